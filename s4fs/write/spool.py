"""The spool: every byte of a file being written, in a local file, in whatever order it
arrives.

Contract:

* ``write(offset, data)`` is one ``pwrite`` into a sparse file in the cache dir; bytes
  never written read back as zeros (a hole), exactly as on a local disk. A full cache
  disk raises :class:`~s4fs.errors.NoSpace` (``ENOSPC``); any other I/O error is an
  ``OSError`` with its errno. Nothing is ever parsed or coded here.
* ``size`` is the file's true logical size at every moment (writes and truncates
  included) — what ``stat`` and ``fstat`` report while the file is open.
* ``frontier`` is the end of the prefix ``[0, frontier)`` in which every byte has been
  written at least once (or was there when the spool was filled from a committed
  version). The ingest pipeline may consume that prefix while the file is still being
  written; writes that arrive out of order (the kernel's writeback cache reorders them)
  wait beyond the frontier until the gap before them is filled.
* The spool is a named file (``spool-<id>``) so that a ``--writeback`` mount can journal
  it and replay it after a crash (:mod:`s4fs.write.journal`), and so that a committed spool can
  become a decoded-cache entry without a copy. ``close(remove=True)`` deletes it; a
  descriptor ``dup``'d by a reader stays valid after that.
* On a full disk ``write`` first calls ``free_space(nbytes)`` (the caches give space back)
  and tries once more before it raises.

Not thread-safe: its owner (:class:`s4fs.write.handle.WriteHandle`) serialises calls.
"""

from __future__ import annotations

import bisect
import errno
import os
import tempfile
import uuid

from s4fs.errors import NoSpace
from s4fs.write.space import disk_full

_NO_SPACE = (errno.ENOSPC, errno.EDQUOT)


def _no_space(when: str) -> NoSpace:
    return NoSpace(f"the cache disk is full {when}: free space under --cache-dir or point "
                   f"it at a larger disk; this version was not stored, the previous one "
                   f"stays")


def fresh_spool_name(folder: str) -> str:
    """A name for a spool in ``folder`` that no file has."""
    return os.path.join(folder, f"spool-{uuid.uuid4().hex}")


class Spool:
    def __init__(self, folder: str, label: str = "", *, free_space=None,
                 existing: str | None = None) -> None:
        os.makedirs(folder, exist_ok=True)
        if existing is None:
            fd, name = tempfile.mkstemp(dir=folder, prefix="spool-")
        else:
            name = existing
            fd = os.open(name, os.O_RDWR)
        self.fd = fd
        self.name = name
        self.label = label
        self.free_space = free_space
        self.size = os.fstat(fd).st_size
        self.frontier = self.size                 # a replayed spool is written through
        self._islands: list[list[int]] = []      # written [start, end) past the frontier

    @classmethod
    def reopen(cls, name: str, label: str = "", *, free_space=None) -> "Spool":
        """The spool of a file accepted before a crash (``--writeback`` journal)."""
        return cls(os.path.dirname(name), label, free_space=free_space, existing=name)

    def start_as(self, read, size: int) -> None:
        """(A new, empty spool.) The ``size`` bytes ``read(offset, n)`` gives: a file
        opened to be changed in place starts as its committed version."""
        pos = 0
        while pos < size:
            data = read(pos, min(8 << 20, size - pos))
            if not data:
                break
            self.write(pos, data)
            pos += len(data)

    # --- bytes in --------------------------------------------------------------------

    def write(self, offset: int, data) -> int:
        n = len(data)
        try:
            try:
                self._pwrite_all(data, offset)
            except OSError as exc:
                if exc.errno not in _NO_SPACE or self.free_space is None \
                        or not self.free_space(n + (64 << 20)):
                    raise
                self._pwrite_all(data, offset)     # the caches gave room back: once more
        except OSError as exc:
            if exc.errno in _NO_SPACE:
                raise _no_space(f"while writing {self.label!r} (offset {offset}, {n} "
                                f"bytes)") from None
            raise
        self.size = max(self.size, offset + n)
        self._mark(offset, offset + n)
        return n

    def _pwrite_all(self, data, offset: int) -> None:
        n = len(data)
        done = os.pwrite(self.fd, data, offset)
        while done < n:            # a short pwrite on a nearly full disk: finish or fail
            more = os.pwrite(self.fd, memoryview(data)[done:], offset + done)
            if more == 0:
                raise OSError(errno.ENOSPC, "no space left on device")
            done += more

    def check_written_behind(self) -> None:
        """(FUSE passthrough: the kernel wrote this file, and a write of its that failed
        never reached us.) Raise :class:`NoSpace` where the cache disk is full now: one
        of those writes may have failed for want of room."""
        if disk_full(os.path.dirname(self.name)):
            raise _no_space(f"while {self.label!r} was written through FUSE passthrough, "
                            f"so a write may have failed")

    def truncate(self, size: int) -> None:
        try:
            os.ftruncate(self.fd, size)
        except OSError as exc:
            if exc.errno in _NO_SPACE:
                raise NoSpace(f"the cache disk is full while resizing {self.label!r}") from None
            raise
        if size < self.size:
            self.frontier = min(self.frontier, size)
            self._islands = [[a, min(b, size)] for a, b in self._islands if a < size]
        else:
            # the new bytes are a hole of zeros: as good as written
            self._mark(self.size, size)
        self.size = size

    def renew(self) -> None:
        """Empty the spool as ``truncate(0)`` does, but into a new file put in its place
        (same name): descriptors taken with :meth:`dup` before keep the old bytes. A
        reader's request the kernel sent before it applied an ``O_TRUNC`` may still be
        answered with them (s4fs.read.node), never with the zeros of a file already
        emptied."""
        fd, tmp = tempfile.mkstemp(dir=os.path.dirname(self.name), prefix="spool-")
        try:
            os.rename(tmp, self.name)
        except BaseException:
            os.close(fd)
            os.unlink(tmp)
            raise
        os.close(self.fd)
        self.fd = fd
        self.size = self.frontier = 0
        self._islands = []

    def written_to(self, size: int) -> None:
        """Someone else (the kernel, FUSE passthrough) wrote this file: it is ``size``
        bytes, all of them written."""
        self.size = size
        self.frontier = size
        self._islands = []

    def _mark(self, lo: int, hi: int) -> None:
        if lo <= self.frontier:
            self.frontier = max(self.frontier, hi)
        else:
            i = bisect.bisect_left(self._islands, [lo, hi])
            self._islands.insert(i, [lo, hi])
            # merge neighbours
            merged: list[list[int]] = []
            for a, b in self._islands:
                if merged and a <= merged[-1][1]:
                    merged[-1][1] = max(merged[-1][1], b)
                else:
                    merged.append([a, b])
            self._islands = merged
        while self._islands and self._islands[0][0] <= self.frontier:
            self.frontier = max(self.frontier, self._islands.pop(0)[1])

    # --- bytes out -------------------------------------------------------------------

    def read(self, offset: int, size: int) -> bytes:
        end = min(offset + size, self.size)
        if offset >= end:
            return b""
        return os.pread(self.fd, end - offset, offset)

    def readinto(self, offset: int, dest) -> int:
        end = min(offset + len(dest), self.size)
        if offset >= end:
            return 0
        return os.preadv(self.fd, [memoryview(dest)[: end - offset]], offset)

    def dup(self) -> int:
        return os.dup(self.fd)

    def close(self, *, remove: bool = True) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1
        if remove and self.name:
            try:
                os.unlink(self.name)
            except FileNotFoundError:
                pass
            self.name = ""
