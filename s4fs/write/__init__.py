"""The write path: one file open for writing, from its spool to its commit.

* ``handle``: :class:`WriteHandle` (one file open for writing, its states, when it
  commits); the parts it owns, each keeping its own fields: ``meta``
  (:class:`~s4fs.write.meta.FileMeta`: the mode, owner and times it will commit),
  ``pending`` (:class:`~s4fs.write.pending.Pending`: ``--writeback``'s acceptance, its
  failed tries), ``streaming`` (the ingest thread that follows the spool as it grows,
  and the commit's check of what it read), ``behind`` (what a spool the kernel writes
  through FUSE passthrough tells the handle); ``state`` (its :class:`State`) and
  ``commit`` (what a commit logs and counts);
* ``services``: :class:`Services`, what every save of one filesystem uses, built once by
  it and handed down (the sessions, the namespace's :class:`~s4fs.write.services.Record`
  of a commit, the cache disk, the journal and committer);
* ``spool``: :class:`Spool`, the local file that takes the writes in any order;
* ``space``: free space on the cache disk for a spool the kernel writes (passthrough):
  :class:`SpaceKeeper` and :func:`disk_full`;
* ``ingest``: :class:`IngestSession` (stream → chunks → coding → packs) and
  :class:`PackWriter`;
* ``bases``: the delta base of a new version (:func:`choose_base`) and
  :class:`Sessions`, the ingest that codes against it;
* ``backward``: backward deltas — the version before a new one re-expressed as deltas
  on it in the background (:class:`Rewriter`, :func:`reexpress`);
* ``journal`` and ``committer``: ``--writeback``'s accepted files and their background
  commits.

It never imports the filesystem: what it needs of it comes in as ports it declares
(``services.Record``, ``bases.Listing``, ``backward.RewritePort``).
"""

from s4fs.write.backward import Rewriter, reexpress
from s4fs.write.bases import Sessions, candidates, choose_base
from s4fs.write.committer import Committer
from s4fs.write.handle import State, WriteHandle
from s4fs.write.ingest import IngestSession, PackWriter
from s4fs.write.journal import Entry, Journal
from s4fs.write.space import SpaceKeeper, disk_full
from s4fs.write.services import Record, Services
from s4fs.write.spool import Spool, fresh_spool_name

__all__ = ["Committer", "Entry", "IngestSession", "Journal", "PackWriter", "Record",
           "Rewriter", "SpaceKeeper", "Services", "Sessions", "Spool", "State", "WriteHandle",
           "candidates", "choose_base", "disk_full", "fresh_spool_name", "reexpress"]
