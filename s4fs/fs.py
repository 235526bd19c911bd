"""The core filesystem: a POSIX-like namespace of files kept in a store.

Knows nothing about FUSE (``s4fs.mount`` translates FUSE operations into these calls, and
the Python API uses them directly). Paths are ``"a/b/c"`` strings relative to the store
root (``""`` is the root). Every method is thread-safe and blocking.

Writes go through :class:`s4fs.write.WriteHandle` (spool first, ingest behind the
writes, commit at close; see that module for the states and when a file is committed);
this module keeps the namespace: which paths exist, their manifests, and the handles open
on them. ``commit`` writes a manifest — the one atomic step of a save — and only then does
the file exist for other mounts. See docs/SEMANTICS.md.

Locking: ``Filesystem._lock`` guards the maps below and is held only for short, local
work; it is never held while calling into a handle or the store.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import shutil
import stat as st
import tempfile
import threading
import time
from dataclasses import dataclass, field

from s4fs import keys, sealed
from s4fs.coding import IngestConfig, placement
from s4fs.errors import (AlreadyExists, Busy, DirectoryNotEmpty,
                         InvalidArgument, IsADirectory, NotADirectory, NotFound, S4Error)
from s4fs.manifest import Manifest, seconds_to_ns
from s4fs.read import (ChunkSource, DecodedCache, FileNode, FileReader, Fills, NodeReader,
                       PackCache, ReadHandle)
from s4fs.read.fetch import THREADS as FETCH_THREADS
from s4fs.runtime import Runtime, current as current_runtime
from s4fs.stores import LocalStore, Store
from s4fs.write import (Committer, IngestSession, Journal, Rewriter, RoomKeeper, State,
                        WriteHandle, candidates, new_session)

__all__ = ["Attr", "Filesystem", "FsConfig", "NodeReader", "ReadHandle", "State",
           "WriteHandle"]

log = logging.getLogger("s4fs.fs")

STORE_FORMAT = {"format": "s4fs-store", "version": 1}


@dataclass(frozen=True)
class FsConfig:
    ingest: IngestConfig = field(default_factory=IngestConfig)
    cache_dir: str | None = None       # spool files and the pack cache; a temp dir if None
    cache_bytes: int = 256 << 20       # decoded-chunk LRU
    metadata_ttl: float = 1.0          # how long a cached manifest/listing is trusted
    delta: bool = True                 # store checkpoints as deltas of the previous one
    # "backward": the newest checkpoint whole, the one before re-expressed as deltas on it
    # in the background (s4fs.write.backward); "forward": each new checkpoint a delta on
    # the one before, within IngestConfig.max_chain_read (docs/DELTA.md)
    delta_direction: str = "backward"
    pack_cache_bytes: int | None = 8 << 30  # local copies of the newest packs (remote
                                       # stores): at most this, and never more than half
                                       # the cache disk's room; None: auto; 0: off
    pack_cache_dir: str | None = None  # where those live; <cache_dir>/packs if None
    # close() returns once the spool holds every byte; commits run in the background,
    # journalled and replayed after a crash (s4fs.write)
    writeback: bool = False
    # writeback under FUSE passthrough: code a file only once close() accepted it (False:
    # nothing runs beside the save itself) or while the kernel writes it (True: the
    # coding shares the machine with the save). Measured in the H200 training loop
    # (docs/BENCHMARKS.md): after close blocked 0.88x local disk, while written 1.05x,
    # with the same drain (the coding fits in the gap between checkpoints)
    code_while_written: bool = False
    # whole committed files kept for reads (s4fs.read.decoded); None: a quarter of the
    # cache disk's free space, at most 64 GiB; 0: off
    decoded_cache_bytes: int | None = None
    close_sync_seconds: float = 30.0   # writeback: how long unmount waits for commits


@dataclass
class Attr:
    path: str
    is_dir: bool
    size: int
    mode: int
    mtime: float                   # seconds; ``mtime_ns`` is exact where known
    stored: int = 0
    mtime_ns: int | None = None
    atime_ns: int | None = None    # set explicitly (utime); None: the mtime (noatime)
    ctime_ns: int | None = None    # last change of content or attributes; None: the mtime

    @property
    def name(self) -> str:
        return keys.basename(self.path)

    def times_ns(self) -> tuple[int, int, int]:
        """(atime, mtime, ctime) in nanoseconds, each falling back to the mtime."""
        mtime = self.mtime_ns if self.mtime_ns is not None else seconds_to_ns(self.mtime)
        return (mtime if self.atime_ns is None else self.atime_ns, mtime,
                mtime if self.ctime_ns is None else self.ctime_ns)


class Filesystem:
    """``runtime``: the worker processes and threads it uses (s4fs.runtime); the caller's
    to close. None: the process's shared one, ``runtime.current()``."""

    def __init__(self, store: Store, cfg: FsConfig | None = None,
                 runtime: Runtime | None = None) -> None:
        self.store = store
        self.cfg = cfg or FsConfig()
        self.runtime = runtime or current_runtime()
        self.pools = self.runtime.pools
        self._check_root()      # first: a store this s4fs cannot use leaves nothing behind
        self._own_cache = self.cfg.cache_dir is None
        if self._own_cache:
            _sweep_stale_temp_caches()
        # absolute: the writeback journal records spool paths that must survive a restart
        self.cache_dir = os.path.abspath(self.cfg.cache_dir or
                                         tempfile.mkdtemp(prefix=TEMP_CACHE_PREFIX))
        in_memory = memory_filesystem(self.cache_dir)
        if in_memory and self.cfg.writeback:
            if self._own_cache:
                shutil.rmtree(self.cache_dir, ignore_errors=True)
            raise InvalidArgument(
                f"--writeback keeps every file that close() accepted on local disk until "
                f"the store takes it, and the cache dir {self.cache_dir} is on {in_memory} "
                f"(memory): a crash or reboot of the machine would lose them. Give "
                f"--cache-dir a folder on a disk, or mount without --writeback (the default "
                f"mode is durable in the store at close(), and may keep its cache in memory)")
        if in_memory:
            log.info("cache dir %s is on %s: spools and local copies stay in memory (no "
                     "disk writes for them), up to --cache-size", self.cache_dir, in_memory)
        self._cache_lock = _lock_cache_dir(self.cache_dir)
        self.spool_dir = os.path.join(self.cache_dir, "spool")
        os.makedirs(self.spool_dir, exist_ok=True)
        self.room = RoomKeeper(self.spool_dir, self.make_room)
        self.pack_cache = None
        if self.cfg.pack_cache_bytes != 0 and not isinstance(store, LocalStore):
            self.pack_cache = PackCache(
                self.cfg.pack_cache_dir or os.path.join(self.cache_dir, "packs"),
                self.cfg.pack_cache_bytes)
        self.decoded = None
        if self.cfg.decoded_cache_bytes != 0:
            self.decoded = DecodedCache(os.path.join(self.cache_dir, "decoded"),
                                        self.cfg.decoded_cache_bytes)
        # decoding goes to the GPU only for planes that need it (nvCOMP ANS/GDeflate);
        # on a mount whose pipeline is the GPU worker process, there (the daemon itself
        # makes no CUDA context)
        ingest = self.cfg.ingest
        offload = None
        if placement(ingest).gpu_worker:
            pools = self.pools
            offload = lambda blob, base: pools.gpu(ingest.nice).decode_blob(blob, base)  # noqa: E731
        self.source = ChunkSource(store, cache_bytes=self.cfg.cache_bytes,
                                  device="auto", blob_cache=self.pack_cache, offload=offload,
                                  threads=self.runtime.thread(
                                      "s4fs-read", max(4, os.cpu_count() or 4)))
        # versions being decoded ahead, and where (the read room's policy)
        self.fills = Fills(store, self.decoded, ingest, self.source, self.pools,
                           self.runtime.cfg.gpu_fill_batch,
                           None if isinstance(store, LocalStore) else
                           self.runtime.thread("s4fs-fetch", FETCH_THREADS))
        self._lock = threading.RLock()
        self._manifests: dict[str, tuple[float, Manifest | None]] = {}
        self._gen = 0                       # bumped by every change made on this mount
        self._writers: dict[str, WriteHandle] = {}
        self._known_dirs: set[str] = {""}
        self._truncated: dict[str, Manifest] = {}   # last version before a truncate to 0
        # the files of this mount by path (s4fs.read.node): what every descriptor of a file
        # reads, and what the kernel may keep cached of it
        self._nodes: dict[str, FileNode] = {}
        self._pinned: set[FileNode] = set()          # detached, still read, packs pinned
        # set by the FUSE adapter: drop the kernel's cached pages of a node, and its
        # name too when the file no longer exists: ``(node, gone)``, from any thread;
        # must not block on the kernel
        self.on_invalidate = None
        self.journal = Journal(os.path.join(self.cache_dir, "journal"))
        self.committer = Committer()
        self.rewriter = Rewriter(self, self.cfg.ingest) if self.backward else None
        self._replay()

    # --- store root ------------------------------------------------------------------

    def _check_root(self) -> None:
        from s4fs.errors import NotFound as _NF, UnsupportedVersionError
        try:
            data = self.store.get(keys.ROOT_MARKER)
        except _NF:
            # the root's times (and those of folders that record none): when it was made
            self._root_ns = time.time_ns()
            self.store.put(keys.ROOT_MARKER,
                           sealed.store_marker({**STORE_FORMAT, "created_ns": self._root_ns}))
            return
        doc = sealed.read_store_marker(
            data, f"store marker (object {keys.ROOT_MARKER!r} in {self.store.url})")
        if doc["version"] > STORE_FORMAT["version"]:
            raise UnsupportedVersionError(
                f"{self.store.url} holds an s4fs store of version {doc.get('version')}; "
                f"this s4fs reads version {STORE_FORMAT['version']}: upgrade s4fs")
        created = doc.get("created_ns")
        # a store made before s4fs recorded it: the marker object's time (its one put)
        self._root_ns = created if type(created) is int else \
            seconds_to_ns(self.store.head(keys.ROOT_MARKER).mtime)

    def close(self) -> None:
        """Unmount: a writeback mount first waits (``close_sync_seconds``) for pending
        commits; what is still pending then stays journalled for the next start."""
        if self.cfg.writeback and self.committer.pending():
            self.committer.sync(timeout=self.cfg.close_sync_seconds)
        with self._lock:
            writers = list(self._writers.values())
        for w in writers:
            w.detach()
        with self._lock:
            pinned, self._pinned = list(self._pinned), set()
        for node in pinned:
            self._unpin(node.pin)
        self.committer.close()
        if self.rewriter is not None:
            self.rewriter.close(self.cfg.close_sync_seconds)
        self.room.close()
        self.source.close()
        os.close(self._cache_lock)
        if self._own_cache:
            shutil.rmtree(self.cache_dir, ignore_errors=True)

    # --- writeback: replay, status, sync ----------------------------------------------

    def _replay(self) -> None:
        """Files a writeback mount accepted before it stopped: shown again, committed in
        the background. Spool files nobody accepted (a crash mid-write) are removed."""
        keep = set()
        for e in self.journal.entries():
            if not os.path.exists(e.spool):
                log.error("journal entry for %r names a spool that is gone (%s); "
                          "dropping it", e.path, e.spool)
                self.journal.drop(e.spool)
                continue
            keep.add(os.path.abspath(e.spool))
            w = WriteHandle.recovered(self, e, self.manifest_or_none(e.path, fresh=True))
            with self._lock:
                old = self._writers.get(e.path)
            if old is not None:
                old.detach()
            with self._lock:
                self._writers[e.path] = w
                self._attach_writer(e.path, w)
            log.warning("replaying %r (%d bytes) accepted before the mount stopped",
                        e.path, e.size)
            self.committer.submit(w)
        for name in os.listdir(self.spool_dir):
            full = os.path.abspath(os.path.join(self.spool_dir, name))
            if full not in keep:
                try:
                    os.unlink(full)
                except OSError:
                    pass

    @staticmethod
    def _pending_info(w: WriteHandle, no_error: str | None) -> dict:
        return {"path": w.path, "bytes": w.size, "state": w.state.value,
                "attempts": w.attempts, "accepted": w.accepted_at,
                "error": str(w.last_error) if w.last_error else no_error}

    def pending(self) -> list[dict]:
        """Files accepted but not yet committed (writeback), oldest first."""
        return [self._pending_info(w, None) for w in self.committer.pending()]

    def sync(self, timeout: float | None = None) -> list[dict]:
        """Wait for every pending commit, then for the re-expressions of previous
        versions as deltas they queued (backward deltas); returns the files that could
        not be committed (each failed at least once during the wait), empty when all are
        in the store."""
        started = time.monotonic()
        failed = [self._pending_info(w, "still committing")
                  for w in self.committer.sync(timeout)]
        self.settle_deltas(None if timeout is None else
                           max(0.0, timeout - (time.monotonic() - started)))
        return failed

    def make_room(self, nbytes: int) -> bool:
        """The cache disk is full: the caches give space back (spools come first)."""
        freed = False
        if self.decoded is not None:
            freed = self.decoded.make_room(nbytes) or freed
        if self.pack_cache is not None:
            freed = bool(self.pack_cache.make_room(nbytes)) or freed
        return freed

    # --- manifests -------------------------------------------------------------------

    def manifest(self, path: str, *, fresh: bool = False) -> Manifest:
        """The committed manifest of ``path``; NotFound when there is none."""
        m = self.manifest_or_none(path, fresh=fresh)
        if m is None:
            raise NotFound(f"no file {path!r}")
        return m

    def manifest_or_none(self, path: str, *, fresh: bool = False) -> Manifest | None:
        """The committed manifest of ``path``, or None when there is none."""
        path = keys.norm(path)
        if not path:
            return None
        now = time.monotonic()
        with self._lock:
            hit = self._manifests.get(path)
            gen = self._gen
        if hit is not None and not fresh and now - hit[0] < self.cfg.metadata_ttl:
            return hit[1]
        try:
            data = self.store.get(keys.file_key(path))
            m = Manifest.from_bytes(data, where=f"manifest of {path!r} (object "
                                                  f"{keys.file_key(path)!r} in {self.store.url})")
        except NotFound:
            m = None
        with self._lock:
            # a commit/unlink/rename on this mount while we fetched knows better
            if self._gen == gen:
                self._manifests[path] = (now, m)
        return m

    def _remember(self, path: str, m: Manifest | None) -> None:
        with self._lock:
            self._gen += 1
            self._manifests[path] = (time.monotonic(), m)

    @property
    def backward(self) -> bool:
        """Whether deltas run backward (FsConfig.delta_direction)."""
        if self.cfg.delta_direction not in ("backward", "forward"):
            raise InvalidArgument(f"delta_direction is 'backward' or 'forward', not "
                                  f"{self.cfg.delta_direction!r}")
        return self.cfg.delta and self.cfg.delta_direction == "backward"

    @property
    def save_ingest(self) -> IngestConfig:
        """How a new version is coded: with backward deltas the newest is stored whole
        (its unchanged chunks shared with the version before); forward, as a delta on it
        within the chain read budget."""
        if self.backward:
            return dataclasses.replace(self.cfg.ingest, max_chain_read=1.0)
        return self.cfg.ingest

    def commit(self, path: str, m: Manifest, *, saved: bool = True) -> None:
        """Write ``m`` as the manifest of ``path`` (the one atomic step of a save).
        ``saved``: a new version (not a rename or a change of attributes): with backward
        deltas the version it was compared with is then re-expressed against it."""
        self._ensure_parents(path)
        self.store.put(keys.file_key(path), m.to_bytes())
        self._remember(path, m)
        with self._lock:
            node = self._nodes.get(path)
            if node is not None and (node.readers > 0 or node.writer is not None):
                node.version = m
                node.changed()
        if saved and self.rewriter is not None and m.base is not None:
            self.rewriter.submit(path, m)

    def rewritten(self, path: str, m: Manifest) -> None:
        """(RewritePort) ``path``'s manifest was rewritten as ``m``: the same version
        (same id, same bytes), its chunks stored otherwise."""
        with self._lock:
            hit = self._manifests.get(path)
            if hit is not None and hit[1] is not None and hit[1].id == m.id:
                self._manifests[path] = (hit[0], m)
            node = self._nodes.get(path)
            if node is not None and node.version is not None and node.version.id == m.id:
                node.version = m

    def settle_deltas(self, timeout: float | None = None) -> bool:
        """Wait until the background re-expressions queued so far are done (True)."""
        return self.rewriter.settle(timeout) if self.rewriter is not None else True

    def _ensure_parents(self, path: str) -> None:
        p = keys.parent(path)
        missing = []
        while p and p not in self._known_dirs:
            missing.append(p)
            p = keys.parent(p)
        for d in reversed(missing):
            if not self._has_dir_marker(d):
                if self.manifest_or_none(d) is not None:
                    raise NotADirectory(f"{d!r} is a file, not a directory")
                self.store.put(keys.dir_key(d), sealed.dir_marker(mtime_ns=time.time_ns()))
            self._known_dirs.add(d)

    # --- namespace -------------------------------------------------------------------

    def stat(self, path: str) -> Attr:
        path = keys.norm(path)
        with self._lock:
            w = self._writers.get(path)
        if w is not None:
            return _writer_attr(path, w)
        if path == "":
            return Attr("", True, 0, st.S_IFDIR | 0o755, self._root_ns / 1e9, 0,
                        self._root_ns)
        m = self.manifest_or_none(path)
        if m is not None:
            return _version_attr(path, m)
        # a folder: the times its marker records (one read serves both questions, as
        # in _is_dir); one without a marker, or whose marker records none, shows the
        # store's creation time
        try:
            marker = self.store.get(keys.dir_key(path))
        except NotFound:
            marker = None
        if marker is not None:
            times = sealed.read_dir_marker(marker, f"marker of directory {path!r} (object "
                                                   f"{keys.dir_key(path)!r} in "
                                                   f"{self.store.url})")
        elif self._has_children(path):
            times = {}
        else:
            self._known_dirs.discard(path)
            raise NotFound(f"no such file or directory: {path!r}")
        self._known_dirs.add(path)
        mtime = times.get("mtime_ns", self._root_ns)
        return Attr(path, True, 0, st.S_IFDIR | 0o755, mtime / 1e9, 0, mtime,
                    times.get("atime_ns"), times.get("ctime_ns"))

    def exists(self, path: str) -> bool:
        try:
            self.stat(path)
            return True
        except NotFound:
            return False

    def _is_dir(self, path: str) -> bool:
        if path in self._known_dirs:
            if self._has_dir_marker(path) or self._has_children(path):
                return True
            self._known_dirs.discard(path)
            return False
        if self._has_dir_marker(path) or self._has_children(path):
            self._known_dirs.add(path)
            return True
        return False

    def _has_dir_marker(self, path: str) -> bool:
        """Whether ``dirs/<path>`` exists; a damaged marker is an error (EIO), not a guess."""
        try:
            data = self.store.get(keys.dir_key(path))
        except NotFound:
            return False
        sealed.check_dir_marker(data, f"marker of directory {path!r} (object "
                                      f"{keys.dir_key(path)!r} in {self.store.url})")
        return True

    def _has_children(self, path: str) -> bool:
        for prefix in (keys.FILES, keys.DIRS):
            for _ in self.store.list(prefix + path + "/"):
                return True
        with self._lock:
            return any(keys.parent(p) == path for p in self._writers)

    def listdir(self, path: str) -> list[str]:
        """Names in directory ``path`` (sorted; without ``.`` and ``..``)."""
        path = keys.norm(path)
        a = self.stat(path)
        if not a.is_dir:
            raise NotADirectory(f"{path!r} is not a directory")
        pre = path + "/" if path else ""
        names, files = set(), []
        for prefix in (keys.FILES, keys.DIRS):
            for obj in self.store.list(prefix + pre):
                rest = obj.key[len(prefix) + len(pre):]
                if rest:
                    names.add(rest.split("/", 1)[0])
                    if prefix == keys.FILES and "/" not in rest:
                        files.append(pre + rest)
        with self._lock:
            # the listing is newer than a cached "no such file" of a name it holds (a
            # file another mount created since): forget those, or a stat of the name
            # would hide a file the listing shows
            for p in files:
                hit = self._manifests.get(p)
                if hit is not None and hit[1] is None:
                    del self._manifests[p]
            for p in self._writers:
                if keys.parent(p) == path:
                    names.add(keys.basename(p))
        return sorted(names)

    def mkdir(self, path: str, mode: int = 0o755) -> None:
        path = keys.norm(path)
        if self.exists(path):
            raise AlreadyExists(f"{path!r} already exists")
        parent = keys.parent(path)
        if not self.stat(parent).is_dir:
            raise NotADirectory(f"{parent!r} is not a directory")
        self.store.put(keys.dir_key(path), sealed.dir_marker(mtime_ns=time.time_ns()))
        self._known_dirs.add(path)

    def rmdir(self, path: str) -> None:
        path = keys.norm(path)
        if not self.stat(path).is_dir:
            raise NotADirectory(f"{path!r} is not a directory")
        if not path:
            raise Busy("cannot remove the root directory")
        if self.listdir(path):
            raise DirectoryNotEmpty(f"directory {path!r} is not empty")
        self.store.delete(keys.dir_key(path))
        self._known_dirs.discard(path)

    def unlink(self, path: str) -> None:
        path = keys.norm(path)
        a = self.stat(path)
        if a.is_dir:
            raise IsADirectory(f"{path!r} is a directory")
        with self._lock:
            w = self._writers.pop(path, None)
            node = self._nodes.pop(path, None)
        if w is not None:
            w.orphan()
        if node is not None:
            self._detach(node)           # first: its readers' packs are pinned
        self.store.delete(keys.file_key(path))
        self._remember(path, None)

    def rename(self, old: str, new: str, *, noreplace: bool = False) -> None:
        old, new = keys.norm(old), keys.norm(new)
        a = self.stat(old)
        if old == new:
            return
        if new.startswith(old + "/"):
            raise InvalidArgument(f"cannot move {old!r} into itself")
        try:
            b = self.stat(new)
        except NotFound:
            b = None
        if b is not None:
            if noreplace:
                raise AlreadyExists(f"{new!r} already exists")
            if a.is_dir and not b.is_dir:
                raise NotADirectory(f"{new!r} is not a directory")
            if not a.is_dir and b.is_dir:
                raise IsADirectory(f"{new!r} is a directory")
            if b.is_dir and self.listdir(new):
                raise DirectoryNotEmpty(f"directory {new!r} is not empty")
        if not self.stat(keys.parent(new)).is_dir:
            raise NotADirectory(f"{keys.parent(new)!r} is not a directory")
        if a.is_dir:
            self._rename_dir(old, new)
        else:
            self._rename_file(old, new)

    def _rename_file(self, old: str, new: str) -> None:
        with self._lock:
            w = self._writers.pop(old, None)
            displaced = self._writers.pop(new, None)
            if w is not None:
                self._writers[new] = w
            node = self._nodes.pop(old, None)
            gone = self._nodes.pop(new, None)
            if node is not None:
                node.path = new
                self._nodes[new] = node
        if gone is not None and gone is not node:
            self._detach(gone)           # the replaced file's readers keep reading it
        if displaced is not None and displaced is not w:
            # the file being replaced may still be open (or closing): as on a local
            # disk, what is written to it later goes nowhere
            displaced.orphan()
        if w is None:
            self._move_manifest(old, new, None)
            return
        with w.moving(new) as live:      # no commit of w lands meanwhile
            if not live:
                self._drop_writer(new, w)
            self._move_manifest(old, new, w)

    def _move_manifest(self, old: str, new: str, w: WriteHandle | None) -> None:
        """The store's side of a file rename: ``old``'s committed manifest becomes
        ``new``'s; with none (a file still being written by ``w``), ``new`` shows no
        committed version until ``w`` commits."""
        m = self.manifest_or_none(old, fresh=True)
        if m is not None:
            self.commit(new, m, saved=False)
            self.store.delete(keys.file_key(old))
        elif w is None:
            raise NotFound(f"no file {old!r}")
        else:
            self.store.delete(keys.file_key(new))
            self._remember(new, None)
        self._remember(old, None)

    def _rename_dir(self, old: str, new: str) -> None:
        moved = []
        with self._lock:
            for p in list(self._writers):
                if p.startswith(old + "/"):
                    w = self._writers.pop(p)
                    self._writers[new + p[len(old):]] = w
                    moved.append((w, new + p[len(old):]))
            for p in [p for p in self._nodes if p.startswith(old + "/")]:
                node = self._nodes.pop(p)
                node.path = new + p[len(old):]
                self._nodes[node.path] = node
            self._manifests.clear()
        with contextlib.ExitStack() as held:      # no commit under the folder meanwhile
            for w, p in moved:
                if not held.enter_context(w.moving(p)):
                    self._drop_writer(p, w)
            self._move_folder_objects(old, new)
        with self._lock:
            self._manifests.clear()

    def _move_folder_objects(self, old: str, new: str) -> None:
        self._ensure_parents(new + "/x")
        try:       # the folder keeps its times (its marker, as it is)
            marker = self.store.get(keys.dir_key(old))
        except NotFound:
            marker = sealed.dir_marker()      # it had none: the store's time shows
        self.store.put(keys.dir_key(new), marker)
        self._known_dirs.add(new)
        for prefix in (keys.FILES, keys.DIRS):
            for obj in list(self.store.list(prefix + old + "/")):
                rest = obj.key[len(prefix) + len(old):]
                self.store.put(prefix + new + rest, self.store.get(obj.key))
                self.store.delete(obj.key)
        self.store.delete(keys.dir_key(old))
        self._known_dirs = {d for d in self._known_dirs if d != old and not d.startswith(old + "/")}

    def set_attrs(self, path: str, *, mode: int | None = None, mtime: float | None = None,
                  size: int | None = None, mtime_ns: int | None = None,
                  atime_ns: int | None = None) -> Attr:
        """chmod / utime / truncate of a path (not through an open handle). Times: the
        mtime as ``mtime_ns`` (exact) or ``mtime`` (seconds), the atime as ``atime_ns``."""
        path = keys.norm(path)
        if mtime is not None and mtime_ns is None:
            mtime_ns = seconds_to_ns(mtime)
        times = {"mtime_ns": mtime_ns, "atime_ns": atime_ns}
        with self._lock:
            w = self._writers.get(path)
        if w is not None and w.set_attrs(mode=mode, size=size, **times):
            return self.stat(path)
        a = self.stat(path)
        if a.is_dir:
            # a folder keeps its times in its marker (its mode is not stored: 0755)
            if path and (mtime_ns is not None or atime_ns is not None):
                self.store.put(keys.dir_key(path), sealed.dir_marker(
                    mtime_ns=a.mtime_ns if mtime_ns is None else mtime_ns,
                    atime_ns=a.atime_ns if atime_ns is None else atime_ns,
                    ctime_ns=time.time_ns()))
                self._known_dirs.add(path)
                return self.stat(path)
            return a
        if size == 0 and a.size > 0:
            old = self.manifest(path, fresh=True)
            h = self.open_write(path, truncate=True)
            try:
                h.set_attrs(mode=mode, **times)
                h.fsync()
            finally:
                h.release()
            with self._lock:
                self._truncated[path] = old
            return self.stat(path)
        if size is not None and size != a.size:
            h = self.open_write(path, truncate=False)
            try:
                h.truncate(size)
                h.set_attrs(mode=mode, **times)
                h.fsync()
            finally:
                h.release()
            return self.stat(path)
        if mode is not None or mtime_ns is not None or atime_ns is not None:
            m = self.manifest(path, fresh=True)
            if mode is not None:
                m.mode = (m.mode & ~0o7777) | (mode & 0o7777)
            if mtime_ns is not None:
                m.mtime, m.mtime_ns = mtime_ns / 1e9, mtime_ns
            if atime_ns is not None:
                m.atime_ns = atime_ns
            m.ctime_ns = time.time_ns()
            self.commit(path, m, saved=False)
        return self.stat(path)

    def statfs(self) -> dict:
        total = shutil.disk_usage(self.cache_dir)
        return {"bsize": 4096, "blocks": 1 << 40, "bfree": 1 << 39, "files": 1 << 32,
                "ffree": 1 << 31, "namemax": 255, "cache_free": total.free}

    # --- files -----------------------------------------------------------------------

    def open_read(self, path: str) -> NodeReader:
        """A descriptor reading ``path``'s file (s4fs.read.node: it follows the file, not one
        version); ``keep_cache`` on it says whether the kernel may keep its pages."""
        path = keys.norm(path)
        with self._lock:
            w = self._writers.get(path)
        m = None
        if w is None:
            m = self.manifest_or_none(path)
            if m is None:
                if path and self._is_dir(path):
                    raise IsADirectory(f"{path!r} is a directory")
                raise NotFound(f"no file {path!r}")
        with self._lock:
            node = self._node(path)
            if node.writer is None and m is not None and \
                    (node.version is None or node.version.id != m.id):
                node.version = m          # first open, or another mount committed anew
                node.changed()
            node.readers += 1
        try:
            view, gen = self._view_of(node)
            if view is None:
                raise NotFound(f"no file {path!r}")
        except BaseException:
            self._reader_gone(node)
            raise
        with self._lock:
            keep = node.open_verdict(view.version)
        return NodeReader(node, view, gen, keep, self._view_of, _note_read,
                          self._reader_gone)

    def node_attr(self, node: FileNode) -> Attr:
        """The attributes of ``node``'s file, also once its path is gone (``fstat`` of a
        descriptor whose file was unlinked or renamed over)."""
        with self._lock:
            w, m, path = node.writer, node.version, node.path
        if w is not None:
            return _writer_attr(path, w)
        if m is not None:
            return _version_attr(path, m)
        raise NotFound(f"no file {path!r}")

    def _node(self, path: str) -> FileNode:
        """(Under ``_lock``.) The node of ``path``, made on first use."""
        node = self._nodes.get(path)
        if node is None:
            node = self._nodes[path] = FileNode(path)
        return node

    def _view_of(self, node: FileNode) -> tuple[ReadHandle | None, int]:
        """What ``node`` is now, as a view to read it through, with the generation it
        is of; None when it has no content (the caller keeps what it had)."""
        while True:
            with self._lock:
                gen, w, m, path = node.gen, node.writer, node.version, node.path
            if w is None:
                break
            fd = w.reader_fd()        # waits for a commit in progress
            if fd is not None:
                # being written on this mount: what is written so far, from its spool
                # (which may already be exactly the committed version: the release of a
                # closed file comes after close() returns)
                return ReadHandle(staged_fd=fd, size_fn=lambda: w.size, path=path,
                                  version=w.committed_id()), gen
            with self._lock:
                if node.writer is w:      # closed, and not yet let go of: its version
                    gen, m = node.gen, node.version
                    break
        if m is None:
            return None, gen
        if self.decoded is not None:
            fd = self.decoded.open(m.id)
            if fd is not None:
                # written (or read whole) on this machine: the exact bytes, on local disk
                return ReadHandle(staged_fd=fd, size_fn=lambda: m.size, path=path,
                                  manifest=m, on_bad=lambda: self.decoded.discard(m.id)), gen
        return ReadHandle(FileReader(m, self.source, path=path), path=path, manifest=m,
                          fill_fn=lambda first: self.fills.start(m, first)), gen

    def _reader_gone(self, node: FileNode) -> None:
        with self._lock:
            node.readers -= 1
            pin = None
            if node.readers <= 0 and node.pin is not None:
                pin, node.pin = node.pin, None
                self._pinned.discard(node)
            _forget_idle_version(node)
        if pin is not None:
            self._unpin(pin)

    def _detach(self, node: FileNode) -> None:
        """``node``'s path was unlinked or renamed over: its readers keep the version
        they read, so its packs are pinned (a manifest under ``pins/``, which garbage
        collection counts as live) until the last of them closes."""
        with self._lock:
            node.detached = True
            m = node.version if node.readers > 0 and node.pin is None else None
        if m is None:
            return
        key = keys.new_pin_key()
        try:
            self.store.put(key, m.to_bytes())
        except S4Error as exc:
            log.warning("%s: could not pin the packs of the version its open readers "
                        "read (%s); a garbage collection meanwhile may free them", node.path,
                        exc)
            return
        with self._lock:
            if node.readers > 0:
                node.pin = key
                self._pinned.add(node)
                key = None
        if key is not None:
            self._unpin(key)

    def _unpin(self, key: str) -> None:
        try:
            self.store.delete(key)
        except S4Error as exc:
            log.warning("could not remove the pin %s (%s); garbage collection ignores it "
                        "once it is older than %d days", key, exc, keys.PIN_DAYS)

    def saw_commit(self, w: WriteHandle, m: Manifest) -> None:
        """``w`` committed ``m``, exactly the bytes written through it (so through the
        kernel, whose pages are then ``m``) — unless another descriptor read the file
        while it was being written: then the kernel is told to drop its pages."""
        with self._lock:
            node = w.node
            if node is None or node.writer is not w or node.detached:
                return
            # through FUSE passthrough the kernel wrote the spool, not its own pages of
            # this file: whatever pages it holds are of an older version
            drop = node.read_while_written or w.passthrough
            node.read_while_written = False
            node.kernel_id = None if drop else m.id
        if drop:
            self._invalidate(node)

    def _invalidate(self, node: FileNode, *, gone: bool = False) -> None:
        if self.on_invalidate is not None:
            self.on_invalidate(node, gone)

    def _attach_writer(self, path: str, w: WriteHandle) -> None:
        """(Under ``_lock``.) ``w`` writes ``path``'s file in place from now on."""
        node = self._node(path)
        node.writer = w
        node.read_while_written = False
        node.changed()
        w.node = node

    def open_write(self, path: str, *, truncate: bool = True, create: bool = True,
                   exclusive: bool = False, mode: int = 0o644) -> WriteHandle:
        path = keys.norm(path)
        if not path:
            raise IsADirectory("the root is a directory")
        while True:
            with self._lock:
                w = self._writers.get(path)
            if w is None:
                break
            if exclusive:
                raise AlreadyExists(f"{path!r} already exists")
            if w.share(truncate=truncate):      # outside our lock: see the module docstring
                return w
            self.release_writer(w)             # it closed meanwhile: open a new one
        try:
            a = self.stat(path)
        except NotFound:
            a = None
        if a is not None and a.is_dir:
            raise IsADirectory(f"{path!r} is a directory")
        if a is not None and exclusive:
            raise AlreadyExists(f"{path!r} already exists")
        if a is None and not create:
            raise NotFound(f"no file {path!r}")
        parent = keys.parent(path)
        if parent and not self.stat(parent).is_dir:
            raise NotADirectory(f"{parent!r} is not a directory")
        old = self.manifest_or_none(path, fresh=True) if a is not None else None
        file_mode = old.mode if old is not None else st.S_IFREG | (mode & 0o7777)
        previous = old
        with self._lock:
            truncated = self._truncated.pop(path, None)
        if truncated is not None and (old is None or old.size == 0):
            previous = truncated       # opened right after a truncate to zero: same lineage
        w = WriteHandle(self, path, file_mode,
                        initial=None if (truncate or old is None or old.size == 0) else old,
                        previous=previous)
        with self._lock:
            other = self._writers.get(path)
            if other is None:
                self._writers[path] = w
                self._attach_writer(path, w)
                return w
        # another open of the same path won the race: share its handle instead
        w.abort()
        return self.open_write(path, truncate=truncate, create=create,
                               exclusive=exclusive, mode=mode)

    def _drop_writer(self, path: str, w: WriteHandle) -> None:
        self._writer_gone(w, path)

    def release_writer(self, w: WriteHandle) -> None:
        """(WriterPort) ``w`` closed or failed."""
        self._writer_gone(w, w.path)

    def _writer_gone(self, w: WriteHandle, path: str) -> None:
        """``w`` closed (or failed): its file is its last committed version again. If
        the bytes it took are no committed version (a failed save), the kernel's pages
        of them are dropped."""
        cid = w.committed_id()
        with self._lock:
            if self._writers.get(path) is w:
                del self._writers[path]
            node = w.node
            if node is None or node.writer is not w:
                return
            if node.detached:
                # unlinked or renamed over: its readers keep reading the spool they
                # hold, and the writer stays its attributes (fstat)
                return
            node.writer = None
            node.changed()
            drop = cid is None
            if drop:
                node.kernel_id = None
            gone = drop and w.previous is None        # its first save failed
            _forget_idle_version(node)
        if drop:
            # a failed first save leaves no file at all: the kernel forgets its name too
            self._invalidate(node, gone=gone)

    def new_session(self, path: str, previous: Manifest | None,
                    spool: str | None = None) -> IngestSession:
        """(WriterPort) The ingest of a new version of ``path``, its delta base chosen
        by the write room (s4fs.write.bases). With writeback, a checkpoint saved while
        the one before it is still being committed waits for that commit (up to
        BASE_WAIT seconds; then an older base) so that it is coded against it: saves
        that outpace their commits would otherwise be coded against older ones."""
        if self.cfg.writeback and self.cfg.delta and \
                any(w.path != path for w in self.committer.pending()):
            near = set(candidates(self, path)) - {path}
            if near and not self.committer.wait_for(near, BASE_WAIT):
                log.info("%s: coded against an older base; the commit of %s is still "
                         "pending", path, ", ".join(sorted(
                             w.path for w in self.committer.pending() if w.path in near)))
        return new_session(self, path, previous, spool)


TEMP_CACHE_PREFIX = "s4fs-cache-"
BASE_WAIT = 10.0      # seconds a save waits for its likely delta base's pending commit


def _writer_attr(path: str, w: WriteHandle) -> Attr:
    """A file being written: its spool's size, the handle's mode and times."""
    return Attr(path, False, w.size, w.mode, w.mtime, 0, w.mtime_ns, w.atime_ns,
                w.ctime_ns)


def _version_attr(path: str, m: Manifest) -> Attr:
    """A committed version."""
    atime, mtime, ctime = m.times_ns()
    return Attr(path, False, m.size, m.mode, m.mtime, m.stored_bytes(), mtime, atime, ctime)


def _forget_idle_version(node: FileNode) -> None:
    """(Under ``Filesystem._lock``.) A node nobody reads or writes keeps only what the
    kernel holds of it (``kernel_id``), not its manifest: a long-running mount that has
    opened thousands of checkpoints holds thousands of nodes. The next open sets it."""
    if node.readers <= 0 and node.writer is None:
        node.version = None


def _note_read(node: FileNode) -> None:
    """A read reached the filesystem: if the file is being written meanwhile, the
    kernel's pages are not only the writer's (s4fs.read.node)."""
    if node.writer is not None:
        node.read_while_written = True


def _sweep_stale_temp_caches() -> None:
    """Remove the temporary cache dirs of s4fs processes that died without closing
    (kill -9, a crash): their decoded-file and pack caches can hold gigabytes. A dir
    still locked belongs to a live process and is left alone, and so is one whose
    journal still names files (a writeback mount's accepted bytes: kept, and logged)."""
    import fcntl
    import glob
    for folder in glob.glob(os.path.join(tempfile.gettempdir(), TEMP_CACHE_PREFIX + "*")):
        try:
            fd = os.open(os.path.join(folder, ".lock"), os.O_RDWR)
        except OSError:
            continue                  # not made by this s4fs
        try:
            if time.time() - os.fstat(fd).st_mtime < 60:
                continue              # just made: its owner may not hold the lock yet
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                continue
            journal = os.path.join(folder, "journal")
            if os.path.isdir(journal) and os.listdir(journal):
                log.warning("%s holds the journal of a writeback mount that died; its "
                            "files are not committed: mount with --cache-dir %s to "
                            "commit them", folder, folder)
                continue
            shutil.rmtree(folder, ignore_errors=True)
        finally:
            os.close(fd)


#: statfs(2) f_type of the filesystems that keep files in memory only (linux/magic.h)
_MEMORY_FS = {0x01021994: "tmpfs", 0x858458F6: "ramfs"}


def memory_filesystem(path: str) -> str | None:
    """"tmpfs" or "ramfs" where ``path`` (or, while it does not exist, its nearest
    existing parent) is on a filesystem that keeps its files in memory only, else None
    (a disk, or where statfs cannot tell)."""
    import ctypes
    import ctypes.util
    while not os.path.exists(path) and os.path.dirname(path) != path:
        path = os.path.dirname(path)
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
    except OSError:
        return None
    buf = ctypes.create_string_buffer(256)      # struct statfs: f_type first, a word
    if libc.statfs(os.fsencode(path), buf) != 0:
        return None
    f_type = ctypes.c_long.from_buffer(buf).value & 0xFFFFFFFF
    return _MEMORY_FS.get(f_type)


def _lock_cache_dir(folder: str) -> int:
    """One mount per cache dir: its spools, journal and caches are this mount's own."""
    import fcntl
    os.makedirs(folder, exist_ok=True)
    fd = os.open(os.path.join(folder, ".lock"), os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise Busy(f"the cache dir {folder} is in use by another s4fs mount (or Python "
                   f"process); give each mount its own --cache-dir") from None
    return fd
