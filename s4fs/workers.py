"""The coding workers: processes that turn spool byte ranges into stored packs.

The mount's daemon moves bytes; it does not code them. For a file being written it reads
the spool's written prefix once, in order, for the cheap sequential work — the stream
parser (zip headers, the pickle scan), the whole-file hash and a 64-bit hash of every
chunk — and hands the coding to this pool as **batches**: lists of chunks, each named by
its byte ranges in the spool file (never the bytes themselves), with its dtype and, for a
delta, its base chunk. A worker process (own interpreter, own GIL, lower CPU priority):

1. ``pread``s each chunk's ranges from the spool by path;
2. checksums it, codes it (byte planes, or an XOR delta against its base: the base's
   bytes are read from the decoded-cache file of the base version when it is there and
   its checksum matches, else fetched and decoded from the store);
3. appends the blobs to one pack and ``put``s it in the store under the key the daemon
   chose (a batch whose chunks all equal their bases stores nothing);
4. returns, per chunk, where its blob lies in the pack and its checksum.

The daemon checks each returned checksum against its own (a spool that changed under the
worker, or a parser that lost a byte, fails the save, never stores wrong bytes) and
builds the manifest. Nothing about the spool's bytes is pickled through the pool's pipes
but these small descriptions.

Contract: ``pool(workers, nice)`` is the process-wide pool (started on first use, started
again after a worker died); :func:`code_batch` runs in a worker; a worker that dies
fails the futures of its pool with :class:`WorkerDied`. Memory: each worker holds at most
one batch (``IngestConfig.batch_bytes``, 16 MiB raw) plus its coded blobs and the codec's
scratch, about 4× the batch (~70 MiB) on top of its interpreter (~60 MiB); the daemon
keeps at most ``2 × workers`` batches in flight.
"""

from __future__ import annotations

import contextlib
import os
import pickle
import threading
from concurrent.futures import Future, ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass

from s4fs.errors import CodecError
from s4fs.delta import collecting_notes
from s4fs.ingest import SAME, IngestConfig, base_bytes, code_chunk
from s4fs.manifest import ChunkRef



class WorkerDied(CodecError):
    """A coding worker process ended (killed, out of memory) while coding a batch."""


def died(who: str, what: str, doing: str, then: str) -> WorkerDied:
    """The error a save or read gets when ``who`` ended under its batch."""
    return WorkerDied(f"{who} died while {doing} {what} (killed, or out of memory); {then}")


@dataclass(frozen=True)
class Item:
    """One chunk to code: its bytes are ``ranges`` of the spool, concatenated."""
    ranges: tuple[tuple[int, int], ...]   # (offset, length) in the spool file
    dtype: str
    checksum: int                          # what the daemon hashed; the worker checks it
    base: ChunkRef | None = None
    base_range: tuple[int, int] | None = None   # where the base lies in base_file


@dataclass(frozen=True)
class Job:
    store: bytes                  # the pickled Store (workers keep one per spec)
    spool: str                    # path of the spool file
    pack: str                     # key to store the batch's pack under
    items: tuple[Item, ...]
    base_file: str | None = None  # decoded-cache file of the delta base version
    cfg: IngestConfig = IngestConfig()  # the delta rules (max depth, minimum gain)


@dataclass(frozen=True)
class ItemResult:
    kind: int          # FULL, DELTA (on the item's base) or SAME (the base chunk itself)
    offset: int        # of its blob in the pack (FULL, DELTA)
    stored: int


@dataclass(frozen=True)
class JobResult:
    items: tuple[ItemResult, ...]
    stored: int        # bytes put in the store (0: no pack was written)
    notes: tuple = ()  # (what, why) of delta bases that could not be read (coded full)


# --- the worker side ---------------------------------------------------------------------

_stores: dict[bytes, object] = {}
_sources: dict[bytes, object] = {}


def _init_worker(nice: int, parent: int) -> None:
    if nice > 0:
        try:
            os.nice(nice)
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


def _open(spec: bytes):
    store = _stores.get(spec)
    if store is None:
        store = _stores[spec] = pickle.loads(spec)
    return store


def _source(spec: bytes):
    src = _sources.get(spec)
    if src is None:
        from s4fs.reader import ChunkSource
        src = _sources[spec] = ChunkSource(_open(spec), cache_bytes=64 << 20,
                                           device="auto", workers=2)
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


def _base_bytes(job: Job, item: Item, base_fd: int | None) -> bytes:
    return base_bytes(base_fd, item.base_range, item.base, _source(job.store))


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


def spool_changed() -> CodecError:
    return CodecError("internal error: the spool changed while its chunks were being "
                      "coded; the file was not stored")


def code_batch(job: Job) -> JobResult:
    """Code one batch and store its pack (runs in a worker process)."""
    from s4fs import codec
    with job_files(job) as (fd, base_fd), collecting_notes() as notes:
        blobs: list[bytes] = []
        results: list[ItemResult] = []
        pos = 0
        for item in job.items:
            data = read_item(fd, item)
            if codec.checksum(data) != item.checksum:
                raise spool_changed()
            blob, kind = _code(job, item, data, base_fd)
            if kind == SAME:
                results.append(ItemResult(SAME, 0, 0))
                continue
            results.append(ItemResult(kind, pos, len(blob)))
            blobs.append(blob)
            pos += len(blob)
        if blobs:
            _open(job.store).put(job.pack, b"".join(blobs))
        return JobResult(tuple(results), pos, tuple(notes))


def _code(job: Job, item: Item, data: bytes, base_fd: int | None) -> tuple[bytes, int]:
    """The same choice as the in-process path: s4fs.ingest.code_chunk, on the CPU."""
    return code_chunk(data, item.dtype, item.checksum, item.base,
                      lambda: _base_bytes(job, item, base_fd), job.cfg, device="cpu")


@dataclass(frozen=True)
class DecodeJob:
    """Chunks to decode into ``target`` (the decoded-cache copy being filled): each item
    is ``(ref, ((offset in chunk, file offset, length), ...))``."""
    store: bytes
    target: str
    items: tuple


def pwrite_all(fd: int, data, offset: int) -> None:
    mv = memoryview(data)
    while len(mv):
        n = os.pwrite(fd, mv, offset)
        mv = mv[n:]
        offset += n


def decode_batch(job: DecodeJob) -> int:
    """Fetch, decode (each chunk checked against its checksum) and place one batch of a
    file's chunks at their file offsets (runs in a worker process)."""
    src = _source(job.store)
    fd = os.open(job.target, os.O_WRONLY)
    try:
        for ref, pieces in job.items:
            data = memoryview(src.get(ref))
            for coff, foff, n in pieces:
                pwrite_all(fd, data[coff: coff + n], foff)
    finally:
        os.close(fd)
    return len(job.items)


def _ping() -> int:
    return os.getpid()


# --- the daemon side ---------------------------------------------------------------------

class Pool:
    """A process pool for coding batches; replaced by a fresh one after a worker died."""

    def __init__(self, workers: int, nice: int) -> None:
        import multiprocessing
        self.workers, self.nice = workers, nice
        # spawn, not fork: the daemon has threads (FUSE, trio, uploads) and maybe CUDA
        self._ctx = multiprocessing.get_context("spawn")
        self._lock = threading.Lock()
        self._exec: ProcessPoolExecutor | None = None

    @property
    def max_in_flight(self) -> int:
        """Batches one session keeps queued: two per worker."""
        return 2 * max(1, self.workers)

    def _executor(self) -> ProcessPoolExecutor:
        with self._lock:
            if self._exec is None:
                self._exec = ProcessPoolExecutor(self.workers, mp_context=self._ctx,
                                                 initializer=_init_worker,
                                                 initargs=(self.nice, os.getpid()))
            return self._exec

    def submit(self, job: Job) -> Future:
        return self._submit(code_batch, job)

    def submit_decode(self, job: DecodeJob) -> Future:
        return self._submit(decode_batch, job)

    def _submit(self, fn, job) -> Future:
        ex = self._executor()
        try:
            return ex.submit(fn, job)
        except BrokenProcessPool:
            self._discard(ex)
            return self._executor().submit(fn, job)

    def result(self, fut: Future, what: str, *, doing: str = "coding",
               then: str = "this version was not stored and the previous one stays"):
        try:
            return fut.result()
        except BrokenProcessPool:
            with self._lock:
                ex = self._exec
            if ex is not None:
                self._discard(ex)
            raise died("a coding worker process", what, doing, then) from None

    def _discard(self, ex: ProcessPoolExecutor) -> None:
        with self._lock:
            if self._exec is ex:
                self._exec = None
        ex.shutdown(wait=False, cancel_futures=True)

    def warm(self) -> list[int]:
        """Start every worker now (a save should not wait for interpreters to start);
        returns their pids."""
        ex = self._executor()
        return sorted({f.result() for f in [ex.submit(_ping) for _ in range(self.workers)]})

    def pids(self) -> list[int]:
        with self._lock:
            ex = self._exec
        procs = getattr(ex, "_processes", None) or {}
        return sorted(procs)

    def close(self) -> None:
        with self._lock:
            ex, self._exec = self._exec, None
        if ex is not None:
            ex.shutdown(wait=True, cancel_futures=True)


class ProcessWide:
    """One pool per process, made on first use and shared by every file (the CPU
    workers here, the GPU worker in ``s4fs.gpu_pool``, the API's save threads in
    ``s4fs.torchsave``)."""

    def __init__(self) -> None:
        self._pool = None
        self._lock = threading.Lock()

    @property
    def current(self):
        """The pool, or None when none was made (or it was shut down)."""
        return self._pool

    def get(self, make):
        with self._lock:
            if self._pool is None:
                self._pool = make()
            return self._pool

    def shutdown(self) -> None:
        with self._lock:
            p, self._pool = self._pool, None
        if p is not None:
            p.close()


_shared = ProcessWide()


def pool(workers: int, nice: int = 0) -> Pool:
    """The process-wide coding pool (one per daemon, shared by every file)."""
    return _shared.get(lambda: Pool(workers, nice))


def shutdown() -> None:
    _shared.shutdown()
