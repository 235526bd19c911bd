"""Delta bases: which chunk of the base version a new chunk is coded against, where its
raw bytes come from (the base version's decoded copy on local disk when it holds them
intact, else the store through a ``ChunkSource``), and what happens when they cannot be
had: a damaged base never stops a save (its chunks are coded in full, warned about once).
Which version is the base is the write room's choice (``s4fs.write.bases``)."""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor

from s4fs import codec
from s4fs.errors import NotFound, S4Error
from s4fs.manifest import ChunkRef, Manifest, Stream

_log = logging.getLogger(__name__)


def base_streams(base: Manifest | None) -> dict:
    """The base version's tensor streams by (record name, dtype, length): a new
    tensor's chunks are coded against those of the stream with its key."""
    if base is None:
        return {}
    return {(s.name, s.dtype, s.length): s for s in base.streams
            if s.kind == "tensor" and s.name is not None}


def base_chunk(base: Stream | None, idx: int) -> ChunkRef | None:
    """Chunk ``idx`` of a base stream (one of :func:`base_streams`), if it has one."""
    if base is not None and idx < len(base.chunks):
        return base.chunks[idx]
    return None


class BaseFile:
    """Where the chunks of the base version lie in its decoded copy on local disk (the
    file a delta's base bytes are read from, instead of decoding them again)."""

    def __init__(self, base: Manifest | None, path: str | None) -> None:
        self.path = path if base is not None else None
        self._ext: dict[int, list[tuple[int, int, int]]] = {}
        self._idx: dict[int, int] = {}
        if self.path is not None:
            for foff, n, sidx, soff in base.extents:
                self._ext.setdefault(sidx, []).append((soff, foff, n))
            self._idx = {id(st): i for i, st in enumerate(base.streams)}

    def range_of(self, stream: Stream | None, idx: int) -> tuple[int, int] | None:
        """(file offset, length) of chunk ``idx`` of base ``stream``, if in one extent."""
        if not self._ext or stream is None:
            return None
        sidx = self._idx.get(id(stream))
        soff = stream.starts()[idx]
        n = stream.chunks[idx].raw
        for es, fo, en in self._ext.get(sidx, ()):
            if es <= soff and soff + n <= es + en:
                return (fo + soff - es, n)
        return None


def base_bytes(fd: int | None, where: tuple[int, int] | None, base: ChunkRef,
               source) -> bytes:
    """The verified raw bytes of chunk ``base``: from the base version's decoded copy
    (:func:`base_from_file`) when it holds them intact, else from ``source`` (a
    ChunkSource: the store, decoded and checked)."""
    data = base_from_file(fd, where, base)
    return data if data is not None else source.get(base)


def base_from_file(fd: int | None, where: tuple[int, int] | None,
                   base: ChunkRef) -> bytes | None:
    """The raw bytes of chunk ``base`` read at ``where`` (offset, length) in the base
    version's decoded copy open at ``fd``, or None when that copy cannot give them intact
    (no copy, short read, an error, or bytes that fail the manifest's checksum)."""
    if fd is None or where is None:
        return None
    off, n = where
    parts, got = [], 0
    try:
        while got < n:
            more = os.pread(fd, n - got, off + got)
            if not more:
                return None
            parts.append(more)
            got += len(more)
    except OSError:
        return None
    data = parts[0] if len(parts) == 1 else b"".join(parts)
    if len(data) != base.raw or codec.checksum(data) != base.checksum:
        return None
    return data


PACKS_SEEN_TTL = 600.0      # seconds a pack seen whole in the store is not looked at again
# Process-wide: what this process saw of a store's packs holds for every owner in it (a
# daemon's runtime and the API's write the same store), keyed by the store's URL.
_seen: dict = {}            # (store url, pack key) -> (size, monotonic time seen)


def saw_pack(store, key: str, size: int) -> None:
    """A pack this process has just written whole (no HEAD needed to use it as a base)."""
    if len(_seen) > 65536:
        _seen.clear()
    _seen[store.url, key] = (size, time.monotonic())


def missing_packs(store, m: Manifest) -> str | None:
    """None when every pack ``m``'s chunks (their delta chains too) need is in the store
    and long enough; else what is wrong. A new file coded against ``m`` would need those
    packs: its chunks may be ``m``'s own, or deltas on them, and the base's bytes may come
    from a local decoded copy that outlived its packs (deleted by hand or by a lifecycle
    rule). One HEAD per pack, remembered for PACKS_SEEN_TTL."""
    need = m.pack_ends()
    url, now = store.url, time.monotonic()

    def seen_whole(key) -> bool:
        size, when = _seen.get((url, key), (-1, 0.0))
        return size >= need[key] and now - when < PACKS_SEEN_TTL

    todo = [k for k in need if not seen_whole(k)]

    def probe(key):
        try:
            return key, store.head(key).size, None
        except NotFound:
            return key, -1, None
        except (S4Error, OSError) as exc:
            return key, -1, exc

    if todo:
        with ThreadPoolExecutor(min(16, len(todo)), thread_name_prefix="s4fs-base-packs") as ex:
            for key, size, exc in ex.map(probe, todo):
                if exc is not None:
                    return f"its pack {key} could not be looked at: {type(exc).__name__}: {exc}"
                if size < need[key]:
                    return (f"its pack {key} is missing from the store" if size < 0 else
                            f"its pack {key} is shorter ({size} bytes) than its chunks need")
                saw_pack(store, key, size)
    return None


# --------------------------------------------------------------------------- damaged bases

# Process-wide, as the log they dedupe is: a damaged base is warned about once per
# process. The notes are per thread: a worker's batch hands them to its parent.
_unreadable: set = set()          # delta bases already warned about
_notes = threading.local()        # a worker's notes for its parent (collecting_notes)


def readable_base(base_bytes, what: str, key: str | None = None):
    """``base_bytes()``, or None when the base (``what``: a chunk's pack, a file whose
    chunks a batch decodes) cannot be had: a pack missing or damaged, planes needing a
    GPU this process lacks, the store failing. What would have been coded against it is
    then coded in full, and :func:`note_unreadable_base` warns (once per ``key``). A
    damaged old checkpoint must not stop the next one from being saved; the old one
    still fails its own reads (never wrong bytes)."""
    try:
        return base_bytes()
    except (S4Error, OSError) as exc:
        note_unreadable_base(what, f"{type(exc).__name__}: {exc}", key=key)
        return None


def note_unreadable_base(what: str, why: str, key: str | None = None) -> None:
    """Warn, once per ``key`` (default: ``what``), that a delta base could not be read;
    inside :func:`collecting_notes` (a worker process), keep the note for the parent."""
    notes = getattr(_notes, "list", None)
    if notes is not None:
        notes.append((what, why))
        return
    key = what if key is None else key
    if key in _unreadable:
        return
    if len(_unreadable) > 4096:
        _unreadable.clear()
    _unreadable.add(key)
    _log.warning(
        "a delta base could not be read (%s: %s); the new file's chunks that would be "
        "coded against it are stored in full instead. The older checkpoint it belongs to "
        "may be damaged: run `s4fs verify` on its folder", what, why)


@contextlib.contextmanager
def collecting_notes():
    """The notes :func:`note_unreadable_base` takes on this thread meanwhile, as a list
    of ``(what, why)`` (a worker process returns them with its result)."""
    _notes.list = []
    try:
        yield _notes.list
    finally:
        _notes.list = None
