"""Backward deltas: the newest checkpoint whole, the ones before it as XOR deltas on it.

A resume reads the newest checkpoint, so that one is stored whole (its chunks coded on
their own, or shared with the version before where they did not change) and a fresh
node restores it as fast as a file saved with deltas off. Once it is committed, the
version it was compared with (its base, the previous checkpoint) is **re-expressed**
in the background: each of its chunks that changed is coded as the byte-XOR against
the newer version's chunk — XOR is symmetric, so this is the same delta a forward chain
would have stored — and kept where that is at most ``delta_min_gain`` of the whole blob
it replaces. The previous version then costs what changed; the newest costs what it
always did.

The steps, each leaving every version readable (a crash, a failed upload or a refused
write at any step loses nothing: the blobs a version stops using are only left to the
garbage collector once the manifest that no longer needs them is durable):

1. the new delta blobs are uploaded (packs, durable);
2. the previous version's manifest is rewritten with its chunks pointing at them —
   same bytes, same version id — with :meth:`Store.replace`, which writes only while
   the manifest is still the one read (a newer commit of that path is never undone);
3. the older versions whose chains ran through the previous version's whole blobs
   (found by following each manifest's ``base`` to the version before it) are
   rewritten the same way, their deltas now on the previous version's new chunks: a
   delta is relative to its base's bytes, not to how they are stored.

Chains are bounded: a version is read through at most ``max_delta_depth`` deltas
(``IngestConfig``, K = 4 by default). When re-expressing the previous version would take
one of the older versions past K, the previous version stays whole instead: it becomes
the root the older ones keep, and the next checkpoints start a new chain.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import threading
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable, Protocol

from s4fs import keys
from s4fs.coding import (BaseFile, base_from_file, base_streams, code_again,
                         lower_priority)
from s4fs.errors import NotFound, S4Error
from s4fs.manifest import ChunkRef, Manifest, Stream
from s4fs.write.ingest import PackWriter

if TYPE_CHECKING:
    from s4fs.coding import IngestConfig, Pools
    from s4fs.chunks import ChunkSource
    from s4fs.read import DecodedCache
    from s4fs.stores import Store

log = logging.getLogger(__name__)

#: the key of ``Manifest.base`` naming the newer version this one is stored against
NEWER = "newer"


class RewritePort(Protocol):
    """What a re-expression reads and tells (s4fs.fs.Filesystem is the implementation)."""

    store: "Store"
    source: "ChunkSource"             # a chunk's verified bytes, decoded from the store
    decoded: "DecodedCache | None"    # a version's decoded copy, read instead
    pools: "Pools"                    # the owner's threads upload the new packs

    def rewritten(self, path: str, m: Manifest, data: bytes | None = None) -> None:
        """``path``'s manifest is now ``m``, stored as ``data`` (same file bytes, its
        chunks stored otherwise)."""


@dataclass
class Outcome:
    """What one re-expression did (also what ``bench/delta.py`` reports)."""
    path: str                         # the version re-expressed
    why: str = ""                     # when it was left as it was: why
    deltas: int = 0                   # its chunks now deltas on the newer version
    shared: int = 0                   # its chunks now the newer version's own blobs
    uploaded: int = 0                 # bytes of new delta blobs
    freed: int = 0                    # bytes of whole blobs the deltas replace
    moved: int = 0                    # bytes of blobs still in use moved out of packs
                                      # the deltas free (the collector frees whole packs)
    repointed: list[str] = field(default_factory=list)    # older versions rewritten

    @property
    def done(self) -> bool:
        return not self.why


def reexpress(fs: RewritePort, cfg: "IngestConfig", new_path: str, new: Manifest) -> Outcome:
    """Re-express the version ``new`` (just committed at ``new_path``) was compared
    with as deltas on ``new``, then the older versions chained to it (module docstring).
    Never raises for a version that cannot be done (it is left as it is: ``why``);
    store errors do raise (the caller logs them; nothing was changed but new packs)."""
    out = Outcome((new.base or {}).get("path") or "")
    found = _previous(fs.store, new_path, new, out)
    if found is None:
        return out
    old_bytes, old = found
    mine = _whole_blobs(old)
    older = _chained(fs.store, out.path, old, set(mine))
    deepest = max((_depth_through(m, set(mine)) for _, _, m in older), default=1)
    if deepest > cfg.max_delta_depth:
        out.why = (f"an older version would be read through {deepest} deltas "
                   f"(max_delta_depth {cfg.max_delta_depth}): kept whole, as their root")
        return out
    # the newest version, when it shares blobs of the previous one's packs
    newest = _current(fs.store, new_path, new)
    others = [m for _, _, m in older] + ([newest[1]] if newest else [])
    mapping = _upload_deltas(fs, cfg, old, new, mine, others, out)
    if mapping is None or not _replace_previous(fs, new_path, new, old_bytes, old,
                                                 mapping, out):
        return out
    later = [(new_path, *newest)] if newest and _uses(newest[1], mapping) else []
    _repoint(fs, later + older, mapping, out)
    return out


def _previous(store: "Store", new_path: str, new: Manifest, out: Outcome):
    """(manifest bytes, manifest) of the version ``new`` was compared with, while it is
    still the one recorded and not yet stored against a newer version; else None, with
    ``out.why`` saying why."""
    info = new.base or {}
    old_path, old_id = info.get("path"), info.get("id")
    if not old_path or old_path == new_path:
        out.why = "no previous version in another file"
        return None
    try:
        old_bytes = store.get(keys.file_key(old_path))
    except NotFound:
        out.why = "the previous version is gone"
        return None
    old = Manifest.from_bytes(old_bytes, where=f"manifest of {old_path!r}")
    if old.id != old_id:
        out.why = "the previous version was replaced meanwhile"
        return None
    if NEWER in (old.base or {}):
        out.why = "already stored against a newer version"
        return None
    return old_bytes, old


def _upload_deltas(fs: RewritePort, cfg: "IngestConfig", old: Manifest, new: Manifest,
                   mine: dict, others: list, out: Outcome) -> "_Mapping | None":
    """Step 1: the deltas (and the blobs moved out of compacted packs) coded by
    ``_by_pack`` and uploaded, durable; what replaces what, with the packs written.
    None (``out.why`` says why) when no pack pays; nothing is left uploaded on an
    error."""
    packs = PackWriter(fs.store, cfg, uploads=1, pools=fs.pools)
    try:
        mapping = _by_pack(fs, cfg, old, new, mine, others, packs, out)
        if not mapping.refs:
            packs.abandon()
            out.why = "no pack of it is smaller with its chunks as deltas"
            return None
        packs.finish()
    except BaseException:
        packs.abandon()
        raise
    mapping.packs = list(packs.keys)
    return mapping


def _replace_previous(fs: RewritePort, new_path: str, new: Manifest, old_bytes: bytes,
                      old: Manifest, mapping: "_Mapping", out: Outcome) -> bool:
    """Step 2: the previous version's manifest rewritten onto ``mapping``, stored against
    ``new`` — only while the store still holds ``old_bytes`` (False, ``out`` cleared
    and saying why, when it changed meanwhile)."""
    fresh = _rewrite(old, mapping)
    fresh.base = {**(old.base or {}), NEWER: {"path": new_path, "id": new.id}}
    used = {c.pack for s in fresh.streams for c in s.chunks}
    fresh.own_packs = [p for p in old.own_packs if p in used] + \
        [p for p in mapping.packs if p in used]
    data = fresh.to_bytes()
    if not fs.store.replace(keys.file_key(out.path), data, old_bytes):
        out.why = "the previous version changed meanwhile"
        out.deltas = out.shared = out.moved = 0
        return False
    fs.rewritten(out.path, fresh, data)
    return True


def _repoint(fs: RewritePort, versions: list, mapping: "_Mapping", out: Outcome) -> None:
    """Step 3: the other versions that use replaced blobs — ``(path, manifest bytes,
    manifest)``, the newest first — rewritten onto ``mapping``, each only while
    unchanged; the first that changed stops it (it, and those before it, keep their
    blobs)."""
    for path, data, m in versions:
        again = _rewrite(m, mapping)
        again.base = m.base
        stored = again.to_bytes()
        if not fs.store.replace(keys.file_key(path), stored, data):
            break
        fs.rewritten(path, again, stored)
        out.repointed.append(path)


def _current(store: "Store", path: str, m: Manifest):
    """(manifest bytes, manifest) of ``path`` while it is still version ``m``, or None."""
    try:
        data = store.get(keys.file_key(path))
    except NotFound:
        return None
    now = Manifest.from_bytes(data, where=f"manifest of {path!r}")
    return (data, now) if now.id == m.id else None


def _uses(m: Manifest, mapping: "_Mapping") -> bool:
    """Whether ``m`` uses (in a chunk or a chain) a blob ``mapping`` replaces."""
    for s in m.streams:
        for c in s.chunks:
            r = c
            while r is not None:
                if r.key() in mapping.refs:
                    return True
                r = r.base
    return False


def likely_replaced(current: Callable[[str], "Manifest | None"],
                    base: Manifest | None) -> frozenset:
    """The chunks of ``base`` (keys) whose counterparts in the version saved after it
    will likely be replaced by deltas once a newer one comes: those the version before
    ``base`` was re-expressed on (its deltas' own bases) — the tensors whose deltas paid
    last time. The new version packs them apart, so that their packs die whole rather
    than being compacted (``_by_pack``). Empty when that is not known. ``current``:
    the committed manifest of a path, read fresh (None: no file)."""
    info = (base.base or {}) if base is not None else {}
    if not info.get("path") or not info.get("id"):
        return frozenset()
    try:
        before = current(info["path"])
    except (S4Error, OSError):
        return frozenset()
    if before is None or before.id != info["id"] or ((before.base or {}).get(NEWER) or {}).get("id") != base.id:
        return frozenset()
    return frozenset(c.base.key() for s in before.streams for c in s.chunks
                     if c.base is not None)


@dataclass
class _Mapping:
    """The previous version's whole blobs (by key) and what replaces each."""
    refs: dict = field(default_factory=dict)         # blob key -> new ChunkRef
    packs: list[str] = field(default_factory=list)   # packs the new deltas went to

    def __bool__(self) -> bool:
        return bool(self.refs)


def _whole_blobs(m: Manifest) -> dict:
    """The whole blobs a version wrote itself, by key: what re-expressing it may free."""
    own = set(m.own_packs)
    return {c.key(): c for s in m.streams for c in s.chunks
            if c.base is None and c.pack in own}


def _chained(store: "Store", path: str, m: Manifest, blobs: set) -> list:
    """The older versions whose chunks (or chains) use ``blobs``: ``m``'s base, its base,
    ... — ``(path, manifest bytes, manifest)``, newest first — while each is still the
    version its successor recorded, and uses them."""
    out, seen, info = [], {path}, m.base or {}
    while info.get("path") and info["path"] not in seen:
        p = info["path"]
        seen.add(p)
        try:
            data = store.get(keys.file_key(p))
        except NotFound:
            break
        older = Manifest.from_bytes(data, where=f"manifest of {p!r}")
        if older.id != info.get("id") or not _depth_through(older, blobs):
            break
        out.append((p, data, older))
        info = older.base or {}
    return out


def _depth_through(m: Manifest, blobs: set) -> int:
    """The depth the deepest chunk of ``m`` whose chain ends in one of ``blobs`` would
    have once those blobs are deltas themselves (its depth + 1); 0 when none does."""
    deepest = 0
    for s in m.streams:
        for c in s.chunks:
            r = c
            while r.base is not None:
                r = r.base
            if r.key() in blobs:
                deepest = max(deepest, c.hops + 1)
    return deepest


#: a pack of the previous version is rewritten — its chunks that pay as deltas replaced,
#: the blobs still in use moved out, the pack left to the collector — when the bytes it
#: saves are at least this share of the bytes it moves: at most 4 bytes uploaded again
#: per byte saved. A pack whose savings are smaller is left exactly as it was (replacing
#: its chunks without freeing it would only add the deltas' bytes).
COMPACT_RATIO = 0.25


def _by_pack(fs: RewritePort, cfg: "IngestConfig", old: Manifest, new: Manifest,
             mine: dict, others: list, packs: PackWriter, out: Outcome) -> _Mapping:
    """Pack by pack of ``old``'s own packs: code each of its whole blobs that has a
    counterpart in ``new`` (same record, dtype and size) as a delta on it (the chunk
    rule's ``code_again``), then rewrite the pack when that pays in the bucket — the
    collector frees packs, not blobs, so a pack is only worth touching when it can be
    freed whole: its deltas and the blobs still in use elsewhere (``old``'s chunks that
    stay whole, ``others``: the newest version's shared chunks, the older versions'
    chains) go to ``packs``, and the bytes saved must be at least COMPACT_RATIO of the
    bytes moved. One pack's deltas are held at a time."""
    pairs = _pairs(old, new, mine)
    mapping = _Mapping()
    if not pairs:
        return mapping
    blobs = _in_use_by_pack(old, others)
    files = _copy(fs, old), _copy(fs, new)
    try:
        for pack in old.own_packs:
            inside = blobs.get(pack, {})
            coded = _code_pack(fs, cfg, inside, pairs, files)
            saved = sum(inside[k].stored - len(blob) for k, blob in coded.items())
            keep = sorted((r for k, r in inside.items() if k not in coded),
                          key=lambda r: r.offset)
            if saved <= 0 or saved < COMPACT_RATIO * sum(r.stored for r in keep):
                continue                   # left as it was
            _place_deltas(coded, inside, pairs, packs, mapping, out)
            _move_kept(fs.store, pack, keep, packs, mapping, out)
    finally:
        for f in files:
            if f[0] is not None:
                os.close(f[0])
    return mapping


def _pairs(old: Manifest, new: Manifest, mine: dict) -> dict:
    """The whole blobs of ``old`` (keys of ``mine``) that a delta on ``new`` may replace:
    old blob key -> (its stream, chunk index, ``new``'s stream, ``new``'s chunk) for
    each chunk of a tensor record ``new`` also has (same name, dtype and length, as many
    chunks), where ``new``'s chunk is whole, of the same raw size and another blob."""
    theirs = base_streams(new)
    pairs: dict = {}
    for s in old.streams:
        t = theirs.get((s.name, s.dtype, s.length)) if s.kind == "tensor" else None
        if t is None or len(t.chunks) != len(s.chunks):
            continue
        for i, (a, b) in enumerate(zip(s.chunks, t.chunks)):
            if a.key() in mine and a.key() != b.key() and b.base is None and a.raw == b.raw:
                pairs[a.key()] = (s, i, t, b)
    return pairs


def _in_use_by_pack(old: Manifest, others: list) -> dict:
    """Every blob of ``old``'s own packs that ``old`` or ``others`` use (as a chunk or a
    link of a chain): pack key -> {blob key: ChunkRef}."""
    own = set(old.own_packs)
    blobs: dict = {}
    for m in [old, *others]:
        for s in m.streams:
            for c in s.chunks:
                r = c
                while r is not None:
                    if r.pack in own:
                        blobs.setdefault(r.pack, {})[r.key()] = r
                    r = r.base
    return blobs


def _code_pack(fs: RewritePort, cfg: "IngestConfig", inside: dict, pairs: dict,
               files: tuple) -> dict:
    """The delta blobs of one pack's paired blobs (``inside``: its blobs in use), by
    key: ``b""`` where the two chunks are the same bytes; left out where the delta does
    not pay. ``files``: the decoded copies of the old and the new version (``_copy``)."""
    old_file, new_file = files
    coded = {}
    for k, ref in inside.items():
        if k in pairs:
            s, i, t, b = pairs[k]
            got = _one(fs, cfg, s.dtype, (old_file, s, i, ref), (new_file, t, i, b))
            if got is not None:
                coded[k] = got
    return coded


def _place_deltas(coded: dict, inside: dict, pairs: dict, packs: PackWriter,
                  mapping: _Mapping, out: Outcome) -> None:
    """A compacted pack's deltas into ``packs``, each replacing its whole blob in
    ``mapping``; a chunk equal to its counterpart becomes the counterpart's own blob."""
    for k, blob in coded.items():
        a, b = inside[k], pairs[k][3]
        if blob == b"":
            mapping.refs[k] = b
            out.shared += 1
            continue
        p, off = packs.add(blob)
        mapping.refs[k] = ChunkRef(p, off, len(blob), a.raw, a.checksum, 1, b)
        out.deltas += 1
        out.uploaded += len(blob)
        out.freed += a.stored


def _move_kept(store: "Store", pack: str, keep: list, packs: PackWriter,
               mapping: _Mapping, out: Outcome) -> None:
    """The blobs of a compacted pack still in use (``keep``, by offset) copied into
    ``packs`` with one ranged read, so that the old pack is left to the collector."""
    if not keep:
        return
    lo, hi = keep[0].offset, keep[-1].offset + keep[-1].stored
    data = store.get(pack, lo, hi)
    for r in keep:
        p, off = packs.add(data[r.offset - lo: r.offset - lo + r.stored])
        # the same blob elsewhere: same bytes, same checksum, same base
        mapping.refs[r.key()] = dataclasses.replace(r, pack=p, offset=off)
        out.moved += r.stored


def _copy(fs: RewritePort, m: Manifest):
    """(descriptor, BaseFile) of ``m``'s decoded copy on local disk, or (None, None)."""
    path = fs.decoded.path_of(m.id) if fs.decoded is not None else None
    if path is None:
        return None, None
    try:
        return os.open(path, os.O_RDONLY | os.O_CLOEXEC), BaseFile(m, path)
    except OSError:
        return None, None


def _bytes(fs: RewritePort, where) -> bytes:
    """The verified raw bytes of one chunk: from its version's decoded copy when it holds
    them intact, else decoded from the store."""
    (fd, located), stream, i, ref = where
    if fd is not None:
        data = base_from_file(fd, located.range_of(stream, i), ref)
        if data is not None:
            return data
    return fs.source.get(ref)


def _one(fs: RewritePort, cfg: "IngestConfig", dtype: str, old, new) -> bytes | None:
    """The delta blob of one chunk of the previous version on its newer counterpart;
    ``b""`` when the two are the same bytes; None when the delta does not pay."""
    a, b = old[3], new[3]
    return code_again(_bytes(fs, old), dtype, a.checksum, _bytes(fs, new), b.checksum,
                      a.stored, cfg)


def _rewrite(m: Manifest, mapping: _Mapping) -> Manifest:
    """``m`` with every use of a replaced blob (a chunk, or a link of a chain) pointing
    at what replaces it: the same bytes, stored otherwise."""
    memo: dict = {}

    def repoint(ref: ChunkRef) -> ChunkRef:
        k = ref.key()
        if k not in memo:
            now = mapping.refs.get(k, ref)      # moved or replaced, or as it was
            base = repoint(now.base) if now.base is not None else None
            memo[k] = now if base is now.base else dataclasses.replace(
                now, depth=base.depth + 1, base=base)
        return memo[k]

    streams = [Stream(s.kind, s.dtype, s.name, [repoint(c) for c in s.chunks])
               for s in m.streams]
    return dataclasses.replace(m, streams=streams, _ext_starts=None)


class Rewriter:
    """The filesystem's one background thread of re-expressions, in commit order, at
    the coding workers' low priority (``IngestConfig.nice``): a save never waits for it.
    ``settle`` waits for what was queued (tests, benchmarks, ``close``)."""

    def __init__(self, fs: RewritePort, cfg: "IngestConfig") -> None:
        self._fs, self._cfg = fs, cfg
        self._cond = threading.Condition()
        self._queue: list[tuple[str, Manifest]] = []
        self._busy = False
        self._stop = False
        self._thread: threading.Thread | None = None
        self.outcomes: list[Outcome] = []          # the latest ones, for status and bench

    def submit(self, path: str, m: Manifest) -> None:
        with self._cond:
            if self._stop:
                return
            self._queue.append((path, m))
            if self._thread is None:
                self._thread = threading.Thread(target=self._loop, daemon=True,
                                                name="s4fs-backward-deltas")
                self._thread.start()
            self._cond.notify_all()

    def settle(self, timeout: float | None = None) -> bool:
        """Wait until nothing is queued or running (True), at most ``timeout`` s."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._cond:
            while self._queue or self._busy:
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    return False
                self._cond.wait(left)
            return True

    def close(self, timeout: float) -> None:
        """Finish what is queued, for at most ``timeout`` s; what is left then stays as
        it is (whole: readable, only larger)."""
        self.settle(timeout)
        with self._cond:
            self._stop = True
            dropped, self._queue = self._queue, []
            self._cond.notify_all()
        if dropped:
            log.info("unmounting: %d previous version(s) stay whole (not re-expressed as "
                     "deltas on their successors in time)", len(dropped))
        if self._thread is not None:
            self._thread.join(timeout=max(1.0, timeout))

    def _loop(self) -> None:
        lower_priority(self._cfg.nice)
        while True:
            with self._cond:
                while not self._queue and not self._stop:
                    self._cond.wait()
                if self._stop:
                    return
                path, m = self._queue.pop(0)
                self._busy = True
            try:
                self._one(path, m)
            finally:
                with self._cond:
                    self._busy = False
                    self._cond.notify_all()

    def _one(self, path: str, m: Manifest) -> None:
        started = time.monotonic()
        try:
            out = reexpress(self._fs, self._cfg, path, m)
        except (S4Error, OSError) as exc:
            log.warning("could not store the version before %s as deltas on it (%s); it "
                        "stays whole. Where its bytes are damaged, `s4fs verify` on its "
                        "folder lists every damaged file", path, exc)
            return
        except Exception:
            log.exception("internal error re-expressing the version before %s; it stays "
                          "whole (please report this)", path)
            return
        self.outcomes = (self.outcomes + [out])[-16:]
        if out.done:
            log.info("%s: stored as deltas on %s (%d deltas, %d shared chunks, %d bytes "
                     "uploaded, %d freed, %d moved out of packs left mostly dead; %d other "
                     "versions repointed) in %.2f s",
                     out.path, path, out.deltas, out.shared, out.uploaded, out.freed, out.moved,
                     len(out.repointed), time.monotonic() - started)
        else:
            log.debug("%s stays as it is: %s", out.path or "(none)", out.why)
