"""The side of a coding worker process that every such process shares (the CPU workers
and the GPU worker): its start (priority, watching its parent), its stores and chunk
sources kept per pickled spec, and reading a job's chunks from the spool."""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import errno
import mmap
import os
import pickle
import threading

from s4fs.coding._bases import base_bytes
from s4fs.coding._jobs import Item, Job
from s4fs.errors import CodecError, SpoolChanged

# A worker process is its own composition root: these live as long as the process
# (its pool's owner starts and stops it), one Store per pickled spec and one
# ChunkSource per (spec, device), shared by the jobs it runs.
_stores: dict[bytes, object] = {}
_sources: dict[tuple[bytes, str], object] = {}


def init_worker(nice: int, parent: int) -> None:
    """Run first in a worker process: lower its priority, and end it when ``parent``
    (the daemon) does."""
    if nice > 0:
        try:
            below = nice - os.nice(0)      # started at it already when warm() started us
            if below > 0:
                os.nice(below)
        except OSError:
            pass
    # A worker must not outlive its daemon (kill -9, a crash): the pool's pipes do not
    # tell it, as every worker holds their write ends. Watch the parent instead.
    # (Not PR_SET_PDEATHSIG: that fires when the *thread* that started us ends.)
    def watch():
        import time
        while os.getppid() == parent:
            time.sleep(0.5)
        os._exit(1)
    threading.Thread(target=watch, daemon=True, name="s4fs-parent-watch").start()
    # what a decode job needs, imported now (at the worker's low priority, while the
    # mount starts) rather than by a fresh node's first decode ahead, which a reader
    # waits on
    import s4fs.chunks  # noqa: F401


def store_for(spec: bytes):
    """The Store of a pickled spec (one per spec in this process)."""
    store = _stores.get(spec)
    if store is None:
        store = _stores[spec] = pickle.loads(spec)
    return store


def source_for(spec: bytes, device: str):
    """A ChunkSource (fetch, decode, check) over the Store of a pickled spec, decoding
    under the ``device`` setting of the worker's pool (a CPU worker's: "cpu")."""
    src = _sources.get((spec, device))
    if src is None:
        from s4fs.chunks import ChunkSource
        src = _sources[spec, device] = ChunkSource(store_for(spec), cache_bytes=64 << 20,
                                                   device=device, workers=2)
    return src


def _pread_all(fd: int, offset: int, length: int) -> bytes:
    data = os.pread(fd, length, offset)
    if len(data) == length:
        return data
    parts = [data]
    got = len(data)
    while got < length:
        more = os.pread(fd, length - got, offset + got)
        if not more:
            raise CodecError(f"internal error: the spool ends at {offset + got}, before "
                             f"the {length} bytes at {offset} it was to hold")
        parts.append(more)
        got += len(more)
    return b"".join(parts)


def item_base(job: Job, item: Item, base_fd: int | None, device: str) -> bytes:
    """The verified raw bytes of ``item``'s delta base (the decoded copy open at
    ``base_fd`` when it holds them, else the store, decoded under ``device``)."""
    return base_bytes(base_fd, item.base_range, item.base, source_for(job.store, device))


@contextlib.contextmanager
def job_files(job: Job):
    """``(spool fd, base fd | None)`` of a coding job, open for reading (the base
    version's decoded copy only when it can be opened)."""
    fd = os.open(job.spool, os.O_RDONLY)
    base_fd = None
    if job.base_file is not None:
        try:
            base_fd = os.open(job.base_file, os.O_RDONLY)
        except OSError:
            base_fd = None
    try:
        yield fd, base_fd
    finally:
        os.close(fd)
        if base_fd is not None:
            os.close(base_fd)


def read_ranges(path: str, ranges) -> bytes:
    """Bytes at ``ranges`` ((offset, length), ...) of the file at ``path``, concatenated:
    a pair's copy, earlier in the spool being coded."""
    fd = os.open(path, os.O_RDONLY)
    try:
        return b"".join(_pread_all(fd, o, n) for o, n in ranges)
    finally:
        os.close(fd)


def read_item(fd: int, item: Item) -> bytes:
    """An item's bytes: its spool ranges, concatenated."""
    if len(item.ranges) == 1:
        return _pread_all(fd, *item.ranges[0])
    return b"".join(_pread_all(fd, o, n) for o, n in item.ranges)


def spool_changed() -> SpoolChanged:
    return SpoolChanged("internal error: the spool changed while its chunks were being "
                      "coded; the file was not stored")


def pwrite_all(fd: int, data, offset: int) -> None:
    mv = memoryview(data)
    while len(mv):
        n = os.pwrite(fd, mv, offset)
        mv = mv[n:]
        offset += n


TMPFS_MAGIC = 0x01021994


def mapped_copy(fd: int, size: int) -> bool:
    """Whether the decoded copy open at ``fd`` (``size`` bytes) is written through a
    shared mapping (:class:`Copy`), decided here only. ``pwrite`` into one file takes the
    file's lock, one writer at a time: in memory (tmpfs) that lock is the whole cost, and
    16 workers filling 1.7 GiB took 0.82 s by ``pwrite`` and 0.47 s through a mapping; on
    a disk file system (ext4) a page fault on a shared mapping costs more than the lock
    (1.24 vs 1.00 s). So: mapped on tmpfs, its pages reserved first (``fallocate``: a
    write through a mapping that meets a full file system is a SIGBUS, not an error);
    ``pwrite`` elsewhere, its blocks reserved first too where the file system can (16
    writers then never allocate blocks one write at a time: ext4 on the H100 box, 1.7
    GiB, 1.10 s reserved against 1.28 s, the floor of reading the stored bytes 0.93 s;
    ``bench/fill.py --stages``). Raises ENOSPC where there is no room for the copy."""
    if size <= 0:
        return False
    if _fs_type(fd) == TMPFS_MAGIC:
        return _reserve(fd, size)
    _reserve(fd, size)
    return False


def _reserve(fd: int, size: int) -> bool:
    """``fallocate`` the first ``size`` bytes of the file open at ``fd``: True when done,
    False where the file system cannot; ENOSPC (and quota) raised."""
    libc = _libc()
    if libc is None:
        return False
    if libc.fallocate(fd, 0, ctypes.c_long(0), ctypes.c_long(size)) == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG):
        raise OSError(err, os.strerror(err))
    return False


def _fs_type(fd: int) -> int | None:
    """The file system type (``statfs``'s magic number) of the file open at ``fd``."""
    libc = _libc()
    if libc is None:
        return None
    buf = ctypes.create_string_buffer(256)          # struct statfs; f_type comes first
    if libc.fstatfs(fd, buf) != 0:
        return None
    return ctypes.c_long.from_buffer(buf).value


_LIBC: list = []


def _libc():
    if not _LIBC:
        name = ctypes.util.find_library("c")
        try:
            lib = ctypes.CDLL(name, use_errno=True) if name else None
            if lib is not None:
                lib.fallocate.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_long,
                                          ctypes.c_long]
        except (OSError, AttributeError):
            lib = None
        _LIBC.append(lib)
    return _LIBC[0]


class Copy:
    """A decoded copy being filled (a decode ahead's target file, created at its size),
    written at file offsets: through a shared mapping where :func:`mapped_copy` said so
    (``mapped``), else with ``pwrite``."""

    def __init__(self, path: str, mapped: bool = True) -> None:
        self.fd = os.open(path, os.O_RDWR if mapped else os.O_WRONLY)
        self._map = None
        self._mv = None
        if mapped:
            try:
                size = os.fstat(self.fd).st_size
                self._map = mmap.mmap(self.fd, size, mmap.MAP_SHARED,
                                      mmap.PROT_READ | mmap.PROT_WRITE)
                self._mv = memoryview(self._map)
            except (OSError, ValueError):
                self._map = None

    def place(self, data, offset: int) -> None:
        """``data`` at file ``offset``."""
        if self._mv is None:
            pwrite_all(self.fd, data, offset)
            return
        src = memoryview(data)
        if src.format != "B" or src.ndim != 1:
            src = src.cast("B")
        n = len(src)
        if offset + n > len(self._mv):
            raise CodecError(f"internal error: a decoded piece of {n} bytes at {offset} "
                             f"ends past the copy's {len(self._mv)} bytes")
        self._mv[offset: offset + n] = src

    def close(self) -> None:
        if self._mv is not None:
            self._mv.release()
            self._map.close()
            self._mv = self._map = None
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def __enter__(self) -> "Copy":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
