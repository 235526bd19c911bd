"""Codec benchmark on real data: all-MiniLM-L6-v2 weights and real AdamW state.

    python bench/codec.py [--steps 300] [--repeat 5] [--threads 2] [--cache DIR]

Prints ONE table: for each data set (the model's weights as fp32, bf16 and fp16; AdamW
``exp_avg`` and ``exp_avg_sq`` after ``--steps`` real fine-tuning steps), the stored size
(% of raw) and compress / decompress speed (MB/s = 10^6 raw bytes per second, medians) of

* s4fs on the CPU, over 4 MiB chunks (the ingest chunk size), on 1 thread and on
  ``--threads`` threads (chunks coded in a thread pool, as the ingest pipeline does),
* ZipNN 0.5.x on 1 and on ``--threads`` threads (it gets a fresh copy of the bytes
  every time: it overwrites the buffer it is given),
* zstd -3 on the raw bytes, and on the byte-grouped bytes (plane k = byte k of every
  element), one thread,
* the order-0 entropy of the sign, exponent and mantissa fields (the mantissa as
  bytes), taken over the whole data set: a bound for coders that see one symbol at a
  time, not for coders that use runs or repeats.

Every tool gets the same bytes: the float tensors of the state dict concatenated in
file order (for AdamW state, in parameter order). Every result is decoded and
compared with the input. When ``bench/codec_gpu.py`` exists and CUDA is available, its
``run(args)`` prints the GPU section after the table.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import machine, pct, rate, table  # noqa: E402

CHUNK = 4 << 20
FIELDS = {"bfloat16": (16, 8, 7), "float16": (16, 5, 10), "float32": (32, 8, 23)}


# --- data ------------------------------------------------------------------------------

def datasets(steps: int, cache: Path | None) -> list[tuple[str, str, bytes]]:
    import torch

    import _minilm as minilm

    weights = [v for v in minilm.load_weights().values() if v.is_floating_point()]
    flat = torch.cat([v.reshape(-1) for v in weights])
    out = [(f"weights {name}", name, flat.to(dt).view(torch.uint8).numpy().tobytes())
           for name, dt in (("float32", torch.float32), ("bfloat16", torch.bfloat16),
                            ("float16", torch.float16))]
    state = None
    path = cache / f"adamw_{steps}.npz" if cache else None
    if path is not None and path.exists():
        with np.load(path) as z:
            state = {k: z[k] for k in ("exp_avg", "exp_avg_sq")}
    if state is None:
        t0 = time.perf_counter()
        for _step, _model, opt in minilm.finetune(steps, every=steps):
            pass
        adam = minilm.adam_state(opt)
        state = {k: torch.cat([t.reshape(-1) for _, t in sorted(adam[k].items())]).numpy()
                 for k in ("exp_avg", "exp_avg_sq")}
        print(f"# fine-tuned {steps} AdamW steps in {time.perf_counter() - t0:.0f} s",
              file=sys.stderr)
        if path is not None:
            path.parent.mkdir(parents=True, exist_ok=True)
            np.savez(path, **state)
    for k in ("exp_avg", "exp_avg_sq"):
        out.append((f"AdamW {k} float32, {steps} steps", "float32", state[k].tobytes()))
    return out


def entropy_bound(data: bytes, dtype: str) -> int:
    """Order-0 entropy in bytes of the sign, exponent and mantissa fields (mantissa as
    bytes, most significant first), each with one histogram over the whole buffer."""
    bits, eb, mb = FIELDS[dtype]
    w = np.frombuffer(data, dtype={16: np.uint16, 32: np.uint32}[bits]).astype(np.uint64)
    fields = [w >> (bits - 1), (w >> mb) & ((1 << eb) - 1)]
    for shift in range((mb - 1) // 8 * 8, -1, -8):
        fields.append((w >> shift) & ((1 << min(8, mb - shift)) - 1))
    total = 0.0
    for f in fields:
        c = np.bincount(f.astype(np.int64))
        p = c[c > 0] / f.size
        total += float(-(p * np.log2(p)).sum()) * f.size
    return int(total / 8)


# --- methods -------------------------------------------------------------------------

def _chunks(data: bytes) -> list[memoryview]:
    mv = memoryview(data)
    return [mv[i: i + CHUNK] for i in range(0, len(mv), CHUNK)]


def s4fs_method(threads: int):
    from s4fs import codec

    pool = ThreadPoolExecutor(threads) if threads > 1 else None

    def run(fn, items):
        return list(pool.map(fn, items)) if pool else [fn(x) for x in items]

    def comp(data, dtype):
        parts = _chunks(data)
        return run(lambda c: codec.compress(c, dtype, device="cpu"), parts)

    def decomp(blobs, dtype):
        return b"".join(run(lambda b: codec.decompress(b, device="cpu"), blobs))

    return comp, decomp, lambda blobs: sum(len(b) for b in blobs)


def zipnn_method(threads: int):
    from zipnn import ZipNN

    coders: dict[str, ZipNN] = {}

    def comp(data, dtype):
        z = coders.get(dtype)
        if z is None:
            z = coders[dtype] = ZipNN(input_format="byte", bytearray_dtype=dtype,
                                      threads=threads)
        return z, z.compress(bytearray(data))       # ZipNN overwrites its input: a copy

    def decomp(blob, dtype):
        z, b = blob
        return bytes(z.decompress(b))

    return comp, decomp, lambda blob: len(blob[1])


def zstd_raw_method():
    import zstandard

    def comp(data, dtype):
        return zstandard.ZstdCompressor(level=3).compress(data)

    def decomp(blob, dtype):
        return zstandard.ZstdDecompressor().decompress(blob)

    return comp, decomp, len


def zstd_grouped_method():
    import zstandard

    def comp(data, dtype):
        k = FIELDS[dtype][0] // 8
        grid = np.frombuffer(data, dtype=np.uint8).reshape(-1, k)
        c = zstandard.ZstdCompressor(level=3)
        return k, [c.compress(np.ascontiguousarray(grid[:, i])) for i in range(k)]

    def decomp(blob, dtype):
        k, planes = blob
        d = zstandard.ZstdDecompressor()
        cols = [np.frombuffer(d.decompress(p), dtype=np.uint8) for p in planes]
        out = np.empty((cols[0].size, k), dtype=np.uint8)
        for i, c in enumerate(cols):
            out[:, i] = c
        return out.tobytes()

    return comp, decomp, lambda blob: sum(len(p) for p in blob[1])


def methods(threads: int):
    out = [("s4fs cpu, 1 thread", s4fs_method(1))]
    if threads > 1:
        out.append((f"s4fs cpu, {threads} threads", s4fs_method(threads)))
    try:
        import zipnn  # noqa: F401
        out.append(("ZipNN, 1 thread", zipnn_method(1)))
        if threads > 1:
            out.append((f"ZipNN, {threads} threads", zipnn_method(threads)))
    except ImportError:
        print("# zipnn is not installed: its rows are left out", file=sys.stderr)
    out.append(("zstd -3 raw", zstd_raw_method()))
    out.append(("zstd -3 byte-grouped", zstd_grouped_method()))
    return out


# --- main --------------------------------------------------------------------------------

def measure(sets, repeat: int, threads: int):
    """Per data set, every method's compress (then decompress) is timed once per round,
    round after round, so a burst of load on the shared machine hits all of them alike;
    each cell is the median over the rounds, after one warm-up round."""
    import statistics
    rows = []
    meths = methods(threads)
    for name, dtype, data in sets:
        n = len(data)
        blobs, tc, td = {}, {m: [] for m, _ in meths}, {m: [] for m, _ in meths}
        for rnd in range(repeat + 1):
            for label, (comp, _decomp, _size) in meths:
                t0 = time.perf_counter()
                blobs[label] = comp(data, dtype)
                if rnd:
                    tc[label].append(time.perf_counter() - t0)
            for label, (_comp, decomp, _size) in meths:
                t0 = time.perf_counter()
                back = decomp(blobs[label], dtype)
                if rnd:
                    td[label].append(time.perf_counter() - t0)
                if back != data:
                    raise SystemExit(f"{label} did not round-trip {name}")
                del back
        for label, (_comp, _decomp, size) in meths:
            rows.append([name, label, pct(size(blobs[label]), n),
                         rate(n, statistics.median(tc[label])),
                         rate(n, statistics.median(td[label]))])
        rows.append([name, "order-0 entropy bound", pct(entropy_bound(data, dtype), n),
                     "", ""])
        print(f"# {name} done", file=sys.stderr)
    return rows


def gpu_section(args) -> None:
    path = Path(__file__).resolve().parent / "codec_gpu.py"
    if not path.exists():
        return
    try:
        import torch
        if not torch.cuda.is_available():
            return
    except ImportError:
        return
    spec = importlib.util.spec_from_file_location("codec_gpu", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    mod.run(args)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=300, help="AdamW fine-tuning steps")
    ap.add_argument("--repeat", type=int, default=5, help="timed runs per cell (median)")
    ap.add_argument("--threads", type=int, default=min(2, os.cpu_count() or 1),
                    help="threads for the multi-threaded rows")
    ap.add_argument("--cache", type=Path, default=None,
                    help="folder to keep the fine-tuned AdamW state in between runs")
    args = ap.parse_args(argv)
    sets = datasets(args.steps, args.cache)
    rows = measure(sets, args.repeat, args.threads)
    print(f"codec benchmark: {machine()}; medians of {args.repeat} interleaved runs; "
          f"MB/s = 10^6 raw bytes per second")
    print(table(["data", "codec", "stored %", "compress MB/s", "decompress MB/s"], rows,
                align="llrrr"))
    gpu_section(args)


if __name__ == "__main__":
    main()
