"""Byte planes: split an array of elements into planes that compress well, and merge
them back. Pure NumPy, vectorised; every function is an exact inverse of its partner.

Layouts (the number is written into the blob):

* ``FLAT`` — one plane, the bytes as they are.
* ``FLOAT`` — per float word: sign bits packed 8 to a byte (little bit order), then the
  exponent field as byte planes (most significant first), then the mantissa field as byte
  planes (most significant first). Words of 8 bits or fewer keep exponent and mantissa
  together in one 7-bit "magnitude" plane.
* ``BYTES`` — byte-grouped: plane *k* holds byte *k* of every element (integer storages).

Any bytes past the last whole word/element form a last ``tail`` plane.
"""

from __future__ import annotations

import numpy as np

from ._dtypes import DType

FLAT = 0
FLOAT = 1
BYTES = 2

_UINT = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}


def layout_for(dt: DType) -> int:
    if dt.is_float:
        return FLOAT
    if dt.itemsize > 1:
        return BYTES
    return FLAT


def _unit(dt: DType, layout: int) -> int:
    if layout == FLOAT:
        return dt.word
    if layout == BYTES:
        return dt.itemsize
    return 1


def _field_bytes(bits: int) -> int:
    return (bits + 7) // 8


def plane_sizes(dt: DType, layout: int, raw_len: int) -> list[int]:
    """Raw length of every plane for ``raw_len`` input bytes (decoder and encoder agree)."""
    unit = _unit(dt, layout)
    n, tail = divmod(raw_len, unit)
    if layout == FLAT:
        return [raw_len]
    if layout == BYTES:
        sizes = [n] * unit
    else:
        sizes = [(n + 7) // 8]
        if dt.ebits + dt.mbits <= 7:
            sizes.append(n)
        else:
            sizes += [n] * (_field_bytes(dt.ebits) + _field_bytes(dt.mbits))
    if tail:
        sizes.append(tail)
    return sizes


def split(data: memoryview, dt: DType, layout: int) -> list[memoryview | np.ndarray]:
    """Split raw bytes into planes (each a contiguous uint8 array or memoryview)."""
    if layout == FLAT:
        return [data]
    unit = _unit(dt, layout)
    n, tail = divmod(len(data), unit)
    body = np.frombuffer(data, dtype=np.uint8, count=n * unit)
    planes: list = []
    if layout == BYTES:
        grid = body.reshape(n, unit)
        planes = [np.ascontiguousarray(grid[:, k]) for k in range(unit)]
    else:
        planes = _split_float(body.view(_UINT[unit]), dt, unit * 8)
    if tail:
        planes.append(data[n * unit:])
    return planes


def _split_float(words: np.ndarray, dt: DType, bits: int) -> list[np.ndarray]:
    ut = words.dtype.type
    sign = np.packbits((words >> ut(bits - 1)).astype(np.uint8), bitorder="little")
    if dt.ebits + dt.mbits <= 7:
        return [sign, (words & ut((1 << (bits - 1)) - 1)).astype(np.uint8)]
    out = [sign]
    exp = (words >> ut(dt.mbits)) & ut((1 << dt.ebits) - 1)
    out += _byte_planes(exp, _field_bytes(dt.ebits), ut)
    mant = words & ut((1 << dt.mbits) - 1) if dt.mbits < bits else words
    out += _byte_planes(mant, _field_bytes(dt.mbits), ut)
    return out


def _byte_planes(field: np.ndarray, nbytes: int, ut) -> list[np.ndarray]:
    if nbytes == 1:
        return [field.astype(np.uint8)]
    return [(field >> ut(8 * k)).astype(np.uint8) for k in range(nbytes - 1, -1, -1)]


def merge(planes: list, dt: DType, layout: int, raw_len: int) -> bytes:
    """Inverse of :func:`split`; ``planes`` are bytes-like of the sizes in plane_sizes."""
    if layout == FLAT:
        return bytes(planes[0])
    unit = _unit(dt, layout)
    n, tail = divmod(raw_len, unit)
    out = np.empty(raw_len, dtype=np.uint8)
    if layout == BYTES:
        grid = out[: n * unit].reshape(n, unit)
        for k in range(unit):
            grid[:, k] = np.frombuffer(planes[k], dtype=np.uint8, count=n)
    else:
        _merge_float(out[: n * unit].view(_UINT[unit]), planes, dt, unit * 8, n)
    if tail:
        out[n * unit:] = np.frombuffer(planes[-1], dtype=np.uint8, count=tail)
    return out.tobytes()


def _merge_float(words: np.ndarray, planes: list, dt: DType, bits: int, n: int) -> None:
    ut = words.dtype.type
    sign = np.unpackbits(np.frombuffer(planes[0], dtype=np.uint8), count=n, bitorder="little")
    words[:] = sign.astype(ut) << ut(bits - 1)
    if dt.ebits + dt.mbits <= 7:
        words |= np.frombuffer(planes[1], dtype=np.uint8, count=n).astype(ut)
        return
    ne, nm = _field_bytes(dt.ebits), _field_bytes(dt.mbits)
    exp = _join(planes[1: 1 + ne], n, ut)
    mant = _join(planes[1 + ne: 1 + ne + nm], n, ut)
    words |= exp << ut(dt.mbits)
    words |= mant


def _join(planes: list, n: int, ut) -> np.ndarray:
    acc = np.zeros(n, dtype=ut)
    for p in planes:
        if acc.dtype.itemsize > 1:
            acc <<= ut(8)
        acc |= np.frombuffer(p, dtype=np.uint8, count=n).astype(ut)
    return acc
