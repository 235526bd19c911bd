"""The committed manifests this filesystem has read, each trusted for
``FsConfig.metadata_ttl`` seconds (another mount may commit meanwhile); what this mount
changes itself is known at once. A manifest read again whose stored bytes are unchanged
(same digest) is not parsed again: a save's choice of base reads its folder's versions,
and a parse with its consistency check costs ~17 ms for a 259 MiB checkpoint."""

from __future__ import annotations

import threading
import time

import xxhash

from s4fs import keys
from s4fs.errors import NotFound
from s4fs.manifest import Manifest
from s4fs.stores import Store

__all__ = ["ManifestCache"]


def _digest(data: bytes | None) -> bytes | None:
    return None if data is None else xxhash.xxh3_128_digest(data)


class ManifestCache:
    """Path → (when read, its manifest or None for "no file", the digest of its stored
    bytes when known). Thread-safe; its lock is held only for the map, never across a
    store call."""

    def __init__(self, store: Store, ttl: float) -> None:
        self.store, self.ttl = store, ttl
        self._lock = threading.Lock()
        self._entries: dict[str, tuple[float, Manifest | None, bytes | None]] = {}
        self._gen = 0                       # bumped by every change made on this mount

    def get(self, path: str, *, fresh: bool = False) -> Manifest | None:
        """The committed manifest of ``path`` (normalized, not the root), or None when
        there is none; from the store when ``fresh`` or the cached answer is too old."""
        now = time.monotonic()
        with self._lock:
            hit = self._entries.get(path)
            gen = self._gen
        if hit is not None and not fresh and now - hit[0] < self.ttl:
            return hit[1]
        try:
            data = self.store.get(keys.file_key(path))
        except NotFound:
            m = digest = None
        else:
            digest = _digest(data)
            if hit is not None and hit[1] is not None and hit[2] == digest:
                m = hit[1]                  # the same bytes: the same manifest
            else:
                m = Manifest.from_bytes(data, where=f"manifest of {path!r} (object "
                                        f"{keys.file_key(path)!r} in {self.store.url})")
        with self._lock:
            # a commit/unlink/rename on this mount while we fetched knows better
            if self._gen == gen:
                self._entries[path] = (now, m, digest)
        return m

    def remember(self, path: str, m: Manifest | None, data: bytes | None = None) -> None:
        """This mount made ``m`` (None: removed) the manifest of ``path``; ``data``: the
        bytes it stored, when the caller has them."""
        with self._lock:
            self._gen += 1
            self._entries[path] = (time.monotonic(), m, _digest(data))

    def rewritten(self, path: str, m: Manifest, data: bytes | None = None) -> None:
        """``path``'s manifest was stored anew as ``m`` (its bytes ``data``), the same
        version (same id): a cached copy of that version is replaced, keeping its age."""
        with self._lock:
            hit = self._entries.get(path)
            if hit is not None and hit[1] is not None and hit[1].id == m.id:
                self._entries[path] = (hit[0], m, _digest(data))

    def forget_absent(self, paths: list[str]) -> None:
        """A listing holds ``paths``: forget a cached "no such file" of any of them (a
        file another mount created since), or a stat of the name would hide a file the
        listing shows."""
        with self._lock:
            for p in paths:
                hit = self._entries.get(p)
                if hit is not None and hit[1] is None:
                    del self._entries[p]

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()
