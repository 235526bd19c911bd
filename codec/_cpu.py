"""The CPU pipeline: split into byte planes, code each plane (Huffman / zstd / raw /
constant), pack the container; and the CPU decode of every plane codec it knows.

The GPU pipeline (``s4fs.codec.gpu``) writes the same container; ``s4fs.codec``'s
entry points pick one through ``_device``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from s4fs.errors import CodecError

from . import _container as C
from . import _plane_codecs as P
from . import _pair, _planes, _zstd_seq
from ._buffers import as_bytes, checksum, diff, xor
from ._dtypes import DType


@dataclass(frozen=True)
class CpuProfile:
    """How the CPU path codes planes (measurements in docs/benchmarks/codec.md).

    * exponent-like planes (``_planes.ENTROPY``) get order-0 Huffman coding: a zstd frame
      with literals only (zstd's own matching costs 5-10 % on exponents), plus offset-1
      matches over zero runs when more than ``rle_zeros`` of the plane is zero bytes
      (untouched rows of optimizer state, deltas); a very skewed plane also tries plain
      zstd, whose repeats then may pay.
    * other planes (mantissa bytes, integers, opaque bytes) get zstd at ``zstd_level``:
      level 1 catches zero runs and repeats and passes random bytes at GB/s; when it
      gains little but the bytes are skewed, Huffman-only coding is tried as well.
    * ``entropy`` "auto" builds the literal-only frames through python-zstandard's
      sequence API (``_zstd_seq``) when it loads, else uses deflate (Huffman-only or
      RLE); "deflate" forces deflate.
    * ``layout`` None picks per dtype (``_planes.cpu_layout_for``); tests may force one.
    * a plane that does not get smaller is stored raw; a constant one as one byte.
    """

    zstd_level: int = 1
    rle_zeros: float = 0.02
    entropy: str = "auto"
    layout: int | None = None


DEFAULT_CPU = CpuProfile()


def _entropy_bits(arr: np.ndarray, sample: int = 1 << 16) -> float:
    """Order-0 entropy (bits per byte) of a strided sample of ``arr``."""
    step = max(1, arr.size // sample)
    counts = np.bincount(arr[::step], minlength=256)
    p = counts[counts > 0] / counts.sum()
    return float(-(p * np.log2(p)).sum())


def _is_const(arr: np.ndarray) -> bool:
    return arr.size > 0 and not np.any(arr != arr[0])


def _entropy_code(arr: np.ndarray, runs: bool, profile: CpuProfile,
                  ) -> tuple[int, int, bytes | None]:
    """Order-0 coding (plus zero runs when ``runs``) of one plane: a literal-only zstd
    frame when python-zstandard's sequence API is there, else deflate."""
    enc = None
    if profile.entropy == "auto" and _zstd_seq.available():
        enc = _zstd_seq.encode(arr, runs=runs)
        cid, major = P.ZSTD, P.Zstd.major
    if enc is None:
        enc = P.Deflate("rle" if runs else "huffman").encode(arr)
        cid, major = P.DEFLATE, P.Deflate.major
    return cid, major, enc if enc is not None and len(enc) < arr.size else None


def _encode_plane_cpu(plane, kind: str, profile: CpuProfile) -> tuple[int, int, bytes]:
    arr = plane if isinstance(plane, np.ndarray) else np.frombuffer(plane, dtype=np.uint8)
    n = arr.size
    if n == 0 or kind == RAW_KIND:
        return P.RAW, P.Raw.major, arr if n else b""
    if kind == _planes.ENTROPY:
        zeros = n - np.count_nonzero(arr)
        if zeros == n:
            return P.CONST, P.Const.major, arr[:1].tobytes()
        cid, major, enc = _entropy_code(arr, zeros > profile.rle_zeros * n, profile)
        if enc is not None and len(enc) < 0.3 * n:
            # very skewed: repeats may pay too (deltas, integer-valued or tiled data)
            lz = P.Zstd(profile.zstd_level).encode(arr)
            if lz is not None and len(lz) < len(enc):
                cid, major, enc = P.ZSTD, P.Zstd.major, lz
    else:
        enc = P.Zstd(profile.zstd_level).encode(arr)
        cid, major = P.ZSTD, P.Zstd.major
        best = n if enc is None else len(enc)
        # zstd leaves literals raw unless Huffman saves > 1.6 %, and its matches can
        # cost more than they save; a skewed byte plane (low mantissa bytes of partly
        # low-precision tensors) still gains from plain Huffman coding
        if best > 0.9 * n and _entropy_bits(arr) < 7.92 * best / n:
            hid, hmajor, huff = _entropy_code(arr, False, profile)
            if huff is not None and len(huff) < best:
                enc, cid, major = huff, hid, hmajor
    if enc is None:
        return P.RAW, P.Raw.major, arr
    if len(enc) < 48 + n // 4096 and _is_const(arr):
        return P.CONST, P.Const.major, arr[:1].tobytes()
    return cid, major, enc


#: a pair's plane whose first bytes zstd cannot shrink by this much is stored raw
RANDOM_SAMPLE, RANDOM_GAIN = 1 << 16, 0.02


def _raw_if_random(plane, kind: str) -> str:
    """A pair residual's low bytes are the master's low mantissa bits, as good as random
    unless the master was made from its copy (then constant): a sample says which, so
    that the whole plane is not offered to zstd and Huffman in vain."""
    arr = plane if isinstance(plane, np.ndarray) else np.frombuffer(plane, dtype=np.uint8)
    if kind != _planes.GENERIC or arr.size < 4 * RANDOM_SAMPLE:
        return kind
    head = arr[:RANDOM_SAMPLE]
    coded = P.Zstd(1).encode(head)
    if coded is None or len(coded) > (1 - RANDOM_GAIN) * RANDOM_SAMPLE:
        return RAW_KIND
    return kind


RAW_KIND = "raw"            # (pairs only) stored as it is, no coder tried


def encode_planes_cpu(planes, kinds, profile: CpuProfile = DEFAULT_CPU,
                      ) -> list[tuple[int, int, int, bytes]]:
    out = []
    for p, kind in zip(planes, kinds):
        cid, major, payload = _encode_plane_cpu(p, kind, profile)
        raw_len = p.nbytes if isinstance(p, np.ndarray) else len(p)
        out.append((cid, major, raw_len, payload))
    return out


def pack_chunk(dt: DType, layout: int, data_checksum: int, base_checksum: int | None,
               raw: memoryview, planes: list[tuple[int, int, int, bytes]],
               diff: bool = False, pair: str | None = None,
               on_master: bool = False) -> bytes:
    """Pack coded planes, falling back to one raw plane when that is not larger.

    ``raw`` is what the planes were split from (the XOR when delta, or with ``diff`` the
    words' difference). The fallback keeps ``len(blob) <= len(data) + 64`` for every
    input.
    """
    flags = C.FLAG_DELTA if base_checksum is not None else 0
    if diff:
        flags |= C.FLAG_DIFF
    if pair is not None:
        flags |= C.FLAG_PAIR | (C.FLAG_PAIR_FP16 if pair == "float16" else 0)
    if on_master:
        flags |= C.FLAG_ON_MASTER
    n = len(raw)
    planar = C.header_size(flags, n, [(r, len(p)) for _, _, r, p in planes]) + \
        sum(len(p) for *_, p in planes)
    flat = C.header_size(flags, n, [(n, n)]) + n
    if planar >= flat or layout == _planes.FLAT and planes[0][0] == P.RAW:
        planes = [(P.RAW, P.Raw.major, n, bytes(raw))]
        layout = _planes.FLAT
    return C.pack(dt.code, flags, layout, data_checksum, base_checksum, n, planes)


def compress_cpu(raw: memoryview, dt: DType, *, base=None,
                 profile: CpuProfile = DEFAULT_CPU, data_sum: int | None = None,
                 base_sum: int | None = None, transform: str = "xor",
                 base_dtype: str | None = None) -> bytes:
    """``data_sum`` / ``base_sum``: the checksums of ``raw`` / ``base`` where the caller
    has them (else taken here). ``transform``: how a delta is taken (``"xor"``, ``"diff"``
    or ``"pair"`` on a ``base_dtype`` copy; s4fs.codec.compress)."""
    if data_sum is None:
        data_sum = checksum(raw)
    src = raw
    if base is not None and transform in ("pair", "on_master"):
        b = as_bytes(base)
        if transform == "on_master":
            src = memoryview(_pair.copy_residual(raw, b, dt.name))
        else:
            src = memoryview(_pair.residual(raw, b, base_dtype))
        if base_sum is None:
            base_sum = checksum(b)
        # the residual's bytes are grouped: its high bytes are zero where the copy is
        # the master rounded, its low ones the master's own low mantissa bits
        layout = _planes.BYTES if profile.layout is None else profile.layout
        planes = _planes.split(src, dt, layout)
        kinds = [_raw_if_random(p, k) for p, k in
                 zip(planes, _planes.plane_kinds(dt, layout, len(src)))]
        coded = encode_planes_cpu(planes, kinds, profile)
        return pack_chunk(dt, layout, data_sum, base_sum, src, coded,
                          pair=base_dtype if transform == "pair" else None,
                          on_master=transform == "on_master")
    if base is not None:
        b = as_bytes(base)
        if len(b) != len(raw):
            raise CodecError(
                f"delta base has {len(b)} bytes but data has {len(raw)}; a base must be "
                f"exactly as long as the data")
        if base_sum is None:
            base_sum = checksum(b)
        src = memoryview(diff(raw, b, dt.itemsize) if transform == "diff" else xor(raw, b))
    else:
        base_sum = None
    layout = _planes.cpu_layout_for(dt) if profile.layout is None else profile.layout
    if not _planes.fits(dt, layout):
        raise CodecError(f"plane layout {layout} is not defined for {dt.name}")
    planes = _planes.split(src, dt, layout)
    coded = encode_planes_cpu(planes, _planes.plane_kinds(dt, layout, len(src)), profile)
    return pack_chunk(dt, layout, data_sum, base_sum, src, coded,
                      diff=base is not None and transform == "diff")


def decode_cpu(blob, head: C.Header, dt: DType) -> bytes:
    buf = memoryview(blob).cast("B")
    pos = head.payload_offset
    planes = []
    for ph in head.planes:
        payload = buf[pos: pos + ph.enc_len]
        pos += ph.enc_len
        planes.append(P.decoder_for(ph.codec_id, ph.codec_major).decode(payload, ph.raw_len))
    return C.expand(_planes.merge(planes, dt, head.layout, head.coded_len), head)
