"""In-process coding: threads of the calling process, for the Python API's sessions
(which hold the bytes in memory and have no spool), ``--workers 0``, and a cold file's
decode ahead on the GPU of a process that has no GPU worker.

:class:`ThreadPool` is a :class:`~s4fs.coding.CodingPool` over two process-wide thread
pools: the codec threads (at a lower CPU priority) that code a
:class:`~s4fs.coding.ChunkBatch` — chunk by chunk on the CPU, or as one batch on the
process's GPU thread when the config puts the pipeline on the GPU — and the GPU decode
threads. :class:`GpuBatches` gathers a session's chunks into GPU batches of about
``IngestConfig.gpu_batch_bytes`` and gives each chunk a Future of its own.
"""

from __future__ import annotations

import contextlib
import os
import threading
from concurrent.futures import Future

from s4fs import codec
from s4fs.coding._bases import base_bytes
from s4fs.coding._config import IngestConfig, placement
from s4fs.coding._device_batch import code_items, decode_into
from s4fs.coding._jobs import ChunkBatch, DecodeJob
from s4fs.coding._pool import KEEP, CodingPool
from s4fs.coding._rule import chunk_result, delta_prep
from s4fs.manifest import ChunkRef

# The GPU decode ahead in-process: eight batches in flight (reading, copying and writing
# around the one GPU thread's decodes; s4fs.runtime.RuntimeConfig.gpu_fill_batch says
# how large).
DECODE_THREADS = 8


def lower_priority(nice: int) -> None:
    """Give the calling thread (Linux: threads have their own nice value) a lower CPU
    priority; a no-op where that is not possible."""
    if nice <= 0:
        return
    try:
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), nice)
    except (AttributeError, OSError):
        pass


class ThreadPool(CodingPool):
    """Coding on threads of this process, for one session (or one decode ahead).

    ``source`` (a ChunkSource) gives the delta bases' bytes (None: every chunk is coded
    whole) and, for :meth:`submit_decode`, the chunks to decode; ``base_path`` is the
    base version's decoded copy, read first for a GPU batch's bases. A CPU batch is
    coded chunk by chunk under the chunk rule (checksums taken here); a GPU batch (the
    config's pipeline is "cuda") in one call on the GPU thread (``_device_batch``).
    :meth:`submit_decode` decodes on this process's GPU. The threads are ``pools``'s,
    shared by every session of their owner: :meth:`close` leaves them running."""

    def __init__(self, cfg: IngestConfig, source=None, base_path: str | None = None, *,
                 pools) -> None:
        self.cfg, self.source, self.base_path = cfg, source, base_path
        self.pools = pools
        self.gpu = placement(cfg, spool=False).gpu

    @property
    def max_in_flight(self) -> int:
        """Chunks one session keeps being coded: ``max_pending_chunks``, else two per
        codec thread."""
        return self.cfg.max_pending_chunks or 2 * self.cfg.workers

    def submit(self, job: ChunkBatch) -> Future:
        code = self._code_on_gpu if self.gpu else self._code_on_cpu
        return self.pools.codec_threads(self.cfg.workers, self.cfg.nice).submit(code,
                                                                               job.items)

    def submit_decode(self, job: DecodeJob) -> Future:
        return self.pools.decode_threads().submit(decode_into, self.source, job)

    def result(self, fut: Future, what: str, *, doing: str = "coding", then: str = KEEP):
        return fut.result()

    def close(self) -> None:
        pass

    def _code_on_cpu(self, items) -> list:
        out = []
        with self._base_file(items) as fd:
            for data, dtype, base, where, *pair in items:
                sum_ = codec.checksum(data)
                if self.source is None:
                    base = None
                out.append(chunk_result(data, dtype, sum_, base,
                                        lambda base=base, where=where:
                                        base_bytes(fd, where, base, self.source), self.cfg,
                                        pair=pair[0] if pair else None))
        return out

    @contextlib.contextmanager
    def _base_file(self, items):
        """The base version's decoded copy, open for reading while a batch that has delta
        bases is coded (None: no copy, or nothing to read from it)."""
        fd = None
        if self.base_path is not None and any(it[3] is not None for it in items):
            try:
                fd = os.open(self.base_path, os.O_RDONLY)
            except OSError:
                fd = None
        try:
            yield fd
        finally:
            if fd is not None:
                os.close(fd)

    def _code_on_gpu(self, items) -> list:
        prep = self._prepare_bases(items)
        return code_items([it[:3] for it in items], prep, self.cfg)

    def _prepare_bases(self, items) -> list:
        """Per chunk, ``delta_prep``'s answer. Base bytes come from the base version's
        decoded copy when it holds them intact (checked against the manifest's
        checksum), else from the store."""
        with self._base_file(items) as fd:
            return [delta_prep(data, base, self.cfg,
                               lambda base=base, where=where:
                               base_bytes(fd, where, base, self.source))
                    for data, _, base, where in items]


class GpuBatches:
    """A session's chunks gathered into GPU batches of about ``cfg.gpu_batch_bytes``;
    each batch gets its delta bases (read from the base version's decoded copy where
    there is one) on the codec threads, then is coded by one
    ``s4fs.codec.gpu.compress_many`` call on the process's GPU thread while the next
    batch fills. The choice of delta or full coding is the chunk rule's; a batch the GPU
    cannot code (out of memory, a driver error) is coded on the CPU instead, with a
    warning, so a save never fails for it. Each chunk's Future resolves with
    ``(blob | None, base ref | None, checksum, raw length)``."""

    def __init__(self, pool: ThreadPool) -> None:
        self.pool = pool
        self.items: list[tuple] = []          # (data, dtype, base ref, where, Future)
        self.nbytes = 0
        cfg = pool.cfg
        self.batch_chunks = max(1, -(-cfg.gpu_batch_bytes // cfg.chunk_size))

    def add(self, data, dtype: str, base: ChunkRef | None, where) -> Future:
        fut: Future = Future()
        self.items.append((data, dtype, base, where, fut))
        self.nbytes += len(data)
        if self.nbytes >= self.pool.cfg.gpu_batch_bytes:
            self.flush()
        return fut

    def flush_if_holding(self, fut: Future) -> None:
        if any(it[-1] is fut for it in self.items):
            self.flush()

    def flush(self) -> None:
        if not self.items:
            return
        batch, self.items, self.nbytes = self.items, [], 0
        futs = [it[-1] for it in batch]
        done = self.pool.submit(ChunkBatch(tuple(it[:4] for it in batch)))
        done.add_done_callback(lambda f: _resolve(f, futs))

    def drop(self) -> None:
        for *_, fut in self.items:
            fut.cancel()
        self.items, self.nbytes = [], 0


def _resolve(done: Future, futs: list[Future]) -> None:
    """Hand a batch's results (or its error) to each chunk's Future."""
    exc = done.exception()
    results = done.result() if exc is None else [None] * len(futs)
    for fut, res in zip(futs, results):
        if fut.set_running_or_notify_cancel():
            if exc is not None:
                fut.set_exception(exc)
            else:
                fut.set_result(res)
