"""The chunk container: a small versioned header, plane payloads, and a checksum.

Layout (little endian)::

    0   4  magic  b"S4CK"
    4   1  format major (readers refuse a newer major)
    5   1  format minor (additions older readers may ignore)
    6   1  dtype code (s4fs.codec._dtypes)
    7   1  flags: bit 0 = delta (payload is the byte-XOR with a base),
                  bit 1 = zero blocks (all-zero blocks of the chunk are not stored),
                  bit 2 = difference (with bit 0: the payload is not the XOR but the
                          zigzag-coded integer difference of the words with the base's,
                          words of the dtype's item size (8 bytes for wider ones),
                          little endian, wrapping; bytes past the last word XOR-ed)
                  bit 3 = pair (with bit 0): the chunk is fp32 words and the base is a
                          low-precision copy of them (half as many bytes); the payload is
                          the residual of each word given the copy (s4fs.codec._pair),
                  bit 4 = with bit 3: the copy is fp16 (else bf16)
                  bit 5 = on its master (with bit 0, not bit 3): the chunk is bf16 or
                          fp16 words (its dtype) and the base their fp32 master (twice
                          as many bytes); the payload is each word's difference from
                          the master rounded to nearest (s4fs.codec._pair), 16-bit
                          words, wrapping
    8   1  layout (s4fs.codec._planes)
    9   1  number of planes
    10  8  xxh3-64 of the original bytes
    [   8  xxh3-64 of the base bytes, when delta]
       v   raw length (LEB128 varint)
    [when zero blocks:
        1  log2 of the block size (12..30)
        v  kept length: the bytes of the blocks that are stored
           keep map: ceil(raw length / block) bits, least significant bit first; a set
           bit is a stored block, a clear one a block of zero bytes (the last block may
           be shorter)]
    per plane:
        1  codec id, 1  codec major, v raw length, v encoded length
    payloads, in plane order

With zero blocks, the planes hold the stored blocks back to back (``kept length``
bytes): a reader decodes those and puts zero blocks back where the keep map says
(``expand``). The checksum is always of the original bytes.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

from s4fs.errors import FormatError, UnsupportedVersionError

MAGIC = b"S4CK"
MAJOR = 1
MINOR = 5               # 1: layouts FLOAT_SM / SIGN_BYTES and the deflate plane codec;
                        # 2: zero blocks; 3: difference deltas; 4: pairs;
                        # 5: copies coded on their masters
FLAG_DELTA = 1
FLAG_ZERO_BLOCKS = 2
FLAG_DIFF = 4
FLAG_PAIR = 8
FLAG_PAIR_FP16 = 16
FLAG_ON_MASTER = 32
KNOWN_FLAGS = FLAG_DELTA | FLAG_ZERO_BLOCKS | FLAG_DIFF | FLAG_PAIR | FLAG_PAIR_FP16 | \
    FLAG_ON_MASTER
MIN_BLOCK_LOG2, MAX_BLOCK_LOG2 = 12, 30

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
    block: int = 0              # zero blocks: the block size (0: every byte is stored)
    kept_len: int = -1          # zero blocks: bytes of the stored blocks
    keep_map: bytes = b""       # zero blocks: one bit per block, set = stored

    @property
    def delta(self) -> bool:
        return bool(self.flags & FLAG_DELTA)

    @property
    def diff(self) -> bool:
        """A delta whose payload is the words' difference with the base, not the XOR."""
        return bool(self.flags & FLAG_DIFF)

    @property
    def pair(self) -> str | None:
        """A delta on a low-precision copy (``FLAG_PAIR``): the copy's dtype name, else
        None."""
        if not self.flags & FLAG_PAIR:
            return None
        return "float16" if self.flags & FLAG_PAIR_FP16 else "bfloat16"

    @property
    def on_master(self) -> bool:
        """A low-precision copy coded on its fp32 master (``FLAG_ON_MASTER``): the base
        is twice as long, and the blob's own dtype names the copy's precision."""
        return bool(self.flags & FLAG_ON_MASTER)

    @property
    def coded_len(self) -> int:
        """Bytes the planes hold: the stored blocks with zero blocks, else the chunk."""
        return self.kept_len if self.block else self.raw_len


# --------------------------------------------------------------------------- zero blocks

def block_log2(raw_len):
    """The block size (log2) the writers use for a chunk of ``raw_len`` bytes: 4 KiB,
    larger for chunks over 4 MiB so that the keep map stays within 128 bytes (1024
    blocks). ``raw_len``: an int (an int back) or an array of them (an array back)."""
    np = _np()
    kib = np.maximum(1, -(-np.asarray(raw_len, dtype=np.int64) // 1024))
    need = np.frexp((kib - 1).astype(np.float64))[1]     # bit length of kib - 1
    out = np.clip(need, MIN_BLOCK_LOG2, MAX_BLOCK_LOG2).astype(np.int64)
    return int(out) if out.ndim == 0 else out


def block_counts(raw_len, log2):
    """Blocks of 2**``log2`` bytes in chunks of ``raw_len`` bytes (ints or arrays)."""
    return (raw_len + (1 << log2) - 1) >> log2


def map_bytes(raw_len: int, log2: int) -> int:
    """Bytes of the keep map of a chunk of ``raw_len`` bytes."""
    return (block_counts(raw_len, log2) + 7) // 8


def kept_runs(keep_map, raw_len: int, block: int):
    """The stored runs of one chunk from its keep map (``kept_runs_many`` for one):
    (offset in the chunk, offset in the stored bytes, length) arrays."""
    np = _np()
    log2 = block.bit_length() - 1
    n = block_counts(raw_len, log2)
    bits = np.unpackbits(np.frombuffer(bytes(keep_map), dtype=np.uint8), bitorder="little")
    (_, at, src, ln), _ = kept_runs_many(bits[:n], [n], [log2], [raw_len])
    return at, src, ln


def kept_length(keep_map, raw_len: int, block: int) -> int:
    """Bytes of the stored blocks a keep map names."""
    return int(kept_runs(keep_map, raw_len, block)[2].sum())


def kept_runs_many(bits, nblocks, log2, raw_len):
    """The stored runs of many chunks at once: ``bits`` (0/1 per block, every chunk's
    blocks back to back; a chunk may list extra 0 blocks past its end), per chunk its
    block count, block size log2 and length. Returns (chunk index, offset in the chunk,
    offset in its stored bytes, length) per run, and every chunk's kept length. Works
    on the run boundaries only (a few array passes over the bits)."""
    np = _np()
    b = np.asarray(bits).astype(np.int8, copy=False)
    nblocks = np.asarray(nblocks, dtype=np.int64)
    log2 = np.asarray(log2, dtype=np.int64)
    raw_len = np.asarray(raw_len, dtype=np.int64)
    n = len(nblocks)
    f0 = np.cumsum(nblocks) - nblocks
    d = np.diff(b, prepend=np.int8(0), append=np.int8(0))
    # a run that crosses into the next chunk is cut at the chunk's first block
    cut = f0[(nblocks > 0) & (f0 > 0)]
    cut = cut[(b[cut] > 0) & (b[cut - 1] > 0)]
    start = np.sort(np.concatenate([np.flatnonzero(d == 1), cut]))
    end = np.sort(np.concatenate([np.flatnonzero(d == -1), cut]))
    owner = np.searchsorted(f0, start, side="right") - 1
    # (chunks without blocks share f0 with the next one: searchsorted finds the last)
    lo = (start - f0[owner]) << log2[owner]
    hi = np.minimum((end - f0[owner]) << log2[owner], raw_len[owner])
    ln = np.maximum(hi - lo, 0)
    kept = np.bincount(owner, weights=ln, minlength=n).astype(np.int64)
    cs = np.cumsum(ln) - ln
    first = np.searchsorted(owner, owner, side="left")
    return (owner, lo, cs - cs[first], ln), kept


def padded_bits(bits, starts, nblocks):
    """Chunks' block bits (``nblocks`` each from ``starts`` in ``bits``), each padded with
    0 to whole bytes, back to back: ``np.packbits`` makes their keep maps of them, and
    ``kept_runs_many`` takes them with the padded counts. Returns them and those counts."""
    np = _np()
    starts = np.asarray(starts, dtype=np.int64)
    nblocks = np.asarray(nblocks, dtype=np.int64)
    width = 8 * ((nblocks + 7) // 8)
    out = np.zeros(int(width.sum()), dtype=np.uint8)
    nfirst = np.cumsum(nblocks) - nblocks
    k = np.arange(int(nblocks.sum()))
    out[np.repeat(np.cumsum(width) - width - nfirst, nblocks) + k] = \
        np.asarray(bits)[np.repeat(starts - nfirst, nblocks) + k]
    return out, width


def masked_maps(a, at, nblocks):
    """Keep maps of many chunks gathered from byte array ``a`` (each at ``at``), the bits
    past each chunk's last block cleared; returns them back to back and each one's
    length in bytes."""
    np = _np()
    nblocks = np.asarray(nblocks, dtype=np.int64)
    mlen = (nblocks + 7) // 8
    first = np.cumsum(mlen) - mlen
    maps = np.asarray(a)[np.repeat(np.asarray(at, dtype=np.int64) - first, mlen)
                         + np.arange(int(mlen.sum()))].copy()
    live = mlen > 0
    tail = nblocks[live] - 8 * (mlen[live] - 1)               # bits used in the last byte
    maps[(first + mlen - 1)[live]] &= ((1 << tail) - 1).astype(np.uint8)
    return maps, mlen


def expand(stored, head: Header) -> bytes:
    """The chunk's bytes from its stored blocks (a chunk without zero blocks: as is)."""
    if not head.block:
        return stored
    np = _np()
    src = np.frombuffer(memoryview(stored).cast("B"), dtype=np.uint8)
    out = np.zeros(head.raw_len, dtype=np.uint8)
    dst, at, ln = kept_runs(head.keep_map, head.raw_len, head.block)
    for d, a, n in zip(dst.tolist(), at.tolist(), ln.tolist()):
        out[d: d + n] = src[a: a + n]
    return out.tobytes()


def _zero_part(raw_len: int, zero_blocks) -> bytes:
    log2, kept, keep_map = zero_blocks
    if not MIN_BLOCK_LOG2 <= log2 <= MAX_BLOCK_LOG2:
        raise ValueError(f"zero-block size 2**{log2} is out of range")
    if len(keep_map) != map_bytes(raw_len, log2):
        raise ValueError("keep map has the wrong length for the chunk")
    return bytes((log2,)) + _varint(kept) + bytes(keep_map)


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
           planes: list[tuple[int, int, int, int]], zero_blocks=None) -> bytes:
    """The header of a blob whose planes are (codec id, codec major, raw length, encoded
    length); the payloads follow it in plane order. ``zero_blocks``: (block size log2,
    kept length, keep map) when the flag is set. The one writer of this header (the GPU
    encoder writes many at once with ``header_many``, checked against it)."""
    if flags & ~KNOWN_FLAGS:
        raise ValueError(f"unknown container flags 0x{flags:02x}")
    if bool(flags & FLAG_ZERO_BLOCKS) != (zero_blocks is not None):
        raise ValueError("the zero-blocks flag and the keep map go together")
    if flags & FLAG_ZERO_BLOCKS and flags & FLAG_DELTA:
        raise ValueError("a delta chunk cannot leave out zero blocks")
    if flags & FLAG_DIFF and not flags & FLAG_DELTA:
        raise ValueError("the difference flag needs the delta flag")
    if _bad_pair(flags):
        raise ValueError("the pair flags need the delta flag, and not the difference one")
    head = bytearray(_FIXED.pack(MAGIC, MAJOR, MINOR, dtype_code, flags, layout,
                                 len(planes), checksum))
    if flags & FLAG_DELTA:
        head += struct.pack("<Q", base_checksum)
    head += _varint(raw_len)
    if zero_blocks is not None:
        head += _zero_part(raw_len, zero_blocks)
    for cid, major, plane_raw, enc in planes:
        head += bytes((cid, major)) + _varint(plane_raw) + _varint(enc)
    return bytes(head)


def pack(dtype_code: int, flags: int, layout: int, checksum: int, base_checksum: int | None,
         raw_len: int, planes: list[tuple[int, int, int, bytes]], zero_blocks=None) -> bytes:
    """planes: (codec id, codec major, raw length, payload)."""
    head = header(dtype_code, flags, layout, checksum, base_checksum, raw_len,
                  [(cid, major, r, len(p)) for cid, major, r, p in planes], zero_blocks)
    return b"".join([head, *[p for *_, p in planes]])


def header_size(flags: int, raw_len: int, planes: list[tuple[int, int]]) -> int:
    n = _FIXED.size + (8 if flags & FLAG_DELTA else 0) + len(_varint(raw_len))
    return n + sum(2 + len(_varint(r)) + len(_varint(e)) for r, e in planes)


def _bad_pair(flags: int) -> bool:
    """Pair flags set in a way no writer sets them: the fp16 bit without the pair bit,
    both directions at once, a pair that is not a delta, or one that is also a
    difference delta."""
    if flags & FLAG_PAIR_FP16 and not flags & FLAG_PAIR:
        return True
    if flags & FLAG_ON_MASTER and flags & FLAG_PAIR:
        return True
    return bool(flags & (FLAG_PAIR | FLAG_ON_MASTER)) and \
        (not flags & FLAG_DELTA or bool(flags & FLAG_DIFF))


# long on purpose: the one reader of a header, field by field in the order of the
# format, each check beside the field it refuses
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
    if flags & FLAG_DIFF and not flags & FLAG_DELTA:
        raise FormatError("blob sets the difference flag without the delta flag, which no "
                          "writer does; the blob is corrupt")
    if _bad_pair(flags):
        raise FormatError("blob sets the pair flags with other flags no writer sets with "
                          "them; the blob is corrupt")
    pos = _FIXED.size
    base_checksum = None
    if flags & FLAG_DELTA:
        if len(buf) < pos + 8:
            raise FormatError("blob is truncated inside its header")
        (base_checksum,) = struct.unpack_from("<Q", buf, pos)
        pos += 8
    raw_len, pos = _read_varint(buf, pos)
    block, kept, keep_map = 0, -1, b""
    if flags & FLAG_ZERO_BLOCKS:
        if flags & FLAG_DELTA:
            raise FormatError("blob sets both the delta and the zero-blocks flags, which no "
                              "writer does; the blob is corrupt")
        if len(buf) < pos + 1:
            raise FormatError("blob is truncated inside its header")
        log2 = buf[pos]
        if not MIN_BLOCK_LOG2 <= log2 <= MAX_BLOCK_LOG2:
            raise FormatError(f"blob names a zero-block size of 2**{log2} bytes")
        kept, pos = _read_varint(buf, pos + 1)
        mlen = map_bytes(raw_len, log2)
        if len(buf) < pos + mlen:
            raise FormatError("blob is truncated inside its header")
        block, keep_map = 1 << log2, bytes(buf[pos: pos + mlen])
        pos += mlen
        if kept_length(keep_map, raw_len, block) != kept:
            raise FormatError("blob's keep map does not match its kept length")
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
    return Header(dcode, flags, layout, checksum, base_checksum, raw_len, tuple(planes), pos,
                  block, kept, keep_map)


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


def header_sizes(delta, raw_len, plane_blob, plane_raw, plane_enc, zero_part=0):
    """Header bytes of every blob: ``delta`` and ``raw_len`` per blob; the planes as
    columns (blob index, raw and encoded length), in blob order; ``zero_part``: bytes of
    each blob's zero-block fields (``zero_part_sizes``; 0 without)."""
    np = _np()
    delta = np.asarray(delta, dtype=bool)
    per_plane = 2 + varint_sizes(plane_raw) + varint_sizes(plane_enc)
    planes = np.bincount(np.asarray(plane_blob, dtype=np.int64), weights=per_plane,
                         minlength=len(delta)).astype(np.int64)
    return _FIXED.size + 8 * delta + varint_sizes(raw_len) + planes + zero_part


def zero_part_sizes(raw_len, log2, kept_len):
    """Bytes of the zero-block fields of every blob (``log2`` 0: none)."""
    np = _np()
    log2 = np.asarray(log2, dtype=np.int64)
    mlen = map_bytes(np.asarray(raw_len, dtype=np.int64), log2)
    return np.where(log2 > 0, 1 + varint_sizes(np.maximum(kept_len, 0)) + mlen, 0)


# long on purpose: the header's fields written in the order the format lays them out
# (header()), as array operations over every blob at once
def header_many(dtype_code, flags, layout, checksum, base_checksum, raw_len,
                plane_blob, plane_cid, plane_major, plane_raw, plane_enc, zero_blocks=None):
    """Every blob's header (as ``header`` writes it), back to back.

    Per blob: dtype code, flags, layout, checksum, base checksum (read when the delta
    flag is set), raw length; per plane (columns in blob order): blob index, codec id,
    codec major, raw and encoded length. ``zero_blocks``: (block log2 per blob, 0 for
    blobs without; kept length per blob; every keep map back to back, uint8), read for
    blobs with the zero-blocks flag. Returns (uint8 array, start of each header, length
    of each header).
    """
    np = _np()
    flags = np.asarray(flags, dtype=np.int64)
    if np.any(flags & ~KNOWN_FLAGS):
        raise ValueError("unknown container flags")
    zb = (flags & FLAG_ZERO_BLOCKS) != 0
    if zero_blocks is None:
        if zb.any():
            raise ValueError("the zero-blocks flag needs keep maps")
        zlog = zkept = np.zeros(len(flags), dtype=np.int64)
        zmaps = np.zeros(0, dtype=np.uint8)
    else:
        zlog, zkept, zmaps = (np.asarray(x) for x in zero_blocks)
        zlog = np.where(zb, zlog, 0).astype(np.int64)
        if np.any(zb & ((zlog < MIN_BLOCK_LOG2) | (zlog > MAX_BLOCK_LOG2))):
            raise ValueError("zero-block size out of range")
        if np.any(zb & ((flags & FLAG_DELTA) != 0)):
            raise ValueError("a delta chunk cannot leave out zero blocks")
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
    zpart = zero_part_sizes(raw_len.astype(np.int64), zlog, zkept)
    pstart = _FIXED.size + 8 * delta + w_len + zpart         # offset of plane 0's fields
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
    if zb.any():
        zq = np.flatnonzero(zb)
        zat = (starts + _FIXED.size + 8 * delta + w_len)[zq]
        out[zat] = zlog[zq]
        kept = np.asarray(zkept, dtype=np.uint64)[zq]
        w_kept = varint_sizes(kept)
        _put_varints(out, zat + 1, kept, w_kept)
        mlen = zpart[zq] - 1 - w_kept
        if int(mlen.sum()) != len(zmaps):
            raise ValueError("keep maps have the wrong total length")
        mfirst = np.cumsum(mlen) - mlen
        out[np.repeat(zat + 1 + w_kept - mfirst, mlen) + np.arange(int(mlen.sum()))] = zmaps
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
    delta), ``raw_len``, ``nplanes``, ``payload_offset``, ``plane0`` (its first plane),
    ``block_log2`` (0: no zero blocks), ``kept_len`` (``raw_len`` without zero blocks),
    ``map_at`` / ``map_len`` (where its keep map is in the parsed bytes);
    per plane ``blob``, ``codec_id``, ``codec_major``, ``raw_len``, ``enc_len``, ``pos``
    (payload offset in its blob)."""

    def __init__(self, **cols) -> None:
        self.__dict__.update(cols)

    def __len__(self) -> int:
        return len(self.raw_len)

    @property
    def delta(self):
        return (self.flags & FLAG_DELTA) != 0

    @property
    def diff(self):
        return (self.flags & FLAG_DIFF) != 0

    @property
    def zero_blocks(self):
        return self.block_log2 > 0

    @property
    def coded_len(self):
        """Bytes the planes hold (the stored blocks of zero-block blobs)."""
        return self.kept_len


# long on purpose: the header's fields read in the order the format lays them out
# (header()), as array operations over every blob at once; each step needs the cursor
# and the refusals of the steps before it
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
    bad |= ((flags & FLAG_DIFF) != 0) & ~delta
    # pairs: read one by one
    bad |= (flags & (FLAG_PAIR | FLAG_PAIR_FP16 | FLAG_ON_MASTER)) != 0
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
    # zero blocks: the block size, the kept length, where the keep map is in ``buf``
    zb = (flags & FLAG_ZERO_BLOCKS) != 0
    bad |= zb & delta
    zlog = np.where(zb, byte(pos).astype(np.int64), 0)
    bad |= zb & ((zlog < MIN_BLOCK_LOG2) | (zlog > MAX_BLOCK_LOG2))
    zlog = np.where(bad & zb, MIN_BLOCK_LOG2, zlog)
    kept, kpos, over = varint(pos + 1)
    bad |= zb & over
    raw_i = np.where(raw_len > np.uint64(1 << 62), 0, raw_len).astype(np.int64)
    nblocks = np.where(zb, block_counts(raw_i, zlog), 0)
    mlen = (nblocks + 7) // 8
    map_at = np.where(zb, kpos, 0)
    pos = np.where(zb, kpos + mlen, pos)
    kept = np.where(zb, kept, raw_len).astype(np.uint64)
    if zb.any():
        zq = np.flatnonzero(zb & ~bad & (pos <= limit))
        bad[zq] |= _kept_lengths(pad, map_at[zq], nblocks[zq], zlog[zq], raw_i[zq]) \
            != kept[zq].astype(np.int64)
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
    bad |= kept > np.uint64(1 << 62)
    heads = Headers(dtype_code=dcode, flags=flags, layout=layout, checksum=checksum,
                    base_checksum=base, raw_len=raw_len.astype(np.int64), nplanes=npl,
                    payload_offset=hlen, plane0=first, blob=pb, codec_id=cid,
                    codec_major=cmaj, plane_raw=praw.astype(np.int64), enc_len=enc_i,
                    pos=ppos, block_log2=zlog, kept_len=kept.astype(np.int64),
                    map_at=map_at, map_len=mlen)
    return heads, np.flatnonzero(bad)


def _kept_lengths(a, at, nblocks, log2, raw_len):
    """Bytes of the stored blocks of keep maps at ``at`` in byte array ``a``."""
    np = _np()
    global _POPCOUNT
    if _POPCOUNT is None:
        _POPCOUNT = np.unpackbits(np.arange(256, dtype=np.uint8)[:, None], axis=1).sum(1)
    maps, mlen = masked_maps(a, at, nblocks)
    owner = np.repeat(np.arange(len(at)), mlen)
    count = np.bincount(owner, weights=_POPCOUNT[maps], minlength=len(at)).astype(np.int64)
    block = np.int64(1) << log2
    last = nblocks - 1
    lastbit = np.zeros(len(at), dtype=np.int64)
    live = nblocks > 0
    first = np.cumsum(mlen) - mlen
    lastbit[live] = (maps[first[live] + last[live] // 8] >> (last[live] % 8)) & 1
    return count * block - lastbit * (block - (raw_len - last * block))


_POPCOUNT = None
