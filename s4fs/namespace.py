"""The namespace changed by path: ``mkdir``, ``rmdir``, ``unlink``, ``rename``,
``symlink`` / ``readlink`` and ``set_attrs`` (chmod, chown, utime, truncate) of the
:class:`~s4fs.fs.Filesystem` that owns a :class:`PathChanges` (it calls these for its
methods of the same names). They check names as a local disk would, then change the
store (manifests, folder markers, links) and the filesystem's tables of open files
together; a file open for writing is changed through its write handle."""

from __future__ import annotations

import contextlib
import time
from typing import TYPE_CHECKING, Protocol

from s4fs import keys
from s4fs.attr import Attr
from s4fs.errors import (AlreadyExists, Busy, DirectoryNotEmpty, InvalidArgument,
                         IsADirectory, NotADirectory, NotFound)
from s4fs.manifest import seconds_to_ns

if TYPE_CHECKING:
    from s4fs.folders import Folders
    from s4fs.links import Links
    from s4fs.manifest import Manifest
    from s4fs.manifest_cache import ManifestCache
    from s4fs.openfiles import OpenFiles
    from s4fs.stores import Store
    from s4fs.write import WriteHandle

__all__ = ["PathChanges", "Changed"]


class Changed(Protocol):
    """The filesystem whose namespace :class:`PathChanges` changes
    (:class:`s4fs.fs.Filesystem`): its parts, and the few of its calls a change makes."""

    store: "Store"
    files: "OpenFiles"
    folders: "Folders"
    links: "Links"
    manifests: "ManifestCache"

    def stat(self, path: str) -> Attr: ...
    def exists(self, path: str) -> bool: ...
    def listdir(self, path: str) -> list[str]: ...
    def manifest(self, path: str, *, fresh: bool = False) -> "Manifest": ...
    def manifest_or_none(self, path: str, *, fresh: bool = False) -> "Manifest | None": ...
    def commit(self, path: str, m: "Manifest", *, saved: bool = True) -> None: ...
    def open_write(self, path: str, **how) -> "WriteHandle": ...


class PathChanges:
    """The by-path changes of ``fs``'s namespace."""

    def __init__(self, fs: Changed) -> None:
        self.fs = fs

    def symlink(self, path: str, target: bytes,
                owner: tuple[int, int] | None = None) -> Attr:
        """A symbolic link at ``path`` to ``target`` (any bytes, as given: it is not
        checked or resolved), owned by ``owner`` (uid, gid) where given."""
        path = keys.norm(path)
        if not target:
            raise NotFound("a symbolic link needs a target")
        if self.fs.exists(path):
            raise AlreadyExists(f"{path!r} already exists")
        parent = keys.parent(path)
        if parent and not self.fs.stat(parent).is_dir:
            raise NotADirectory(f"{parent!r} is not a directory")
        self.fs.links.make(path, target, owner)
        return self.fs.stat(path)

    def readlink(self, path: str) -> bytes:
        """The target of the symbolic link at ``path``; InvalidArgument where ``path``
        is no symbolic link (as readlink(2) says)."""
        path = keys.norm(path)
        link = self.fs.links.get(path)
        if link is None:
            self.fs.stat(path)                        # NotFound where there is nothing
            raise InvalidArgument(f"{path!r} is not a symbolic link")
        return link[0]

    def mkdir(self, path: str, mode: int = 0o755,
              owner: tuple[int, int] | None = None) -> None:
        """A folder at ``path`` with permission bits ``mode``, owned by ``owner`` (uid,
        gid) where given."""
        path = keys.norm(path)
        if self.fs.exists(path):
            raise AlreadyExists(f"{path!r} already exists")
        parent = keys.parent(path)
        if not self.fs.stat(parent).is_dir:
            raise NotADirectory(f"{parent!r} is not a directory")
        self.fs.folders.make(path, mode, owner)

    def rmdir(self, path: str) -> None:
        path = keys.norm(path)
        if not self.fs.stat(path).is_dir:
            raise NotADirectory(f"{path!r} is not a directory")
        if not path:
            raise Busy("cannot remove the root directory")
        if self.fs.listdir(path):
            raise DirectoryNotEmpty(f"directory {path!r} is not empty")
        self.fs.folders.remove(path)

    def unlink(self, path: str) -> None:
        path = keys.norm(path)
        a = self.fs.stat(path)
        if a.is_dir:
            raise IsADirectory(f"{path!r} is a directory")
        if a.is_link:
            self.fs.links.delete(path)
            return
        self.fs.files.unlink(path)
        self.fs.store.delete(keys.file_key(path))
        self.fs.manifests.remember(path, None)

    def rename(self, old: str, new: str, *, noreplace: bool = False) -> None:
        old, new = keys.norm(old), keys.norm(new)
        a = self.fs.stat(old)
        if old == new:
            return
        if new.startswith(old + "/"):
            raise InvalidArgument(f"cannot move {old!r} into itself")
        try:
            b = self.fs.stat(new)
        except NotFound:
            b = None
        if b is not None:
            if noreplace:
                raise AlreadyExists(f"{new!r} already exists")
            if a.is_dir and not b.is_dir:
                raise NotADirectory(f"{new!r} is not a directory")
            if not a.is_dir and b.is_dir:
                raise IsADirectory(f"{new!r} is a directory")
            if b.is_dir and self.fs.listdir(new):
                raise DirectoryNotEmpty(f"directory {new!r} is not empty")
        if not self.fs.stat(keys.parent(new)).is_dir:
            raise NotADirectory(f"{keys.parent(new)!r} is not a directory")
        if a.is_dir:
            self._rename_dir(old, new)
        elif a.is_link:
            self.fs.links.move(old, new)
            if b is not None and not b.is_link:       # a file it replaces
                self.fs.files.unlink(new)
                self.fs.store.delete(keys.file_key(new))
                self.fs.manifests.remember(new, None)
        else:
            self._rename_file(old, new)
            if b is not None and b.is_link:           # a link it replaces
                self.fs.links.delete(new)

    def _rename_file(self, old: str, new: str) -> None:
        w = self.fs.files.rename_file(old, new)
        if w is None:
            self._move_manifest(old, new, None)
            return
        with w.moving(new) as live:      # no commit of w lands meanwhile
            if not live:
                self.fs.files.writer_gone(w, new)
            self._move_manifest(old, new, w)

    def _move_manifest(self, old: str, new: str, w: WriteHandle | None) -> None:
        """The store's side of a file rename: ``old``'s committed manifest becomes
        ``new``'s; with none (a file still being written by ``w``), ``new`` shows no
        committed version until ``w`` commits."""
        m = self.fs.manifest_or_none(old, fresh=True)
        if m is not None:
            self.fs.commit(new, m, saved=False)
            self.fs.store.delete(keys.file_key(old))
        elif w is None:
            raise NotFound(f"no file {old!r}")
        else:
            self.fs.store.delete(keys.file_key(new))
            self.fs.manifests.remember(new, None)
        self.fs.manifests.remember(old, None)

    def _rename_dir(self, old: str, new: str) -> None:
        moved = self.fs.files.rename_folder(old, new)
        self.fs.manifests.clear()
        with contextlib.ExitStack() as held:      # no commit under the folder meanwhile
            for w, p in moved:
                if not held.enter_context(w.moving(p)):
                    self.fs.files.writer_gone(w, p)
            self.fs.folders.move(old, new)
        self.fs.manifests.clear()

    def set_attrs(self, path: str, *, mode: int | None = None, mtime: float | None = None,
                  size: int | None = None, mtime_ns: int | None = None,
                  atime_ns: int | None = None, uid: int | None = None,
                  gid: int | None = None) -> Attr:
        """chmod / utime / truncate / chown of a path (not through an open handle).
        Times: the mtime as ``mtime_ns`` (exact) or ``mtime`` (seconds), the atime as
        ``atime_ns``; ``uid`` / ``gid``: None leaves each as it is."""
        path = keys.norm(path)
        if mtime is not None and mtime_ns is None:
            mtime_ns = seconds_to_ns(mtime)
        times = {"mtime_ns": mtime_ns, "atime_ns": atime_ns}
        a = self.fs.stat(path)
        owner = None if uid is None and gid is None else \
            (a.uid if uid is None else uid, a.gid if gid is None else gid)
        w = self.fs.files.writer(path)
        if w is not None:
            if w.set_attrs(mode=mode, size=size, owner=owner, **times):
                return self.fs.stat(path)
            a = self.fs.stat(path)        # it closed meanwhile: change the committed file
        if a.is_dir:
            changed = self.fs.folders.set_attrs(a, mode=mode, owner=owner, **times)
            return self.fs.stat(path) if changed else a
        if a.is_link:
            self.fs.links.set_attrs(path, owner, **times)
        elif size is not None and size != a.size:
            self._resize(path, size, mode, times, owner)
        elif mode is not None or owner is not None or mtime_ns is not None \
                or atime_ns is not None:
            m = self.fs.manifest(path, fresh=True)
            if mode is not None:
                m.mode = (m.mode & ~0o7777) | (mode & 0o7777)
            if owner is not None:
                m.uid, m.gid = owner
            if mtime_ns is not None:
                m.mtime, m.mtime_ns = mtime_ns / 1e9, mtime_ns
            if atime_ns is not None:
                m.atime_ns = atime_ns
            m.ctime_ns = time.time_ns()
            self.fs.commit(path, m, saved=False)
        return self.fs.stat(path)

    def _resize(self, path: str, size: int, mode: int | None, times: dict,
                owner: tuple | None = None) -> None:
        """truncate of a path, through a write handle. A truncate to zero remembers the
        version it cut, so that a file written again right after keeps its lineage (the
        delta base of its next version)."""
        old = self.fs.manifest(path, fresh=True) if size == 0 else None
        h = self.fs.open_write(path, truncate=size == 0)
        try:
            if size != 0:
                h.truncate(size)
            h.set_attrs(mode=mode, owner=owner, **times)
            h.fsync()
        finally:
            h.release()
        if old is not None:
            self.fs.files.truncated(path, old)
