"""The side of a coding worker process that every such process shares (the CPU workers
and the GPU worker): its start (priority, watching its parent), its stores and chunk
sources kept per pickled spec, and reading a job's chunks from the spool."""

from __future__ import annotations

import contextlib
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
    import s4fs.read.reader  # noqa: F401


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
        from s4fs.read.reader import ChunkSource
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
