"""The core filesystem: a POSIX-like namespace of files kept in a store.

Knows nothing about FUSE (``s4fs.mount`` translates FUSE operations into these calls, and
the Python API uses them directly). Paths are ``"a/b/c"`` strings relative to the store
root (``""`` is the root). Every method is thread-safe and blocking.

Writes go through :class:`s4fs.write.WriteHandle` (spool first, ingest behind the
writes, commit at close; see that module for the states and when a file is committed);
this module keeps the namespace: which paths exist and their manifests. ``commit`` writes
a manifest — the one atomic step of a save — and only then does the file exist for other
mounts. See docs/SEMANTICS.md.

What :class:`Filesystem` owns and delegates to: the cache dir (:mod:`s4fs.cachedir`),
the manifests read (:mod:`s4fs.manifest_cache`), the folders and the store's root
marker (:mod:`s4fs.folders`), the writers and nodes of the files open on it, with the
pins of what detached readers read (:mod:`s4fs.openfiles`, whose lock guards those
tables and is never held while calling into a handle or the store), and the journal,
committer and rewriter behind its saves (:mod:`s4fs.writeback`).
"""

from __future__ import annotations

import dataclasses
import os
import stat as st

from s4fs import keys
from s4fs.attr import Attr, link_attr, version_attr
from s4fs.cachedir import CacheDir
from s4fs.coding import IngestConfig, placement
from s4fs.errors import (AlreadyExists, InvalidArgument, IsADirectory, IsALink,
                         NotADirectory, NotFound)
from s4fs.folders import STORE_FORMAT, Folders
from s4fs.fsconfig import FsConfig
from s4fs.links import Links
from s4fs.manifest import Manifest
from s4fs.manifest_cache import ManifestCache
from s4fs.namespace import PathChanges
from s4fs.openfiles import OpenFiles
from s4fs.chunks import ChunkSource
from s4fs.read import DecodedCache, FileNode, Fills, NodeReader, PackCache, ReadHandle
from s4fs.read.fetch import THREADS as FETCH_THREADS
from s4fs.record import Recorder
from s4fs.runtime import Runtime, current as current_runtime
from s4fs.stores import LocalStore, Store
from s4fs.write import (IngestSession, Rewriter, SpaceKeeper, Services, Sessions, State,
                        WriteHandle)
from s4fs.writeback import Writeback

__all__ = ["Attr", "Filesystem", "FsConfig", "NodeReader", "ReadHandle", "STORE_FORMAT",
           "State", "WriteHandle"]


class Filesystem:
    """``runtime``: the worker processes and threads it uses (s4fs.runtime); the caller's
    to close. None: the process's shared one, ``runtime.current()``."""

    def __init__(self, store: Store, cfg: FsConfig | None = None,
                 runtime: Runtime | None = None) -> None:
        self.store = store
        self.cfg = cfg or FsConfig()
        self.runtime = runtime or current_runtime()
        self.pools = self.runtime.pools
        self.manifests = ManifestCache(store, self.cfg.metadata_ttl)
        # first: a store this s4fs cannot use leaves nothing behind
        self.folders = Folders(store, lambda p: self.manifest_or_none(p) is not None,
                               lambda folder: self.files.open_under(folder))
        self.links = Links(store)
        self.changes = PathChanges(self)
        self.cache = CacheDir(self.cfg.cache_dir, writeback=self.cfg.writeback)
        self.cache_dir = self.cache.path
        self.spool_dir = self.cache.sub("spool", make=True)
        self.space = SpaceKeeper(self.spool_dir, self.free_space)
        self.pack_cache = None
        if self.cfg.pack_cache_bytes != 0 and not isinstance(store, LocalStore):
            self.pack_cache = PackCache(self.cfg.pack_cache_dir or self.cache.sub("packs"),
                                        self.cfg.pack_cache_bytes)
        self.decoded = None
        if self.cfg.decoded_cache_bytes != 0:
            self.decoded = DecodedCache(self.cache.sub("decoded"),
                                        self.cfg.decoded_cache_bytes)
        self.source = self._chunk_source()
        # versions being decoded ahead, and where (the read room's policy)
        self.fills = Fills(store, self.decoded, self.cfg.ingest, self.source, self.pools,
                           self.runtime.cfg.gpu_fill_batch,
                           None if isinstance(store, LocalStore) else
                           self.runtime.thread("s4fs-fetch", FETCH_THREADS))
        # set by the FUSE adapter: drop the kernel's cached pages of a node, and its
        # name too when the file no longer exists: ``(node, gone)``, from any thread;
        # must not block on the kernel
        self.on_invalidate = None
        self.files = OpenFiles(store, self.decoded, self.source, self.fills,
                               self._invalidate)
        self.writeback = Writeback(self.cfg, self.cache.sub("journal"), Rewriter(
            self, self.cfg.ingest) if self.backward else None)
        self.record = Recorder(store, self.folders, self.manifests, self.files,
                               self.writeback.saved)
        # what every save uses, built once and handed down to each write handle
        self.sessions = Sessions(self, store, self.cfg, self.save_ingest,
                                 backward=self.backward, decoded=self.decoded,
                                 pack_cache=self.pack_cache, source=self.source,
                                 pools=self.pools, committer=self.writeback.committer)
        self.services = Services(
            self.cfg, self.sessions, self.record, self.spool_dir, self.free_space, self.space,
            self.writeback.journal, self.writeback.committer, self.decoded, self.source,
            lambda: self.runtime.thread("s4fs-check", min(8, os.cpu_count() or 1)))
        self.writeback.replay(self.services, self.files, self.spool_dir,
                              lambda p: self.manifest_or_none(p, fresh=True))

    def _chunk_source(self) -> ChunkSource:
        """Chunks fetched, verified and decoded. Decoding goes to the GPU only for
        planes that need it (nvCOMP ANS/GDeflate); on a mount whose pipeline is the GPU
        worker process, there (the daemon itself makes no CUDA context)."""
        ingest = self.cfg.ingest
        offload = None
        if placement(ingest).gpu_worker:
            pools = self.pools
            offload = lambda blob, base: pools.gpu(ingest.nice).decode_blob(blob, base)  # noqa: E731
        return ChunkSource(self.store, cache_bytes=self.cfg.cache_bytes, device="auto",
                           blob_cache=self.pack_cache, offload=offload,
                           threads=self.runtime.thread("s4fs-read",
                                                       max(4, os.cpu_count() or 4)))

    def close(self) -> None:
        """Unmount: a writeback mount first waits (``close_sync_seconds``) for pending
        commits; what is still pending then stays journalled for the next start."""
        self.writeback.drain()
        self.files.close()
        self.writeback.close()
        self.space.close()
        self.source.close()
        self.cache.close()

    def _invalidate(self, node: FileNode, gone: bool) -> None:
        if self.on_invalidate is not None:
            self.on_invalidate(node, gone)

    def free_space(self, nbytes: int) -> bool:
        """The cache disk is full: the caches give space back (spools come first)."""
        freed = False
        if self.decoded is not None:
            freed = self.decoded.free_space(nbytes) or freed
        if self.pack_cache is not None:
            freed = bool(self.pack_cache.free_space(nbytes)) or freed
        return freed

    def statfs(self) -> dict:
        return self.cache.statfs()

    # --- writeback: pending, sync (s4fs.writeback) ------------------------------------

    def pending(self) -> list[dict]:
        """Files accepted but not yet committed (writeback), oldest first."""
        return self.writeback.pending()

    def sync(self, timeout: float | None = None) -> list[dict]:
        """Wait for every pending commit, then for the re-expressions of previous
        versions as deltas they queued (backward deltas); returns the files that could
        not be committed (each failed at least once during the wait), empty when all are
        in the store."""
        return self.writeback.sync(timeout)

    def settle_deltas(self, timeout: float | None = None) -> bool:
        """Wait until the background re-expressions queued so far are done (True)."""
        return self.writeback.settle(timeout)

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
        return self.manifests.get(path, fresh=fresh) if path else None

    def current_manifest(self, path: str) -> Manifest | None:
        """The manifest of ``path`` as the store holds it now (not parsed again when its
        bytes are those already read), or None."""
        return self.manifest_or_none(path, fresh=True)

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
        self.record.commit(path, m, saved=saved)

    def rewritten(self, path: str, m: Manifest, data: bytes | None = None) -> None:
        """(RewritePort) ``path``'s manifest was rewritten as ``m`` (stored as ``data``):
        the same version (same id, same bytes), its chunks stored otherwise."""
        self.manifests.rewritten(path, m, data)
        self.files.rewritten(path, m)

    # --- namespace -------------------------------------------------------------------

    def stat(self, path: str) -> Attr:
        path = keys.norm(path)
        w = self.files.writer(path)
        if w is not None:
            return w.attr()
        if path == "":
            return self.folders.attr("")
        m = self.manifest_or_none(path)
        if m is not None:
            return version_attr(path, m)
        try:
            return self.folders.attr(path)
        except NotFound:
            link = self.links.get(path)
            if link is None:
                raise
            return link_attr(path, *link)

    # --- changes by path (s4fs.namespace) ---------------------------------------------

    def mkdir(self, path: str, mode: int = 0o755,
              owner: tuple[int, int] | None = None) -> None:
        self.changes.mkdir(path, mode, owner)

    def rmdir(self, path: str) -> None:
        self.changes.rmdir(path)

    def unlink(self, path: str) -> None:
        self.changes.unlink(path)

    def rename(self, old: str, new: str, *, noreplace: bool = False) -> None:
        self.changes.rename(old, new, noreplace=noreplace)

    def set_attrs(self, path: str, **changes) -> Attr:
        """chmod / chown / utime / truncate by path (:meth:`PathChanges.set_attrs`)."""
        return self.changes.set_attrs(path, **changes)

    def symlink(self, path: str, target: bytes,
                owner: tuple[int, int] | None = None) -> Attr:
        return self.changes.symlink(path, target, owner)

    def readlink(self, path: str) -> bytes:
        return self.changes.readlink(path)

    def exists(self, path: str) -> bool:
        try:
            self.stat(path)
            return True
        except NotFound:
            return False

    def listdir(self, path: str) -> list[str]:
        """Names in directory ``path`` (sorted; without ``.`` and ``..``)."""
        path = keys.norm(path)
        a = self.stat(path)
        if not a.is_dir:
            raise NotADirectory(f"{path!r} is not a directory")
        names, files = self.folders.names(path)
        self.manifests.forget_absent(files)
        return sorted(names | self.files.names_under(path))


    # --- files -----------------------------------------------------------------------

    def open_read(self, path: str) -> NodeReader:
        """A descriptor reading ``path``'s file (s4fs.read.node: it follows the file, not one
        version); ``keep_cache`` on it says whether the kernel may keep its pages."""
        path = keys.norm(path)
        m = None
        if self.files.writer(path) is None:
            m = self.manifest_or_none(path)
            if m is None:
                if path and self.folders.is_dir(path):
                    raise IsADirectory(f"{path!r} is a directory")
                if self.links.get(path) is not None:
                    raise IsALink(f"{path!r} is a symbolic link (read what it points to)")
                raise NotFound(f"no file {path!r}")
        return self.files.open_read(path, m)

    def node_attr(self, node: FileNode) -> Attr:
        """The attributes of ``node``'s file, also once its path is gone (``fstat`` of a
        descriptor whose file was unlinked or renamed over)."""
        return self.files.node_attr(node)

    def open_write(self, path: str, *, truncate: bool = True, create: bool = True,
                   exclusive: bool = False, mode: int = 0o644,
                   owner: tuple[int, int] | None = None) -> WriteHandle:
        """A handle writing ``path``'s file; a new file gets permission bits ``mode``
        and is owned by ``owner`` (uid, gid) where given."""
        path = keys.norm(path)
        if not path:
            raise IsADirectory("the root is a directory")
        while (w := self.files.writer(path)) is not None:
            if exclusive:
                raise AlreadyExists(f"{path!r} already exists")
            if w.share(truncate=truncate):      # outside the tables' lock: see openfiles
                return w
            self.files.writer_gone(w, w.path)  # it closed meanwhile: open a new one
        old = self._existing_for_write(path, create=create, exclusive=exclusive)
        file_mode = old.mode if old is not None else st.S_IFREG | (mode & 0o7777)
        previous = old
        truncated = self.files.pop_truncated(path)
        if truncated is not None and (old is None or old.size == 0):
            previous = truncated       # opened right after a truncate to zero: same lineage
        w = WriteHandle(self.services, path, file_mode,
                        initial=None if (truncate or old is None or old.size == 0) else old,
                        previous=previous)
        if old is None and owner is not None:
            w.meta.owner = owner
        if self.files.add_writer(path, w):
            return w
        # another open of the same path won the race: share its handle instead
        w.abort()
        return self.open_write(path, truncate=truncate, create=create,
                               exclusive=exclusive, mode=mode, owner=owner)

    def _existing_for_write(self, path: str, *, create: bool,
                            exclusive: bool) -> Manifest | None:
        """The checks of an open for writing where no writer is open: the committed
        version of ``path``, None where there is no file yet."""
        try:
            a = self.stat(path)
        except NotFound:
            a = None
        if a is not None and a.is_dir:
            raise IsADirectory(f"{path!r} is a directory")
        if a is not None and a.is_link:
            raise AlreadyExists(f"{path!r} is a symbolic link") if exclusive else \
                IsALink(f"{path!r} is a symbolic link (write what it points to)")
        if a is not None and exclusive:
            raise AlreadyExists(f"{path!r} already exists")
        if a is None and not create:
            raise NotFound(f"no file {path!r}")
        parent = keys.parent(path)
        if parent and not self.stat(parent).is_dir:
            raise NotADirectory(f"{parent!r} is not a directory")
        return self.manifest_or_none(path, fresh=True) if a is not None else None

    def new_session(self, path: str, previous: Manifest | None,
                    spool: str | None = None) -> IngestSession:
        """The ingest of a new version of ``path`` (the direct save of ``s4fs.torch``
        and the benchmarks; a write handle has the same :class:`Sessions`)."""
        return self.sessions.new(path, previous, spool)
