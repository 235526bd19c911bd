"""A checksummed envelope for small metadata objects (manifests, directory and store markers).

Every stored object that decides what a read returns must be refused when it is damaged,
never trusted: a chunk carries its own checksum (``s4fs.codec``), and the small objects
around chunks are *sealed* with this envelope. Layout (integers little endian)::

    0     4  magic b"S4SL"
    4     1  envelope major (a reader refuses a newer major: "upgrade s4fs")
    5     1  envelope minor (additions an older reader may ignore; none yet)
    6     1  k = length of the kind tag, 1..64
    7     k  kind tag, ASCII: "manifest", "dir", "store"
    7+k   8  n = payload length
    15+k 16  xxh3-128 of every other byte of the object — bytes [0, 15+k), then the
             payload — as ``xxhash.xxh3_128(...).digest()`` (canonical, big endian)
    31+k  n  payload

The object is exactly ``31 + k + n`` bytes: a shorter one is truncated, a longer one has
trailing bytes, and both are corrupt. The checksum covers the header too, so flipping any
single bit of a sealed object is detected (a flip of the major byte itself reads as
"written by a newer s4fs", still an error). A sealed object names its kind, so a marker
put where a manifest belongs is refused as well.

Every failure raises :class:`~s4fs.errors.CorruptManifest` (errno ``EIO``) with a
message that names the object and says what to do.
"""

from __future__ import annotations

import json
import os
import struct

import xxhash

from s4fs.errors import CorruptManifest

MAGIC = b"S4SL"
MAJOR = 1
MINOR = 0
MAX_KIND = 64

KIND_MANIFEST = "manifest"
KIND_DIR = "dir"
KIND_LINK = "link"
KIND_STORE = "store"

STORE_FORMAT = "s4fs-store"

_LEN = struct.Struct("<Q")
_SUM = 16                                   # bytes of the xxh3-128 digest
_REMEDY = ("the stored object was changed or damaged after s4fs wrote it; restore it from "
           "a copy of the store (bucket versioning or a replica), or delete it and write "
           "the data again")


def is_sealed(data: bytes) -> bool:
    """Whether ``data`` claims to be a sealed object (starts with the magic)."""
    return bytes(data[:4]) == MAGIC


def seal(kind: str, payload: bytes) -> bytes:
    """Wrap ``payload`` in the envelope, tagged ``kind``."""
    tag = kind.encode("ascii")
    if not 1 <= len(tag) <= MAX_KIND:
        raise ValueError(f"kind tag must be 1..{MAX_KIND} ASCII characters: {kind!r}")
    payload = bytes(payload)
    head = MAGIC + bytes((MAJOR, MINOR, len(tag))) + tag + _LEN.pack(len(payload))
    return head + _digest(head, payload) + payload


def unseal(data: bytes, *, kind: str, where: str) -> bytes:
    """The payload of a sealed object of ``kind``, after checking its checksum.

    ``where`` names the object in error messages ("manifest of 'run/ckpt_1.pt'").
    """
    data = bytes(data)
    if len(data) < 7 or not is_sealed(data):
        raise CorruptManifest(f"{where} is not a sealed s4fs object (wrong magic or too "
                              f"short); {_REMEDY}")
    major, k = data[4], data[6]
    if major > MAJOR:
        raise CorruptManifest(
            f"{where} was written by a newer s4fs (envelope version {major}; this s4fs reads "
            f"version {MAJOR}): upgrade s4fs. If no newer s4fs writes to this store, the "
            f"object is corrupt: {_REMEDY}")
    if major < 1 or not 1 <= k <= MAX_KIND:
        raise CorruptManifest(f"{where} has a corrupt header; {_REMEDY}")
    body = 7 + k + _LEN.size + _SUM
    if len(data) < body:
        raise CorruptManifest(f"{where} is truncated ({len(data)} bytes, the header alone "
                              f"needs {body}); {_REMEDY}")
    (n,) = _LEN.unpack_from(data, 7 + k)
    if len(data) != body + n:
        what = "truncated" if len(data) < body + n else "followed by trailing bytes"
        raise CorruptManifest(f"{where} is {what} ({len(data)} bytes, the header says "
                              f"{body + n}); {_REMEDY}")
    head, digest, payload = data[: 7 + k + _LEN.size], data[7 + k + _LEN.size: body], data[body:]
    if _digest(head, payload) != digest:
        raise CorruptManifest(f"{where} is corrupt (checksum mismatch); {_REMEDY}")
    got = data[7: 7 + k].decode("ascii", "replace")
    if got != kind:
        raise CorruptManifest(f"{where} holds a sealed {got!r} object where a {kind!r} "
                              f"belongs; {_REMEDY}")
    return payload


def _digest(head: bytes, payload: bytes) -> bytes:
    h = xxhash.xxh3_128(head)
    h.update(payload)
    return h.digest()


# --- directory markers ``dirs/<path>`` -----------------------------------------------

DIR_TIMES = ("mtime_ns", "atime_ns", "ctime_ns")
OWNER = ("mode", "uid", "gid")     # permission bits (no type bits), owner and group
DIR_ATTRS = DIR_TIMES + OWNER
_RANGE = {"mode": (0, 0o7777), "uid": (0, (1 << 32) - 2), "gid": (0, (1 << 32) - 2)}


def dir_marker(**attrs: int | None) -> bytes:
    """The bytes of a directory marker: a sealed ``dir`` object whose payload holds the
    directory's attributes, a JSON object of those given (times ``mtime_ns=``,
    ``atime_ns=``, ``ctime_ns=``: integer nanoseconds since the epoch; ``mode=`` its
    permission bits, ``uid=``, ``gid=``), e.g. ``{"mtime_ns":1764576000123456789}``;
    with none, the payload is empty.

    Every reader accepts any payload whose checksum holds (s4fs before directory times
    wrote empty ones, before owners no owner); :func:`read_dir_marker` takes what it
    knows from it.
    """
    return seal(KIND_DIR, _attrs_json(attrs, DIR_ATTRS, "directory attribute"))


def read_dir_marker(data: bytes, where: str) -> dict[str, int]:
    """The attributes a directory marker records (keys of ``DIR_ATTRS``; none for a
    legacy marker, an empty payload, or a payload this s4fs does not understand), after
    checking it as :func:`check_dir_marker` does."""
    if len(data) == 0:
        return {}
    return _read_attrs(unseal(data, kind=KIND_DIR, where=where), DIR_ATTRS)


def _attrs_json(attrs: dict, known: tuple, what: str) -> bytes:
    unknown = set(attrs) - set(known)
    if unknown:
        raise ValueError(f"not a {what}: {sorted(unknown)}")
    doc = {k: v for k, v in attrs.items() if v is not None}
    return json.dumps(doc, sort_keys=True, separators=(",", ":")).encode() if doc else b""


def _read_attrs(payload: bytes, known: tuple) -> dict:
    """The attributes of ``known`` a JSON payload holds with a type and range they may
    have (what does not fit is left out, as an attribute not recorded)."""
    try:
        doc = json.loads(payload) if payload else {}
    except (ValueError, RecursionError):
        return {}
    if not isinstance(doc, dict):
        return {}
    out = {}
    for k in known:
        lo, hi = _RANGE.get(k, (-(1 << 63), (1 << 63) - 1))
        if type(doc.get(k)) is int and lo <= doc[k] <= hi:
            out[k] = doc[k]
    return out


# --- symbolic links ``links/<path>`` ---------------------------------------------------

def link_object(target: bytes, **attrs: int | None) -> bytes:
    """The bytes of a symbolic link: a sealed ``link`` object whose payload is a JSON
    object of its target (``target``: the bytes as given to ``symlink``, decoded as
    UTF-8 with surrogate escapes) and the attributes given (times, ``uid``, ``gid``;
    a link's mode is always 0777)."""
    doc = json.loads(_attrs_json(attrs, DIR_TIMES + ("uid", "gid"), "link attribute")
                     or b"{}")
    doc["target"] = os.fsdecode(target)
    return seal(KIND_LINK, json.dumps(doc, sort_keys=True, separators=(",", ":")).encode())


def read_link(data: bytes, where: str) -> tuple[bytes, dict[str, int]]:
    """``(target, attributes)`` of a stored symbolic link; CorruptManifest where it is
    damaged or not a link."""
    payload = unseal(data, kind=KIND_LINK, where=where)
    try:
        doc = json.loads(payload)
    except (ValueError, RecursionError):
        doc = None
    if not isinstance(doc, dict) or not isinstance(doc.get("target"), str):
        raise CorruptManifest(f"{where} is no symbolic link s4fs can read; {_REMEDY}")
    return os.fsencode(doc["target"]), _read_attrs(payload, DIR_TIMES + ("uid", "gid"))


def check_dir_marker(data: bytes, where: str) -> None:
    """Accept a directory marker or raise CorruptManifest.

    A legacy marker (an empty object, as every s4fs before sealed markers wrote) is
    accepted: it has no bits to damage. Anything else must be a sealed ``dir`` object.
    """
    if len(data) == 0:
        return
    unseal(data, kind=KIND_DIR, where=where)


# --- the store marker ``s4fs-store.json`` ---------------------------------------------

def store_marker(doc: dict) -> bytes:
    """The bytes of a store marker for ``doc`` (``{"format": "s4fs-store", "version": N}``,
    optionally ``"created_ns"``: when the store was made, integer nanoseconds since the
    epoch — every reader of sealed markers ignores keys it does not know): its JSON,
    sealed as a ``store`` object."""
    if not _store_doc_ok(doc, legacy=False):
        raise ValueError(f"not a store marker document: {doc!r}")
    return seal(KIND_STORE, json.dumps(doc, sort_keys=True, separators=(",", ":")).encode())


def read_store_marker(data: bytes, where: str) -> dict:
    """The document of a store marker; CorruptManifest if it is damaged.

    The caller compares ``doc["version"]`` with the versions it reads.

    A legacy marker — plain JSON, as every s4fs before sealed markers wrote — is accepted
    only if it parses as exactly the document those versions wrote,
    ``{"format": "s4fs-store", "version": 1}`` (any spacing). It carries no checksum, so
    it cannot be fully protected: damage that still leaves exactly that document goes
    unnoticed (harmlessly: the document is the same), and there is no way to tell a
    legacy marker that was damaged into valid JSON of another shape from one written
    that way — both are refused. Rewriting a legacy marker with :func:`store_marker`
    protects it fully.
    """
    data = bytes(data)
    if is_sealed(data):
        payload = unseal(data, kind=KIND_STORE, where=where)
        try:
            doc = json.loads(payload)
        except ValueError:
            raise CorruptManifest(f"{where} holds a checksummed store marker that is not "
                                  f"JSON (written by a faulty s4fs?); {_REMEDY}") from None
        _check_store_doc(doc, where, legacy=False)
        return doc
    try:
        doc = json.loads(data)
    except ValueError:
        raise CorruptManifest(f"{where} is not a valid s4fs store marker (neither sealed nor "
                              f"JSON); {_REMEDY}") from None
    _check_store_doc(doc, where, legacy=True)
    return doc


def _store_doc_ok(doc, *, legacy: bool) -> bool:
    ok = (isinstance(doc, dict) and doc.get("format") == STORE_FORMAT
          and type(doc.get("version")) is int and doc["version"] >= 1)
    if ok and legacy:
        ok = set(doc) == {"format", "version"} and doc["version"] == 1
    return ok


def _check_store_doc(doc, where: str, *, legacy: bool) -> None:
    if not _store_doc_ok(doc, legacy=legacy):
        raise CorruptManifest(f"{where} is not the s4fs store marker expected "
                              f"({'legacy ' if legacy else ''}document {doc!r:.200}); "
                              f"{_REMEDY}")
