"""Coding: how a file's chunks become stored blobs, and where that work runs.

* the chunk rule (``_rule``): a chunk is stored whole (FULL), as an XOR delta against
  the matching chunk of the base version (DELTA) or as that chunk itself (SAME) —
  :func:`code_chunk`, :func:`chunk_result`, :func:`delta_prep` and their tests of size;
  :func:`code_again` for a chunk stored whole coded again on a newer one (backward);
* delta bases (``_bases``): which base chunk a chunk is coded against and where its
  bytes come from (:class:`BaseFile`, :func:`base_bytes`); a base that cannot be had
  (:func:`missing_packs`, :func:`readable_base`, warned about once by
  :func:`note_unreadable_base`);
* the jobs and results passed to pools (``_jobs``) and the one pool interface,
  :class:`CodingPool` (``_pool``);
* where a pipeline runs, decided in one function (``_config``: :func:`placement`, a
  :class:`Placement`): on the CPU or the GPU (the codec's choice of device), in worker
  processes or threads of this process; the pools, sessions and readers ask it;
* the pools: the CPU worker processes (``_cpu_pool``), the GPU worker process
  (``_gpu_pool``), both held by :class:`Pools` (``_pools``: made on first use, stopped
  by its owner, s4fs.runtime), threads of this process for the API (``_threads``); the
  daemon's side of the process pools (``_spool``: :class:`SpoolCoding`);
* the device side of coding one batch (``_device_batch``), shared by the GPU worker,
  the API's GPU batches and the device save;
* a decoded copy being filled by many workers at once (``_worker``: :class:`Copy`,
  written through a shared mapping where :func:`mapped_copy` says so).

``coding`` imports the codec, the manifest, the stores' pickled specs and the read room's
chunk source; never the write room, the filesystem or the API.
"""

from s4fs.coding._bases import (BaseFile, base_bytes, base_chunk, base_from_file, base_streams,
                                collecting_notes, missing_packs, note_unreadable_base,
                                readable_base, saw_pack)
from s4fs.coding._config import IngestConfig, Placement, placement
from s4fs.coding._device_batch import code_items, code_on_device, decode_into
from s4fs.coding._jobs import (ChunkBatch, DecodeJob, Item, ItemResult, Job, JobResult,
                               WorkerDied, died)
from s4fs.coding._pool import CodingPool
from s4fs.coding._pools import Pools
from s4fs.coding._rule import (DELTA, FULL, PAIR, PAIR_SHARE, SAME, chunk_result,
                               code_again, code_chunk, code_pair, delta_candidate,
                               delta_is_tiny, delta_prep, keep_delta, pair_step)
from s4fs.coding._spool import SpoolCoding
from s4fs.coding._threads import GpuBatches, ThreadPool, lower_priority
from s4fs.coding._worker import Copy, mapped_copy


__all__ = [
    "BaseFile", "ChunkBatch", "CodingPool", "Copy", "DELTA", "DecodeJob", "FULL", "GpuBatches",
    "IngestConfig", "Item", "ItemResult", "Job", "JobResult", "PAIR", "PAIR_SHARE", "Placement", "Pools",
    "SAME",
    "SpoolCoding", "ThreadPool", "WorkerDied", "base_bytes", "base_chunk",
    "base_from_file", "base_streams", "chunk_result", "code_again", "code_chunk", "code_pair", "pair_step",
    "code_items",
    "code_on_device", "collecting_notes", "decode_into",
    "delta_candidate", "delta_is_tiny", "delta_prep", "died", "keep_delta",
    "lower_priority", "missing_packs", "note_unreadable_base", "placement", "readable_base",
    "mapped_copy", "saw_pack",
]
