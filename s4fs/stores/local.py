"""LocalStore: a store in a local directory (the default; no cloud needed).

Layout 1 (every store this version creates; the root holds ``.s4fs-layout``). Each key
component is escaped into an on-disk name: ``%`` becomes ``%25``, a leading ``.``
becomes ``%2E``, and the ``.`` of a trailing ``.s4o`` becomes ``%2E`` (an empty last
component is ``%``). A folder is the escaped component; an object is the escaped last
component plus ``.s4o``. So no escaped name starts with ``.``, and no folder ends in
``.s4o``: users cannot reach the names that start with ``.``, which are the store's own —
``.tmp-*`` (a put in flight), ``.s4fs-layout``, and, for a component whose escaped name
would pass NAME_MAX (255 bytes), ``.L<sha256>.s4o`` (object) or ``.D<sha256>`` (folder).
An object with such a hashed name in its path starts with a header holding its key
(``S4FSKEY1``, 4-byte big-endian length, the key's bytes), so ``list`` gives back exact
keys. Most keys (``files/run/ckpt.pt``) map to ``<root>/<key>.s4o``, as before.

Layout 0 (legacy): a root without ``.s4fs-layout`` that has an object file (``*.s4o``)
at its top level (every s4fs store has ``s4fs-store.json.s4o``) was written before
layout 1; it keeps the identity mapping ``<key>.s4o`` (where ``.tmp-*`` objects are
hidden and a folder can collide with ``<name>.s4o``). A put writes ``.s4fs-layout``
before its object, and nothing but a put writes, so probing a folder leaves it as it was.

Puts write a temporary file, fsync it, and rename it into place, so readers never see a
partial object. Deletes prune the folders they leave empty.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import json
import os
import re
import struct
import tempfile
import threading
from pathlib import Path
from typing import Iterator

from s4fs.errors import NotFound, PermissionDenied, S4Error, StoreError

from s4fs.atomic import replace_from_temp

from .base import (
    NAME_MAX,
    NameTooLong,
    ObjectInfo,
    ObjectWriter,
    Store,
    check_key,
    check_name_lengths,
    name_bytes,
)

SUFFIX = ".s4o"
TMP_PREFIX = ".tmp-"
LAYOUT_MARKER = ".s4fs-layout"
# flocked by every put and delete (shared) and by ``replace`` (exclusive): one open file
# description per call, so threads of one process exclude each other too
WRITE_LOCK = ".s4fs-lock"
LAYOUT_VERSION = 1
LONG_OBJECT = ".L"
LONG_FOLDER = ".D"
KEY_MAGIC = b"S4FSKEY1"

_UNESCAPE = re.compile(r"%(25|2E)")


def escape(name: str) -> str:
    """The on-disk form of one key component (before the object suffix)."""
    if not name:
        return "%"
    out = name.replace("%", "%25")
    if out.startswith("."):
        out = "%2E" + out[1:]
    if out.endswith(SUFFIX):
        out = out[: -len(SUFFIX)] + "%2E" + SUFFIX[1:]
    return out


def unescape(disk: str) -> str | None:
    """The component ``disk`` is the escaped form of; None when ``disk`` is not one."""
    if disk == "%":
        return ""
    name = _UNESCAPE.sub(lambda m: "%" if m.group(1) == "25" else ".", disk)
    return name if name and escape(name) == disk else None


def _hashed(prefix: str, name: str) -> str:
    return prefix + hashlib.sha256(name_bytes(name)).hexdigest()


def _header(key: str) -> bytes:
    raw = name_bytes(key)
    return KEY_MAGIC + struct.pack(">I", len(raw)) + raw


def _read_key(f) -> tuple[str, int] | None:
    """(key, header length) from an object file with a key header; None if damaged."""
    head = f.read(len(KEY_MAGIC) + 4)
    if len(head) < len(KEY_MAGIC) + 4 or not head.startswith(KEY_MAGIC):
        return None
    (n,) = struct.unpack(">I", head[len(KEY_MAGIC):])
    raw = f.read(n)
    if len(raw) != n:
        return None
    return os.fsdecode(raw), len(head) + n


def _temp_beside(path: str) -> tuple[int, str]:
    """A new temporary file in ``path``'s folder (made if missing): (fd, its name)."""
    folder = os.path.dirname(path)
    for attempt in range(5):
        try:
            os.makedirs(folder, exist_ok=True)
            return tempfile.mkstemp(dir=folder, prefix=TMP_PREFIX, suffix=".part")
        except (FileNotFoundError, FileExistsError):
            # a delete pruned the folder meanwhile (makedirs saw it exist, then found
            # no folder there: FileExistsError); make it again
            if attempt == 4:
                raise
    raise AssertionError("unreachable")


class _LocalWriter(ObjectWriter):
    """A LocalStore object written ahead: each :meth:`write` lands in a temporary file
    beside the object and is synced to the disk there (in the caller's thread, a pack
    upload thread), so that :meth:`commit` only syncs the last piece and renames the
    file into place."""

    def __init__(self, store: "LocalStore", key: str) -> None:
        super().__init__(store, key)
        self._fd: int | None = None
        self._tmp = self._path = ""

    def _open(self) -> None:
        store = self.store
        rel, hashed = store._locate(self.key)
        if store._layout_version() >= 1:
            store._mark()
        self._path = str(store.root / rel)
        self._fd, self._tmp = _temp_beside(self._path)
        if hashed:
            _write_all(self._fd, _header(self.key))

    def write(self, parts: list) -> None:
        try:
            if self._fd is None:
                self._open()
            for p in parts:
                _write_all(self._fd, p)
            os.fdatasync(self._fd)
        except OSError as exc:
            self.abort()
            raise self.store._error("write", self.key, exc) from None

    def commit(self) -> None:
        try:
            if self._fd is None:
                self._open()
            os.fsync(self._fd)
            with self.store._writing(fcntl.LOCK_SH):
                os.replace(self._tmp, self._path)
            os.close(self._fd)
            self._fd = None
        except OSError as exc:
            self.abort()
            raise self.store._error("write", self.key, exc) from None

    def abort(self) -> None:
        fd, self._fd = self._fd, None
        if fd is not None:
            os.close(fd)
            try:
                os.unlink(self._tmp)
            except OSError:
                pass


def _write_all(fd: int, data) -> None:
    view = memoryview(data).cast("B")
    while view:
        view = view[os.write(fd, view):]


class LocalStore(Store):
    def __init__(self, root: str | os.PathLike) -> None:
        self.root = Path(root).resolve()
        self.root.mkdir(parents=True, exist_ok=True)
        self.url = self.root.as_uri()
        self._lock = threading.Lock()
        self._layout: int | None = None       # found on first use (see _layout_version)
        self._marked = False                   # .s4fs-layout known to be on disk

    def __reduce__(self):
        # worker processes (s4fs.coding) get the store by pickle: its root is enough
        return (LocalStore, (str(self.root),))

    # --- layout ----------------------------------------------------------------------

    def _layout_version(self) -> int:
        if self._layout is None:
            with self._lock:
                if self._layout is None:
                    self._layout = self._detect_layout()
        return self._layout

    def _detect_layout(self) -> int:
        try:
            with open(self.root / LAYOUT_MARKER, "rb") as f:
                doc = json.loads(f.read())
            version = int(doc["version"])
        except FileNotFoundError:
            pass
        except (ValueError, KeyError, TypeError):
            raise StoreError(f"{self.url}/{LAYOUT_MARKER} is damaged; it should hold "
                             f'{{"version": {LAYOUT_VERSION}}}') from None
        else:
            if version < 1:                # layout 0 never has a marker: a damaged one
                raise StoreError(f"{self.url}/{LAYOUT_MARKER} is damaged (version "
                                 f"{version}); it should hold "
                                 f'{{"version": {LAYOUT_VERSION}}}') from None
            if version > LAYOUT_VERSION:
                raise StoreError(f"{self.url} was written with LocalStore layout "
                                 f"{version}; this s4fs reads layouts up to "
                                 f"{LAYOUT_VERSION}: upgrade s4fs to read it")
            self._marked = True
            return version
        with os.scandir(self.root) as entries:
            for e in entries:
                if e.name.endswith(SUFFIX) and not e.name.startswith(TMP_PREFIX):
                    return 0              # objects but no marker: written before layout 1
        return LAYOUT_VERSION             # a new store; put writes the marker first

    def _mark(self) -> None:
        """Write ``.s4fs-layout`` before the first object of a layout-1 store."""
        if self._marked:
            return
        doc = json.dumps({"layout": "s4fs LocalStore", "version": LAYOUT_VERSION})
        self._write(str(self.root / LAYOUT_MARKER), [doc.encode() + b"\n"])
        self._marked = True

    # --- key -> file -----------------------------------------------------------------

    def _locate(self, key: str) -> tuple[str, bool]:
        """(file of ``key`` relative to the root, whether it starts with a key header)."""
        check_name_lengths(check_key(key))
        *folders, leaf = key.split("/")
        parts, hashed = [], False
        for c in folders:
            d = escape(c)
            if len(name_bytes(d)) > NAME_MAX:
                d, hashed = _hashed(LONG_FOLDER, c), True
            parts.append(d)
        f = escape(leaf) + SUFFIX
        if len(name_bytes(f)) > NAME_MAX:
            f, hashed = _hashed(LONG_OBJECT, leaf) + SUFFIX, True
        parts.append(f)
        rel = "/".join(parts)
        if rel == key + SUFFIX or self._layout_version() >= 1:
            return rel, hashed            # (the same file in both layouts: no detection)
        return key + SUFFIX, False

    def _open_object(self, key: str, rel: str, hashed: bool, what: str):
        """(``rel`` opened at the object's first byte, length of its key header)."""
        f = open(self.root / rel, "rb")
        if not hashed:
            return f, 0
        try:
            found = _read_key(f)
        except BaseException:
            f.close()
            raise
        if found is None or found[0] != key:
            f.close()
            if found is None:
                raise StoreError(f"cannot {what} {key!r} in {self.url}: {rel} is damaged "
                                 f"(its key header is missing); put the object again")
            raise NotFound(f"no object {key!r} in {self.url}")
        return f, found[1]

    def _error(self, what: str, key: str, exc: OSError) -> S4Error:
        msg = f"cannot {what} {key!r} in {self.url}: {exc}"
        if isinstance(exc, PermissionError):
            return PermissionDenied(msg)
        if exc.errno == errno.ENAMETOOLONG:
            return NameTooLong(msg + " (the whole path passes PATH_MAX; use shorter "
                                     "names or fewer folders)")
        return StoreError(msg)

    # --- the Store contract ----------------------------------------------------------

    def get(self, key, start=None, end=None) -> bytes:
        with self._reading(key) as (f, skip):
            if start or skip:
                f.seek(skip + (start or 0))
            if end is None:
                return f.read()
            return f.read(max(0, end - (start or 0)))

    def get_into(self, key, start: int, end: int, out) -> int:
        mv = memoryview(out).cast("B")[: max(0, end - start)]
        with self._reading(key) as (f, skip):
            fd, got = f.fileno(), 0
            while got < len(mv):
                n = os.preadv(fd, [mv[got:]], skip + start + got)
                if n <= 0:
                    break
                got += n
            return got

    @contextlib.contextmanager
    def _reading(self, key):
        """The object's open file and where its bytes start, with read errors mapped."""
        try:
            f, skip = self._open_object(key, *self._locate(key), "read")
            with f:
                yield f, skip
        except S4Error:
            raise
        except (FileNotFoundError, NotADirectoryError):
            raise NotFound(f"no object {key!r} in {self.url}") from None
        except OSError as exc:
            raise self._error("read", key, exc) from None

    def head(self, key) -> ObjectInfo:
        try:
            rel, hashed = self._locate(key)
            if hashed:
                f, skip = self._open_object(key, rel, hashed, "stat")
                with f:
                    st = os.fstat(f.fileno())
            else:
                st, skip = os.stat(self.root / rel), 0
        except S4Error:
            raise
        except (FileNotFoundError, NotADirectoryError):
            raise NotFound(f"no object {key!r} in {self.url}") from None
        except OSError as exc:
            raise self._error("stat", key, exc) from None
        return ObjectInfo(key, st.st_size - skip, st.st_mtime)

    @contextlib.contextmanager
    def _writing(self, how: int):
        fd = os.open(self.root / WRITE_LOCK, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            fcntl.flock(fd, how)
            yield
        finally:
            os.close(fd)                      # drops the lock

    def put(self, key, data) -> None:
        self.put_parts(key, [data])

    def writer(self, key) -> ObjectWriter:
        if getattr(self.put_parts, "__func__", None) is not LocalStore.put_parts:
            # put_parts replaced (a subclass's, or a test's on this store): objects
            # land through it, at the commit
            return ObjectWriter(self, key)
        return _LocalWriter(self, key)

    def replace(self, key, data, expected: bytes) -> bool:
        try:
            with self._writing(fcntl.LOCK_EX):
                try:
                    if self.get(key) != expected:
                        return False
                except NotFound:
                    return False
                self._put_parts(key, [data])
                return True
        except S4Error:
            raise
        except OSError as exc:
            raise self._error("write", key, exc) from None

    def put_parts(self, key, parts) -> None:
        try:
            with self._writing(fcntl.LOCK_SH):
                self._put_parts(key, parts)
        except S4Error:
            raise
        except OSError as exc:
            raise self._error("write", key, exc) from None

    def _put_parts(self, key, parts) -> None:
        try:
            rel, hashed = self._locate(key)
            if self._layout_version() >= 1:
                self._mark()
            self._write(str(self.root / rel), parts, _header(key) if hashed else b"")
        except S4Error:
            raise
        except OSError as exc:
            raise self._error("write", key, exc) from None

    def _write(self, path: str, parts: list, header: bytes = b"") -> None:
        fd, tmp = _temp_beside(path)
        replace_from_temp(fd, tmp, path, header, *parts)

    def delete(self, key) -> None:
        try:
            rel, _ = self._locate(key)
            path = self.root / rel
            with self._writing(fcntl.LOCK_SH):
                path.unlink()
        except S4Error:
            raise
        except (FileNotFoundError, NotADirectoryError):
            return
        except OSError as exc:
            raise self._error("delete", key, exc) from None
        # prune empty parent folders so listings stay cheap
        parent = path.parent
        while parent != self.root:
            try:
                parent.rmdir()
            except OSError:
                break
            parent = parent.parent

    def list(self, prefix: str = "") -> Iterator[ObjectInfo]:
        try:
            return iter(self._list(prefix))
        except S4Error:
            raise
        except OSError as exc:
            raise self._error("list", prefix, exc) from None

    def _list(self, prefix: str) -> list[ObjectInfo]:
        # walk only the folder that can hold the prefix
        legacy = self._layout_version() == 0
        rel = prefix.rsplit("/", 1)[0] + "/" if "/" in prefix else ""
        start, hashed = self.root, False
        for c in rel.split("/")[:-1]:
            if c in ("", ".", "..") or len(name_bytes(c)) > NAME_MAX:
                return []                 # no key can be under such a folder
            d = c if legacy else escape(c)
            if len(name_bytes(d)) > NAME_MAX:
                d, hashed = _hashed(LONG_FOLDER, c), True
            start = start / d
        found: list[ObjectInfo] = []
        # (folder, its key prefix or None below a hashed folder, objects carry headers)
        todo = [(str(start), rel, hashed)]
        while todo:
            folder, rel, hashed = todo.pop()
            try:
                with os.scandir(folder) as it:
                    entries = list(it)
            except (FileNotFoundError, NotADirectoryError):
                continue
            for e in entries:
                if e.is_dir(follow_symlinks=False):
                    sub = self._sub_folder(e.name, rel, prefix, legacy)
                    if sub is not False:
                        todo.append((e.path, sub, hashed or sub is None))
                    continue
                info = self._object(e, rel, hashed, legacy)
                if info is not None and info.key.startswith(prefix):
                    found.append(info)
        found.sort(key=lambda o: o.key)
        return found

    @staticmethod
    def _sub_folder(name: str, rel: str | None, prefix: str, legacy: bool):
        """Key prefix of sub-folder ``name`` (None: unknown, hashed), or False: skip it."""
        if legacy:
            c = name
        elif name.startswith(LONG_FOLDER):
            return None
        else:
            c = unescape(name)
            if not c:                     # not a folder name this store writes
                return False
        if rel is None:
            return None
        sub = rel + c + "/"
        return sub if sub.startswith(prefix) or prefix.startswith(sub) else False

    @staticmethod
    def _object(e: os.DirEntry, rel: str | None, hashed: bool,
                legacy: bool) -> ObjectInfo | None:
        name = e.name
        if not name.endswith(SUFFIX) or name.startswith(TMP_PREFIX):
            return None
        leaf = name[: -len(SUFFIX)] if legacy else unescape(name[: -len(SUFFIX)])
        if not legacy and name.startswith(LONG_OBJECT):
            hashed = True
        elif leaf is None:
            return None                   # not a name this store writes
        try:
            if not hashed:
                st = e.stat()
                return ObjectInfo(rel + leaf, st.st_size, st.st_mtime)
            with open(e.path, "rb") as f:
                found = _read_key(f)
                st = os.fstat(f.fileno())
        except FileNotFoundError:         # deleted while we listed
            return None
        if found is None:
            return None
        return ObjectInfo(found[0], st.st_size - found[1], st.st_mtime)
