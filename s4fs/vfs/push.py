"""A cold file read while it is decoded: its decoded bytes pushed into the kernel's page
cache as they land (:class:`Pushes`).

A fresh node's first open of a checkpoint finds no local copy: the decode ahead
(s4fs.read.fill) fills one in the worker processes, batch by batch. Waiting at the open
until the copy is whole and then passing it through puts ``torch.load`` after the whole
decode; answering every read in the daemon costs a Python round trip per request. Here
the open returns at once, through the page cache, and threads of the daemon push the
decoded bytes into the kernel's cache of the file (FUSE ``notify_store``) as they land,
lowest first, in whole pages, straight from a mapping of the copy: the reads that find
their pages there never reach the daemon; one that runs ahead of the decode is a request
that waits for its own batch. A page that holds bytes of two batches is pushed once both
are in (the kernel keeps only pages a push fills, and a pusher must not wait on a page
that a read request holds while it waits for the batch still decoding).
``bench/push_floor.py`` measured the three ways with no codec at all.

The pages pushed are exactly the version the open reads (``kernel_id`` of its node, in
s4fs.read.node), and only while nothing else may write the inode's pages: the core stops
an inode's pusher — and waits for a push in flight — before anything that changes what
the kernel's pages of it should be: an open for writing, a truncate, an open of another
version, and every invalidation the core asks of the kernel.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import mmap
import os
import threading

from s4fs.read.fill import Ranges

log = logging.getLogger("s4fs.mount")

PIECE = 4 << 20          # bytes per push
PAGE = mmap.PAGESIZE


def threads() -> int:
    """Pushers per file (each takes the next landed piece): the kernel copies each pushed page
    in the pusher's own thread, at 1-2 GB/s, so a machine with cores to spare pushes
    with more of them; two at least, eight at most."""
    return max(2, min(8, (os.cpu_count() or 2) // 2))


class Pusher:
    """Pushes one version's decoded copy into the kernel's pages of ``inode`` as the
    copy fills: ``fill`` (an s4fs.read.fill.Fill) says which ranges landed, ``fd`` (the
    pusher's own descriptor of the copy; closed when it ends) holds them."""

    def __init__(self, port, inode: int, fill, fd: int, on_refused, name: str = "") -> None:
        self.port, self.inode, self.fill, self.fd = port, inode, fill, fd
        self.name = name or f"inode {inode}"
        self.on_refused = on_refused
        self.threads = threads()
        # one per thread, held across each of its pushes: stop() waits for them all
        self._locks = [threading.Lock() for _ in range(self.threads)]
        self._stopped = False
        self._count = threading.Lock()
        self._left = self.threads
        self._pushed = [0] * self.threads
        # what the threads took to push, in file order as it lands (:meth:`_claim`)
        self._planning = threading.Lock()
        self._taken = Ranges()
        self._seen = -1
        # the kernel copies the pushed bytes straight out of a mapping of the copy (no
        # read into a buffer first); ``pread`` into one where the copy cannot be mapped
        try:
            self._map = mmap.mmap(fd, fill.m.size, mmap.MAP_SHARED, mmap.PROT_READ)
        except (OSError, ValueError):
            self._map = None

    @property
    def pushed(self) -> int:
        return sum(self._pushed)

    def start(self) -> None:
        for k in range(self.threads):
            threading.Thread(target=self._run, args=(k,), daemon=True,
                             name="s4fs-push").start()

    def discard(self) -> None:
        """Never started: let its copy go."""
        self._stopped = True
        if self._map is not None:
            self._map.close()
        os.close(self.fd)

    def stop(self, wait: bool = True) -> None:
        """No push after this returns (those in flight are waited for); ``wait`` False:
        none after those in flight, which are not waited for (the event loop must not
        wait: a push may wait for a page that a read request in flight holds, and its
        reply goes out through that loop)."""
        self._stopped = True
        if wait:
            for lock in self._locks:
                with lock:
                    pass

    def _claim(self) -> tuple[int, int] | None:
        """The next piece to push: the lowest part, up to :data:`PIECE` bytes, of the
        landed bytes no thread took yet, in whole pages (the kernel keeps a pushed page
        only when the push fills it: a page shared with bytes still decoding waits for
        them); None when there is none left or the push stops."""
        size = self.fill.m.size
        with self._planning:
            while not self._stopped:
                landings, ranges, over = self.fill.landed(self._seen)
                if self.fill.failed is not None:
                    return None
                for lo, hi in ranges:
                    lo = -(-lo // PAGE) * PAGE
                    hi = hi if hi == size else hi // PAGE * PAGE
                    got = self._taken.gap(lo, hi) if lo < hi else None
                    if got is not None:
                        piece = (got[0], min(got[1], got[0] + PIECE))
                        self._taken.add(*piece)
                        return piece
                if over:
                    return None
                self._seen = landings           # wait for the next batch to land
        return None

    def _run(self, k: int) -> None:
        view = memoryview(self._map) if self._map is not None else None
        buf = memoryview(bytearray(PIECE)) if view is None else None
        lock = self._locks[k]
        try:
            while (got := self._claim()) is not None:
                pos, end = got
                if view is not None:
                    piece = view[pos: end]
                else:
                    n = os.preadv(self.fd, [buf[: end - pos]], pos)
                    if n <= 0:
                        return
                    piece = buf[:n]
                try:
                    with lock:
                        if self._stopped:
                            return
                        self.port.store_pages(self.inode, pos, piece)
                    self._pushed[k] += len(piece)
                finally:
                    piece.release()         # the mapping closes once no piece holds it
        except OSError as exc:
            self._stopped = True
            if exc.errno in (errno.ENOSYS, errno.EOPNOTSUPP, errno.EPERM):
                self.on_refused(exc)
            else:                   # the kernel forgot the inode, the copy went away
                log.debug("pushing inode %d: %s", self.inode, exc)
        finally:
            if view is not None:
                view.release()
            with self._count:
                self._left -= 1
                last = self._left == 0
            if last:
                os.close(self.fd)
                if self._map is not None:
                    self._map.close()
                log.info("%s: %.1f MiB of its decoded copy pushed into the page cache",
                         self.name, self.pushed / 2**20)


class Pushes:
    """The pushers of one mount, by inode; ``enabled``: cold files are read while they
    are decoded, pushed (``FsConfig.cold_reads`` "push", ``s4fs mount
    --push-cold-reads``). The kernel's first refusal of a push turns pushing off for
    the mount (its cold opens then wait for the whole copy, or stream)."""

    def __init__(self, port, enabled: bool) -> None:
        self.port = port
        self.enabled = enabled
        self._lock = threading.Lock()
        self._by_inode: dict[int, list[Pusher]] = {}
        # held while a pusher begins and while a change to an inode's bytes (an open for
        # writing, a truncate) stops its pushers and takes effect: a pusher begins only
        # if its version is still the file's, with no writer, and is stopped otherwise
        self._gate = threading.Lock()

    def prepare(self, inode: int, handle) -> Pusher | None:
        """A pusher of the copy ``handle`` (a cold committed version's reader) is decoded
        into — its decode ahead started now — or None where there is none (not decoded
        ahead: a small file, no pool). Started by :meth:`begin`."""
        got = handle.decoding() if self.enabled else None
        if got is None:
            return None
        fill, fd = got
        return Pusher(self.port, inode, fill, fd, self._refused,
                      getattr(handle, "path", "") or "")

    def begin(self, p: Pusher, still) -> bool:
        """Start ``p`` if ``still()`` (its version is the file's, no writer) — asked
        under the gate that :meth:`quiet` holds; else drop it. Whether it started."""
        with self._gate:
            if not still():
                p.discard()
                return False
            with self._lock:
                self._by_inode.setdefault(p.inode, []).append(p)
            p.start()
            return True

    @contextlib.contextmanager
    def quiet(self, inode: int | None):
        """Within the block, nothing pushes into ``inode``'s pages, and no pusher begins
        (the change the block makes — an open for writing, a truncate — is seen by any
        pusher about to begin)."""
        with self._gate:
            if inode is not None:
                self.stop(inode)
            yield

    def active(self, inode: int) -> bool:
        with self._lock:
            return bool(self._by_inode.get(inode))

    def stop(self, inode: int, wait: bool = True) -> None:
        """Stop every pusher of ``inode``: none pushes after this returns (``wait``
        False: after the push in flight, not waited for — from the event loop)."""
        with self._lock:
            ps = self._by_inode.pop(inode, [])
        for p in ps:
            p.stop(wait)

    def _refused(self, exc: OSError) -> None:
        if self.enabled:
            self.enabled = False
            log.warning("the kernel refused to take decoded pages (%s); cold files are "
                        "read through requests while they are decoded", exc)
