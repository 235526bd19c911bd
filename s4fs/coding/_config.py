"""The configuration of a file's ingest and of the coding it asks for (one frozen
dataclass, ``FsConfig.ingest``)."""

from __future__ import annotations

import os
from dataclasses import dataclass


@dataclass(frozen=True)
class IngestConfig:
    chunk_size: int = 4 << 20          # raw bytes per chunk (a multiple of every itemsize)
    pack_size: int = 32 << 20          # stored bytes per pack object
    workers: int = max(2, os.cpu_count() or 2)
    max_pending_chunks: int = 0        # chunks being coded at once; 0: twice the workers
    max_uploads: int = 4
    # "cpu", "cuda" or "auto" (the GPU when one is usable: s4fs.codec.resolve_device).
    # On the GPU, chunks are coded in batches of about gpu_batch_bytes by one worker on
    # the process's GPU thread (s4fs.coding: GpuBatches, the GPU worker process); the
    # API keeps the CPU unless asked.
    device: str = "cpu"
    gpu_batch_bytes: int = 64 << 20
    # the GPU profile's name (s4fs.codec.gpu.PROFILES): "default" codes planes with nvCOMP
    # ANS (a GPU decodes them); "portable" writes blobs any CPU decodes
    gpu_profile: str = "default"
    # background coding yields the CPU to the training job and to the FUSE requests it
    # waits on (a nice value for the coding threads; 0 keeps the normal priority)
    nice: int = 10
    max_delta_depth: int = 4           # a delta chain never grows past this
    # A delta chain never holds more than this many times its root's stored bytes (the
    # root blob and every delta on it, the new one included): what a node with nothing
    # cached fetches and decodes to read the chunk. Bounds a fresh node's load against
    # the same version stored whole; 1.0 turns deltas off (identical chunks still reuse
    # their base's blob), a large value leaves max_delta_depth the only bound.
    max_chain_read: float = 1.25
    delta_min_gain: float = 0.9        # keep a delta only if <= this fraction of full size
    # an fp32 tensor saved after a bf16/fp16 copy of it in the same file is coded on that
    # copy (s4fs.write.pairs; coded on the CPU: not where a save codes on the GPU)
    pairs: bool = True
    # A session fed from a spool file codes in worker processes (s4fs.coding's CPU
    # workers or GPU worker) when this is set (the mount sets it): chunks are sent as
    # spool byte ranges in batches of about batch_bytes, one pack each.
    processes: bool = False
    batch_bytes: int = 16 << 20


@dataclass(frozen=True)
class Placement:
    """Where a pipeline's chunks are coded and a cold file is decoded ahead: the answer
    of :func:`placement`, which every pool, session and reader asks."""

    device: str          # "cpu" or "cuda"
    processes: bool      # worker processes (they read spool files), else threads here

    @property
    def gpu(self) -> bool:
        return self.device == "cuda"

    @property
    def gpu_worker(self) -> bool:
        """The GPU worker process codes and decodes; this process makes no CUDA context
        (its reads of GPU-coded chunks go there too)."""
        return self.gpu and self.processes

    @property
    def decodes_ahead(self) -> bool:
        """Whether cold files are decoded ahead: by worker processes, or on this
        process's GPU; threads of this process on its CPU only decode as it reads."""
        return self.processes or self.gpu

    def batch_bytes(self, cfg: IngestConfig) -> int:
        """The raw bytes of one batch a pool codes or decodes (a whole GPU batch on the
        device; a few MiB per CPU worker)."""
        return cfg.gpu_batch_bytes if self.gpu else cfg.batch_bytes


def placement(cfg: IngestConfig, *, spool: bool = True) -> Placement:
    """Where a pipeline under ``cfg`` runs, decided here only. The device is the codec's
    choice for a whole pipeline (``s4fs.codec.resolve_device``: "auto" is the GPU where
    one is usable and the machine has few cores; "cuda" without one raises); worker
    processes where ``cfg.processes`` and the bytes lie in a file they can read
    (``spool``: a session fed from memory codes on threads of this process)."""
    from s4fs.codec import resolve_device
    return Placement(resolve_device(cfg.device), cfg.processes and spool)
