"""The kernel port over pyfuse3's session: the five things the core asks of the kernel."""

from __future__ import annotations

import fcntl
import struct

import pyfuse3

from s4fs.vfs import KernelPort

# linux/fuse.h: _IOW(229, 1, struct fuse_backing_map {s32 fd; u32 flags; u64 padding})
# registers a backing file for FUSE passthrough (the ioctl returns its id);
# _IOW(229, 2, u32) drops an id
_BACKING_OPEN, _BACKING_CLOSE = 0x4010E501, 0x4004E502


class Pyfuse3Port(KernelPort):
    """The port of the mount pyfuse3 runs in this process."""

    def open_backing(self, fd: int) -> int:
        return fcntl.ioctl(pyfuse3.get_session_fd(), _BACKING_OPEN,
                           bytearray(struct.pack("=iIQ", fd, 0, 0)), True)

    def close_backing(self, backing_id: int) -> None:
        fcntl.ioctl(pyfuse3.get_session_fd(), _BACKING_CLOSE,
                    bytearray(struct.pack("=I", backing_id)), True)

    def invalidate_inode(self, inode: int, *, attr_only: bool) -> None:
        try:
            pyfuse3.invalidate_inode(inode, attr_only=attr_only)
        except pyfuse3.FUSEError as exc:      # the kernel does not know it (any more)
            raise OSError(exc.errno, f"inode {inode}") from None

    def store_pages(self, inode: int, offset: int, data) -> None:
        try:
            pyfuse3.notify_store(inode, offset, data)
        except pyfuse3.FUSEError as exc:
            raise OSError(exc.errno, f"inode {inode}") from None

    def invalidate_entry(self, parent: int, name: bytes) -> None:
        try:
            pyfuse3.invalidate_entry(parent, name)
        except pyfuse3.FUSEError as exc:
            raise OSError(exc.errno, f"entry {name!r} of inode {parent}") from None
