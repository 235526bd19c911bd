"""compress / decompress: the codec's public entry points.

The CPU pipeline lives here; the GPU pipeline (``s4fs.codec.gpu``) produces the same
container and is chosen at run time by ``device``.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

import numpy as np
import xxhash

from s4fs.errors import BaseMismatchError, ChecksumError, CodecError, FormatError

from . import _container as C
from . import _plane_codecs as P
from . import _planes, _zstd_seq
from ._dtypes import BY_CODE, DType, from_code, lookup

_GPU_LOCK = threading.Lock()
_GPU_THREAD = None


def _on_gpu_thread(fn, *args, **kwargs):
    """Run GPU codec work on one long-lived thread per process: CUDA and CuPy keep
    per-thread state, and callers (the ingest and read pools) are many short threads."""
    global _GPU_THREAD
    if _GPU_THREAD is None:
        with _GPU_LOCK:
            if _GPU_THREAD is None:
                from concurrent.futures import ThreadPoolExecutor
                _GPU_THREAD = ThreadPoolExecutor(1, thread_name_prefix="s4fs-gpu")
    if threading.current_thread().name.startswith("s4fs-gpu"):
        return fn(*args, **kwargs)
    return _GPU_THREAD.submit(fn, *args, **kwargs).result()


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
    if n == 0:
        return P.RAW, P.Raw.major, b""
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


def encode_planes_cpu(planes, kinds, profile: CpuProfile = DEFAULT_CPU,
                      ) -> list[tuple[int, int, int, bytes]]:
    out = []
    for p, kind in zip(planes, kinds):
        cid, major, payload = _encode_plane_cpu(p, kind, profile)
        raw_len = p.nbytes if isinstance(p, np.ndarray) else len(p)
        out.append((cid, major, raw_len, payload))
    return out


def pack_chunk(dt: DType, layout: int, data_checksum: int, base_checksum: int | None,
               raw: memoryview, planes: list[tuple[int, int, int, bytes]]) -> bytes:
    """Pack coded planes, falling back to one raw plane when that is not larger.

    ``raw`` is what the planes were split from (the XOR when delta). The fallback keeps
    ``len(blob) <= len(data) + 64`` for every input.
    """
    flags = C.FLAG_DELTA if base_checksum is not None else 0
    n = len(raw)
    planar = C.header_size(flags, n, [(r, len(p)) for _, _, r, p in planes]) + \
        sum(len(p) for *_, p in planes)
    flat = C.header_size(flags, n, [(n, n)]) + n
    if planar >= flat or layout == _planes.FLAT and planes[0][0] == P.RAW:
        planes = [(P.RAW, P.Raw.major, n, bytes(raw))]
        layout = _planes.FLAT
    return C.pack(dt.code, flags, layout, data_checksum, base_checksum, n, planes)


def compress(data, dtype="bytes", *, base=None, device: str = "auto",
             profile: CpuProfile | None = None) -> bytes:
    """Compress ``data`` (bytes-like, NumPy array or torch tensor) losslessly.

    ``dtype`` names how to read the bytes (a torch dtype name, or ``"bytes"``); it only
    affects the ratio, never correctness: any bytes round-trip under any dtype.
    ``base``, when given, is a buffer of the same length; the blob then stores the
    byte-XOR with it and needs the same base to decode.
    ``device`` is ``"auto"`` (GPU when CUDA and nvCOMP are available), ``"cpu"`` or
    ``"cuda"``.
    """
    dt = lookup(dtype)
    if _use_gpu(device, data):
        from . import gpu
        return _on_gpu_thread(gpu.compress, data, dt, base=base, profile=profile)
    raw = as_bytes(data)
    return compress_cpu(raw, dt, base=base, profile=profile or DEFAULT_CPU)


def compress_cpu(raw: memoryview, dt: DType, *, base=None,
                 profile: CpuProfile = DEFAULT_CPU) -> bytes:
    data_sum = checksum(raw)
    base_sum = None
    src = raw
    if base is not None:
        b = as_bytes(base)
        if len(b) != len(raw):
            raise CodecError(
                f"delta base has {len(b)} bytes but data has {len(raw)}; a base must be "
                f"exactly as long as the data")
        base_sum = checksum(b)
        src = memoryview(xor(raw, b))
    layout = _planes.cpu_layout_for(dt) if profile.layout is None else profile.layout
    if not _planes.fits(dt, layout):
        raise CodecError(f"plane layout {layout} is not defined for {dt.name}")
    planes = _planes.split(src, dt, layout)
    coded = encode_planes_cpu(planes, _planes.plane_kinds(dt, layout, len(src)), profile)
    return pack_chunk(dt, layout, data_sum, base_sum, src, coded)


def _use_gpu(device: str, data=None) -> bool:
    if device == "cpu":
        return False
    if device == "cuda":
        from . import gpu
        gpu.require()
        return True
    if device != "auto":
        raise CodecError(f"device must be 'auto', 'cpu' or 'cuda', not {device!r}")
    from ._probe import gpu_available
    if not gpu_available():
        return False
    from . import gpu
    return data is None or gpu.prefers(data)


def decompress(blob, *, base=None, device: str = "auto") -> bytes:
    """Restore the exact bytes given to :func:`compress`.

    Raises a :class:`~s4fs.errors.CodecError` subclass (never returns wrong bytes) when the
    blob is corrupt, truncated, from a newer format, needs a missing codec, or was a delta
    written against another base.
    """
    head = C.unpack(blob)
    if head.delta and base is None:
        raise BaseMismatchError(
            "this blob is a delta: pass the base it was written against (base=...)")
    if not head.delta and base is not None:
        raise BaseMismatchError("this blob is not a delta, but a base was given")
    dt = from_code(head.dtype_code)
    if head.layout not in _planes.LAYOUTS:
        from s4fs.errors import UnsupportedVersionError
        raise UnsupportedVersionError(
            f"blob uses plane layout {head.layout}, unknown to this s4fs; upgrade s4fs")
    if not _planes.fits(dt, head.layout):
        raise FormatError(f"blob pairs dtype {dt.name} with plane layout {head.layout}, "
                          f"which does not exist; the blob is corrupt")
    base_view = None
    if head.delta:
        base_view = as_bytes(base)
        if len(base_view) != head.raw_len or checksum(base_view) != head.base_checksum:
            raise BaseMismatchError(
                "this delta blob was written against a different base (its length or "
                "checksum does not match); pass the exact base bytes it was coded with")
    expected = _planes.plane_sizes(dt, head.layout, head.raw_len)
    if [p.raw_len for p in head.planes] != expected:
        raise FormatError(
            f"blob plane sizes {[p.raw_len for p in head.planes]} do not fit a "
            f"{dt.name} layout-{head.layout} chunk of {head.raw_len} bytes")
    if _wants_gpu_decode(device, head):
        from . import gpu
        out = _on_gpu_thread(gpu.decompress_planes, blob, head, dt)
    else:
        out = _decode_cpu(blob, head, dt)
    if base_view is not None:
        out = xor(out, base_view).tobytes()
    if checksum(out) != head.checksum:
        raise ChecksumError(
            "chunk checksum mismatch: the stored bytes are corrupt; restore this file from "
            "another copy (s4fs never returns bytes it cannot verify)")
    return out


def _wants_gpu_decode(device: str, head: C.Header) -> bool:
    gpu_planes = any(p.codec_id >= 16 for p in head.planes)
    if device == "cpu" or not gpu_planes and device == "auto":
        return False
    return _use_gpu(device)


def _decode_cpu(blob, head: C.Header, dt: DType) -> bytes:
    buf = memoryview(blob).cast("B")
    pos = head.payload_offset
    planes = []
    for ph in head.planes:
        payload = buf[pos: pos + ph.enc_len]
        pos += ph.enc_len
        planes.append(P.decoder_for(ph.codec_id, ph.codec_major).decode(payload, ph.raw_len))
    return _planes.merge(planes, dt, head.layout, head.raw_len)


@dataclass(frozen=True)
class BlobInfo:
    dtype: str
    raw_len: int
    stored_len: int
    delta: bool
    planes: list[dict] = field(default_factory=list)


def inspect(blob) -> BlobInfo:
    """Describe a blob without decoding it (dtype, sizes, codec of each plane)."""
    head = C.unpack(blob)
    dt = BY_CODE.get(head.dtype_code)
    return BlobInfo(
        dtype=dt.name if dt else f"code-{head.dtype_code}", raw_len=head.raw_len,
        stored_len=len(memoryview(blob).cast("B")), delta=head.delta,
        planes=[{"codec": P.codec_name(p.codec_id), "major": p.codec_major,
                 "raw": p.raw_len, "stored": p.enc_len} for p in head.planes])
