"""The attributes a file being written will commit: its mode, owner and times.

A :class:`~s4fs.write.handle.WriteHandle` keeps one :class:`FileMeta`; ``chmod``,
``chown`` and ``utime`` change it, a change of the bytes moves its times, and each commit
writes it into the new version's manifest.

The mtime is that of the version's first change (the open that created or truncated
the file, or the first write after a commit), not of every write: the kernel drops every
cached page of a file whose mtime it sees move, so a moving mtime would throw away the
pages ``torch.save`` just wrote, and the ``torch.load`` right after it would read
everything again (docs/SEMANTICS.md).
"""

from __future__ import annotations

import dataclasses
import time

from s4fs.attr import Attr
from s4fs.manifest import Manifest, seconds_to_ns

__all__ = ["FileMeta"]


@dataclasses.dataclass
class FileMeta:
    mode: int
    mtime_ns: int
    ctime_ns: int | None = None      # the last change; None: the mtime
    atime_ns: int | None = None      # one set explicitly (utime), kept across versions
                                     # as on a noatime disk; None: the mtime
    owner: tuple[int, int] | None = None   # (uid, gid) recorded; None: not recorded

    @classmethod
    def of(cls, mode: int, initial: Manifest | None,
           previous: Manifest | None) -> "FileMeta":
        """A file opened to be written: a new file's times are now; a file opened to be
        changed in place (``initial``) shows its own until its first change. The atime
        and the owner are the file's, kept across versions."""
        meta = cls(mode, time.time_ns() if initial is None else initial.times_ns()[1],
                   None if initial is None else initial.times_ns()[2])
        if previous is not None:
            meta.atime_ns = previous.atime_ns
            if previous.uid is not None:
                meta.owner = (previous.uid, previous.gid)
        return meta

    @property
    def mtime(self) -> float:
        """The mtime in seconds (``mtime_ns`` is the exact value)."""
        return self.mtime_ns / 1e9

    def changed(self, *, content: bool, first: bool) -> None:
        """Something changed now: the ctime moves; the mtime too where the bytes changed
        (``content``) for the first time since the last commit (``first``)."""
        self.ctime_ns = time.time_ns()
        if content and first:
            self.mtime_ns = self.ctime_ns

    def set(self, *, mode: int | None = None, owner: tuple[int, int] | None = None,
            mtime: float | None = None, mtime_ns: int | None = None,
            atime_ns: int | None = None) -> bool:
        """chmod / chown / utime (the mtime as ``mtime_ns``, or ``mtime`` in seconds):
        True where anything was given (the caller counts it as a change of the
        attributes)."""
        if mtime is not None and mtime_ns is None:
            mtime_ns = seconds_to_ns(mtime)
        if mode is not None:
            self.mode = (self.mode & ~0o7777) | (mode & 0o7777)
        if owner is not None:
            self.owner = owner
        if mtime_ns is not None:
            self.mtime_ns = mtime_ns
        if atime_ns is not None:
            self.atime_ns = atime_ns
        return any(v is not None for v in (mode, owner, mtime_ns, atime_ns))

    def journalled(self, entry) -> None:
        """The times of a file accepted before the daemon stopped (a writeback journal
        ``Entry``); one journalled by an s4fs that kept only seconds has no atime."""
        self.mtime_ns = seconds_to_ns(entry.mtime)
        if entry.mtime_ns is not None:
            self.mtime_ns, self.atime_ns = entry.mtime_ns, entry.atime_ns

    def onto(self, m: Manifest) -> Manifest:
        """``m`` (the last committed version: the same chunks) with these attributes."""
        m = dataclasses.replace(m, mode=self.mode, mtime=self.mtime, mtime_ns=self.mtime_ns,
                                atime_ns=self.atime_ns, ctime_ns=time.time_ns())
        return self.owned(m)

    def owned(self, m: Manifest) -> Manifest:
        """``m`` recording this owner, where one is recorded."""
        if self.owner is not None:
            m.uid, m.gid = self.owner
        return m

    def attr(self, path: str, size: int) -> Attr:
        """What ``stat`` answers of the file while it is written."""
        uid, gid = self.owner or (None, None)
        return Attr(path, False, size, self.mode, self.mtime, 0, self.mtime_ns,
                    self.atime_ns, self.ctime_ns, uid, gid)
