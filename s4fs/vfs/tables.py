"""The core's tables: inode numbers ↔ paths, file handles, open counts, and the
namespace lock that keeps a rename or unlink atomic with respect to opens."""

from __future__ import annotations

import contextlib
import threading

import trio

from s4fs import keys
from s4fs.errors import NotFound

ROOT_INODE = 1          # the kernel's number for the mount's root folder


class Tables:
    """Inodes, handles and open counts of one mount, under one lock (``lock``: a
    ``threading.Lock``, since the blocking halves of requests run on threads).

    An inode number stands for a path until the path is unlinked or renamed away; it is
    never reused for the life of the mount (the kernel's ``forget`` is ignored). A file
    whose path is gone but which is still open keeps its node here, found by inode, until
    its last close."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self._paths: dict[int, str] = {ROOT_INODE: ""}
        self._inodes: dict[str, int] = {"": ROOT_INODE}
        self._next_inode = ROOT_INODE + 1
        self._handles: dict[int, object] = {}
        self._handle_locks: dict[int, trio.Lock] = {}
        self._fh_inodes: dict[int, int] = {}
        self._next_fh = 1
        self._open_nodes: dict[int, tuple[object, int]] = {}    # inode -> (node, opens)

    # --- inodes and paths ------------------------------------------------------------

    def path(self, inode: int) -> str:
        """The path ``inode`` stands for; NotFound where it stands for none (any more)."""
        try:
            return self._paths[inode]
        except KeyError:
            raise NotFound(f"inode {inode} names no file (any more)") from None

    def path_or_none(self, inode: int) -> str | None:
        return self._paths.get(inode)

    def child(self, parent: int, name: str) -> str:
        """The path of ``name`` in the folder ``parent`` (``.`` and ``..`` resolved)."""
        base = self.path(parent)
        if name == ".":
            return base
        if name == "..":
            return keys.parent(base)
        return f"{base}/{name}" if base else name

    def inode(self, path: str) -> int:
        """The inode number of ``path``: the one it has, or a new one."""
        with self.lock:
            return self.inode_locked(path)

    def inode_locked(self, path: str) -> int:
        ino = self._inodes.get(path)
        if ino is None:
            ino = self._next_inode
            self._next_inode += 1
            self._inodes[path] = ino
            self._paths[ino] = path
        return ino

    def known_inode(self, path: str) -> int | None:
        """The inode number ``path`` has, without making one."""
        with self.lock:
            return self._inodes.get(path)

    def moved(self, old: str, new: str) -> None:
        """``old`` (a file, or a folder with everything under it) is now ``new``: the
        inodes follow their files; an inode that ``new`` stood for names nothing now."""
        with self.lock:
            for path in [p for p in self._inodes if p == old or p.startswith(old + "/")]:
                ino = self._inodes.pop(path)
                np_ = new + path[len(old):]
                stale = self._inodes.pop(np_, None)
                if stale is not None and stale != ino:
                    self._paths.pop(stale, None)
                self._inodes[np_] = ino
                self._paths[ino] = np_

    def dropped(self, path: str) -> None:
        """``path`` was unlinked or removed: its inode names nothing now."""
        with self.lock:
            ino = self._inodes.pop(path, None)
            if ino is not None:
                self._paths.pop(ino, None)

    # --- handles ---------------------------------------------------------------------

    def new_fh(self, handle, inode: int | None = None) -> int:
        with self.lock:
            fh = self._next_fh
            self._next_fh += 1
            self._handles[fh] = handle
            if inode is not None:
                self._fh_inodes[fh] = inode
            self._handle_locks[fh] = trio.Lock()
            return fh

    def handle(self, fh: int):
        try:
            return self._handles[fh]
        except KeyError:
            raise NotFound(f"file handle {fh} is not open") from None

    def handle_or_none(self, fh: int | None):
        return self._handles.get(fh) if fh is not None else None

    def handle_lock(self, fh: int) -> trio.Lock:
        """The lock that keeps a handle's requests in order (writes, flush, release)."""
        return self._handle_locks[fh]

    def forget_fh(self, fh: int) -> int | None:
        """Drop handle ``fh``; the inode it was opened under, if any (the caller lets
        go of that open)."""
        with self.lock:
            self._handles.pop(fh, None)
            self._handle_locks.pop(fh, None)
            return self._fh_inodes.pop(fh, None)

    def open_handles(self) -> int:
        return len(self._handles)

    # --- open counts -----------------------------------------------------------------

    def hold(self, inode: int, node) -> None:
        """A descriptor of ``node`` is open under ``inode``."""
        with self.lock:
            self.hold_locked(inode, node)

    def hold_locked(self, inode: int, node) -> None:
        if node is None:
            return
        node.cache_key = inode
        _, opens = self._open_nodes.get(inode, (node, 0))
        self._open_nodes[inode] = (node, opens + 1)

    def opens_locked(self, inode: int) -> int:
        """How many descriptors are open under ``inode`` (under ``lock``)."""
        return self._open_nodes.get(inode, (None, 0))[1]

    def open_node(self, inode: int):
        """The node open under ``inode``, or None."""
        held = self._open_nodes.get(inode)
        return held[0] if held is not None else None

    def let_go(self, inode: int) -> None:
        with self.lock:
            held = self._open_nodes.get(inode)
            if held is None:
                return
            if held[1] <= 1:
                del self._open_nodes[inode]
            else:
                self._open_nodes[inode] = (held[0], held[1] - 1)


class NamespaceLock:
    """Renames and unlinks change which file a path (and so an inode) stands for, in the
    core's store view and in :class:`Tables`; opens and attribute requests must see both
    sides of that change or neither (an open racing a rename over its path would read
    the new file under the old inode, whose cached size is the old file's). Shared for
    those, exclusive for the changes; no waiting writer blocks a new reader, so a
    request may nest shared use."""

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
