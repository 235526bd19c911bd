"""LocalStore: a store in a local directory (the default; no cloud needed).

Each object is a file ``<root>/<key>.s4o``; the suffix keeps ``a`` and ``a/b`` from
colliding (an object and a "directory" of the same name). Puts write a temporary file,
fsync it, and rename it into place, so readers never see a partial object.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Iterator

from s4fs.errors import NotFound, PermissionDenied, StoreError

from .base import ObjectInfo, Store, check_key

SUFFIX = ".s4o"


class LocalStore(Store):
    def __init__(self, root: str | os.PathLike) -> None:
        self.root = Path(root).resolve()
        self.root.mkdir(parents=True, exist_ok=True)
        self.url = self.root.as_uri()

    def _path(self, key: str) -> Path:
        return self.root / (check_key(key) + SUFFIX)

    def get(self, key, start=None, end=None) -> bytes:
        path = self._path(key)
        try:
            with open(path, "rb") as f:
                if start:
                    f.seek(start)
                if end is None:
                    return f.read()
                return f.read(max(0, end - (start or 0)))
        except (FileNotFoundError, NotADirectoryError):
            raise NotFound(f"no object {key!r} in {self.url}") from None
        except PermissionError as exc:
            raise PermissionDenied(f"cannot read {key!r} in {self.url}: {exc}") from None
        except OSError as exc:
            raise StoreError(f"cannot read {key!r} in {self.url}: {exc}") from None

    def put(self, key, data) -> None:
        path = self._path(key)
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-", suffix=".part")
            try:
                with os.fdopen(fd, "wb") as f:
                    f.write(data)
                    f.flush()
                    os.fsync(f.fileno())
                os.replace(tmp, path)
            except BaseException:
                try:
                    os.unlink(tmp)
                except OSError:
                    pass
                raise
        except PermissionError as exc:
            raise PermissionDenied(f"cannot write {key!r} in {self.url}: {exc}") from None
        except OSError as exc:
            raise StoreError(f"cannot write {key!r} in {self.url}: {exc}") from None

    def delete(self, key) -> None:
        path = self._path(key)
        try:
            path.unlink()
        except (FileNotFoundError, NotADirectoryError):
            return
        except OSError as exc:
            raise StoreError(f"cannot delete {key!r} in {self.url}: {exc}") from None
        # prune empty parent folders so listings stay cheap
        parent = path.parent
        while parent != self.root:
            try:
                parent.rmdir()
            except OSError:
                break
            parent = parent.parent

    def head(self, key) -> ObjectInfo:
        try:
            st = self._path(key).stat()
        except (FileNotFoundError, NotADirectoryError):
            raise NotFound(f"no object {key!r} in {self.url}") from None
        except OSError as exc:
            raise StoreError(f"cannot stat {key!r} in {self.url}: {exc}") from None
        return ObjectInfo(key, st.st_size, st.st_mtime)

    def list(self, prefix: str = "") -> Iterator[ObjectInfo]:
        # walk only the folder that can hold the prefix
        folder = self.root / prefix.rsplit("/", 1)[0] if "/" in prefix else self.root
        if not folder.is_dir():
            return iter(())
        found = []
        for dirpath, dirnames, filenames in os.walk(folder):
            rel = os.path.relpath(dirpath, self.root)
            rel = "" if rel == "." else rel.replace(os.sep, "/") + "/"
            dirnames[:] = [d for d in dirnames
                           if (rel + d + "/").startswith(prefix) or prefix.startswith(rel + d + "/")]
            for name in filenames:
                if not name.endswith(SUFFIX) or name.startswith(".tmp-"):
                    continue
                key = rel + name[: -len(SUFFIX)]
                if key.startswith(prefix):
                    try:
                        st = os.stat(os.path.join(dirpath, name))
                    except FileNotFoundError:
                        continue
                    found.append(ObjectInfo(key, st.st_size, st.st_mtime))
        found.sort(key=lambda o: o.key)
        return iter(found)
