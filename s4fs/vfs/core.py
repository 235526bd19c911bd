"""The filesystem as the kernel sees it, with no FUSE in it: :class:`Vfs`.

Each method is one FUSE operation in plain terms — inode numbers and names in, plain
data (:class:`Entry`, :class:`Opened`) or bytes out, :class:`~s4fs.errors.S4Error` for
what fails. ``s4fs.mount`` translates pyfuse3's requests into these calls and their
results into pyfuse3's replies; what only the kernel can do goes through the
:class:`~s4fs.vfs.port.KernelPort` this core is given. The blocking halves (the store,
the spool, the codec) run on threads through :meth:`Vfs.run`, the one route off the
trio loop.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import os
import stat as st

import trio

from s4fs import keys
from s4fs import metrics
from s4fs.errors import InvalidArgument, NotFound, S4Error
from s4fs.fs import Attr, Filesystem, WriteHandle
from s4fs.read import NodeReader
from s4fs.vfs.coherence import Coherence
from s4fs.vfs.passthrough import Passthrough
from s4fs.vfs.port import KernelPort
from s4fs.vfs.push import Pushes
from s4fs.vfs.tables import NamespaceLock, Tables

log = logging.getLogger("s4fs.mount")


@dataclasses.dataclass
class Entry:
    """A file's or folder's attributes as the kernel is told them."""
    inode: int
    mode: int
    nlink: int
    uid: int
    gid: int
    size: int
    blocks: int
    atime_ns: int
    mtime_ns: int
    ctime_ns: int
    timeout: float                    # how long the kernel may keep the entry and attrs
    blksize: int = 1 << 20


@dataclasses.dataclass
class Opened:
    """An open file: its handle number, the backing id the kernel passes it through to
    (0: none, requests), and whether the kernel may keep its cached pages."""
    fh: int
    backing_id: int = 0
    keep_cache: bool = False


def _namespace(kind: str):
    """Run a request under the namespace lock (``"shared"`` or ``"exclusive"``)."""
    def wrap(fn):
        @functools.wraps(fn)
        async def wrapper(self, *args, **kwargs):
            async with getattr(self.ns, kind)():
                return await fn(self, *args, **kwargs)
        return wrapper
    return wrap


class Vfs:
    """One mount's filesystem over ``fs``. ``uid``/``gid``: the owner every file shows
    (the training job's user, where the daemon runs as a service user); ``workers``:
    requests whose blocking half runs at once; ``info``: how the mount moves bytes (the
    ``transport``, kept current here for ``s4fs status``)."""

    def __init__(self, fs: Filesystem, port: KernelPort, *, workers: int = 16,
                 attr_timeout: float = 1.0, uid: int | None = None,
                 gid: int | None = None, info: dict | None = None) -> None:
        self.fs = fs
        self.port = port
        self.attr_timeout = attr_timeout
        self.info: dict = info if info is not None else {}
        self.uid = os.getuid() if uid is None else uid
        self.gid = os.getgid() if gid is None else gid
        self.tables = Tables()
        self.ns = NamespaceLock()
        self.passthrough = Passthrough(fs, self.tables, port, self._passthrough_refused)
        # a cold file read while it is decoded, its bytes pushed into the kernel's pages
        self.pushes = Pushes(port, enabled=fs.cfg.cold_reads == "push")
        self._fh_pushing: dict[int, int] = {}                    # fh -> inode
        self._limiter = trio.CapacityLimiter(workers)
        self._fh_backing: dict[int, int] = {}                    # fh -> inode
        # what the kernel is told to forget, and the wait for it
        self.coherence = Coherence(port, self.tables, self.pushes)
        self.settle = self.coherence.settle
        fs.on_invalidate = self.coherence.invalidate

    async def run(self, fn, *args, **kwargs):
        """The one route for blocking work off the trio loop."""
        return await trio.to_thread.run_sync(functools.partial(fn, *args, **kwargs),
                                             limiter=self._limiter)

    def entry(self, a: Attr, inode: int | None = None) -> Entry:
        mode = a.mode if a.mode & 0o170000 else \
            (st.S_IFDIR if a.is_dir else st.S_IFREG) | a.mode
        times = a.times_ns()
        return Entry(
            inode=self.tables.inode(a.path) if inode is None else inode,
            mode=mode, nlink=2 if a.is_dir else 1,
            uid=self.uid if a.uid is None else a.uid,
            gid=self.gid if a.gid is None else a.gid,
            size=a.size,
            blocks=(a.stored if a.stored else a.size) // 512 + 1 if a.size else 0,
            atime_ns=times[0], mtime_ns=times[1], ctime_ns=times[2],
            timeout=self.attr_timeout)

    # --- how the mount moves bytes ---------------------------------------------------

    def set_transport(self, how: str) -> None:
        """How this mount moves bytes, for ``s4fs status``, /healthz and /metrics:
        "FUSE passthrough (...)" or "FUSE requests (why)"."""
        self.info["transport"] = how
        self.info["passthrough"] = how.startswith("FUSE passthrough")
        metrics.set_passthrough(self.info["passthrough"])

    def _passthrough_refused(self, why: str) -> None:
        self.set_transport(f"FUSE requests (FUSE passthrough refused: {why})")

    # --- metadata ----------------------------------------------------------------------

    @_namespace("shared")
    async def lookup(self, parent: int, name: str) -> Entry:
        path = self.tables.child(parent, name)
        return self.entry(await self.run(self.fs.stat, path))

    @_namespace("shared")
    async def getattr(self, inode: int) -> Entry:
        path = self.tables.path_or_none(inode)
        if path is None:
            node = self.tables.open_node(inode)
            if node is None:
                raise NotFound(f"inode {inode} names no file (any more)")
            e = self.entry(await self.run(self.fs.node_attr, node), inode)
            e.nlink = 0                    # unlinked (or renamed over) and still open
            return e
        return self.entry(await self.run(self.fs.stat, path))

    @_namespace("shared")
    async def setattr(self, inode: int, changes: dict, fh: int | None) -> Entry:
        """``changes``: any of ``size``, ``mode``, ``mtime_ns``, ``atime_ns``, ``uid``,
        ``gid`` (the kernel checked who may change what: the mount's
        ``default_permissions``)."""
        path = self.tables.path_or_none(inode)
        gone = self.tables.open_node(inode) if path is None else None
        if path is None and gone is None:
            raise NotFound(f"inode {inode} names no file (any more)")
        handle = self.tables.handle_or_none(fh)
        # a truncate: no push of the bytes before may land in the inode's pages
        quiet = inode if "size" in changes else None
        if changes:
            if not isinstance(handle, WriteHandle) or \
                    not await self.run(self._quietly, quiet, handle.set_attrs,
                                       **self._owner(changes, handle)):
                if gone is not None:
                    # unlinked while open, changed through no descriptor of its writer:
                    # nothing of it is stored any more (as on a local disk, it is lost
                    # at the last close)
                    raise NotFound(f"inode {inode} was removed")
                await self.run(self._quietly, quiet, self.fs.set_attrs, path, **changes)
        if gone is not None:
            return await self.getattr(inode)
        return self.entry(await self.run(self.fs.stat, path))

    def _quietly(self, inode: int | None, fn, *args, **kwargs):
        """(A worker thread.) ``fn(*args, **kwargs)`` — a change to ``inode``'s bytes —
        with nothing pushing into its pages, and no pusher beginning, until it is done
        (s4fs.vfs.push)."""
        with self.pushes.quiet(inode):
            return fn(*args, **kwargs)

    def _owner(self, changes: dict, handle: WriteHandle) -> dict:
        """``changes`` for a write handle: ``uid`` / ``gid`` as its ``owner``."""
        if "uid" not in changes and "gid" not in changes:
            return changes
        out = {k: v for k, v in changes.items() if k not in ("uid", "gid")}
        uid, gid = handle.owner or (self.uid, self.gid)
        out["owner"] = (changes.get("uid", uid), changes.get("gid", gid))
        return out

    async def readlink(self, inode: int) -> bytes:
        return await self.run(self.fs.readlink, self.tables.path(inode))

    async def symlink(self, parent: int, name: str, target: bytes,
                      owner: tuple[int, int]) -> Entry:
        path = self.tables.child(parent, name)
        return self.entry(await self.run(self.fs.symlink, path, target,
                                         await self._inherit(parent, owner)))

    async def _inherit(self, parent: int, owner: tuple[int, int]) -> tuple[int, int]:
        """The owner of a new file or folder in ``parent``: its creator, in the
        folder's group where the folder has its set-group-ID bit (as on a local disk)."""
        folder = self.entry(await self.run(self.fs.stat, self.tables.path(parent)), parent)
        return (owner[0], folder.gid) if folder.mode & st.S_ISGID else owner

    async def opendir(self, inode: int) -> int:
        path = self.tables.path(inode)
        names = await self.run(self.fs.listdir, path)
        return self.tables.new_fh(("dir", path, names))

    async def readdir(self, fh: int, start: int):
        """The folder's entries from index ``start`` as ``(name, Entry, next index)``:
        an async generator under the namespace lock, each entry stat'ed as it is asked
        for (the caller stops when the kernel's buffer is full, and must close it:
        ``contextlib.aclosing``)."""
        async with self.ns.shared():
            _, path, names = self.tables.handle(fh)
            listing = [(".", path), ("..", keys.parent(path))] + \
                      [(n, f"{path}/{n}" if path else n) for n in names]
            for i in range(start, len(listing)):
                name, p = listing[i]
                try:
                    a = await self.run(self.fs.stat, p)
                except S4Error:
                    continue             # vanished since opendir
                yield name, self.entry(a), i + 1

    async def releasedir(self, fh: int) -> None:
        self._forget_fh(fh)

    async def mkdir(self, parent: int, name: str, mode: int,
                    owner: tuple[int, int] | None = None) -> Entry:
        path = self.tables.child(parent, name)
        if owner is not None:
            inherited = await self._inherit(parent, owner)
            if inherited != owner:                 # the set-group-ID bit passes down
                mode |= st.S_ISGID
            owner = inherited
        await self.run(self.fs.mkdir, path, mode, owner)
        return self.entry(await self.run(self.fs.stat, path))

    @_namespace("exclusive")
    async def rmdir(self, parent: int, name: str) -> None:
        path = self.tables.child(parent, name)
        await self.run(self.fs.rmdir, path)
        self.tables.dropped(path)

    @_namespace("exclusive")
    async def unlink(self, parent: int, name: str) -> None:
        path = self.tables.child(parent, name)
        await self.run(self.fs.unlink, path)
        self.tables.dropped(path)

    @_namespace("exclusive")
    async def rename(self, parent_old: int, name_old: str, parent_new: int,
                     name_new: str, *, noreplace: bool = False,
                     exchange: bool = False) -> None:
        if exchange:
            raise InvalidArgument("renaming with RENAME_EXCHANGE is not supported")
        old = self.tables.child(parent_old, name_old)
        new = self.tables.child(parent_new, name_new)
        await self.run(self.fs.rename, old, new, noreplace=noreplace)
        self.tables.moved(old, new)

    async def statfs(self) -> dict:
        return await self.run(self.fs.statfs)

    # --- files -------------------------------------------------------------------------

    async def open(self, inode: int, flags: int) -> Opened:
        if flags & os.O_ACCMODE != os.O_RDONLY:
            return await self._open_write(inode, flags)
        async with self.ns.shared():
            handle = await self.run(self.fs.open_read, self.tables.path(inode))
            if self._may_push(inode, handle):
                return await self._open_pushed(inode, handle)
            if not self.passthrough.wants_whole_copy(inode, handle):
                return await self._open_read(inode, handle)
        # a cold file, decoded whole onto local disk before the kernel reads that copy:
        # outside the namespace lock (seconds for a large file), so a rename or unlink
        # elsewhere on the mount, and the requests queued behind it, do not wait for it
        try:
            whole = await self.run(handle.decode_whole)
        except BaseException:
            handle.release()
            raise
        async with self.ns.shared():
            if whole:
                handle = await self.run(self._reopened, inode, handle)
            return await self._open_read(inode, handle)

    def _may_push(self, inode: int, handle) -> bool:
        """Whether a read open of ``inode`` reads a cold committed version whose decoded
        bytes are pushed into the kernel's pages as they land (s4fs.vfs.push): no local
        copy of it yet, no backing file serving the inode, no writer."""
        return self.pushes.enabled and handle.version is not None and \
            handle.local_file() is None and self.passthrough.backing(inode) is None

    async def _open_pushed(self, inode: int, handle) -> Opened:
        """(Under the namespace lock.) A cold file opened through the page cache, its
        decode ahead started and followed by pushes: the kernel's pages of the inode
        (another version's, if any) dropped first, so that the open keeps the pages
        pushed from then on."""
        opened = await self._open_read(inode, handle)
        if opened.backing_id or (opened.keep_cache and self.pushes.active(inode)):
            return opened                   # passed through after all; or pushed already
        pusher = await self.run(self.pushes.prepare, inode, handle)
        if pusher is None:
            return opened                   # not decoded ahead: read through requests
        if not opened.keep_cache:
            await trio.to_thread.run_sync(self.coherence.forget_pages, inode)
        with self.tables.lock:
            self._fh_pushing[opened.fh] = inode
        if await trio.to_thread.run_sync(self.pushes.begin, pusher,
                                         functools.partial(handle.reads_version,
                                                           handle.version)):
            opened.keep_cache = True
        return opened

    async def _open_read(self, inode: int, handle) -> Opened:
        """(Under the namespace lock.) The read open ``handle`` handed to the kernel:
        through passthrough where the policy says so, else through requests."""
        try:
            bid = self.passthrough.for_read(inode, handle)   # counts the open too
        except BaseException:
            handle.release()
            raise
        if bid:
            # the kernel reads the file's spool or local copy itself (no page cache
            # of the mount's own beside it) — and leaves the inode's pages as they
            # are, where an open through requests without keep_cache drops them.
            # Another descriptor (through requests, or an mmap) may hold pages of
            # the version before: dropped here, attributes with them, before this
            # open returns, as that open would have the kernel do
            if not handle.keep_cache:
                await trio.to_thread.run_sync(self.coherence.forget_pages, inode)
            return self._opened(handle, inode, bid)
        if not handle.keep_cache:
            # the kernel's cached attributes may be another version's (another
            # mount's commit, seen by this open first): it asks again before use; and
            # it drops the inode's pages at this open, so nothing may push the version
            # before into them after it
            await trio.to_thread.run_sync(self.coherence.forget_attributes, inode)
        # the core says whether the kernel's pages are the version this open reads
        return Opened(self.tables.new_fh(handle, inode), keep_cache=handle.keep_cache)

    def _reopened(self, inode: int, handle):
        """(A worker thread, under the namespace lock.) ``inode``'s file opened again
        once ``handle``'s version is whole on local disk, to read that copy — where the
        inode is still that file (not unlinked or renamed over meanwhile); else
        ``handle`` itself, which reads the version it opened as before."""
        try:
            again = self.fs.open_read(self.tables.path(inode))
        except NotFound:
            return handle
        except BaseException:
            handle.release()
            raise
        if again.node is not handle.node:
            again.release()
            return handle
        # the kernel was never told about the first open: its verdict on the inode's
        # pages (drop them) must reach it through this one
        again.keep_cache = again.keep_cache and handle.keep_cache
        handle.release()
        return again

    @_namespace("shared")
    async def _open_write(self, inode: int, flags: int) -> Opened:
        # create=True: the kernel may still hold an entry for a file whose first save
        # failed (never committed); opening it for writing starts it afresh. No push of
        # the version before may land in the pages the writer fills
        handle = await self.run(self._quietly, inode, self.fs.open_write,
                                self.tables.path(inode), truncate=bool(flags & os.O_TRUNC),
                                create=True)
        bid = await self.run(self.passthrough.for_write, inode, handle)   # counts it
        return self._opened(handle, inode, bid)

    @_namespace("shared")
    async def create(self, parent: int, name: str, mode: int, flags: int,
                     owner: tuple[int, int] | None = None) -> tuple[Opened, Entry]:
        path = self.tables.child(parent, name)
        if owner is not None:
            owner = await self._inherit(parent, owner)
        # a name the kernel thought gone may be a file pushed into: no more pushes
        handle = await self.run(self._quietly, self.tables.known_inode(path),
                                self.fs.open_write, path, truncate=True, create=True,
                                exclusive=bool(flags & os.O_EXCL), mode=mode, owner=owner)
        entry = self.entry(await self.run(self.fs.stat, path))
        bid = await self.run(self.passthrough.for_write, entry.inode, handle)
        return self._opened(handle, entry.inode, bid), entry

    def _opened(self, handle, inode: int, bid: int) -> Opened:
        fh = self.tables.new_fh(handle, inode)
        if bid:
            self._fh_backing[fh] = inode
        return Opened(fh, backing_id=bid)

    async def read(self, fh: int, off: int, size: int) -> bytes:
        handle = self.tables.handle(fh)
        if isinstance(handle, NodeReader):
            ticket = handle.ticket()           # the order requests came in (NodeReader)
            # bytes already in the page cache (a file just written, read back): read
            # them right here, without the hop to a thread and back
            data = handle.read_now(off, size, ticket)
            if data is not None:
                return data
            return await self.run(handle.read, off, size, ticket)
        return await self.run(handle.read, off, size)

    async def write(self, fh: int, off: int, buf) -> int:
        handle = self.tables.handle(fh)
        lock = self.tables.handle_lock(fh)
        if not lock.locked():
            # nothing queued before it: land the bytes in the spool right here, without
            # the hop to a thread and back (a pwrite into the page cache), unless the
            # handle is busy (a commit) — then wait in line like any other request
            n = handle.write_now(off, buf)
            if n is not None:
                return n
        async with lock:                            # FIFO: keeps writes in request order
            return await self.run(handle.write, off, buf)

    async def flush(self, fh: int) -> None:
        await self._commit_step(fh, "flush")

    async def fsync(self, fh: int) -> None:
        await self._commit_step(fh, "fsync")

    async def _commit_step(self, fh: int, step: str) -> None:
        handle = self.tables.handle(fh)
        if isinstance(handle, WriteHandle):
            try:
                async with self.tables.handle_lock(fh):
                    await self.run(getattr(handle, step))
            finally:
                await self.settle()

    async def release(self, fh: int) -> None:
        handle = self.tables.handle_or_none(fh)
        try:
            if handle is not None:
                async with self.tables.handle_lock(fh):
                    await self.run(handle.release)
        finally:
            self._forget_fh(fh)
            await self.settle()

    # --- open files and the kernel's page cache ----------------------------------------

    def _forget_fh(self, fh: int) -> None:
        inode = self.tables.forget_fh(fh)
        with self.tables.lock:
            backed = self._fh_backing.pop(fh, None)
            pushing = self._fh_pushing.pop(fh, None)
        if pushing is not None:           # read to its end, or given up: pushed enough
            self.pushes.stop(pushing, wait=False)
        if inode is not None:
            self.tables.let_go(inode)
        if backed is not None:
            self.passthrough.drop(backed)
