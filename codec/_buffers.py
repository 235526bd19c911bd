"""Byte views, checksums and XOR of the buffers the codec is given (both pipelines)."""

from __future__ import annotations

import numpy as np
import xxhash


def as_bytes(data) -> memoryview:
    """A flat byte view of bytes-likes, NumPy arrays and (CPU) torch tensors."""
    mod = type(data).__module__
    if mod.startswith("torch"):
        t = data.detach()
        if t.device.type != "cpu":
            t = t.cpu()
        t = t.contiguous().reshape(-1)
        if t.numel() == 0:
            return memoryview(b"")
        import torch
        return memoryview(t.view(torch.uint8).numpy()).cast("B")
    if isinstance(data, np.ndarray):
        return memoryview(np.ascontiguousarray(data).reshape(-1).view(np.uint8)).cast("B")
    mv = memoryview(data)
    if not mv.c_contiguous:
        mv = memoryview(mv.tobytes())
    return mv.cast("B") if mv.format != "B" or mv.ndim != 1 else mv


def checksum(data) -> int:
    return xxhash.xxh3_64_intdigest(data)


_WORDS = {1: (np.uint8, np.int8), 2: (np.uint16, np.int16), 4: (np.uint32, np.int32),
          8: (np.uint64, np.int64)}


def word_size(itemsize: int) -> int:
    """The word a difference delta is taken over: the item, 8 bytes for wider ones
    (complex128: its two float64 parts). Part of the blob format: never change it."""
    return itemsize if itemsize in _WORDS else 8


def diff(a, b, itemsize: int) -> np.ndarray:
    """The zigzag-coded difference ``a - b`` of two equal-length buffers, word by word
    (little-endian words of ``itemsize`` bytes, wrapping): small changes of a number's
    bits become small unsigned numbers, whatever their sign or the carries between
    them — where a byte-XOR of two nearby floats keeps every bit a carry flipped. Bytes
    past the last whole word are XOR-ed. Undone by :func:`undiff`."""
    itemsize = word_size(itemsize)
    u, s = _WORDS[itemsize]
    x = np.frombuffer(a, dtype=np.uint8)
    y = np.frombuffer(b, dtype=np.uint8)
    n = len(x) // itemsize * itemsize
    out = np.empty(len(x), dtype=np.uint8)
    d = (x[:n].view(u) - y[:n].view(u)).view(s)             # wraps: uint arithmetic
    bits = 8 * itemsize - 1
    out[:n].view(u)[:] = ((d << 1) ^ (d >> bits)).view(u)   # zigzag
    np.bitwise_xor(x[n:], y[n:], out=out[n:])
    return out


def undiff(d, b, itemsize: int) -> np.ndarray:
    """The bytes :func:`diff` was given: ``b`` plus the zigzag-decoded words of ``d``."""
    itemsize = word_size(itemsize)
    u, s = _WORDS[itemsize]
    z = np.frombuffer(d, dtype=np.uint8)
    y = np.frombuffer(b, dtype=np.uint8)
    n = len(z) // itemsize * itemsize
    out = np.empty(len(z), dtype=np.uint8)
    w = z[:n].view(u)
    delta = (w >> u(1)) ^ (np.zeros(1, u) - (w & u(1)))      # un-zigzag, as unsigned
    out[:n].view(u)[:] = y[:n].view(u) + delta
    np.bitwise_xor(z[n:], y[n:], out=out[n:])
    return out


def xor(a, b) -> np.ndarray:
    """Byte-XOR of two equal-length buffers."""
    x = np.frombuffer(a, dtype=np.uint8)
    y = np.frombuffer(b, dtype=np.uint8)
    n8 = len(x) // 8 * 8
    out = np.empty(len(x), dtype=np.uint8)
    np.bitwise_xor(x[:n8].view(np.uint64), y[:n8].view(np.uint64), out=out[:n8].view(np.uint64))
    np.bitwise_xor(x[n8:], y[n8:], out=out[n8:])
    return out
