"""``--writeback``: a version whose ``close()`` was accepted and waits for its commit.

A :class:`~s4fs.write.handle.WriteHandle` keeps one :class:`Pending`: since when its
spool is accepted (journalled, :mod:`s4fs.write.journal`, so that a crash replays it),
how many of its background commits failed and the last error (for ``s4fs status``,
``/metrics`` and ``/healthz``; the :class:`~s4fs.write.committer.Committer` waits longer
before each next try).
"""

from __future__ import annotations

import time

from s4fs import metrics
from s4fs.write.journal import Entry, Journal
from s4fs.write.meta import FileMeta
from s4fs.write.spool import Spool

__all__ = ["Pending"]


class Pending:
    def __init__(self, journal: Journal) -> None:
        self._journal = journal
        self.since = 0.0                  # time.time() of the acceptance; 0: none
        self.attempts = 0                 # failed commits of this version
        self.last_error: BaseException | None = None

    @property
    def accepted(self) -> bool:
        return bool(self.since)

    def accept(self, path: str, spool: Spool, meta: FileMeta) -> None:
        """``spool`` holds every byte of ``path``'s new version: journalled now."""
        self.since = time.time()
        self._journal.record(self._entry(path, spool, meta))

    def moved(self, path: str, spool: Spool, meta: FileMeta) -> None:
        """The file was renamed: an accepted spool is journalled under its new name."""
        if self.since:
            self._journal.record(self._entry(path, spool, meta))

    def _entry(self, path: str, spool: Spool, meta: FileMeta) -> Entry:
        return Entry(path, spool.name, meta.mode, meta.mtime, spool.size, self.since,
                     meta.mtime_ns, meta.atime_ns)

    def forget(self, spool_name: str) -> None:
        """Nothing accepted is left to replay (committed, failed, or unlinked)."""
        if self.since:
            self._journal.drop(spool_name)
            self.since = 0.0

    def committed(self, spool_name: str) -> None:
        self.forget(spool_name)
        self.attempts, self.last_error = 0, None

    def failed(self, exc: BaseException) -> None:
        """A commit of accepted bytes failed: counted, and kept to be shown."""
        self.attempts += 1
        self.last_error = exc
        metrics.observe_error(type(exc).__name__)

    def note(self, exc: BaseException) -> None:
        """The ingest behind the writes failed (writeback: the commit codes it all
        again): shown, not counted as a failed commit."""
        self.last_error = exc
