"""Where things live inside a store (one s4fs namespace per store root).

* ``s4fs-store.json`` — marks a store root (format version).
* ``files/<path>``    — the manifest of each file; listing a prefix is ``ls``.
* ``dirs/<path>``     — a marker for each directory made with mkdir (or by a save).
* ``packs/<id>``      — packs of compressed chunks, written once, never changed;
                        reclaimed by the garbage collector only.
* ``pins/<id>``       — a copy of the manifest of a file that was unlinked or renamed
                        over while a mount still had it open: its packs stay live for
                        the garbage collector until the mount removes the pin (at the
                        last close), or for ``PIN_DAYS`` if that mount died.
"""

from __future__ import annotations

import posixpath
import uuid

from s4fs.errors import InvalidArgument, NameTooLong

NAME_MAX = 255          # bytes per name, as on a local disk, whatever the store

ROOT_MARKER = "s4fs-store.json"
FILES = "files/"
DIRS = "dirs/"
PACKS = "packs/"
PINS = "pins/"
LINKS = "links/"        # symbolic links: one small sealed object each (s4fs.sealed)
PIN_DAYS = 7            # a pin older than this (its mount died) no longer keeps packs


def norm(path: str) -> str:
    """Normalise a path inside the namespace: ``"a/b"``, root is ``""``."""
    if "\x00" in path:
        raise InvalidArgument("path contains a NUL byte")
    p = posixpath.normpath("/" + path).lstrip("/")
    if p in (".", ""):
        return ""
    parts = p.split("/")
    if any(part == ".." for part in parts):
        raise InvalidArgument(f"path {path!r} leaves the store")
    for part in parts:
        if len(part.encode("utf-8", "surrogateescape")) > NAME_MAX:
            raise NameTooLong(f"the name {part[:40]!r}... is longer than {NAME_MAX} bytes; "
                              f"use a shorter name")
    return p


def file_key(path: str) -> str:
    return FILES + path


def dir_key(path: str) -> str:
    return DIRS + path


def link_key(path: str) -> str:
    return LINKS + path


def new_pack_key() -> str:
    return PACKS + uuid.uuid4().hex


def new_pin_key() -> str:
    return PINS + uuid.uuid4().hex


def parent(path: str) -> str:
    return posixpath.dirname(path)


def basename(path: str) -> str:
    return posixpath.basename(path)
