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

The other direction, for a copy saved *after* its master: the copy's words are coded on
the master's (``copy_residual`` / ``copy_restore``)::

    d = bits(c) - nearest(m)            (16-bit words, wrapping)

``nearest(m)`` is the master rounded to the copy's precision, to nearest even (bf16:
torch's rule, NaN to 0x7FC0; fp16: IEEE's, a NaN to the quiet NaN of its sign). Where
the copy is that rounding, every ``d`` is zero and the copy costs next to nothing; any
other copy is a bijection too, so it costs bytes, never correctness.
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
    """The fp32 bit patterns (uint32, a new array) of the copy's values (``copy``: uint16
    words)."""
    if kind == "bfloat16":
        out = copy.astype(np.uint32)
        out <<= np.uint32(16)
        return out
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
    out = widen(c, kind)                             # a new array: worked on in place
    np.subtract(m, out, out=out)                     # uint32: wraps
    out += HALF[kind]
    return out.view(np.uint8)


def restore(res, copy, kind: str) -> np.ndarray:
    """The fp32 words :func:`residual` was given, from their residual and the copy."""
    r, c = _words(res, copy, kind)
    out = widen(c, kind)
    out += r
    out -= HALF[kind]
    return out.view(np.uint8)


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


def nearest(master: np.ndarray, kind: str) -> np.ndarray:
    """The uint16 words of fp32 words ``master`` (uint32) rounded to ``kind``, to nearest
    even: what ``copy_`` into a bf16 or fp16 tensor gives, NaNs made one fixed quiet NaN
    (the rule is the format's: written out, so every machine predicts the same words)."""
    if kind == "bfloat16":
        t = master >> np.uint32(16)
        t &= np.uint32(1)
        t += np.uint32(0x7FFF)
        t += master
        t >>= np.uint32(16)
        out = t.astype(np.uint16)
        nan = _nans(master, t)
        if nan is not None:
            out[nan] = 0x7FC0
        return out
    nan = (master & np.uint32(0x7FFFFFFF)) > np.uint32(0x7F800000)
    if kind == "float16":
        with np.errstate(over="ignore", invalid="ignore"):
            out = master.view(np.float32).astype(np.float16).view(np.uint16)
        out = out.copy()
        out[nan] = ((master[nan] >> np.uint32(16)) & np.uint32(0x8000)).astype(np.uint16) \
            | np.uint16(0x7E00)
        return out
    raise CodecError(f"a pair's copy is bfloat16 or float16, not {kind!r}")


def _nans(master: np.ndarray, scratch: np.ndarray) -> np.ndarray | None:
    """Where ``master`` holds NaNs (None: nowhere, the common case); ``scratch``, an
    array as long, is overwritten."""
    np.bitwise_and(master, np.uint32(0x7FFFFFFF), out=scratch)
    if scratch.max(initial=0) <= 0x7F800000:
        return None
    return scratch > np.uint32(0x7F800000)


def _copy_words(copy, master, kind: str) -> tuple[np.ndarray, np.ndarray]:
    m, c = _words(master, copy, kind)
    return c, m


def copy_residual(copy, master, kind: str) -> np.ndarray:
    """The residual bytes (as long as ``copy``) of ``kind`` words given their fp32
    master: zero wherever the copy is the master rounded to nearest."""
    c, m = _copy_words(copy, master, kind)
    out = nearest(m, kind)                           # a new array: worked on in place
    np.subtract(c, out, out=out)                     # uint16: wraps
    return out.view(np.uint8)


def copy_restore(res, master, kind: str) -> np.ndarray:
    """The copy :func:`copy_residual` was given, from its residual and the master."""
    r, m = _copy_words(res, master, kind)
    out = nearest(m, kind)
    out += r
    return out.view(np.uint8)
