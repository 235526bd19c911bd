"""The mount table: what is mounted where, read from ``/proc/self/mountinfo``.

The one parser of the kernel's mount table. The mount daemon asks it whether a mount
already sits on its mountpoint and which FUSE connection is its own, the service's
health check whether the mount is there, and the path resolver whether a path lies
under an s4fs mount and of which store. Reading mountinfo never calls into a
filesystem, so a hung FUSE daemon cannot block it (a stat of its mountpoint would).

An s4fs mount shows as type ``fuse.s4fs`` (FUSE subtype ``s4fs``) with its store URL as
its source (the ``fsname`` option, commas written ``%2C``): :func:`fsname_option` writes
that and :attr:`MountEntry.store` reads it back.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass

MOUNTINFO = "/proc/self/mountinfo"
SUBTYPE = "s4fs"                    # the FUSE subtype an s4fs mount is made with
FSTYPE = "fuse." + SUBTYPE          # ... and so the type the mount table shows


@dataclass(frozen=True)
class MountEntry:
    """One line of /proc/self/mountinfo."""
    mount_id: int
    parent_id: int
    device: str               # major:minor; for FUSE the minor is the connection number
    root: str                 # the folder of the filesystem mounted here ("/": all of it)
    path: str                 # where it is mounted
    fstype: str               # "fuse.s4fs", "fuse", "fuseblk", "tmpfs", ...
    source: str

    @property
    def is_fuse(self) -> bool:
        return self.fstype.split(".", 1)[0] in ("fuse", "fuseblk")

    @property
    def is_s4fs(self) -> bool:
        return self.fstype == FSTYPE

    @property
    def store(self) -> str:
        """An s4fs mount's store URL: its source, as :func:`fsname_option` wrote it."""
        return self.source.replace("%2C", ",")


def fsname_option(store_url: str) -> str:
    """The FUSE mount option that shows ``store_url`` as the mount's source (a comma
    would end the option, so it is written ``%2C``)."""
    return "fsname=" + store_url.replace(",", "%2C")


def _unescape(field: bytes) -> str:
    """mountinfo writes space, tab, newline and backslash as octal escapes (``\\040``)."""
    return os.fsdecode(re.sub(rb"\\([0-7]{3})", lambda m: bytes([int(m.group(1), 8)]),
                              field))


def parse_mountinfo(text: bytes | str) -> list[MountEntry]:
    """Every mount of ``text`` (what /proc/self/mountinfo holds), in its order::

        36 35 98:0 /mnt1 /mnt/parent rw,noatime master:1 - ext3 /dev/root rw,errors=continue
        (1)(2)(3)   (4)   (5)         (6)       (7)      (8) (9)   (10)      (11)

    Lines that are not mountinfo lines are skipped."""
    if isinstance(text, str):
        text = os.fsencode(text)
    found = []
    for line in text.splitlines():
        left, sep, right = line.partition(b" - ")
        fields, rest = left.split(), right.split()
        if not sep or len(fields) < 5 or not rest or not (fields[0] + fields[1]).isdigit():
            continue
        found.append(MountEntry(int(fields[0]), int(fields[1]), fields[2].decode(),
                                _unescape(fields[3]), _unescape(fields[4]),
                                _unescape(rest[0]), _unescape(rest[1]) if len(rest) > 1 else ""))
    return found


def read_mounts() -> list[MountEntry]:
    """This process's mounts (none where the table cannot be read)."""
    try:
        with open(MOUNTINFO, "rb") as f:
            return parse_mountinfo(f.read())
    except OSError:
        return []


def _resolve(mountpoint: str) -> str:
    """The absolute path the kernel mounts on, found without a stat of ``mountpoint``
    itself (that would call into a hung FUSE daemon there)."""
    path = os.path.abspath(mountpoint)
    parent = os.path.realpath(os.path.dirname(path))
    path = os.path.join(parent, os.path.basename(path))
    try:
        return os.path.realpath(os.path.join(parent, os.readlink(path)))
    except OSError:                          # not a symlink (or not there)
        return path


def _top_last(stacked: list[MountEntry]) -> list[MountEntry]:
    """Mounts at one path, the one on top (the one a path lookup reaches) last: each
    stacked mount's parent is the mount below it."""
    ids = {e.mount_id for e in stacked}
    below = {e.parent_id for e in stacked if e.parent_id in ids}
    return sorted(stacked, key=lambda e: e.mount_id not in below)


def mounts_at(mountpoint: str, entries: list[MountEntry] | None = None) -> list[MountEntry]:
    """The mounts whose mountpoint is exactly ``mountpoint`` (symlinks resolved), the one
    on top last. ``entries``: a parsed table (default: this process's)."""
    target = _resolve(mountpoint)
    table = read_mounts() if entries is None else entries
    return _top_last([e for e in table if e.path == target])


def s4fs_mount_of(path: str, entries: list[MountEntry] | None = None
                  ) -> tuple[MountEntry, str] | None:
    """``(the s4fs mount, path inside its store)`` when the absolute ``path`` lies in an
    s4fs mount (the mount a lookup of it reaches), else None."""
    table = read_mounts() if entries is None else entries
    holding = [e for e in table
               if path == e.path or path.startswith(e.path.rstrip("/") + "/")]
    if not holding:
        return None
    deepest = max(len(e.path) for e in holding)
    top = _top_last([e for e in holding if len(e.path) == deepest])[-1]
    if not top.is_s4fs:
        return None
    rel = os.path.relpath(os.path.join(top.root, os.path.relpath(path, top.path)), "/")
    return top, "" if rel == "." else rel.replace(os.sep, "/")
