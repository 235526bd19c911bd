"""One file open for writing: its spool, its background ingest, and when it commits.

A write, top to bottom: the mount's ``write`` → :meth:`WriteHandle.write` (one ``pwrite``
into the :class:`~s4fs.write.spool.Spool`) → the handle's ingest thread
(:class:`~s4fs.write.streaming.StreamingIngest`) feeds the spool's written prefix to an
:class:`~s4fs.write.ingest.IngestSession` (parse, chunk, code, pack, upload — while the
file is still being written) → at the commit the session finishes (every pack durable)
and the namespace's :class:`~s4fs.write.services.Record` writes the manifest, the one
atomic step. Under FUSE passthrough the kernel writes the spool itself; what the handle
learns of that comes from :class:`~s4fs.write.behind.KernelWrites`. Everything a save
uses comes in one :class:`~s4fs.write.services.Services`, built once by the filesystem:
a save goes down from here and never calls back up.

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
  (:func:`s4fs.parse.looks_complete`), so a child closing its copy of the descriptor of a
  half-written checkpoint commits nothing.
* The **last release** (the kernel's last close of the last descriptor) acts on whatever
  the spool holds.
* "Acts" means, by default: commit before ``close()`` returns (after ``torch.save``
  returns, the checkpoint is in the store). With ``--writeback``: *accept* — journal the
  spool (:class:`~s4fs.write.pending.Pending`) and return; the
  :class:`~s4fs.write.committer.Committer` commits in the background, retrying failures
  for as long as it takes; the file is listed and read from its spool meanwhile.
* Any error before a file is accepted — the cache disk full, or (default mode) a pack
  upload that failed after its retries, a codec error — fails the handle: the write or
  close that sees it raises, and the previous version of the file stays.

The handle owns its state: its parts (``meta``, ``pending``, ``stream``, ``kernel``)
keep their own fields, and only the handle moves its state. Locking: the handle's lock
is taken after the filesystem's, never before; with it held the handle calls only the
``Record`` (which takes the namespace's own short locks and never calls a handle).
"""

from __future__ import annotations

import contextlib
import threading

from s4fs import metrics
from s4fs.attr import Attr
from s4fs.manifest import Manifest
from s4fs.parse import looks_complete
from s4fs.read import FileReader
from s4fs.write.behind import KernelWrites
from s4fs.write.commit import SaveLog
from s4fs.write.journal import Entry
from s4fs.write.meta import FileMeta
from s4fs.write.pending import Pending
from s4fs.write.services import Services
from s4fs.write.spool import Spool
from s4fs.write.state import State
from s4fs.write.streaming import StreamingIngest

__all__ = ["State", "WriteHandle"]


class WriteHandle:
    """One file open for writing on this mount, shared by every descriptor open on it."""

    def __init__(self, services: Services, path: str, mode: int, *,
                 initial: Manifest | None, previous: Manifest | None,
                 spool: Spool | None = None, accepted: Entry | None = None) -> None:
        """``initial``: the version an open without ``O_TRUNC`` changes in place;
        ``accepted``: the journal's entry of a file accepted before the daemon stopped
        (``spool`` its spool): shown again, committed in the background."""
        self.services, self.path = services, path
        self.meta = FileMeta.of(mode, initial, previous)
        self.log = SaveLog()              # the save's times and writes, for its commit
        self.previous = previous          # the version this one replaces (delta lineage)
        self.refs = 1                     # descriptors open on it
        self.error: BaseException | None = None
        self.state = State.STREAMING
        self.writeback = services.cfg.writeback
        self.pending = Pending(services.journal)     # writeback: accepted, not committed
        self.orphaned = False             # unlinked while open: commit nothing
        self.same_bytes = False           # the spool holds exactly ``previous``'s bytes
        self.node = None                  # its file on this mount (s4fs.read.node)
        self._cond = threading.Condition(threading.RLock())
        self.spool = spool or Spool(services.spool_dir, path, free_space=services.free_space)
        self.stream = StreamingIngest(self, self._cond, services.cfg, services.sessions,
                                      services.checks)
        self.kernel = KernelWrites(services.space, services.free_space)   # passthrough
        if accepted is not None:
            self.meta.journalled(accepted)
            self.refs, self.state, self.pending.since = 0, State.SPOOLED, accepted.accepted
        if initial is not None:           # opened to be changed in place: its bytes first
            try:
                self.spool.start_as(FileReader(initial, services.source, path=path).read,
                                initial.size)
            except BaseException:
                self.spool.close()
                raise
            self.state, self.same_bytes = State.COMMITTED, True      # nothing new yet

    # --- what others may ask -------------------------------------------------------

    @property
    def size(self) -> int:
        return self.kernel.size(self.spool)

    @property
    def passthrough(self) -> bool:
        """Whether the kernel writes the spool itself (FUSE passthrough)."""
        return self.kernel.on

    descriptors = property(lambda self: self.refs, doc="descriptors open (a snapshot)")
    def live(self) -> bool:
        """Whether the spool is the file's content: not closed, not failed."""
        return self.state not in (State.CLOSED, State.FAILED)

    def attr(self, path: str | None = None) -> Attr:
        """What ``stat`` answers of the file while it is written (at ``path``: where a
        descriptor's file has moved on; else its own). A snapshot read without the lock:
        a ``stat`` never waits for a commit."""
        return self.meta.attr(self.path if path is None else path, self.size)

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

    def spool_fd(self, *, sole: bool = False) -> int | None:
        """A new descriptor of the spool, for a reader on this mount, or (``sole``) for
        the kernel to write through (passthrough) where this is the save's only
        descriptor. None once closed or failed, or (``sole``) where it has others or
        its lock is busy: the caller holds the mount's tables, which a failure needs."""
        if not self._cond.acquire(blocking=not sole):
            return None
        try:
            return self.spool.dup() if self.live() and (self.refs <= 1 or not sole) \
                else None
        finally:
            self._cond.release()

    # --- descriptors -----------------------------------------------------------------

    def share(self, *, truncate: bool) -> bool:
        """Another descriptor opens this file; False if the handle has already closed
        (the caller then opens a new one)."""
        with self._cond:
            self._wait_commit()
            if not self.live():
                return False
            self.refs += 1
            if truncate and not self.kernel.on and self.spool.size:
                # O_TRUNC of a file still open (or not yet committed): a new spool file,
                # so that reads sent before the kernel applied the truncation still
                # find the old bytes (s4fs.read.node); its readers move to the new one
                self._check()
                self.stream.rewrites(0)
                self._failing(self.spool.renew)
                self._touch()
                self.services.record.renewed(self)
            elif truncate:
                self.truncate(0)
            return True

    def use_spool(self, name: str, *, truncate: bool) -> None:
        """(FUSE passthrough) The kernel already passes this file through to the file at
        ``name`` (readers hold it: a copy of the version this handle starts from): that
        file becomes the spool, emptied if the open truncated the file."""
        with self._cond:
            self.spool = self.kernel.adopt(name, self.spool, truncate=truncate)

    def written_behind(self) -> None:
        """From now on (before its first write) the kernel writes into the spool
        directly (FUSE passthrough): no write request reaches the handle."""
        with self._cond:
            self.kernel.start(self.spool)
            self.stream.kick()            # follow the spool as it grows

    def behind(self) -> None:
        """(Under the lock.) Take in what the kernel wrote into the spool since the last
        look: its size, and — when anything changed — a new version to commit."""
        if self.kernel.moved(self.spool):
            self._touch()
            self.stream.kick()

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
        self.log.writes += 1
        n = self._failing(self.spool.write, offset, data)   # a full disk loses it
        self._touch()
        self.stream.kick()
        return n

    def read(self, offset: int, size: int) -> bytes:        # (a descriptor opened O_RDWR)
        with self._cond:
            self._check()
            return self.spool.read(offset, size)

    def truncate(self, size: int) -> None:
        with self._cond:
            self._ready()
            if size == self.spool.size:
                return
            self.stream.rewrites(size)
            self._failing(self.spool.truncate, size)
            self._touch()

    def set_attrs(self, *, mode=None, mtime=None, size=None, mtime_ns=None,
                  atime_ns=None, owner=None) -> bool:
        """chmod / utime / truncate / chown through this handle (as ``FileMeta.set``);
        False when it has closed meanwhile (then change the committed file instead)."""
        with self._cond:
            self._ready()
            if self.state is State.CLOSED:
                return False
            self.behind()
            if size is not None:
                self.truncate(size)
            if self.meta.set(mode=mode, owner=owner, mtime=mtime, mtime_ns=mtime_ns,
                             atime_ns=atime_ns):
                self._touch(content=False)
            if self.writeback and self.refs == 0 and self.state is State.STREAMING \
                    and not self.orphaned:
                # writeback: accepted, waiting for its commit, and no descriptor left
                # whose release would accept it again: accept the changed file now
                self._accept()
            return True

    def _touch(self, *, content: bool = True) -> None:
        """Something changed: a new version to commit (``content=False``: only its mode,
        owner or times; its times move as :class:`~s4fs.write.meta.FileMeta` says)."""
        first = self.state is not State.STREAMING
        self.state = State.STREAMING
        self.meta.changed(content=content, first=first)
        if content:
            self.same_bytes = False

    def _failing(self, step, *args):
        """``step(*args)``; where it raises, this version is lost: the handle fails."""
        try:
            return step(*args)
        except BaseException as exc:
            self.fail(exc)
            raise

    def _wait_commit(self) -> None:
        """A commit releases the lock while it waits for the ingest thread; nothing may
        change the handle meanwhile (it commits one consistent spool)."""
        while self.state is State.COMMITTING:
            self._cond.wait()

    def _check(self) -> None:
        if self.error is not None:
            raise self.error

    def _ready(self) -> None:       # (under the lock) no commit runs, the handle not failed
        self._wait_commit()
        self._check()

    # --- commit ----------------------------------------------------------------------

    def flush(self) -> None:
        """A descriptor is closed: commit (or, writeback, accept) if the file looks
        complete (module docstring). Raises the handle's error, if any."""
        with self._cond:
            self._ready()
            self.behind()
            if self.state is not State.STREAMING or self.orphaned or \
                    not looks_complete(self.spool.read, self.spool.size):
                return          # (a half-written checkpoint: the last release acts)
            self.log.closing()
            self._act()

    def fsync(self) -> None:
        """Commit now, whatever the file looks like, in both modes; raises if it fails."""
        with self._cond:
            self._ready()
            self.behind()
            if self.orphaned or self.state not in (State.STREAMING, State.SPOOLED):
                return
            if self.state is State.STREAMING:
                self.kernel.check_room(self.spool, self.fail)
            try:
                self._commit()
            except BaseException as exc:
                if not self.writeback:
                    self.fail(exc)
                else:                   # the accepted bytes stay pending, queued again
                    self.pending.failed(exc)
                    self.services.committer.submit(self)
                raise

    def background_commit(self) -> bool:
        """Called by the committer. True when nothing is left to do for this handle."""
        with self._cond:
            self._wait_commit()
            if self.state is State.SPOOLED and not self.orphaned:
                try:
                    self._commit()
                except BaseException as exc:
                    self.pending.failed(exc)          # the committer tries again
                    return False
            elif self.state is State.STREAMING and not self.orphaned:
                return True        # written again since accepted: the next accept queues it
            if self.refs <= 0 and self.state is not State.CLOSED:
                self._close()
            return True

    def _act(self) -> None:
        """Commit now, or (writeback) accept; a failure (a full disk the kernel's
        writes under passthrough never told of, too) fails the handle."""
        self.kernel.check_room(self.spool, self.fail)
        self._failing(self._accept if self.writeback else self._commit)

    def _commit(self) -> None:
        """Commit the spool as it is now. Raises on failure, leaving the handle as it was
        (its ingest to start again from the whole spool)."""
        before, self.state = self.state, State.COMMITTING
        attrs_only = self.same_bytes and self.previous is not None
        try:
            m = self.meta.onto(self.previous) if attrs_only else self.stream.manifest()
            self.services.record.committed(self, m)
        except BaseException:
            if self.state is State.COMMITTING:
                self.state = before
            if not attrs_only:
                self.stream.reset(ok=False)    # the next try ingests the whole spool
            raise
        finally:
            self._cond.notify_all()            # wake calls waiting for the commit to end
        self.previous, self.state, self.same_bytes = m, State.COMMITTED, True
        self.pending.committed(self.spool.name)
        self.stream.reset(ok=True)   # a later write: a new version, ingested afresh
        if self.kernel.on and self.refs > 0:
            self.stream.kick()       # the kernel may write on: follow the next version
        self.log.committed(self.path, m)

    def _accept(self) -> None:
        """(Writeback.) The spool holds every byte: journal it, queue its commit."""
        self.pending.accept(self.path, self.spool, self.meta)
        self.state = State.SPOOLED
        self.services.committer.submit(self)

    def fail(self, exc: BaseException) -> None:
        """(Under the lock.) This version can never be committed: every later call raises
        ``exc``; the file shows its previous version again at once."""
        if self.error is None:
            self.error = exc
            metrics.observe_error(type(exc).__name__)
        self.state = State.FAILED
        self.kernel.stop()
        self.pending.forget(self.spool.name)    # its spool goes with it
        self.stream.abort()
        self.services.record.released(self)

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
                    self._act()
                except BaseException:
                    self._close()
                    raise
                if not self.writeback:         # (the committer closes it once committed)
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
            self.pending.forget(self.spool.name)

    @contextlib.contextmanager
    def moving(self, path: str):
        """The path is renamed while this handle is open (or its commit pending): yields
        True with the handle at ``path`` and held, so that no commit lands while the
        rename moves the manifests; False if it has closed meanwhile (then drop it)."""
        with self._cond:
            self._wait_commit()
            if not self.live():
                yield False
                return
            self.path = path
            self.spool.label = path
            self.pending.moved(self.path, self.spool, self.meta)
            yield True

    def detach(self) -> None:
        """The mount is going away: stop, but keep an accepted file's spool and journal
        entry for the next start to replay."""
        with self._cond:
            self._wait_commit()
            self._close(keep=self.state is State.SPOOLED and not self.orphaned)

    def _close(self, *, keep: bool = False) -> None:     # keep: the spool stays (replay)
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
        decoded = self.services.decoded
        if committed and decoded is not None and not self.orphaned and not keep:
            # the spool holds exactly the committed version: keep it as a read cache
            decoded.adopt(self.previous.id, self.spool)
        else:
            self.spool.close(remove=not keep)
        self.services.record.released(self)
