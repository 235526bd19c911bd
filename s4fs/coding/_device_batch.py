"""The device side of coding one batch: the chunk rule on the GPU (one
``s4fs.codec.gpu.compress_many`` call codes every delta and every chunk in full; the
smaller wins), with the CPU as the fallback for a batch the GPU cannot code; and a
decode-ahead batch decoded on the GPU and written at its file offsets.

Used by the GPU worker process (``_gpu_pool``), by the in-process GPU batches of the
API's sessions (``_threads``) and by the device save (``s4fs.torch.save``, through
:func:`code_on_device`). Everything that touches the device runs on the process's GPU
thread (``s4fs.codec.on_gpu_thread``).
"""

from __future__ import annotations

import logging
import time

from s4fs import codec
from s4fs.coding._config import IngestConfig
from s4fs.coding._rule import chain_room, chunk_result, delta_is_tiny, keep_delta
from s4fs.coding._worker import Copy
from s4fs.codec import on_gpu_thread, read_header

# The one warning of this module (a batch coded on the CPU instead) keeps the logger name
# it has always had: operators and tests/core/test_gpu_pool.py match "s4fs.ingest" in it.
log = logging.getLogger("s4fs.ingest")


def code_items(items: list, prep: list, cfg: IngestConfig) -> list:
    """Code ``items`` (``(data, dtype, base ref)``, with ``prep`` from the delta rule:
    ``delta_prep``'s None, ``("same",)`` or ``("delta", base bytes)``) in one GPU batch
    on the process's GPU thread; per item ``(blob | None, base ref | None, checksum, raw
    length)``. Every coded item's checksum is the one its full blob's header holds,
    computed on the device from the bytes that were coded. A batch the GPU cannot code
    is coded on the CPU instead, with a warning."""
    try:
        return on_gpu_thread(_gpu_results, items, prep, cfg)
    except Exception as exc:       # noqa: BLE001 - the CPU codes the batch instead
        log.warning(
            "the GPU could not code a batch of %d chunks (%s: %s); coding it on the CPU",
            len(items), type(exc).__name__, exc)
        return [_cpu_result(it, p, cfg) for it, p in zip(items, prep)]


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
        room = chain_room(base, cfg)
        keep = (delta_is_tiny(len(delta), n) and len(delta) <= room) or \
            keep_delta(len(delta), len(full[i]), cfg, room)
        res[i] = (delta if keep else full[i], base if keep else None, sum_, n)
    for i in fulls:
        res[i] = (full[i], None, _sum_of(full[i]), len(batch[i][0]))
    return res


def _sum_of(blob) -> int:
    """The chunk's XXH3-64 as the blob's header holds it (computed on the device)."""
    return read_header(blob, whole=False).checksum


def decode_into(source, job) -> int:
    """Decode one batch (a :class:`~s4fs.coding.DecodeJob`) with
    ``s4fs.chunks.decode_on_gpu`` (only the decoding on the process's GPU thread; every
    chunk checked) and write its pieces at their offsets in ``job.target``."""
    from s4fs.chunks import decode_on_gpu
    t0 = time.perf_counter()
    with source.staged(job.staged):
        decoded = decode_on_gpu(source, [ref for ref, _ in job.items], gpu_thread=True,
                                to_host=True)
    t1 = time.perf_counter()
    with Copy(job.target, job.mapped) as copy:
        for ref, pieces in job.items:
            arr = decoded[ref.key()]
            data = arr.get() if hasattr(arr, "get") else arr      # CuPy (a base too)
            for coff, foff, n in pieces:
                copy.place(data[coff: coff + n], foff)
    log.info("decoded ahead %d chunks (%.1f MiB): read and decode %.0f ms, write %.0f ms "
             "(%s)", len(job.items), sum(ref.raw for ref, _ in job.items) / 2**20,
             1e3 * (t1 - t0), 1e3 * (time.perf_counter() - t1),
             "mapped" if job.mapped else "pwrite")
    return len(job.items)
