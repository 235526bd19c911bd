"""The manifest: how a logical file is rebuilt from chunks.

A manifest is the last object written for a file, atomically; until it exists the file
does not. It is a JSON document, zstd-compressed, versioned, and (from version 2) sealed
with a checksum (:mod:`s4fs.sealed`, kind ``"manifest"``)::

    {"format": "s4fs-manifest", "version": 2, "size": ..., "xxh128": ..., "mtime": ...,
     "mtime_ns": ..., "atime_ns": ..., "ctime_ns": ...,    # optional, see below
     "mode": ..., "kind": "torch-zip" | "safetensors" | "raw",
     "packs": [pack keys ...],              # every pack this file needs, bases included
     "own": <how many of the first packs this version wrote>,
     "streams": [{"kind", "dtype", "name", "chunks": [ref ...]}, ...],
     "extents": [[file offset, length, stream index, stream offset], ...],
     "names": {"data/3": "encoder.layer.0....weight"},
     "base": {"path": ..., "id": ...} | null, "id": <unique id of this version>}

A chunk ref is ``{"p": pack index, "o": offset, "n": stored length, "r": raw length,
"h": xxh3-64 of the raw bytes, "d": delta depth, "b": base ref | absent}``; a delta ref
carries its whole base chain inline, so a manifest never depends on another manifest
(deleting a base checkpoint never breaks a delta: its packs stay referenced).
Stream 0 is the "raw" stream holding every non-tensor byte of the file, in order.

Times: ``"mtime"`` is seconds since the epoch as a JSON float (every s4fs writes it, so
older readers keep working); the optional integers are nanoseconds: ``"mtime_ns"`` the
exact mtime (a reader prefers it to ``"mtime"``), ``"atime_ns"`` an access time set
explicitly (utime), ``"ctime_ns"`` when this version was made (a change of content or
attributes). A manifest without them (older s4fs) reads with the mtime as the other two.

Stored forms:

* version 2 (written): ``seal("manifest", zstd(JSON))``; the checksum covers every
  stored byte, so a damaged manifest is refused (``CorruptManifest``, EIO), never read.
  Every later version keeps the sealed payload a zstd frame of a JSON object carrying
  ``"format"`` and ``"version"``, so this reader can name the version it refuses.
* version 1 (read only): ``b"S4MF" + zstd(JSON)``, no checksum.

Whatever the version, a loaded manifest is checked for consistency before use (and
``to_bytes`` refuses to write one that fails): every index in range, extents contiguous
from 0 and covering ``size``, the extents that map into each stream tiling it exactly,
a delta base as long as its chunk and one level shallower, every ref to one blob (pack,
offset) agreeing about it. So even a manifest damaged before it was sealed (or a
version-1 one) is refused rather than making a read crash, hang, or read from the
wrong place; what such damage can still do is caught by the chunk checksums and the
whole-file hash.
"""

from __future__ import annotations

import bisect
import json
import math
import time
import uuid
from dataclasses import dataclass, field

import zstandard

from s4fs import sealed
from s4fs.errors import CorruptManifest

FORMAT = "s4fs-manifest"
VERSION = 2                 # the version written; versions 1 and 2 are read
_MAGIC_V1 = b"S4MF"         # version 1: this magic, then the zstd frame, no checksum
_MAX_CHECKSUM = (1 << 64) - 1
_TIMES_NS = ("mtime_ns", "atime_ns", "ctime_ns")     # optional keys, int nanoseconds
_OWNER = ("uid", "gid")                              # optional keys: who owns the file
_MAX_ID = (1 << 32) - 2                              # (uid_t)-1 means "no change"
_MIN_NS, _MAX_NS = -(1 << 63), (1 << 63) - 1        # what a stat can carry
_REMEDY = ("restore the object from a copy of the store (bucket versioning or a replica), "
           "or delete the file and save it again")


def seconds_to_ns(seconds: float) -> int:
    """A time in float seconds as integer nanoseconds, as exactly as the float holds it
    (``round(seconds * 1e9)`` is off by up to a few hundred ns at today's dates)."""
    whole = math.floor(seconds)
    return whole * 1_000_000_000 + round((seconds - whole) * 1e9)


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

    @property
    def hops(self) -> int:
        """The deltas on other versions a read of this chunk goes through: its chain's
        links less the pair links within one file (``max_delta_depth`` bounds these;
        ``depth`` counts every link)."""
        n, r = 0, self
        while r.base is not None:
            n += not r.paired
            r = r.base
        return n

    @property
    def paired(self) -> bool:
        """Coded on its *pair* (s4fs.codec._pair): fp32 words on their low-precision
        copy, half as long, or the copy on its fp32 master, twice as long — not on an
        earlier version of itself."""
        return self.base is not None and self.base.raw != self.raw


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
    # the exact mtime; None: ``mtime`` (older manifests). Whoever sets one sets both
    mtime_ns: int | None = None
    atime_ns: int | None = None    # set explicitly; None: the mtime
    ctime_ns: int | None = None    # when this version was made; None: the mtime
    uid: int | None = None         # the owner; None: not recorded (the mount's --uid)
    gid: int | None = None         # the group; None: not recorded (the mount's --gid)
    _ext_starts: list[int] | None = field(default=None, repr=False)

    # --- queries ---------------------------------------------------------------------

    def pack_ends(self) -> dict[str, int]:
        """Every pack the chunks need (their delta chains too), with how many of its
        bytes: the end of the last blob in it."""
        out: dict[str, int] = {}
        for s in self.streams:
            for c in s.chunks:
                r = c
                while r is not None:
                    end = r.offset + r.stored
                    if out.get(r.pack, -1) < end:
                        out[r.pack] = end
                    r = r.base
        return out

    def packs(self) -> set[str]:
        return set(self.pack_ends())

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

    def times_ns(self) -> tuple[int, int, int]:
        """(atime, mtime, ctime) in nanoseconds, each falling back to the mtime."""
        mtime = self.mtime_ns if self.mtime_ns is not None else seconds_to_ns(self.mtime)
        return (mtime if self.atime_ns is None else self.atime_ns, mtime,
                mtime if self.ctime_ns is None else self.ctime_ns)

    def locate(self, offset: int) -> int:
        if self._ext_starts is None or len(self._ext_starts) != len(self.extents):
            self._ext_starts = [e[0] for e in self.extents]
        return bisect.bisect_right(self._ext_starts, offset) - 1

    # --- serialisation ---------------------------------------------------------------

    def to_bytes(self) -> bytes:
        """The stored form: version 2, sealed. Refuses to serialise an inconsistent
        manifest (it could not be read back)."""
        packs: dict[str, int] = {p: i for i, p in enumerate(self.own_packs)}
        streams = [{"kind": s.kind, "dtype": s.dtype, "name": s.name,
                    "chunks": [c.to_json(packs) for c in s.chunks]} for s in self.streams]
        doc = {"format": FORMAT, "version": VERSION, "size": self.size,
               "xxh128": self.xxh128, "mtime": self.mtime, "mode": self.mode,
               "kind": self.kind, "id": self.id,
               "packs": sorted(packs, key=packs.get), "streams": streams,
               "extents": [list(e) for e in self.extents], "names": self.names,
               "base": self.base, "own": len(self.own_packs)}
        for k in _TIMES_NS + _OWNER:             # optional: absent when unknown
            if getattr(self, k) is not None:
                doc[k] = getattr(self, k)
        problem = _inconsistency(doc)
        if problem:
            raise CorruptManifest(
                f"internal error: s4fs built an inconsistent manifest ({problem}) and did not "
                f"store it; the file was not saved (please report this)")
        raw = json.dumps(doc, separators=(",", ":")).encode()
        return sealed.seal(sealed.KIND_MANIFEST, zstandard.ZstdCompressor(level=3).compress(raw))

    @classmethod
    def from_bytes(cls, data: bytes, where: str = "manifest") -> "Manifest":
        """Parse a stored manifest (version 1 or 2); CorruptManifest (EIO) if it is damaged,
        inconsistent, or written by a newer s4fs."""
        data = bytes(data)
        if data.startswith(_MAGIC_V1):
            container, body = 1, data[len(_MAGIC_V1):]
        elif sealed.is_sealed(data):
            container, body = 2, sealed.unseal(data, kind=sealed.KIND_MANIFEST, where=where)
        else:
            raise CorruptManifest(f"{where} is not an s4fs manifest (wrong magic); {_REMEDY}")
        doc = _inflate(body, where)
        if not isinstance(doc, dict) or doc.get("format") != FORMAT:
            raise CorruptManifest(f"{where} is not an s4fs manifest; {_REMEDY}")
        version = doc.get("version")
        if type(version) is int and version > VERSION:
            raise CorruptManifest(
                f"{where} has manifest version {version}; this s4fs reads versions 1 to "
                f"{VERSION}: upgrade s4fs")
        if version != container:
            raise CorruptManifest(
                f"{where} is corrupt: it says version {version!r} in a version-{container} "
                f"container; {_REMEDY}")
        problem = _inconsistency(doc)
        if problem:
            why = ("it was damaged before it was sealed (a faulty s4fs? please report it)"
                   if container == 2 else "a version-1 manifest has no checksum: it was damaged")
            raise CorruptManifest(f"{where} is inconsistent ({problem}): {why}; {_REMEDY}")
        packs = doc["packs"]
        streams = [Stream(s["kind"], s["dtype"], s["name"],
                          [ChunkRef.from_json(c, packs) for c in s["chunks"]])
                   for s in doc["streams"]]
        return cls(size=doc["size"], xxh128=doc["xxh128"], mtime=doc["mtime"],
                   mode=doc["mode"], kind=doc["kind"], id=doc.get("id", ""),
                   streams=streams, extents=[tuple(e) for e in doc["extents"]],
                   names=doc.get("names", {}), base=doc.get("base"),
                   own_packs=packs[: doc.get("own", 0)],
                   **{k: doc[k] for k in _TIMES_NS + _OWNER if k in doc})


def stored_split(m: Manifest) -> dict:
    """How one version's bytes were stored: ``stored_delta`` and ``stored_full`` (bytes
    in its own packs, as deltas / whole chunks), ``unchanged`` (logical bytes of chunks
    reused from an earlier version), ``chain_depth`` (the most deltas on other versions a
    chunk is read through), ``read_cold`` (stored bytes a node
    with nothing cached fetches to read it: every blob of every chunk's delta chain,
    once). The one place this is counted: ``s4fs stat``, ``s4fs report`` and the
    metrics all use it."""
    own = set(m.own_packs)
    delta_bytes = full_bytes = reused = depth = 0
    blobs: dict[tuple[str, int], int] = {}
    for s in m.streams:
        for c in s.chunks:
            if c.pack not in own:
                reused += c.raw
            elif c.base is not None:
                delta_bytes += c.stored
            else:
                full_bytes += c.stored
            depth = max(depth, c.hops)
            link = c
            while link is not None:
                blobs[link.key()] = link.stored
                link = link.base
    return {"stored_delta": delta_bytes, "stored_full": full_bytes, "unchanged": reused,
            "chain_depth": depth, "read_cold": sum(blobs.values())}


class ManifestBuilder:
    """A new version's manifest, built as its bytes are placed in file order: the one
    place one is assembled (``s4fs.write.IngestSession``, the device save of
    ``s4fs.torch.save``). Stream 0 is the raw stream (:attr:`raw`); :meth:`add` appends
    a tensor stream, :meth:`place` maps the next bytes of the file into a stream (a run
    contiguous in both joins the extent before it), :meth:`build` makes the manifest."""

    def __init__(self) -> None:
        self.raw = Stream("raw")
        self.streams: list[Stream] = [self.raw]
        self.extents: list[list[int]] = []

    def add(self, stream: Stream) -> int:
        """Append ``stream``; its index."""
        self.streams.append(stream)
        return len(self.streams) - 1

    def place(self, offset: int, n: int, sidx: int, soff: int) -> None:
        """The file's bytes [offset, offset + n) are stream ``sidx``'s from ``soff``."""
        if self.extents:
            last = self.extents[-1]
            if last[2] == sidx and last[3] + last[1] == soff and last[0] + last[1] == offset:
                last[1] += n
                return
        self.extents.append([offset, n, sidx, soff])

    def build(self, *, size: int, xxh128: str, kind: str, names: dict, own_packs,
              base: dict | None, mode: int = 0o100644, mtime: float | None = None,
              mtime_ns: int | None = None, atime_ns: int | None = None) -> Manifest:
        """The manifest of a new version (a fresh id, made now: ``ctime_ns``), its mtime
        ``mtime_ns``, else ``mtime`` in seconds, else now."""
        now = time.time_ns()
        if mtime_ns is None:
            mtime_ns = now if mtime is None else seconds_to_ns(mtime)
        return Manifest(size=size, xxh128=xxh128, mtime=mtime_ns / 1e9, mtime_ns=mtime_ns,
                        atime_ns=atime_ns, ctime_ns=now, mode=mode, kind=kind,
                        id=uuid.uuid4().hex, streams=self.streams,
                        extents=[tuple(e) for e in self.extents], names=names,
                        own_packs=list(own_packs), base=base)


def _inflate(body: bytes, where: str):
    """The JSON document in one zstd frame (nothing before or after it)."""
    try:
        d = zstandard.ZstdDecompressor().decompressobj()
        raw = d.decompress(body)
        whole, trailing = d.eof, bool(d.unused_data)
    except zstandard.ZstdError as exc:
        raise CorruptManifest(f"{where} is corrupt ({exc}); {_REMEDY}") from None
    if not whole or trailing:
        raise CorruptManifest(f"{where} is corrupt (compressed body "
                              f"{'truncated' if not whole else 'followed by trailing bytes'})"
                              f"; {_REMEDY}")
    try:
        return json.loads(raw)
    except (ValueError, RecursionError) as exc:
        raise CorruptManifest(f"{where} is corrupt (not JSON: {exc}); {_REMEDY}") from None


# --- consistency ---------------------------------------------------------------------

class _Bad(Exception):
    pass


def _inconsistency(doc: dict) -> str | None:
    """Why ``doc`` cannot be read safely, or None. Checks every field a read depends on."""
    try:
        _check(doc)
    except _Bad as exc:
        return str(exc)
    except RecursionError:
        return "chunk refs nested too deeply"
    return None


def _int(v, what: str, lo: int = 0, hi: int | None = None) -> int:
    if type(v) is not int or v < lo or (hi is not None and v > hi):
        raise _Bad(f"{what} is {v!r}")
    return v


def _is(v, types, what: str):
    if not isinstance(v, types) or isinstance(v, bool):
        raise _Bad(f"{what} has the wrong type ({type(v).__name__})")
    return v


def _check(doc: dict) -> None:
    for k in ("packs", "streams", "extents", "size", "xxh128", "mtime", "mode", "kind"):
        if k not in doc:
            raise _Bad(f"no {k!r}")
    packs = _is(doc["packs"], list, "packs")
    for p in packs:
        _is(p, str, "a pack key")
    if len(set(packs)) != len(packs):
        raise _Bad("a pack is listed twice")
    _int(doc.get("own", 0), "'own'", 0, len(packs))
    size = _int(doc["size"], "size")
    _is(doc["xxh128"], str, "xxh128")
    _is(doc["mtime"], (int, float), "mtime")
    for k in _TIMES_NS:
        if k in doc:
            _int(doc[k], repr(k), _MIN_NS, _MAX_NS)
    for k in _OWNER:
        if k in doc:
            _int(doc[k], repr(k), 0, _MAX_ID)
    _int(doc["mode"], "mode")
    _is(doc["kind"], str, "kind")
    _is(doc.get("id", ""), str, "id")
    _is(doc.get("names", {}), dict, "names")
    if doc.get("base") is not None:
        _is(doc["base"], dict, "base")
    _check_extents(doc, _check_streams(doc, len(packs)), size)


def _check_streams(doc: dict, npacks: int) -> list[int]:
    """Check every stream and its chunks; the stream lengths."""
    lengths, blobs = [], {}
    for i, s in enumerate(_is(doc["streams"], list, "streams")):
        _is(s, dict, f"stream {i}")
        if s.get("kind") not in ("raw", "tensor"):
            raise _Bad(f"stream {i} has kind {s.get('kind')!r}")
        _is(s.get("dtype"), str, f"stream {i} dtype")
        if s.get("name") is not None:
            _is(s["name"], str, f"stream {i} name")
        length = 0
        for j, c in enumerate(_is(s.get("chunks"), list, f"stream {i} chunks")):
            length += _check_ref(c, npacks, f"stream {i} chunk {j}", blobs)
        lengths.append(length)
    return lengths


def _check_extents(doc: dict, lengths: list[int], size: int) -> None:
    """Check that the extents map the whole file onto every stream byte, in order."""
    pos, cursor = 0, [0] * len(lengths)
    for i, e in enumerate(_is(doc["extents"], list, "extents")):
        if not isinstance(e, list) or len(e) != 4:
            raise _Bad(f"extent {i} is {e!r:.80}")
        foff = _int(e[0], f"extent {i} file offset")
        flen = _int(e[1], f"extent {i} length", 1)
        sidx = _int(e[2], f"extent {i} stream index", 0, len(lengths) - 1)
        soff = _int(e[3], f"extent {i} stream offset")
        if foff != pos:
            raise _Bad(f"extent {i} starts at {foff}, not where extent {i - 1} ends ({pos})")
        if soff != cursor[sidx]:
            raise _Bad(f"extent {i} maps stream {sidx} from {soff}, not from {cursor[sidx]} "
                       f"where its previous extent ends")
        if soff + flen > lengths[sidx]:
            raise _Bad(f"extent {i} runs past the end of stream {sidx} "
                       f"({soff + flen} > {lengths[sidx]} bytes of chunks)")
        pos += flen
        cursor[sidx] += flen
    if pos != size:
        raise _Bad(f"extents cover {pos} bytes of a {size}-byte file")
    for i, (got, want) in enumerate(zip(cursor, lengths)):
        if got != want:
            raise _Bad(f"stream {i} holds {want} bytes of chunks but extents use {got}")


def _check_ref(c, npacks: int, what: str, blobs: dict) -> int:
    """Check one chunk ref (and its base chain); returns its raw length.

    ``blobs`` maps each (pack, offset) seen so far to what its refs say of that blob: a
    blob is written once, so every ref to it must agree (the reader caches decoded
    chunks by that key, and a ref that were its own base would wait on itself)."""
    _is(c, dict, what)
    p = _int(c.get("p"), f"{what} pack index", 0, npacks - 1)
    o = _int(c.get("o"), f"{what} offset")
    n = _int(c.get("n"), f"{what} stored length", 1)
    raw = _int(c.get("r"), f"{what} raw length", 1)
    h = _int(c.get("h"), f"{what} checksum", 0, _MAX_CHECKSUM)
    depth, base_key = 0, None
    if "b" in c:
        depth = _int(c.get("d"), f"{what} delta depth", 1)
        base = _is(c["b"], dict, f"{what} base")
        base_raw = _check_ref(base, npacks, f"{what} base", blobs)
        # a delta's base is as long as it; a pair's half (fp32 on its bf16/fp16 copy)
        # or twice (the copy on its fp32 master)
        if base_raw != raw and (base_raw * 2 != raw or raw % 4) and \
                (raw * 2 != base_raw or raw % 2):
            raise _Bad(f"{what} has a delta base of another length")
        if base.get("d", 0) != depth - 1:
            raise _Bad(f"{what} has depth {depth} over a base of depth {base.get('d', 0)}")
        base_key = (base["p"], base["o"])
    elif "d" in c:
        raise _Bad(f"{what} has a delta depth but no base")
    blob = (n, raw, h, depth, base_key)
    if blobs.setdefault((p, o), blob) != blob:
        raise _Bad(f"{what} and another chunk ref disagree about the blob at pack {p} "
                   f"offset {o}")
    return raw
