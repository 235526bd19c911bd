"""compress / decompress: the codec's public entry points.

Each call checks its input, asks ``_device`` where to run, and hands the work to the CPU
pipeline (``_cpu``) or the GPU pipeline (``s4fs.codec.gpu``); both write and read the
same container (``_container``).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from s4fs.errors import BaseMismatchError, ChecksumError, FormatError

from . import _container as C
from . import _device
from . import _plane_codecs as P
from . import _pair, _planes
from ._buffers import as_bytes, checksum, undiff, xor
from ._cpu import DEFAULT_CPU, CpuProfile, compress_cpu, decode_cpu
from ._dtypes import BY_CODE, from_code, lookup

__all__ = ["compress", "decompress", "inspect", "BlobInfo", "CpuProfile", "as_bytes",
           "checksum", "xor"]


def compress(data, dtype="bytes", *, base=None, device: str = "auto",
             profile: CpuProfile | None = None, checksum: int | None = None,
             base_checksum: int | None = None, transform: str = "xor",
             base_dtype: str | None = None) -> bytes:
    """Compress ``data`` (bytes-like, NumPy array or torch tensor) losslessly.

    ``dtype`` names how to read the bytes (a torch dtype name, or ``"bytes"``); it only
    affects the ratio, never correctness: any bytes round-trip under any dtype.
    ``base``, when given, is a buffer of the same length; the blob then stores the
    byte-XOR with it (``transform="xor"``) or the zigzag-coded difference of the words
    (``"diff"``, words of the dtype's item size; coded on the CPU) and needs the same
    base to decode. ``transform="pair"``: ``data`` is fp32 words and ``base`` a
    ``base_dtype`` ("bfloat16" or "float16") copy of them, half as long — typically the
    master weights and the copy a mixed-precision model computes with; the blob stores
    each word's residual given the copy (s4fs.codec._pair; coded on the CPU).
    ``transform="on_master"``: the other way round, ``data`` is the bf16 or fp16 copy
    (``dtype``) and ``base`` its fp32 master, twice as long; the blob stores each word's
    difference from the master rounded to nearest (zero where the copy is that rounding;
    coded on the CPU).
    ``device`` is ``"auto"`` (GPU when CUDA and nvCOMP are available), ``"cpu"`` or
    ``"cuda"``.
    ``checksum`` / ``base_checksum``: :func:`checksum` of ``data`` / ``base`` where the
    caller has just taken it of these very bytes (the CPU path then does not hash them
    again). A wrong value cannot give wrong bytes back: :func:`decompress` checks what it
    restores, and the base it is given, against them and raises.
    """
    dt = lookup(dtype)
    if transform not in ("xor", "diff", "pair", "on_master"):
        raise ValueError(f"transform is 'xor', 'diff', 'pair' or 'on_master', not "
                         f"{transform!r}")
    if transform == "on_master":
        if base is None or dt.name not in _pair.HALF:
            raise ValueError("a copy coded on its master is bfloat16 or float16 data on a "
                             "base that is its float32 master: pass base=...")
        return compress_cpu(as_bytes(data), dt, base=base, profile=profile or DEFAULT_CPU,
                            data_sum=checksum, base_sum=base_checksum,
                            transform="on_master")
    if transform == "pair":
        if base is None or dt.name != "float32" or base_dtype not in _pair.HALF:
            raise ValueError("a pair codes float32 data on a base that is its bfloat16 or "
                             "float16 copy: pass base=... and base_dtype=...")
        return compress_cpu(as_bytes(data), dt, base=base, profile=profile or DEFAULT_CPU,
                            data_sum=checksum, base_sum=base_checksum, transform="pair",
                            base_dtype=base_dtype)
    if transform == "diff" and base is not None:
        return compress_cpu(as_bytes(data), dt, base=base, profile=profile or DEFAULT_CPU,
                            data_sum=checksum, base_sum=base_checksum, transform="diff")
    if _device.use_gpu(device, data):
        from . import gpu
        return _device.on_gpu_thread(gpu.compress, data, dt, base=base, profile=profile)
    raw = as_bytes(data)
    return compress_cpu(raw, dt, base=base, profile=profile or DEFAULT_CPU,
                        data_sum=checksum, base_sum=base_checksum)


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
        want = head.raw_len // 2 if head.pair else \
            head.raw_len * 2 if head.on_master else head.raw_len
        if len(base_view) != want or checksum(base_view) != head.base_checksum:
            raise BaseMismatchError(
                "this delta blob was written against a different base (its length or "
                "checksum does not match); pass the exact base bytes it was coded with")
    expected = _planes.plane_sizes(dt, head.layout, head.coded_len)
    if [p.raw_len for p in head.planes] != expected:
        raise FormatError(
            f"blob plane sizes {[p.raw_len for p in head.planes]} do not fit a "
            f"{dt.name} layout-{head.layout} chunk of {head.coded_len} bytes")
    if _device.decode_on_gpu(device, head):
        from . import gpu
        out = _device.on_gpu_thread(gpu.decompress_planes, blob, head, dt)
    else:
        out = decode_cpu(blob, head, dt)
    if head.pair and (dt.name != "float32" or head.raw_len % 4):
        raise FormatError("blob pairs words that are not float32 with a copy; the blob "
                          "is corrupt")
    if head.on_master and (dt.name not in _pair.HALF or head.raw_len % 2):
        raise FormatError("blob codes words that are not bfloat16 or float16 on a master; "
                          "the blob is corrupt")
    if base_view is not None:
        out = (_pair.restore(out, base_view, head.pair) if head.pair else
               _pair.copy_restore(out, base_view, dt.name) if head.on_master else
               undiff(out, base_view, dt.itemsize) if head.diff
               else xor(out, base_view)).tobytes()
    if checksum(out) != head.checksum:
        raise ChecksumError(
            "chunk checksum mismatch: the stored bytes are corrupt; restore this file from "
            "another copy (s4fs never returns bytes it cannot verify)")
    return out


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
