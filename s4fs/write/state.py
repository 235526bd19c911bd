"""The states of a file open for writing (:class:`~s4fs.write.handle.WriteHandle`), in a
module of their own so that the parts a handle delegates to (``streaming``, ``commit``)
name them without importing the handle.

::

    STREAMING --accept--> SPOOLED --background commit--> COMMITTED   (--writeback only)
    STREAMING --commit--> COMMITTING --ok--> COMMITTED
    COMMITTED / SPOOLED --a later write--> STREAMING
    any state --error--> FAILED (sticky: every later call raises it; nothing is committed)
    last release, nothing left to commit --> CLOSED
"""

from __future__ import annotations

import enum


class State(enum.Enum):
    STREAMING = "streaming"      # bytes not yet committed; ingest runs behind the writes
    SPOOLED = "spooled"          # close() accepted it (writeback): waiting for its commit
    COMMITTING = "committing"
    COMMITTED = "committed"      # the store holds exactly what the spool holds
    FAILED = "failed"
    CLOSED = "closed"
