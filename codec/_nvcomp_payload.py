"""The payload of a plane coded with nvCOMP (codec ids 16, 17, 18; codec major 1).

A plane is cut into chunks of ``chunk`` bytes (the last one shorter) and each chunk is
one raw nvCOMP bitstream (``BitstreamKind.RAW``: no nvCOMP header), so a Deflate chunk
is a plain RFC 1951 stream. Layout (little endian)::

    0  1  nvCOMP major version that wrote the plane (0: written by the CPU twin)
    1  1  nvCOMP minor version
    2  1  nvCOMP patch version
    3  1  codec option (ANS: symbol type, 0 = '|u1'; (G)Deflate: algorithm level)
    4  4  chunk size (uncompressed bytes per chunk)
    8  4  compressed size of each chunk, ceil(raw_len / chunk) entries
       chunk bitstreams, back to back

The version is recorded because nvCOMP 6.0 changed the ANS bitstream: an ANS plane
decodes only with an nvCOMP of the major version that wrote it.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

import numpy as np

from s4fs.errors import FormatError

FIXED = struct.Struct("<BBBBI")
FIXED_SIZE = FIXED.size


@dataclass(frozen=True)
class PayloadHeader:
    version: tuple[int, int, int]
    option: int
    chunk: int
    sizes: np.ndarray          # compressed size of every chunk (uint32)
    data_offset: int           # where the first chunk starts in the payload

    @property
    def nchunks(self) -> int:
        return len(self.sizes)

    def version_text(self) -> str:
        if self.version == (0, 0, 0):
            return "the CPU twin (no nvCOMP)"
        return "nvCOMP " + ".".join(map(str, self.version))

    def raw_sizes(self, raw_len: int) -> np.ndarray:
        out = np.full(self.nchunks, self.chunk, dtype=np.int64)
        if self.nchunks:
            out[-1] = raw_len - self.chunk * (self.nchunks - 1)
        return out


def nchunks(raw_len: int, chunk: int) -> int:
    return -(-raw_len // chunk)


def header_size(raw_len: int, chunk: int) -> int:
    return FIXED_SIZE + 4 * nchunks(raw_len, chunk)


def pack_header(version: tuple[int, int, int], option: int, chunk: int, sizes) -> bytes:
    return FIXED.pack(*version, option, chunk) + np.asarray(sizes, dtype="<u4").tobytes()


def parse(payload, raw_len: int, codec: str) -> PayloadHeader:
    """Read and check a payload header against the plane's raw length."""
    buf = memoryview(payload).cast("B")
    return parse_table(buf, len(buf), raw_len, codec)


def parse_table(head, enc_len: int, raw_len: int, codec: str) -> PayloadHeader:
    """Like :func:`parse`, from the payload's first bytes (at least its header) and the
    payload's full length."""
    buf = memoryview(head).cast("B")
    if enc_len < FIXED_SIZE or len(buf) < FIXED_SIZE:
        raise FormatError(f"{codec} plane payload is truncated ({enc_len} bytes)")
    vmaj, vmin, vpat, option, chunk = FIXED.unpack_from(buf)
    if chunk == 0:
        raise FormatError(f"{codec} plane payload names a chunk size of 0")
    count = nchunks(raw_len, chunk)
    start = FIXED_SIZE + 4 * count
    if enc_len < start or len(buf) < start:
        raise FormatError(f"{codec} plane payload is truncated inside its chunk table")
    sizes = np.frombuffer(buf, dtype="<u4", count=count, offset=FIXED_SIZE).astype(np.uint32)
    listed = int(sizes.sum(dtype=np.uint64))
    if listed != enc_len - start:
        raise FormatError(f"{codec} plane payload holds {enc_len - start} bytes of chunks but "
                          f"its table lists {listed}")
    return PayloadHeader((vmaj, vmin, vpat), option, chunk, sizes, start)


# --------------------------------------------------------------------------- many at once

def pack_many(version: tuple[int, int, int], option, chunk, sizes, counts):
    """Every plane's payload header (``pack_header``) back to back: ``option`` and
    ``chunk`` per plane, ``sizes`` of all chunks concatenated, ``counts`` per plane.
    Returns (uint8 array, start of each header)."""
    counts = np.asarray(counts, dtype=np.int64)
    words = 2 + counts
    w0 = np.cumsum(words) - words
    out = np.zeros(int(words.sum()), dtype="<u4")
    vmaj, vmin, vpat = version
    out[w0] = (vmaj | (vmin << 8) | (vpat << 16)) + (np.asarray(option, np.int64) << 24)
    out[w0 + 1] = np.asarray(chunk, dtype=np.int64)
    first = np.cumsum(counts) - counts
    idx = np.repeat(w0 + 2 - first, counts) + np.arange(int(counts.sum()))
    out[idx] = np.asarray(sizes, dtype=np.int64)
    return out.view(np.uint8), 4 * w0


def parse_many(buf, starts, enc_len, raw_len, avail=None):
    """Many payload headers (as ``parse_table`` reads them) from one byte array: each
    table's first ``avail`` bytes (default: to the end of ``buf``) at ``starts``, its
    plane's payload and raw lengths. Returns
    (option, chunk, version (n, 3), counts, sizes of all chunks concatenated, indices
    ``parse_table`` would refuse)."""
    a = np.frombuffer(memoryview(buf).cast("B"), dtype=np.uint8)
    starts = np.asarray(starts, dtype=np.int64)
    enc_len = np.asarray(enc_len, dtype=np.int64)
    raw_len = np.asarray(raw_len, dtype=np.int64)
    n = len(starts)
    end = np.full(n, len(a), dtype=np.int64) if avail is None else \
        np.minimum(starts + np.asarray(avail, dtype=np.int64), len(a))
    pad = np.concatenate([a, np.zeros(8, dtype=np.uint8)])
    bad = (enc_len < FIXED_SIZE) | (starts + FIXED_SIZE > end)
    s = np.where(bad, 0, starts)
    version = np.stack([pad[s + k] for k in range(3)], axis=1).astype(np.int64)
    option = pad[s + 3].astype(np.int64)
    chunk = sum(pad[s + 4 + k].astype(np.int64) << (8 * k) for k in range(4))
    bad |= chunk == 0
    counts = np.where(bad, 0, -(-raw_len // np.maximum(chunk, 1)))
    start = FIXED_SIZE + 4 * counts
    bad |= (enc_len < start) | (s + start > end)
    counts = np.where(bad, 0, counts)
    first = np.cumsum(counts) - counts
    idx = np.repeat(s + FIXED_SIZE - 4 * first, counts) + 4 * np.arange(int(counts.sum()))
    sizes = sum(pad[idx + k].astype(np.int64) << (8 * k) for k in range(4))
    listed = np.bincount(np.repeat(np.arange(n), counts), weights=sizes, minlength=n)
    bad |= listed.astype(np.int64) != enc_len - start
    return option, chunk, version, counts, sizes, np.flatnonzero(bad)
