"""The core filesystem: a POSIX-like namespace of files kept in a store.

Knows nothing about FUSE (``s4fs.mount`` translates FUSE operations into these calls, and
the Python API uses them directly). Paths are ``"a/b/c"`` strings relative to the store
root (``""`` is the root). Every method is thread-safe and blocking.

Writes: a file opened for writing from empty streams straight into an
:class:`~s4fs.ingest.IngestSession` while bytes arrive in order. Anything else — a write
that is not at the end, a read or truncate through a write handle, opening an existing
file without truncating it — switches the handle to a staging file on local disk, which
is ingested at flush. ``flush``/``fsync`` commit: every chunk is stored, then the
manifest is written, atomically; only then does the file exist for other mounts.
See docs/SEMANTICS.md.
"""

from __future__ import annotations

import json
import os
import shutil
import stat as st
import tempfile
import threading
import time
from dataclasses import dataclass, field

from s4fs import keys
from s4fs import metrics
from s4fs.errors import (AlreadyExists, Busy, CorruptManifest, DirectoryNotEmpty,
                         InvalidArgument, IsADirectory, NotADirectory, NotFound)
from s4fs.ingest import IngestConfig, IngestSession
from s4fs.manifest import Manifest
from s4fs.reader import ChunkSource, FileReader
from s4fs.stores import LocalStore, Store

STORE_FORMAT = {"format": "s4fs-store", "version": 1}


@dataclass(frozen=True)
class FsConfig:
    ingest: IngestConfig = field(default_factory=IngestConfig)
    cache_dir: str | None = None       # staging files and the pack cache; a temp dir if None
    cache_bytes: int = 256 << 20       # decoded-chunk LRU
    metadata_ttl: float = 1.0          # how long a cached manifest/listing is trusted
    delta: bool = True                 # store checkpoints as deltas of the previous one
    pack_cache_bytes: int = 8 << 30    # local copies of the newest packs (remote stores)


@dataclass
class Attr:
    path: str
    is_dir: bool
    size: int
    mode: int
    mtime: float
    stored: int = 0

    @property
    def name(self) -> str:
        return keys.basename(self.path)


class Filesystem:
    def __init__(self, store: Store, cfg: FsConfig | None = None) -> None:
        self.store = store
        self.cfg = cfg or FsConfig()
        self._own_cache = self.cfg.cache_dir is None
        self.cache_dir = self.cfg.cache_dir or tempfile.mkdtemp(prefix="s4fs-cache-")
        os.makedirs(os.path.join(self.cache_dir, "staging"), exist_ok=True)
        self.pack_cache = None
        if self.cfg.pack_cache_bytes and not isinstance(store, LocalStore):
            from s4fs.cache import PackCache
            self.pack_cache = PackCache(os.path.join(self.cache_dir, "packs"),
                                        self.cfg.pack_cache_bytes)
        # decoding goes to the GPU only for planes that need it (nvCOMP ANS/GDeflate)
        self.source = ChunkSource(store, cache_bytes=self.cfg.cache_bytes,
                                  device="auto", blob_cache=self.pack_cache)
        self._lock = threading.RLock()
        self._manifests: dict[str, tuple[float, Manifest | None]] = {}
        self._gen = 0                       # bumped by every change made on this mount
        self._writers: dict[str, "WriteHandle"] = {}
        self._known_dirs: set[str] = {""}
        self._truncated: dict[str, Manifest] = {}   # last version before a truncate to 0
        self._check_root()

    # --- store root ------------------------------------------------------------------

    def _check_root(self) -> None:
        from s4fs.errors import NotFound as _NF, UnsupportedVersionError
        try:
            doc = json.loads(self.store.get(keys.ROOT_MARKER))
        except _NF:
            self.store.put(keys.ROOT_MARKER, json.dumps(STORE_FORMAT).encode())
            return
        except ValueError:
            raise CorruptManifest(f"{self.store.url}: {keys.ROOT_MARKER} is not valid JSON")
        if doc.get("format") != "s4fs-store" or doc.get("version", 0) > STORE_FORMAT["version"]:
            raise UnsupportedVersionError(
                f"{self.store.url} holds an s4fs store of version {doc.get('version')}; "
                f"this s4fs reads version {STORE_FORMAT['version']}: upgrade s4fs")

    def close(self) -> None:
        with self._lock:
            writers = list(self._writers.values())
        for w in writers:
            w.abort()
        self.source.close()
        if self._own_cache:
            shutil.rmtree(self.cache_dir, ignore_errors=True)

    # --- manifests -------------------------------------------------------------------

    def manifest(self, path: str, *, fresh: bool = False) -> Manifest:
        """The committed manifest of ``path``; NotFound when there is none."""
        m = self._manifest_or_none(path, fresh=fresh)
        if m is None:
            raise NotFound(f"no file {path!r}")
        return m

    def _manifest_or_none(self, path: str, *, fresh: bool = False) -> Manifest | None:
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
            m = Manifest.from_bytes(data, where=f"manifest of {path!r}")
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

    def commit(self, path: str, m: Manifest) -> None:
        """Write ``m`` as the manifest of ``path`` (the one atomic step of a save)."""
        self._ensure_parents(path)
        self.store.put(keys.file_key(path), m.to_bytes())
        self._remember(path, m)

    def _ensure_parents(self, path: str) -> None:
        p = keys.parent(path)
        missing = []
        while p and p not in self._known_dirs:
            missing.append(p)
            p = keys.parent(p)
        for d in reversed(missing):
            if not self.store.exists(keys.dir_key(d)):
                if self._manifest_or_none(d) is not None:
                    raise NotADirectory(f"{d!r} is a file, not a directory")
                self.store.put(keys.dir_key(d), b"")
            self._known_dirs.add(d)

    # --- namespace -------------------------------------------------------------------

    def stat(self, path: str) -> Attr:
        path = keys.norm(path)
        with self._lock:
            w = self._writers.get(path)
        if w is not None:
            return Attr(path, False, w.size, w.mode, w.mtime)
        if path == "":
            return Attr("", True, 0, st.S_IFDIR | 0o755, 0.0)
        m = self._manifest_or_none(path)
        if m is not None:
            return Attr(path, False, m.size, m.mode, m.mtime, m.stored_bytes())
        if self._is_dir(path):
            return Attr(path, True, 0, st.S_IFDIR | 0o755, 0.0)
        raise NotFound(f"no such file or directory: {path!r}")

    def exists(self, path: str) -> bool:
        try:
            self.stat(path)
            return True
        except NotFound:
            return False

    def _is_dir(self, path: str) -> bool:
        if path in self._known_dirs:
            if self.store.exists(keys.dir_key(path)) or self._has_children(path):
                return True
            self._known_dirs.discard(path)
            return False
        if self.store.exists(keys.dir_key(path)) or self._has_children(path):
            self._known_dirs.add(path)
            return True
        return False

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
        names = set()
        for prefix in (keys.FILES, keys.DIRS):
            for obj in self.store.list(prefix + pre):
                rest = obj.key[len(prefix) + len(pre):]
                if rest:
                    names.add(rest.split("/", 1)[0])
        with self._lock:
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
        self.store.put(keys.dir_key(path), b"")
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
        if w is not None:
            w.orphan()
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
            if w is not None:
                self._writers[new] = w
                w.path = new
        m = self._manifest_or_none(old, fresh=True)
        if m is not None:
            self.commit(new, m)
            self.store.delete(keys.file_key(old))
        elif w is None:
            raise NotFound(f"no file {old!r}")
        else:
            self.store.delete(keys.file_key(new))
            self._remember(new, None)
        self._remember(old, None)

    def _rename_dir(self, old: str, new: str) -> None:
        self._ensure_parents(new + "/x")
        self.store.put(keys.dir_key(new), b"")
        self._known_dirs.add(new)
        for prefix in (keys.FILES, keys.DIRS):
            for obj in list(self.store.list(prefix + old + "/")):
                rest = obj.key[len(prefix) + len(old):]
                self.store.put(prefix + new + rest, self.store.get(obj.key))
                self.store.delete(obj.key)
        with self._lock:
            for p in list(self._writers):
                if p.startswith(old + "/"):
                    w = self._writers.pop(p)
                    w.path = new + p[len(old):]
                    self._writers[w.path] = w
            self._manifests.clear()
        self.store.delete(keys.dir_key(old))
        self._known_dirs = {d for d in self._known_dirs if d != old and not d.startswith(old + "/")}

    def set_attrs(self, path: str, *, mode: int | None = None, mtime: float | None = None,
                  size: int | None = None) -> Attr:
        """chmod / utime / truncate of a path (not through an open handle)."""
        path = keys.norm(path)
        with self._lock:
            w = self._writers.get(path)
        if w is not None:
            w.set_attrs(mode=mode, mtime=mtime, size=size)
            return self.stat(path)
        a = self.stat(path)
        if a.is_dir:
            return a          # directory modes/times are not stored
        if size == 0 and a.size > 0:
            old = self.manifest(path, fresh=True)
            h = self.open_write(path, truncate=True)
            try:
                h.set_attrs(mode=mode, mtime=mtime)
                h.flush()
            finally:
                h.release()
            with self._lock:
                self._truncated[path] = old
            return self.stat(path)
        if size is not None and size != a.size:
            h = self.open_write(path, truncate=False)
            try:
                h.truncate(size)
                h.set_attrs(mode=mode, mtime=mtime)
                h.flush()
            finally:
                h.release()
            return self.stat(path)
        if mode is not None or mtime is not None:
            m = self.manifest(path, fresh=True)
            if mode is not None:
                m.mode = (m.mode & ~0o7777) | (mode & 0o7777)
            if mtime is not None:
                m.mtime = mtime
            self.commit(path, m)
        return self.stat(path)

    def statfs(self) -> dict:
        total = shutil.disk_usage(self.cache_dir)
        return {"bsize": 4096, "blocks": 1 << 40, "bfree": 1 << 39, "files": 1 << 32,
                "ffree": 1 << 31, "namemax": 255, "cache_free": total.free}

    # --- files -----------------------------------------------------------------------

    def open_read(self, path: str) -> "ReadHandle":
        path = keys.norm(path)
        with self._lock:
            w = self._writers.get(path)
        if w is not None:
            return w.reader_view()
        m = self._manifest_or_none(path)
        if m is None:
            if path and self._is_dir(path):
                raise IsADirectory(f"{path!r} is a directory")
            raise NotFound(f"no file {path!r}")
        return ReadHandle(FileReader(m, self.source), path=path)

    def open_write(self, path: str, *, truncate: bool = True, create: bool = True,
                   exclusive: bool = False, mode: int = 0o644) -> "WriteHandle":
        path = keys.norm(path)
        if not path:
            raise IsADirectory("the root is a directory")
        with self._lock:
            if path in self._writers:
                w = self._writers[path]
                if exclusive:
                    raise AlreadyExists(f"{path!r} already exists")
                return w.share(truncate=truncate)
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
        old = self._manifest_or_none(path) if a is not None else None
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
            self._writers[path] = w
        return w

    def _release_writer(self, w: "WriteHandle") -> None:
        with self._lock:
            if self._writers.get(w.path) is w:
                del self._writers[w.path]

    def new_session(self, path: str, previous: Manifest | None) -> IngestSession:
        base = base_path = None
        if self.cfg.delta:
            from s4fs.delta import choose_base
            chosen = choose_base(self, path, previous)
            if chosen is not None:
                base_path, base = chosen
        return IngestSession(self.store, self.cfg.ingest, base=base, base_path=base_path,
                             source=self.source, on_pack=self.pack_cache.put
                             if self.pack_cache is not None else None)

    def staging_file(self):
        return tempfile.NamedTemporaryFile(dir=os.path.join(self.cache_dir, "staging"),
                                           prefix="w-", delete=True)


class ReadHandle:
    """A read-only view of one committed version of a file."""

    def __init__(self, reader: FileReader | None = None, staged_fd: int | None = None,
                 size_fn=None, path: str = ""):
        self._reader = reader
        self._fd = staged_fd
        self._size_fn = size_fn
        self.path = path
        self.opened = time.monotonic()
        self.nbytes = 0

    @property
    def size(self) -> int:
        return self._reader.size if self._reader is not None else self._size_fn()

    def read(self, offset: int, size: int) -> bytes:
        if self._reader is not None:
            data = self._reader.read(offset, size)
        else:
            data = os.pread(self._fd, size, offset)
        self.nbytes += len(data)
        return data

    def readinto(self, offset: int, dest) -> int:
        if self._reader is not None:
            n = self._reader.readinto(offset, memoryview(dest).cast("B"))
        else:
            n = os.preadv(self._fd, [dest], offset)
        self.nbytes += n
        return n

    def release(self) -> None:
        if self.nbytes:
            metrics.observe_load(self.path, self.nbytes, time.monotonic() - self.opened)
            self.nbytes = 0
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


class WriteHandle:
    """One file open for writing (shared by every descriptor open on it on this mount)."""

    def __init__(self, fs: Filesystem, path: str, mode: int, *, initial: Manifest | None,
                 previous: Manifest | None) -> None:
        self.fs, self.path, self.mode = fs, path, mode
        self.mtime = time.time()
        self.opened = time.monotonic()
        self.previous = previous
        self.refs = 1
        self.error: BaseException | None = None
        self._lock = threading.RLock()
        self._session: IngestSession | None = None
        self._staged = None               # NamedTemporaryFile while staged
        self._size = 0
        self._dirty = True                # something to commit
        self._orphaned = False
        if initial is None:
            self._session = fs.new_session(path, previous)
        else:
            self._stage_from(initial)
            self._dirty = False

    # -- sharing --------------------------------------------------------------------

    def share(self, *, truncate: bool) -> "WriteHandle":
        with self._lock:
            self.refs += 1
            if truncate:
                self.truncate(0)
            return self

    @property
    def size(self) -> int:
        return self._size

    # -- staging --------------------------------------------------------------------

    def _stage_from(self, m: Manifest | None) -> None:
        f = self.fs.staging_file()
        if m is not None:
            reader = FileReader(m, self.fs.source)
            pos = 0
            step = 8 << 20
            while pos < m.size:
                data = reader.read(pos, step)
                f.write(data)
                pos += len(data)
        f.flush()
        self._staged = f
        self._size = m.size if m is not None else 0

    def _to_staged(self) -> None:
        """Leave streaming mode: read back what was streamed into a staging file."""
        if self._staged is not None:
            return
        s, self._session = self._session, None
        m = s.finish(mode=self.mode, mtime=self.mtime)
        self._stage_from(m)

    # -- operations ------------------------------------------------------------------

    def write(self, offset: int, data) -> int:
        with self._lock:
            self._check()
            n = len(data)
            if self._session is not None and offset == self._session.size:
                self._session.write(data)
                self._size = self._session.size
            else:
                self._to_staged_or_reopen()
                os.pwrite(self._staged.fileno(), data, offset)
                self._size = max(self._size, offset + n)
            self._dirty = True
            self.mtime = time.time()
            return n

    def _to_staged_or_reopen(self) -> None:
        if self._session is not None:
            self._to_staged()
        elif self._staged is None:       # committed, then written again
            self._stage_from(self.fs._manifest_or_none(self.path, fresh=True))

    def read(self, offset: int, size: int) -> bytes:
        with self._lock:
            self._check()
            if self._session is not None or self._staged is None:
                self._to_staged_or_reopen()
            return os.pread(self._staged.fileno(), size, offset)

    def truncate(self, size: int) -> None:
        with self._lock:
            self._check()
            if size == self._size:
                return
            if self._session is not None and size == 0 and self._session.size == 0:
                return
            if size == 0 and self.refs == 1:       # sole writer: start the stream afresh
                self._restart_stream()
                return
            self._to_staged_or_reopen()
            os.ftruncate(self._staged.fileno(), size)
            self._size = size
            self._dirty = True
            self.mtime = time.time()

    def _restart_stream(self) -> None:
        if self._session is not None:
            self._session.abort()
        if self._staged is not None:
            self._staged.close()
            self._staged = None
        self._session = self.fs.new_session(self.path, self.previous)
        self._size = 0
        self._dirty = True
        self.mtime = time.time()

    def set_attrs(self, *, mode=None, mtime=None, size=None) -> None:
        with self._lock:
            if size is not None:
                self.truncate(size)
            if mode is not None:
                self.mode = (self.mode & ~0o7777) | (mode & 0o7777)
                self._dirty = True
            if mtime is not None:
                self.mtime = mtime
                self._dirty = True

    def flush(self) -> None:
        """Commit: every chunk durable, then the manifest. Raises if anything failed."""
        with self._lock:
            self._check()
            if not self._dirty or self._orphaned:
                return
            try:
                if self._session is not None:
                    s, self._session = self._session, None
                    m = s.finish(mode=self.mode, mtime=self.mtime)
                else:
                    m = self._ingest_staged()
                self.fs.commit(self.path, m)
                self.previous = m
                self._dirty = False
                metrics.observe_save(self.path, m.size, m.stored_bytes(),
                                     time.monotonic() - self.opened)
            except BaseException as exc:
                self.error = exc
                metrics.observe_error(type(exc).__name__)
                # this version can never be committed: stop showing it now, not at the
                # (asynchronous) release
                self.fs._release_writer(self)
                raise

    fsync = flush

    def _ingest_staged(self) -> Manifest:
        s = self.fs.new_session(self.path, self.previous)
        try:
            fd = self._staged.fileno()
            pos = 0
            while pos < self._size:
                data = os.pread(fd, min(4 << 20, self._size - pos), pos)
                if not data:
                    break
                s.write(data)
                pos += len(data)
            return s.finish(mode=self.mode, mtime=self.mtime)
        except BaseException:
            s.abort()
            raise

    def _check(self) -> None:
        if self.error is not None:
            raise self.error

    def reader_view(self) -> ReadHandle:
        with self._lock:
            if not self._dirty and self.previous is not None:
                return ReadHandle(FileReader(self.previous, self.fs.source))
            if self._session is not None:
                raise Busy(f"{self.path!r} is being written; it can be read once closed")
            if self._staged is None:
                self._stage_from(self.fs._manifest_or_none(self.path, fresh=True))
            # a descriptor of its own: the writer may close its staging file first
            return ReadHandle(staged_fd=os.dup(self._staged.fileno()),
                              size_fn=lambda: self._size)

    def release(self) -> None:
        """Last close of one descriptor. Commits what is left; the last one cleans up."""
        with self._lock:
            self.refs -= 1
            if self.refs > 0:
                return
            try:
                if self._dirty and self.error is None and not self._orphaned:
                    self.flush()
            finally:
                self._cleanup()

    def abort(self) -> None:
        with self._lock:
            self._cleanup()

    def orphan(self) -> None:
        """The path was unlinked while open: keep accepting writes, commit nothing."""
        with self._lock:
            self._orphaned = True

    def _cleanup(self) -> None:
        if self._session is not None:
            self._session.abort()
            self._session = None
        if self._staged is not None:
            self._staged.close()
            self._staged = None
        self.fs._release_writer(self)
