"""Which store holds a path: the Filesystem of each store the process opened, a path
or URL split into (filesystem, path inside the store), and read-only file objects.

A path names a file in a store: a local path or ``file://`` URL inside a store root
(a folder holding ``s4fs-store.json``; a new store is created in the file's folder when
none is found above it), a path under an s4fs mount of this machine, or
``s3://bucket/prefix/...`` the same way. The Python API (``s4fs.api``) and the torch
save and load (``s4fs.torch``) both find their files here.
"""

from __future__ import annotations

import io
import os
from urllib.parse import unquote, urlparse

from s4fs import keys
from s4fs.errors import InvalidArgument, PermissionDenied
from s4fs.fs import Filesystem, FsConfig
from s4fs.mtab import s4fs_mount_of
from s4fs.runtime import current as current_runtime
from s4fs.stores import LocalStore, open_store

def filesystem(store_url: str, cfg: FsConfig | None = None) -> Filesystem:
    """The Filesystem of a store URL, kept open by the API's runtime
    (``s4fs.runtime.current()``, closed at interpreter exit). The API reads files
    straight into the caller's memory, so it keeps no decoded-file cache on disk (a
    mount does)."""
    def make() -> Filesystem:
        return Filesystem(open_store(store_url), cfg or FsConfig(decoded_cache_bytes=0))

    def deleted(fs) -> bool:               # the folder was deleted (and maybe made again)
        return "://" not in store_url and not LocalStore(store_url).exists(keys.ROOT_MARKER)

    return current_runtime().opened("filesystem:" + store_url, make, deleted)


def close_all() -> None:
    """Close every Filesystem the API opened (their temporary cache dirs go too)."""
    current_runtime().close_opened()


def resolve(path, *, create: bool = False) -> tuple[Filesystem, str]:
    """Split a path or URL into (filesystem of its store, path inside the store)."""
    path = os.fspath(path)
    if path.startswith("s3://"):
        return _resolve_s3(path, create)
    if path.startswith("file://"):
        path = unquote(urlparse(path).path)
    full = os.path.abspath(path)
    mounted = _through_mount(full)
    if mounted is not None:
        return mounted
    d = full
    while True:
        if os.path.isdir(d) and LocalStore(d).exists(keys.ROOT_MARKER):
            rel = os.path.relpath(full, d).replace(os.sep, "/")
            return filesystem(d), "" if rel == "." else rel
        up = os.path.dirname(d)
        if up == d:
            break
        d = up
    if not create:
        raise InvalidArgument(
            f"{path} is not inside an s4fs store (no {keys.ROOT_MARKER} in any parent "
            f"folder); save a file there first or run 's4fs init DIR'")
    root = os.path.dirname(full)
    return filesystem(root), os.path.basename(full)


def _through_mount(full: str):
    """A path under an s4fs mount of this machine maps to the mount's store."""
    found = mount_of(full)
    if found is None:
        return None
    source, _, rel = found
    return filesystem(source), rel


def mount_of(path) -> tuple[str, str, str] | None:
    """``(store URL, mountpoint, path inside the store)`` when ``path`` lies under an
    s4fs mount of this machine, else None."""
    found = s4fs_mount_of(os.path.abspath(os.fspath(path)))
    if found is None:
        return None
    entry, rel = found
    return entry.store, entry.path, rel


def _resolve_s3(url: str, create: bool) -> tuple[Filesystem, str]:
    rest = url[len("s3://"):]
    bucket, _, key = rest.partition("/")
    parts = key.split("/")
    for cut in range(len(parts) - 1, -1, -1):
        prefix = "/".join(parts[:cut])
        store_url = f"s3://{bucket}/{prefix}" if prefix else f"s3://{bucket}"
        store = open_store(store_url)
        try:
            found = store.exists(keys.ROOT_MARKER)
        except PermissionDenied:
            found = False        # a policy limited to the store's prefix hides its parents
        if found:
            return filesystem(store_url), "/".join(parts[cut:])
    if not create:
        raise InvalidArgument(f"{url} is not inside an s4fs store")
    prefix = "/".join(parts[:-1])
    store_url = f"s3://{bucket}/{prefix}" if prefix else f"s3://{bucket}"
    return filesystem(store_url), parts[-1]


class _ReadStream(io.RawIOBase):
    def __init__(self, handle, name: str) -> None:
        self._h = handle
        self._pos = 0
        self.name = name

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def readinto(self, b) -> int:
        n = self._h.readinto(self._pos, b)
        self._pos += n
        return n

    def seek(self, offset: int, whence: int = 0) -> int:
        if whence == 0:
            self._pos = offset
        elif whence == 1:
            self._pos += offset
        else:
            self._pos = self._h.size + offset
        if self._pos < 0:
            raise ValueError("negative seek position")
        return self._pos

    def tell(self) -> int:
        return self._pos

    def close(self) -> None:
        self._h.release()
        super().close()


def open(path, mode: str = "rb", *, buffering: int = 4 << 20):  # noqa: A001
    """A read-only, seekable binary file object over a stored file."""
    if mode not in ("rb", "r"):
        raise InvalidArgument("s4fs.open is read-only: use mode 'rb' (write with s4fs.save)")
    fs, rel = resolve(path)
    return io.BufferedReader(_ReadStream(fs.open_read(rel), str(path)), buffering)
