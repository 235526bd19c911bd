"""The write path: one file open for writing, from its spool to its commit.

* ``handle``: :class:`WriteHandle` (one file open for writing, its states, when it
  commits) and :class:`WriterPort` (what it needs of the filesystem); the parts it
  owns: ``state`` (its :class:`State`), ``streaming`` (the ingest thread that follows
  the spool as it grows, and the commit's check of what it read), ``commit`` (the
  commit, writeback acceptance and retries), ``behind`` (what a spool the kernel writes
  through FUSE passthrough tells the handle);
* ``spool``: :class:`Spool`, the local file that takes the writes in any order;
* ``room``: room on the cache disk for a spool the kernel writes (FUSE passthrough):
  :class:`RoomKeeper` and :func:`disk_full`;
* ``ingest``: :class:`IngestSession` (stream → chunks → coding → packs) and
  :class:`PackWriter`;
* ``bases``: the delta base of a new version (:func:`choose_base`) and the ingest that
  codes against it (:func:`new_session`);
* ``backward``: backward deltas — the version before a new one re-expressed as deltas
  on it in the background (:class:`Rewriter`, :func:`reexpress`);
* ``journal`` and ``committer``: ``--writeback``'s accepted files and their background
  commits.

It talks to the filesystem only through ports (:class:`WriterPort`,
``bases.SessionPort``, ``backward.RewritePort``), never by importing ``s4fs.fs``.
"""

from s4fs.write.backward import Rewriter, reexpress
from s4fs.write.bases import candidates, choose_base, new_session
from s4fs.write.committer import Committer
from s4fs.write.handle import State, WriteHandle, WriterPort
from s4fs.write.ingest import IngestSession, PackWriter
from s4fs.write.journal import Entry, Journal
from s4fs.write.room import RoomKeeper, disk_full
from s4fs.write.spool import Spool, fresh_spool_name

__all__ = ["Committer", "Rewriter", "reexpress", "Entry", "IngestSession", "Journal", "PackWriter", "RoomKeeper",
           "Spool", "State", "disk_full", "fresh_spool_name",
           "WriteHandle", "WriterPort", "candidates", "choose_base", "new_session"]
