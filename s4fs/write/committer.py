"""Background commits of a ``--writeback`` mount: retried, reported, never dropped.

:meth:`Committer.submit` queues a write handle whose ``close()`` was accepted (its bytes
are all in its spool and journalled). One thread commits queued handles in order; a
commit that fails (the store is down, access denied) is retried with a growing delay
(1 s doubling to 60 s) for as long as the mount runs, its error kept for ``status``,
``/metrics`` and ``/healthz``; the spool and the journal entry stay until it succeeds.

:meth:`sync` waits until everything queued before the call is committed, and returns the
files that failed since (so ``s4fs sync`` can fail naming them) instead of waiting
forever on a store that is down.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Protocol

from s4fs.write.pending import Pending

log = logging.getLogger(__name__)

RETRY_FIRST = 1.0
RETRY_MAX = 60.0


class Waiting(Protocol):
    """An accepted file waiting for its commit (a :class:`~s4fs.write.WriteHandle`)."""

    path: str
    size: int
    pending: Pending

    def background_commit(self) -> bool:
        """Commit it; True when nothing is left to do for it. Never raises."""


class Committer:
    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._queue: list[Waiting] = []    # pending, in the order accepted
        self._due: dict[int, float] = {}          # id(handle) -> when to try next
        self._stop = False
        self._thread = threading.Thread(target=self._loop, name="s4fs-committer",
                                        daemon=True)
        self._thread.start()

    def submit(self, w: Waiting) -> None:
        with self._cond:
            if w not in self._queue:
                self._queue.append(w)
            self._due[id(w)] = 0.0
            self._report()
            self._cond.notify_all()

    def pending(self) -> list[Waiting]:
        with self._cond:
            return list(self._queue)

    def wait_for(self, paths: set[str], timeout: float) -> bool:
        """Wait until no file of ``paths`` is pending on its first try (True), for at
        most ``timeout`` seconds (False). A file whose commit failed is not waited for:
        its retry waits for a backoff, and meanwhile this thread's own file may be the
        one the committer works on. Returns at once on the committer's own thread."""
        def first_try() -> bool:
            return any(w.path in paths and w.pending.attempts == 0 for w in self._queue)

        if threading.current_thread() is self._thread:
            with self._cond:
                return not first_try()
        deadline = time.monotonic() + timeout
        with self._cond:
            while first_try():
                left = deadline - time.monotonic()
                if left <= 0 or self._stop:
                    return False
                self._cond.wait(left)
            return True

    def _loop(self) -> None:
        while True:
            with self._cond:
                while not self._stop:
                    now = time.monotonic()
                    ready = [w for w in self._queue if self._due.get(id(w), 0.0) <= now]
                    if ready:
                        break
                    wake = min((self._due.get(id(w), 0.0) for w in self._queue),
                               default=now + 3600)
                    self._cond.wait(max(0.01, wake - now))
                if self._stop:
                    return
                w = ready[0]
            done = w.background_commit()          # never raises; False: try again later
            with self._cond:
                if done:
                    if w in self._queue:
                        self._queue.remove(w)
                    self._due.pop(id(w), None)
                else:
                    tries = w.pending.attempts
                    delay = min(RETRY_MAX, RETRY_FIRST * 2 ** max(0, tries - 1))
                    self._due[id(w)] = time.monotonic() + delay
                    log.error("commit of %r failed (attempt %d, next in %.0f s): %s",
                              w.path, tries, delay, w.pending.last_error)
                self._report()
                self._cond.notify_all()

    def _report(self) -> None:
        from s4fs import metrics
        q = self._queue
        metrics.set_pending(len(q), sum(w.size for w in q),
                            sum(1 for w in q if w.pending.attempts))

    def sync(self, timeout: float | None = None) -> list[Waiting]:
        """Wait until every handle queued now is committed, or has failed at least once
        after this call began; returns those still failing (empty: all committed)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._cond:
            waiting = list(self._queue)
            marks = {id(w): w.pending.attempts for w in waiting}
            for w in waiting:
                self._due[id(w)] = 0.0            # try now, not after the backoff
            self._cond.notify_all()
            while True:
                left = [w for w in waiting if w in self._queue]
                unsettled = [w for w in left if w.pending.attempts <= marks[id(w)]]
                if not unsettled:
                    return left
                if deadline is not None and time.monotonic() >= deadline:
                    return left
                self._cond.wait(0.2 if deadline is None
                                else max(0.01, min(0.2, deadline - time.monotonic())))

    def close(self) -> None:
        with self._cond:
            self._stop = True
            self._cond.notify_all()
        self._thread.join(timeout=10)
