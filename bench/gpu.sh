#!/usr/bin/env bash
# The GPU machine's measurements, by suite: the tables of docs/BENCHMARKS.md that need a
# CUDA GPU (the H200 box), and the tests that need that machine.
#
# Usage: bash bench/gpu.sh SUITE...    SUITE: tests codec save mount fill ingest delta
#                                             train-loop multi-gpu selftest
#
#   tests   the GPU tests, then the FUSE trust, writeback and coherence tests
#           (TESTS_MOUNT=0: the GPU tests alone; TESTS_GPU=0: the FUSE ones)  (600 s)
#   codec   the GPU codec vs nvCOMP alone and the CPU path, bf16/fp32/AdamW,
#           4 MiB chunks across tensors, then cut per tensor              (240 s)
#   save    s4fs.save / async_save / load of GPU-resident state vs torch.save
#           and DCP, with the disk's own time for the stored bytes         (420 s)
#   mount   bench/mount.py on a GPT trained here, --device cuda then cpu   (400 s)
#           (MOUNT_MODES: its --modes, e.g. default,passthrough; MOUNT_DEVICES,
#           MOUNT_SECONDS: a run's limit; MOUNT_ARGS: more options, e.g. --floor)
#   fill    a fresh node's decode ahead alone (no FUSE), cpu and cuda      (150 s)
#           (FILL_SOURCES: --source values, a run each; FILL_ARGS, FILL_SECONDS)
#   push-floor  a cold file handed to the kernel while it lands, with no codec: the
#           open waiting for the whole copy (passthrough), pushed pages, requests
#           (bench/push_floor.py; PUSH_ARGS: its options)                     (200 s)
#   ingest  s4fs.save/load vs torch.save/load, then the coding-worker sweep (500 s)
#   delta   deltas on the train-loop GPT trained here: backward vs unbounded
#           forward chains vs deltas off (DELTA_ARGS: its options)          (540 s)
#   train-loop  a GPT training on the GPU, checkpointed every 200 steps by every
#           mode (local disk +sync / page cache, DCP async, s4fs API, the mount
#           default and --writeback on cpu and cuda, and the floor of a pyfuse3
#           mount): blocked s, overhead; TRAIN_MODES=a,b,... runs some;
#           TRAIN_PROFILE=1 keeps daemon logs and py-spy profiles in $OUT
#           (TRAIN_PYSPY=0: the logs alone);
#           TRAIN_GIB, TRAIN_EVERY, TRAIN_CKPTS: state size, steps, checkpoints;
#           TRAIN_ROUNDS: run the modes that many times, alternating order;
#           TRAIN_SECONDS: the run's limit (560 s)
#   multi-gpu  an FSDP2 GPT on every GPU (torchrun, NCCL) checkpointed with DCP to
#           local disk, through one --device cuda mount and with s4fs.dcp's
#           writer; loads back with N and N/2 ranks, bit-exact; MULTI_GIB,
#           MULTI_ARGS (e.g. "--every 30 --checkpoints 2 --modes local,mount") (560 s)
#   selftest  the image build's gate, `s4fs selftest --device cuda --mount
#           --require-passthrough` (the patched pyfuse3 from the kit), then its mount
#           check again with the mount coding on the GPU (--device cuda)          (300 s)
#   binding   each way of building the passthrough binding, then the gate's mount check
#           through it: `s4fs build-passthrough` with libfuse from source (offline:
#           the tarball and meson/ninja/wheel from .offline-kit/build-whl/), again against
#           that libfuse as a "system" one (pkg-config), and its wheel installed into a
#           fresh folder without network or compiler, the build's folder moved away  (500 s)
#
# Each command runs under `timeout` with the budget shown (the device machine allows
# 10 minutes a command, so give each device call one suite). Run from the repo root with
# an offline kit in .offline-kit/, carried to the device (ignored by git; `bash
# bench/offline_kit.sh` builds it: the GPU machine has no network — wheels of trio,
# zstandard, xxhash, Cython, pyfuse3's source, libfuse3, nvCOMP, and a setup.sh that
# installs them; fuse317/ with libfuse 3.18.3 and the patched pyfuse3 source; the
# train-loop suite's C floor adds fuse317/example/ from bench/build_fuse_c_floor.sh)
# and, for codec and ingest, the MiniLM weights subset in
# .gpubench/minilm-subset.safetensors (without it the codec bench falls back to
# synthetic weights). Everything goes to $OUT/gpu.log (OUT defaults to /tmp/s4fs-gpu);
# the tables and test summaries are printed at the end.
set -u
suites="tests codec save mount fill push-floor ingest delta train-loop multi-gpu selftest binding"
usage() { echo "usage: bash bench/gpu.sh SUITE...   (SUITE: ${suites// /, })" >&2; exit 2; }
[ $# -ge 1 ] || usage
for s in "$@"; do
    case " $suites " in *" $s "*) ;; *) echo "unknown suite: $s" >&2; usage ;; esac
done

# --- environment: the log, the `run` step helper, the offline kit, s4fs installed to
# /tmp/s4 (C extension built), cwd /tmp so the source tree stays off sys.path.
R=$(pwd)
OUT=${OUT:-/tmp/s4fs-gpu}
mkdir -p "$OUT"
LOG=$OUT/gpu.log
export PYTHONUNBUFFERED=1
run() {   # run SECONDS CMD...: one step, its output and exit status into the log
    local t=$1; shift
    echo "=== \$ $*" >>"$LOG"
    local t0=$SECONDS
    timeout "$t" "$@" >>"$LOG" 2>&1
    echo "=== exit $? after $((SECONDS - t0)) s" >>"$LOG"
}
# shellcheck disable=SC1091   # the offline kit is made outside the repository
source .offline-kit/setup.sh >>"$LOG" 2>&1
export PATH=$R/.offline-kit/site/bin:$PATH     # py-spy, where the kit carries its wheel
rm -rf /tmp/s4                               # a warm machine keeps the last install
python3 -m pip install -q --no-index --no-deps --no-build-isolation --target /tmp/s4 . >>"$LOG" 2>&1
export PYTHONPATH=/tmp/s4:${PYTHONPATH:-}
cd /tmp || exit 1
nvidia-smi -L >>"$LOG" 2>&1
run 60 python3 -c "import s4fs.codec as c, s4fs.codec._planes as p; print('gpu', c.gpu_available(), 'C planes', p.USE_C)"
W=$R/.gpubench/minilm-subset.safetensors
[ -f "$W" ] || echo "# no $W: the codec bench uses synthetic weights" >>"$LOG"
# pyfuse3 patched for FUSE passthrough, built here from the kit
# (mount/binding/build_pyfuse3.sh .offline-kit/fuse317 made it): the passthrough modes
patched_pyfuse3() {
    local P=$R/.offline-kit/fuse317 PK
    if [ -z "${S4FS_PYFUSE3_PASSTHROUGH:-}" ] && [ -f "$P/pyfuse3-3.5.0-passthrough.tar.gz" ]; then
        PK=$(cd "$P" && pwd)
        sed -i "s#^prefix=.*#prefix=$PK/libfuse#" "$PK/libfuse/lib/pkgconfig/fuse3.pc"
        # a site left by an earlier build (another Python) is not replaced by pip --target
        rm -rf "$PK/site" "$PK/src"
        mkdir -p "$PK/src" && tar -xzf "$PK/pyfuse3-3.5.0-passthrough.tar.gz" -C "$PK/src"
        PKG_CONFIG_PATH="$PK/libfuse/lib/pkgconfig" LDFLAGS="-Wl,-rpath,$PK/libfuse/lib" \
            SETUPTOOLS_SCM_PRETEND_VERSION=3.5.0 timeout 300 python3 -m pip install -q \
            --no-index --no-deps --no-build-isolation --target "$PK/site" \
            "$PK/src/pyfuse3-3.5.0" >>"$LOG" 2>&1 && export S4FS_PYFUSE3_PASSTHROUGH="$PK/site"
        echo "# patched pyfuse3 for passthrough: ${S4FS_PYFUSE3_PASSTHROUGH:-build failed}" >>"$LOG"
    fi
}
T=(python3 -m pytest -q -rs -p no:cacheprovider --rootdir "$R")
B=$R/bench

for suite in "$@"; do
    echo "### suite $suite" >>"$LOG"
    case $suite in
    tests)
        [ "${TESTS_GPU:-1}" = 0 ] ||
        run 300 "${T[@]}" "$R/tests/gpu/test_gpu_codec.py" "$R/tests/gpu/test_gpu_save.py" \
            "$R/tests/core/test_gpu_pool.py" "$R/tests/codec/test_container_batch.py"
        [ "${TESTS_MOUNT:-1}" = 0 ] ||
        run 300 "${T[@]}" "$R/tests/mount/test_trust.py" "$R/tests/mount/test_writeback.py" \
            "$R/tests/mount/test_coherence.py" -m "not s3"
        ;;
    codec)
        # the MiniLM subset where it was carried, else synthetic weights
        WARGS=(); [ -f "$W" ] && WARGS=(--weights "$W")
        run 120 python3 "$B/codec_gpu.py" --size 1 --sets bf16,fp32,adam --repeat 5 \
            --profiles default "${WARGS[@]}" --chunking concat
        run 120 python3 "$B/codec_gpu.py" --size 1 --sets bf16,fp32,adam --repeat 3 \
            --profiles default "${WARGS[@]}"
        ;;
    save)
        run 420 python3 "$B/gpu_save.py" --gib 1.7 --repeat 2 --series 3 --between 10 --work /tmp
        ;;
    mount)
        # MOUNT_MODES: bench/mount.py's --modes (default: default); MOUNT_DEVICES
        case ${MOUNT_MODES:-default} in *passthrough*) patched_pyfuse3 ;; esac
        for d in ${MOUNT_DEVICES:-cuda cpu}; do
            # shellcheck disable=SC2086   # MOUNT_ARGS: more options, split on purpose
            run "${MOUNT_SECONDS:-200}" python3 "$B/mount.py" --source gpt --gib 0.6 --saves 3 \
                --loads 3 --modes "${MOUNT_MODES:-default}" --device "$d" --work /tmp ${MOUNT_ARGS:-}
        done
        ;;
    fill)
        # FILL_SOURCES: bench/fill.py's --source values, a run each; FILL_ARGS its options
        for src in ${FILL_SOURCES:-synthetic}; do
            # shellcheck disable=SC2086   # FILL_ARGS: bench/fill.py's options, split on purpose
            run "${FILL_SECONDS:-150}" python3 "$B/fill.py" --source "$src" \
                ${FILL_ARGS:---gib 0.6 --repeat 3 --saves 3 --devices cpu,cuda} --work "${FILL_WORK:-/tmp}"
        done
        ;;
    push-floor)
        patched_pyfuse3
        # shellcheck disable=SC2086   # PUSH_ARGS: bench/push_floor.py's options, split on purpose
        run "${PUSH_SECONDS:-200}" python3 "$B/push_floor.py" \
            ${PUSH_ARGS:---gib 1.7 --rates 2,4,0 --repeat 3} --work /tmp
        ;;
    ingest)
        S4FS_BENCH_WEIGHTS=$W run 200 python3 "$B/ingest.py" --gib 1 --repeat 3
        S4FS_BENCH_WEIGHTS=$W run 300 python3 "$B/ingest.py" --workers 1,2,4,8,16 --gib 1 --repeat 1
        ;;
    delta)
        # shellcheck disable=SC2086   # DELTA_ARGS: bench/delta_gpu.py's options, split on purpose
        run 540 python3 "$B/delta_gpu.py" ${DELTA_ARGS:---steps 1000 --every 200 --gib 1.7}
        ;;
    train-loop)
        t0=$SECONDS
        patched_pyfuse3          # the passthrough modes (mount-pt*, fuse-floor-pt)
        # --budget: the modes that fit, and their table, rather than a timeout and no table
        tl=${TRAIN_SECONDS:-560}
        run $((tl - (SECONDS - t0))) python3 "$B/train_loop.py" --gib "${TRAIN_GIB:-1.7}" --every "${TRAIN_EVERY:-200}" \
            --checkpoints "${TRAIN_CKPTS:-4}" --rounds "${TRAIN_ROUNDS:-1}" --work /tmp \
            --budget $((tl - 30 - (SECONDS - t0))) \
            ${TRAIN_MODES:+--modes "$TRAIN_MODES"} ${TRAIN_PROFILE:+--profile "$OUT/profile"}
        ;;
    multi-gpu)
        nvidia-smi topo -m >>"$LOG" 2>&1
        # shellcheck disable=SC2086   # MULTI_ARGS: more options, split on purpose
        run 560 python3 "$B/multi_gpu.py" --gib "${MULTI_GIB:-2}" --work /tmp \
            --timeout "${MULTI_TIMEOUT:-240}" ${MULTI_ARGS:---every 50 --checkpoints 3}
        ;;
    selftest)
        patched_pyfuse3
        # the CLI's mount daemons take the patched pyfuse3 from PYTHONPATH
        pp=${S4FS_PYFUSE3_PASSTHROUGH:+$S4FS_PYFUSE3_PASSTHROUGH:}$PYTHONPATH
        PYTHONPATH=$pp run 200 python3 -m s4fs.cli selftest --device cuda --mount \
            --require-passthrough
        PYTHONPATH=$pp run 100 python3 -m s4fs.cli selftest --device cuda --random-size 1000 \
            --mount --require-passthrough --mount-mib 64 --mount-arg=--device=cuda
        ;;
    binding)
        bw=$R/.offline-kit/build-whl
        gate() {   # gate SITE: the mount check through the pyfuse3 installed in SITE
            PYTHONPATH=$1:$PYTHONPATH run 150 python3 -c \
                "import pyfuse3; print('pyfuse3 from', pyfuse3.__file__)"
            PYTHONPATH=$1:$PYTHONPATH run 150 python3 -m s4fs.cli selftest --device cuda \
                --random-size 1000 --mount --require-passthrough --mount-mib 64 "${@:2}"
        }
        (   # offline: pip finds pyfuse3's sdist, Cython, meson, ninja in the kit
            export PIP_NO_INDEX=1 PIP_FIND_LINKS="$R/.offline-kit/whl $bw"
            export S4FS_LIBFUSE_TARBALL=$bw/fuse3_3.18.3.orig.tar.gz
            rm -rf /tmp/pt-src /tmp/pt-sys /tmp/pt-wheel /tmp/pt-moved
            run 200 python3 -m s4fs.cli build-passthrough --dest /tmp/pt-src --no-install
            gate /tmp/pt-src/site
            PKG_CONFIG_PATH=/tmp/pt-src/libfuse/lib/pkgconfig \
                run 150 python3 -m s4fs.cli build-passthrough --dest /tmp/pt-sys --no-install
            gate /tmp/pt-sys/site --mount-arg=--device=cuda
            mv /tmp/pt-src /tmp/pt-moved          # the wheel needs nothing of its build
            run 60 python3 -m pip install -q --no-index --no-deps --target /tmp/pt-wheel \
                /tmp/pt-moved/wheel/pyfuse3-*.whl
            gate /tmp/pt-wheel
        )
        ;;
    esac
done
grep -E "^(===|###|\||#|[0-9]+ (passed|failed)|FAILED|ERROR|gpu |mount selftest|how the bytes|pyfuse3 from|built |s4fs: |libfuse: |[0-9]+/[0-9]+ round trips)" \
    "$LOG" | tail -"${TAIL:-80}"
