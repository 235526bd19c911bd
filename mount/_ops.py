"""FUSE operations: each pyfuse3 request translated into a call on the core
(:class:`s4fs.vfs.Vfs`) and its result into pyfuse3's reply; errors become errno here,
and only here."""

from __future__ import annotations

import contextlib
import errno
import functools
import logging
import os

import pyfuse3

from s4fs import metrics
from s4fs.errors import S4Error
from s4fs.fs import Filesystem
from s4fs.vfs import Entry, Opened, Vfs

from ._port import Pyfuse3Port

log = logging.getLogger("s4fs.mount")


def _fuse_errors(fn):
    """The one place where errors become errno: only FUSEError leaves a handler."""

    @functools.wraps(fn)
    async def wrapper(*args, **kwargs):
        try:
            return await fn(*args, **kwargs)
        except pyfuse3.FUSEError:
            raise
        except S4Error as exc:
            if exc.errno == errno.EIO:
                log.error("%s: %s", fn.__name__, exc)
                metrics.observe_error(type(exc).__name__)
            elif fn.__name__ == "read":         # an mmap reader dies of it (SIGBUS)
                log.warning("read: %s (errno %d)", exc, exc.errno)
            raise pyfuse3.FUSEError(exc.errno) from None
        except OSError as exc:
            if exc.errno is None or exc.errno == errno.EBADF:   # EBADF: always our bug
                log.exception("%s failed", fn.__name__)
            elif fn.__name__ == "read":
                log.warning("read failed: %r", exc)
            metrics.observe_error(type(exc).__name__)
            raise pyfuse3.FUSEError(exc.errno or errno.EIO) from None
        except Exception as exc:
            log.exception("unexpected error in %s", fn.__name__)
            metrics.observe_error(type(exc).__name__)
            raise pyfuse3.FUSEError(errno.EIO) from None
    return wrapper


def _attrs(e: Entry) -> pyfuse3.EntryAttributes:
    a = pyfuse3.EntryAttributes()
    a.st_ino, a.st_mode, a.st_nlink = e.inode, e.mode, e.nlink
    a.st_uid, a.st_gid = e.uid, e.gid
    a.st_size, a.st_blksize, a.st_blocks = e.size, e.blksize, e.blocks
    a.st_atime_ns, a.st_mtime_ns, a.st_ctime_ns = e.atime_ns, e.mtime_ns, e.ctime_ns
    a.attr_timeout = a.entry_timeout = e.timeout
    return a


def _info(o: Opened) -> pyfuse3.FileInfo:
    if o.backing_id:
        return pyfuse3.FileInfo(fh=o.fh, keep_cache=False, backing_id=o.backing_id)
    return pyfuse3.FileInfo(fh=o.fh, keep_cache=o.keep_cache)


class S4Operations(pyfuse3.Operations):
    supports_dot_lookup = True
    # Off on purpose: with it the kernel trusts its own file sizes and never takes them
    # from us, so a file another node changed, or a failed save whose old version stays,
    # would show a stale size (docs/SEMANTICS.md). The spool would take any order.
    enable_writeback_cache = False
    enable_acl = False

    def __init__(self, fs: Filesystem, *, workers: int = 16, attr_timeout: float = 1.0,
                 uid: int | None = None, gid: int | None = None, info: dict | None = None):
        super().__init__()
        self.fs = fs
        self.vfs = Vfs(fs, Pyfuse3Port(), workers=workers, attr_timeout=attr_timeout,
                       uid=uid, gid=gid, info=info)
        self.info = self.vfs.info
        self.set_transport = self.vfs.set_transport

    # FUSE passthrough (the mount's --passthrough; a pyfuse3 that can ask for it): the
    # kernel writes a file being written straight into its spool; pyfuse3 reads this to
    # negotiate it (docs/ARCHITECTURE.md)
    @property
    def enable_passthrough(self) -> bool:
        return self.vfs.passthrough.enabled

    @enable_passthrough.setter
    def enable_passthrough(self, on: bool) -> None:
        self.vfs.passthrough.enabled = on

    @property
    def passthrough_optional(self) -> bool:
        """Passthrough as the default where it can be had (not asked for): the kernel's
        first refusal turns it off for the whole mount, said once."""
        return self.vfs.passthrough.optional

    @passthrough_optional.setter
    def passthrough_optional(self, on: bool) -> None:
        self.vfs.passthrough.optional = on

    # --- metadata ----------------------------------------------------------------------

    @_fuse_errors
    async def lookup(self, parent_inode, name, ctx=None):
        return _attrs(await self.vfs.lookup(parent_inode, os.fsdecode(name)))

    @_fuse_errors
    async def getattr(self, inode, ctx=None):
        return _attrs(await self.vfs.getattr(inode))

    @_fuse_errors
    async def setattr(self, inode, attr, fields, fh, ctx):
        changes = {}
        if fields.update_size:
            changes["size"] = attr.st_size
        if fields.update_mode:
            changes["mode"] = attr.st_mode
        if fields.update_mtime:
            changes["mtime_ns"] = attr.st_mtime_ns
        if fields.update_atime:               # the kernel never sends one for a read
            changes["atime_ns"] = attr.st_atime_ns
        if fields.update_uid:
            changes["uid"] = attr.st_uid
        if fields.update_gid:
            changes["gid"] = attr.st_gid
        return _attrs(await self.vfs.setattr(inode, changes, fh))

    @_fuse_errors
    async def readlink(self, inode, ctx):
        return await self.vfs.readlink(inode)

    @_fuse_errors
    async def symlink(self, parent_inode, name, target, ctx):
        return _attrs(await self.vfs.symlink(parent_inode, os.fsdecode(name), target,
                                             (ctx.uid, ctx.gid)))

    @_fuse_errors
    async def opendir(self, inode, ctx):
        return await self.vfs.opendir(inode)

    @_fuse_errors
    async def readdir(self, fh, start_id, token):
        async with contextlib.aclosing(self.vfs.readdir(fh, start_id)) as entries:
            async for name, e, next_id in entries:
                if not pyfuse3.readdir_reply(token, os.fsencode(name), _attrs(e), next_id):
                    return

    @_fuse_errors
    async def releasedir(self, fh):
        await self.vfs.releasedir(fh)

    @_fuse_errors
    async def mkdir(self, parent_inode, name, mode, ctx):
        return _attrs(await self.vfs.mkdir(parent_inode, os.fsdecode(name), mode,
                                           (ctx.uid, ctx.gid)))

    @_fuse_errors
    async def rmdir(self, parent_inode, name, ctx):
        await self.vfs.rmdir(parent_inode, os.fsdecode(name))

    @_fuse_errors
    async def unlink(self, parent_inode, name, ctx):
        await self.vfs.unlink(parent_inode, os.fsdecode(name))

    @_fuse_errors
    async def rename(self, parent_inode_old, name_old, parent_inode_new, name_new, flags,
                     ctx):
        await self.vfs.rename(parent_inode_old, os.fsdecode(name_old), parent_inode_new,
                              os.fsdecode(name_new),
                              noreplace=bool(flags & pyfuse3.RENAME_NOREPLACE),
                              exchange=bool(flags & pyfuse3.RENAME_EXCHANGE))

    @_fuse_errors
    async def statfs(self, ctx):
        d = await self.vfs.statfs()
        s = pyfuse3.StatvfsData()
        s.f_bsize = s.f_frsize = d["bsize"]
        s.f_blocks, s.f_bfree, s.f_bavail = d["blocks"], d["bfree"], d["bfree"]
        s.f_files, s.f_ffree, s.f_favail = d["files"], d["ffree"], d["ffree"]
        s.f_namemax = d["namemax"]
        return s

    async def forget(self, inode_list):
        pass    # inode numbers stay stable for the life of the mount

    # --- files -------------------------------------------------------------------------

    @_fuse_errors
    async def open(self, inode, flags, ctx):
        return _info(await self.vfs.open(inode, flags))

    @_fuse_errors
    async def create(self, parent_inode, name, mode, flags, ctx):
        opened, entry = await self.vfs.create(parent_inode, os.fsdecode(name), mode, flags,
                                              (ctx.uid, ctx.gid))
        return _info(opened), _attrs(entry)

    @_fuse_errors
    async def read(self, fh, off, size):
        return await self.vfs.read(fh, off, size)

    @_fuse_errors
    async def write(self, fh, off, buf):
        return await self.vfs.write(fh, off, buf)

    @_fuse_errors
    async def flush(self, fh):
        await self.vfs.flush(fh)

    @_fuse_errors
    async def fsync(self, fh, datasync):
        await self.vfs.fsync(fh)

    @_fuse_errors
    async def release(self, fh):
        await self.vfs.release(fh)
