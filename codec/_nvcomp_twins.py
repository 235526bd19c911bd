"""The nvCOMP plane codecs as seen from a CPU: registry ids, CPU twins, clear refusals.

The GPU pipeline (``s4fs.codec.gpu``) codes these planes in batches on the device;
these classes hold their ids in the plane codec registry (``s4fs.codec`` registers
them, see its ``__init__``), and are what the CPU path finds there for the same ids:

* ``nvcomp-deflate`` (18): each chunk is a raw RFC 1951 stream. zlib decodes and
  encodes it on any CPU (the CPU twin; each decodes the other's output).
* ``nvcomp-gdeflate`` (17): decoded and encoded on a CPU by nvCOMP's own CPU library
  (``libnvcomp_cpu``, in the nvidia-libnvcomp wheel, no CUDA needed) when installed.
* ``nvcomp-ans`` (16): GPU only; decoding on a CPU raises ``CodecUnavailableError``
  naming what is needed.
"""

from __future__ import annotations

import ctypes
import functools
import importlib.util
import os
import zlib

import numpy as np

from s4fs.errors import CodecUnavailableError, FormatError

from . import _nvcomp_payload as _payload
from . import _plane_codecs as P

INSTALL = ("pip install 's4fs[gpu]' (CUDA 12) or 's4fs[gpu-cu13]' (CUDA 13)")
CPU_VERSION = (0, 0, 0)      # version bytes of planes written by a CPU twin


class NvcompPlane(P.PlaneCodec):
    """Common payload handling of the nvCOMP plane codecs (codec major 1)."""

    major = 1
    algorithm = ""
    chunk = 1 << 16

    def encode(self, plane) -> bytes | None:
        raw = memoryview(plane).cast("B")
        n = len(raw)
        if n == 0:
            return None
        count = _payload.nchunks(n, self.chunk)
        pieces = [self._encode_chunks([raw[i * self.chunk:(i + 1) * self.chunk]
                                       for i in range(count)])]
        sizes = [len(p) for p in pieces[0]]
        out = _payload.pack_header(CPU_VERSION, self.option(), self.chunk, sizes) + \
            b"".join(pieces[0])
        return out if len(out) < n else None

    def decode(self, payload, raw_len: int) -> bytes:
        head = _payload.parse(payload, raw_len, self.name)
        self.check_version(head)
        buf = memoryview(payload).cast("B")
        ends = head.data_offset + np.cumsum(head.sizes, dtype=np.int64)
        starts = ends - head.sizes
        chunks = [buf[int(s):int(e)] for s, e in zip(starts, ends)]
        out = self._decode_chunks(chunks, head.raw_sizes(raw_len))
        if len(out) != raw_len:
            raise FormatError(f"{self.name} plane decoded to {len(out)} bytes, header says {raw_len}")
        return out

    def option(self) -> int:
        return 0

    def check_version(self, head: _payload.PayloadHeader) -> None:
        """Refuse planes whose bitstream this nvCOMP cannot read (ANS only)."""

    def _encode_chunks(self, chunks) -> list[bytes]:
        raise CodecUnavailableError(
            f"{self.name} planes are encoded on the GPU (s4fs.codec.compress with "
            f"device='cuda'); this needs a CUDA GPU with nvidia-nvcomp and cupy: {INSTALL}")

    def _decode_chunks(self, chunks, raw_sizes) -> bytes:
        raise NotImplementedError


def installed_nvcomp_version() -> tuple[int, int, int] | None:
    """The version of the importable nvCOMP Python package, without importing CUDA."""
    try:
        from importlib.metadata import PackageNotFoundError, version
    except ImportError:  # pragma: no cover
        return None
    for dist in ("nvidia-nvcomp-cu13", "nvidia-nvcomp-cu12", "nvidia-nvcomp-cu11"):
        try:
            parts = version(dist).split(".")
        except PackageNotFoundError:
            continue
        return tuple(int(p) for p in (parts + ["0", "0"])[:3])  # type: ignore[return-value]
    return None


class NvcompAns(NvcompPlane):
    codec_id, name, algorithm = P.NVCOMP_ANS, "nvcomp-ans", "ANS"

    def check_version(self, head: _payload.PayloadHeader) -> None:
        check_ans_version(head.version, installed_nvcomp_version())

    def _decode_chunks(self, chunks, raw_sizes) -> bytes:
        raise CodecUnavailableError(
            "this blob has a plane coded with nvCOMP ANS, which only decodes on a GPU: it "
            "needs a CUDA GPU with nvidia-nvcomp and cupy installed "
            f"({INSTALL}); decode it with device='auto' or device='cuda' on such a machine")


def check_ans_version(written: tuple[int, int, int], installed: tuple[int, int, int] | None) -> None:
    if written == CPU_VERSION or installed is None:
        return
    if written[0] != installed[0]:
        raise CodecUnavailableError(
            f"this plane was coded with nvCOMP ANS {'.'.join(map(str, written))}, but this "
            f"machine has nvCOMP {'.'.join(map(str, installed))}; the ANS bitstream changed "
            f"between nvCOMP major versions (6.0 changed it), so install nvidia-nvcomp "
            f"{written[0]}.x to decode it")


class NvcompGdeflate(NvcompPlane):
    codec_id, name, algorithm = P.NVCOMP_GDEFLATE, "nvcomp-gdeflate", "GDeflate"

    def _encode_chunks(self, chunks) -> list[bytes]:
        lib = cpu_gdeflate()
        if lib is None:
            return super()._encode_chunks(chunks)
        return lib.compress(chunks)

    def _decode_chunks(self, chunks, raw_sizes) -> bytes:
        lib = cpu_gdeflate()
        if lib is None:
            raise CodecUnavailableError(
                "this blob has a plane coded with nvCOMP GDeflate: decoding it needs a CUDA "
                f"GPU with nvidia-nvcomp and cupy ({INSTALL}), or at least nvCOMP's CPU "
                "library (pip install nvidia-libnvcomp-cu12 or -cu13) for a CPU decode")
        return lib.decompress(chunks, raw_sizes)


class NvcompDeflate(NvcompPlane):
    """Raw deflate chunks: zlib is this codec's CPU twin."""

    codec_id, name, algorithm = P.NVCOMP_DEFLATE, "nvcomp-deflate", "Deflate"

    def __init__(self, level: int = 1) -> None:
        self.level = level

    def option(self) -> int:
        return 0

    def _encode_chunks(self, chunks) -> list[bytes]:
        out = []
        for c in chunks:
            z = zlib.compressobj(self.level, zlib.DEFLATED, -15)
            out.append(z.compress(c) + z.flush())
        return out

    def _decode_chunks(self, chunks, raw_sizes) -> bytes:
        out = bytearray()
        for c, n in zip(chunks, raw_sizes):
            d = zlib.decompressobj(-15)
            try:
                piece = d.decompress(c, int(n))
            except zlib.error as exc:
                raise FormatError(f"nvcomp-deflate chunk is corrupt: {exc}") from None
            if len(piece) != n or not d.eof or d.unconsumed_tail or d.unused_data:
                raise FormatError("nvcomp-deflate chunk does not decode to its recorded size")
            out += piece
        return bytes(out)

    def get_config(self) -> dict:
        return {"id": self.name, "level": self.level}


class _CpuGdeflate:
    """nvCOMP's CPU GDeflate (``libnvcomp_cpu``), through ctypes."""

    _COMP = "_ZN6nvcomp8gdeflate11compressCPUEPKPKvPKmmmPKPvPmi"
    _DEC = "_ZN6nvcomp8gdeflate13decompressCPUEPKPKvPKmmPKPvPmSA_"
    _BOUND = "_ZN6nvcomp8gdeflate32compressCPUGetMaxOutputChunkSizeEmPm"

    def __init__(self, path: str) -> None:
        lib = ctypes.CDLL(path)
        self._comp = getattr(lib, self._COMP)
        self._dec = getattr(lib, self._DEC)
        self._bound = getattr(lib, self._BOUND)
        for f in (self._comp, self._dec, self._bound):
            f.restype = None

    def compress(self, chunks) -> list[bytes]:
        out = []
        for c in chunks:
            src = np.frombuffer(c, dtype=np.uint8)
            bound = ctypes.c_size_t(0)
            self._bound(ctypes.c_size_t(max(len(src), 1)), ctypes.byref(bound))
            dst = np.empty(bound.value, dtype=np.uint8)
            ins = (ctypes.c_void_p * 1)(src.ctypes.data)
            in_n = (ctypes.c_size_t * 1)(len(src))
            outs = (ctypes.c_void_p * 1)(dst.ctypes.data)
            out_n = (ctypes.c_size_t * 1)(0)
            self._comp(ins, in_n, ctypes.c_size_t(max(len(src), 1)), ctypes.c_size_t(1),
                       outs, out_n, ctypes.c_int(1))
            out.append(dst[: out_n[0]].tobytes())
        return out

    def decompress(self, chunks, raw_sizes) -> bytes:
        total = int(np.sum(raw_sizes))
        out = np.empty(total, dtype=np.uint8)
        n = len(chunks)
        srcs = [np.frombuffer(c, dtype=np.uint8) for c in chunks]
        ins = (ctypes.c_void_p * n)(*[s.ctypes.data for s in srcs])
        in_n = (ctypes.c_size_t * n)(*[len(s) for s in srcs])
        offs = np.concatenate([[0], np.cumsum(raw_sizes)[:-1]]).astype(np.int64)
        outs = (ctypes.c_void_p * n)(*[out.ctypes.data + int(o) for o in offs])
        cap = (ctypes.c_size_t * n)(*[int(s) for s in raw_sizes])
        got = (ctypes.c_size_t * n)(*([0] * n))
        self._dec(ins, in_n, ctypes.c_size_t(n), outs, cap, got)
        if list(got) != [int(s) for s in raw_sizes]:
            raise FormatError("nvcomp-gdeflate chunk does not decode to its recorded size")
        return out.tobytes()


@functools.lru_cache(maxsize=1)
def cpu_gdeflate() -> _CpuGdeflate | None:
    """nvCOMP's CPU GDeflate when the nvidia-libnvcomp wheel is installed (probed once)."""
    try:
        spec = importlib.util.find_spec("nvidia.libnvcomp")
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    for folder in spec.submodule_search_locations:
        path = os.path.join(folder, "lib64", "libnvcomp_cpu.so.6")
        if os.path.exists(path):
            try:
                return _CpuGdeflate(path)
            except (OSError, AttributeError):
                return None
    return None


ALL = (NvcompAns, NvcompGdeflate, NvcompDeflate)
BY_NAME = {"ans": NvcompAns, "gdeflate": NvcompGdeflate, "deflate": NvcompDeflate}
