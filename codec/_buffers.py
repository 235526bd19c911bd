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


def xor(a, b) -> np.ndarray:
    """Byte-XOR of two equal-length buffers."""
    x = np.frombuffer(a, dtype=np.uint8)
    y = np.frombuffer(b, dtype=np.uint8)
    n8 = len(x) // 8 * 8
    out = np.empty(len(x), dtype=np.uint8)
    np.bitwise_xor(x[:n8].view(np.uint64), y[:n8].view(np.uint64), out=out[:n8].view(np.uint64))
    np.bitwise_xor(x[n8:], y[n8:], out=out[n8:])
    return out
