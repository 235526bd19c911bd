"""A local cache of recently written packs, so writing a delta never fetches its base
back from a remote store, and reading a fresh checkpoint back is a local read.

The cache is an optimisation only: it never fails a save or a read. Its size follows
the disk it lives on. The effective budget is the configured ``max_bytes`` (``0`` or
``None``: no fixed limit, "auto"), but never more than ``share`` (half, by default) of
what the cache filesystem could offer it — its free bytes plus the bytes the cache
already holds — and this is re-checked against ``statvfs`` before every entry is
written. When the budget shrinks (something else, such as spool files, is filling the
disk) the least recently used packs are evicted; when the disk is nearly full (less
than ``reserve`` would stay free: 5 % of the disk, at most 1 GiB) or a pack alone is
larger than the budget, the pack is simply not cached. Any ``OSError`` while writing
an entry (``ENOSPC``, ``EDQUOT``, ``EIO``, ...) is logged once as a warning, the
partial file is removed and the save goes on; ``free_space(n)`` lets the rest of the
mount ask the cache to give disk space back. Every entry carries a checksum per 64 KiB
block and a versioned footer, so an entry that is missing, short, torn by a crash or
corrupted on disk is a miss (the reader fetches those bytes from the store, which it
verifies against the manifest's chunk checksums as always), never wrong bytes; entries
are written to a ``.part`` file and renamed, and ``.part`` files or unreadable entries
left by a crash are removed when the cache starts. The cache folder belongs to one
mount (``<cache_dir>/packs``); deleting it at any time is safe.
"""

from __future__ import annotations

import logging
import os
import struct
import threading
import uuid
from collections import OrderedDict

import xxhash

log = logging.getLogger(__name__)

BLOCK = 64 << 10                       # bytes covered by one checksum
_MAGIC = b"S4PC"
_MAJOR, _MINOR = 1, 0
# magic, major, minor, block size, data length, xxh3-64 of (table + the fields before it)
_FOOTER = struct.Struct("<4sHHIQQ")
_SUM = struct.Struct("<Q")
_PART = ".part"
_CORRUPT = object()


class PackCache:
    """Packs by key, each stored whole; ``get`` returns verified byte ranges or None.

    Thread-safe: the upload threads call ``put`` and the read pool calls ``get`` at once.
    """

    def __init__(self, folder: str, max_bytes: int | None = None, *, share: float = 0.5,
                 reserve_fraction: float = 0.05, reserve_max: int = 1 << 30) -> None:
        self.folder = folder
        self.max_bytes = max_bytes or None           # None: bounded by the disk only
        self.share = share
        self.reserve_fraction = reserve_fraction
        self.reserve_max = reserve_max
        self._lock = threading.Lock()
        self._lru: OrderedDict[str, int] = OrderedDict()   # file name -> bytes on disk
        self._own = 0                      # bytes of the entries in _lru
        self._pending = 0                  # bytes being written right now
        self._warned: set[str] = set()
        self.disabled = False
        try:
            os.makedirs(folder, exist_ok=True)
            self._load()
            self.trim()
        except OSError as exc:
            self._warn("start", f"pack cache in {folder} is off ({exc}); packs are "
                       f"read from the store instead")
            self.disabled = True

    # --- public ----------------------------------------------------------------------

    @property
    def nbytes(self) -> int:
        """Bytes the cache holds on disk now."""
        return self._own

    def put(self, key: str, data) -> None:
        """Cache ``data`` as pack ``key`` if the disk has room for it. Never raises."""
        if self.disabled:
            return
        name = self._name(key)
        try:
            view = memoryview(data).cast("B")
            size = len(view) + (len(view) + BLOCK - 1) // BLOCK * _SUM.size + _FOOTER.size
            with self._lock:
                if name in self._lru or not self._room_for(size):
                    return
                self._pending += size
            try:
                self._write(name, view)
            finally:
                with self._lock:
                    self._pending -= size
            with self._lock:
                old = self._lru.pop(name, 0)
                self._lru[name] = size
                self._own += size - old
            self.trim()            # puts racing each other may overshoot: back to budget
        except OSError as exc:
            self._warn("put", f"pack cache in {self.folder} could not store a pack ({exc}); "
                       f"the save goes on without caching it")
        except Exception:
            log.exception("pack cache: unexpected error while storing %s (ignored)", key)

    def get(self, key: str, offset: int, length: int) -> bytes | None:
        """The bytes ``[offset, offset+length)`` of pack ``key``, checked against the
        entry's block checksums; None when the entry is missing, short or corrupt."""
        if self.disabled or offset < 0 or length < 0:
            return None
        name = self._name(key)
        with self._lock:
            if name not in self._lru:
                return None
            self._lru.move_to_end(name)
        try:
            fd = os.open(os.path.join(self.folder, name), os.O_RDONLY)
        except OSError:
            self._forget(name)
            return None
        try:
            try:
                data = self._read(fd, offset, length)
            except OSError as exc:         # EIO from a failing disk: as bad as corrupt
                data, why = _CORRUPT, str(exc)
            else:
                why = "checksum mismatch"
            if data is _CORRUPT:
                self._warn("corrupt", f"pack cache entry {name} in {self.folder} is "
                           f"unreadable ({why}); dropped, its bytes are read from the store")
                self.discard(key)
                return None
            try:
                os.utime(fd)               # recency survives a restart
            except OSError:
                pass
            return data
        finally:
            os.close(fd)

    def discard(self, key: str) -> None:
        """Drop the entry of ``key`` (for a caller that found its bytes bad)."""
        name = self._name(key)
        self._forget(name)
        _unlink(os.path.join(self.folder, name))

    def trim(self) -> None:
        """Evict until the cache fits its budget on the disk as it is now."""
        if self.disabled:
            return
        try:
            with self._lock:
                budget, _, _ = self._budget()
                self._evict_to(budget)
        except OSError:
            pass

    def free_space(self, nbytes: int) -> int:
        """Evict least recently used packs until at least ``nbytes`` are free on the
        cache disk (or the cache is empty); returns the bytes given back. For a writer
        that got ``ENOSPC`` beside the cache: ``free_space(n)``, then retry once."""
        if self.disabled:
            return 0
        freed = 0
        with self._lock:
            try:
                free = _free(self.folder)[0]
            except OSError:
                free = 0
            while self._lru and free + freed < nbytes:
                freed += self._pop_oldest()
        return freed

    # --- budget ----------------------------------------------------------------------

    def _budget(self) -> tuple[float, int, int]:
        """(budget in bytes, free bytes, reserve), from the disk as it is now. Bytes being
        written are neither free nor counted as ours: that errs on the small side."""
        free, total = _free(self.folder)
        budget = self.share * (free + self._own)
        if self.max_bytes is not None:
            budget = min(budget, self.max_bytes)
        return budget, free, int(min(total * self.reserve_fraction, self.reserve_max))

    def _room_for(self, size: int) -> bool:
        """Called under the lock: evict for an entry of ``size`` bytes; False to skip it."""
        budget, free, reserve = self._budget()
        if self._pending + size > budget:
            self._evict_to(budget)         # the disk may have shrunk under us
            return False
        freed = self._evict_to(budget - self._pending - size)
        return free + freed - self._pending - size >= reserve

    def _evict_to(self, limit: float) -> int:
        freed = 0
        while self._lru and self._own > limit:
            freed += self._pop_oldest()
        return freed

    def _pop_oldest(self) -> int:
        name, size = self._lru.popitem(last=False)
        self._own -= size
        _unlink(os.path.join(self.folder, name))
        return size

    def _forget(self, name: str) -> None:
        with self._lock:
            size = self._lru.pop(name, None)
            if size is not None:
                self._own -= size

    # --- entries on disk -------------------------------------------------------------

    @staticmethod
    def _name(key: str) -> str:
        return key.replace("/", "_")

    def _write(self, name: str, view: memoryview) -> None:
        sums = b"".join(_SUM.pack(xxhash.xxh3_64_intdigest(view[i:i + BLOCK]))
                        for i in range(0, len(view), BLOCK))
        fields = struct.pack("<4sHHIQ", _MAGIC, _MAJOR, _MINOR, BLOCK, len(view))
        tail = sums + fields + _SUM.pack(xxhash.xxh3_64_intdigest(sums + fields))
        tmp = os.path.join(self.folder, f"{name}.{uuid.uuid4().hex[:8]}{_PART}")
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            try:
                _write_all(fd, view)
                _write_all(fd, memoryview(tail))
            finally:
                os.close(fd)
            os.replace(tmp, os.path.join(self.folder, name))
        except BaseException:
            _unlink(tmp)
            raise

    @staticmethod
    def _layout(fd: int) -> tuple[int, int, bytes] | None:
        """(block size, data length, checksum table) of a well-formed entry, else None."""
        size = os.fstat(fd).st_size
        if size < _FOOTER.size:
            return None
        foot = os.pread(fd, _FOOTER.size, size - _FOOTER.size)
        if len(foot) != _FOOTER.size:
            return None
        magic, major, _minor, block, n, digest = _FOOTER.unpack(foot)
        if magic != _MAGIC or major != _MAJOR or block <= 0:
            return None             # another format or version: a miss, never a guess
        nsums = (n + block - 1) // block
        if size != n + nsums * _SUM.size + _FOOTER.size:
            return None
        sums = os.pread(fd, nsums * _SUM.size, n)
        if xxhash.xxh3_64_intdigest(sums + foot[:-_SUM.size]) != digest:
            return None
        return block, n, sums

    def _read(self, fd: int, offset: int, length: int):
        """The checked bytes; None for a range past the end; _CORRUPT for a bad entry."""
        layout = self._layout(fd)
        if layout is None:
            return _CORRUPT
        block, n, sums = layout
        if offset + length > n:
            return None
        if length == 0:
            return b""
        first, last = offset // block, (offset + length - 1) // block
        lo, hi = first * block, min(n, (last + 1) * block)
        data = os.pread(fd, hi - lo, lo)
        if len(data) != hi - lo:
            return _CORRUPT
        view = memoryview(data)
        for i in range(first, last + 1):
            part = view[(i - first) * block: (i - first + 1) * block]
            if xxhash.xxh3_64_intdigest(part) != _SUM.unpack_from(sums, i * _SUM.size)[0]:
                return _CORRUPT
        if lo == offset and hi - lo == length:
            return data
        return bytes(view[offset - lo: offset - lo + length])

    def _load(self) -> None:
        """Index the entries a previous run left; remove partial and unreadable ones."""
        found = []
        for entry in os.scandir(self.folder):
            if not entry.is_file(follow_symlinks=False):
                continue
            if entry.name.endswith(_PART):
                _unlink(entry.path)
                continue
            try:
                fd = os.open(entry.path, os.O_RDONLY)
                try:
                    ok = self._layout(fd) is not None
                    st = os.fstat(fd)
                finally:
                    os.close(fd)
            except OSError:
                ok = False
            if not ok:
                _unlink(entry.path)
                continue
            found.append((st.st_mtime, entry.name, st.st_size))
        for _, name, size in sorted(found):
            self._lru[name] = size
            self._own += size

    def _warn(self, kind: str, message: str) -> None:
        if kind in self._warned:
            log.debug("%s", message)
        else:
            self._warned.add(kind)
            log.warning("%s", message)


def _free(folder: str) -> tuple[int, int]:
    """(bytes free to an unprivileged writer, size) of the filesystem holding ``folder``."""
    st = os.statvfs(folder)
    return st.f_bavail * st.f_frsize, st.f_blocks * st.f_frsize


def _write_all(fd: int, view: memoryview) -> None:
    while view:
        view = view[os.write(fd, view):]


def _unlink(path: str) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass
