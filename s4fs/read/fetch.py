"""Fetch ahead: the stored bytes of a cold file's decode-ahead batches, brought from a
remote store with many ranged GETs in flight into a local staging file, so that the
workers decoding the batches read local bytes.

Without it each decode worker fetched its batch and then decoded it: no more GETs in
flight than workers (two on a 2-core node), none while a worker decoded, and the link
idle between. A :class:`Fetch` takes a :class:`~s4fs.read.fill.Fill`'s batches in the
fill's order (the batch of the first read first), plans each batch's stored runs the
way :meth:`ChunkSource.preloaded` will read them (the chunks and the delta bases they
decode through, adjacent blobs of a pack in one run), cuts the runs into parts of at
most :data:`PART` bytes and fetches the parts on a shared pool of :data:`THREADS`
threads, ``pwrite``-ing each at its place in ``<cache>/decoded/.fetch-<id>``. When every
part of a batch is in, the batch is ready: its decode job names the staging file and
where each run lies in it (``DecodeJob.staged``), and the worker's reads of those ranges
come from there (``ChunkSource.staged``). Staged bytes are checked like the store's:
each blob against the manifest's checksum when it is decoded, the whole file against
its hash at the end of the fill.

Memory: one reused buffer of :data:`PART` bytes per fetch thread (``THREADS × PART``,
32 MiB, for the life of the process once a remote file was read cold), plus the staging
file's pages in the page cache — at most the file's stored bytes, written shortly before
they are decoded and dropped (the file unlinked) when the fill ends.

A part that fails (the store down past its retries, an object missing or short) ends
the fetch: every batch not yet ready is reported failed, the fill ends, and its readers
decode in the daemon, which reports the error if it persists.
"""

from __future__ import annotations

import logging
import os
import threading

from s4fs.errors import MissingData, NotFound

log = logging.getLogger(__name__)

PREFIX = ".fetch-"
PART = 4 << 20          # the most bytes of one ranged GET
THREADS = 8             # GETs in flight, for every fetch of a process together

_buffers = threading.local()


def _buffer() -> bytearray:
    buf = getattr(_buffers, "buf", None)
    if buf is None:
        buf = _buffers.buf = bytearray(PART)
    return buf


def batch_runs(batch) -> list[list]:
    """The stored runs ``[pack, lo, hi]`` a batch's decode reads: its chunks and the
    delta bases they decode through, as ``ChunkSource.preloaded`` plans them (so each
    range it reads lies inside one run fetched here)."""
    from s4fs.chunks import plan_runs
    chain, seen = [], set()
    for ref, _ in batch:
        r = ref
        while r is not None and r.key() not in seen:
            seen.add(r.key())
            chain.append(r)
            r = r.base
    runs, _ = plan_runs(chain)
    return runs


class Fetch:
    """The stored bytes of ``batches`` (in that order) fetched from ``store`` into the
    staging file ``path``, once :meth:`start` ed. ``on_ready(k, staged)`` is called once
    batch ``k``'s bytes are all in (``staged`` for its ``DecodeJob``); ``on_failed(k,
    exc)`` once for each batch that never will be. Both from the fetch threads (or
    ``start``'s caller)."""

    def __init__(self, store, batches: list, path: str, on_ready, on_failed,
                 part: int = PART) -> None:
        self.store, self.path = store, path
        self._on_ready, self._on_failed = on_ready, on_failed
        self._lock = threading.Lock()
        self._stop: BaseException | None = None
        self._staged: list[tuple] = []
        self._left: list[int] = []
        self._running = 0                    # parts submitted and not yet ended
        self._closed = False
        self._parts = parts = []
        at = 0
        for k, batch in enumerate(batches):
            staged = []
            n = 0
            for pack, lo, hi in batch_runs(batch):
                staged.append((pack, lo, hi, at))
                for p in range(lo, hi, part):
                    parts.append((k, pack, p, min(hi, p + part), at + p - lo))
                    n += 1
                at += hi - lo
            self._staged.append(tuple(staged))
            self._left.append(n)
        self.nbytes = at
        self.fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            os.ftruncate(self.fd, at)
        except OSError:
            self.close()
            raise

    def start(self, executor) -> None:
        """Submit the fetch of every part to ``executor`` (a batch with nothing stored is
        ready at once)."""
        for k, left in enumerate(self._left):
            if not left:                     # nothing stored: all-zero or empty chunks
                self._ready(k)
        parts, self._parts = self._parts, []
        self._running = len(parts)
        for i, p in enumerate(parts):
            try:
                fut = executor.submit(self._part, *p)
            except RuntimeError as exc:      # the executor was shut down (unmounting)
                with self._lock:
                    self._running -= len(parts) - i
                self._fail(exc)
                return
            fut.add_done_callback(lambda f, k=p[0]: self._part_done(f, k))

    def _part(self, k: int, pack: str, lo: int, hi: int, at: int) -> None:
        if self._stop is not None:
            return
        buf = memoryview(_buffer())[: hi - lo]
        try:
            got = self.store.get_into(pack, lo, hi, buf)
        except NotFound:
            raise MissingData(f"object {pack} is missing from the store "
                              f"({self.store.url})") from None
        if got != hi - lo:
            raise MissingData(f"object {pack} of the store ({self.store.url}) ends at "
                              f"{lo + got}, before the {hi - lo} bytes at {lo} it should "
                              f"hold")
        done = 0
        while done < len(buf):
            done += os.pwrite(self.fd, buf[done:], at + done)

    def _part_done(self, fut, k: int) -> None:
        exc = fut.exception()
        with self._lock:
            self._running -= 1
            ready = False
            if exc is None and self._stop is None and self._left[k] > 0:
                self._left[k] -= 1
                ready = self._left[k] == 0
            last = self._closed and self._running == 0
        if exc is not None:
            self._fail(exc)
        elif ready:
            self._ready(k)
        if last:
            self._close_fd()

    def _ready(self, k: int) -> None:
        with self._lock:
            self._left[k] = -1                # reported
        self._on_ready(k, (self.path, self._staged[k]))

    def _fail(self, exc: BaseException) -> None:
        with self._lock:
            if self._stop is not None:
                return
            self._stop = exc
            failed = [k for k, left in enumerate(self._left) if left >= 0]
            for k in failed:
                self._left[k] = -1
        log.warning("fetching ahead into %s failed: %s", self.path, exc)
        for k in failed:
            self._on_failed(k, exc)

    def close(self) -> None:
        """Stop fetching what is left and remove the staging file (call it once every
        decode job naming the file has ended); its descriptor is closed when the last
        part running has ended."""
        with self._lock:
            if self._stop is None:
                self._stop = RuntimeError("the fetch was closed")
            self._closed = True
            idle = self._running == 0
        try:
            os.unlink(self.path)
        except OSError:
            pass
        if idle:
            self._close_fd()

    def _close_fd(self) -> None:
        with self._lock:
            fd, self.fd = self.fd, -1
        if fd >= 0:
            os.close(fd)
