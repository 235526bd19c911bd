"""What a save's commits tell the operator: a log line and the save's metrics.

(The commit itself is :meth:`WriteHandle._commit <s4fs.write.handle.WriteHandle>`: the
streaming ingest finished, then the namespace's ``Record`` writes the manifest, the one
atomic step; where only the mode or times changed, a new manifest for the same chunks.)
"""

from __future__ import annotations

import logging
import time

from s4fs import metrics
from s4fs.manifest import Manifest, stored_split

__all__ = ["SaveLog"]

log = logging.getLogger(__name__)


class SaveLog:
    """One write handle's account of its saves: a save's time runs from the open (and,
    where a close committed it, from that close); ``writes`` counts the write requests
    since the last commit."""

    def __init__(self) -> None:
        self.opened = time.monotonic()
        self.writes = 0
        self.closed_at = 0.0

    def closing(self) -> None:
        """A close that commits (or accepts) came now."""
        self.closed_at = time.monotonic()

    def committed(self, path: str, m: Manifest) -> None:
        """``m`` was committed at ``path``: logged and counted."""
        now = time.monotonic()
        log.info("%s: committed %d bytes written in %d writes, %.3f s after the open%s",
                 path, m.size, self.writes, now - self.opened,
                 f" ({now - self.closed_at:.3f} s after the close)" if self.closed_at
                 else "")
        split = stored_split(m)
        metrics.observe_save(path, m.size, m.stored_bytes(), now - self.opened,
                             stored_delta=split["stored_delta"],
                             unchanged=split["unchanged"])
        self.writes, self.closed_at = 0, 0.0
