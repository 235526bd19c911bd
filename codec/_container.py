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
