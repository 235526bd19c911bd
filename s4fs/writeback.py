"""What a filesystem does behind its saves: the journal of the files close() accepted
and the committer that commits them in the background (``--writeback``), and the
rewriter that re-expresses a previous version as deltas on the new one (backward
deltas). :class:`Writeback` holds the three for :class:`s4fs.fs.Filesystem`: replaying
the journal at start, what is pending, waiting for it all, and the order they stop in.
"""

from __future__ import annotations

import logging
import os
import time
from typing import Callable

from s4fs.fsconfig import FsConfig
from s4fs.manifest import Manifest
from s4fs.openfiles import OpenFiles
from s4fs.write import Committer, Journal, Rewriter, Services, Spool, WriteHandle

__all__ = ["Writeback"]

log = logging.getLogger("s4fs.fs")


class Writeback:
    """``journal_dir``: where accepted files are journalled (in the cache dir);
    ``rewriter``: the re-expressions of backward deltas, None where deltas run forward
    or are off."""

    def __init__(self, cfg: FsConfig, journal_dir: str, rewriter: Rewriter | None) -> None:
        self.cfg = cfg
        self.journal = Journal(journal_dir)
        self.committer = Committer()
        self.rewriter = rewriter

    def replay(self, services: Services, files: OpenFiles, spool_dir: str,
               manifest: Callable[[str], Manifest | None]) -> None:
        """Files a writeback mount accepted before it stopped: shown again (writers of
        ``services`` in ``files``), committed in the background. Spool files nobody accepted
        (a crash mid-write) are removed from ``spool_dir``. ``manifest(path)``: the
        committed version of ``path`` in the store now, None if none."""
        keep = set()
        for e in self.journal.entries():
            if not os.path.exists(e.spool):
                log.error("journal entry for %r names a spool that is gone (%s); "
                          "dropping it", e.path, e.spool)
                self.journal.drop(e.spool)
                continue
            keep.add(os.path.abspath(e.spool))
            w = WriteHandle(services, e.path, e.mode, initial=None, previous=manifest(e.path),
                            spool=Spool.reopen(e.spool, e.path,
                                               free_space=services.free_space), accepted=e)
            old = files.writer(e.path)
            if old is not None:
                old.detach()
            files.add_writer(e.path, w, replace=True)
            log.warning("replaying %r (%d bytes) accepted before the mount stopped",
                        e.path, e.size)
            self.committer.submit(w)
        for name in os.listdir(spool_dir):
            full = os.path.abspath(os.path.join(spool_dir, name))
            if full not in keep:
                try:
                    os.unlink(full)
                except OSError:
                    pass

    @staticmethod
    def _info(w: WriteHandle, no_error: str | None) -> dict:
        p = w.pending
        return {"path": w.path, "bytes": w.size, "state": w.state.value,
                "attempts": p.attempts, "accepted": p.since,
                "error": str(p.last_error) if p.last_error else no_error}

    def pending(self) -> list[dict]:
        """Files accepted but not yet committed, oldest first."""
        return [self._info(w, None) for w in self.committer.pending()]

    def sync(self, timeout: float | None = None) -> list[dict]:
        """Wait for every pending commit, then for the re-expressions they queued;
        returns the files that could not be committed (each failed at least once during
        the wait), empty when all are in the store."""
        started = time.monotonic()
        failed = [self._info(w, "still committing") for w in self.committer.sync(timeout)]
        self.settle(None if timeout is None else
                    max(0.0, timeout - (time.monotonic() - started)))
        return failed

    def settle(self, timeout: float | None = None) -> bool:
        """Wait until the re-expressions queued so far are done (True)."""
        return self.rewriter.settle(timeout) if self.rewriter is not None else True

    def saved(self, path: str, m: Manifest) -> None:
        """``m``, a new version of ``path`` coded against an earlier one, is committed:
        with backward deltas that earlier one is re-expressed against it."""
        if self.rewriter is not None and m.base is not None:
            self.rewriter.submit(path, m)

    def drain(self) -> None:
        """The first step of closing: a writeback mount waits (``close_sync_seconds``)
        for pending commits; what is still pending then stays journalled for the next
        start."""
        if self.cfg.writeback and self.committer.pending():
            self.committer.sync(timeout=self.cfg.close_sync_seconds)

    def close(self) -> None:
        self.committer.close()
        if self.rewriter is not None:
            self.rewriter.close(self.cfg.close_sync_seconds)
