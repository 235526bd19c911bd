"""``FsConfig``: the settings of one filesystem (:class:`s4fs.fs.Filesystem`).

Its own module so that the rooms a filesystem drives (the write room's ``Services`` and
``Sessions`` are given it) can name it without importing :mod:`s4fs.fs`;
``from s4fs.fs import FsConfig`` keeps working.
"""

from __future__ import annotations

import os

from dataclasses import dataclass, field

from s4fs.coding import IngestConfig

__all__ = ["FsConfig"]


@dataclass(frozen=True)
class FsConfig:
    ingest: IngestConfig = field(default_factory=IngestConfig)
    cache_dir: str | None = None       # spool files and the pack cache; a temp dir if None
    cache_bytes: int = 256 << 20       # decoded-chunk LRU
    metadata_ttl: float = 1.0          # how long a cached manifest/listing is trusted
    delta: bool = True                 # store checkpoints as deltas of the previous one
    # "backward": the newest checkpoint whole, the one before re-expressed as deltas on it
    # in the background (s4fs.write.backward); "forward": each new checkpoint a delta on
    # the one before, within IngestConfig.max_chain_read (docs/DELTA.md)
    delta_direction: str = "backward"
    pack_cache_bytes: int | None = 8 << 30  # local copies of the newest packs (remote
                                       # stores): at most this, and never more than half
                                       # the cache disk's room; None: auto; 0: off
    pack_cache_dir: str | None = None  # where those live; <cache_dir>/packs if None
    # close() returns once the spool holds every byte; commits run in the background,
    # journalled and replayed after a crash (s4fs.write)
    writeback: bool = False
    # writeback under FUSE passthrough: code a file only once close() accepted it (False:
    # nothing runs beside the save itself) or while the kernel writes it (True: the
    # coding shares the machine with the save). After close is the default: in the
    # training loop docs/BENCHMARKS.md records it blocks the loop less, with the same
    # drain (the coding fits in the gap between checkpoints)
    code_while_written: bool = False
    # a read open of a file with no local copy (a fresh node; s4fs.vfs): "whole" waits,
    # under FUSE passthrough, until it is decoded whole onto local disk, then the kernel
    # reads that copy (without passthrough: as "stream"); "push" returns at once and the
    # daemon pushes its decoded parts into the kernel's page cache as they land (reads
    # ahead of them are requests); "stream" reads it through the daemon as it is
    # decoded. ``s4fs mount`` picks one for the machine (:func:`cold_reads_here`)
    cold_reads: str = "whole"
    # whole committed files kept for reads (s4fs.read.decoded); None: a quarter of the
    # cache disk's free space, at most 64 GiB; 0: off
    decoded_cache_bytes: int | None = None
    close_sync_seconds: float = 30.0   # writeback: how long unmount waits for commits


PUSH_MIN_CORES = 4


def cold_reads_here() -> str:
    """How ``s4fs mount`` reads a cold file unless told (``FsConfig.cold_reads``):
    pushed where the machine has at least :data:`PUSH_MIN_CORES` cores — the decode
    ahead leaves cores to the pushes and to ``torch.load`` beside it (H100 box, 16
    cores, 1.77 GiB: a fresh node's load 1.44 s pushed against 2.20 s waiting for the
    whole copy) — else the whole copy first (2 cores: the decode takes both, and
    pushing adds a copy of every page: 0.50 s against 0.47 s). docs/BENCHMARKS.md §4."""
    return "push" if (os.cpu_count() or 1) >= PUSH_MIN_CORES else "whole"
