"""One file open for writing: its spool, its background ingest, and when it commits.

A write, top to bottom: the mount's ``write`` → :meth:`WriteHandle.write` (one ``pwrite``
into the :class:`~s4fs.write.spool.Spool`) → the handle's ingest thread feeds the spool's
written prefix to an :class:`~s4fs.write.ingest.IngestSession` (parse, chunk, code, pack,
upload — while the file is still being written) → at commit the session finishes (every
pack durable) and :meth:`Filesystem.commit` writes the manifest, the one atomic step.

States (``WriteHandle.state``)::

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
lock.
"""

from __future__ import annotations

import contextlib
import enum
import logging
import os
import threading
import time
from typing import TYPE_CHECKING, Protocol

import xxhash

from s4fs import metrics
from s4fs.errors import NoSpace, S4Error, SpoolChanged
from s4fs.write.ingest import IngestSession
from s4fs.manifest import Manifest, seconds_to_ns, stored_split
from s4fs.parse import looks_complete
from s4fs.write.spool import Spool

log = logging.getLogger(__name__)

if TYPE_CHECKING:
    from s4fs.write.committer import Committer
    from s4fs.read import ChunkSource, DecodedCache
    from s4fs.fs import FsConfig
    from s4fs.runtime import Runtime
    from s4fs.write.journal import Journal
    from s4fs.write.room import RoomKeeper


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

_STEP = 4 << 20           # bytes the ingest thread reads from the spool at a time
_FOLLOW = 0.005           # s between looks at a spool the kernel writes (passthrough)


class State(enum.Enum):
    STREAMING = "streaming"      # bytes not yet committed; ingest runs behind the writes
    SPOOLED = "spooled"          # close() accepted it (writeback): waiting for its commit
    COMMITTING = "committing"
    COMMITTED = "committed"      # the store holds exactly what the spool holds
    FAILED = "failed"
    CLOSED = "closed"


class WriteHandle:
    """One file open for writing on this mount, shared by every descriptor open on it."""

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
        self._orphaned = False            # unlinked while open: commit nothing
        self.node = None                  # its file on this mount (s4fs.read.node), once attached
        self._cond = threading.Condition(threading.RLock())
        self.spool = spool or Spool(fs.spool_dir, path, make_room=fs.make_room)
        # background ingest of the spool's written prefix
        self._session: IngestSession | None = None
        self._ingested = 0                # spool bytes the session has consumed
        self._claimed = 0                 # ... plus those the ingest thread is reading now
        self._stream_ok = True            # False once bytes it consumed were rewritten
        # passthrough: (offset, length, xxh3-64) of each step the ingest thread read; the
        # commit checks them against the spool (a rewrite is invisible to the handle)
        self._steps: list[tuple[int, int, int]] = []
        self._thread: threading.Thread | None = None
        self._stop = False
        self._same_bytes = False          # the spool holds exactly ``previous``'s bytes
        # FUSE passthrough (s4fs.mount): the kernel writes into the spool itself and the
        # handle learns of it from the spool's size and mtime (see behind())
        self.passthrough = False
        self._watching = False            # counted by fs.room while the kernel writes
        self._seen: tuple[int, int] | None = None
        try:
            if initial is not None:
                self._fill_from(initial)
                self.state = State.COMMITTED      # nothing new yet
                self._same_bytes = True
        except BaseException:
            self.spool.close()
            raise

    def _fill_from(self, m: Manifest) -> None:
        """An existing file opened without truncation: its bytes become the spool."""
        from s4fs.read import FileReader
        reader = FileReader(m, self.fs.source, path=self.path)
        pos = 0
        while pos < m.size:
            data = reader.read(pos, min(8 << 20, m.size - pos))
            if not data:
                break
            self.spool.write(pos, data)
            pos += len(data)

    # --- descriptors -----------------------------------------------------------------

    def share(self, *, truncate: bool) -> bool:
        """Another descriptor opens this file; False if the handle has already closed
        (the caller then opens a new one)."""
        with self._cond:
            self._wait_commit()
            if self.state in (State.CLOSED, State.FAILED):
                return False
            self.refs += 1
            if truncate:
                self.truncate(0)
            return True

    @property
    def size(self) -> int:
        if self.passthrough and self.spool.fd >= 0:
            try:
                return os.fstat(self.spool.fd).st_size     # what the kernel wrote so far
            except OSError:
                pass
        return self.spool.size

    def live(self) -> bool:
        """Whether the spool is the file's content: not closed, not failed."""
        return self.state not in (State.CLOSED, State.FAILED)

    def use_spool(self, name: str, *, truncate: bool) -> None:
        """(FUSE passthrough) The kernel already passes this file through to the file at
        ``name`` (readers hold it: a copy of the version this handle starts from): that
        file becomes the spool, emptied if the open truncated the file."""
        with self._cond:
            spool = Spool.reopen(name, self.path, make_room=self.fs.make_room)
            try:
                if truncate:
                    spool.truncate(0)
            except BaseException:
                spool.close()
                raise
            self.spool.close()
            self.spool = spool

    def written_behind(self) -> None:
        """From now on the kernel writes into the spool directly (FUSE passthrough): no
        write request reaches the handle. Called before the first such write."""
        with self._cond:
            if not self._watching:
                self.fs.room.watch()      # the caches make room before the disk is full
                self._watching = True
            self.passthrough = True
            self._seen = self._spool_stamp()
            self._kick()                  # follow the spool as it grows

    def _unwatch(self) -> None:
        if self._watching:
            self._watching = False
            self.fs.room.unwatch()

    def _no_room_check(self) -> None:
        """(Under the lock; a passthrough save about to be committed or accepted.) The
        kernel's writes into the spool never reached the daemon, so one that failed on a
        full cache disk went unseen: where the disk is full now, fail the save (the
        previous version stays) rather than commit what the spool holds."""
        if not self.passthrough:
            return
        try:
            self.spool.check_written_behind()
        except NoSpace as exc:
            log.warning("%s", exc)
            self._fail(exc)
            raise

    def _spool_stamp(self) -> tuple[int, int]:
        st = os.fstat(self.spool.fd)
        return st.st_size, st.st_mtime_ns

    def behind(self) -> None:
        """(Under the lock.) Take in what the kernel wrote into the spool since the last
        look: its size, and — when anything changed — a new version to commit. The
        ingest thread follows the spool's size (both modes); what it read is checked
        against the spool at the commit (:meth:`_steps_hold`), since a rewrite of bytes
        it already read is invisible here."""
        if not self.passthrough or self.spool.fd < 0:
            return
        stamp = self._spool_stamp()
        if stamp == self._seen:
            return
        self._seen = stamp
        self.spool.written_to(stamp[0])
        self._touch()
        self._kick()

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
        if offset < self._claimed:
            self._stream_ok = False           # rewrites bytes ingest already took
        self.nwrites += 1
        try:
            n = self.spool.write(offset, data)
        except BaseException as exc:           # cache disk full: this version is lost
            self._fail(exc)
            raise
        self._touch()
        self._kick()
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
            if size < self._claimed:
                self._stream_ok = False
            try:
                self.spool.truncate(size)
            except BaseException as exc:
                self._fail(exc)
                raise
            self._touch()

    def set_attrs(self, *, mode=None, mtime=None, size=None, mtime_ns=None,
                  atime_ns=None) -> bool:
        """chmod / utime / truncate through this handle (the mtime as ``mtime_ns``, or
        ``mtime`` in seconds); False when it has closed meanwhile (the caller then
        changes the committed file instead)."""
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
            if mtime is not None and mtime_ns is None:
                mtime_ns = seconds_to_ns(mtime)
            if mtime_ns is not None:
                self.mtime_ns = mtime_ns
                self._touch(mtime=False)
            if atime_ns is not None:
                self.atime_ns = atime_ns
                self._touch(mtime=False)
            if self.writeback and self.refs == 0 and self.state is State.STREAMING \
                    and not self._orphaned:
                # writeback: the file was accepted and waits for its commit, and no
                # descriptor is left whose release would accept it again: accept the
                # changed file now (journalled anew, queued for its commit)
                self._accept()
            return True

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
            self._same_bytes = False

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
            if self.state is not State.STREAMING or self._orphaned:
                return
            self._no_room_check()
            if not looks_complete(self.spool.read, self.spool.size):
                return                 # a half-written checkpoint: the last release acts
            self.closed_at = time.monotonic()
            self._act()

    def fsync(self) -> None:
        """Commit now, whatever the file looks like, in both modes; raises if it fails."""
        with self._cond:
            self._wait_commit()
            self._check()
            self.behind()
            if self._orphaned or self.state not in (State.STREAMING, State.SPOOLED):
                return
            if self.state is State.STREAMING:
                self._no_room_check()
            if not self.writeback:
                self._commit_or_fail()
                return
            try:
                self._commit()
            except BaseException as exc:
                self._retry_later(exc)         # the accepted bytes stay pending
                raise

    def _act(self) -> None:
        if not self.writeback:
            self._commit_or_fail()
            return
        try:
            self._accept()
        except BaseException as exc:   # not journalled: close() fails, nothing is kept
            self._fail(exc)
            raise

    def _accept(self) -> None:
        """Writeback: the spool holds every byte; journal it, queue its commit, return."""
        from s4fs.write.journal import Entry
        self.accepted_at = time.time()
        self.fs.journal.record(Entry(self.path, self.spool.name, self.mode, self.mtime,
                                     self.spool.size, self.accepted_at, self.mtime_ns,
                                     self.atime_ns))
        self.state = State.SPOOLED
        self.fs.committer.submit(self)

    def _commit_or_fail(self) -> None:
        try:
            self._commit()
        except BaseException as exc:
            self._fail(exc)
            raise

    def _commit(self) -> None:
        """Commit the spool as it is now. Raises on failure, leaving the handle as it was
        (its session aborted): the caller fails it or retries."""
        try:
            self._commit_inner()
        finally:
            self._cond.notify_all()         # wake calls waiting in _wait_commit

    def _commit_inner(self) -> None:
        before = self.state
        self.state = State.COMMITTING
        if self._same_bytes and self.previous is not None:
            self._commit_attrs(before)
            return
        try:
            self._stop_ingest()
            self._check()
            s = self._session
            self._session = None
            if s is not None and not (self._stream_ok and self._steps_hold()):
                s.abort()
                s = None
            try:
                m = self._finish(s)
            except SpoolChanged:
                if s is None:
                    raise
                # bytes changed under the streaming coders (a rewrite they caught):
                # ingest the whole spool again
                m = self._finish(None)
            self.fs.commit(self.path, m)
        except BaseException:
            if self.state is State.COMMITTING:
                self.state = before
            self._ingested = self._claimed = 0
            self._steps = []
            self._stream_ok = False            # the next try ingests the whole spool
            self._stop = False
            raise
        self._committed(m)

    def _finish(self, s: IngestSession | None) -> Manifest:
        """Feed the spool's rest to the streaming session ``s`` (None: a new session, the
        whole spool) and finish it; aborted if that fails."""
        start = self._ingested
        if s is None:
            s = self.fs.new_session(self.path, self.previous, self.spool.name)
            start = 0
        try:
            self._feed(s, start, self.spool.size)
            return s.finish(mode=self.mode, mtime_ns=self.mtime_ns, atime_ns=self.atime_ns)
        except BaseException:
            s.abort()
            raise

    def _steps_hold(self) -> bool:
        """Whether the spool still holds what the ingest thread read of it: always where
        every write came as a request (a rewrite of read bytes cleared ``_stream_ok``);
        under passthrough, each step's bytes hashed again, in parallel on the runtime's
        check threads (pread and xxhash release the GIL)."""
        if not self.passthrough:
            return True
        if self._ingested > self.spool.size:
            return False
        fd = self.spool.fd

        def holds(step):
            off, n, digest = step
            return xxhash.xxh3_64_intdigest(os.pread(fd, n, off)) == digest
        checks = self.fs.runtime.thread("s4fs-check", min(8, os.cpu_count() or 1))
        return all(checks.map(holds, self._steps))

    def _commit_attrs(self, before: State) -> None:
        """Only mode or times changed since the last commit: a new manifest for the same
        chunks (no re-ingest)."""
        import dataclasses
        m = dataclasses.replace(self.previous, mode=self.mode, mtime=self.mtime,
                                mtime_ns=self.mtime_ns, atime_ns=self.atime_ns,
                                ctime_ns=time.time_ns())
        try:
            self.fs.commit(self.path, m)
        except BaseException:
            self.state = before
            raise
        self._committed(m)

    def _committed(self, m: Manifest) -> None:
        self.previous = m
        self.state = State.COMMITTED
        self._same_bytes = True
        self.fs.saw_commit(self, m)
        if self.accepted_at:
            self.fs.journal.drop(self.spool.name)
            self.accepted_at = 0.0
        self.attempts = 0
        self.last_error = None
        # a later write starts a new version, ingested afresh from the whole spool
        self._ingested = self._claimed = 0
        self._steps = []
        self._stream_ok = True
        self._stop = False
        if self.passthrough and self.refs > 0:
            self._kick()            # the kernel may write on: follow the next version
        now = time.monotonic()
        log.info("%s: committed %d bytes written in %d writes, %.3f s after the open%s",
                 self.path, m.size, self.nwrites, now - self.opened,
                 f" ({now - self.closed_at:.3f} s after the close)" if self.closed_at else "")
        self.nwrites, self.closed_at = 0, 0.0
        split = stored_split(m)
        metrics.observe_save(self.path, m.size, m.stored_bytes(),
                             time.monotonic() - self.opened,
                             stored_delta=split["stored_delta"], unchanged=split["unchanged"])

    def _retry_later(self, exc: BaseException) -> None:
        self.attempts += 1
        self.last_error = exc
        metrics.observe_error(type(exc).__name__)
        if self.state is not State.STREAMING:
            self.state = State.SPOOLED
        self.fs.committer.submit(self)

    def background_commit(self) -> bool:
        """Called by the committer. True when nothing is left to do for this handle."""
        with self._cond:
            self._wait_commit()
            if self._orphaned or self.state in (State.FAILED, State.CLOSED):
                self._maybe_close()
                return True
            if self.state is not State.SPOOLED:
                # committed by an fsync meanwhile, or written again since it was
                # accepted (then the next accept queues it anew)
                if self.state is State.COMMITTED:
                    self._maybe_close()
                return True
            try:
                self._commit()
            except BaseException as exc:
                self.attempts += 1
                self.last_error = exc
                metrics.observe_error(type(exc).__name__)
                return False
            self._maybe_close()
            return True

    def _maybe_close(self) -> None:
        if self.refs <= 0 and self.state is not State.CLOSED:
            self._close()

    def _feed(self, s: IngestSession, lo: int, hi: int) -> None:
        while lo < hi:
            data = self.spool.read(lo, min(_STEP, hi - lo))
            if not data:
                raise S4Error(f"internal error: the spool of {self.path!r} is shorter than "
                              f"its size; nothing was committed")
            s.write(data, stable=True)
            lo += len(data)

    def _fail(self, exc: BaseException) -> None:
        """This version can never be committed: every later call raises ``exc``, and the
        file stops showing this version at once (the previous one stays)."""
        if self.error is None:
            self.error = exc
            metrics.observe_error(type(exc).__name__)
        self.state = State.FAILED
        self._unwatch()
        if self.accepted_at:           # its spool goes with it: nothing left to replay
            self.fs.journal.drop(self.spool.name)
            self.accepted_at = 0.0
        if self._session is not None:
            self._session.abort()
            self._session = None
        self.fs.release_writer(self)

    # --- background ingest -----------------------------------------------------------

    def _kick(self) -> None:
        """Wake (or start) the ingest thread: the written prefix grew.

        A ``--writeback`` handle fed by write requests codes nothing while the file is
        being written: in one Python process, coding next to the FUSE requests slows the
        writes themselves (measured: 2.4x local disk on the H200 box), and what a
        writeback mount promises is the shortest stall; the committer codes the whole
        spool once it is accepted. Under passthrough no request reaches the daemon, so
        the default mode follows the spool (the committer then codes only what is
        left); ``--writeback`` does only where asked (``FsConfig.code_while_written``:
        measured, coding after close blocked the training loop less, the same drain)."""
        if self.writeback and not (self.passthrough and self.fs.cfg.code_while_written):
            return
        if self._thread is None and not self._stop:
            self._thread = threading.Thread(target=self._ingest_loop, daemon=True,
                                            name="s4fs-ingest")
            self._thread.start()
        self._cond.notify_all()

    def _stop_ingest(self) -> None:
        """Stop the ingest thread and wait until it is out (releases the lock meanwhile)."""
        self._stop = True
        self._cond.notify_all()
        while self._thread is not None:
            self._cond.wait()

    def _ingest_loop(self) -> None:
        from s4fs.coding import lower_priority
        lower_priority(self.fs.cfg.ingest.nice)
        s = None
        try:
            while True:
                with self._cond:
                    while not self._stop and self.error is None and (
                            not self._stream_ok
                            or self.state not in (State.STREAMING, State.SPOOLED)
                            or self._ingested >= self.spool.frontier):
                        if self.passthrough:     # no write request says it grew: look
                            self._cond.wait(_FOLLOW)
                            self.behind()
                        else:
                            self._cond.wait()
                    if self._stop or self.error is not None:
                        return
                    lo = self._ingested
                    hi = min(self.spool.frontier, lo + _STEP)
                    self._claimed = hi
                    s = self._session
                if s is None:
                    s = self.fs.new_session(self.path, self.previous, self.spool.name)
                    with self._cond:
                        self._session = s
                data = os.pread(self.spool.fd, hi - lo, lo)
                step = (lo, len(data), xxhash.xxh3_64_intdigest(data)) \
                    if self.passthrough else None
                s.write(data, stable=True)
                with self._cond:
                    if self._stream_ok:
                        self._ingested = lo + len(data)
                        if step is not None:
                            self._steps.append(step)
                    self._claimed = self._ingested
        except BaseException as exc:       # a failed upload, a codec error, ...
            with self._cond:
                changed = isinstance(exc, SpoolChanged)
                if self.writeback or changed:
                    # the commit ingests the whole spool again (writeback: and retries
                    # until it works). SpoolChanged: bytes were rewritten under the
                    # coders, which passthrough hides from the handle
                    if self._session is not None:
                        self._session.abort()
                        self._session = None
                    self._stream_ok = False
                    if not changed:
                        self.last_error = exc
                else:
                    self._fail(exc)
        finally:
            with self._cond:
                self._thread = None
                self._cond.notify_all()

    def committed_id(self) -> str | None:
        """The id of the committed version whose bytes are exactly what was written
        through this handle (so a kernel page cache filled by those writes may be kept),
        or None."""
        with self._cond:
            if self.error is not None or self._orphaned or not self._same_bytes or \
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
            if self.state is State.STREAMING and self.error is None and not self._orphaned:
                try:
                    self._no_room_check()
                except BaseException:
                    self._close()
                    raise
                if self.writeback:
                    try:
                        self._accept()
                    except BaseException as exc:
                        self._fail(exc)
                        self._close()
                        raise
                    return                     # the committer closes it once committed
                try:
                    self._commit_or_fail()
                finally:
                    self._close()
                return
            if self.state is not State.SPOOLED or self._orphaned:
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
            self._orphaned = True
            if self.accepted_at:
                self.fs.journal.drop(self.spool.name)
                self.accepted_at = 0.0

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
                from s4fs.write.journal import Entry
                self.fs.journal.record(Entry(path, self.spool.name, self.mode, self.mtime,
                                             self.spool.size, self.accepted_at,
                                             self.mtime_ns, self.atime_ns))
            yield True

    def detach(self) -> None:
        """The mount is going away: stop, but keep an accepted file's spool and journal
        entry for the next start to replay."""
        with self._cond:
            self._wait_commit()
            if self.state is State.SPOOLED and not self._orphaned:
                self._stop_ingest()
                if self._session is not None:
                    self._session.abort()
                    self._session = None
                self.spool.close(remove=False)
                self.state = State.CLOSED
                self._unwatch()
                self.fs.release_writer(self)
            else:
                self._close()

    def _close(self) -> None:
        if self._thread is not None:
            # the thread must be out before the spool goes, and nothing may change the
            # handle while this waits for it (the wait releases the lock): a chmod let in
            # here would be accepted and then dropped with the spool
            before, self.state = self.state, State.COMMITTING
            try:
                self._stop_ingest()
            finally:
                self.state = before
                self._cond.notify_all()
        if self._session is not None:
            self._session.abort()
            self._session = None
        self._unwatch()
        if self.state is not State.FAILED:
            committed = self.state is State.COMMITTED and self.previous is not None
            self.state = State.CLOSED
        else:
            committed = False
        if committed and self.fs.decoded is not None and not self._orphaned:
            # the spool holds exactly the committed version: keep it as a read cache
            self.fs.decoded.adopt(self.previous.id, self.spool)
        else:
            self.spool.close()
        self.fs.release_writer(self)
