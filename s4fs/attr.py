"""``Attr``: what ``stat`` answers of a path — of a folder, of a committed version, of
a file being written on this mount (:meth:`s4fs.write.WriteHandle.attr`), or of a
symbolic link."""

from __future__ import annotations

import stat as st
from dataclasses import dataclass

from s4fs import keys
from s4fs.manifest import Manifest, seconds_to_ns

__all__ = ["Attr", "link_attr", "version_attr"]


@dataclass
class Attr:
    path: str
    is_dir: bool
    size: int
    mode: int
    mtime: float                   # seconds; ``mtime_ns`` is exact where known
    stored: int = 0
    mtime_ns: int | None = None
    atime_ns: int | None = None    # set explicitly (utime); None: the mtime (noatime)
    ctime_ns: int | None = None    # last change of content or attributes; None: the mtime
    uid: int | None = None         # the owner; None: not recorded (the mount shows its own)
    gid: int | None = None
    target: bytes | None = None    # a symbolic link's target (then ``mode`` is S_IFLNK)

    @property
    def is_link(self) -> bool:
        return self.target is not None

    @property
    def name(self) -> str:
        return keys.basename(self.path)

    def times_ns(self) -> tuple[int, int, int]:
        """(atime, mtime, ctime) in nanoseconds, each falling back to the mtime."""
        mtime = self.mtime_ns if self.mtime_ns is not None else seconds_to_ns(self.mtime)
        return (mtime if self.atime_ns is None else self.atime_ns, mtime,
                mtime if self.ctime_ns is None else self.ctime_ns)


def version_attr(path: str, m: Manifest) -> Attr:
    """A committed version."""
    atime, mtime, ctime = m.times_ns()
    return Attr(path, False, m.size, m.mode, m.mtime, m.stored_bytes(), mtime, atime, ctime,
                m.uid, m.gid)


def link_attr(path: str, target: bytes, attrs: dict) -> Attr:
    """A symbolic link: its size is its target's length, its mode 0777."""
    mtime = attrs.get("mtime_ns", 0)
    return Attr(path, False, len(target), st.S_IFLNK | 0o777, mtime / 1e9, 0, mtime,
                attrs.get("atime_ns"), attrs.get("ctime_ns"), attrs.get("uid"),
                attrs.get("gid"), target)
