"""Symbolic links in the store: one small sealed object each, ``links/<path>``
(:func:`s4fs.sealed.link_object`), holding the target as given and the link's times and
owner. Any mount of the store sees them; nothing is resolved here (the kernel follows a
link a training script opens, and the Python API refuses to write through one)."""

from __future__ import annotations

import time

from s4fs import keys, sealed
from s4fs.errors import NotFound
from s4fs.stores import Store

__all__ = ["Links"]


class Links:
    """The symbolic links of ``store``."""

    def __init__(self, store: Store) -> None:
        self.store = store

    def get(self, path: str) -> tuple[bytes, dict] | None:
        """``(target, attributes)`` of the link at ``path``, or None."""
        try:
            data = self.store.get(keys.link_key(path))
        except NotFound:
            return None
        return sealed.read_link(data, f"symbolic link {path!r} (object "
                                      f"{keys.link_key(path)!r} in {self.store.url})")

    def make(self, path: str, target: bytes, owner: tuple[int, int] | None) -> None:
        """A new link (the caller checked the names)."""
        uid, gid = owner or (None, None)
        self.store.put(keys.link_key(path), sealed.link_object(
            target, mtime_ns=time.time_ns(), uid=uid, gid=gid))

    def set_attrs(self, path: str, owner: tuple | None, *, mtime_ns: int | None,
                  atime_ns: int | None) -> None:
        """lchown / utime of a link (its mode is always 0777)."""
        link = self.get(path)
        if link is None:
            raise NotFound(f"no symbolic link {path!r}")
        target, rec = link
        uid, gid = owner or (rec.get("uid"), rec.get("gid"))
        self.store.put(keys.link_key(path), sealed.link_object(
            target, uid=uid, gid=gid, ctime_ns=time.time_ns(),
            mtime_ns=rec.get("mtime_ns") if mtime_ns is None else mtime_ns,
            atime_ns=rec.get("atime_ns") if atime_ns is None else atime_ns))

    def move(self, old: str, new: str) -> None:
        """rename of a link (over whatever link was at ``new``)."""
        self.store.put(keys.link_key(new), self.store.get(keys.link_key(old)))
        self.store.delete(keys.link_key(old))

    def delete(self, path: str) -> None:
        self.store.delete(keys.link_key(path))
