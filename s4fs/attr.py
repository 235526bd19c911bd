"""``Attr``: what ``stat`` answers of a path — of a folder, of a committed version, or
of a file being written on this mount."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from s4fs import keys
from s4fs.manifest import Manifest, seconds_to_ns

if TYPE_CHECKING:
    from s4fs.write import WriteHandle

__all__ = ["Attr", "version_attr", "writer_attr"]


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

    @property
    def name(self) -> str:
        return keys.basename(self.path)

    def times_ns(self) -> tuple[int, int, int]:
        """(atime, mtime, ctime) in nanoseconds, each falling back to the mtime."""
        mtime = self.mtime_ns if self.mtime_ns is not None else seconds_to_ns(self.mtime)
        return (mtime if self.atime_ns is None else self.atime_ns, mtime,
                mtime if self.ctime_ns is None else self.ctime_ns)


def writer_attr(path: str, w: "WriteHandle") -> Attr:
    """A file being written: its spool's size, the handle's mode and times."""
    return Attr(path, False, w.size, w.mode, w.mtime, 0, w.mtime_ns, w.atime_ns,
                w.ctime_ns)


def version_attr(path: str, m: Manifest) -> Attr:
    """A committed version."""
    atime, mtime, ctime = m.times_ns()
    return Attr(path, False, m.size, m.mode, m.mtime, m.stored_bytes(), mtime, atime, ctime)
