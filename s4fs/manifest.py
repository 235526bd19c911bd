"""The manifest: how a logical file is rebuilt from chunks.

A manifest is the last object written for a file, atomically; until it exists the file
does not. It is JSON, zstd-compressed, and versioned::

    {"format": "s4fs-manifest", "version": 1, "size": ..., "xxh128": ..., "mtime": ...,
     "mode": ..., "kind": "torch-zip" | "safetensors" | "raw",
     "packs": [pack keys ...],              # every pack this file needs, bases included
     "streams": [{"kind", "dtype", "name", "chunks": [ref ...]}, ...],
     "extents": [[file offset, length, stream index, stream offset], ...],
     "names": {"data/3": "encoder.layer.0....weight"},
     "base": {"path": ..., "id": ...} | null, "id": <unique id of this version>}

A chunk ref is ``{"p": pack index, "o": offset, "n": stored length, "r": raw length,
"h": xxh3-64 of the raw bytes, "d": delta depth, "b": base ref | absent}``; a delta ref
carries its whole base chain inline, so a manifest never depends on another manifest
(deleting a base checkpoint never breaks a delta: its packs stay referenced).
Stream 0 is the "raw" stream holding every non-tensor byte of the file, in order.
"""

from __future__ import annotations

import bisect
import json
from dataclasses import dataclass, field

import zstandard

from s4fs.errors import CorruptManifest

FORMAT = "s4fs-manifest"
VERSION = 1
_MAGIC = b"S4MF"


@dataclass
class ChunkRef:
    pack: str                 # pack object key
    offset: int
    stored: int
    raw: int
    checksum: int
    depth: int = 0
    base: "ChunkRef | None" = None

    def to_json(self, packs: dict[str, int]) -> dict:
        if self.pack not in packs:
            packs[self.pack] = len(packs)
        d = {"p": packs[self.pack], "o": self.offset, "n": self.stored, "r": self.raw,
             "h": self.checksum}
        if self.base is not None:
            d["d"] = self.depth
            d["b"] = self.base.to_json(packs)
        return d

    @classmethod
    def from_json(cls, d: dict, packs: list[str]) -> "ChunkRef":
        base = cls.from_json(d["b"], packs) if "b" in d else None
        return cls(packs[d["p"]], d["o"], d["n"], d["r"], d["h"], d.get("d", 0), base)

    def key(self) -> tuple[str, int]:
        return (self.pack, self.offset)


@dataclass
class Stream:
    kind: str                      # "raw" or "tensor"
    dtype: str = "bytes"
    name: str | None = None
    chunks: list[ChunkRef] = field(default_factory=list)
    _starts: list[int] | None = field(default=None, repr=False)

    @property
    def length(self) -> int:
        return sum(c.raw for c in self.chunks)

    def starts(self) -> list[int]:
        if self._starts is None or len(self._starts) != len(self.chunks):
            acc, out = 0, []
            for c in self.chunks:
                out.append(acc)
                acc += c.raw
            self._starts = out
        return self._starts

    def locate(self, offset: int) -> int:
        """Index of the chunk holding stream byte ``offset``."""
        return bisect.bisect_right(self.starts(), offset) - 1


@dataclass
class Manifest:
    size: int = 0
    xxh128: str = ""
    mtime: float = 0.0
    mode: int = 0o100644
    kind: str = "raw"
    id: str = ""
    streams: list[Stream] = field(default_factory=list)
    extents: list[tuple[int, int, int, int]] = field(default_factory=list)
    names: dict[str, str] = field(default_factory=dict)
    base: dict | None = None
    own_packs: list[str] = field(default_factory=list)   # packs this version wrote
    _ext_starts: list[int] | None = field(default=None, repr=False)

    # --- queries ---------------------------------------------------------------------

    def packs(self) -> set[str]:
        out: set[str] = set()
        for s in self.streams:
            for c in s.chunks:
                r = c
                while r is not None:
                    out.add(r.pack)
                    r = r.base
        return out

    def stored_bytes(self) -> int:
        """Bytes this file added to the store (its own blobs; bases not counted)."""
        own = set(self.own_packs)
        seen = set()
        total = 0
        for s in self.streams:
            for c in s.chunks:
                if c.pack in own and c.key() not in seen:
                    seen.add(c.key())
                    total += c.stored
        return total

    def locate(self, offset: int) -> int:
        if self._ext_starts is None or len(self._ext_starts) != len(self.extents):
            self._ext_starts = [e[0] for e in self.extents]
        return bisect.bisect_right(self._ext_starts, offset) - 1

    # --- serialisation ---------------------------------------------------------------

    def to_bytes(self) -> bytes:
        packs: dict[str, int] = {p: i for i, p in enumerate(self.own_packs)}
        streams = [{"kind": s.kind, "dtype": s.dtype, "name": s.name,
                    "chunks": [c.to_json(packs) for c in s.chunks]} for s in self.streams]
        doc = {"format": FORMAT, "version": VERSION, "size": self.size,
               "xxh128": self.xxh128, "mtime": self.mtime, "mode": self.mode,
               "kind": self.kind, "id": self.id,
               "packs": sorted(packs, key=packs.get), "streams": streams,
               "extents": [list(e) for e in self.extents], "names": self.names,
               "base": self.base, "own": len(self.own_packs)}
        raw = json.dumps(doc, separators=(",", ":")).encode()
        return _MAGIC + zstandard.ZstdCompressor(level=3).compress(raw)

    @classmethod
    def from_bytes(cls, data: bytes, where: str = "manifest") -> "Manifest":
        if not data.startswith(_MAGIC):
            raise CorruptManifest(f"{where} is not an s4fs manifest (wrong magic)")
        try:
            doc = json.loads(zstandard.ZstdDecompressor().decompress(data[4:]))
        except Exception as exc:
            raise CorruptManifest(f"{where} is corrupt: {exc}") from None
        if doc.get("format") != FORMAT:
            raise CorruptManifest(f"{where} is not an s4fs manifest")
        if doc.get("version") != VERSION:
            raise CorruptManifest(
                f"{where} has manifest version {doc.get('version')}; this s4fs reads "
                f"version {VERSION}: upgrade s4fs")
        try:
            packs = doc["packs"]
            streams = [Stream(s["kind"], s["dtype"], s["name"],
                              [ChunkRef.from_json(c, packs) for c in s["chunks"]])
                       for s in doc["streams"]]
            return cls(size=doc["size"], xxh128=doc["xxh128"], mtime=doc["mtime"],
                       mode=doc["mode"], kind=doc["kind"], id=doc.get("id", ""),
                       streams=streams, extents=[tuple(e) for e in doc["extents"]],
                       names=doc.get("names", {}), base=doc.get("base"),
                       own_packs=packs[: doc.get("own", 0)])
        except (KeyError, IndexError, TypeError) as exc:
            raise CorruptManifest(f"{where} is malformed: {exc!r}") from None
