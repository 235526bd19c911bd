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
over (``s4fs.coding``'s :func:`missing_packs`), and a base chunk that cannot be read is
not coded against (``readable_base`` there); either is warned about once.

:class:`Sessions` is the write policy a filesystem builds once and hands to its saves:
the ingest of a new version, its base chosen here and read from the base's decoded copy
where there is one.
"""

from __future__ import annotations

import logging
import re
from typing import TYPE_CHECKING, Protocol

from s4fs import keys
from s4fs.coding import missing_packs, note_unreadable_base
from s4fs.manifest import Manifest
from s4fs.write.backward import likely_replaced
from s4fs.write.ingest import IngestSession

if TYPE_CHECKING:
    from s4fs.coding import IngestConfig, Pools
    from s4fs.fsconfig import FsConfig
    from s4fs.chunks import ChunkSource
    from s4fs.read import DecodedCache, PackCache
    from s4fs.stores import Store
    from s4fs.write.committer import Committer

log = logging.getLogger("s4fs.fs")

_DIGITS = re.compile(r"\d+")
MAX_CANDIDATES = 4
BASE_WAIT = 10.0      # seconds a save waits for its likely delta base's pending commit


def shape(name: str) -> str:
    """A name with its numbers blanked: ckpt_100.pt and ckpt_200.pt share a shape."""
    return _DIGITS.sub("#", name)


def _number(name: str) -> tuple:
    return tuple(int(x) for x in _DIGITS.findall(name))


class Namespace(Protocol):
    """What choosing a base reads of the filesystem (s4fs.fs.Filesystem is the one
    implementation): the names in a folder, a file's manifest, the store."""

    store: "Store"

    def listdir(self, path: str) -> list[str]:
        """The names in folder ``path``."""

    def manifest(self, path: str) -> Manifest:
        """The committed version of ``path``."""


class Listing(Namespace, Protocol):
    """What :class:`Sessions` reads of the filesystem besides: a manifest as the store
    holds it now (s4fs.fs.Filesystem)."""

    def current_manifest(self, path: str) -> Manifest | None:
        """The manifest of ``path`` as the store holds it now, or None."""


def _peers(fs: Namespace, folder: str, name: str) -> list[str]:
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


def candidates(fs: Namespace, path: str) -> list[str]:
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


def choose_base(fs: Namespace, path: str, previous: Manifest | None,
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
        why = missing_packs(fs.store, m)
        if why is None:
            return p, m
        note_unreadable_base(f"file {p}", why, key=m.id)
    return None


class Sessions:
    """The ingest of each new version one filesystem saves: its delta base chosen
    (``cfg.delta``), read from its decoded copy where ``decoded`` keeps one, coded as
    ``ingest`` says (with backward deltas: whole), in ``pools``, its packs kept in
    ``pack_cache``. ``committer``: ``--writeback``'s, whose pending commits a save may
    wait for (its likely base)."""

    def __init__(self, ns: Listing, store: "Store", cfg: "FsConfig", ingest: "IngestConfig",
                 *, backward: bool, decoded: "DecodedCache | None",
                 pack_cache: "PackCache | None", source: "ChunkSource", pools: "Pools",
                 committer: "Committer") -> None:
        self._ns, self._store, self._cfg, self._ingest = ns, store, cfg, ingest
        self._backward, self._decoded, self._pack_cache = backward, decoded, pack_cache
        self._source, self._pools, self._committer = source, pools, committer

    def new(self, path: str, previous: Manifest | None,
            spool: str | None = None) -> IngestSession:
        """The ingest of a new version of ``path``; ``spool``: the file it is fed from
        (then the coding may run in worker processes that read it, s4fs.coding)."""
        self._wait_for_base(path)
        base = base_path = None
        if self._cfg.delta:
            chosen = choose_base(self._ns, path, previous)
            if chosen is not None:
                base_path, base = chosen
        base_file = None
        if base is not None and self._decoded is not None:
            base_file = self._decoded.path_of(base.id)
        lanes = likely_replaced(self._ns.current_manifest, base) \
            if self._backward and base_path != path else frozenset()
        pc = self._pack_cache
        return IngestSession(self._store, self._ingest, base=base, base_path=base_path,
                             source=self._source, on_pack=pc.put if pc is not None else None,
                             spool_path=spool, base_file=base_file, label=path,
                             pools=self._pools, lanes=lanes)

    def _wait_for_base(self, path: str) -> None:
        """With writeback, a checkpoint saved while the one before it is still being
        committed waits for that commit (up to BASE_WAIT seconds; then an older base)
        so that it is coded against it: saves that outpace their commits would
        otherwise be coded against older ones."""
        pending = self._committer.pending
        if not (self._cfg.writeback and self._cfg.delta) or \
                not any(w.path != path for w in pending()):
            return
        near = set(candidates(self._ns, path)) - {path}
        if near and not self._committer.wait_for(near, BASE_WAIT):
            log.info("%s: coded against an older base; the commit of %s is still "
                     "pending", path, ", ".join(sorted(
                         w.path for w in pending() if w.path in near)))
