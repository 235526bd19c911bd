"""The chunk rule: how one chunk is stored — coded whole (FULL), as an XOR delta against
the matching chunk of the base version (DELTA), or as that base chunk itself (SAME).

One rule for every path that codes: the API's threads, the CPU worker processes, the GPU
worker process and the device save. The GPU paths split it in two: :func:`delta_prep`
(what is known before coding: no delta, the same bytes, or the base's bytes) here, and
the comparison of the coded sizes (:func:`delta_is_tiny`, :func:`keep_delta`) after
one batch call on the device (``_device_batch``).
"""

from __future__ import annotations

from s4fs import codec
from s4fs.coding._bases import readable_base
from s4fs.coding._config import IngestConfig
from s4fs.manifest import ChunkRef

FULL, DELTA, SAME = 0, 1, 2        # how a chunk is stored: coded whole, as a delta, reused


def code_chunk(data, dtype: str, checksum: int, base: ChunkRef | None, base_bytes,
               cfg: IngestConfig, device: str | None = None) -> tuple[bytes, int]:
    """Code one chunk: ``(blob, FULL)``, ``(delta, DELTA)`` against ``base`` (whose raw
    bytes ``base_bytes()`` returns), or ``(b"", SAME)`` when it equals its base. A delta
    is kept when it is tiny, or no larger than ``cfg.delta_min_gain`` of the full coding.
    The one rule for both the in-process threads and the worker processes."""
    device = cfg.device if device is None else device
    if not delta_candidate(base, len(data), cfg):
        return codec.compress(data, dtype, device=device), FULL
    base_raw = readable_base(base_bytes, f"pack {base.pack}")
    if base_raw is None:
        return codec.compress(data, dtype, device=device), FULL
    if base.checksum == checksum and base_raw == data:
        return b"", SAME
    delta = codec.compress(data, dtype, base=base_raw, device=device)
    if delta_is_tiny(len(delta), len(data)):
        return delta, DELTA
    full = codec.compress(data, dtype, device=device)
    if keep_delta(len(delta), len(full), cfg):
        return delta, DELTA
    return full, FULL


def chunk_result(data, dtype: str, checksum: int, base: ChunkRef | None, base_bytes,
                 cfg: IngestConfig, device: str | None = None) -> tuple:
    """:func:`code_chunk`'s choice as ``(blob | None, base ref | None, checksum, raw
    length)`` (what ``s4fs.write.PackWriter.place`` takes): no blob when the chunk is its
    base, no base when it is coded whole."""
    blob, kind = code_chunk(data, dtype, checksum, base, base_bytes, cfg, device)
    return (None if kind == SAME else blob), (None if kind == FULL else base), checksum, \
        len(data)


def delta_candidate(base: ChunkRef | None, raw: int, cfg: IngestConfig) -> bool:
    """Whether a chunk of ``raw`` bytes may be stored as a delta against ``base``."""
    return base is not None and base.raw == raw and base.depth < cfg.max_delta_depth


def delta_is_tiny(delta_len: int, raw: int) -> bool:
    """A delta this small is kept without coding the chunk in full to compare."""
    return delta_len < 0.25 * raw


def keep_delta(delta_len: int, full_len: int, cfg: IngestConfig) -> bool:
    return delta_len <= cfg.delta_min_gain * full_len


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
