"""The floor of any Python FUSE filesystem: a pyfuse3 mount that does nothing but pass
each request to a file in a local folder (no parsing, no hashing, no coding, no store).
Whatever an unchanged ``torch.save`` costs through it is the cost of the FUSE transport
itself as pyfuse3 runs it (one request of at most 1 MiB at a time, answered by one
Python process), which no pyfuse3 filesystem can go below.

    python bench/_fuse_floor.py BACKING_DIR MOUNTPOINT [--fsync] [--kernel-cache]
        [--passthrough]

``--fsync``: ``close()`` returns only once the file is on disk (flush fsyncs it), the
floor of a FUSE mount that is durable at ``close()``. ``--kernel-cache``: the kernel's
FUSE writeback cache on (writes land in the page cache; the kernel sends them on in the
background and all of them before ``close()`` returns). ``--passthrough``: the kernel's
FUSE passthrough (Linux >= 6.9, root): every open names its backing file and the kernel
reads and writes it directly, no request per read or write — needs pyfuse3 built with
``mount/binding/build_pyfuse3.sh`` (libfuse >= 3.16 and the few lines pyfuse3 3.5
lacks). Runs in the foreground until
SIGTERM / SIGINT or an unmount. Used by ``bench/train_loop.py`` (modes ``fuse-floor``
``fuse-floor+sync``, ``py-passthrough``, ``py-passthrough+sync``); flat files only,
enough for ``torch.save``/``torch.load``.
"""

from __future__ import annotations

import errno
import fcntl
import os
import signal
import stat
import struct
import sys

import pyfuse3
import trio


# linux/fuse.h: _IOW(229, 1, struct fuse_backing_map {s32 fd; u32 flags; u64 padding})
# and _IOW(229, 2, u32): register a backing file (the ioctl returns its id), drop an id
BACKING_OPEN, BACKING_CLOSE = 0x4010E501, 0x4004E502


class Floor(pyfuse3.Operations):
    """Flat passthrough: inode numbers by name, one OS descriptor per open."""

    def __init__(self, backing: str, fsync: bool, passthrough: bool = False) -> None:
        super().__init__()
        self.backing, self.fsync = backing, fsync
        self.names: dict[int, bytes] = {pyfuse3.ROOT_INODE: b""}
        self.inodes: dict[bytes, int] = {}
        self.fds: dict[int, int] = {}
        # the kernel wants one backing file per inode while any open uses it
        self.enable_passthrough = passthrough
        self.backing_ids: dict[int, list[int]] = {}       # inode -> [id, opens]
        self.fd_inodes: dict[int, int] = {}

    def _path(self, inode: int) -> str:
        return os.path.join(self.backing, os.fsdecode(self.names[inode]))

    def _inode(self, name: bytes) -> int:
        if name not in self.inodes:
            self.inodes[name] = len(self.names) + pyfuse3.ROOT_INODE
            self.names[self.inodes[name]] = name
        return self.inodes[name]

    def _attr(self, inode: int) -> pyfuse3.EntryAttributes:
        try:
            st = os.lstat(self._path(inode))
        except OSError as exc:
            raise pyfuse3.FUSEError(exc.errno)
        e = pyfuse3.EntryAttributes()
        for k in ("st_mode", "st_nlink", "st_uid", "st_gid", "st_size", "st_blocks"):
            setattr(e, k, getattr(st, k))
        e.st_atime_ns, e.st_mtime_ns, e.st_ctime_ns = st.st_atime_ns, st.st_mtime_ns, st.st_ctime_ns
        e.st_ino, e.st_blksize = inode, 4096
        e.attr_timeout = e.entry_timeout = 1.0
        return e

    async def lookup(self, parent_inode, name, ctx=None):
        if parent_inode != pyfuse3.ROOT_INODE:
            raise pyfuse3.FUSEError(errno.ENOENT)
        return self._attr(self._inode(name))

    async def getattr(self, inode, ctx=None):
        return self._attr(inode)

    async def setattr(self, inode, attr, fields, fh, ctx):
        if fields.update_size:
            os.truncate(self._path(inode), attr.st_size)
        if fields.update_mode:
            os.chmod(self._path(inode), stat.S_IMODE(attr.st_mode))
        return self._attr(inode)

    async def opendir(self, inode, ctx):
        return inode

    async def readdir(self, fh, start_id, token):
        names = sorted(os.listdir(self.backing))
        for i, name in enumerate(names[start_id:], start=start_id):
            b = os.fsencode(name)
            if not pyfuse3.readdir_reply(token, b, self._attr(self._inode(b)), i + 1):
                break

    async def unlink(self, parent_inode, name, ctx):
        os.unlink(os.path.join(self.backing, os.fsdecode(name)))

    async def statfs(self, ctx):
        st = os.statvfs(self.backing)
        s = pyfuse3.StatvfsData()
        for k in ("f_bsize", "f_frsize", "f_blocks", "f_bfree", "f_bavail", "f_files",
                  "f_ffree", "f_favail", "f_namemax"):
            setattr(s, k, getattr(st, k))
        return s

    def _open_fd(self, inode: int, flags: int, mode: int = 0o644) -> pyfuse3.FileInfo:
        fd = os.open(self._path(inode), flags & ~os.O_APPEND, mode)
        self.fds[fd] = fd
        if not self.enable_passthrough:
            return pyfuse3.FileInfo(fh=fd)
        held = self.backing_ids.get(inode)
        if held is None:
            # the kernel keeps the file it is given; a read-write one serves every open
            rw = os.open(self._path(inode), os.O_RDWR)
            try:
                bid = fcntl.ioctl(pyfuse3.get_session_fd(), BACKING_OPEN,
                                  bytearray(struct.pack("=iIQ", rw, 0, 0)), True)
            finally:
                os.close(rw)
            held = self.backing_ids[inode] = [bid, 0]
        held[1] += 1
        self.fd_inodes[fd] = inode
        # the kernel refuses passthrough with other open flags (keep_cache among them)
        return pyfuse3.FileInfo(fh=fd, keep_cache=False, backing_id=held[0])

    async def open(self, inode, flags, ctx):
        return self._open_fd(inode, flags)

    async def create(self, parent_inode, name, mode, flags, ctx):
        inode = self._inode(name)
        fi = self._open_fd(inode, flags | os.O_CREAT, stat.S_IMODE(mode))
        return fi, self._attr(inode)

    async def read(self, fh, off, size):
        return os.pread(fh, size, off)

    async def write(self, fh, off, buf):
        return os.pwrite(fh, buf, off)           # inline on the event loop, as s4fs does

    async def flush(self, fh):
        if self.fsync:
            await trio.to_thread.run_sync(os.fsync, fh)

    async def fsync(self, fh, datasync):
        await trio.to_thread.run_sync(os.fsync, fh)

    async def release(self, fh):
        os.close(self.fds.pop(fh))
        inode = self.fd_inodes.pop(fh, None)
        if inode is not None:
            held = self.backing_ids[inode]
            held[1] -= 1
            if not held[1]:
                del self.backing_ids[inode]
                fcntl.ioctl(pyfuse3.get_session_fd(), BACKING_CLOSE,
                            bytearray(struct.pack("=I", held[0])), True)


def main(argv: list[str]) -> int:
    backing, mountpoint = argv[0], argv[1]
    passthrough = "--passthrough" in argv
    if passthrough and not hasattr(pyfuse3, "get_session_fd"):
        sys.exit("--passthrough needs pyfuse3 built by mount/binding/build_pyfuse3.sh "
                 "(this pyfuse3 cannot hand the kernel a backing file)")
    ops = Floor(backing, fsync="--fsync" in argv, passthrough=passthrough)
    ops.enable_writeback_cache = "--kernel-cache" in argv
    opts = set(pyfuse3.default_options) | {"fsname=fuse-floor"}
    pyfuse3.init(ops, mountpoint, opts)

    async def run():
        async with trio.open_nursery() as nursery:
            async def on_signal():
                with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as sigs:
                    async for _ in sigs:
                        pyfuse3.terminate()
                        return
            nursery.start_soon(on_signal)
            await pyfuse3.main(min_tasks=8, max_tasks=64)
            nursery.cancel_scope.cancel()
    try:
        trio.run(run)
    finally:
        pyfuse3.close(unmount=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
