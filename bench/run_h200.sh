#!/usr/bin/env bash
# The H200 measurements in docs/BENCHMARKS.md, in one go: GPU tests, golden GPU fixtures
# (written once), `s4fs selftest --device cuda`, the GPU codec bench, and the mount bench
# with the GPU codec. The GPU box has no network: run from the repo root with the offline
# kit (`bash ../shared/tools/make-offline-kit.sh`) and the weights subset in .gpubench/.
set -u
source "$(dirname "$0")/_h200_env.sh"
run 60 python3 -c "import s4fs.codec as c; print('gpu_available', c.gpu_available())"
W=$R/.gpubench/minilm-subset.safetensors
if [ "${1:-all}" = all ]; then
run 200 python3 -m pytest "$R/tests/test_gpu.py" -q -rs -p no:cacheprovider --rootdir "$R"
S4FS_WRITE_GPU_FIXTURES=1 S4FS_GPU_FIXTURE_DIR=$OUT/gpufix \
    run 60 python3 -m pytest "$R/tests/test_gpu.py" -q -p no:cacheprovider --rootdir "$R" -k write_golden
run 150 python3 -m s4fs.cli selftest --device cuda
run 200 python3 "$R/bench/codec_gpu.py" --size 1 --sets bf16,fp32,adam
S4FS_BENCH_WEIGHTS=$W run 240 python3 "$R/bench/mount.py" --gib 1 --repeat 3 --device cpu
fi
if [ "${1:-all}" = delta ] || [ "${1:-all}" = all ]; then
run 400 python3 "$R/bench/delta_gpu.py" --steps 300 --every 30 --spaced 150
[ "${1:-all}" = delta ] && { tail -12 "$LOG"; exit 0; }
fi
# the GPU codec inside the ingest pipeline (threads) and through the mount
S4FS_BENCH_WEIGHTS=$W run 120 python3 -X faulthandler -c "
import sys, tempfile, time, hashlib, io, torch, s4fs
sys.path.insert(0, '$R/bench')
from _data import mixed_state_dict
sd = mixed_state_dict(1 << 28)
b = io.BytesIO(); torch.save(sd, b)
p = tempfile.mkdtemp() + '/x.pt'
t = time.perf_counter(); s4fs.save(sd, p); t1 = time.perf_counter() - t
back = s4fs.read_bytes(p); t2 = time.perf_counter() - t - t1
fs, rel = s4fs.resolve(p)
print('exact', back == b.getvalue(), 'save s', round(t1, 2), 'read s', round(t2, 2),
      'stored %', round(100 * fs.manifest(rel).stored_bytes() / len(back), 2), flush=True)
"
S4FS_BENCH_WEIGHTS=$W run 200 python3 "$R/bench/ingest.py" --gib 1 --repeat 3
S4FS_BENCH_WEIGHTS=$W run 240 python3 "$R/bench/mount.py" --gib 1 --repeat 3 --device cuda
[ -d "$OUT/gpufix" ] && tar cf "$OUT/gpufix.tar" -C "$OUT" gpufix && rm -rf "$OUT/gpufix"
tail -5 "$LOG"
