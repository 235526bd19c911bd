"""FUSE operations over the core Filesystem (inodes ↔ paths, handles, errno mapping)."""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import fcntl
import functools
import logging
import os
import stat as st
import struct
import threading

import pyfuse3
import trio

from s4fs import keys
from s4fs import metrics
from s4fs.errors import S4Error
from s4fs.fs import Attr, Filesystem, WriteHandle
from s4fs.read import NodeReader
from s4fs.write import fresh_spool_name

log = logging.getLogger("s4fs.mount")

# linux/fuse.h: _IOW(229, 1, struct fuse_backing_map {s32 fd; u32 flags; u64 padding})
# registers a backing file for FUSE passthrough (the ioctl returns its id);
# _IOW(229, 2, u32) drops an id
_BACKING_OPEN, _BACKING_CLOSE = 0x4010E501, 0x4004E502
# the kernel's answers to a backing open where passthrough cannot work at all (not one
# file's trouble): no such ioctl, not negotiated, not permitted
_NO_PASSTHROUGH = {errno.ENOTTY, errno.EOPNOTSUPP, errno.EINVAL, errno.EPERM, errno.ENOSYS}


def _register_backing(fd: int) -> int:
    """Hand the kernel the file open at ``fd`` as a backing file; its id. Raises OSError
    where the kernel refuses (no passthrough, not CAP_SYS_ADMIN)."""
    return fcntl.ioctl(pyfuse3.get_session_fd(), _BACKING_OPEN,
                       bytearray(struct.pack("=iIQ", fd, 0, 0)), True)


def _unregister_backing(backing_id: int) -> None:
    fcntl.ioctl(pyfuse3.get_session_fd(), _BACKING_CLOSE,
                bytearray(struct.pack("=I", backing_id)), True)


@dataclasses.dataclass
class _Backing:
    """The file the kernel passes one inode through to: the spool of a save, or the
    local whole copy of a committed version (the decoded cache) for readers."""
    id: int
    fd: int                           # the daemon's own descriptor of it (its identity)
    handle: WriteHandle | None        # the save whose spool it is, if any
    version: str | None = None        # else: the committed version it holds
    name: str | None = None           # where it lies when outside the decoded cache
    opens: int = 1                    # descriptors of the inode using it
    released: bool = False            # the save's own descriptors are all closed
    # held while the file changes hands (a save takes it over, a refresh rewrites it)
    lock: threading.Lock = dataclasses.field(default_factory=threading.Lock)

    def holds(self) -> str | None:
        """The committed version the file is exactly, or None (a save being written,
        or one that failed)."""
        return self.handle.committed_id() if self.handle is not None else self.version

    def writing(self) -> bool:
        """Whether the file is a save's spool that is still the file's content (being
        written, accepted, or committed and not yet released)."""
        return self.handle is not None and self.handle.live()


def _fuse_errors(fn):
    """The one place where errors become errno: only FUSEError leaves a handler."""

    @functools.wraps(fn)
    async def wrapper(*args, **kwargs):
        try:
            return await fn(*args, **kwargs)
        except pyfuse3.FUSEError:
            raise
        except S4Error as exc:
            if exc.errno == errno.EIO:
                log.error("%s: %s", fn.__name__, exc)
                metrics.observe_error(type(exc).__name__)
            elif fn.__name__ == "read":         # an mmap reader dies of it (SIGBUS)
                log.warning("read: %s (errno %d)", exc, exc.errno)
            raise pyfuse3.FUSEError(exc.errno) from None
        except OSError as exc:
            if exc.errno is None or exc.errno == errno.EBADF:   # EBADF: always our bug
                log.exception("%s failed", fn.__name__)
            elif fn.__name__ == "read":
                log.warning("read failed: %r", exc)
            metrics.observe_error(type(exc).__name__)
            raise pyfuse3.FUSEError(exc.errno or errno.EIO) from None
        except Exception as exc:
            log.exception("unexpected error in %s", fn.__name__)
            metrics.observe_error(type(exc).__name__)
            raise pyfuse3.FUSEError(errno.EIO) from None
    return wrapper


def _forget_attributes(inode: int) -> None:
    try:
        pyfuse3.invalidate_inode(inode, attr_only=True)
    except OSError as exc:            # not known to the kernel (yet)
        log.debug("invalidating the attributes of inode %d: %s", inode, exc)


class _NamespaceLock:
    """Renames and unlinks change which file a path (and so an inode) stands for, in the
    core and here; opens and attribute requests must see both sides of that change or
    neither (an open racing a rename over its path would read the new file under the old
    inode, whose cached size is the old file's). Shared for those, exclusive for the
    changes; no waiting writer blocks a new reader, so a handler may nest shared use."""

    def __init__(self) -> None:
        self._cond = trio.Condition()
        self._readers = 0
        self._writing = False

    @contextlib.asynccontextmanager
    async def shared(self):
        async with self._cond:
            while self._writing:
                await self._cond.wait()
            self._readers += 1
        try:
            yield
        finally:
            async with self._cond:
                self._readers -= 1
                if not self._readers:
                    self._cond.notify_all()

    @contextlib.asynccontextmanager
    async def exclusive(self):
        async with self._cond:
            while self._writing or self._readers:
                await self._cond.wait()
            self._writing = True
        try:
            yield
        finally:
            async with self._cond:
                self._writing = False
                self._cond.notify_all()


def _namespace(kind: str):
    """Run a handler under the namespace lock (``"shared"`` or ``"exclusive"``)."""
    def wrap(fn):
        @functools.wraps(fn)
        async def wrapper(self, *args, **kwargs):
            async with getattr(self._ns, kind)():
                return await fn(self, *args, **kwargs)
        return wrapper
    return wrap


class S4Operations(pyfuse3.Operations):
    supports_dot_lookup = True
    # Off on purpose: with it the kernel trusts its own file sizes and never takes them
    # from us, so a file another node changed, or a failed save whose old version stays,
    # would show a stale size (docs/SEMANTICS.md). The spool would take any order.
    enable_writeback_cache = False
    enable_acl = False
    # FUSE passthrough (the mount's --passthrough; a pyfuse3 that can ask for it): the
    # kernel writes a file being written straight into its spool (docs/ARCHITECTURE.md)
    enable_passthrough = False
    # passthrough as the default where it can be had (not asked for by --passthrough):
    # the kernel's first refusal turns it off for the whole mount, said once
    passthrough_optional = False

    def __init__(self, fs: Filesystem, *, workers: int = 16, attr_timeout: float = 1.0,
                 uid: int | None = None, gid: int | None = None, info: dict | None = None):
        super().__init__()
        self.fs = fs
        self.attr_timeout = attr_timeout
        # how this mount moves bytes ("transport", for s4fs status), kept current here
        self.info: dict = info if info is not None else {}
        self._limiter = trio.CapacityLimiter(workers)
        self._lock = threading.Lock()
        self._paths: dict[int, str] = {pyfuse3.ROOT_INODE: ""}
        self._inodes: dict[str, int] = {"": pyfuse3.ROOT_INODE}
        self._next_inode = pyfuse3.ROOT_INODE + 1
        self._handles: dict[int, object] = {}
        self._handle_locks: dict[int, trio.Lock] = {}
        self._fh_inodes: dict[int, int] = {}
        self._ns = _NamespaceLock()
        self._dropping: set[threading.Thread] = set()   # kernel invalidations under way
        self._next_fh = 1
        # files appear owned by this user (the training job's, when the daemon runs as a
        # service user); permissions are then checked by the kernel (default_permissions)
        self._uid = os.getuid() if uid is None else uid
        self._gid = os.getgid() if gid is None else gid
        # files whose path is gone (unlinked, renamed over) but still open: the kernel
        # asks their attributes by inode (fstat, reads) until the last close
        self._open_nodes: dict[int, tuple[object, int]] = {}    # inode -> (node, opens)
        # passthrough: the backing file the kernel holds per inode, while any open uses
        # it (the kernel allows one per inode, and no cached open beside it)
        self._backing: dict[int, _Backing] = {}                  # inode -> its backing
        self._fh_backing: dict[int, int] = {}                    # fh -> inode
        fs.on_invalidate = self._invalidate

    # --- plumbing ------------------------------------------------------------------

    async def _run(self, fn, *args, **kwargs):
        """The one route for blocking work off the trio loop."""
        return await trio.to_thread.run_sync(functools.partial(fn, *args, **kwargs),
                                             limiter=self._limiter)

    def _path(self, inode: int) -> str:
        try:
            return self._paths[inode]
        except KeyError:
            raise pyfuse3.FUSEError(errno.ENOENT) from None

    def _child(self, parent: int, name: bytes) -> str:
        base = self._path(parent)
        n = os.fsdecode(name)
        if n == ".":
            return base
        if n == "..":
            return keys.parent(base)
        return f"{base}/{n}" if base else n

    def _inode(self, path: str) -> int:
        with self._lock:
            ino = self._inodes.get(path)
            if ino is None:
                ino = self._next_inode
                self._next_inode += 1
                self._inodes[path] = ino
                self._paths[ino] = path
            return ino

    def _entry(self, a: Attr, inode: int | None = None) -> pyfuse3.EntryAttributes:
        e = pyfuse3.EntryAttributes()
        e.st_ino = self._inode(a.path) if inode is None else inode
        e.st_mode = a.mode if a.mode & 0o170000 else (st.S_IFDIR if a.is_dir else st.S_IFREG) | a.mode
        e.st_nlink = 2 if a.is_dir else 1
        e.st_uid, e.st_gid = self._uid, self._gid
        e.st_size = a.size
        e.st_blksize = 1 << 20
        e.st_blocks = (a.stored if a.stored else a.size) // 512 + 1 if a.size else 0
        e.st_atime_ns, e.st_mtime_ns, e.st_ctime_ns = a.times_ns()
        e.attr_timeout = self.attr_timeout
        e.entry_timeout = self.attr_timeout
        return e

    def _new_fh(self, handle, inode: int | None = None) -> int:
        with self._lock:
            fh = self._next_fh
            self._next_fh += 1
            self._handles[fh] = handle
            if inode is not None:
                self._fh_inodes[fh] = inode
            self._handle_locks[fh] = trio.Lock()
            return fh

    def _moved(self, old: str, new: str) -> None:
        with self._lock:
            for path in [p for p in self._inodes if p == old or p.startswith(old + "/")]:
                ino = self._inodes.pop(path)
                np_ = new + path[len(old):]
                stale = self._inodes.pop(np_, None)
                if stale is not None and stale != ino:
                    self._paths.pop(stale, None)
                self._inodes[np_] = ino
                self._paths[ino] = np_

    def _dropped(self, path: str) -> None:
        with self._lock:
            ino = self._inodes.pop(path, None)
            if ino is not None:
                self._paths.pop(ino, None)

    # --- metadata ------------------------------------------------------------------

    @_fuse_errors
    @_namespace("shared")
    async def lookup(self, parent_inode, name, ctx=None):
        path = self._child(parent_inode, name)
        return self._entry(await self._run(self.fs.stat, path))

    @_fuse_errors
    @_namespace("shared")
    async def getattr(self, inode, ctx=None):
        path = self._paths.get(inode)
        if path is None:
            held = self._open_nodes.get(inode)
            if held is None:
                raise pyfuse3.FUSEError(errno.ENOENT)
            e = self._entry(await self._run(self.fs.node_attr, held[0]), inode)
            e.st_nlink = 0                 # unlinked (or renamed over) and still open
            return e
        return self._entry(await self._run(self.fs.stat, path))

    @_fuse_errors
    @_namespace("shared")
    async def setattr(self, inode, attr, fields, fh, ctx):
        path = self._paths.get(inode)
        gone = self._open_nodes.get(inode) if path is None else None
        if path is None and gone is None:
            raise pyfuse3.FUSEError(errno.ENOENT)
        kw = {}
        if fields.update_size:
            kw["size"] = attr.st_size
        if fields.update_mode:
            kw["mode"] = attr.st_mode
        if fields.update_mtime:
            kw["mtime_ns"] = attr.st_mtime_ns
        if fields.update_atime:               # the kernel never sends one for a read
            kw["atime_ns"] = attr.st_atime_ns
        handle = self._handles.get(fh) if fh is not None else None
        if kw:
            if not isinstance(handle, WriteHandle) or \
                    not await self._run(handle.set_attrs, **kw):
                if gone is not None:
                    # unlinked while open, changed through no descriptor of its writer:
                    # nothing of it is stored any more (as on a local disk, it is lost
                    # at the last close)
                    raise pyfuse3.FUSEError(errno.ENOENT)
                await self._run(self.fs.set_attrs, path, **kw)
        if gone is not None:
            return await self.getattr(inode)
        return self._entry(await self._run(self.fs.stat, path))

    @_fuse_errors
    async def opendir(self, inode, ctx):
        path = self._path(inode)
        names = await self._run(self.fs.listdir, path)
        return self._new_fh(("dir", path, names))

    @_fuse_errors
    @_namespace("shared")
    async def readdir(self, fh, start_id, token):
        _, path, names = self._handles[fh]
        entries = [(".", path), ("..", keys.parent(path))] + \
                  [(n, f"{path}/{n}" if path else n) for n in names]
        for i in range(start_id, len(entries)):
            name, p = entries[i]
            try:
                a = await self._run(self.fs.stat, p)
            except S4Error:
                continue             # vanished since opendir
            if not pyfuse3.readdir_reply(token, os.fsencode(name), self._entry(a), i + 1):
                return

    @_fuse_errors
    async def releasedir(self, fh):
        self._forget_fh(fh)

    @_fuse_errors
    async def mkdir(self, parent_inode, name, mode, ctx):
        path = self._child(parent_inode, name)
        await self._run(self.fs.mkdir, path, mode)
        return self._entry(await self._run(self.fs.stat, path))

    @_fuse_errors
    @_namespace("exclusive")
    async def rmdir(self, parent_inode, name, ctx):
        path = self._child(parent_inode, name)
        await self._run(self.fs.rmdir, path)
        self._dropped(path)

    @_fuse_errors
    @_namespace("exclusive")
    async def unlink(self, parent_inode, name, ctx):
        path = self._child(parent_inode, name)
        await self._run(self.fs.unlink, path)
        self._dropped(path)

    @_fuse_errors
    @_namespace("exclusive")
    async def rename(self, parent_inode_old, name_old, parent_inode_new, name_new, flags, ctx):
        if flags & pyfuse3.RENAME_EXCHANGE:
            raise pyfuse3.FUSEError(errno.EINVAL)
        old = self._child(parent_inode_old, name_old)
        new = self._child(parent_inode_new, name_new)
        await self._run(self.fs.rename, old, new,
                        noreplace=bool(flags & pyfuse3.RENAME_NOREPLACE))
        self._moved(old, new)

    @_fuse_errors
    async def statfs(self, ctx):
        d = await self._run(self.fs.statfs)
        s = pyfuse3.StatvfsData()
        s.f_bsize = s.f_frsize = d["bsize"]
        s.f_blocks, s.f_bfree, s.f_bavail = d["blocks"], d["bfree"], d["bfree"]
        s.f_files, s.f_ffree, s.f_favail = d["files"], d["ffree"], d["ffree"]
        s.f_namemax = d["namemax"]
        return s

    async def forget(self, inode_list):
        pass    # inode numbers stay stable for the life of the mount

    # --- files ---------------------------------------------------------------------

    @_fuse_errors
    @_namespace("shared")
    async def open(self, inode, flags, ctx):
        path = self._path(inode)
        acc = flags & os.O_ACCMODE
        if acc == os.O_RDONLY:
            handle = await self._run(self.fs.open_read, path)
            try:
                bid = self._backing_to_read(inode, handle)     # counts the open too
            except BaseException:
                handle.release()
                raise
            if bid:
                # the kernel reads the file's spool or local copy itself (no page cache
                # of the mount's own beside it)
                fh = self._new_fh(handle, inode)
                self._fh_backing[fh] = inode
                return pyfuse3.FileInfo(fh=fh, keep_cache=False, backing_id=bid)
            if not handle.keep_cache:
                # the kernel's cached attributes may be another version's (another
                # mount's commit, seen by this open first): it asks again before use
                await trio.to_thread.run_sync(_forget_attributes, inode)
            # the core says whether the kernel's pages are the version this open reads
            return pyfuse3.FileInfo(fh=self._new_fh(handle, inode),
                                    keep_cache=handle.keep_cache)
        # create=True: the kernel may still hold an entry for a file whose first save
        # failed (never committed); opening it for writing starts it afresh
        handle = await self._run(self.fs.open_write, path,
                                 truncate=bool(flags & os.O_TRUNC), create=True)
        bid = await self._run(self._backing_for, inode, handle)   # counts the open too
        fh = self._new_fh(handle, inode)
        if bid:
            self._fh_backing[fh] = inode
            return pyfuse3.FileInfo(fh=fh, keep_cache=False, backing_id=bid)
        return pyfuse3.FileInfo(fh=fh)

    @_fuse_errors
    @_namespace("shared")
    async def create(self, parent_inode, name, mode, flags, ctx):
        path = self._child(parent_inode, name)
        handle = await self._run(self.fs.open_write, path, truncate=True, create=True,
                                 exclusive=bool(flags & os.O_EXCL), mode=mode)
        entry = self._entry(await self._run(self.fs.stat, path))
        bid = await self._run(self._backing_for, entry.st_ino, handle)
        fh = self._new_fh(handle, entry.st_ino)
        if bid:
            self._fh_backing[fh] = entry.st_ino
            return pyfuse3.FileInfo(fh=fh, keep_cache=False, backing_id=bid), entry
        return pyfuse3.FileInfo(fh=fh), entry

    @_fuse_errors
    async def read(self, fh, off, size):
        handle = self._handles[fh]
        if isinstance(handle, NodeReader):
            # bytes already in the page cache (a file just written, read back): read
            # them right here, without the hop to a thread and back
            data = handle.read_now(off, size)
            if data is not None:
                return data
        return await self._run(handle.read, off, size)

    @_fuse_errors
    async def write(self, fh, off, buf):
        handle = self._handles[fh]
        lock = self._handle_locks[fh]
        if not lock.locked():
            # nothing queued before it: land the bytes in the spool right here, without
            # the hop to a thread and back (a pwrite into the page cache), unless the
            # handle is busy (a commit) — then wait in line like any other request
            n = handle.write_now(off, buf)
            if n is not None:
                return n
        async with lock:                            # FIFO: keeps writes in request order
            return await self._run(handle.write, off, buf)

    @_fuse_errors
    async def flush(self, fh):
        handle = self._handles[fh]
        if isinstance(handle, WriteHandle):
            try:
                async with self._handle_locks[fh]:
                    await self._run(handle.flush)
            finally:
                await self._settle()

    @_fuse_errors
    async def fsync(self, fh, datasync):
        handle = self._handles[fh]
        if isinstance(handle, WriteHandle):
            try:
                async with self._handle_locks[fh]:
                    await self._run(handle.fsync)
            finally:
                await self._settle()

    @_fuse_errors
    async def release(self, fh):
        handle = self._handles.get(fh)
        try:
            if handle is not None:
                async with self._handle_locks[fh]:
                    await self._run(handle.release)
        finally:
            self._forget_fh(fh)
            await self._settle()

    # --- open files and the kernel's page cache ------------------------------------

    def _hold(self, inode: int, node) -> None:
        """A descriptor of ``node`` is open under ``inode``."""
        with self._lock:
            self._hold_locked(inode, node)

    def _hold_locked(self, inode: int, node) -> None:
        if node is None:
            return
        node.cache_key = inode
        _, opens = self._open_nodes.get(inode, (node, 0))
        self._open_nodes[inode] = (node, opens + 1)

    def _let_go(self, inode: int) -> None:
        with self._lock:
            held = self._open_nodes.get(inode)
            if held is None:
                return
            if held[1] <= 1:
                del self._open_nodes[inode]
            else:
                self._open_nodes[inode] = (held[0], held[1] - 1)

    def _invalidate(self, node, gone: bool) -> None:
        """The core says the kernel's pages of ``node`` may not be its bytes: drop
        them, and when the file is gone (a failed first save), its name, so that the
        next open creates it instead of failing on the stale entry. From a thread of its
        own: the kernel waits for pages that reads in flight hold, and those reads need
        this daemon to answer."""
        inode = node.cache_key
        if inode is None:
            return
        entry = None
        if gone:
            with self._lock:
                parent = self._inodes.get(keys.parent(node.path))
            if parent is not None:
                entry = (parent, os.fsencode(keys.basename(node.path)))

        def drop():
            try:
                pyfuse3.invalidate_inode(inode, attr_only=False)
                if entry is not None:
                    pyfuse3.invalidate_entry(*entry)
            except (OSError, pyfuse3.FUSEError) as exc:   # gone from the kernel already
                log.debug("invalidating inode %d: %s", inode, exc)
        t = threading.Thread(target=drop, daemon=True, name="s4fs-invalidate")
        with self._lock:      # started before _settle can see it (it joins what it sees)
            t.start()
            self._dropping.add(t)

    async def _settle(self) -> None:
        """Wait for the kernel to have dropped what the core asked so far (before a
        close() or fsync() that failed, or committed, returns to the caller)."""
        with self._lock:
            pending, self._dropping = self._dropping, set()
        if pending:
            await trio.to_thread.run_sync(lambda: [t.join() for t in pending])

    def _forget_fh(self, fh) -> None:
        with self._lock:
            self._handles.pop(fh, None)
            self._handle_locks.pop(fh, None)
            inode = self._fh_inodes.pop(fh, None)
            backed = self._fh_backing.pop(fh, None)
        if inode is not None:
            self._let_go(inode)
        if backed is not None:
            self._drop_backing(backed)

    # --- FUSE passthrough --------------------------------------------------------------

    def set_transport(self, how: str) -> None:
        """How this mount moves bytes, for ``s4fs status``, /healthz and /metrics:
        "FUSE passthrough (...)" or "FUSE requests (why)"."""
        self.info["transport"] = how
        self.info["passthrough"] = how.startswith("FUSE passthrough")
        metrics.set_passthrough(self.info["passthrough"])

    def _backing_for(self, inode: int, handle) -> int:
        """A write open of ``inode``, counted as open: the backing id of its spool for
        the kernel, or 0 to stay on write requests (passthrough off, a writer already on
        requests, readers open with the kernel's page cache, or the kernel refused).
        Where the kernel already passes the inode through to a file (readers hold it),
        that file becomes the save's spool, written in place as on a local disk.

        The choice and the count are one step under the adapter's lock: two opens of one
        inode deciding at once would otherwise both find it free and ask the kernel for
        two backing files, or one for a backing file beside a cached open (it answers
        ``EIO``)."""
        node = handle.node
        if not self.enable_passthrough:
            self._hold(inode, node)
            return 0
        bid = 0
        with self._lock:
            held = self._backing.get(inode)
            if held is not None:
                held.opens += 1           # it stays registered while this open uses it
            elif not self._open_nodes.get(inode, (None, 0))[1] and handle.refs <= 1:
                fd = handle.spool.dup()
                bid = self._register(fd, handle.path, "stays on write requests")
                if bid:
                    self._backing[inode] = _Backing(bid, fd, handle)
            self._hold_locked(inode, node)
        if held is not None:
            if held.handle is handle:     # another descriptor of the same save
                return held.id
            try:
                return self._take_over(held, handle)
            except BaseException:
                self._drop_backing(inode)
                self._let_go(inode)
                # a new save that never starts: the file stays as it is
                if handle.refs <= 1:
                    handle.abort()
                else:
                    handle.release()
                raise
        if bid:
            handle.written_behind()
            log.info("%s: written through FUSE passthrough (backing id %d)", handle.path,
                     bid)
        return bid

    def _register(self, fd: int, path: str, otherwise: str) -> int:
        """The backing id of the file open at ``fd`` (the caller's now), or 0 where the
        kernel refuses (``fd`` closed, the log says what happens ``otherwise``). Where
        passthrough was not asked for and the kernel cannot do it at all (too old, not
        built with it, not root), the mount stops asking."""
        try:
            return _register_backing(fd)
        except OSError as exc:
            os.close(fd)
            if self.passthrough_optional and exc.errno in _NO_PASSTHROUGH:
                self.enable_passthrough = False
                why = (f"{exc}: the kernel needs Linux >= 6.9 built with "
                       f"CONFIG_FUSE_PASSTHROUGH, and root")
                log.warning("FUSE passthrough is not available here (%s); this mount "
                            "reads and writes through FUSE requests", why)
                self.set_transport(f"FUSE requests (FUSE passthrough refused: {why})")
            else:
                log.warning("FUSE passthrough refused (%s): %s %s", exc, path, otherwise)
            return 0

    def _take_over(self, held: _Backing, handle: WriteHandle) -> int:
        """A save of an inode the kernel passes through to ``held``'s file (readers of
        the last version hold it): that file becomes the new spool — out of the decoded
        cache, truncated if the open truncates — and readers see the new bytes land, as
        on a local disk. Refused (EBUSY, nothing changed) where the file is not the
        version the save starts from, or no longer named (docs/SEMANTICS.md)."""
        truncate = handle.spool.size == 0
        with held.lock:
            version = held.holds()
            name = None
            if not held.writing() and (truncate or (
                    version is not None and handle.committed_id() == version)):
                name = self._out_of_cache(held, version)
            if name is not None:
                handle.use_spool(name, truncate=truncate)
                handle.written_behind()
                with self._lock:
                    held.handle, held.version, held.released = handle, None, False
                    held.name = None          # the spool's now: the save decides its fate
        if name is None:
            raise self._busy(handle.path)
        log.info("%s: written through FUSE passthrough in place of the copy its readers "
                 "hold (backing id %d)", handle.path, held.id)
        return held.id

    def _out_of_cache(self, held: _Backing, version: str | None) -> str | None:
        """``held``'s file under a spool name of its own: moved out of the decoded cache
        (where it is ``version``'s copy), or where an earlier move left it; None where
        it has no name any more."""
        st = os.fstat(held.fd)
        if held.name is not None:
            try:
                if os.path.samestat(os.stat(held.name), st):
                    return held.name
            except OSError:
                pass
        if self.fs.decoded is None or version is None:
            return None
        return self.fs.decoded.take(version, st, fresh_spool_name(self.fs.spool_dir))

    def _backing_to_read(self, inode: int, handle) -> int:
        """A read open of ``inode``, counted as open: the backing id the kernel reads it
        through, or 0 for the page cache. A file passed through already is read through
        the same file (its spool while it is saved, or the copy of its version — brought
        to the version this open reads if the file changed another way); a committed
        version kept whole on local disk is passed through when no cached open is in
        the way. One step under the adapter's lock, as in :meth:`_backing_for`."""
        node = handle.node
        if not self.enable_passthrough:
            self._hold(inode, node)
            return 0
        local, version = handle.local_file(), handle.version   # outside the lock
        bid = 0
        with self._lock:
            held = self._backing.get(inode)
            if held is not None:
                held.opens += 1           # it stays registered while this open uses it
            elif local is not None and not self._open_nodes.get(inode, (None, 0))[1]:
                fd = os.dup(local)
                bid = self._register(fd, handle.path, "is read through the daemon")
                if bid:
                    self._backing[inode] = _Backing(bid, fd, None, version)
            self._hold_locked(inode, node)
        if held is None:
            if bid:
                log.info("%s: read through FUSE passthrough (backing id %d)", handle.path,
                         bid)
            return bid
        try:
            self._refresh(held, handle)
        except BaseException:
            self._drop_backing(inode)
            self._let_go(inode)
            raise
        return held.id

    def _refresh(self, held: _Backing, handle) -> None:
        """Bring ``held``'s file to the version ``handle`` reads, where the file changed
        without going through it (a truncate by path, another mount's commit, a failed
        save): the kernel takes no other file for the inode while readers hold this one,
        so it is rewritten in place — those readers see the new version, as readers of
        a local disk see a change — and kept as that version's local copy."""
        with held.lock:
            version = handle.version      # None: a save on requests, or one accepted
            if held.writing() or (version is not None and held.holds() == version):
                return
            name = self._out_of_cache(held, held.holds())
            fd = os.open(f"/proc/self/fd/{held.fd}", os.O_RDWR)
            try:
                size, pos = handle.size, 0
                while pos < size:
                    data = handle.read(pos, min(8 << 20, size - pos))
                    if not data:
                        break
                    os.pwrite(fd, data, pos)
                    pos += len(data)
                os.ftruncate(fd, pos)
            finally:
                os.close(fd)
            with self._lock:
                held.handle, held.version, held.name = None, version, name
            if name is not None and version is not None and self.fs.decoded is not None \
                    and self.fs.decoded.adopt_file(version, name, pos):
                held.name = None          # back in the cache, as that version's copy
        log.info("%s: the file its readers hold through FUSE passthrough now holds "
                 "version %s", handle.path, version or "being written")

    @staticmethod
    def _busy(path: str) -> pyfuse3.FUSEError:
        """The kernel passes this inode through to a file that cannot become the new
        save's spool (not the version the save starts from, or gone from the decoded
        cache): it takes no other backing file and no open without one."""
        log.warning("%s: cannot be saved while readers hold an older copy of it through "
                    "FUSE passthrough: close them, or mount without --passthrough", path)
        return pyfuse3.FUSEError(errno.EBUSY)

    def _drop_backing(self, inode: int) -> None:
        with self._lock:
            held = self._backing.get(inode)
            if held is None:
                return
            held.opens -= 1
            if held.handle is not None and held.handle.refs <= 0 and not held.released:
                held.released = True
                log.info("%s: the passthrough save's descriptors are closed (%d other "
                         "opens keep its spool)", held.handle.path, held.opens)
            if held.opens > 0:
                return
            del self._backing[inode]
        try:
            _unregister_backing(held.id)
        except OSError as exc:
            log.warning("dropping backing id %d of inode %d: %s", held.id, inode, exc)
        os.close(held.fd)
        if held.name is not None:         # a copy no cache keeps
            try:
                os.unlink(held.name)
            except OSError:
                pass
