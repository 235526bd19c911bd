#!/usr/bin/env bash
# GPU-resident save/load on the H200 box in one go: the GPU tests (codec, s4fs.save /
# async_save / load of CUDA state, and the CPU API tests), the save/load benchmark on a
# GPT trained there, and the codec benchmark. Run from the repo root with the offline
# kit (`bash ../shared/tools/make-offline-kit.sh`).
# Usage: run_h200_gpusave.sh [all|tests|bench|codec|profiles|mount|worker]
#   profiles: the codec with the stored-size candidates side by side
#   mount:    the mount benchmark with --device cpu, then --device cuda (the GPU worker)
set -u
source "$(dirname "$0")/_h200_env.sh"
T="python3 -m pytest -q -rs -p no:cacheprovider --rootdir $R"
what=${1:-all}
if [ "$what" = all ] || [ "$what" = tests ]; then
run 240 $T "$R/tests/test_gpu_save.py" "$R/tests/test_torchsave.py" "$R/tests/test_gpu.py"
fi
if [ "$what" = all ] || [ "$what" = bench ]; then
run 300 python3 "$R/bench/gpu_save.py" --gib 1.7 --repeat 3 --work /tmp
fi
if [ "$what" = all ] || [ "$what" = codec ]; then
run 150 python3 "$R/bench/codec_gpu.py" --size 1 --sets bf16,fp32,adam
fi
if [ "$what" = profiles ]; then
run 280 python3 "$R/bench/codec_gpu.py" --size 1 --sets bf16,fp32,adam --repeat 2 \
    --profiles default,default:verify=false,zero-runs,default:chunk=65536
fi
if [ "$what" = worker ]; then     # the GPU worker: its tests, then a cuda mount
run 200 $T "$R/tests/test_gpu_save.py" "$R/tests/test_gpu.py"
run 200 python3 "$R/bench/mount.py" --source gpt --gib 1.2 --saves 3 --loads 1 --modes default \
    --device cuda --work /tmp
fi
if [ "$what" = mount ]; then
for dev in cpu cuda; do
run 280 python3 "$R/bench/mount.py" --source gpt --gib 1.2 --saves 3 --loads 1 --modes default \
    --device $dev --work /tmp
done
fi
grep -E "^(===|\||#|[0-9]+ (passed|failed)|FAILED|ERROR|E  |stored)" "$LOG" | tail -90
