"""A write handle's ingest thread: the spool coded while the file is still being written.

The thread feeds the spool's written prefix (:attr:`Spool.frontier`), one step at a
time, to one :class:`~s4fs.write.ingest.IngestSession` (made by the save's
:class:`~s4fs.write.bases.Sessions`, which chose the delta base), at the coding workers' low CPU priority.
At the commit, :meth:`StreamingIngest.manifest` stops it and finishes that session over
the rest of the spool — or, where what it read is no longer what the spool holds, codes
the whole spool again in a new one.

What it read may stop being the spool's bytes in two ways. A write request (or a
truncation) below what the thread has claimed says so itself (:meth:`rewrites`). Under
FUSE passthrough the kernel writes the spool and the handle sees no request, so the
thread follows the spool's size (an ``fstat`` every ``_FOLLOW`` s, through the handle's
``behind``) and records an xxh3-64 of every step it read; the commit hashes each step
again (:meth:`_holds`). The worker processes check what they code against the daemon's
chunk hashes as always; a mismatch there (``SpoolChanged``) also means "code it again",
not a failed save. So the coded bytes are what the thread read, and that is the spool
at the commit.
"""

from __future__ import annotations

import os
import threading
from concurrent.futures import Executor
from typing import TYPE_CHECKING, Callable, Protocol

import xxhash

from s4fs.errors import S4Error, SpoolChanged
from s4fs.manifest import Manifest
from s4fs.write.ingest import IngestSession
from s4fs.write.meta import FileMeta
from s4fs.write.pending import Pending
from s4fs.write.spool import Spool
from s4fs.write.state import State

if TYPE_CHECKING:
    from s4fs.fsconfig import FsConfig
    from s4fs.write.bases import Sessions

_STEP = 4 << 20           # bytes the ingest thread reads from the spool at a time
_FOLLOW = 0.005           # s between looks at a spool the kernel writes (passthrough)


class Fed(Protocol):
    """The file whose spool the thread codes (a :class:`~s4fs.write.WriteHandle`), as
    the thread reads it under the handle's lock; ``fail`` and ``behind`` are called
    with that lock held."""

    path: str
    previous: Manifest | None         # the version the new one replaces (delta lineage)
    spool: Spool
    state: State
    error: BaseException | None
    meta: FileMeta
    pending: Pending

    @property
    def passthrough(self) -> bool: ...
    def behind(self) -> None: ...
    def fail(self, exc: BaseException) -> None: ...


class StreamingIngest:
    """The background ingest of one write handle's spool (``w``), its sessions made by
    ``sessions``; ``checks``: the threads a passthrough commit hashes its steps on.

    Every method is called with the handle's lock (``cond``) held. The thread takes that
    lock to look at the handle (its state, error, spool and mode) and to record what it
    took, and releases it while it reads and codes a step."""

    def __init__(self, w: Fed, cond: threading.Condition, cfg: "FsConfig",
                 sessions: "Sessions", checks: Callable[[], Executor]) -> None:
        self._w, self._cond = w, cond
        self._cfg, self._sessions, self._checks = cfg, sessions, checks
        self._session: IngestSession | None = None
        self.ingested = 0                 # spool bytes the session has consumed
        self._claimed = 0                 # ... plus those the thread is reading now
        self._ok = True                   # False once bytes it consumed were rewritten
        # passthrough: (offset, length, xxh3-64) of each step the thread read; the
        # commit checks them against the spool (a rewrite is invisible to the handle)
        self._steps: list[tuple[int, int, int]] = []
        self._thread: threading.Thread | None = None
        self._stop = False

    @property
    def running(self) -> bool:
        """Whether the thread is started and not yet out."""
        return self._thread is not None

    def rewrites(self, offset: int) -> None:
        """The spool's bytes from ``offset`` on change (a write request, a truncation):
        where the thread already took any of them, its session no longer matches."""
        if offset < self._claimed:
            self._ok = False

    def kick(self) -> None:
        """Wake (or start) the thread: the written prefix grew.

        A ``--writeback`` handle fed by write requests codes nothing while the file is
        being written: in one Python process, coding next to the FUSE requests slows the
        writes themselves (docs/BENCHMARKS.md), and what a writeback mount promises is
        the shortest stall; the committer codes the whole spool once it is accepted.
        Under passthrough no request reaches the daemon, so the default mode follows the
        spool (the committer then codes only what is left); ``--writeback`` does only
        where asked (``FsConfig.code_while_written``: coding after close blocks the
        training loop less, for the same drain; docs/BENCHMARKS.md)."""
        if self._cfg.writeback and not (self._w.passthrough and
                                        self._cfg.code_while_written):
            return
        if self._thread is None and not self._stop:
            self._thread = threading.Thread(target=self._run, daemon=True,
                                            name="s4fs-ingest")
            self._thread.start()
        self._cond.notify_all()

    def stop(self) -> None:
        """Stop the thread and wait until it is out (the wait releases the lock)."""
        self._stop = True
        self._cond.notify_all()
        while self._thread is not None:
            self._cond.wait()

    def abort(self) -> None:
        """Drop the session and what it coded (nothing it wrote is committed)."""
        if self._session is not None:
            self._session.abort()
            self._session = None

    def reset(self, *, ok: bool) -> None:
        """Start again from the spool's first byte: after a commit (``ok``: a later
        write starts a new version, streamed afresh) or after a failed one (the next
        try codes the whole spool)."""
        self.ingested = self._claimed = 0
        self._steps = []
        self._ok = ok
        self._stop = False

    # --- at the commit ---------------------------------------------------------------

    def manifest(self) -> Manifest:
        """(The commit, the handle ``COMMITTING``.) Stop the thread and finish: the
        session it fed, over the rest of the spool, where what it read still holds; else
        a new session over the whole spool. Raises on failure, the session aborted (the
        caller then calls ``reset(ok=False)``)."""
        w = self._w
        self.stop()
        if w.error is not None:            # the thread failed the handle
            raise w.error
        s, self._session = self._session, None
        if s is not None and not (self._ok and self._holds()):
            s.abort()
            s = None
        try:
            return self._finish(s)
        except SpoolChanged:
            if s is None:
                raise
            # bytes changed under the streaming coders (a rewrite they caught): ingest
            # the whole spool again
            return self._finish(None)

    def _finish(self, s: IngestSession | None) -> Manifest:
        """Feed the spool's rest to the streaming session ``s`` (None: a new session, the
        whole spool) and finish it; aborted if that fails."""
        w = self._w
        start = self.ingested
        if s is None:
            s = self._sessions.new(w.path, w.previous, w.spool.name)
            start = 0
        try:
            self._feed(s, start, w.spool.size)
            meta = w.meta
            return meta.owned(s.finish(mode=meta.mode, mtime_ns=meta.mtime_ns,
                                       atime_ns=meta.atime_ns))
        except BaseException:
            s.abort()
            raise

    def _feed(self, s: IngestSession, lo: int, hi: int) -> None:
        spool = self._w.spool
        while lo < hi:
            data = spool.read(lo, min(_STEP, hi - lo))
            if not data:
                raise S4Error(f"internal error: the spool of {self._w.path!r} is shorter "
                              f"than its size; nothing was committed")
            s.write(data, stable=True)
            lo += len(data)

    def _holds(self) -> bool:
        """Whether the spool still holds what the thread read of it: always where every
        write came as a request (a rewrite of read bytes cleared ``_ok``); under
        passthrough, each step's bytes hashed again, in parallel on the runtime's check
        threads (pread and xxhash release the GIL)."""
        w = self._w
        if not w.passthrough:
            return True
        if self.ingested > w.spool.size:
            return False
        fd = w.spool.fd

        def holds(step):
            off, n, digest = step
            return xxhash.xxh3_64_intdigest(os.pread(fd, n, off)) == digest
        return all(self._checks().map(holds, self._steps))

    # --- the thread ------------------------------------------------------------------

    def _run(self) -> None:
        """Claim the next step of the written prefix, code it (the session made at the
        first step), and again, until stopped or the handle failed."""
        from s4fs.coding import lower_priority
        w = self._w
        lower_priority(self._cfg.ingest.nice)
        try:
            while (claim := self._claim()) is not None:
                s, lo, hi = claim
                if s is None:
                    s = self._sessions.new(w.path, w.previous, w.spool.name)
                    with self._cond:
                        self._session = s
                self._take(s, lo, hi)
        except BaseException as exc:       # a failed upload, a codec error, ...
            with self._cond:
                self._failed(exc)
        finally:
            with self._cond:
                self._thread = None
                self._cond.notify_all()

    def _claim(self) -> tuple[IngestSession | None, int, int] | None:
        """Wait until there is a step to code: (the session, or None before the first
        step; the step's first byte; its end), claimed; None once the thread should end."""
        w = self._w
        with self._cond:
            while not self._stop and w.error is None and (
                    not self._ok
                    or w.state not in (State.STREAMING, State.SPOOLED)
                    or self.ingested >= w.spool.frontier):
                if w.passthrough:     # no write request says it grew: look
                    self._cond.wait(_FOLLOW)
                    w.behind()
                else:
                    self._cond.wait()
            if self._stop or w.error is not None:
                return None
            lo = self.ingested
            self._claimed = hi = min(w.spool.frontier, lo + _STEP)
            return self._session, lo, hi

    def _take(self, s: IngestSession, lo: int, hi: int) -> None:
        """Read the spool's bytes ``lo:hi`` (without the lock) and code them; under
        passthrough their hash is recorded as a step."""
        w = self._w
        data = os.pread(w.spool.fd, hi - lo, lo)
        step = (lo, len(data), xxhash.xxh3_64_intdigest(data)) if w.passthrough else None
        s.write(data, stable=True)
        with self._cond:
            if self._ok:
                self.ingested = lo + len(data)
                if step is not None:
                    self._steps.append(step)
            self._claimed = self.ingested

    def _failed(self, exc: BaseException) -> None:
        """(Under the lock.) The thread's coding failed. Writeback, or ``SpoolChanged``
        (bytes rewritten under the coders, which passthrough hides from the handle): the
        commit codes the whole spool again (writeback: and retries until that works).
        Otherwise the save has failed."""
        changed = isinstance(exc, SpoolChanged)
        if self._cfg.writeback or changed:
            self.abort()
            self._ok = False
            if not changed:
                self._w.pending.note(exc)
        else:
            self._w.fail(exc)
