"""What only the kernel can do for the filesystem core: the kernel port.

The core (:class:`s4fs.vfs.Vfs`) decides; the port carries out the five things that need
the kernel's FUSE session. ``s4fs.mount`` implements it over pyfuse3 in a few lines; the
tests use a recording fake, so the core's coherence and passthrough rules run without
root or ``/dev/fuse``.
"""

from __future__ import annotations

import abc


class KernelPort(abc.ABC):
    """The kernel side of one mount.

    ``open_backing`` raises ``OSError`` where the kernel refuses (no passthrough, not
    permitted, a bad file); its errno says which. The invalidations raise ``OSError``
    where the kernel does not know the inode or name (any more): nothing to drop. They
    may block until reads in flight finish, so the core calls them from a thread of
    their own, never from a request's handler."""

    @abc.abstractmethod
    def open_backing(self, fd: int) -> int:
        """Hand the kernel the file open at ``fd`` as a backing file for FUSE
        passthrough; the id the kernel gives it (the caller keeps ``fd``)."""

    @abc.abstractmethod
    def close_backing(self, backing_id: int) -> None:
        """The kernel drops the backing file ``backing_id``."""

    @abc.abstractmethod
    def invalidate_inode(self, inode: int, *, attr_only: bool) -> None:
        """Drop the kernel's cached attributes of ``inode`` and, unless ``attr_only``,
        its cached pages."""

    @abc.abstractmethod
    def store_pages(self, inode: int, offset: int, data) -> None:
        """Put ``data`` into the kernel's page cache of ``inode`` at ``offset`` (FUSE
        ``notify_store``): reads of those pages are then not sent to the daemon. Raises
        ``OSError`` where the kernel refuses (ENOSYS: never here) or does not know the
        inode (any more). Called from threads of the core's own; ``data`` (a buffer)
        is valid only during the call."""

    @abc.abstractmethod
    def invalidate_entry(self, parent: int, name: bytes) -> None:
        """Drop the kernel's cached name ``name`` in the folder ``parent``."""
