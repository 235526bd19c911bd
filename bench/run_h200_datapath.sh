#!/usr/bin/env bash
# The data-path measurements on the H200 box, in one go: build (C extension included),
# the GPU tests, the FUSE trust/writeback tests, the ingest worker sweep, and the mount
# benchmark on a GPT trained there (bf16 weights + fp32 AdamW). Run from the repo root
# with the offline kit (`bash ../shared/tools/make-offline-kit.sh`) and a weights subset
# in .gpubench/ (MiniLM tensors, for the ingest sweep).
# Usage: run_h200_datapath.sh [cpu|mount|devices|devices-loads|devices-fill|devices-final|devices-profile|zero-blocks|zero-blocks-2|final|diag|prof|final8a|final8b|final8c|prof9|run9a|run9b|run9c|final9|run10a|run10b|final10|hold10|final10b|run11a|run11b|final11|tests12|run12a|final12|mends12|workers|workers-mount|codec]
set -u
source "$(dirname "$0")/_h200_env.sh"
run 60 python3 -c "import s4fs.codec as c, s4fs.codec._planes as p; print('gpu', c.gpu_available(), 'C planes', p.USE_C)"
W=$R/.gpubench/minilm-subset.safetensors
T="python3 -m pytest -q -rs -p no:cacheprovider --rootdir $R"
if [ "${1:-cpu}" = cpu ]; then
run 150 $T "$R/tests/test_gpu.py" "$R/tests/test_shuffle.py"
run 200 $T "$R/tests/test_trust.py" "$R/tests/test_writeback.py" -m "not s3"
S4FS_BENCH_WEIGHTS=$W run 150 python3 "$R/bench/ingest.py" --workers 1,2,4,8,16 --gib 1 --repeat 2
run 300 python3 "$R/bench/mount.py" --source gpt --gib 1.5 --saves 4 --loads 3 --device cpu --work /tmp
elif [ "$1" = mount ]; then       # both modes, then default mode with 4 threads and the GPU codec
run 230 python3 "$R/bench/mount.py" --source gpt --gib 1.5 --saves 4 --loads 2 --device cpu --work /tmp
run 100 python3 "$R/bench/mount.py" --source gpt --gib 1.5 --saves 3 --loads 1 --modes default --workers 4 --work /tmp
run 120 python3 "$R/bench/mount.py" --source gpt --gib 1.5 --saves 3 --loads 1 --modes default --device cuda --work /tmp
S4FS_BENCH_WEIGHTS=$W run 90 python3 "$R/bench/ingest.py" --workers 1,4,16 --gib 0.5 --repeat 1
elif [ "$1" = workers ]; then     # coding in worker processes: tests, then the sweep
run 240 $T "$R/tests/test_workers.py"
S4FS_BENCH_WEIGHTS=$W run 330 python3 "$R/bench/ingest.py" --workers 1,2,4,8,16 --gib 1 --repeat 1
elif [ "$1" = devices ]; then      # the GPU tests, then cpu and cuda mounts alternately
run 240 $T "$R/tests/test_gpu_save.py" "$R/tests/test_gpu_pool.py" "$R/tests/test_gpu.py"
run 60 python3 -c "import time; from s4fs import coding; t = time.time(); coding.gpu_worker().warm(); print('GPU worker started and warm in %.2f s' % (time.time() - t)); coding.shutdown()"
for d in cpu cuda cpu cuda; do
run 110 python3 "$R/bench/mount.py" --source gpt --gib 0.6 --saves 3 --loads 2 --modes default --device $d --work /tmp
done
elif [ "$1" = devices-loads ]; then   # the codec's chunk split, then loads with 3 repeats
run 200 python3 "$R/bench/codec_gpu.py" --size 1 --sets bf16,fp32,adam --repeat 3 --profiles default,default:chunk=262144
for d in cpu cuda; do
run 110 python3 "$R/bench/mount.py" --source gpt --gib 0.6 --saves 3 --loads 3 --modes default --device $d --work /tmp
done
elif [ "$1" = devices-fill ]; then   # decode ahead alone, its knobs, then the mounts
run 60 python3 -c "
import threading, time
from s4fs.codec.gpu._backend import CudaBackend, pinned_host
def make(out):
    t = time.perf_counter(); CudaBackend(); out.append(time.perf_counter() - t)
for k in range(3):
    out = []; th = threading.Thread(target=make, args=(out,)); th.start(); th.join()
    t = time.perf_counter(); pinned_host(16 << 20); p = time.perf_counter() - t
    print('a codec backend on a new thread: %.1f ms; 16 MiB pinned: %.2f ms' % (1e3 * out[0], 1e3 * p))
"
run 200 $T "$R/tests/test_gpu_save.py" "$R/tests/test_gpu_pool.py"
run 120 python3 "$R/bench/fill.py" --gib 0.6 --repeat 3 --devices cpu,cuda
run 60 python3 "$R/bench/fill.py" --gib 0.6 --repeat 3 --devices cuda --gpu-fill-batch 64 --gpu-threads 4
run 60 python3 "$R/bench/fill.py" --gib 0.6 --repeat 3 --devices cuda --gpu-fill-batch 8 --gpu-threads 16
for d in cpu cuda; do
run 110 python3 "$R/bench/mount.py" --source gpt --gib 0.6 --saves 3 --loads 3 --modes default --device $d --work /tmp
done
elif [ "$1" = devices-final ]; then  # the GPU tests, then one cpu and one cuda mount
run 200 $T "$R/tests/test_gpu_save.py" "$R/tests/test_gpu_pool.py"
for d in cpu cuda; do
run 110 python3 "$R/bench/mount.py" --source gpt --gib 0.6 --saves 3 --loads 3 --modes default --device $d --work /tmp
done
elif [ "$1" = devices-profile ]; then  # all GPU tests, logged mounts, a delta chain's fill, real-data codec
run 200 $T "$R/tests/test_gpu.py" "$R/tests/test_gpu_save.py" "$R/tests/test_gpu_pool.py"
run 85 python3 "$R/bench/mount.py" --source gpt --gib 0.6 --saves 3 --loads 2 --modes default --device cuda --work /tmp --daemon-log
run 85 python3 "$R/bench/mount.py" --source gpt --gib 0.6 --saves 3 --loads 2 --modes default --device cpu --work /tmp
run 60 python3 "$R/bench/fill.py" --gib 0.6 --repeat 2 --saves 3 --devices cpu,cuda
run 80 python3 "$R/bench/codec_gpu.py" --size 1 --sets bf16,adam --repeat 2 --profiles default,zero-runs --weights "$W"
elif [ "$1" = zero-blocks ]; then   # zero-block fixtures, every GPU test, the codec on real data, the mounts
mkdir -p "$OUT/fx"
S4FS_WRITE_GPU_FIXTURES=1 S4FS_GPU_FIXTURE_DIR="$OUT/fx" run 60 $T "$R/tests/test_gpu.py" -k write_zero_block
cp -r "$OUT/fx/zero-blocks" "$R/tests/fixtures/gpu/" 2>>"$LOG"
run 200 $T "$R/tests/test_gpu.py" "$R/tests/test_gpu_save.py" "$R/tests/test_gpu_pool.py" "$R/tests/test_container_batch.py"
run 90 python3 "$R/bench/codec_gpu.py" --size 1 --sets bf16,fp32,adam --repeat 3 --profiles default --weights "$W"
run 60 python3 "$R/bench/codec_gpu.py" --size 1 --sets adam --repeat 2 --profiles default:zero_blocks=false --weights "$W"
run 85 python3 "$R/bench/mount.py" --source gpt --gib 0.6 --saves 3 --loads 2 --modes default --device cuda --work /tmp
run 85 python3 "$R/bench/mount.py" --source gpt --gib 0.6 --saves 3 --loads 2 --modes default --device cpu --work /tmp
elif [ "$1" = zero-blocks-2 ]; then   # the GPU tests and the codec after the zero-block host work went vectorized
run 120 $T "$R/tests/test_gpu.py" "$R/tests/test_container_batch.py"
run 100 python3 "$R/bench/codec_gpu.py" --size 1 --sets bf16,fp32,adam --repeat 3 --profiles default,default:zero_blocks=false --weights "$W"
run 70 python3 "$R/bench/codec_gpu.py" --size 1 --sets bf16,fp32,adam --repeat 3 --profiles default
elif [ "$1" = final ]; then   # the last code: every GPU test, the codec on real data, both mounts
run 200 $T "$R/tests/test_gpu.py" "$R/tests/test_gpu_save.py" "$R/tests/test_gpu_pool.py" "$R/tests/test_container_batch.py"
run 90 python3 "$R/bench/codec_gpu.py" --size 1 --sets bf16,fp32,adam --repeat 3 --profiles default --weights "$W"
run 85 python3 "$R/bench/mount.py" --source gpt --gib 0.6 --saves 3 --loads 3 --modes default --device cuda --work /tmp
run 85 python3 "$R/bench/mount.py" --source gpt --gib 0.6 --saves 3 --loads 3 --modes default --device cpu --work /tmp
elif [ "$1" = diag ]; then   # the codec cut per tensor, then both mounts with the daemon's log
run 120 python3 "$R/bench/codec_gpu.py" --size 1 --sets bf16,fp32,adam --repeat 3 --profiles default --weights "$W"
for d in cuda cpu; do
run 100 python3 "$R/bench/mount.py" --source gpt --gib 0.6 --saves 3 --loads 2 --modes default --device $d --work /tmp --daemon-log
done
elif [ "$1" = prof ]; then   # host profile of the codec on per-tensor chunks, then GPU-resident save/load
run 120 python3 "$R/bench/codec_gpu_host.py" --sets bf16 --weights "$W"
run 300 python3 "$R/bench/gpu_save.py" --gib 1.7 --repeat 3 --work /tmp
elif [ "$1" = final8a ]; then   # eighth session's code: every GPU test, the codec cut per tensor and across tensors
run 240 $T "$R/tests/test_gpu.py" "$R/tests/test_gpu_save.py" "$R/tests/test_gpu_pool.py" "$R/tests/test_container_batch.py"
run 90 python3 "$R/bench/codec_gpu.py" --size 1 --sets bf16,fp32,adam --repeat 3 --profiles default --weights "$W"
run 90 python3 "$R/bench/codec_gpu.py" --size 1 --sets bf16,fp32,adam --repeat 3 --profiles default --weights "$W" --chunking concat
elif [ "$1" = final8b ]; then   # eighth session's code: GPU-resident save/load, then both mounts
run 240 python3 "$R/bench/gpu_save.py" --gib 1.7 --repeat 3 --work /tmp
for d in cuda cpu; do
run 100 python3 "$R/bench/mount.py" --source gpt --gib 0.6 --saves 3 --loads 3 --modes default --device $d --work /tmp
done
elif [ "$1" = final8c ]; then   # a second pair of mounts, the cuda one with the daemon's log
run 90 python3 "$R/bench/codec_gpu_host.py" --sets bf16 --weights "$W" --top 25
run 100 python3 "$R/bench/mount.py" --source gpt --gib 0.6 --saves 3 --loads 3 --modes default --device cuda --work /tmp --daemon-log
run 100 python3 "$R/bench/mount.py" --source gpt --gib 0.6 --saves 3 --loads 3 --modes default --device cpu --work /tmp
elif [ "$1" = prof9 ]; then   # ninth session: where the 4 MiB cut's host time goes, the AdamW gap by plane
run 120 python3 "$R/bench/codec_gpu.py" --size 1 --sets bf16,fp32,adam --repeat 5 --profiles default --weights "$W" --chunking concat
run 90 python3 "$R/bench/codec_gpu_host.py" --sets bf16 --weights "$W" --chunking concat --top 45
run 120 python3 "$R/bench/codec_gpu_planes.py" --sets adam,fp32,bf16 --weights "$W"
elif [ "$1" = run9a ]; then   # ninth session: GPU tests, codec both cuts, host time, the AdamW gap whole vs sample
run 240 $T "$R/tests/test_gpu.py" "$R/tests/test_gpu_save.py" "$R/tests/test_gpu_pool.py" "$R/tests/test_container_batch.py"
run 90 python3 "$R/bench/codec_gpu.py" --size 1 --sets bf16,fp32,adam --repeat 5 --profiles default --weights "$W" --chunking concat
run 90 python3 "$R/bench/codec_gpu.py" --size 1 --sets bf16,fp32,adam --repeat 3 --profiles default --weights "$W"
run 60 python3 "$R/bench/codec_gpu_host.py" --sets bf16 --weights "$W" --chunking concat --top 30
run 60 python3 "$R/bench/codec_gpu_host.py" --sets bf16 --weights "$W" --top 30
run 120 python3 "$R/bench/codec_gpu_planes.py" --sets adam --weights "$W" --sample 256
elif [ "$1" = run9b ]; then   # ninth session: the save's hash beside its coding, the store's write pattern, the codec
run 120 $T "$R/tests/test_gpu_save.py"
run 120 python3 "$R/bench/store_write.py" --dir /tmp --gib 1.4 --repeat 2 --writers 1,4,16 --packs 32,128
run 200 python3 "$R/bench/gpu_save.py" --gib 1.7 --repeat 3 --work /tmp
run 200 python3 "$R/bench/gpu_save.py" --gib 1.7 --repeat 3 --work /tmp --uploads 16
run 60 python3 "$R/bench/codec_gpu.py" --size 1 --sets bf16,fp32,adam --repeat 5 --profiles default --weights "$W" --chunking concat
run 60 python3 "$R/bench/codec_gpu.py" --size 1 --sets bf16,fp32,adam --repeat 3 --profiles default --weights "$W"
elif [ "$1" = run9c ]; then   # ninth session: where s4fs.save's time goes now, and with 16 pack writers
run 200 python3 "$R/bench/gpu_save.py" --gib 1.7 --repeat 3 --work /tmp
run 200 python3 "$R/bench/gpu_save.py" --gib 1.7 --repeat 2 --work /tmp --uploads 16
elif [ "$1" = final9 ]; then   # ninth session's code: every GPU test, the codec both cuts, the GPU-resident save/load
run 200 $T "$R/tests/test_gpu.py" "$R/tests/test_gpu_save.py" "$R/tests/test_gpu_pool.py" "$R/tests/test_container_batch.py"
run 60 python3 "$R/bench/codec_gpu.py" --size 1 --sets bf16,fp32,adam --repeat 5 --profiles default --weights "$W" --chunking concat
run 40 python3 "$R/bench/codec_gpu_host.py" --sets bf16 --weights "$W" --chunking concat --top 5
run 60 python3 "$R/bench/codec_gpu.py" --size 1 --sets bf16,fp32,adam --repeat 3 --profiles default --weights "$W"
run 200 python3 "$R/bench/gpu_save.py" --gib 1.7 --repeat 3 --work /tmp
elif [ "$1" = run10a ]; then   # tenth session: GPU tests, the save's first batches small, the disk's patterns, the codec bench's sample
run 240 $T "$R/tests/test_gpu.py" "$R/tests/test_gpu_save.py" "$R/tests/test_gpu_pool.py" "$R/tests/test_container_batch.py"
run 150 python3 "$R/bench/store_write.py" --dir /tmp --gib 1.4 --repeat 2 --writers 4,16,32 --packs 32
run 200 python3 "$R/bench/gpu_save.py" --gib 1.7 --repeat 3 --work /tmp
run 60 python3 "$R/bench/codec_gpu.py" --size 1 --sets bf16,fp32,adam --repeat 5 --profiles default --weights "$W" --chunking concat
run 60 python3 "$R/bench/codec_gpu_host.py" --sets bf16,fp32,adam --weights "$W" --chunking concat --top 5
elif [ "$1" = run10b ]; then   # tenth session: where the device save leaves the disk idle, with and without small first batches
run 200 python3 "$R/bench/gpu_save.py" --gib 1.7 --repeat 3 --work /tmp --timeline
run 200 python3 "$R/bench/gpu_save.py" --gib 1.7 --repeat 3 --work /tmp --timeline --first-batches ""
elif [ "$1" = final10 ]; then   # tenth session's code: every GPU test, the traced GPU-resident save, the codec both cuts
run 60 python3 -c "from s4fs.codec import _zstd_seq; print('zstd sequences (cffi):', _zstd_seq.available())"
run 240 $T "$R/tests/test_gpu.py" "$R/tests/test_gpu_save.py" "$R/tests/test_gpu_pool.py" "$R/tests/test_container_batch.py"
run 200 python3 "$R/bench/gpu_save.py" --gib 1.7 --repeat 3 --work /tmp --timeline
run 60 python3 "$R/bench/codec_gpu.py" --size 1 --sets bf16,fp32,adam --repeat 5 --profiles default --weights "$W" --chunking concat
run 60 python3 "$R/bench/codec_gpu.py" --size 1 --sets bf16,fp32,adam --repeat 3 --profiles default --weights "$W"
run 40 python3 "$R/bench/codec_gpu_host.py" --sets bf16 --weights "$W" --chunking concat --top 5
elif [ "$1" = final10b ]; then   # tenth session's last code: every GPU test, the codec both cuts (before the disk work), the traced save
run 240 $T "$R/tests/test_gpu.py" "$R/tests/test_gpu_save.py" "$R/tests/test_gpu_pool.py" "$R/tests/test_container_batch.py"
run 40 python3 "$R/bench/codec_gpu_host.py" --sets bf16 --weights "$W" --chunking concat --top 0 --repeat 5
run 40 python3 "$R/bench/codec_gpu_host.py" --sets bf16 --weights "$W" --top 0 --repeat 5
run 60 python3 "$R/bench/codec_gpu.py" --size 1 --sets bf16,fp32,adam --repeat 5 --profiles default --weights "$W" --chunking concat
run 60 python3 "$R/bench/codec_gpu.py" --size 1 --sets bf16,fp32,adam --repeat 3 --profiles default --weights "$W"
run 200 python3 "$R/bench/gpu_save.py" --gib 1.7 --repeat 3 --work /tmp --timeline
elif [ "$1" = run11a ]; then   # eleventh session: device saves code against the previous checkpoint
run 260 $T "$R/tests/test_gpu_save.py" "$R/tests/test_gpu_pool.py" "$R/tests/test_gpu.py" "$R/tests/test_container_batch.py"
run 300 python3 "$R/bench/gpu_save.py" --gib 1.7 --repeat 3 --series 4 --between 10 --work /tmp
elif [ "$1" = run11b ]; then   # eleventh session: the delta bases decoded one batch ahead
run 120 $T "$R/tests/test_gpu_save.py"
run 300 python3 "$R/bench/gpu_save.py" --gib 1.7 --repeat 2 --series 5 --between 10 --work /tmp
elif [ "$1" = final11 ]; then   # eleventh session's code: the GPU save tests, the device save with and without deltas
run 150 $T "$R/tests/test_gpu_save.py" "$R/tests/test_gpu_pool.py"
run 300 python3 "$R/bench/gpu_save.py" --gib 1.7 --repeat 2 --series 4 --between 10 --work /tmp
elif [ "$1" = tests12 ]; then   # twelfth session: every GPU test (the device save's damaged-base fallback is new)
run 330 $T "$R/tests/test_gpu_save.py" "$R/tests/test_gpu_pool.py" "$R/tests/test_gpu.py" "$R/tests/test_container_batch.py"
elif [ "$1" = run12a ]; then   # twelfth session: the disk's own floor beside the saves, delta saves traced
run 480 python3 "$R/bench/gpu_save.py" --gib 1.7 --repeat 2 --series 4 --between 10 --work /tmp --timeline
elif [ "$1" = final12 ]; then   # twelfth session's code (each thread's GPU work on its caller's device): GPU tests, then the saves
run 150 $T "$R/tests/test_gpu_save.py" "$R/tests/test_gpu_pool.py" "$R/tests/test_gpu.py" "$R/tests/test_container_batch.py"
run 330 python3 "$R/bench/gpu_save.py" --gib 1.7 --repeat 2 --series 3 --between 10 --work /tmp
elif [ "$1" = mends12 ]; then   # twelfth session's review mends: the device-save tests
run 120 $T "$R/tests/test_gpu_save.py"
elif [ "$1" = hold10 ]; then   # tenth session: does memory held on the device slow the codec (one set vs three)
for a in "--sets bf16" "--sets bf16,fp32,adam --only bf16" "--sets bf16 --hold 3" "--sets bf16" "--sets bf16,fp32,adam --only bf16" "--sets bf16 --hold 3"; do
run 40 python3 "$R/bench/codec_gpu_host.py" $a --weights "$W" --chunking concat --top 0 --repeat 5
done
elif [ "$1" = workers-mount ]; then
run 540 python3 "$R/bench/mount.py" --source gpt --gib 1.5 --saves 4 --loads 2 --device cpu --work /tmp
else
run 200 python3 "$R/bench/codec_gpu.py" --size 1 --sets bf16,fp32,adam
fi
grep -E "^(===|\||#|[0-9]+ passed|FAILED|a codec backend)" "$LOG" | tail -${TAIL:-60}
