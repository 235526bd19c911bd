"""Adversarial inputs for lossless round trips: every bit pattern of the 16- and 8-bit
float types, the special values of fp32/fp64, random data, and delta bases.

Each generator yields ``(name, dtype, data)`` with ``data`` a bytes object, plus
``delta_cases`` yielding ``(name, dtype, data, base)``. Deterministic for a given seed.
"""

from __future__ import annotations

import struct
from typing import Iterator

import numpy as np

FLOAT_SPECIALS_32 = [
    0x00000000, 0x80000000,                  # +0, -0
    0x7F800000, 0xFF800000,                  # +inf, -inf
    0x7FC00000, 0xFFC00000,                  # quiet NaNs
    0x7FC00001, 0x7FFFFFFF, 0xFFFFFFFF,      # quiet NaNs with payloads
    0x7F800001, 0x7FBFFFFF, 0xFF800001,      # signalling NaNs with payloads
    0x00000001, 0x80000001,                  # smallest denormals
    0x007FFFFF, 0x807FFFFF,                  # largest denormals
    0x00800000, 0x80800000,                  # smallest normals
    0x7F7FFFFF, 0xFF7FFFFF,                  # largest finite
    0x3F800000, 0xBF800000,                  # +-1
]

FLOAT_SPECIALS_64 = [
    0x0000000000000000, 0x8000000000000000,
    0x7FF0000000000000, 0xFFF0000000000000,
    0x7FF8000000000000, 0xFFF8000000000000,
    0x7FF8000000000001, 0x7FFFFFFFFFFFFFFF, 0xFFFFFFFFFFFFFFFF,
    0x7FF0000000000001, 0x7FF7FFFFFFFFFFFF, 0xFFF0000000000001,
    0x0000000000000001, 0x8000000000000001,
    0x000FFFFFFFFFFFFF, 0x800FFFFFFFFFFFFF,
    0x0010000000000000, 0x7FEFFFFFFFFFFFFF, 0xFFEFFFFFFFFFFFFF,
    0x3FF0000000000000, 0xBFF0000000000000,
]


def exhaustive() -> Iterator[tuple[str, str, bytes]]:
    """Every bit pattern of every 16-bit and 8-bit float type."""
    all16 = np.arange(1 << 16, dtype=np.uint16).tobytes()
    all8 = np.arange(256, dtype=np.uint8).tobytes()
    yield "all bf16 patterns", "bfloat16", all16
    yield "all fp16 patterns", "float16", all16
    for dt in ("float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz", "float8_e5m2fnuz",
               "float8_e8m0fnu"):
        yield f"all {dt} patterns", dt, all8


def specials(seed: int = 0, n_random: int = 1_000_000) -> Iterator[tuple[str, str, bytes]]:
    """fp32/fp64 specials, alone and mixed into random values."""
    rng = np.random.default_rng(seed)
    s32 = np.array(FLOAT_SPECIALS_32, dtype=np.uint32)
    s64 = np.array(FLOAT_SPECIALS_64, dtype=np.uint64)
    yield "fp32 specials", "float32", s32.tobytes()
    yield "fp64 specials", "float64", s64.tobytes()
    r32 = rng.standard_normal(n_random).astype(np.float32).view(np.uint32)
    r32[rng.integers(0, n_random, 1000)] = rng.choice(s32, 1000)
    yield "fp32 normal + specials", "float32", r32.tobytes()
    r64 = rng.standard_normal(n_random // 4).view(np.uint64)
    r64[rng.integers(0, len(r64), 1000)] = rng.choice(s64, 1000)
    yield "fp64 normal + specials", "float64", r64.tobytes()
    yield "fp32 random bits", "float32", rng.integers(0, 1 << 32, n_random, dtype=np.uint32).tobytes()
    bf = rng.standard_normal(n_random).astype(np.float32).view(np.uint32) >> 16
    yield "bf16 normal weights", "bfloat16", bf.astype(np.uint16).tobytes()
    yield "fp16 normal weights", "float16", (rng.standard_normal(n_random) * 0.02).astype(np.float16).tobytes()
    yield "fp32 all zeros", "float32", bytes(4 * 4096)
    sq = np.abs(rng.standard_normal(n_random).astype(np.float32)) ** 2 * 1e-6
    sq[: n_random // 3] = 0
    yield "fp32 adam exp_avg_sq-like", "float32", sq.tobytes()
    rows = rng.standard_normal((n_random // 384, 384)).astype(np.float32) * 1e-4
    rows[rng.random(len(rows)) < 0.5] = 0
    yield "fp32 zero rows (untouched embeddings)", "float32", rows.tobytes()
    yield "bf16 zero rows (untouched embeddings)", "bfloat16", \
        (rows.view(np.uint32) >> 16).astype(np.uint16).tobytes()
    yield "fp32 all ones", "float32", np.ones(4096, dtype=np.float32).tobytes()
    yield "fp32 denormals only", "float32", \
        rng.integers(1, 1 << 23, 4096, dtype=np.uint32).tobytes()


def random_bytes(seed: int = 0) -> Iterator[tuple[str, str, bytes]]:
    rng = np.random.default_rng(seed)
    for n in (0, 1, 2, 3, 5, 7, 63, 64, 65, 1001, 65537, 1 << 20):
        yield f"random {n} bytes", "bytes", rng.bytes(n)
    for dt in ("bfloat16", "float32", "float64", "float8_e5m2", "int64", "bool", "complex64"):
        for n in (1, 3, 13, 4099):
            yield f"random {n} bytes as {dt}", dt, rng.bytes(n)


def all_cases(seed: int = 0, n_random: int = 1_000_000) -> Iterator[tuple[str, str, bytes]]:
    yield from exhaustive()
    yield from specials(seed, n_random)
    yield from random_bytes(seed)


def delta_cases(seed: int = 0) -> Iterator[tuple[str, str, bytes, bytes]]:
    """(name, dtype, data, base) with random, adversarial and nearby bases."""
    rng = np.random.default_rng(seed)
    all16 = np.arange(1 << 16, dtype=np.uint16)
    yield "bf16 patterns vs reversed", "bfloat16", all16.tobytes(), all16[::-1].tobytes()
    yield "fp16 patterns vs random", "float16", all16.tobytes(), rng.bytes(len(all16) * 2)
    s32 = np.array(FLOAT_SPECIALS_32, dtype=np.uint32)
    base = np.resize(s32, 4096)
    data = base.copy()
    data[::3] ^= np.uint32(1)
    yield "fp32 specials nudged", "float32", data.tobytes(), base.tobytes()
    w = rng.standard_normal(1 << 18).astype(np.float32)
    w2 = w + rng.standard_normal(w.shape).astype(np.float32) * 1e-4
    yield "fp32 nearby weights", "float32", w2.tobytes(), w.tobytes()
    yield "fp32 identical", "float32", w.tobytes(), w.tobytes()
    yield "bytes random vs random", "bytes", rng.bytes(10_001), rng.bytes(10_001)
    yield "empty", "float32", b"", b""


def pack_u32(values) -> bytes:
    return struct.pack(f"<{len(values)}I", *values)
