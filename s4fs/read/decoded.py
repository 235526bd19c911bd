"""The decoded cache: whole files, exactly as committed, kept on local disk for reads.

When a file written on this mount is committed and closed, its spool holds exactly the
bytes of that version; instead of deleting it, the mount keeps it here under the
version's manifest id, so reading a checkpoint soon after writing it (resume, evaluation,
``cp``) costs a local ``pread``, not a fetch and a decode. Entries survive a remount (the
name is the version id, so a newer version of the file never matches an old entry).

Contract: ``adopt(id, spool)`` takes ownership of a closed-over spool file;
``open(id)`` returns a new read-only descriptor or None; the total size stays within
``max_bytes`` (least recently used entries go first); ``free_space(n)`` evicts until ``n``
bytes are free on the disk or nothing is left, and returns whether it freed anything.
Bytes served from here are checked against the manifest's whole-file hash when a file is
read from start to end (as reads from the store are); an entry that fails that check is
dropped. ``max_bytes`` 0 turns the cache off.
"""

from __future__ import annotations

import logging
import os
import shutil
import threading
from collections import OrderedDict

log = logging.getLogger(__name__)


def default_budget(folder: str) -> int:
    """A quarter of the cache disk's free space, at most 64 GiB."""
    try:
        free = shutil.disk_usage(folder).free
    except OSError:
        return 0
    return min(64 << 30, free // 4)


class DecodedCache:
    def __init__(self, folder: str, max_bytes: int | None = None) -> None:
        self.folder = folder
        os.makedirs(folder, exist_ok=True)
        self.max_bytes = default_budget(folder) if max_bytes is None else max_bytes
        self._lock = threading.Lock()
        self._lru: OrderedDict[str, int] = OrderedDict()
        entries = []
        for name in os.listdir(folder):
            full = os.path.join(folder, name)
            # a copy being decoded, or the stored bytes fetched for it, when we stopped
            if name.startswith((".fill-", ".fetch-")):
                _unlink(full)
                continue
            if name.startswith(".") or not os.path.isfile(full):
                continue
            try:
                st = os.stat(full)
            except OSError:
                continue
            entries.append((st.st_atime, name, st.st_size))
        for _, name, size in sorted(entries):
            self._lru[name] = size
        self._trim(0)

    @property
    def nbytes(self) -> int:
        with self._lock:
            return sum(self._lru.values())

    def _path(self, vid: str) -> str:
        return os.path.join(self.folder, vid)

    def adopt(self, vid: str, spool) -> None:
        """Keep ``spool`` (an s4fs.write.Spool of exactly version ``vid``) as an entry."""
        size = spool.size
        name = spool.name
        spool.close(remove=False)
        self.adopt_file(vid, name, size)

    def adopt_file(self, vid: str, path: str, size: int) -> bool:
        """Keep the file at ``path`` (exactly version ``vid``, e.g. a copy decoded ahead
        by s4fs.read.fill) as an entry; False if it cannot be kept (then it is removed)."""
        if not self.max_bytes or size > self.max_bytes or not vid or "/" in vid:
            _unlink(path)
            return False
        try:
            os.replace(path, self._path(vid))
        except OSError as exc:
            log.warning("could not keep %s in the decoded cache: %s", path, exc)
            _unlink(path)
            return False
        with self._lock:
            self._lru[vid] = size
            self._lru.move_to_end(vid)
        self._trim(0)
        return True

    def open(self, vid: str) -> int | None:
        with self._lock:
            if vid not in self._lru:
                return None
            self._lru.move_to_end(vid)
        try:
            fd = os.open(self._path(vid), os.O_RDONLY)
        except OSError:
            self.discard(vid)
            return None
        try:   # torch.load reads the whole file: have the disk read it ahead at its pace
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_WILLNEED)
        except (AttributeError, OSError):
            pass
        return fd

    def path_of(self, vid: str) -> str | None:
        """The entry's file (for a worker process to read), or None. It may be evicted
        at any moment: readers open it and check what they read against a checksum."""
        with self._lock:
            return self._path(vid) if vid in self._lru else None

    def take(self, vid: str, held: os.stat_result, dest: str) -> str | None:
        """Move the entry's file out of the cache to ``dest`` (it becomes a spool) if it
        is the file ``held`` was taken of (kept open by the caller, so its inode number
        is not reused); ``dest``, or None where the entry is gone or is another file."""
        with self._lock:               # no eviction between the check and the move
            if vid not in self._lru:
                return None
            try:
                if not os.path.samestat(os.stat(self._path(vid)), held):
                    return None
                os.replace(self._path(vid), dest)
            except OSError:
                return None
            del self._lru[vid]
        return dest

    def discard(self, vid: str) -> None:
        with self._lock:
            self._lru.pop(vid, None)
        _unlink(self._path(vid))

    def _trim(self, need_free: int) -> bool:
        freed = False
        while True:
            with self._lock:
                total = sum(self._lru.values())
                over = total > self.max_bytes
                if not over and need_free:
                    try:
                        over = shutil.disk_usage(self.folder).free < need_free
                    except OSError:
                        over = False
                if not over or not self._lru:
                    return freed
                vid, _ = self._lru.popitem(last=False)
            _unlink(self._path(vid))
            freed = True

    def free_space(self, nbytes: int) -> bool:
        return self._trim(nbytes)


def _unlink(path: str) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass
