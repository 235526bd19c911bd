"""What is passed to a coding pool and back: small descriptions, never chunk bytes (a
process pool ``pread``s them from the spool file the job names)."""

from __future__ import annotations

from dataclasses import dataclass

from s4fs.coding._config import IngestConfig
from s4fs.errors import CodecError
from s4fs.manifest import ChunkRef


class WorkerDied(CodecError):
    """A coding worker process ended (killed, out of memory) while coding a batch."""


def died(who: str, what: str, doing: str, then: str) -> WorkerDied:
    """The error a save or read gets when ``who`` ended under its batch."""
    return WorkerDied(f"{who} died while {doing} {what} (killed, or out of memory); {then}")


@dataclass(frozen=True)
class Item:
    """One chunk to code: its bytes are ``ranges`` of the spool, concatenated."""
    ranges: tuple[tuple[int, int], ...]   # (offset, length) in the spool file
    dtype: str
    checksum: int                          # what the daemon hashed; the worker checks it
    base: ChunkRef | None = None
    base_range: tuple[int, int] | None = None   # where the base lies in base_file
    # the chunk's pair earlier in the same spool (an fp32 chunk's low-precision copy, or
    # a copy's fp32 master): (its dtype, its ranges in the spool, its ChunkRef); coded
    # on it where that pays (s4fs.write.pairs)
    pair: tuple | None = None


@dataclass(frozen=True)
class Job:
    """A batch to code into one pack."""
    store: bytes                  # the pickled Store (workers keep one per spec)
    spool: str                    # path of the spool file
    pack: str                     # key to store the batch's pack under
    items: tuple[Item, ...]
    base_file: str | None = None  # decoded-cache file of the delta base version
    cfg: IngestConfig = IngestConfig()  # the delta rules (max depth, minimum gain)


@dataclass(frozen=True)
class ItemResult:
    kind: int          # FULL, DELTA (on the item's base) or SAME (the base chunk itself)
    offset: int        # of its blob in the pack (FULL, DELTA)
    stored: int


@dataclass(frozen=True)
class JobResult:
    items: tuple[ItemResult, ...]
    stored: int        # bytes put in the store (0: no pack was written)
    notes: tuple = ()  # (what, why) of delta bases that could not be read (coded full)


@dataclass(frozen=True)
class DecodeJob:
    """Chunks to decode into ``target`` (the decoded-cache copy being filled): each item
    is ``(ref, ((offset in chunk, file offset, length), ...))``. ``staged``: where the
    batch's stored bytes were fetched ahead (``ChunkSource.staged``), or None.
    ``mapped``: the target is written through a shared mapping (``_worker.Copy``; its
    blocks reserved, where ``_worker.mapped_copy`` chose it), else with ``pwrite``."""
    store: bytes
    target: str
    items: tuple
    staged: tuple | None = None
    mapped: bool = False


@dataclass(frozen=True)
class ChunkBatch:
    """Chunks in memory to code in this process (the API's sessions, ``--workers 0``):
    each item ``(data, dtype, base ref | None, where)``, ``where`` the base's (offset,
    length) in the base version's decoded copy, if known, and optionally a fifth,
    ``pair``: ``(its pair's dtype, ref, bytes fn)`` (``s4fs.coding.code_pair``). Its
    result is, per item,
    ``(blob | None, base ref | None, checksum, raw length)``: what
    ``s4fs.write.PackWriter.place`` takes."""
    items: tuple
