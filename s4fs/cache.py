"""A local cache of recently written packs, so writing a delta never fetches its base
back from a remote store. Bounded in bytes; least recently used packs go first."""

from __future__ import annotations

import os
import threading


class PackCache:
    def __init__(self, folder: str, max_bytes: int) -> None:
        self.folder = folder
        self.max_bytes = max_bytes
        os.makedirs(folder, exist_ok=True)
        self._lock = threading.Lock()
        self._sizes: dict[str, int] = {}
        for name in os.listdir(folder):
            try:
                self._sizes[name] = os.path.getsize(os.path.join(folder, name))
            except OSError:
                pass

    def _file(self, key: str) -> str:
        return os.path.join(self.folder, key.replace("/", "_"))

    def put(self, key: str, data: bytes) -> None:
        if len(data) > self.max_bytes:
            return
        path = self._file(key)
        tmp = path + ".part"
        with open(tmp, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
        with self._lock:
            self._sizes[os.path.basename(path)] = len(data)
            self._evict()

    def _evict(self) -> None:
        total = sum(self._sizes.values())
        if total <= self.max_bytes:
            return
        by_age = sorted(self._sizes, key=lambda n: _atime(os.path.join(self.folder, n)))
        for name in by_age:
            if total <= self.max_bytes:
                break
            total -= self._sizes.pop(name)
            try:
                os.unlink(os.path.join(self.folder, name))
            except OSError:
                pass

    def get(self, key: str, offset: int, length: int) -> bytes | None:
        path = self._file(key)
        try:
            with open(path, "rb") as f:
                os.utime(path)            # mark as recently used
                f.seek(offset)
                data = f.read(length)
        except OSError:
            return None
        return data if len(data) == length else None


def _atime(path: str) -> float:
    try:
        return os.stat(path).st_mtime
    except OSError:
        return 0.0
