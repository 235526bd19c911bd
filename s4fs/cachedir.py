"""The cache dir of one filesystem: its spools, writeback journal, pack and decoded
caches (``FsConfig.cache_dir``, or a temporary folder made for it).

:class:`CacheDir` makes it, refuses a writeback mount on a folder kept in memory only,
and locks it (one mount per cache dir); a temporary one is removed at ``close`` and,
where its process died without closing, by the next s4fs that starts
(:func:`sweep_stale_temp_caches`).
"""

from __future__ import annotations

import fcntl
import glob
import logging
import os
import shutil
import tempfile
import time

from s4fs.errors import Busy, InvalidArgument

__all__ = ["CacheDir", "TEMP_CACHE_PREFIX", "memory_filesystem",
           "sweep_stale_temp_caches"]

log = logging.getLogger("s4fs.fs")

TEMP_CACHE_PREFIX = "s4fs-cache-"

#: statfs(2) f_type of the filesystems that keep files in memory only (linux/magic.h)
_MEMORY_FS = {0x01021994: "tmpfs", 0x858458F6: "ramfs"}


class CacheDir:
    """The cache dir, made and locked. ``folder``: the one asked for (absolute or not),
    None for a temporary one of this filesystem's own. ``writeback``: the mount keeps
    files close() accepted in it until the store takes them, so it must be on a disk."""

    def __init__(self, folder: str | None, *, writeback: bool) -> None:
        self.own = folder is None
        if self.own:
            sweep_stale_temp_caches()
        # absolute: the writeback journal records spool paths that must survive a restart
        self.path = os.path.abspath(folder or tempfile.mkdtemp(prefix=TEMP_CACHE_PREFIX))
        self._refuse_memory(writeback)
        self._lock_fd = _lock(self.path)

    def _refuse_memory(self, writeback: bool) -> None:
        in_memory = memory_filesystem(self.path)
        if in_memory and writeback:
            if self.own:
                shutil.rmtree(self.path, ignore_errors=True)
            raise InvalidArgument(
                f"--writeback keeps every file that close() accepted on local disk until "
                f"the store takes it, and the cache dir {self.path} is on {in_memory} "
                f"(memory): a crash or reboot of the machine would lose them. Give "
                f"--cache-dir a folder on a disk, or mount without --writeback (the default "
                f"mode is durable in the store at close(), and may keep its cache in memory)")
        if in_memory:
            log.info("cache dir %s is on %s: spools and local copies stay in memory (no "
                     "disk writes for them), up to --cache-size", self.path, in_memory)

    def sub(self, name: str, *, make: bool = False) -> str:
        """``<cache dir>/<name>``, made first with ``make``."""
        path = os.path.join(self.path, name)
        if make:
            os.makedirs(path, exist_ok=True)
        return path

    def statfs(self) -> dict:
        """What ``statfs`` of the mount answers: the store has no size, so fixed large
        figures; ``cache_free`` is the cache disk's free space."""
        total = shutil.disk_usage(self.path)
        return {"bsize": 4096, "blocks": 1 << 40, "bfree": 1 << 39, "files": 1 << 32,
                "ffree": 1 << 31, "namemax": 255, "cache_free": total.free}

    def close(self) -> None:
        """Let go of the lock; a temporary cache dir is removed."""
        os.close(self._lock_fd)
        if self.own:
            shutil.rmtree(self.path, ignore_errors=True)


def sweep_stale_temp_caches() -> None:
    """Remove the temporary cache dirs of s4fs processes that died without closing
    (kill -9, a crash): their decoded-file and pack caches can hold gigabytes. A dir
    still locked belongs to a live process and is left alone, and so is one whose
    journal still names files (a writeback mount's accepted bytes: kept, and logged)."""
    for folder in glob.glob(os.path.join(tempfile.gettempdir(), TEMP_CACHE_PREFIX + "*")):
        try:
            fd = os.open(os.path.join(folder, ".lock"), os.O_RDWR)
        except OSError:
            continue                  # not made by this s4fs
        try:
            if time.time() - os.fstat(fd).st_mtime < 60:
                continue              # just made: its owner may not hold the lock yet
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                continue
            journal = os.path.join(folder, "journal")
            if os.path.isdir(journal) and os.listdir(journal):
                log.warning("%s holds the journal of a writeback mount that died; its "
                            "files are not committed: mount with --cache-dir %s to "
                            "commit them", folder, folder)
                continue
            shutil.rmtree(folder, ignore_errors=True)
        finally:
            os.close(fd)


def memory_filesystem(path: str) -> str | None:
    """"tmpfs" or "ramfs" where ``path`` (or, while it does not exist, its nearest
    existing parent) is on a filesystem that keeps its files in memory only, else None
    (a disk, or where statfs cannot tell)."""
    import ctypes
    import ctypes.util
    while not os.path.exists(path) and os.path.dirname(path) != path:
        path = os.path.dirname(path)
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
    except OSError:
        return None
    buf = ctypes.create_string_buffer(256)      # struct statfs: f_type first, a word
    if libc.statfs(os.fsencode(path), buf) != 0:
        return None
    f_type = ctypes.c_long.from_buffer(buf).value & 0xFFFFFFFF
    return _MEMORY_FS.get(f_type)


def _lock(folder: str) -> int:
    """One mount per cache dir: its spools, journal and caches are this mount's own."""
    os.makedirs(folder, exist_ok=True)
    fd = os.open(os.path.join(folder, ".lock"), os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise Busy(f"the cache dir {folder} is in use by another s4fs mount (or Python "
                   f"process); give each mount its own --cache-dir") from None
    return fd
