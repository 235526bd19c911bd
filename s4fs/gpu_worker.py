"""The ingest pipeline's GPU worker (``IngestConfig.device`` "cuda", or "auto" where
``s4fs.codec._device.pipeline`` picks the GPU).

An ingest session hands its chunks to :class:`GpuCoding` instead of the codec thread
pool: they are gathered into batches of about ``IngestConfig.gpu_batch_bytes``; each
batch gets its delta bases on the codec pool (read from the base version's decoded copy
where there is one, checked against the manifest, else from the store), then is coded by
one ``s4fs.codec.gpu.compress_many`` call (deltas, and every chunk in full so that the
smaller wins) on the process's GPU thread while the next batch fills. Every chunk's Future resolves with what
``IngestSession._encode`` returns, so the session packs and commits as usual. The delta
rule is ``ingest.code_chunk``'s. A batch the GPU cannot code (out of memory, a driver
error) is coded on the CPU instead, with a warning: a save never fails for it.
"""

from __future__ import annotations

import logging
import os
from concurrent.futures import Future

from s4fs import codec
from s4fs.codec import _container, _device
from s4fs.delta import readable_base
from s4fs.ingest import (IngestConfig, _Pools, base_bytes, chunk_result, delta_candidate,
                         delta_is_tiny, keep_delta)
from s4fs.manifest import ChunkRef

log = logging.getLogger("s4fs.ingest")


class GpuCoding:
    """The GPU worker of a session: chunks gathered into batches of about
    ``cfg.gpu_batch_bytes``; each batch gets its delta bases (read from the base
    version's decoded copy where there is one) on the codec pool, then is coded by one
    ``s4fs.codec.gpu.compress_many`` call on the process's GPU thread while the next
    batch fills. The choice of delta or full coding is ``code_chunk``'s; a batch the GPU
    cannot code (out of memory, a driver error) is coded on the CPU instead, with a
    warning, so a save never fails for it."""

    def __init__(self, session, bases) -> None:
        self.s = session
        self.bases = bases
        self.items: list[tuple] = []          # (data, dtype, base ref, where, Future)
        self.nbytes = 0
        cfg = session.cfg
        self.batch_chunks = max(1, -(-cfg.gpu_batch_bytes // cfg.chunk_size))

    def add(self, data, dtype: str, base: ChunkRef | None, where) -> Future:
        fut: Future = Future()
        self.items.append((data, dtype, base, where, fut))
        self.nbytes += len(data)
        if self.nbytes >= self.s.cfg.gpu_batch_bytes:
            self.flush()
        return fut

    def flush_if_holding(self, fut: Future) -> None:
        if any(it[-1] is fut for it in self.items):
            self.flush()

    def flush(self) -> None:
        if not self.items:
            return
        batch, self.items, self.nbytes = self.items, [], 0
        cfg = self.s.cfg
        _Pools.codec(cfg.workers, cfg.nice).submit(code_batch, batch, cfg, self.s._source,
                                                  self.bases.path)

    def drop(self) -> None:
        for *_, fut in self.items:
            fut.cancel()
        self.items, self.nbytes = [], 0


def code_batch(batch: list, cfg: IngestConfig, source, base_path) -> None:
    """Code one batch and resolve each chunk's Future with what ``IngestSession._encode``
    returns (runs on the codec pool; the coding itself on the GPU thread)."""
    try:
        prep = _prepare_bases(batch, cfg, source, base_path)
        results = code_items([it[:3] for it in batch], prep, cfg)
    except BaseException as exc:        # noqa: BLE001 - handed to the session
        for *_, fut in batch:
            if fut.set_running_or_notify_cancel():
                fut.set_exception(exc)
        return
    for (*_, fut), res in zip(batch, results):
        if fut.set_running_or_notify_cancel():
            fut.set_result(res)


def code_items(items: list, prep: list, cfg: IngestConfig) -> list:
    """Code ``items`` (``(data, dtype, base ref)``, with ``prep`` from the delta rule:
    :func:`delta_prep`'s None, ``("same",)`` or ``("delta", base bytes)``) in one GPU batch
    on the process's GPU thread; per item ``(blob | None, base ref | None, checksum, raw
    length)``. Every coded item's checksum is the one its full blob's header holds,
    computed on the device from the bytes that were coded. A batch the GPU cannot code
    is coded on the CPU instead, with a warning."""
    try:
        return _device.on_gpu_thread(_gpu_results, items, prep, cfg)
    except Exception as exc:       # noqa: BLE001 - the CPU codes the batch instead
        log.warning(
            "the GPU could not code a batch of %d chunks (%s: %s); coding it on the CPU",
            len(items), type(exc).__name__, exc)
        return [_cpu_result(it, p, cfg) for it, p in zip(items, prep)]


def _prepare_bases(batch: list, cfg: IngestConfig, source, base_path) -> list:
    """Per chunk, :func:`delta_prep`'s answer. Base bytes come from the base version's
    decoded copy when it holds them intact (checked against the manifest's checksum),
    else from the store."""
    fd = None
    if base_path is not None and any(it[3] is not None for it in batch):
        try:
            fd = os.open(base_path, os.O_RDONLY)
        except OSError:
            fd = None
    try:
        return [delta_prep(data, base, cfg, lambda: base_bytes(fd, where, base, source))
                for data, _, base, where, _ in batch]
    finally:
        if fd is not None:
            os.close(fd)


def delta_prep(data, base: ChunkRef | None, cfg: IngestConfig, base_bytes):
    """What the delta rule needs before a chunk is coded: None (code it whole),
    ``("same",)`` when it equals its base (whose checksum is then the chunk's), or
    ``("delta", base bytes)``. ``base_bytes()`` returns the base's verified raw bytes.
    (No checksum of ``data`` here: the device computes every coded chunk's.)"""
    if not delta_candidate(base, len(data), cfg):
        return None
    raw = readable_base(base_bytes, f"pack {base.pack}")   # None: unreadable, coded whole
    if raw is None:
        return None
    if raw == data:
        return ("same",)
    return ("delta", raw)


def _cpu_result(item, prep, cfg: IngestConfig):
    data, dtype, base = item
    if prep is not None and prep[0] == "same":
        return None, base, base.checksum, len(data)
    return chunk_result(data, dtype, codec.checksum(data), base if prep else None,
                        lambda: prep[1], cfg, device="cpu")


def _gpu_results(batch: list, prep: list, cfg: IngestConfig) -> list:
    from s4fs.codec import gpu
    return code_on_device(batch, prep, gpu.PROFILES[cfg.gpu_profile], cfg)


def code_on_device(batch: list, prep: list, profile, cfg: IngestConfig, same=None) -> list:
    """The delta rule on the GPU, for one batch: ``batch`` of ``(data, dtype, base ref)``
    and ``prep`` as :func:`code_items` takes them (a ``"delta"`` base may be a device
    array); per item ``(blob | None, base ref | None, checksum, raw length)``, blobs as
    views of pinned host memory. One ``compress_many`` call codes every delta and every
    chunk in full (delta candidates too: the smaller wins unless the delta is tiny).
    ``same(i)``, when given, says whether item ``i`` has exactly its base's bytes; it is
    asked only when the chunk's checksum (computed on the device) is its base's, and a
    chunk that is the same is stored as its base (no blob). Without it, sameness is
    settled before (``prep``'s ``("same",)``)."""
    from s4fs.codec import gpu
    res: list = [None] * len(batch)
    deltas = [i for i, p in enumerate(prep) if p is not None and p[0] == "delta"]
    fulls = [i for i, p in enumerate(prep) if p is None]
    for i, p in enumerate(prep):
        if p is not None and p[0] == "same":
            res[i] = (None, batch[i][2], batch[i][2].checksum, len(batch[i][0]))
    # a chunk's bytes are staged once for both codings
    blobs = gpu.compress_many([(batch[i][0], batch[i][1], prep[i][1]) for i in deltas] +
                              [(batch[i][0], batch[i][1]) for i in deltas + fulls],
                              profile=profile, out="host")
    full = dict(zip(deltas + fulls, blobs[len(deltas):]))
    for i, delta in zip(deltas, blobs):
        n, base, sum_ = len(batch[i][0]), batch[i][2], _sum_of(full[i])
        if same is not None and sum_ == base.checksum and same(i):
            res[i] = (None, base, sum_, n)
            continue
        keep = delta_is_tiny(len(delta), n) or keep_delta(len(delta), len(full[i]), cfg)
        res[i] = (delta if keep else full[i], base if keep else None, sum_, n)
    for i in fulls:
        res[i] = (full[i], None, _sum_of(full[i]), len(batch[i][0]))
    return res


def _sum_of(blob) -> int:
    """The chunk's XXH3-64 as the blob's header holds it (computed on the device)."""
    return _container.unpack(blob, whole=False).checksum
