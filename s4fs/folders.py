"""The store's root and folders, as the filesystem (:mod:`s4fs.fs`) sees them.

The root marker (``keys.ROOT_MARKER``) says which store format the store holds and when
it was made; a folder is a marker under ``dirs/`` (its times) or just the prefix of
what lies in it. :class:`Folders` answers whether a path is a folder and its attributes,
and makes, removes, retimes and moves folders in the store.
"""

from __future__ import annotations

import stat as st
import time
from typing import Callable

from s4fs import keys, sealed
from s4fs.attr import Attr
from s4fs.errors import NotADirectory, NotFound, UnsupportedVersionError
from s4fs.manifest import seconds_to_ns
from s4fs.stores import Store

__all__ = ["Folders", "STORE_FORMAT"]

STORE_FORMAT = {"format": "s4fs-store", "version": 1}

_DIR_MODE = 0o755                  # a folder that records no mode (the root, older stores)
_LISTED = (keys.FILES, keys.DIRS, keys.LINKS)   # what lies in a folder


class Folders:
    """The folders of ``store``. ``is_file(path)``: whether a file (a committed manifest)
    is at ``path``; ``open_under(path)``: whether a file is being written in folder
    ``path`` on this mount (such a folder exists before anything of it is stored).

    Checks the root marker first (writing one into a new store): a store this s4fs
    cannot use raises here, before anything else is made."""

    def __init__(self, store: Store, is_file: Callable[[str], bool],
                 open_under: Callable[[str], bool]) -> None:
        self.store = store
        self._is_file, self._open_under = is_file, open_under
        self.known: set[str] = {""}       # folders seen to exist (a cache, not the truth)
        # the root's times (and those of folders that record none): when it was made
        self.root_ns = self._check_root()

    def _check_root(self) -> int:
        try:
            data = self.store.get(keys.ROOT_MARKER)
        except NotFound:
            root_ns = time.time_ns()
            self.store.put(keys.ROOT_MARKER,
                           sealed.store_marker({**STORE_FORMAT, "created_ns": root_ns}))
            return root_ns
        doc = sealed.read_store_marker(
            data, f"store marker (object {keys.ROOT_MARKER!r} in {self.store.url})")
        if doc["version"] > STORE_FORMAT["version"]:
            raise UnsupportedVersionError(
                f"{self.store.url} holds an s4fs store of version {doc.get('version')}; "
                f"this s4fs reads version {STORE_FORMAT['version']}: upgrade s4fs")
        created = doc.get("created_ns")
        # a store made before s4fs recorded it: the marker object's time (its one put)
        return created if type(created) is int else \
            seconds_to_ns(self.store.head(keys.ROOT_MARKER).mtime)

    def attr(self, path: str) -> Attr:
        """The attributes of folder ``path`` (the caller found no file there): the times
        its marker records; one without a marker, or whose marker records none, shows
        the store's creation time. NotFound when it is no folder."""
        if path == "":
            return Attr("", True, 0, st.S_IFDIR | _DIR_MODE, self.root_ns / 1e9, 0,
                        self.root_ns)
        # one read serves both questions, as in is_dir
        try:
            marker = self.store.get(keys.dir_key(path))
        except NotFound:
            marker = None
        if marker is not None:
            rec = sealed.read_dir_marker(marker, self._where(path))
        elif self.has_children(path):
            rec = {}
        else:
            self.known.discard(path)
            raise NotFound(f"no such file or directory: {path!r}")
        self.known.add(path)
        mtime = rec.get("mtime_ns", self.root_ns)
        return Attr(path, True, 0, st.S_IFDIR | rec.get("mode", _DIR_MODE), mtime / 1e9,
                    0, mtime, rec.get("atime_ns"), rec.get("ctime_ns"), rec.get("uid"),
                    rec.get("gid"))

    def _where(self, path: str) -> str:
        return f"marker of directory {path!r} (object {keys.dir_key(path)!r} in " \
               f"{self.store.url})"

    def is_dir(self, path: str) -> bool:
        exists = self.has_marker(path) or self.has_children(path)
        if exists:
            self.known.add(path)
        else:
            self.known.discard(path)
        return exists

    def has_marker(self, path: str) -> bool:
        """Whether ``dirs/<path>`` exists; a damaged marker is an error (EIO), not a guess."""
        try:
            data = self.store.get(keys.dir_key(path))
        except NotFound:
            return False
        sealed.check_dir_marker(data, self._where(path))
        return True

    def has_children(self, path: str) -> bool:
        for prefix in _LISTED:
            for _ in self.store.list(prefix + path + "/"):
                return True
        return self._open_under(path)

    def names(self, path: str) -> tuple[set[str], list[str]]:
        """The names the store holds in folder ``path``, and the paths of the files
        among them."""
        pre = path + "/" if path else ""
        names, files = set(), []
        for prefix in _LISTED:
            for obj in self.store.list(prefix + pre):
                rest = obj.key[len(prefix) + len(pre):]
                if rest:
                    names.add(rest.split("/", 1)[0])
                    if prefix == keys.FILES and "/" not in rest:
                        files.append(pre + rest)
        return names, files

    def ensure_parents(self, path: str) -> None:
        """The folders above ``path`` exist in the store (markers made where missing);
        NotADirectory where one of them is a file."""
        p = keys.parent(path)
        missing = []
        while p and p not in self.known:
            missing.append(p)
            p = keys.parent(p)
        for d in reversed(missing):
            if not self.has_marker(d):
                if self._is_file(d):
                    raise NotADirectory(f"{d!r} is a file, not a directory")
                self.store.put(keys.dir_key(d), sealed.dir_marker(mtime_ns=time.time_ns()))
            self.known.add(d)

    def make(self, path: str, mode: int | None = None,
             owner: tuple[int, int] | None = None) -> None:
        """mkdir: the marker of a new folder (the caller checked the names), with its
        permission bits and (uid, gid) where given."""
        uid, gid = owner or (None, None)
        self.store.put(keys.dir_key(path), sealed.dir_marker(
            mtime_ns=time.time_ns(), mode=None if mode is None else mode & 0o7777,
            uid=uid, gid=gid))
        self.known.add(path)

    def remove(self, path: str) -> None:
        """rmdir of an empty folder."""
        self.store.delete(keys.dir_key(path))
        self.known.discard(path)

    def set_attrs(self, a: Attr, *, mtime_ns: int | None = None,
                  atime_ns: int | None = None, mode: int | None = None,
                  owner: tuple[int, int] | None = None) -> bool:
        """utime / chmod / chown of folder ``a``: a folder keeps them in its marker (the
        root has none: it keeps its own). Whether anything changed."""
        if not a.path or (mtime_ns is None and atime_ns is None and mode is None
                          and owner is None):
            return False
        recorded = a.mode & 0o7777 if a.mode & 0o7777 != _DIR_MODE else None
        uid, gid = owner or (a.uid, a.gid)
        self.store.put(keys.dir_key(a.path), sealed.dir_marker(
            mtime_ns=a.mtime_ns if mtime_ns is None else mtime_ns,
            atime_ns=a.atime_ns if atime_ns is None else atime_ns,
            ctime_ns=time.time_ns(), mode=recorded if mode is None else mode & 0o7777,
            uid=uid, gid=gid))
        self.known.add(a.path)
        return True

    def move(self, old: str, new: str) -> None:
        """The store's side of a folder rename: its marker and every object under it."""
        self.ensure_parents(new + "/x")
        try:       # the folder keeps its times (its marker, as it is)
            marker = self.store.get(keys.dir_key(old))
        except NotFound:
            marker = sealed.dir_marker()      # it had none: the store's time shows
        self.store.put(keys.dir_key(new), marker)
        self.known.add(new)
        for prefix in _LISTED:
            for obj in list(self.store.list(prefix + old + "/")):
                rest = obj.key[len(prefix) + len(old):]
                self.store.put(prefix + new + rest, self.store.get(obj.key))
                self.store.delete(obj.key)
        self.store.delete(keys.dir_key(old))
        self.known = {d for d in self.known if d != old and not d.startswith(old + "/")}
