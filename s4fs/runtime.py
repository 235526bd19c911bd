"""The composition root: one owner of every worker process and thread s4fs starts.

A :class:`Runtime` makes each on first use and stops them all in :meth:`Runtime.close`:
the coding worker processes (:class:`s4fs.coding.Pools`), the executors of every
session's pack uploads (``s4fs.write.ingest``), of the API's saves (``s4fs.torch.save``:
async saves, CRC-32s, the device save's hashing) and of a mount's passthrough checks
(``s4fs.write.handle``), and the codec's GPU thread; it keeps the stages of the last
device save and load (:attr:`Runtime.stages`). A mount's daemon builds one and closes it
at exit; the Python API
shares :func:`current`, closed at interpreter exit. A :class:`~s4fs.fs.Filesystem` uses
the runtime it is given (its caller's to close) or :func:`current`.
"""

from __future__ import annotations

import atexit
import logging
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from s4fs.codec import stop_gpu_thread
from s4fs.coding import Pools


@dataclass(frozen=True)
class RuntimeConfig:
    """The knobs of a runtime.

    ``gpu_worker_init``: "module:function" run first in a new GPU worker process (tests
    install the emulated GPU there); None in normal use. ``gpu_fill_batch``: the most
    bytes of one GPU decode-ahead batch: small batches, several in flight around the one
    GPU thread, so a reader's first bytes do not wait for a whole large batch
    (docs/BENCHMARKS.md, "Measurements behind the code's choices")."""

    gpu_worker_init: str | None = None
    gpu_fill_batch: int = 16 << 20


class Runtime:
    """The worker processes and threads of one owner, made on first use, stopped by
    :meth:`close` (a later use makes them again)."""

    def __init__(self, cfg: RuntimeConfig | None = None) -> None:
        self.cfg = cfg or RuntimeConfig()
        self._lock = threading.Lock()
        self._threads: dict[str, ThreadPoolExecutor] = {}
        self.pools = Pools(self.thread, gpu_worker_init=self.cfg.gpu_worker_init)
        # "save" / "load": the seconds per stage of the last device save and load of the
        # filesystems on this runtime (s4fs.torch; benchmarks print them)
        self.stages: dict[str, dict[str, float]] = {}
        # what the Python API opened on this runtime, by key (s4fs.paths: a Filesystem
        # per store URL); closed before the threads and processes they use
        self._opened: dict[str, object] = {}
        self._opened_lock = threading.Lock()     # not _lock: making one asks thread()

    def opened(self, key: str, make, stale=None):
        """The object kept under ``key`` (anything with ``close()``), made by ``make()``
        on first use, or again where ``stale(it)`` says it no longer fits (it is closed
        first). :meth:`close_opened` and :meth:`close` close them."""
        with self._opened_lock:
            it = self._opened.get(key)
            if it is not None and stale is not None and stale(it):
                it.close()
                it = None
            if it is None:
                it = self._opened[key] = make()
            return it

    def close_opened(self) -> None:
        """Close everything :meth:`opened` made (a failure to close one is logged)."""
        with self._opened_lock:
            opened, self._opened = list(self._opened.values()), {}
        for it in opened:
            try:
                it.close()
            except Exception:                    # noqa: BLE001 - the others still close
                logging.getLogger("s4fs").warning("closing %r", it, exc_info=True)

    def thread(self, name: str, workers: int = 1) -> ThreadPoolExecutor:
        """The executor called ``name``, of ``workers`` threads (the count of its first
        use): with one, what is submitted to it runs one after another (async saves;
        the device save's hashing, one codec stream kept); with more, side by side (a
        passthrough spool hashed again at its commit, the packs every session uploads:
        ``s4fs.write.ingest``, through ``pools.thread``)."""
        with self._lock:
            ex = self._threads.get(name)
            if ex is None:
                ex = self._threads[name] = ThreadPoolExecutor(workers,
                                                              thread_name_prefix=name)
            return ex

    def close(self) -> None:
        """Close what the API opened on it, wait for what was submitted, then stop the
        threads, the worker processes and the codec's GPU thread."""
        self.close_opened()
        with self._lock:
            threads, self._threads = list(self._threads.values()), {}
        for ex in threads:
            ex.shutdown(wait=True)
        self.pools.close()
        stop_gpu_thread()


# The one process-wide runtime: the plain Python API's (s4fs.save, s4fs.open), which has
# no owner to hand one down; a mount's daemon and the tests make their own.
_current: Runtime | None = None
_current_lock = threading.Lock()


def current() -> Runtime:
    """The process's runtime for the Python API: made on first use, closed at
    interpreter exit."""
    global _current
    with _current_lock:
        if _current is None:
            _current = Runtime()
            atexit.register(_current.close)
        return _current
