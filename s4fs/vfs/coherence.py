"""What a mount tells the kernel to forget, and the wait for it.

The core says when the kernel's cached pages or attributes of a file may no longer be
its bytes (a commit through another descriptor, a failed save, a file changed on another
node): :class:`Coherence` asks the kernel, through the port, to drop them — and the name
too where the file is gone — and a ``close()`` or ``fsync()`` that follows waits for the
kernel to have done so (:meth:`Coherence.settle`), so that the caller's next read sees
the new bytes.
"""

from __future__ import annotations

import logging
import os
import threading

import trio

from s4fs import keys
from s4fs.vfs.port import KernelPort
from s4fs.vfs.push import Pushes
from s4fs.vfs.tables import Tables

log = logging.getLogger("s4fs.vfs")

__all__ = ["Coherence"]


class Coherence:
    """``pushes``: the mount's pushes of decoded bytes into the kernel's pages, stopped
    for an inode whose pages are dropped; ``tables``: its inode table (and lock)."""

    def __init__(self, port: KernelPort, tables: Tables, pushes: Pushes) -> None:
        self._port, self._tables, self._pushes = port, tables, pushes
        self._dropping: set[threading.Thread] = set()   # invalidations under way

    def forget_attributes(self, inode: int) -> None:
        self.forget_pages(inode, attr_only=True)

    def forget_pages(self, inode: int, *, attr_only: bool = False) -> None:
        """Drop the kernel's cached pages of ``inode`` (``attr_only``: its attributes
        alone), now, on the calling thread."""
        self._pushes.stop(inode)
        try:
            self._port.invalidate_inode(inode, attr_only=attr_only)
        except OSError as exc:            # not known to the kernel (yet)
            log.debug("invalidating inode %d%s: %s", inode,
                      " (attributes)" if attr_only else "", exc)

    def invalidate(self, node, gone: bool) -> None:
        """The core says the kernel's pages of ``node`` may not be its bytes: drop
        them, and when the file is gone (a failed first save), its name, so that the
        next open creates it instead of failing on the stale entry. From a thread of its
        own: the kernel waits for pages that reads in flight hold, and those reads need
        this daemon to answer."""
        inode = node.cache_key
        if inode is None:
            return
        entry = None
        if gone:
            parent = self._tables.known_inode(keys.parent(node.path))
            if parent is not None:
                entry = (parent, os.fsencode(keys.basename(node.path)))

        def drop():
            self._pushes.stop(inode)
            try:
                self._port.invalidate_inode(inode, attr_only=False)
                if entry is not None:
                    self._port.invalidate_entry(*entry)
            except OSError as exc:        # gone from the kernel already
                log.debug("invalidating inode %d: %s", inode, exc)
        t = threading.Thread(target=drop, daemon=True, name="s4fs-invalidate")
        with self._tables.lock:  # started before settle can see it (it joins what it sees)
            t.start()
            self._dropping.add(t)

    async def settle(self) -> None:
        """Wait for the kernel to have dropped what the core asked so far (before a
        close() or fsync() that failed, or committed, returns to the caller)."""
        with self._tables.lock:
            pending, self._dropping = self._dropping, set()
        if pending:
            await trio.to_thread.run_sync(lambda: [t.join() for t in pending])
