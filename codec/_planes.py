"""Byte planes: split an array of elements into planes that compress well, and merge
them back. Pure NumPy, vectorised; every function is an exact inverse of its partner.

Layouts (the number is written into the blob):

* ``FLAT`` — one plane, the bytes as they are.
* ``FLOAT`` — per float word: sign bits packed 8 to a byte (little bit order), then the
  exponent field as byte planes (most significant first), then the mantissa field as byte
  planes (most significant first). Words of 8 bits or fewer keep exponent and mantissa
  together in one 7-bit "magnitude" plane.
* ``BYTES`` — byte-grouped: plane *k* holds byte *k* of every element (integer storages).
* ``FLOAT_SM`` — for float words with an 8-bit exponent and a mantissa of 8k+7 bits
  (bf16, fp32, complex64): the exponent byte first, then the sign folded into the top
  7 mantissa bits as one byte, then the remaining mantissa bytes (most significant
  first). Same information as ``FLOAT`` in whole bytes: the exponent plane gets the
  entropy coder and the rest is stored as it is unless it measurably compresses, which
  is what makes the CPU path fast. Split and merge are whole-word (bf16) or uint8
  column operations.
* ``SIGN_BYTES`` — for fp16 (and complex32): sign bits packed 8 to a byte (little bit
  order), then the words without their sign bit as byte planes, most significant first
  (exponent + top mantissa bits, then the low mantissa byte). Huffman codes the 7-bit
  exponent byte 0.05 % tighter than the byte with the sign in it.

Any bytes past the last whole word/element form a last ``tail`` plane.

The CPU layouts (``FLOAT_SM``, ``BYTES``, ``SIGN_BYTES``) split and merge in a small C
extension (``_shuffle.c``, built at install; it releases the GIL) when it is there; the
NumPy code here is the reference it is tested against, and the fallback without it.
"""

from __future__ import annotations

import numpy as np

from ._dtypes import DType

FLAT = 0
FLOAT = 1
BYTES = 2
FLOAT_SM = 3
SIGN_BYTES = 4

LAYOUTS = (FLAT, FLOAT, BYTES, FLOAT_SM, SIGN_BYTES)

# what a plane holds, so the CPU path can pick a plane codec without trying them all
ENTROPY = "entropy"     # skewed symbols, few repeats (exponents): Huffman coding
GENERIC = "generic"     # anything else (mantissa bytes, integers, opaque bytes): zstd

_UINT = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}

try:                                  # the C twin of the NumPy code below
    import s4fs.codec._shuffle as _shuffle
except ImportError:                   # not built (a source checkout without a compiler)
    _shuffle = None

#: use the C extension where it covers a layout (tests turn it off for the reference)
USE_C = _shuffle is not None


def layout_for(dt: DType) -> int:
    if dt.is_float:
        return FLOAT
    if dt.itemsize > 1:
        return BYTES
    return FLAT


def cpu_layout_for(dt: DType) -> int:
    """The layout the CPU path writes (``layout_for`` is the one the GPU path writes;
    every reader decodes both)."""
    if _sm_ok(dt):
        return FLOAT_SM
    if dt.is_float and dt.word == 1:
        return FLAT              # fp8: a Huffman-coded byte is sign + magnitude already
    if dt.is_float and dt.word == 2:
        return SIGN_BYTES        # fp16, complex32
    if dt.itemsize > 1:
        return BYTES             # fp64, complex128, integers: byte-grouped
    return FLAT


def fits(dt: DType, layout: int) -> bool:
    """Whether ``layout`` is defined for ``dt`` (a corrupt or hand-made header may pair
    them otherwise)."""
    if layout in (FLAT, BYTES):
        return True
    if layout in (FLOAT, SIGN_BYTES):
        return dt.is_float
    return layout == FLOAT_SM and _sm_ok(dt)


def _sm_ok(dt: DType) -> bool:
    return dt.is_float and dt.ebits == 8 and dt.mbits % 8 == 7 and dt.word in (2, 4)


def plane_kinds(dt: DType, layout: int, raw_len: int) -> list[str]:
    """ENTROPY or GENERIC for every plane of :func:`plane_sizes`."""
    sizes = plane_sizes(dt, layout, raw_len)
    kinds = [GENERIC] * len(sizes)
    if layout == FLAT:
        if dt.is_float:
            kinds[0] = ENTROPY
    elif layout == FLOAT_SM:
        kinds[0] = ENTROPY
    elif layout == SIGN_BYTES:
        kinds[1] = ENTROPY
    elif layout == FLOAT:
        kinds[1] = ENTROPY
        if dt.ebits + dt.mbits > 7 and dt.ebits > 8:
            kinds[2] = ENTROPY
    elif layout == BYTES and dt.is_float:
        # little endian: the top byte of each float word holds sign and exponent bits,
        # and so does the next one when the exponent is wider than 7 bits
        for end in range(dt.word, dt.itemsize + 1, dt.word):
            kinds[end - 1] = ENTROPY
            if dt.ebits > 7 and dt.word > 1:
                kinds[end - 2] = ENTROPY
    return kinds


def _unit(dt: DType, layout: int) -> int:
    if layout in (FLOAT, FLOAT_SM, SIGN_BYTES):
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
    if layout in (BYTES, FLOAT_SM):
        sizes = [n] * unit
    elif layout == SIGN_BYTES:
        sizes = [(n + 7) // 8] + [n] * unit
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
    fast = _split_c(body, dt, layout, unit, n) if USE_C else None
    if fast is not None:
        planes = fast
    elif layout == BYTES:
        planes = list(body.reshape(n, unit).T.copy())     # one transposing copy
    elif layout == FLOAT_SM:
        planes = _split_sm(body.reshape(n, unit))
    elif layout == SIGN_BYTES:
        rows = body.reshape(n, unit).T.copy()
        hi = rows[unit - 1]
        sign = np.packbits(hi >> 7, bitorder="little")
        hi &= 0x7F
        planes = [sign] + [rows[k] for k in range(unit - 1, -1, -1)]
    else:
        planes = _split_float(body.view(_UINT[unit]), dt, unit * 8)
    if tail:
        planes.append(data[n * unit:])
    return planes


def _split_c(body: np.ndarray, dt: DType, layout: int, unit: int, n: int):
    """The split in C, as views of one buffer; None where C does not cover it."""
    if layout == FLOAT_SM and unit in (2, 4):
        out = np.empty(n * unit, dtype=np.uint8)
        _shuffle.split_sm(body, out, unit)
    elif layout == BYTES and unit <= 16:
        out = np.empty(n * unit, dtype=np.uint8)
        _shuffle.split_bytes(body, out, unit)
    elif layout == SIGN_BYTES and unit <= 16:
        ns = (n + 7) // 8
        out = np.empty(ns + n * unit, dtype=np.uint8)
        _shuffle.split_sign_bytes(body, out, unit)
        return [out[:ns]] + [out[ns + k * n: ns + (k + 1) * n] for k in range(unit)]
    else:
        return None
    return [out[k * n: (k + 1) * n] for k in range(unit)]


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


def _split_sm(grid: np.ndarray) -> list[np.ndarray]:
    unit = grid.shape[1]
    if unit == 2:                  # bf16: whole-word ops beat strided byte columns
        w = grid.reshape(-1).view(np.uint16)
        n = w.size
        exp, sm, tmp = (np.empty(n, dtype=np.uint8) for _ in range(3))
        np.right_shift(w, 7, out=exp, casting="unsafe")
        np.bitwise_and(w, 0x7F, out=sm, casting="unsafe")
        np.right_shift(w, 8, out=tmp, casting="unsafe")
        tmp &= 0x80
        sm |= tmp
        return [exp, sm]
    rows = grid.T.copy()           # one transposing copy, then in-place byte ops
    hi, nxt = rows[unit - 1], rows[unit - 2]            # s|e7 and e0|m7
    exp = np.left_shift(hi, 1)
    exp |= nxt >> 7
    nxt &= 0x7F
    nxt |= hi & 0x80                                    # now s|m7
    return [exp, nxt] + [rows[k] for k in range(unit - 3, -1, -1)]


def _merge_sm(grid: np.ndarray, planes: list, n: int) -> None:
    unit = grid.shape[1]
    exp = np.frombuffer(planes[0], dtype=np.uint8, count=n)
    sm = np.frombuffer(planes[1], dtype=np.uint8, count=n)
    if unit == 2:
        w = grid.reshape(-1).view(np.uint16)
        np.left_shift(exp, 7, out=w, dtype=np.uint16)
        t = np.bitwise_and(sm, 0x80, dtype=np.uint16)
        t <<= 8
        w |= t
        np.bitwise_and(sm, 0x7F, out=t, dtype=np.uint16)
        w |= t
        return
    hi = exp >> 1
    hi |= sm & 0x80
    nxt = np.left_shift(exp, 7)
    nxt |= sm & 0x7F
    grid[:, unit - 1] = hi
    grid[:, unit - 2] = nxt
    for i, k in enumerate(range(unit - 3, -1, -1)):
        grid[:, k] = np.frombuffer(planes[2 + i], dtype=np.uint8, count=n)


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
    if USE_C and _merge_c(planes, out[: n * unit], layout, unit):
        pass
    elif layout == BYTES:
        grid = out[: n * unit].reshape(n, unit)
        for k in range(unit):
            grid[:, k] = np.frombuffer(planes[k], dtype=np.uint8, count=n)
    elif layout == FLOAT_SM:
        _merge_sm(out[: n * unit].reshape(n, unit), planes, n)
    elif layout == SIGN_BYTES:
        _merge_sign_bytes(out[: n * unit].reshape(n, unit), planes, n)
    else:
        _merge_float(out[: n * unit].view(_UINT[unit]), planes, dt, unit * 8, n)
    if tail:
        out[n * unit:] = np.frombuffer(planes[-1], dtype=np.uint8, count=tail)
    return out.tobytes()


def _merge_c(planes: list, dest: np.ndarray, layout: int, unit: int) -> bool:
    """The merge in C into ``dest``; False where C does not cover it."""
    if layout == FLOAT_SM and unit in (2, 4):
        _shuffle.merge_sm(planes, dest, unit)
    elif layout == BYTES and unit <= 16:
        _shuffle.merge_bytes(planes, dest, unit)
    elif layout == SIGN_BYTES and unit <= 16:
        _shuffle.merge_sign_bytes(planes, dest, unit)
    else:
        return False
    return True


def _merge_sign_bytes(grid: np.ndarray, planes: list, n: int) -> None:
    unit = grid.shape[1]
    sign = np.unpackbits(np.frombuffer(planes[0], dtype=np.uint8), count=n,
                         bitorder="little")
    if unit == 2:                  # whole-word ops beat strided byte columns
        w = grid.reshape(-1).view(np.uint16)
        np.left_shift(np.frombuffer(planes[1], dtype=np.uint8, count=n), 8, out=w,
                      dtype=np.uint16)
        np.bitwise_or(w, np.frombuffer(planes[2], dtype=np.uint8, count=n), out=w)
        w |= np.left_shift(sign, 15, dtype=np.uint16)
        return
    sign <<= 7
    sign |= np.frombuffer(planes[1], dtype=np.uint8, count=n)
    grid[:, unit - 1] = sign
    for i, k in enumerate(range(unit - 2, -1, -1)):
        grid[:, k] = np.frombuffer(planes[2 + i], dtype=np.uint8, count=n)


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


def plane_roles(head) -> list[str]:
    """What each plane of a blob holds ("sign", "exponent", "mantissa", "bytes", ...),
    by the layout its parsed container header names."""
    from ._dtypes import from_code
    layout, nplanes = head.layout, len(head.planes)
    if layout == FLAT:
        roles = ["bytes"]
    elif layout == FLOAT_SM:
        roles = ["exponent", "sign+mantissa"] + ["mantissa"] * 8
    elif layout == SIGN_BYTES:
        roles = ["sign", "exponent+mantissa", "mantissa"]
    elif layout == BYTES:
        roles = ["bytes"] * 16
    else:                                             # FLOAT: sign, exponent, mantissa
        dt = from_code(head.dtype_code)               # as plane_sizes lays them out
        if dt.ebits + dt.mbits <= 7:
            roles = ["sign", "exponent+mantissa"]
        else:
            roles = ["sign"] + ["exponent"] * _field_bytes(dt.ebits) + \
                ["mantissa"] * _field_bytes(dt.mbits)
    roles = roles[:nplanes]
    return roles + ["tail"] * (nplanes - len(roles))
