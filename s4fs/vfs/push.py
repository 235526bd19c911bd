"""A cold file read while it is decoded: its decoded bytes pushed into the kernel's page
cache as they land (:class:`Pushes`).

A fresh node's first open of a checkpoint finds no local copy: the decode ahead
(s4fs.read.fill) fills one in the worker processes, batch by batch. Waiting at the open
until the copy is whole and then passing it through puts ``torch.load`` after the whole
decode; answering every read in the daemon costs a Python round trip per request. Here
the open returns at once, through the page cache, and threads of the daemon push each
batch's bytes into the kernel's cache of the file (FUSE ``notify_store``) as it lands,
in the order the decode runs: the reads that find their pages there never reach the
daemon; one that runs ahead of the decode is a request that waits for its own batch.
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
import os
import threading

log = logging.getLogger("s4fs.mount")

PIECE = 4 << 20          # bytes per push
THREADS = 2              # pushers per file (batches taken in turns)


class Pusher:
    """Pushes one version's decoded copy into the kernel's pages of ``inode`` as the
    copy fills: ``fill`` (an s4fs.read.fill.Fill) says which ranges landed, ``fd`` (the
    pusher's own descriptor of the copy; closed when it ends) holds them."""

    def __init__(self, port, inode: int, fill, fd: int, on_refused, name: str = "") -> None:
        self.port, self.inode, self.fill, self.fd = port, inode, fill, fd
        self.name = name or f"inode {inode}"
        self.on_refused = on_refused
        # one per thread, held across each of its pushes: stop() waits for them all
        self._locks = [threading.Lock() for _ in range(THREADS)]
        self._stopped = False
        self._count = threading.Lock()
        self._left = THREADS
        self._pushed = [0] * THREADS

    @property
    def pushed(self) -> int:
        return sum(self._pushed)

    def start(self) -> None:
        for k in range(THREADS):
            threading.Thread(target=self._run, args=(k,), daemon=True,
                             name="s4fs-push").start()

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

    def _run(self, k: int) -> None:
        buf = bytearray(PIECE)
        mv = memoryview(buf)
        lock = self._locks[k]
        try:
            for b in range(k, len(self.fill.batches), THREADS):
                for lo, hi in self.fill.ranges(b):
                    if not self.fill.wait(lo, hi):          # the decode ahead failed
                        return
                    pos = lo
                    while pos < hi:
                        n = os.preadv(self.fd, [mv[: min(PIECE, hi - pos)]], pos)
                        if n <= 0:
                            return
                        with lock:
                            if self._stopped:
                                return
                            self.port.store_pages(self.inode, pos, mv[:n])
                        self._pushed[k] += n
                        pos += n
        except OSError as exc:
            self._stopped = True
            if exc.errno in (errno.ENOSYS, errno.EOPNOTSUPP, errno.EPERM):
                self.on_refused(exc)
            else:                   # the kernel forgot the inode, the copy went away
                log.debug("pushing inode %d: %s", self.inode, exc)
        finally:
            with self._count:
                self._left -= 1
                last = self._left == 0
            if last:
                os.close(self.fd)
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
                p.stop()
                os.close(p.fd)
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
