"""The Store contract: a flat key → bytes object store.

Keys are ``/``-separated strings of printable characters with no empty, ``.`` or ``..``
components and no leading ``/``. A store holds immutable objects; ``put`` replaces an
object atomically (a reader sees the old bytes or the new ones, never a mix).

Missing keys: ``get`` and ``head`` raise :class:`s4fs.errors.NotFound`; ``delete`` of a
missing key is not an error (deletes are idempotent); ``list`` of a prefix with nothing
under it yields nothing.

Too long keys: a store may refuse a key with a component longer than it can hold with
:class:`NameTooLong` (errno ``ENAMETOOLONG``); ``LocalStore`` holds components of up to
``NAME_MAX`` (255) bytes, like the local file systems it lives on.

Every other failure is raised as an :class:`s4fs.errors.S4Error` subclass, translated at
the store's edge (``StoreError``, ``StoreUnavailable``, ``Busy``, ``PermissionDenied``).
Stores are safe to call from several threads at once.
"""

from __future__ import annotations

import os
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Iterator

from s4fs.errors import InvalidArgument, NameTooLong  # noqa: F401  (re-exported)

#: the longest component, in bytes of the file system encoding, a LocalStore can hold
NAME_MAX = 255


@dataclass(frozen=True)
class ObjectInfo:
    key: str
    size: int
    mtime: float          # seconds since the epoch of the last put


class Store(ABC):
    """Small ABC every backend implements (see the module docstring for the contract)."""

    #: a URL that names this store (``file:///...``, ``s3://bucket/prefix``)
    url: str

    @abstractmethod
    def get(self, key: str, start: int | None = None, end: int | None = None) -> bytes:
        """Bytes of ``key``; with ``start``/``end`` the half-open range [start, end)
        (clipped at the object's end). Raises NotFound when the key is missing."""

    def get_into(self, key: str, start: int, end: int, out) -> int:
        """Read [start, end) of ``key`` into the writable buffer ``out`` (at least
        ``end - start`` bytes); returns the bytes read (fewer at the object's end). A
        store that can read in place (a local file) overrides this."""
        data = self.get(key, start, end)
        memoryview(out).cast("B")[: len(data)] = data
        return len(data)

    @abstractmethod
    def put(self, key: str, data) -> None:
        """Store ``data`` (bytes-like) under ``key`` atomically, replacing any object."""

    def put_parts(self, key: str, parts: list) -> None:
        """Store the concatenation of ``parts`` (bytes-likes) under ``key``, as
        :meth:`put`; a store that can write the pieces without joining them first
        overrides this (a pack is many coded chunks)."""
        self.put(key, b"".join(parts))

    def writer(self, key: str) -> "ObjectWriter":
        """An object stored piece by piece as its bytes come (a pack as its chunks are
        coded), so that little is left to write when it is complete. The default
        collects the pieces and stores them with :meth:`put_parts` at
        :meth:`ObjectWriter.commit`; a store that can write ahead overrides it."""
        return ObjectWriter(self, key)

    def replace(self, key: str, data, expected: bytes) -> bool:
        """Store ``data`` under ``key`` only while the object there holds exactly
        ``expected``, atomically against every other ``put`` and ``replace``: True when
        written, False when the object changed or is gone (then nothing is written). A
        rewrite of a committed manifest (s4fs.write.backward) must never undo a newer
        commit of the same file. A store that cannot promise it raises
        NotImplementedError."""
        raise NotImplementedError(f"{type(self).__name__} cannot replace an object only "
                                  f"while it is unchanged")

    @abstractmethod
    def delete(self, key: str) -> None:
        """Remove ``key``; a missing key is not an error."""

    @abstractmethod
    def list(self, prefix: str = "") -> Iterator[ObjectInfo]:
        """Every object whose key starts with ``prefix``, in key order."""

    @abstractmethod
    def head(self, key: str) -> ObjectInfo:
        """Size and mtime of ``key``; raises NotFound when missing."""

    def exists(self, key: str) -> bool:
        from s4fs.errors import NotFound
        try:
            self.head(key)
            return True
        except NotFound:
            return False

    def close(self) -> None:
        """Release connections and threads (optional)."""


class ObjectWriter:
    """One object being written: :meth:`write` appends pieces (bytes-likes, which the
    caller leaves unchanged until :meth:`commit` or :meth:`abort` returns); nothing is
    under the key until :meth:`commit` returns, and then the whole object is, atomically
    (as :meth:`Store.put`); :meth:`abort` (or a failed commit) leaves nothing behind.
    Calls come from one thread at a time, in order."""

    def __init__(self, store: Store, key: str) -> None:
        self.store, self.key = store, key
        self._parts: list = []

    def write(self, parts: list) -> None:
        self._parts.extend(parts)

    def commit(self) -> None:
        parts, self._parts = self._parts, []
        self.store.put_parts(self.key, parts)

    def abort(self) -> None:
        self._parts = []


def check_key(key: str) -> str:
    if not isinstance(key, str) or not key or key.startswith("/") or "\x00" in key:
        raise InvalidArgument(f"invalid store key {key!r}")
    parts = key.split("/")
    if any(p in ("", ".", "..") for p in parts[:-1]) or parts[-1] in (".", ".."):
        raise InvalidArgument(f"invalid store key {key!r}: empty, '.' or '..' component")
    return key


def name_bytes(name: str) -> bytes:
    """``name`` as the bytes a local file system stores (UTF-8; the undecodable bytes a
    FUSE name carried come back as they were, via ``surrogateescape``)."""
    try:
        return os.fsencode(name)
    except UnicodeEncodeError:
        raise InvalidArgument(f"store key component {name!r} is not valid Unicode "
                              f"(it has a lone surrogate)") from None


def check_name_lengths(key: str, name_max: int = NAME_MAX) -> str:
    """``key`` when every ``/``-separated component fits in ``name_max`` bytes;
    :class:`NameTooLong` otherwise (what a user sees for a name past NAME_MAX)."""
    for part in key.split("/"):
        n = len(name_bytes(part))
        if n > name_max:
            raise NameTooLong(f"name {part[:40]!r}... is {n} bytes long; names (each "
                              f"path component) may be at most {name_max} bytes: use a "
                              f"shorter name")
    return key
