"""Room on the cache disk for saves whose writes the daemon never sees (FUSE passthrough).

Through FUSE requests every write reaches :class:`~s4fs.write.spool.Spool`, which meets
a full cache disk by asking the caches for room and, failing that, fails the save: the
caller's ``close()`` raises ``ENOSPC`` and the previous version stays. Under passthrough
the kernel writes the spool itself; a write that finds the disk full fails in the caller
and the daemon hears nothing of it. Two things keep the same promise there:

* :class:`SpaceKeeper` — while any save is written behind the daemon's back, a thread
  looks at the cache disk every few milliseconds and has the caches give space back
  before the disk is full (what ``Spool.write`` does after the fact on requests);
* :func:`disk_full` — at ``close()`` / ``fsync()`` of such a save, ``FULL_MARGIN``
  (1 MiB) allocated in an unnamed file on the same disk: refused means the disk is full
  now, so one of the save's writes may have failed, and the handle fails the save
  instead of committing what the spool holds (a save that leaves less than that free
  fails too: the previous version stays, and the next save would not fit anyway). A
  write that failed while the caches still held space that the keeper gave back before
  ``close()`` would go unseen; the keeper acts while a gigabyte is still free, which the
  kernel does not fill within one look.
"""

from __future__ import annotations

import errno
import logging
import os
import tempfile
import threading

log = logging.getLogger(__name__)

_NO_SPACE = (errno.ENOSPC, errno.EDQUOT)


#: room for fewer bytes than this counts as a full disk: a write that failed may have
#: left some free. ext4 refused a 1 MiB write with 419 KiB still free (the clusters it
#: keeps for its own metadata, and reservations writeback settles later), where one more
#: block still fitted; with less than this left, a save's write may have failed.
FULL_MARGIN = 1 << 20


def disk_full(folder: str, margin: int = FULL_MARGIN) -> bool:
    """Whether the filesystem holding ``folder`` has no room for ``margin`` more bytes
    now (what a root-owned writer, like the kernel's passthrough writes, can still get:
    the bytes are allocated in an unnamed file, then let go)."""
    try:
        fd = os.open(folder, os.O_TMPFILE | os.O_WRONLY, 0o600)
        name = None
    except OSError as exc:
        if exc.errno in _NO_SPACE:
            return True
        if exc.errno not in (errno.EOPNOTSUPP, errno.EISDIR, errno.EINVAL):
            raise
        fd, name = tempfile.mkstemp(dir=folder, prefix=".space-")   # no O_TMPFILE here
    try:
        try:
            os.posix_fallocate(fd, 0, margin)
            return False
        except OSError as exc:
            if exc.errno in _NO_SPACE:
                return True
            if exc.errno not in (errno.EOPNOTSUPP, errno.EINVAL):
                raise
        # no fallocate on this filesystem: write the bytes (a short write: no room)
        try:
            return os.write(fd, bytes(margin)) < margin
        except OSError as exc:
            if exc.errno in _NO_SPACE:
                return True
            raise
    finally:
        os.close(fd)
        if name is not None:
            os.unlink(name)


class SpaceKeeper:
    """Keeps ``headroom`` bytes free on the disk of ``folder`` while saves are written
    behind the daemon (``watch``/``unwatch`` around each): below it, ``free_space``
    (the caches give space back) is asked for that much."""

    def __init__(self, folder: str, free_space, *, headroom: int = 1 << 30,
                 every: float = 0.005) -> None:
        self.folder = folder
        self.free_space = free_space
        self.headroom = headroom
        self.every = every
        self._cond = threading.Condition()
        self._watched = 0
        self._thread: threading.Thread | None = None
        self._closed = False

    def watch(self) -> None:
        with self._cond:
            self._watched += 1
            if self._thread is None and not self._closed:
                self._thread = threading.Thread(target=self._run, daemon=True,
                                                name="s4fs-space")
                self._thread.start()

    def unwatch(self) -> None:
        with self._cond:
            self._watched -= 1
            self._cond.notify_all()

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify_all()
            t = self._thread
        if t is not None:
            t.join()

    def free(self) -> int:
        st = os.statvfs(self.folder)
        return st.f_bavail * st.f_frsize

    def _run(self) -> None:
        try:
            while True:
                with self._cond:
                    if self._closed or self._watched <= 0:
                        self._thread = None
                        return
                    self._cond.wait(self.every)
                if self.free() < self.headroom and self.free_space(self.headroom):
                    log.info("the cache disk has less than %d MiB free while a file is "
                             "written through FUSE passthrough: the caches gave space back",
                             self.headroom >> 20)
        except Exception:                # the keeper must not take the mount down
            log.exception("watching the cache disk's free space")
            with self._cond:
                self._thread = None
