"""The chunk container: a small versioned header, plane payloads, and a checksum.

Layout (little endian)::

    0   4  magic  b"S4CK"
    4   1  format major (readers refuse a newer major)
    5   1  format minor (additions older readers may ignore)
    6   1  dtype code (s4fs.codec._dtypes)
    7   1  flags: bit 0 = delta (payload is the byte-XOR with a base)
    8   1  layout (s4fs.codec._planes)
    9   1  number of planes
    10  8  xxh3-64 of the original bytes
    [   8  xxh3-64 of the base bytes, when delta]
       v   raw length (LEB128 varint)
    per plane:
        1  codec id, 1  codec major, v raw length, v encoded length
    payloads, in plane order
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

from s4fs.errors import FormatError, UnsupportedVersionError

MAGIC = b"S4CK"
MAJOR = 1
MINOR = 1               # 1: layouts FLOAT_SM / SIGN_BYTES and the deflate plane codec
FLAG_DELTA = 1
KNOWN_FLAGS = FLAG_DELTA

_FIXED = struct.Struct("<4sBBBBBBQ")


@dataclass(frozen=True)
class PlaneHeader:
    codec_id: int
    codec_major: int
    raw_len: int
    enc_len: int


@dataclass(frozen=True)
class Header:
    dtype_code: int
    flags: int
    layout: int
    checksum: int
    base_checksum: int | None
    raw_len: int
    planes: tuple[PlaneHeader, ...]
    payload_offset: int

    @property
    def delta(self) -> bool:
        return bool(self.flags & FLAG_DELTA)


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        if n:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def _read_varint(buf: memoryview, pos: int) -> tuple[int, int]:
    n = shift = 0
    while True:
        if pos >= len(buf):
            raise FormatError("blob is truncated inside its header")
        b = buf[pos]
        pos += 1
        n |= (b & 0x7F) << shift
        if not b & 0x80:
            return n, pos
        shift += 7
        if shift > 70:
            raise FormatError("blob header has an overlong length field")


def header(dtype_code: int, flags: int, layout: int, checksum: int,
           base_checksum: int | None, raw_len: int,
           planes: list[tuple[int, int, int, int]]) -> bytes:
    """The header of a blob whose planes are (codec id, codec major, raw length, encoded
    length); the payloads follow it in plane order. The one writer of this header: the
    CPU path (``pack``) and the GPU encoder both call it."""
    if flags & ~KNOWN_FLAGS:
        raise ValueError(f"unknown container flags 0x{flags:02x}")
    head = bytearray(_FIXED.pack(MAGIC, MAJOR, MINOR, dtype_code, flags, layout,
                                 len(planes), checksum))
    if flags & FLAG_DELTA:
        head += struct.pack("<Q", base_checksum)
    head += _varint(raw_len)
    for cid, major, plane_raw, enc in planes:
        head += bytes((cid, major)) + _varint(plane_raw) + _varint(enc)
    return bytes(head)


def pack(dtype_code: int, flags: int, layout: int, checksum: int, base_checksum: int | None,
         raw_len: int, planes: list[tuple[int, int, int, bytes]]) -> bytes:
    """planes: (codec id, codec major, raw length, payload)."""
    head = header(dtype_code, flags, layout, checksum, base_checksum, raw_len,
                  [(cid, major, r, len(p)) for cid, major, r, p in planes])
    return b"".join([head, *[p for *_, p in planes]])


def header_size(flags: int, raw_len: int, planes: list[tuple[int, int]]) -> int:
    n = _FIXED.size + (8 if flags & FLAG_DELTA else 0) + len(_varint(raw_len))
    return n + sum(2 + len(_varint(r)) + len(_varint(e)) for r, e in planes)


def unpack(blob, *, whole: bool = True, total: int | None = None) -> Header:
    """The blob's header, the one reader of it. ``whole=False``: ``blob`` may be just the
    blob's first bytes (enough to hold the header): its length is then not checked, or,
    given the blob's ``total`` length, checked against that."""
    buf = memoryview(blob).cast("B")
    size = len(buf) if total is None else total
    if len(buf) < _FIXED.size:
        if bytes(buf[:4]) != MAGIC[: len(buf[:4])]:
            raise FormatError("not an s4fs chunk (wrong magic)")
        raise FormatError(f"blob is truncated: {len(buf)} bytes is shorter than any header")
    magic, major, minor, dcode, flags, layout, nplanes, checksum = _FIXED.unpack_from(buf)
    if magic != MAGIC:
        raise FormatError(f"not an s4fs chunk (magic {magic!r}, expected {MAGIC!r})")
    if major != MAJOR:
        raise UnsupportedVersionError(
            f"chunk format v{major}.{minor} is not readable by this s4fs (reads v{MAJOR}.x); "
            f"upgrade s4fs to read it")
    if flags & ~KNOWN_FLAGS:
        raise UnsupportedVersionError(
            f"chunk sets flags 0x{flags:02x} that this s4fs does not know; upgrade s4fs "
            f"to read it (or the blob is corrupt)")
    pos = _FIXED.size
    base_checksum = None
    if flags & FLAG_DELTA:
        if len(buf) < pos + 8:
            raise FormatError("blob is truncated inside its header")
        (base_checksum,) = struct.unpack_from("<Q", buf, pos)
        pos += 8
    raw_len, pos = _read_varint(buf, pos)
    planes = []
    for _ in range(nplanes):
        if len(buf) < pos + 2:
            raise FormatError("blob is truncated inside its header")
        cid, cmajor = buf[pos], buf[pos + 1]
        plane_raw, pos = _read_varint(buf, pos + 2)
        enc, pos = _read_varint(buf, pos)
        planes.append(PlaneHeader(cid, cmajor, plane_raw, enc))
    end = pos + sum(p.enc_len for p in planes)
    if (whole or total is not None) and end != size:
        what = "truncated" if end > size else "followed by extra bytes"
        raise FormatError(f"blob is {what}: header describes {end} bytes, got {size}")
    return Header(dcode, flags, layout, checksum, base_checksum, raw_len, tuple(planes), pos)


# --------------------------------------------------------------------------- many at once
# The same header, written and read for a whole batch of blobs with array operations
# (the GPU codec codes hundreds of chunks per call; a Python loop per header cost more
# than the device's work). ``header`` and ``unpack`` above remain the definition: the
# tests check these two against them byte for byte and field for field.

def _np():
    import numpy as np
    return np


_VARINT_STEPS = None          # 2**7, 2**14, ... as uint64 (made on first use)


def varint_sizes(values):
    """Bytes of the LEB128 varint of every value (an integer array)."""
    global _VARINT_STEPS
    np = _np()
    if _VARINT_STEPS is None:
        _VARINT_STEPS = np.array([1 << (7 * k) for k in range(1, 10)], dtype=np.uint64)
    v = np.asarray(values, dtype=np.uint64)
    return np.searchsorted(_VARINT_STEPS, v, side="right").astype(np.int64) + 1


def header_sizes(delta, raw_len, plane_blob, plane_raw, plane_enc):
    """Header bytes of every blob: ``delta`` and ``raw_len`` per blob; the planes as
    columns (blob index, raw and encoded length), in blob order."""
    np = _np()
    delta = np.asarray(delta, dtype=bool)
    per_plane = 2 + varint_sizes(plane_raw) + varint_sizes(plane_enc)
    planes = np.bincount(np.asarray(plane_blob, dtype=np.int64), weights=per_plane,
                         minlength=len(delta)).astype(np.int64)
    return _FIXED.size + 8 * delta + varint_sizes(raw_len) + planes


def header_many(dtype_code, flags, layout, checksum, base_checksum, raw_len,
                plane_blob, plane_cid, plane_major, plane_raw, plane_enc):
    """Every blob's header (as ``header`` writes it), back to back.

    Per blob: dtype code, flags, layout, checksum, base checksum (read when the delta
    flag is set), raw length; per plane (columns in blob order): blob index, codec id,
    codec major, raw and encoded length. Returns (uint8 array, start of each header,
    length of each header).
    """
    np = _np()
    flags = np.asarray(flags, dtype=np.int64)
    if np.any(flags & ~KNOWN_FLAGS):
        raise ValueError("unknown container flags")
    nb = len(flags)
    pb = np.asarray(plane_blob, dtype=np.int64)
    nplanes = np.bincount(pb, minlength=nb)
    delta = (flags & FLAG_DELTA) != 0
    raw_len = np.asarray(raw_len, dtype=np.uint64)
    praw, penc = np.asarray(plane_raw, np.uint64), np.asarray(plane_enc, np.uint64)
    # where every field goes: the fixed part, the base checksum, the raw length, then
    # per plane two bytes and two varints
    w_len, w_raw, w_enc = varint_sizes(raw_len), varint_sizes(praw), varint_sizes(penc)
    per_plane = 2 + w_raw + w_enc
    pstart = _FIXED.size + 8 * delta + w_len                 # offset of plane 0's fields
    excl = np.cumsum(per_plane) - per_plane
    first = np.cumsum(nplanes) - nplanes
    lens = pstart + np.bincount(pb, weights=per_plane, minlength=nb).astype(np.int64)
    starts = np.cumsum(lens) - lens
    out = np.zeros(int(lens.sum()), dtype=np.uint8)
    fixed = np.empty((nb, 10), dtype=np.uint8)
    fixed[:, :4] = np.frombuffer(MAGIC, dtype=np.uint8)
    fixed[:, 4], fixed[:, 5] = MAJOR, MINOR
    fixed[:, 6], fixed[:, 7] = np.asarray(dtype_code), flags
    fixed[:, 8], fixed[:, 9] = np.asarray(layout), nplanes
    out[starts[:, None] + np.arange(10)] = fixed
    eight = np.arange(8)
    out[starts[:, None] + 10 + eight] = np.asarray(checksum, "<u8").view(np.uint8).reshape(-1, 8)
    if delta.any():
        base = np.asarray(base_checksum, "<u8")[delta]
        out[starts[delta][:, None] + 18 + eight] = base.view(np.uint8).reshape(-1, 8)
    _put_varints(out, starts + _FIXED.size + 8 * delta, raw_len, w_len)
    at = starts[pb] + pstart[pb] + excl - np.append(excl, 0)[first][pb]
    out[at] = np.asarray(plane_cid)
    out[at + 1] = np.asarray(plane_major)
    _put_varints(out, at + 2, praw, w_raw)
    _put_varints(out, at + 2 + w_raw, penc, w_enc)
    return out, starts, lens


def _put_varints(out, at, values, widths) -> None:
    """Write LEB128 varints of the given widths at the given offsets."""
    np = _np()
    if not len(at):
        return
    k = np.arange(int(widths.max()))
    groups = ((values[:, None] >> (7 * k).astype(np.uint64)) & np.uint64(0x7F)) | \
        np.where(k < (widths - 1)[:, None], np.uint64(0x80), np.uint64(0))
    live = k < widths[:, None]
    out[(at[:, None] + k)[live]] = groups[live].astype(np.uint8)


class Headers:
    """Many parsed headers as columns (what :func:`unpack_many` returns): per blob
    ``dtype_code``, ``flags``, ``layout``, ``checksum``, ``base_checksum`` (0 when not a
    delta), ``raw_len``, ``nplanes``, ``payload_offset``, ``plane0`` (its first plane);
    per plane ``blob``, ``codec_id``, ``codec_major``, ``raw_len``, ``enc_len``, ``pos``
    (payload offset in its blob)."""

    def __init__(self, **cols) -> None:
        self.__dict__.update(cols)

    def __len__(self) -> int:
        return len(self.raw_len)

    @property
    def delta(self):
        return (self.flags & FLAG_DELTA) != 0


def unpack_many(buf, starts, totals, avail=None):
    """Parse many headers from one byte array: each blob's first ``avail`` bytes (default:
    to the end of ``buf``) at ``starts``, its full length in ``totals``. Returns
    (:class:`Headers`, indices of the blobs it could not read: ones ``unpack`` refuses,
    or whose header runs past their ``avail`` bytes; ``unpack`` on one says why). The
    fields of those blobs are undefined.
    """
    np = _np()
    a = np.frombuffer(memoryview(buf).cast("B"), dtype=np.uint8)
    starts = np.asarray(starts, dtype=np.int64)
    totals = np.asarray(totals, dtype=np.int64)
    nb = len(starts)
    limit = len(a) if avail is None else np.minimum(starts + np.asarray(avail, np.int64), len(a))
    bad = starts + _FIXED.size > limit
    pad = np.concatenate([a, np.zeros(96, dtype=np.uint8)])
    s = np.where(bad, 0, starts)
    top = len(pad) - 16           # reads past the bytes are clamped (those blobs refuse)

    def byte(pos):
        return pad[np.minimum(pos, top)].astype(np.uint64)

    def u64le(pos):
        return np.ascontiguousarray(pad[pos[:, None] + np.arange(8)]).view("<u8").reshape(-1)

    magic = pad[s[:, None] + np.arange(4)]
    bad |= ~np.all(magic == np.frombuffer(MAGIC, dtype=np.uint8), axis=1)
    major, dcode, flags, layout, npl = (pad[s + o].astype(np.int64) for o in (4, 6, 7, 8, 9))
    bad |= (major != MAJOR) | ((flags & ~KNOWN_FLAGS) != 0)
    checksum = u64le(s + 10)
    delta = (flags & FLAG_DELTA) != 0
    base = np.where(delta, u64le(s + 18), np.uint64(0))
    pos = s + 18 + 8 * delta
    def varint(pos, width=5):
        # the first ``width`` bytes of every varint; again with 10 if one runs longer
        k = np.arange(width)
        g = pad[np.minimum(pos, top)[:, None] + k]
        ends = (g & 0x80) == 0
        done = ends.any(axis=1)
        if width < 10 and not done.all():
            return varint(pos, 10)
        ln = np.where(done, np.argmax(ends, axis=1) + 1, width)
        n = np.bitwise_or.reduce(np.where(k < ln[:, None], (g & 0x7F).astype(np.uint64)
                                          << (7 * k).astype(np.uint64), np.uint64(0)), axis=1)
        # unpack refuses a varint of more than 10 bytes (shift > 70); 10 bytes overflows u64
        return n, pos + ln, ~done | (ln == 10)

    raw_len, pos, over = varint(pos)
    bad |= over
    if npl.sum() > 0:
        pb = np.repeat(np.arange(nb), npl)
        first = np.cumsum(npl) - npl
        cid = np.zeros(len(pb), dtype=np.int64)
        cmaj = np.zeros(len(pb), dtype=np.int64)
        praw = np.zeros(len(pb), dtype=np.uint64)
        penc = np.zeros(len(pb), dtype=np.uint64)
        for k in range(int(npl.max())):
            live = np.flatnonzero(npl > k)
            p = pos[live]
            sel = first[live] + k
            cid[sel] = byte(p).astype(np.int64)
            cmaj[sel] = byte(p + 1).astype(np.int64)
            r, p, o1 = varint(p + 2)
            e, p, o2 = varint(p)
            praw[sel], penc[sel] = r, e
            bad[live] |= o1 | o2
            pos[live] = p
    else:
        pb = np.zeros(0, dtype=np.int64)
        first = np.zeros(nb, dtype=np.int64)
        cid = cmaj = np.zeros(0, dtype=np.int64)
        praw = penc = np.zeros(0, dtype=np.uint64)
    bad |= pos > limit
    hlen = pos - s
    big = penc > np.uint64(1 << 62)
    bad |= np.bincount(pb, weights=big, minlength=nb) > 0
    enc_i = np.where(big, 0, penc).astype(np.int64)
    ends = hlen + np.bincount(pb, weights=enc_i, minlength=nb).astype(np.int64)
    bad |= ends != totals
    bad |= raw_len > np.uint64(1 << 62)
    excl = np.cumsum(enc_i) - enc_i
    ppos = np.repeat(hlen, npl) + excl - np.repeat(np.append(excl, 0)[first], npl)
    heads = Headers(dtype_code=dcode, flags=flags, layout=layout, checksum=checksum,
                    base_checksum=base, raw_len=raw_len.astype(np.int64), nplanes=npl,
                    payload_offset=hlen, plane0=first, blob=pb, codec_id=cid,
                    codec_major=cmaj, plane_raw=praw.astype(np.int64), enc_len=enc_i,
                    pos=ppos)
    return heads, np.flatnonzero(bad)
