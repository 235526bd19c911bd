"""Where the GPU codec's host time goes, on chunks cut per tensor (H200 box).

The data is bench/codec_gpu.py's (real MiniLM tensors tiled to ``--size`` GiB on the
device, every tensor cut on its own as s4fs cuts storages: thousands of chunks per GiB,
a third of them 384-element biases and norms). It prints the median encode and decode
with Python's cyclic GC on and off (the pipeline makes a few Python objects per chunk),
then a cProfile of three encodes and three decodes, by own time.

``--chunking concat`` cuts the tile as one stream into 4 MiB chunks instead (about 256
chunks per GiB, as a large model's tensors give).

    python bench/codec_gpu_host.py [--sets bf16] [--size 1] [--top 30] [--chunking concat]
"""

from __future__ import annotations

import argparse
import cProfile
import gc
import io
import os
import pstats
import sys
import time


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--sets", default="bf16")
    p.add_argument("--size", type=float, default=1.0)
    p.add_argument("--repeat", type=int, default=7)
    p.add_argument("--top", type=int, default=30)
    p.add_argument("--weights", default=None)
    p.add_argument("--chunking", choices=("storage", "concat"), default="storage",
                   help="cut every tensor on its own (as s4fs does) or the tile as one stream")
    p.add_argument("--hold", type=float, default=0.0,
                   help="GiB of other device memory (torch) held while timing, as a "
                        "training process holds its model")
    p.add_argument("--only", default=None, help="time only this set (the others are held)")
    args = p.parse_args(argv)
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import codec_gpu as B
    from s4fs.codec import gpu
    gpu.require()
    data, source, sizes = B.device_sets(args.sets, args.size, args.weights)
    print(f"# {source}, {args.size:g} GiB per set, chunks cut "
          f"{'per tensor' if args.chunking == 'storage' else 'across tensors'}; medians of "
          f"{args.repeat}")
    if args.hold:
        import torch
        held = torch.ones(int(args.hold * (1 << 30)), dtype=torch.uint8, device="cuda")
        print(f"# holding {held.numel() / 2**30:g} GiB of other device memory")
    for name, (dtype, flat) in data.items():
        if args.only and not name.startswith(args.only):
            continue
        cut = sizes if args.chunking == "storage" else None
        items = [(c, dtype) for c in B._chunks(flat, 4 << 20, cut)]
        raw = flat.numel() * flat.element_size()
        gpu.compress_many(items, out="device")                    # warm up
        for mode in ("GC on", "GC off", "GC on", "GC off"):
            te, td = [], []
            runs = sum(s["collections"] for s in gc.get_stats())
            for _ in range(args.repeat):
                if mode == "GC off":
                    gc.disable()
                try:
                    t0 = time.perf_counter()
                    blobs = gpu.compress_many(items, out="device")
                    te.append(time.perf_counter() - t0)
                    t0 = time.perf_counter()
                    outs = gpu.decompress_many(blobs, out="device")
                    td.append(time.perf_counter() - t0)
                finally:
                    gc.enable()
                del outs, blobs
            runs = sum(s["collections"] for s in gc.get_stats()) - runs
            te.sort()
            td.sort()
            k = len(te) // 2
            print(f"{name}, {mode}: {len(items)} chunks; encode {raw / te[k] / 1e9:.1f} GB/s "
                  f"({1e3 * te[k]:.0f} ms), decode {raw / td[k] / 1e9:.1f} GB/s "
                  f"({1e3 * td[k]:.0f} ms); {runs} collections", flush=True)
        blobs = gpu.compress_many(items, out="device")
        for what, fn in (("encode", lambda: gpu.compress_many(items, out="device")),
                         ("decode", lambda: gpu.decompress_many(blobs, out="device"))):
            prof = cProfile.Profile()
            prof.enable()
            for _ in range(3):
                fn()
            prof.disable()
            text = io.StringIO()
            pstats.Stats(prof, stream=text).sort_stats("tottime").print_stats(args.top)
            lines = [ln for ln in text.getvalue().splitlines() if ln.strip()]
            print(f"\n{name}: {what}, three calls, by own time")
            print("\n".join(lines[3:]), flush=True)


if __name__ == "__main__":
    main()
