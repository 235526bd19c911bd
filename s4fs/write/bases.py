"""Choosing the delta base of a new checkpoint.

A new torch checkpoint is coded against the previous checkpoint it most resembles:

1. the previous version of the same path (a file overwritten in place, ``latest.pt``);
2. the newest file in the same directory whose name has the same shape once digits are
   ignored (``ckpt_100.pt`` → ``ckpt_200.pt``, ``step-9.pt`` → ``step-10.pt``);
3. the same file name in the newest sibling directory of the same shape
   (``checkpoint-500/optimizer.pt`` → ``checkpoint-1000/optimizer.pt``, as Hugging Face
   Trainer and Lightning write them).

Among the candidates (at most a few manifests are read) the one sharing the most tensor
bytes (same record name, dtype and size) wins. The ingest then keeps, per chunk, the
smaller of the chunk's own coding and its XOR with the base chunk; chains are bounded by
``IngestConfig.max_delta_depth``.

A damaged base never stops a save: a base whose packs are not all in the store is passed
over (:func:`missing_packs`), and a base chunk that cannot be read is not coded against
(:func:`readable_base`); either is warned about once.
"""

from __future__ import annotations

import contextlib
import logging
import re
import threading
import time
from concurrent.futures import ThreadPoolExecutor

from s4fs import keys
from s4fs.errors import NotFound, S4Error
from s4fs.manifest import Manifest

_log = logging.getLogger(__name__)

_DIGITS = re.compile(r"\d+")
MAX_CANDIDATES = 4


def shape(name: str) -> str:
    """A name with its numbers blanked: ckpt_100.pt and ckpt_200.pt share a shape."""
    return _DIGITS.sub("#", name)


def _number(name: str) -> tuple:
    return tuple(int(x) for x in _DIGITS.findall(name))


def _peers(fs, folder: str, name: str) -> list[str]:
    """Names in ``folder`` shaped like ``name`` (other than it), closest earlier number
    first, at most MAX_CANDIDATES."""
    try:
        names = fs.listdir(folder)
    except Exception:
        return []
    me = sum(_number(name))
    later = _number(name)
    peers = [n for n in names if n != name and shape(n) == shape(name)]
    peers.sort(key=lambda n: (_number(n) > later, abs(sum(_number(n)) - me)))
    return peers[:MAX_CANDIDATES]


def _join(folder: str, *parts: str) -> str:
    return "/".join(p for p in (folder, *parts) if p)


def candidates(fs, path: str) -> list[str]:
    """Paths that may serve as the base of ``path``, most promising first: same-shaped
    names in its folder, then the same name in same-shaped sibling folders."""
    parent, name = keys.parent(path), keys.basename(path)
    out = [_join(parent, n) for n in _peers(fs, parent, name)]
    if parent:
        grand, dname = keys.parent(parent), keys.basename(parent)
        out += [_join(grand, d, name) for d in _peers(fs, grand, dname)]
    return out


def overlap(a: Manifest, b: Manifest) -> int:
    """Tensor bytes two manifests have in common (same name, dtype and size)."""
    mine = {(s.name, s.dtype, s.length) for s in a.streams if s.kind == "tensor"}
    return sum(s.length for s in b.streams
               if s.kind == "tensor" and (s.name, s.dtype, s.length) in mine)


def choose_base(fs, path: str, previous: Manifest | None,
                template: Manifest | None = None) -> tuple[str, Manifest] | None:
    """(path, manifest) of the base a new version of ``path`` should use, or None.

    ``template`` — when known, the manifest the new file will resemble (e.g. the
    version being overwritten) — breaks ties by tensor overlap; otherwise the first
    usable candidate wins.
    """
    found: list[tuple[str, Manifest]] = []
    if previous is not None and previous.kind != "raw":
        found.append((path, previous))
    for p in candidates(fs, path):
        if len(found) > MAX_CANDIDATES:
            break
        try:
            m = fs.manifest(p)
        except Exception:
            continue
        if m.kind != "raw":
            found.append((p, m))
    if not found:
        return None
    ref = template or found[0][1]
    for p, m in sorted(found, key=lambda pm: (overlap(ref, pm[1]), pm[1].mtime), reverse=True):
        why = missing_packs(fs, m)
        if why is None:
            return p, m
        note_unreadable_base(f"file {p}", why, key=m.id)
    return None


PACKS_SEEN_TTL = 600.0      # seconds a pack seen whole in the store is not looked at again
_seen: dict = {}            # (store url, pack key) -> (size, monotonic time seen)


def saw_pack(store, key: str, size: int) -> None:
    """A pack this process has just written whole (no HEAD needed to use it as a base)."""
    if len(_seen) > 65536:
        _seen.clear()
    _seen[store.url, key] = (size, time.monotonic())


def missing_packs(fs, m: Manifest) -> str | None:
    """None when every pack ``m``'s chunks (their delta chains too) need is in the store
    and long enough; else what is wrong. A new file coded against ``m`` would need those
    packs: its chunks may be ``m``'s own, or deltas on them, and the base's bytes may come
    from a local decoded copy that outlived its packs (deleted by hand or by a lifecycle
    rule). One HEAD per pack, remembered for PACKS_SEEN_TTL."""
    need = m.pack_ends()
    url, now = fs.store.url, time.monotonic()

    def seen_whole(key) -> bool:
        size, when = _seen.get((url, key), (-1, 0.0))
        return size >= need[key] and now - when < PACKS_SEEN_TTL

    todo = [k for k in need if not seen_whole(k)]

    def probe(key):
        try:
            return key, fs.store.head(key).size, None
        except NotFound:
            return key, -1, None
        except (S4Error, OSError) as exc:
            return key, -1, exc

    if todo:
        with ThreadPoolExecutor(min(16, len(todo)), thread_name_prefix="s4fs-base-packs") as ex:
            for key, size, exc in ex.map(probe, todo):
                if exc is not None:
                    return f"its pack {key} could not be looked at: {type(exc).__name__}: {exc}"
                if size < need[key]:
                    return (f"its pack {key} is missing from the store" if size < 0 else
                            f"its pack {key} is shorter ({size} bytes) than its chunks need")
                saw_pack(fs.store, key, size)
    return None


# --------------------------------------------------------------------------- damaged bases

_unreadable: set = set()          # delta bases already warned about
_notes = threading.local()        # a worker's notes for its parent (collecting_notes)


def readable_base(base_bytes, what: str, key: str | None = None):
    """``base_bytes()``, or None when the base (``what``: a chunk's pack, a file whose
    chunks a batch decodes) cannot be had: a pack missing or damaged, planes needing a
    GPU this process lacks, the store failing. What would have been coded against it is
    then coded in full, and :func:`note_unreadable_base` warns (once per ``key``). A
    damaged old checkpoint must not stop the next one from being saved; the old one
    still fails its own reads (never wrong bytes)."""
    try:
        return base_bytes()
    except (S4Error, OSError) as exc:
        note_unreadable_base(what, f"{type(exc).__name__}: {exc}", key=key)
        return None


def note_unreadable_base(what: str, why: str, key: str | None = None) -> None:
    """Warn, once per ``key`` (default: ``what``), that a delta base could not be read;
    inside :func:`collecting_notes` (a worker process), keep the note for the parent."""
    notes = getattr(_notes, "list", None)
    if notes is not None:
        notes.append((what, why))
        return
    key = what if key is None else key
    if key in _unreadable:
        return
    if len(_unreadable) > 4096:
        _unreadable.clear()
    _unreadable.add(key)
    _log.warning(
        "a delta base could not be read (%s: %s); the new file's chunks that would be "
        "coded against it are stored in full instead. The older checkpoint it belongs to "
        "may be damaged: run `s4fs verify` on its folder", what, why)


@contextlib.contextmanager
def collecting_notes():
    """The notes :func:`note_unreadable_base` takes on this thread meanwhile, as a list
    of ``(what, why)`` (a worker process returns them with its result)."""
    _notes.list = []
    try:
        yield _notes.list
    finally:
        _notes.list = None
