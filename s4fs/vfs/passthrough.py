"""The passthrough policy: which open of an inode the kernel passes through to a local
file (a save's spool, or a committed version's whole copy in the decoded cache), and
what happens to that file while opens come and go.

The kernel allows one backing file per inode, and no open with the kernel's own page
cache beside it. So the first open of an inode decides (a backing file, or the page
cache) and later opens follow it: a save opened while readers hold a version's copy
takes that copy over as its spool (as on a local disk, readers see the new bytes land);
a reader opened while the file changed another way has the copy rewritten to the
version it reads. Every decision and its open count is one step under the tables' lock.
"""

from __future__ import annotations

import dataclasses
import errno
import logging
import os
import threading

from s4fs.errors import Busy
from s4fs.vfs.port import KernelPort
from s4fs.vfs.tables import Tables
from s4fs.write import fresh_spool_name

log = logging.getLogger("s4fs.mount")

# the kernel's answers to a backing open where passthrough cannot work at all (not one
# file's trouble): no such ioctl, not negotiated, not permitted
NO_PASSTHROUGH = frozenset({errno.ENOTTY, errno.EOPNOTSUPP, errno.EINVAL, errno.EPERM,
                            errno.ENOSYS})


@dataclasses.dataclass
class Backing:
    """The file the kernel passes one inode through to: the spool of a save, or the
    local whole copy of a committed version (the decoded cache) for readers."""
    id: int
    fd: int                           # the daemon's own descriptor of it (its identity)
    handle: object | None             # the save (WriteHandle) whose spool it is, if any
    version: str | None = None        # else: the committed version it holds
    name: str | None = None           # where it lies when outside the decoded cache
    opens: int = 1                    # descriptors of the inode using it
    released: bool = False            # the save's own descriptors are all closed
    # held while the file changes hands (a save takes it over, a refresh rewrites it)
    lock: threading.Lock = dataclasses.field(default_factory=threading.Lock)

    def holds(self) -> str | None:
        """The committed version the file is exactly, or None (a save being written,
        or one that failed)."""
        return self.handle.committed_id() if self.handle is not None else self.version

    def writing(self) -> bool:
        """Whether the file is a save's spool that is still the file's content (being
        written, accepted, or committed and not yet released)."""
        return self.handle is not None and self.handle.live()


class Passthrough:
    """The backing files of one mount. ``enabled``: ask the kernel for passthrough at
    all; ``optional``: passthrough was not asked for by the user, so the kernel's first
    refusal of the kind that means "never here" turns it off for the mount (said once,
    through ``on_refused``)."""

    def __init__(self, fs, tables: Tables, port: KernelPort, on_refused=None) -> None:
        self.fs = fs
        self.tables = tables
        self.port = port
        self.enabled = False
        self.optional = False
        # a cold file's read open waits for its whole local copy (FsConfig)
        self.whole_cold = fs.cfg.cold_reads != "stream"
        self.on_refused = on_refused           # called with why, when turned off
        self._backing: dict[int, Backing] = {}                  # inode -> its backing

    def backing(self, inode: int) -> Backing | None:
        return self._backing.get(inode)

    # --- opens -----------------------------------------------------------------------

    def for_write(self, inode: int, handle) -> int:
        """A write open of ``inode``, counted as open: the backing id of its spool for
        the kernel, or 0 to stay on write requests (passthrough off, a writer already on
        requests, readers open with the kernel's page cache, or the kernel refused).
        Where the kernel already passes the inode through to a file (readers hold it),
        that file becomes the save's spool, written in place as on a local disk.

        The choice and the count are one step under the tables' lock: two opens of one
        inode deciding at once would otherwise both find it free and ask the kernel for
        two backing files, or one for a backing file beside a cached open (it answers
        ``EIO``)."""
        t = self.tables
        if not self.enabled:
            t.hold(inode, handle.node)
            return 0
        bid = 0
        with t.lock:
            held = self._backing.get(inode)
            if held is not None:
                held.opens += 1           # it stays registered while this open uses it
            elif not t.opens_locked(inode) and \
                    (fd := handle.spool_fd(sole=True)) is not None:
                bid = self._register(fd, handle.path, "stays on write requests")
                if bid:
                    self._backing[inode] = Backing(bid, fd, handle)
            t.hold_locked(inode, handle.node)
        if held is not None:
            if held.handle is handle:     # another descriptor of the same save
                return held.id
            try:
                return self._take_over(held, handle)
            except BaseException:
                self.drop(inode)
                t.let_go(inode)
                # a new save that never starts: the file stays as it is
                if handle.descriptors <= 1:
                    handle.abort()
                else:
                    handle.release()
                raise
        if bid:
            handle.written_behind()
            log.info("%s: written through FUSE passthrough (backing id %d)", handle.path,
                     bid)
        return bid

    def wants_whole_copy(self, inode: int, handle) -> bool:
        """Whether a read open of a cold file should wait for the file to be decoded
        whole onto local disk, so that the kernel reads it through passthrough: a
        committed version with no local copy yet, on an inode that no open holds (one
        through the page cache would keep this open off passthrough; a backing file
        already serves it). The file is decoded ahead whole at its first read anyway
        (s4fs.read.fill); waiting at the open instead lets every read bypass the daemon,
        which on a fresh node costs more than the decode (docs/ARCHITECTURE.md)."""
        if not (self.enabled and self.whole_cold) or handle.version is None or \
                handle.local_file() is not None:
            return False
        with self.tables.lock:
            return inode not in self._backing and not self.tables.opens_locked(inode)

    def for_read(self, inode: int, handle) -> int:
        """A read open of ``inode``, counted as open: the backing id the kernel reads it
        through, or 0 for the page cache. A file passed through already is read through
        the same file (its spool while it is saved, or the copy of its version — brought
        to the version this open reads if the file changed another way); a committed
        version kept whole on local disk is passed through when no cached open is in
        the way. One step under the tables' lock, as in :meth:`for_write`."""
        t = self.tables
        if not self.enabled:
            t.hold(inode, handle.node)
            return 0
        local, version = handle.local_file(), handle.version   # outside the lock
        bid = 0
        with t.lock:
            held = self._backing.get(inode)
            if held is not None:
                held.opens += 1           # it stays registered while this open uses it
            elif local is not None and not t.opens_locked(inode):
                fd = os.dup(local)
                bid = self._register(fd, handle.path, "is read through the daemon")
                if bid:
                    self._backing[inode] = Backing(bid, fd, None, version)
            t.hold_locked(inode, handle.node)
        if held is None:
            if bid:
                log.info("%s: read through FUSE passthrough (backing id %d)", handle.path,
                         bid)
            return bid
        try:
            self._refresh(held, handle)
        except BaseException:
            self.drop(inode)
            t.let_go(inode)
            raise
        return held.id

    def drop(self, inode: int) -> None:
        """An open of ``inode`` that used its backing file is closed; the last one's
        close hands the file back (and deletes it where no cache keeps it)."""
        with self.tables.lock:
            held = self._backing.get(inode)
            if held is None:
                return
            held.opens -= 1
            if held.handle is not None and held.handle.descriptors <= 0 and \
                    not held.released:
                held.released = True
                log.info("%s: the passthrough save's descriptors are closed (%d other "
                         "opens keep its spool)", held.handle.path, held.opens)
            if held.opens > 0:
                return
            del self._backing[inode]
        try:
            self.port.close_backing(held.id)
        except OSError as exc:
            log.warning("dropping backing id %d of inode %d: %s", held.id, inode, exc)
        os.close(held.fd)
        if held.name is not None:         # a copy no cache keeps
            try:
                os.unlink(held.name)
            except OSError:
                pass

    # --- the file changing hands -------------------------------------------------------

    def _register(self, fd: int, path: str, otherwise: str) -> int:
        """The backing id of the file open at ``fd`` (the caller's now), or 0 where the
        kernel refuses (``fd`` closed, the log says what happens ``otherwise``). Where
        passthrough was not asked for and the kernel cannot do it at all (too old, not
        built with it, not root), the mount stops asking."""
        try:
            return self.port.open_backing(fd)
        except OSError as exc:
            os.close(fd)
            if self.optional and exc.errno in NO_PASSTHROUGH:
                self.enabled = False
                why = (f"{exc}: the kernel needs Linux >= 6.9 built with "
                       f"CONFIG_FUSE_PASSTHROUGH, and root")
                log.warning("FUSE passthrough is not available here (%s); this mount "
                            "reads and writes through FUSE requests", why)
                if self.on_refused is not None:
                    self.on_refused(why)
            else:
                log.warning("FUSE passthrough refused (%s): %s %s", exc, path, otherwise)
            return 0

    def _take_over(self, held: Backing, handle) -> int:
        """A save of an inode the kernel passes through to ``held``'s file (readers of
        the last version hold it): that file becomes the new spool — out of the decoded
        cache, truncated if the open truncates — and readers see the new bytes land, as
        on a local disk. Refused (EBUSY, nothing changed) where the file is not the
        version the save starts from, or no longer named (docs/SEMANTICS.md)."""
        truncate = handle.size == 0
        with held.lock:
            version = held.holds()
            name = None
            if not held.writing() and (truncate or (
                    version is not None and handle.committed_id() == version)):
                name = self._out_of_cache(held, version)
            if name is not None:
                handle.use_spool(name, truncate=truncate)
                handle.written_behind()
                with self.tables.lock:
                    held.handle, held.version, held.released = handle, None, False
                    held.name = None          # the spool's now: the save decides its fate
        if name is None:
            log.warning("%s: cannot be saved while readers hold an older copy of it "
                        "through FUSE passthrough: close them, or mount without "
                        "--passthrough", handle.path)
            raise Busy(f"{handle.path}: readers hold an older copy of it through FUSE "
                       f"passthrough; close them, or mount without --passthrough")
        log.info("%s: written through FUSE passthrough in place of the copy its readers "
                 "hold (backing id %d)", handle.path, held.id)
        return held.id

    def _out_of_cache(self, held: Backing, version: str | None) -> str | None:
        """``held``'s file under a spool name of its own: moved out of the decoded cache
        (where it is ``version``'s copy), or where an earlier move left it; None where
        it has no name any more."""
        st = os.fstat(held.fd)
        if held.name is not None:
            try:
                if os.path.samestat(os.stat(held.name), st):
                    return held.name
            except OSError:
                pass
        if self.fs.decoded is None or version is None:
            return None
        return self.fs.decoded.take(version, st, fresh_spool_name(self.fs.spool_dir))

    def _refresh(self, held: Backing, handle) -> None:
        """Bring ``held``'s file to the version ``handle`` reads, where the file changed
        without going through it (a truncate by path, another mount's commit, a failed
        save): the kernel takes no other file for the inode while readers hold this one,
        so it is rewritten in place — those readers see the new version, as readers of
        a local disk see a change — and kept as that version's local copy."""
        with held.lock:
            version = handle.version      # None: a save on requests, or one accepted
            if held.writing() or (version is not None and held.holds() == version):
                return
            name = self._out_of_cache(held, held.holds())
            fd = os.open(f"/proc/self/fd/{held.fd}", os.O_RDWR)
            try:
                size, pos = handle.size, 0
                while pos < size:
                    data = handle.read(pos, min(8 << 20, size - pos))
                    if not data:
                        break
                    os.pwrite(fd, data, pos)
                    pos += len(data)
                os.ftruncate(fd, pos)
            finally:
                os.close(fd)
            with self.tables.lock:
                held.handle, held.version, held.name = None, version, name
            if name is not None and version is not None and self.fs.decoded is not None \
                    and self.fs.decoded.adopt_file(version, name, pos):
                held.name = None          # back in the cache, as that version's copy
        log.info("%s: the file its readers hold through FUSE passthrough now holds "
                 "version %s", handle.path, version or "being written")
