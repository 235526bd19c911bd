"""What every save on one filesystem uses, built once by the filesystem
(:class:`s4fs.fs.Filesystem`) and handed down to each
:class:`~s4fs.write.handle.WriteHandle`: a save goes down from there and never calls
back up.

* ``sessions`` (:class:`~s4fs.write.bases.Sessions`): the ingest of a new version, its
  delta base chosen;
* ``record`` (:class:`Record`): the namespace's record of the file — a commit's manifest
  written (the one atomic step of a save) and what the open files learn of it, in one
  call;
* the cache disk (``spool_dir``, ``free_space``, ``space``), ``--writeback``'s journal and
  committer, the decoded cache a committed spool is kept in, the chunk source an
  in-place open reads its file from, and the threads a passthrough commit checks its
  spool on.
"""

from __future__ import annotations

from concurrent.futures import Executor
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, Protocol

if TYPE_CHECKING:
    from s4fs.chunks import ChunkSource
    from s4fs.fsconfig import FsConfig
    from s4fs.manifest import Manifest
    from s4fs.read import DecodedCache
    from s4fs.write.bases import Sessions
    from s4fs.write.committer import Committer
    from s4fs.write.journal import Journal
    from s4fs.write.space import SpaceKeeper

__all__ = ["Record", "Services"]


class Record(Protocol):
    """The namespace's record of the files being written (``s4fs.record.Recorder``).
    Each call takes only the namespace's own short locks and never calls a handle back:
    a handle makes them with its lock held."""

    def committed(self, w, m: "Manifest") -> None:
        """``w`` (a write handle) committed ``m``, exactly the bytes written through
        it: ``m`` becomes the manifest of ``w.path`` in the store, then the version its
        descriptors read, and the kernel's pages are known to be it (or dropped)."""

    def released(self, w) -> None:
        """``w`` closed or failed: the file is its last committed version again."""

    def renewed(self, w) -> None:
        """``w`` writes into a new spool file (an ``O_TRUNC`` open): readers move to
        it."""


@dataclass(frozen=True)
class Services:
    cfg: "FsConfig"                   # writeback on or off, the ingest's priority
    sessions: "Sessions"
    record: Record
    spool_dir: str                    # where spools are made
    free_space: Callable[[int], bool]  # the cache disk is full: give space back
    space: "SpaceKeeper"               # keeps the cache disk from filling (passthrough)
    journal: "Journal"                # writeback: accepted files, replayed after a crash
    committer: "Committer"            # writeback: background commits
    decoded: "DecodedCache | None"    # keeps a committed spool as the version's copy
    source: "ChunkSource"             # reads the version an in-place open starts from
    checks: Callable[[], Executor]    # threads a passthrough commit hashes its steps on
