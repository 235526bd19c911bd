"""One file open for writing: its spool, its background ingest, and when it commits.

A write, top to bottom: the mount's ``write`` → :meth:`WriteHandle.write` (one ``pwrite``
into the :class:`~s4fs.write.spool.Spool`) → the handle's ingest thread
(:class:`~s4fs.write.streaming.StreamingIngest`) feeds the spool's written prefix to an
:class:`~s4fs.write.ingest.IngestSession` (parse, chunk, code, pack, upload — while the
file is still being written) → at commit the session finishes (every pack durable) and
:meth:`Filesystem.commit` writes the manifest, the one atomic step
(:class:`~s4fs.write.commit.Commits`). Under FUSE passthrough the kernel writes the
spool itself; what the handle learns of that comes from
:class:`~s4fs.write.behind.KernelWrites`.

States (``WriteHandle.state``, :class:`~s4fs.write.state.State`)::

    STREAMING --accept--> SPOOLED --background commit--> COMMITTED   (--writeback only)
    STREAMING --commit--> COMMITTING --ok--> COMMITTED
    COMMITTED / SPOOLED --a later write--> STREAMING
    any state --error--> FAILED (sticky: every later call raises it; nothing is committed)
    last release, nothing left to commit --> CLOSED

When a file is committed (docs/SEMANTICS.md):

* ``fsync`` of any descriptor commits what the spool holds, now, in both modes.
* ``flush`` (every ``close()`` of a descriptor, including one inherited by a forked child
  or made by ``dup``) acts only if the file **looks complete** for its format
  (:func:`s4fs.parse.looks_complete`: a torch zip whose end record is written, a
  safetensors file as long as its header says; files of other formats always look
  complete once 9 bytes decide their format). A child closing its copy of the descriptor of a half-written checkpoint
  therefore commits nothing.
* The **last release** (the kernel's last close of the last descriptor) acts on whatever
  the spool holds.
* "Acts" means, by default: commit before ``close()`` returns (after ``torch.save``
  returns, the checkpoint is in the store). With ``--writeback``: *accept* — journal the
  spool (:mod:`s4fs.write.journal`) and return; the
  :class:`~s4fs.write.committer.Committer` commits in the background, retrying failures
  for as long as it takes; the file is listed and read from its spool meanwhile.
* Any error before a file is accepted — the cache disk full, or (default mode) a pack
  upload that failed after its retries, a codec error — fails the handle: the write or
  close that sees it raises, and the previous version of the file stays. Nothing is ever
  committed from a failed handle. After acceptance (writeback) errors are retried.

Locking: the handle's lock is taken after the filesystem's, never before — nothing here
calls into the filesystem (:class:`WriterPort`) while holding the handle lock except
``commit``, ``saw_commit`` and the short ``release_writer``, which take only the
filesystem's own short lock, and the filesystem never calls a handle while holding its
lock. The handle's parts (``stream``, ``commits``, ``kernel``) run under the same lock.
"""

from __future__ import annotations

import contextlib
import threading
import time
from typing import TYPE_CHECKING, Protocol

from s4fs import metrics
from s4fs.write.behind import KernelWrites, kernel_spool
from s4fs.write.commit import Commits
from s4fs.write.ingest import IngestSession
from s4fs.manifest import Manifest, seconds_to_ns
from s4fs.parse import looks_complete
from s4fs.write.spool import Spool
from s4fs.write.state import State
from s4fs.write.streaming import StreamingIngest

if TYPE_CHECKING:
    from s4fs.write.committer import Committer
    from s4fs.chunks import ChunkSource
    from s4fs.read import DecodedCache
    from s4fs.fsconfig import FsConfig
    from s4fs.runtime import Runtime
    from s4fs.write.journal import Journal
    from s4fs.write.room import RoomKeeper

__all__ = ["State", "WriteHandle", "WriterPort"]


class WriterPort(Protocol):
    """What a write handle needs from the filesystem it writes into (s4fs.fs.Filesystem
    is the one implementation; tests may give their own). Every call may be made with
    the handle's lock held; none of them calls back into the handle."""

    cfg: "FsConfig"                   # writeback on or off, the ingest settings
    spool_dir: str                    # where spools are made
    journal: "Journal"                # writeback: accepted files, replayed after a crash
    committer: "Committer"            # writeback: background commits
    decoded: "DecodedCache | None"    # keeps a committed spool as the version's copy
    source: "ChunkSource"             # reads the version a file opened without O_TRUNC had
    runtime: "Runtime"                # its threads (the passthrough check at a commit)
    room: "RoomKeeper"                # keeps the cache disk from filling under passthrough

    def make_room(self, nbytes: int) -> bool:
        """The cache disk is full: give space back; True if any was freed."""

    def new_session(self, path: str, previous: Manifest | None,
                    spool: str | None = None) -> IngestSession:
        """The ingest of a new version of ``path`` (its delta base chosen there)."""

    def commit(self, path: str, m: Manifest) -> None:
        """Write ``m`` as the manifest of ``path``: the one atomic step of a save."""

    def saw_commit(self, w: "WriteHandle", m: Manifest) -> None:
        """``w`` committed ``m``, exactly the bytes written through it."""

    def release_writer(self, w: "WriteHandle") -> None:
        """``w`` closed or failed: the file is its last committed version again."""

    def spool_renewed(self, w: "WriteHandle") -> None:
        """``w`` writes into a new spool file (an ``O_TRUNC`` open): readers move to it."""


class WriteHandle:
    """One file open for writing on this mount, shared by every descriptor open on it.

    (A little over 400 lines: what its descriptors do and the states they move it
    through, under one lock; its parts live beside it in ``streaming``, ``commit`` and
    ``behind``.)"""

    def __init__(self, fs: WriterPort, path: str, mode: int, *,
                 initial: Manifest | None, previous: Manifest | None,
                 spool: Spool | None = None) -> None:
        self.fs, self.path, self.mode = fs, path, mode
        # times in ns (``mtime``: in seconds; see _touch): a file opened to be changed in
        # place shows its own until its first change. The atime is one set explicitly
        # (utime), kept across versions as on a noatime disk; None: the mtime. The
        # ctime is the last change; None: the mtime
        self.mtime_ns = time.time_ns() if initial is None else initial.times_ns()[1]
        self.ctime_ns = None if initial is None else initial.times_ns()[2]
        self.atime_ns = previous.atime_ns if previous is not None else None
        # (uid, gid) the versions it commits record: the file's, kept across versions;
        # a new file's creator (s4fs.fs.open_write); None: not recorded
        self.owner = (previous.uid, previous.gid) \
            if previous is not None and previous.uid is not None else None
        self.opened = time.monotonic()
        self.previous = previous          # the version this one replaces (delta lineage)
        self.refs = 1
        self.error: BaseException | None = None
        self.state = State.STREAMING
        self.writeback = fs.cfg.writeback
        self.attempts = 0                 # failed background commits of this version
        self.last_error: BaseException | None = None
        self.accepted_at = 0.0
        self.nwrites = 0                  # write requests since the last commit
        self.closed_at = 0.0              # when the close that commits came
        self.orphaned = False             # unlinked while open: commit nothing
        self.same_bytes = False           # the spool holds exactly ``previous``'s bytes
        self.node = None                  # its file on this mount (s4fs.read.node), once attached
        self._cond = threading.Condition(threading.RLock())
        self.spool = spool or Spool(fs.spool_dir, path, make_room=fs.make_room)
        self.stream = StreamingIngest(self, self._cond)    # the background ingest
        self.commits = Commits(self, self._cond)
        # FUSE passthrough (s4fs.mount): the kernel writes into the spool itself
        self.kernel = KernelWrites(fs.room)
        try:
            if initial is not None:
                _spool_from_store(self.spool, initial, fs.source, path)
                self.state = State.COMMITTED      # nothing new yet
                self.same_bytes = True
        except BaseException:
            self.spool.close()
            raise

    @classmethod
    def recovered(cls, fs: WriterPort, entry, previous: Manifest | None) -> "WriteHandle":
        """A file accepted before the daemon stopped (writeback journal): shown again at
        once, committed in the background."""
        spool = Spool.reopen(entry.spool, entry.path, make_room=fs.make_room)
        w = cls(fs, entry.path, entry.mode, initial=None, previous=previous, spool=spool)
        w.mtime = entry.mtime
        if entry.mtime_ns is not None:     # journalled by an s4fs that keeps nanoseconds
            w.mtime_ns, w.atime_ns = entry.mtime_ns, entry.atime_ns
        w.refs = 0
        w.state = State.SPOOLED
        w.accepted_at = entry.accepted
        return w

    # --- descriptors -----------------------------------------------------------------

    def share(self, *, truncate: bool) -> bool:
        """Another descriptor opens this file; False if the handle has already closed
        (the caller then opens a new one)."""
        with self._cond:
            self._wait_commit()
            if self.state in (State.CLOSED, State.FAILED):
                return False
            self.refs += 1
            if truncate and not self.kernel.on and self.spool.size:
                # an O_TRUNC open of a file still open (or, writeback, not yet
                # committed): emptied into a new spool file, so that readers' requests
                # sent before the kernel applied the truncation still find the bytes
                # (s4fs.read.node); its readers move to the new one
                self._check()
                self.stream.rewrites(0)
                try:
                    self.spool.renew()
                except BaseException as exc:
                    self.fail(exc)
                    raise
                self._touch()
                self.fs.spool_renewed(self)
            elif truncate:
                self.truncate(0)
            return True

    @property
    def size(self) -> int:
        return self.kernel.size(self.spool)

    @property
    def passthrough(self) -> bool:
        """Whether the kernel writes the spool itself (FUSE passthrough)."""
        return self.kernel.on

    def live(self) -> bool:
        """Whether the spool is the file's content: not closed, not failed."""
        return self.state not in (State.CLOSED, State.FAILED)

    def use_spool(self, name: str, *, truncate: bool) -> None:
        """(FUSE passthrough) The kernel already passes this file through to the file at
        ``name`` (readers hold it: a copy of the version this handle starts from): that
        file becomes the spool, emptied if the open truncated the file."""
        with self._cond:
            spool = kernel_spool(name, self.path, make_room=self.fs.make_room,
                                 truncate=truncate)
            self.spool.close()
            self.spool = spool

    def written_behind(self) -> None:
        """From now on the kernel writes into the spool directly (FUSE passthrough): no
        write request reaches the handle. Called before the first such write."""
        with self._cond:
            self.kernel.start(self.spool)
            self.stream.kick()            # follow the spool as it grows

    def behind(self) -> None:
        """(Under the lock.) Take in what the kernel wrote into the spool since the last
        look: its size, and — when anything changed — a new version to commit. The
        ingest thread follows the spool's size (both modes); what it read is checked
        against the spool at the commit, since a rewrite of bytes it already read is
        invisible here."""
        if self.kernel.moved(self.spool):
            self._touch()
            self.stream.kick()

    @property
    def mtime(self) -> float:
        """The mtime in seconds (``mtime_ns`` is the exact value)."""
        return self.mtime_ns / 1e9

    @mtime.setter
    def mtime(self, seconds: float) -> None:
        self.mtime_ns = seconds_to_ns(seconds)

    # --- operations ------------------------------------------------------------------

    def write(self, offset: int, data) -> int:
        with self._cond:
            self._wait_commit()
            return self._write(offset, data)

    def write_now(self, offset: int, data) -> int | None:
        """``write`` if it need not wait (its lock is free and no commit runs), else
        None: the caller then waits in line with ``write``."""
        if not self._cond.acquire(blocking=False):
            return None
        try:
            if self.state is State.COMMITTING:
                return None
            return self._write(offset, data)
        finally:
            self._cond.release()

    def _write(self, offset: int, data) -> int:
        """One write into the spool; the caller holds the lock and no commit runs."""
        self._check()
        self.stream.rewrites(offset)
        self.nwrites += 1
        try:
            n = self.spool.write(offset, data)
        except BaseException as exc:           # cache disk full: this version is lost
            self.fail(exc)
            raise
        self._touch()
        self.stream.kick()
        return n

    def read(self, offset: int, size: int) -> bytes:
        with self._cond:
            self._check()
            return self.spool.read(offset, size)

    def readinto(self, offset: int, dest) -> int:
        with self._cond:
            self._check()
            return self.spool.readinto(offset, dest)

    def truncate(self, size: int) -> None:
        with self._cond:
            self._wait_commit()
            self._check()
            if size == self.spool.size:
                return
            self.stream.rewrites(size)
            try:
                self.spool.truncate(size)
            except BaseException as exc:
                self.fail(exc)
                raise
            self._touch()

    def set_attrs(self, *, mode=None, mtime=None, size=None, mtime_ns=None,
                  atime_ns=None, owner=None) -> bool:
        """chmod / utime / truncate / chown through this handle (the mtime as
        ``mtime_ns``, or ``mtime`` in seconds; ``owner`` a (uid, gid)); False when it
        has closed meanwhile (the caller then changes the committed file instead)."""
        with self._cond:
            self._wait_commit()
            self._check()
            if self.state is State.CLOSED:
                return False
            self.behind()
            if size is not None:
                self.truncate(size)
            if mode is not None:
                self.mode = (self.mode & ~0o7777) | (mode & 0o7777)
                self._touch(mtime=False)
            if owner is not None:
                self.owner = owner
                self._touch(mtime=False)
            if mtime is not None and mtime_ns is None:
                mtime_ns = seconds_to_ns(mtime)
            if mtime_ns is not None:
                self.mtime_ns = mtime_ns
                self._touch(mtime=False)
            if atime_ns is not None:
                self.atime_ns = atime_ns
                self._touch(mtime=False)
            if self.writeback and self.refs == 0 and self.state is State.STREAMING \
                    and not self.orphaned:
                # writeback: the file was accepted and waits for its commit, and no
                # descriptor is left whose release would accept it again: accept the
                # changed file now (journalled anew, queued for its commit)
                self.commits.accept()
            return True

    def _touch(self, *, mtime: bool = True) -> None:
        """Something changed: the file has a new version to commit. ``mtime=False``:
        only its mode or times changed (the bytes are still the last committed ones).

        The mtime is that of the version's first change (the open that created or
        truncated the file, or the first write after a commit), not of every write: the
        kernel drops every cached page of a file whose mtime it sees move, so a moving
        mtime would throw away the pages ``torch.save`` just wrote, and the
        ``torch.load`` right after it would read everything again (docs/SEMANTICS.md)."""
        fresh = self.state is not State.STREAMING
        if fresh:
            self.state = State.STREAMING
        self.ctime_ns = time.time_ns()
        if mtime:
            if fresh:
                self.mtime_ns = self.ctime_ns
            self.same_bytes = False

    def _wait_commit(self) -> None:
        """A commit releases the lock while it waits for the ingest thread; nothing may
        change the handle meanwhile (the commit must be of one consistent spool)."""
        while self.state is State.COMMITTING:
            self._cond.wait()

    def _check(self) -> None:
        if self.error is not None:
            raise self.error

    # --- commit ----------------------------------------------------------------------

    def flush(self) -> None:
        """A descriptor is closed: commit (or, writeback, accept) if the file looks
        complete (module docstring). Raises the handle's error, if any."""
        with self._cond:
            self._wait_commit()
            self._check()
            self.behind()
            if self.state is not State.STREAMING or self.orphaned:
                return
            self.kernel.check_room(self.spool, self.fail)
            if not looks_complete(self.spool.read, self.spool.size):
                return                 # a half-written checkpoint: the last release acts
            self.closed_at = time.monotonic()
            self.commits.act()

    def fsync(self) -> None:
        """Commit now, whatever the file looks like, in both modes; raises if it fails."""
        with self._cond:
            self._wait_commit()
            self._check()
            self.behind()
            if self.orphaned or self.state not in (State.STREAMING, State.SPOOLED):
                return
            if self.state is State.STREAMING:
                self.kernel.check_room(self.spool, self.fail)
            self.commits.now()

    def background_commit(self) -> bool:
        """Called by the committer. True when nothing is left to do for this handle."""
        with self._cond:
            self._wait_commit()
            if self.state is State.SPOOLED and not self.orphaned:
                if not self.commits.in_background():
                    return False               # counted; the committer tries again
            elif self.state is State.STREAMING and not self.orphaned:
                return True        # written again since accepted: the next accept queues it
            # committed (now, or by an fsync meanwhile), failed, closed or unlinked
            self._maybe_close()
            return True

    def fail(self, exc: BaseException) -> None:
        """(Under the lock.) This version can never be committed: every later call raises
        ``exc``, and the file stops showing this version at once (the previous one
        stays)."""
        if self.error is None:
            self.error = exc
            metrics.observe_error(type(exc).__name__)
        self.state = State.FAILED
        self.kernel.stop()
        self.commits.forget_accepted()    # its spool goes with it: nothing to replay
        self.stream.abort()
        self.fs.release_writer(self)

    def committed_id(self) -> str | None:
        """The id of the committed version whose bytes are exactly what was written
        through this handle (so a kernel page cache filled by those writes may be kept),
        or None."""
        with self._cond:
            if self.error is not None or self.orphaned or not self.same_bytes or \
                    self.previous is None or self.state not in (State.COMMITTED,
                                                                State.CLOSED):
                return None
            return self.previous.id

    # --- reading while open ----------------------------------------------------------

    def reader_fd(self) -> int | None:
        """A descriptor of the spool for a reader on this mount (it stays valid after the
        handle closes); None once the handle has closed or failed (the committed version,
        if any, is then the file)."""
        with self._cond:
            if self.state in (State.CLOSED, State.FAILED):
                return None
            return self.spool.dup()

    # --- closing ---------------------------------------------------------------------

    def release(self) -> None:
        """One descriptor is gone for good; the last one acts on what is left."""
        with self._cond:
            self._wait_commit()
            if self.error is None:
                self.behind()        # written after the last flush (another descriptor)
            self.refs -= 1
            if self.refs > 0:
                return
            if self.state is State.STREAMING and self.error is None and not self.orphaned:
                try:
                    self.kernel.check_room(self.spool, self.fail)
                    self.commits.act()
                    if self.writeback:
                        return                 # the committer closes it once committed
                except BaseException:
                    self._close()
                    raise
                self._close()
                return
            if self.state is not State.SPOOLED or self.orphaned:
                self._close()

    def abort(self) -> None:
        """Give up this version (the Python API after an exception): nothing commits."""
        with self._cond:
            self._wait_commit()
            self._close()

    def orphan(self) -> None:
        """The path was unlinked while open: keep accepting writes, commit nothing."""
        with self._cond:
            self._wait_commit()
            self.orphaned = True
            self.commits.forget_accepted()

    @contextlib.contextmanager
    def moving(self, path: str):
        """The path is renamed while this handle is open (or its commit pending): yields
        True with the handle now at ``path`` and held, so that no commit lands while the
        rename moves the manifests in the store (a commit under the new name before the
        rename removes the replaced file's manifest would be removed with it); False if
        the handle has closed meanwhile (the caller drops it)."""
        with self._cond:
            self._wait_commit()
            if self.state in (State.CLOSED, State.FAILED):
                yield False
                return
            self.path = path
            self.spool.label = path
            if self.accepted_at:
                self.fs.journal.record(self.commits.journal_entry())
            yield True

    def detach(self) -> None:
        """The mount is going away: stop, but keep an accepted file's spool and journal
        entry for the next start to replay."""
        with self._cond:
            self._wait_commit()
            if self.state is State.SPOOLED and not self.orphaned:
                self.stream.stop()
                self.stream.abort()
                self.spool.close(remove=False)
                self.state = State.CLOSED
                self.kernel.stop()
                self.fs.release_writer(self)
            else:
                self._close()

    def _maybe_close(self) -> None:
        if self.refs <= 0 and self.state is not State.CLOSED:
            self._close()

    def _close(self) -> None:
        if self.stream.running:
            # the thread must be out before the spool goes, and nothing may change the
            # handle while this waits for it (the wait releases the lock): a chmod let in
            # here would be accepted and then dropped with the spool
            before, self.state = self.state, State.COMMITTING
            try:
                self.stream.stop()
            finally:
                self.state = before
                self._cond.notify_all()
        self.stream.abort()
        self.kernel.stop()
        committed = self.state is State.COMMITTED and self.previous is not None
        if self.state is not State.FAILED:
            self.state = State.CLOSED
        if committed and self.fs.decoded is not None and not self.orphaned:
            # the spool holds exactly the committed version: keep it as a read cache
            self.fs.decoded.adopt(self.previous.id, self.spool)
        else:
            self.spool.close()
        self.fs.release_writer(self)


def _spool_from_store(spool: Spool, m: Manifest, source: "ChunkSource", path: str) -> None:
    """An existing file opened without truncation: its bytes become the spool."""
    from s4fs.read import FileReader
    reader = FileReader(m, source, path=path)
    pos = 0
    while pos < m.size:
        data = reader.read(pos, min(8 << 20, m.size - pos))
        if not data:
            break
        spool.write(pos, data)
        pos += len(data)
