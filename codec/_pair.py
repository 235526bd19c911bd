"""Pairs: fp32 words coded given a low-precision copy of them.

Mixed-precision training keeps every weight twice: the fp32 master the optimizer
updates and the bf16 (or fp16) copy the model computes with, which is the master
rounded to nearest even. Given the copy, a master word is known to within half a step
of the copy's precision, so only its position inside that step is new information.

The residual of a master word ``m`` given its copy ``c`` is, on 32-bit words (wrapping)::

    r = bits(m) - widen(c) + H

``widen(c)`` is the fp32 bit pattern of the copy's exact value (bf16: ``c << 16``; fp16:
the IEEE conversion, NaN payloads moved to the top of the fp32 mantissa), ``H`` half a
step of the copy in fp32 units (2**15 for bf16, 2**12 for fp16 normals). Where the copy
is the master rounded to nearest, ``r`` lies in ``[0, 2H]``: its two (bf16) or one and a
half (fp16) low bytes carry the information and the high bytes are zero, which the
byte-grouped planes then store for next to nothing. The transform is a bijection on
words for any copy and any master: a copy that is not the rounding (stochastic rounding,
a step taken between copy and save, NaN) costs bytes, never correctness.

``residual`` and ``restore`` are exact inverses for every input of matching lengths.
"""

from __future__ import annotations

import numpy as np

from s4fs.errors import CodecError

#: half a step of each copy type, in fp32 units (the residual's offset)
HALF = {"bfloat16": np.uint32(1 << 15), "float16": np.uint32(1 << 12)}

_FP16_TABLE: np.ndarray | None = None


def _fp16_widen_table() -> np.ndarray:
    """fp32 bit pattern of every fp16 value (65,536 entries), built once. Finite values
    and infinities convert exactly under IEEE rules; a NaN keeps its sign and payload,
    the payload moved to the top of the fp32 mantissa (what a CPU's conversion does,
    written out so that every machine builds the same table)."""
    global _FP16_TABLE
    if _FP16_TABLE is None:
        h = np.arange(1 << 16, dtype=np.uint32)
        with np.errstate(invalid="ignore"):
            t = h.astype(np.uint16).view(np.float16).astype(np.float32).view(np.uint32)
        nan = ((h >> 10) & 0x1F == 0x1F) & (h & 0x3FF != 0)
        t = t.copy()
        t[nan] = ((h[nan] >> 15) << 31) | np.uint32(0x7F800000) | ((h[nan] & 0x3FF) << 13)
        _FP16_TABLE = t
    return _FP16_TABLE


def widen(copy: np.ndarray, kind: str) -> np.ndarray:
    """The fp32 bit patterns (uint32) of the copy's values (``copy``: uint16 words)."""
    if kind == "bfloat16":
        return copy.astype(np.uint32) << np.uint32(16)
    if kind == "float16":
        return _fp16_widen_table()[copy]
    raise CodecError(f"a pair's copy is bfloat16 or float16, not {kind!r}")


def _words(master, copy, kind: str) -> tuple[np.ndarray, np.ndarray]:
    m = np.frombuffer(master, dtype=np.uint8)
    c = np.frombuffer(copy, dtype=np.uint8)
    if kind not in HALF:
        raise CodecError(f"a pair's copy is bfloat16 or float16, not {kind!r}")
    if len(m) % 4 or len(c) * 2 != len(m):
        raise CodecError(f"a pair needs fp32 words and a copy of half their bytes; got "
                         f"{len(m)} and {len(c)} bytes")
    return m.view("<u4"), c.view("<u2")


def residual(master, copy, kind: str) -> np.ndarray:
    """The residual bytes (as long as ``master``) of fp32 words given their ``kind`` copy."""
    m, c = _words(master, copy, kind)
    out = m - widen(c, kind) + HALF[kind]            # uint32: wraps
    return out.astype("<u4", copy=False).view(np.uint8)


def restore(res, copy, kind: str) -> np.ndarray:
    """The fp32 words :func:`residual` was given, from their residual and the copy."""
    r, c = _words(res, copy, kind)
    out = r - HALF[kind] + widen(c, kind)
    return out.astype("<u4", copy=False).view(np.uint8)


def rounds_to(master, copy, kind: str, sample: int = 4096) -> float:
    """The share of a sample of words whose residual lies within the copy's half step
    (the copy is, about there, the master rounded): what a matcher asks before it pairs
    two tensors. Cheap: at most ``sample`` words, spread over the buffer."""
    m, c = _words(master, copy, kind)
    if not len(m):
        return 0.0
    idx = np.linspace(0, len(m) - 1, num=min(sample, len(m)), dtype=np.int64)
    r = m[idx] - widen(c[idx], kind) + HALF[kind]
    return float(np.mean(r <= 2 * HALF[kind]))
