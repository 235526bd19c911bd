"""The worker processes one owner starts and stops: :class:`Pools`."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Callable

from s4fs.coding._config import IngestConfig, placement
from s4fs.coding._pool import CodingPool
from s4fs.coding._threads import DECODE_THREADS, ThreadPool, lower_priority


class Pools:
    """The coding worker processes of one owner (s4fs.runtime's ``Runtime``): CPU
    workers, one pool per (workers, nice), and the one GPU worker process; and the
    threads in-process sessions code and decode on (``coding.ThreadPool``). Each is made
    on first use and shared by every file, all stopped by :meth:`close` (a later use
    starts them again). ``threads``: the owner's named executors (``Runtime.thread``),
    which :meth:`thread` hands to the sessions (their pack uploads); the owner stops
    them. ``gpu_worker_init``: "module:function" run first in a new GPU worker (tests
    install the emulated GPU there)."""

    def __init__(self, threads: Callable[[str, int], ThreadPoolExecutor],
                 gpu_worker_init: str | None = None) -> None:
        self.thread = threads
        self.gpu_worker_init = gpu_worker_init
        self._lock = threading.Lock()
        self._cpu: dict[tuple[int, int], CodingPool] = {}
        self._gpu: CodingPool | None = None
        self._codec: ThreadPoolExecutor | None = None
        self._decode: ThreadPoolExecutor | None = None

    def cpu(self, workers: int, nice: int = 0) -> CodingPool:
        """The CPU worker processes for (``workers``, ``nice``)."""
        from s4fs.coding._cpu_pool import CpuPool
        with self._lock:
            p = self._cpu.get((workers, nice))
            if p is None:
                p = self._cpu[workers, nice] = CpuPool(workers, nice)
            return p

    def gpu(self, nice: int = 0) -> CodingPool:
        """The GPU worker process (the first ``nice`` asked for it stays)."""
        from s4fs.coding import _gpu_pool
        with self._lock:
            if self._gpu is None:
                self._gpu = _gpu_pool.GpuPool(nice, threads=_gpu_pool.THREADS,
                                              init=self.gpu_worker_init)
            return self._gpu

    def codec_threads(self, workers: int, nice: int = 0) -> ThreadPoolExecutor:
        """The threads in-process sessions code on (the first size asked for stays)."""
        with self._lock:
            if self._codec is None:
                self._codec = ThreadPoolExecutor(workers, thread_name_prefix="s4fs-codec",
                                                 initializer=lower_priority,
                                                 initargs=(nice,))
            return self._codec

    def decode_threads(self) -> ThreadPoolExecutor:
        """The threads an in-process decode ahead runs its batches on."""
        with self._lock:
            if self._decode is None:
                self._decode = ThreadPoolExecutor(DECODE_THREADS,
                                                  thread_name_prefix="s4fs-gpu-fill")
            return self._decode

    def for_ingest(self, cfg: IngestConfig) -> CodingPool:
        """The process pool that codes and decodes ahead for a mount (``cfg.processes``):
        the CPU worker processes, or the GPU worker process where
        :func:`~s4fs.coding.placement` puts the pipeline on the GPU."""
        if placement(cfg).gpu:
            return self.gpu(cfg.nice)
        return self.cpu(cfg.workers, cfg.nice)

    def decode_ahead(self, cfg: IngestConfig, source, gpu_batch: int):
        """``(pool, batch bytes)`` that decode a cold file ahead under ``cfg``, or None
        where :func:`~s4fs.coding.placement` decodes only as it is read (threads of this
        process on its CPU): the worker processes; else, on the GPU, threads of this
        process decoding ``source``'s chunks there, in batches of at most ``gpu_batch``."""
        where = placement(cfg)
        if not where.decodes_ahead:
            return None
        if where.processes:
            pool = self.for_ingest(cfg)
        else:
            pool = ThreadPool(cfg, source, pools=self)
        batch = where.batch_bytes(cfg)
        return pool, min(batch, gpu_batch) if where.gpu else batch

    def cpu_started(self) -> bool:
        """Whether any CPU worker pool was made (since the last :meth:`close`)."""
        with self._lock:
            return bool(self._cpu)

    def close(self) -> None:
        """Stop every worker process; wait for the batches running."""
        with self._lock:
            pools = [*self._cpu.values(), *([self._gpu] if self._gpu is not None else [])]
            self._cpu, self._gpu = {}, None
            threads = [t for t in (self._codec, self._decode) if t is not None]
            self._codec = self._decode = None
        for p in pools:
            p.close()
        for t in threads:
            t.shutdown(wait=True, cancel_futures=True)
