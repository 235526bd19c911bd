"""How a write handle's spool becomes a version in the store (when: the handle's module
docstring and docs/SEMANTICS.md).

Default mode: the commit runs now, and a failure fails the handle. ``--writeback``: the
spool is *accepted* — journalled (:mod:`s4fs.write.journal`) and queued for the
:class:`~s4fs.write.committer.Committer` — and committed in the background, every
failure counted and retried. Either way a commit is: the streaming ingest finished
(:meth:`StreamingIngest.manifest <s4fs.write.streaming.StreamingIngest.manifest>`),
then ``Filesystem.commit`` writes the manifest, the one atomic step; where only the mode
or times changed since the last commit, only a new manifest for the same chunks.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from typing import TYPE_CHECKING, Callable

from s4fs import metrics
from s4fs.manifest import Manifest, stored_split
from s4fs.write.journal import Entry
from s4fs.write.state import State

if TYPE_CHECKING:
    from s4fs.write.handle import WriteHandle

log = logging.getLogger(__name__)


class Commits:
    """The commits of one :class:`~s4fs.write.handle.WriteHandle`, made under its lock
    (``cond``): they move its state and its last committed version (``previous``), and
    keep its writeback bookkeeping (``accepted_at``, ``attempts``, ``last_error``)."""

    def __init__(self, w: "WriteHandle", cond: threading.Condition) -> None:
        self._w, self._cond = w, cond

    def act(self) -> None:
        """Commit now (default mode) or accept (writeback); a failure fails the handle
        (writeback: nothing was journalled, so ``close()`` fails and nothing is kept)."""
        _trying(self.accept if self._w.writeback else self.commit, self._w.fail)

    def now(self) -> None:
        """``fsync``: commit now, in both modes. A failure fails the handle, except in
        writeback mode: the accepted bytes stay pending, queued again."""
        _trying(self.commit, self._retry_later if self._w.writeback else self._w.fail)

    def commit(self) -> None:
        """Commit the spool as it is now. Raises on failure, leaving the handle as it was
        (its ingest to start again from the whole spool): the caller fails it or
        retries."""
        try:
            self._commit()
        finally:
            self._cond.notify_all()         # wake calls waiting for the commit to end

    def _commit(self) -> None:
        w = self._w
        before, w.state = w.state, State.COMMITTING
        same_chunks = w.same_bytes and w.previous is not None
        try:
            m = self._new_attrs() if same_chunks else w.stream.manifest()
            if w.owner is not None:
                m.uid, m.gid = w.owner
            w.fs.commit(w.path, m)
        except BaseException:
            if w.state is State.COMMITTING:
                w.state = before
            if not same_chunks:
                w.stream.reset(ok=False)    # the next try ingests the whole spool
            raise
        self._committed(m)

    def _new_attrs(self) -> Manifest:
        """Only mode or times changed since the last commit: the last version's manifest
        with the new ones (the same chunks, nothing ingested)."""
        w = self._w
        return dataclasses.replace(w.previous, mode=w.mode, mtime=w.mtime,
                                   mtime_ns=w.mtime_ns, atime_ns=w.atime_ns,
                                   ctime_ns=time.time_ns())

    def _committed(self, m: Manifest) -> None:
        w = self._w
        w.previous = m
        w.state = State.COMMITTED
        w.same_bytes = True
        w.fs.saw_commit(w, m)
        self.forget_accepted()
        w.attempts = 0
        w.last_error = None
        # a later write starts a new version, ingested afresh from the whole spool
        w.stream.reset(ok=True)
        if w.passthrough and w.refs > 0:
            w.stream.kick()             # the kernel may write on: follow the next version
        self._observe(m)

    def _observe(self, m: Manifest) -> None:
        """Log and count a commit (the save's time runs from the open)."""
        w = self._w
        now = time.monotonic()
        log.info("%s: committed %d bytes written in %d writes, %.3f s after the open%s",
                 w.path, m.size, w.nwrites, now - w.opened,
                 f" ({now - w.closed_at:.3f} s after the close)" if w.closed_at else "")
        w.nwrites, w.closed_at = 0, 0.0
        split = stored_split(m)
        metrics.observe_save(w.path, m.size, m.stored_bytes(), time.monotonic() - w.opened,
                             stored_delta=split["stored_delta"], unchanged=split["unchanged"])

    # --- writeback -------------------------------------------------------------------

    def accept(self) -> None:
        """The spool holds every byte: journal it, queue its commit, return."""
        w = self._w
        w.accepted_at = time.time()
        w.fs.journal.record(self.journal_entry())
        w.state = State.SPOOLED
        w.fs.committer.submit(w)

    def journal_entry(self) -> Entry:
        """The journal's record of the accepted spool, as the handle is now."""
        w = self._w
        return Entry(w.path, w.spool.name, w.mode, w.mtime, w.spool.size, w.accepted_at,
                     w.mtime_ns, w.atime_ns)

    def forget_accepted(self) -> None:
        """Nothing accepted is left to replay (committed, failed, or unlinked): the
        journal's entry goes."""
        w = self._w
        if w.accepted_at:
            w.fs.journal.drop(w.spool.name)
            w.accepted_at = 0.0

    def in_background(self) -> bool:
        """The committer's try at an accepted file: True when it committed; a failure is
        counted, and the committer tries again."""
        try:
            self.commit()
        except BaseException as exc:
            self._failed_attempt(exc)
            return False
        return True

    def _failed_attempt(self, exc: BaseException) -> None:
        """A commit of accepted bytes failed: counted (the committer waits longer before
        each next try) and kept to be shown (``s4fs status``)."""
        w = self._w
        w.attempts += 1
        w.last_error = exc
        metrics.observe_error(type(exc).__name__)

    def _retry_later(self, exc: BaseException) -> None:
        """(An fsync's commit failed, writeback.) The bytes stay pending: queued again."""
        self._failed_attempt(exc)
        if self._w.state is not State.STREAMING:
            self._w.state = State.SPOOLED
        self._w.fs.committer.submit(self._w)


def _trying(step: Callable[[], None], failed: Callable[[BaseException], None]) -> None:
    """``step()``; where it raises, ``failed`` is told first."""
    try:
        step()
    except BaseException as exc:
        failed(exc)
        raise
