"""One file on this mount across its versions (what the kernel calls an inode), and the
descriptors reading it.

A descriptor reads the **file** it opened, not a version frozen at open time, because the
kernel keeps one page cache per inode, shared by every descriptor of it: if one
descriptor were served an older version than another, the cache would end up holding a
mixture of the two, and later opens would be served it (docs/SEMANTICS.md). So, as on a
local disk:

* an in-place overwrite on this mount (``O_TRUNC``, truncate, append, ``r+``) changes the
  file: every descriptor of it reads the new bytes as they land (the writer's spool);
* a newer version committed by another mount becomes the file's version when an open on
  this mount first sees it; descriptors opened earlier read it from then on (their
  earlier reads, and the kernel's pages, were of one version only: the open that saw the
  change tells the kernel to drop its pages);
* ``unlink`` or ``rename`` over the path **detach** the node: its descriptors keep
  reading the version they had, whole (its packs are pinned against garbage collection
  while any is open), and the path gets a new node.

What the kernel may keep cached is decided here too (:meth:`FileNode.open_verdict`): its
pages are known to be exactly one committed version (``kernel_id``) when this mount
wrote that version through the kernel and nothing else changed the file since.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import TYPE_CHECKING, Callable

if TYPE_CHECKING:
    from s4fs.manifest import Manifest

log = logging.getLogger(__name__)


class FileNode:
    """The identity of one file on this mount. Fields are guarded by the filesystem's
    open-files lock (``OpenFiles.lock``, :mod:`s4fs.openfiles`)."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.gen = 0                          # bumped when what its readers read changes
        self.version: Manifest | None = None  # the committed version (no writer spooling)
        self.writer = None                    # the in-place WriteHandle, while it lives
        self.detached = False                 # unlinked or replaced by a rename
        self.readers = 0                      # descriptors open for reading
        self.pin: str | None = None           # store key pinning ``version`` while detached
        self.kernel_id: str | None = None     # the version the kernel's pages are exactly
        self.read_while_written = False       # a reader reached us while a writer spooled
        self.cache_key = None                 # what the FUSE adapter calls it (its inode)

    def changed(self) -> None:
        """Readers must look again at what the file is (at their next read)."""
        self.gen += 1

    def open_verdict(self, content_id: str | None) -> bool:
        """An open is served ``content_id`` (None: bytes that are no committed version):
        whether the kernel may keep the pages it holds. From this open on the kernel's
        pages are filled from this content only (every descriptor reads it)."""
        keep = content_id is not None and self.kernel_id == content_id
        self.kernel_id = content_id
        return keep


class NodeReader:
    """A descriptor open for reading: reads its node's current content through a *view*
    (:class:`s4fs.read.ReadHandle` over the writer's spool, a local whole copy, or the
    store) and changes view when the node changes. Unknown attributes are the current
    view's (``manifest``, ``version``, ``size``, ...)."""

    def __init__(self, node: FileNode, view, gen: int, keep_cache: bool,
                 view_of: Callable[[FileNode], tuple[object | None, int]],
                 on_read: Callable[[FileNode], None],
                 on_release: Callable[[FileNode], None]) -> None:
        self.node = node
        self.keep_cache = keep_cache          # for the kernel, at open (s4fs.mount)
        self._view = view
        self._gen = gen
        self._view_of = view_of
        self._on_read = on_read
        self._on_release = on_release
        self._lock = threading.Lock()
        self._old: list = []                  # views left behind: released at the end
        # (view, when) of the file's bytes before an in-place truncation on this mount
        self._before: tuple | None = None
        self._released = False
        # requests in the order they came (ticket), and the view the latest-come of
        # those that chose one read: see _in_order
        self._tickets = 0
        self._latest: tuple[int, object | None] = (-1, None)

    def ticket(self) -> int:
        """(On the mount's event loop, as a read request comes.) The request's place in
        the order the kernel sent them: a ``pread`` the kernel splits into several
        requests sends them in offset order, and the threads that answer them may start
        in another."""
        self._tickets += 1
        return self._tickets

    def _in_order(self, ticket: int | None, view):
        """The view a request with ``ticket`` reads: ``view`` (the node's now), unless
        a request that came after it already read an older one — then that one, so that
        a ``pread`` spanning a change of version reads the old version up to a byte and
        the new one after it, never back again (as the kernel's pages of a local file
        being overwritten)."""
        if ticket is None:
            return view
        with self._lock:
            latest, seen = self._latest
            if ticket < latest and seen is not None:
                return seen
            self._latest = (ticket, view)
        return view

    def _current(self):
        if self.node.gen != self._gen:
            with self._lock:
                if self.node.gen != self._gen:
                    view, gen = self._view_of(self.node)
                    if view is not None and _shrinks(self._view, view):
                        # overwritten in place on this mount: see _past_end
                        self._before = (self._view, time.monotonic())
                    if view is not None:
                        if log.isEnabledFor(logging.INFO):
                            # to another size: the kernel sees it too (an mmap past the
                            # new end faults), so the log says so
                            was, now = _size(self._view), _size(view)
                            log.log(logging.DEBUG if was == now else logging.INFO,
                                    "%s: a reader moves from %s (%s bytes) to %s (%s bytes)",
                                    self.node.path, _name(self._view), was, _name(view), now)
                        # other threads may be inside the old view: release it at the end
                        self._old.append(self._view)
                        self._view = view
                    self._gen = gen
        return self._view

    def read(self, offset: int, size: int, ticket: int | None = None):
        view = self._in_order(ticket, self._current())
        self._on_read(self.node)
        data = view.read(offset, size)
        if len(data) < size and self._before is not None:
            return self._past_end(offset, size, data)
        return data

    def _past_end(self, offset: int, size: int, data):
        """A read past the end of a file just truncated on this mount (``O_TRUNC``,
        ``truncate``): the kernel sent it before it applied the truncation — after that
        it asks only for bytes below its new size, which the writer's bytes reach
        before the kernel grows it — and will drop the pages it fills. Answered with
        the bytes the file had there, as a local disk's read racing a truncate returns
        them: a short answer would have the kernel fill the pages with zeros and copy
        them out to that reader, bytes of neither version (docs/SEMANTICS.md)."""
        before, since = self._before
        if time.monotonic() - since > PAST_END_SECONDS:
            self._before = None
            return data
        start = offset + len(data)
        # the page holding the new end: a read the kernel sends now may ask for all of
        # it, and past the end it holds zeros (old bytes there would stay cached)
        page_end = -(-start // PAGE) * PAGE
        if offset + size <= page_end:
            return data
        try:
            rest = before.read_held(page_end, offset + size - page_end)
        except Exception:              # noqa: BLE001 - the old bytes are a courtesy
            return data
        if not rest:
            return data
        return bytes(data) + bytes(page_end - start) + bytes(rest)

    def read_now(self, offset: int, size: int, ticket: int | None = None):
        """``read`` when it cannot block: the node has not changed since the last read
        and its view has every byte asked for in the page cache; else None (then
        ``read``, from a thread, with the same ticket)."""
        if self.node.gen != self._gen:
            return None
        view = self._in_order(ticket, self._view)
        self._on_read(self.node)
        return view.read_now(offset, size)

    def readinto(self, offset: int, dest) -> int:
        view = self._current()
        self._on_read(self.node)
        return view.readinto(offset, dest)

    def reads_version(self, vid: str | None) -> bool:
        """Whether the file is still exactly committed version ``vid``: no writer has
        it, no other version was committed since (what a push of ``vid``'s bytes into
        the kernel's pages asks before it begins; s4fs.vfs.push)."""
        node = self.node
        m = node.version
        return vid is not None and node.writer is None and not node.detached and \
            m is not None and m.id == vid and node.gen == self._gen

    def release(self) -> None:
        with self._lock:
            if self._released:
                return
            self._released = True
            views, self._old = [*self._old, self._view], []
        for v in views:
            v.release()
        self._on_release(self.node)

    def __getattr__(self, name: str):
        if name.startswith("__"):
            raise AttributeError(name)
        return getattr(self._current(), name)


#: how long after an in-place truncation a read past the new end is answered with the
#: old bytes (the kernel applies a truncation within milliseconds of our answer)
PAST_END_SECONDS = 10.0
PAGE = 4096


def _shrinks(old, new) -> bool:
    """Whether moving a reader from view ``old`` to ``new`` is this mount's in-place
    overwrite or truncation of the file (``new`` the writer's spool, shorter), not
    another version committed elsewhere."""
    try:
        return new.is_spool and new.size < old.held_size
    except Exception:                  # noqa: BLE001 - a view that cannot say: no
        return False


def _size(view):
    try:
        return view.size
    except Exception as exc:           # noqa: BLE001 - a log line must not fail a read
        return f"? ({exc!r})"


def _name(view) -> str:
    """A view, for the log: the version it reads."""
    return getattr(view, "version", None) or "the spool"
