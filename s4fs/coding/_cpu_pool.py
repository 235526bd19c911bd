"""The CPU coding workers: processes that turn spool byte ranges into stored packs.

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

Contract: :class:`~s4fs.coding.CodingPool`'s. A :class:`~s4fs.coding.Pools`
holds one per (workers, nice) (started on first use, started again after a worker died);
:func:`code_batch` runs in a worker; a worker that dies fails the futures of its pool
with :class:`~s4fs.coding.WorkerDied`. Memory: each worker holds at most
one batch (``IngestConfig.batch_bytes``, 16 MiB raw) plus its coded blobs and the codec's
scratch, about 4× the batch (~70 MiB) on top of its interpreter (~60 MiB); the daemon
keeps at most ``2 × workers`` batches in flight.
"""

from __future__ import annotations

import os
import threading
import time
from concurrent.futures import Future, ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool

from s4fs.coding._bases import collecting_notes
from s4fs.coding._jobs import (DecodeJob, Item, ItemResult, Job, JobResult,
                               WorkerDied, died)  # noqa: F401 - WorkerDied: its error
from s4fs.coding._pool import KEEP, CodingPool
from s4fs.coding._rule import SAME, code_chunk
from s4fs.coding._worker import (Copy, init_worker, item_base, job_files, read_item,
                                 read_ranges, source_for, spool_changed, store_for)


# --- the worker side ---------------------------------------------------------------------

# A CPU worker codes and decodes (delta bases, decode ahead) on its CPU only: it never
# makes a CUDA context (one per worker). The pool runs where s4fs.coding.placement puts the pipeline
# on the CPU; a chunk only a GPU decodes fails its batch here, and its reader decodes it
# in the daemon.
DEVICE = "cpu"

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
            store_for(job.store).put(job.pack, b"".join(blobs))
        return JobResult(tuple(results), pos, tuple(notes))


def _code(job: Job, item: Item, data: bytes, base_fd: int | None) -> tuple[bytes, int]:
    """The same choice as the in-process path: the chunk rule (code_chunk), on the
    CPU."""
    pair = None
    if item.pair is not None:
        kind, ranges, ref = item.pair
        pair = (kind, ref, lambda: read_ranges(job.spool, ranges))
    return code_chunk(data, item.dtype, item.checksum, item.base,
                      lambda: item_base(job, item, base_fd, DEVICE), job.cfg, device=DEVICE,
                      pair=pair)


def decode_batch(job: DecodeJob) -> int:
    """Fetch, decode (each chunk checked against its checksum) and place one batch of a
    file's chunks at their file offsets (runs in a worker process)."""
    src = source_for(job.store, DEVICE)
    with Copy(job.target, job.mapped) as copy, src.staged(job.staged), \
            src.preloaded([ref for ref, _ in job.items]):
        for ref, pieces in job.items:
            data = memoryview(src.get(ref))
            for coff, foff, n in pieces:
                copy.place(data[coff: coff + n], foff)
    return len(job.items)


def _ping(hold: float = 0.0) -> int:
    if hold:
        time.sleep(hold)       # busy a moment: the next ping goes to another worker
    return os.getpid()


# --- the daemon side ---------------------------------------------------------------------

class CpuPool(CodingPool):
    """The CPU worker processes: a process pool for coding batches; replaced by a fresh
    one after a worker died."""

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
                                                 initializer=init_worker,
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
               then: str = KEEP):
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
        """Start every worker now and wait until each has answered (a save should not
        wait for interpreters to start); returns their pids. They start at their own low
        priority: a process takes the nice value of the thread that creates it, and the
        pool creates a worker in the thread that submits to it; so all but the first
        are submitted from a short-lived thread at ``nice``, and the interpreters they
        start (imports, on a cold page cache after a remount) yield to the FUSE requests
        and to a checkpoint being loaded right after mounting. The first is submitted
        from here: the pool's own threads, started with it, keep the caller's priority."""
        ex = self._executor()
        futs = [ex.submit(_ping)]

        def spawn() -> None:
            if self.nice > 0:
                try:
                    os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), self.nice)
                except OSError:
                    pass
            futs.extend(ex.submit(_ping) for _ in range(self.workers - 1))

        t = threading.Thread(target=spawn, name="s4fs-workers-spawn", daemon=True)
        t.start()
        t.join()
        answered = {f.result() for f in futs}
        while True:
            # a worker up first may have answered every ping while the others were still
            # starting: ask the ones not heard from yet, holding each answer a moment
            missing = set(self.pids()) - answered
            if not missing:
                return sorted(answered)
            answered |= {f.result() for f in [ex.submit(_ping, 0.02) for _ in missing]}

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
