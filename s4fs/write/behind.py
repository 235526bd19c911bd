"""Writes a handle never sees: under FUSE passthrough the kernel writes the spool itself.

No ``WRITE`` request reaches the daemon, only ``FLUSH``, ``RELEASE``, ``SETATTR`` and
``GETATTR``. What the handle learns of the kernel's writes it learns here, from the
spool's ``fstat``: its size (the kernel raises its own after each write, and a stale
smaller one would shrink it) and whether size or mtime moved since the last look (then
the file has a new version to commit). A write that failed on a full cache disk is never
seen either, so while the kernel writes, the filesystem's
:class:`~s4fs.write.space.SpaceKeeper` watches the disk, and the save probes it before it
is committed or accepted (:meth:`KernelWrites.check_room`).
"""

from __future__ import annotations

import logging
import os
from typing import TYPE_CHECKING, Callable

from s4fs.errors import NoSpace

from s4fs.write.spool import Spool

if TYPE_CHECKING:
    from s4fs.write.space import SpaceKeeper

log = logging.getLogger(__name__)


class KernelWrites:
    """What one handle knows of the kernel's writes into its spool (off until
    :meth:`start`). Called under the handle's lock."""

    def __init__(self, space: "SpaceKeeper", free_space=None) -> None:
        self.on = False                   # the kernel writes the spool (passthrough)
        self._space, self._free_space = space, free_space
        self._watching = False            # counted by the space keeper
        self._seen: tuple[int, int] | None = None    # (size, mtime_ns) at the last look

    def start(self, spool: Spool) -> None:
        """From now on the kernel writes ``spool`` directly (before its first write)."""
        if not self._watching:
            self._space.watch()            # the caches make room before the disk is full
            self._watching = True
        self.on = True
        self._seen = _stamp(spool)

    def adopt(self, name: str, spool: Spool, *, truncate: bool) -> Spool:
        """The spool to use instead of ``spool`` (which is closed): the file at
        ``name``, which the kernel already passes the inode through to (readers hold
        it: a copy of the version the save starts from), emptied if the open truncated
        the file."""
        new = kernel_spool(name, spool.label, free_space=self._free_space, truncate=truncate)
        spool.close()
        return new

    def stop(self) -> None:
        """The save is over (closed or failed): the space keeper need not watch for it."""
        if self._watching:
            self._watching = False
            self._space.unwatch()

    def moved(self, spool: Spool) -> bool:
        """Whether the kernel wrote ``spool`` since the last look (its size or mtime
        moved); the spool then takes the size it has now as written."""
        if not self.on or spool.fd < 0:
            return False
        stamp = _stamp(spool)
        if stamp == self._seen:
            return False
        self._seen = stamp
        spool.written_to(stamp[0])
        return True

    def size(self, spool: Spool) -> int:
        """The file's size: what the kernel wrote so far, where it writes."""
        if self.on and spool.fd >= 0:
            try:
                return os.fstat(spool.fd).st_size
            except OSError:
                pass
        return spool.size

    def check_room(self, spool: Spool, fail: Callable[[BaseException], None]) -> None:
        """(A save about to be committed or accepted.) The kernel's writes into the spool
        never reached the daemon, so one that failed on a full cache disk went unseen:
        where the disk is full now, the save fails (``fail``: the previous version stays)
        and ``NoSpace`` is raised, rather than commit what the spool holds."""
        if not self.on:
            return
        try:
            spool.check_written_behind()
        except NoSpace as exc:
            log.warning("%s", exc)
            fail(exc)
            raise


def kernel_spool(name: str, label: str, *, free_space, truncate: bool) -> Spool:
    """The file at ``name``, which the kernel already passes an inode through to (a copy
    of the version a save starts from), opened as that save's spool; emptied where the
    open truncated the file."""
    spool = Spool.reopen(name, label, free_space=free_space)
    try:
        if truncate:
            spool.truncate(0)
    except BaseException:
        spool.close()
        raise
    return spool


def _stamp(spool: Spool) -> tuple[int, int]:
    st = os.fstat(spool.fd)
    return st.st_size, st.st_mtime_ns
