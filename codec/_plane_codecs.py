"""Plane codecs: small classes with a registry id, a major version, encode/decode over
buffers, and a JSON-round-tripping config.

Ids are written into blobs and never reused. Two codecs may share an id only if each
decodes the other's output (the contract between a GPU codec and its CPU twin).
The CPU codecs below are in the registry from the start; the nvCOMP ids are held by the
CPU twins of the GPU codecs (``_nvcomp_twins``), which ``s4fs.codec`` registers when it
is imported.
"""

from __future__ import annotations

import threading
import zlib
from abc import ABC, abstractmethod
from typing import ClassVar

from s4fs.errors import FormatError, UnsupportedVersionError

# ids written into blobs (never reuse one)
RAW = 0
CONST = 1
ZSTD = 2
DEFLATE = 3             # raw deflate (RFC 1951); the CPU writes Huffman-only or RLE streams
NVCOMP_ANS = 16
NVCOMP_GDEFLATE = 17
NVCOMP_DEFLATE = 18     # standard raw deflate: decodable with zlib on a CPU

NAMES = {RAW: "raw", CONST: "const", ZSTD: "zstd", DEFLATE: "deflate", NVCOMP_ANS: "nvcomp-ans",
         NVCOMP_GDEFLATE: "nvcomp-gdeflate", NVCOMP_DEFLATE: "nvcomp-deflate"}


class PlaneCodec(ABC):
    """Encodes one plane. ``encode`` may return ``None`` when coding does not pay."""

    codec_id: ClassVar[int]
    major: ClassVar[int] = 1
    name: ClassVar[str]

    @abstractmethod
    def encode(self, plane) -> bytes | None: ...

    @abstractmethod
    def decode(self, payload: memoryview, raw_len: int) -> bytes: ...

    def get_config(self) -> dict:
        return {"id": self.name}

    @classmethod
    def from_config(cls, config: dict) -> "PlaneCodec":
        cfg = {k: v for k, v in config.items() if k != "id"}
        return cls(**cfg)


class Raw(PlaneCodec):
    codec_id, name = RAW, "raw"

    def encode(self, plane) -> bytes:
        return bytes(plane)

    def decode(self, payload, raw_len):
        if len(payload) != raw_len:
            raise FormatError(f"raw plane holds {len(payload)} bytes, header says {raw_len}")
        return payload


class Const(PlaneCodec):
    """A plane whose bytes are all equal: one byte of payload."""

    codec_id, name = CONST, "const"

    def encode(self, plane) -> bytes | None:
        mv = memoryview(plane).cast("B")
        if len(mv) == 0:
            return None
        first = mv[0:1].tobytes()
        if bytes(mv).count(first) != len(mv):
            return None
        return first

    def decode(self, payload, raw_len):
        if len(payload) != 1:
            raise FormatError("constant plane payload must be one byte")
        return bytes(payload) * raw_len


class Zstd(PlaneCodec):
    """zstd frames without checksum or content size (the container has both)."""

    codec_id, name = ZSTD, "zstd"
    _local = threading.local()

    def __init__(self, level: int = 1) -> None:
        self.level = level

    def _cctx(self):
        import zstandard
        cache = getattr(self._local, "c", None)
        if cache is None:
            cache = self._local.c = {}
        ctx = cache.get(self.level)
        if ctx is None:
            ctx = cache[self.level] = zstandard.ZstdCompressor(
                level=self.level, write_checksum=False, write_content_size=False,
                write_dict_id=False)
        return ctx

    def _dctx(self):
        import zstandard
        ctx = getattr(self._local, "d", None)
        if ctx is None:
            ctx = self._local.d = zstandard.ZstdDecompressor()
        return ctx

    def encode(self, plane) -> bytes | None:
        out = self._cctx().compress(plane)
        return out if len(out) < len(memoryview(plane).cast("B")) else None

    def decode(self, payload, raw_len):
        import zstandard
        try:
            out = self._dctx().decompress(payload, max_output_size=raw_len)
        except zstandard.ZstdError as exc:
            raise FormatError(f"zstd plane is corrupt: {exc}") from None
        if len(out) != raw_len:
            raise FormatError(f"zstd plane decoded to {len(out)} bytes, header says {raw_len}")
        return out

    def get_config(self) -> dict:
        return {"id": self.name, "level": self.level}


class Deflate(PlaneCodec):
    """Raw deflate through zlib. ``strategy`` "huffman" codes every byte with a Huffman
    code rebuilt every 32 Ki symbols and no matches: the order-0 entropy of exponents,
    which zstd's greedy matching loses 5-10 % of (bench/codec.py). "rle" adds runs (zero
    stretches of optimizer state); "default" is ordinary deflate. Any strategy decodes
    with the same inflate."""

    codec_id, name = DEFLATE, "deflate"
    _STRATEGIES = {"huffman": zlib.Z_HUFFMAN_ONLY, "rle": zlib.Z_RLE,
                   "default": zlib.Z_DEFAULT_STRATEGY}

    def __init__(self, strategy: str = "huffman", level: int = 1) -> None:
        if strategy not in self._STRATEGIES:
            raise ValueError(f"deflate strategy must be one of {sorted(self._STRATEGIES)}")
        self.strategy, self.level = strategy, level

    def encode(self, plane) -> bytes | None:
        co = zlib.compressobj(self.level, zlib.DEFLATED, -15, 9, self._STRATEGIES[self.strategy])
        out = co.compress(plane) + co.flush()
        return out if len(out) < len(memoryview(plane).cast("B")) else None

    def decode(self, payload, raw_len):
        d = zlib.decompressobj(-15)
        try:
            out = d.decompress(payload, raw_len)
        except zlib.error as exc:
            raise FormatError(f"deflate plane is corrupt: {exc}") from None
        if len(out) != raw_len or not d.eof or d.unconsumed_tail or d.unused_data:
            raise FormatError(
                f"deflate plane does not decode to exactly {raw_len} bytes; it is corrupt")
        return out

    def get_config(self) -> dict:
        return {"id": self.name, "strategy": self.strategy, "level": self.level}


_REGISTRY: dict[int, type[PlaneCodec]] = {RAW: Raw, CONST: Const, ZSTD: Zstd, DEFLATE: Deflate}
_INSTANCES: dict[int, PlaneCodec] = {}


def register(cls: type[PlaneCodec]) -> None:
    _REGISTRY[cls.codec_id] = cls
    _INSTANCES.pop(cls.codec_id, None)


def decoder_for(codec_id: int, major: int) -> PlaneCodec:
    """The codec instance that decodes planes written with ``codec_id``/``major``."""
    cls = _REGISTRY.get(codec_id)
    if cls is None:
        raise UnsupportedVersionError(
            f"plane codec id {codec_id} is unknown to this version of s4fs; upgrade s4fs "
            f"to read this blob")
    if major < 1:
        raise FormatError(f"plane codec {cls.name} major version 0 was never written; "
                          f"the blob is corrupt")
    if major > cls.major:
        raise UnsupportedVersionError(
            f"plane codec {cls.name} v{major} is newer than this s4fs supports "
            f"(v{cls.major}); upgrade s4fs to read this blob")
    inst = _INSTANCES.get(codec_id)
    if inst is None:
        inst = _INSTANCES[codec_id] = cls()
    return inst


def codec_name(codec_id: int) -> str:
    return NAMES.get(codec_id, f"codec-{codec_id}")
