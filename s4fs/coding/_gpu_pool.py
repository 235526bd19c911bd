"""The GPU worker process: the one process of a mount that owns the GPU.

A mount's daemon moves bytes; it does not code them (the CPU workers: ``_cpu_pool``).
When the mount codes on the GPU (``--device cuda``, or ``auto`` where
``s4fs.codec.resolve_device`` picks it), the same batches the CPU worker processes
take — a file's chunks named by their byte ranges in its spool, a cold file's chunks to
decode ahead into the decoded cache — go to one worker process that owns the GPU
instead. There:

* a batch to code is ``pread`` from the spool, its delta bases read (from the base
  version's decoded copy, else the store), coded by one ``compress_many`` call on the
  process's GPU thread under the chunk rule (its device half: ``_device_batch``; deltas,
  every chunk's checksum taken from its blob's header as the device computed it and
  compared with the daemon's, the CPU as a fallback), and its pack put in the store;
* a batch to decode goes through ``s4fs.chunks.decode_on_gpu`` (every blob checked) and
  is written at its file offsets (``_device_batch.decode_into``).

A few threads in the worker overlap one batch's reads and writes with another's coding;
only the GPU thread touches the device. Before, this ran on threads of the daemon, where
every staging copy, ``pread`` and ``pwrite`` competed for the daemon's interpreter with
the FUSE requests of the save or load it served, and the cuda mount saved and
cold-loaded slower than the CPU workers.

Contract: :class:`~s4fs.coding.CodingPool`'s (the same as the CPU workers'):
:meth:`GpuPool.submit` (a :class:`~s4fs.coding.Job`, its Future holds a
:class:`~s4fs.coding.JobResult`), :meth:`GpuPool.submit_decode` (a
:class:`~s4fs.coding.DecodeJob`), :meth:`GpuPool.result` (raises
:class:`~s4fs.coding.WorkerDied` when the process ended under a batch; the next submit
starts a fresh one), ``max_in_flight`` (batches a session keeps queued), ``warm``,
``pids``, ``close``; and :meth:`GpuPool.decode_blob`, one chunk the daemon reads itself.
Memory: the worker holds at most ``THREADS`` batches on the host
(``IngestConfig.gpu_batch_bytes`` raw each, plus their blobs) and the codec's device
scratch of one batch at a time (about 4× the batch), on top of its CUDA context.
"""

from __future__ import annotations

import importlib
import logging
import os
import pickle
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures.process import BrokenProcessPool

from s4fs.coding import _worker
from s4fs.coding._jobs import DecodeJob, ItemResult, Job, JobResult, died
from s4fs.coding._pool import KEEP, CodingPool
from s4fs import codec
from s4fs.coding._rule import DELTA, FULL, PAIR, SAME, code_pair, delta_prep
from s4fs.errors import CodecError

log = logging.getLogger(__name__)

THREADS = 8            # batches the worker reads, codes or writes at once
DEVICE = "auto"        # the worker decodes nvCOMP planes on the GPU, the others on its CPU
MAX_IN_FLIGHT = 4      # batches to code one session keeps queued (each gpu_batch_bytes)


# --- the worker side ---------------------------------------------------------------------

def code_batch(job: Job) -> JobResult:
    """Code one batch on the GPU and store its pack (runs in the GPU worker process).
    Chunks coded on their pair (s4fs.write.pairs) are coded here on the CPU, as every
    path codes them, the rest of the batch on the GPU."""
    from s4fs.coding._device_batch import code_items
    from s4fs.coding._bases import collecting_notes
    with _worker.job_files(job) as (fd, base_fd), collecting_notes() as notes:
        t0 = time.perf_counter()
        datas = [_worker.read_item(fd, it) for it in job.items]
        paired = _paired(job, datas)
        rest = [k for k in range(len(datas)) if k not in paired]
        prep = [delta_prep(datas[k], job.items[k].base, job.cfg,
                           lambda it=job.items[k]: _worker.item_base(job, it, base_fd,
                                                                     DEVICE))
                for k in rest]
        t1 = time.perf_counter()
        coded = dict(zip(rest, code_items(
            [(datas[k], job.items[k].dtype, job.items[k].base) for k in rest], prep,
            job.cfg))) if rest else {}
        t2 = time.perf_counter()
        results, blobs, pos = [], [], 0
        for k, it in enumerate(job.items):
            if k in paired:
                blob = paired[k]
                results.append(ItemResult(PAIR, pos, len(blob)))
                blobs.append(blob)
                pos += len(blob)
                continue
            blob, base, sum_, _ = coded[k]
            if sum_ != it.checksum:             # the device's hash of what it coded
                raise _worker.spool_changed()
            if blob is None:
                results.append(ItemResult(SAME, 0, 0))
                continue
            results.append(ItemResult(DELTA if base is not None else FULL, pos,
                                              len(blob)))
            blobs.append(blob)
            pos += len(blob)
        if blobs:
            _worker.store_for(job.store).put_parts(job.pack, blobs)
        t3 = time.perf_counter()
        log.info("coded %d chunks (%.1f MiB) in %.0f ms: read %.0f, code %.0f, put %.0f",
                 len(datas), sum(map(len, datas)) / 2**20, 1e3 * (t3 - t0),
                 1e3 * (t1 - t0), 1e3 * (t2 - t1), 1e3 * (t3 - t2))
        return JobResult(tuple(results), pos, tuple(notes))


def _paired(job: Job, datas: list) -> dict:
    """The blobs of the batch's chunks coded on their pair, by position (the CPU's
    ``code_pair``: where the pair does not pay, the chunk is left to the GPU)."""
    out = {}
    for k, (it, data) in enumerate(zip(job.items, datas)):
        if it.pair is None:
            continue
        if codec.checksum(data) != it.checksum:
            raise _worker.spool_changed()
        kind, ranges, ref = it.pair
        blob = code_pair(data, it.dtype, it.checksum,
                         (kind, ref, lambda r=ranges: _worker.read_ranges(job.spool, r)),
                         job.cfg)
        if blob is not None:
            out[k] = blob
    return out


def decode_batch(job: DecodeJob) -> int:
    """Decode one batch of a cold file's chunks on the GPU into its decoded-cache copy
    (runs in the GPU worker process)."""
    from s4fs.coding._device_batch import decode_into
    return decode_into(_worker.source_for(job.store, DEVICE), job)    # logs its times


def decode_blob(blob: bytes, base: bytes | None) -> bytes:
    """One chunk the daemon reads itself (a small file, a read outside a decode
    ahead): decoded on the GPU thread, checked against its checksum."""
    from s4fs import codec
    from s4fs.codec import on_gpu_thread
    return on_gpu_thread(codec.decompress, blob, base=base, device=DEVICE)


def warm_up() -> int:
    """Load CuPy and nvCOMP, code and decode one small batch, so that the first save or
    cold load does not wait for them; the worker's pid."""
    from s4fs.codec import gpu, on_gpu_thread
    gpu.require()
    sample = bytes(range(256)) * 4096

    def round_trip():
        blobs = gpu.compress_many([(sample, "bfloat16")], out="bytes")
        gpu.decompress_many(blobs, out="host")
    on_gpu_thread(round_trip)
    return os.getpid()


_CALLS = {"code": code_batch, "decode": decode_batch, "blob": decode_blob,
          "warm": warm_up}


def _portable(exc: BaseException) -> BaseException:
    """``exc`` if it crosses a pipe intact, else a CodecError that says what it was."""
    try:
        pickle.loads(pickle.dumps(exc))
        return exc
    except Exception:                       # noqa: BLE001 - any unpicklable error
        return CodecError(f"{type(exc).__name__}: {exc}")


def _serve(conn, nice: int, parent: int, init: str | None, threads: int,
           log_level: int = logging.WARNING) -> None:
    """The worker process: run each request on a thread, send each answer back. It logs
    as the daemon does (its standard error is the daemon's), at the daemon's level."""
    logging.basicConfig(level=log_level,
                        format="%(asctime)s.%(msecs)03d s4fs: %(levelname)s %(name)s "
                               "(GPU worker): %(message)s", datefmt="%H:%M:%S")
    _worker.init_worker(nice, parent)
    if init:
        mod, _, fn = init.partition(":")
        getattr(importlib.import_module(mod), fn)()
    send_lock = threading.Lock()

    def answer(jid: int, fut: Future) -> None:
        exc = fut.exception()
        msg = (jid, True, fut.result()) if exc is None else (jid, False, _portable(exc))
        try:
            with send_lock:
                conn.send(msg)
        except (OSError, ValueError):       # the daemon is gone
            os._exit(1)

    with ThreadPoolExecutor(threads, thread_name_prefix="s4fs-gpu-job") as pool:
        while True:
            try:
                req = conn.recv()
            except (EOFError, OSError):
                break
            if req is None:
                break
            jid, kind, job = req
            pool.submit(_CALLS[kind], *job).add_done_callback(
                lambda f, jid=jid: answer(jid, f))


# --- the daemon side ---------------------------------------------------------------------

class _Worker:
    def __init__(self, proc, conn) -> None:
        self.proc, self.conn = proc, conn
        self.futures: dict[int, Future] = {}
        self.send_lock = threading.Lock()


class GpuPool(CodingPool):
    """The GPU worker process, as a pool of one (started on first use, started again
    after it died)."""

    max_in_flight = MAX_IN_FLIGHT

    def __init__(self, nice: int = 0, *, threads: int = THREADS,
                 init: str | None = None) -> None:
        import multiprocessing
        self.nice, self.threads, self.init = nice, threads, init
        # spawn, not fork: the daemon has threads (FUSE, trio, uploads)
        self._ctx = multiprocessing.get_context("spawn")
        self._lock = threading.Lock()
        self._worker: _Worker | None = None
        self._next = 0

    def _start(self) -> _Worker:
        ours, theirs = self._ctx.Pipe()
        proc = self._ctx.Process(target=_serve, name="s4fs-gpu-worker", daemon=True,
                                 args=(theirs, self.nice, os.getpid(), self.init,
                                       self.threads, logging.getLogger().getEffectiveLevel()))
        proc.start()
        theirs.close()
        w = _Worker(proc, ours)
        threading.Thread(target=self._receive, args=(w,), daemon=True,
                         name="s4fs-gpu-answers").start()
        return w

    def _receive(self, w: _Worker) -> None:
        try:
            while True:
                jid, ok, value = w.conn.recv()
                with self._lock:
                    fut = w.futures.pop(jid, None)
                if fut is None or not fut.set_running_or_notify_cancel():
                    continue
                if ok:
                    fut.set_result(value)
                else:
                    fut.set_exception(value)
        except (EOFError, OSError):
            pass
        except Exception:                   # noqa: BLE001 - an answer that did not load
            log.exception("the GPU worker sent an answer that could not be read")
        with self._lock:
            if self._worker is w:
                self._worker = None
            left, w.futures = w.futures, {}
        for fut in left.values():
            if fut.set_running_or_notify_cancel():
                fut.set_exception(BrokenProcessPool("the GPU worker process ended"))
        w.conn.close()
        w.proc.join(timeout=5)

    def _submit(self, kind: str, *args) -> Future:
        fut: Future = Future()
        with self._lock:
            if self._worker is None:
                self._worker = self._start()
            w = self._worker
            self._next += 1
            jid = self._next
            w.futures[jid] = fut
        try:
            with w.send_lock:
                w.conn.send((jid, kind, args))
        except (OSError, ValueError):
            with self._lock:
                mine = w.futures.pop(jid, None) is not None
            # else the answering thread saw the worker end first and failed it already
            if mine and fut.set_running_or_notify_cancel():
                fut.set_exception(BrokenProcessPool("the GPU worker process ended"))
        return fut

    def submit(self, job) -> Future:
        return self._submit("code", job)

    def submit_decode(self, job) -> Future:
        return self._submit("decode", job)

    def decode_blob(self, blob: bytes, base: bytes | None) -> bytes:
        """The raw bytes of one chunk, decoded in the worker (the daemon's own reads of
        GPU-coded chunks)."""
        return self.result(self._submit("blob", bytes(blob), base), "a chunk",
                           doing="decoding", then="the read fails; try it again")

    def result(self, fut: Future, what: str, *, doing: str = "coding",
               then: str = KEEP):
        try:
            return fut.result()
        except BrokenProcessPool:
            raise died("the GPU worker process", what, doing, then) from None

    def warm(self, timeout: float | None = None) -> list[int]:
        """Start the worker and load the GPU codec in it now (waiting at most
        ``timeout`` seconds); its pid. A GPU codec that cannot load there is logged
        (batches are then coded on the CPU in the worker)."""
        try:
            return [self._submit("warm").result(timeout)]
        except Exception as exc:            # noqa: BLE001 - reported, saves still work
            log.warning("the GPU worker could not load the GPU codec: %s", exc)
            return self.pids()

    def pids(self) -> list[int]:
        with self._lock:
            w = self._worker
        return [w.proc.pid] if w is not None and w.proc.is_alive() else []

    def close(self) -> None:
        with self._lock:
            w, self._worker = self._worker, None
        if w is None:
            return
        try:
            w.conn.send(None)
        except (OSError, ValueError):
            pass
        w.proc.join(timeout=30)
        if w.proc.is_alive():
            w.proc.kill()
            w.proc.join(timeout=5)
