"""The GPU codec's host work, on any machine: ``compress_many`` / ``decompress_many`` over
a backend whose kernels and nvCOMP calls do nothing.

On the H200 the GPU codec is bound by its host side (Python and NumPy between the
launches: about 8 of a 1 GiB bf16 encode's 13 ms), so the host milliseconds per GiB
printed here bound what the codec can reach, and changes to them can be measured
without a GPU. What the device does is not measured (bench/codec_gpu.py does, on a
GPU); the blobs made here are not valid and are never decoded for their bytes.

    python bench/codec_host.py [--gib 1] [--chunk 4] [--repeat 5]
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np

MiB = 1 << 20


def _backend():
    from s4fs.codec.gpu._backend import EmulatedBackend

    class Null(EmulatedBackend):
        """Memory without contents; launches and nvCOMP calls that do nothing."""

        def __init__(self) -> None:
            self._keep = []

        def empty(self, n):
            return np.zeros(max(int(n), 1), dtype=np.uint8)   # calloc: pages never touched

        def launch(self, *args) -> None:
            pass

        def encode(self, spec, src, src_off, sizes, dst, dst_off, cap):
            return np.asarray(sizes, np.int64) // 3 + 1      # sizes a codec might give

        def decode(self, *args, **kw) -> None:
            pass

    return Null()


class _Stages:
    def __init__(self) -> None:
        self.ms: dict[str, float] = {}
        self.t = time.perf_counter()

    def mark(self, stage: str) -> None:
        now = time.perf_counter()
        self.ms[stage] = self.ms.get(stage, 0.0) + 1e3 * (now - self.t)
        self.t = now


def _sets(gib: float, chunk: int) -> dict:
    """Chunks of each data set, as NumPy arrays: staged as host memory is (the table
    leaves 'stage in' out of the total: on a GPU the bench's data is on the device)."""
    rng = np.random.default_rng(0)
    n = max(1, int(gib * 1024 * MiB) // chunk)
    w = rng.normal(0, 0.02, chunk // 2).astype(np.float32)
    bf16 = w.view(np.uint16)[1::2].copy()             # the top halves: bfloat16 words
    fp32 = w[: chunk // 4]
    sq = (fp32 * 1e-3) ** 2
    sq[: len(sq) * 44 // 100] = 0
    return {"bf16 weights": [(bf16, "bfloat16")] * n, "fp32 weights": [(fp32, "float32")] * n,
            "fp32 exp_avg_sq": [(sq, "float32")] * n}


def _best(fn, repeat: int):
    best = None
    for _ in range(repeat):
        st = _Stages()
        t0 = time.perf_counter()
        fn(st)
        total = 1e3 * (time.perf_counter() - t0)
        if best is None or total < best[0]:
            best = (total, st.ms)
    return best


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--gib", type=float, default=1.0, help="GiB per data set")
    p.add_argument("--chunk", type=float, default=4.0, help="MiB per chunk")
    p.add_argument("--repeat", type=int, default=5, help="runs (the fastest is shown)")
    args = p.parse_args(argv)
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
    from s4fs.codec.gpu import _decode, _encode
    from s4fs.codec.gpu._backend import EmulatedBackend
    b, emu = _backend(), EmulatedBackend()
    chunk = int(args.chunk * MiB)
    rows = []
    for name, items in _sets(args.gib, chunk).items():
        gib = sum(x.nbytes for x, _ in items) / (1024 * MiB)
        # real blobs to decode: one chunk coded by the emulated pipeline, repeated
        one = np.frombuffer(_encode.compress_many(items[:1], backend=emu, out="bytes")[0],
                            np.uint8)
        blobs = [one] * len(items)
        enc = _best(lambda st: _encode.compress_many(items, backend=b, out="device",
                                                     timer=st), args.repeat)
        dec = _best(lambda st: _decode.decompress_many(blobs, backend=b, out="device",
                                                       verify=False, timer=st), args.repeat)
        for kind, (_, ms) in (("encode", enc), ("decode", dec)):
            # staging host inputs and freeing the do-nothing device's memory are left
            # out: they are page faults here, a pinned copy or no work at all on a GPU
            host = sum(v for k, v in ms.items() if k != "stage in")
            rows.append([name, kind, str(len(items)), f"{host / gib:.2f}",
                         ", ".join(f"{k} {v / gib:.2f}" for k, v in ms.items()
                                   if k != "stage in")])
    head = ["data", "", "chunks", "host ms per GiB", "stages, ms per GiB"]
    width = [max(len(str(r[i])) for r in rows + [head]) for i in range(4)]
    print(f"GPU codec host work, {args.chunk:g} MiB chunks, do-nothing device; fastest of "
          f"{args.repeat}\n")
    for r in [head] + rows:
        print("  ".join(str(c).ljust(w) for c, w in zip(r[:4], width)) + "  " + r[4])


if __name__ == "__main__":
    main()
