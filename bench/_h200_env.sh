# Sourced by the bench/run_h200*.sh scripts from the repo root: the log, the `run` step
# helper, the offline kit, s4fs installed to /tmp/s4 (C extension built), cwd /tmp.
R=$(pwd)
OUT=${OUT:-/tmp/s4fs-h200}
mkdir -p "$OUT"
LOG=$OUT/h200.log
export PYTHONUNBUFFERED=1
run() {   # run SECONDS CMD...: one step, its output and exit status into the log
    local t=$1; shift
    echo "=== \$ $*" >>"$LOG"
    local t0=$SECONDS
    timeout "$t" "$@" >>"$LOG" 2>&1
    echo "=== exit $? after $((SECONDS - t0)) s" >>"$LOG"
}
source .offline-kit/setup.sh >>"$LOG" 2>&1
rm -rf /tmp/s4                               # a warm machine keeps the last install
python3 -m pip install -q --no-index --no-deps --no-build-isolation --target /tmp/s4 . >>"$LOG" 2>&1
export PYTHONPATH=/tmp/s4:${PYTHONPATH:-}
cd /tmp                                    # keep the source tree off sys.path
nvidia-smi -L >>"$LOG" 2>&1
