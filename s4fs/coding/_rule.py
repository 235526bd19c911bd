"""The chunk rule: how one chunk is stored — coded whole (FULL), as an XOR delta against
the matching chunk of the base version (DELTA), or as that base chunk itself (SAME).

One rule for every path that codes: the API's threads, the CPU worker processes, the GPU
worker process and the device save. The GPU paths split it in two: :func:`delta_prep`
(what is known before coding: no delta, the same bytes, or the base's bytes) here, and
the comparison of the coded sizes (:func:`delta_is_tiny`, :func:`keep_delta`) after
one batch call on the device (``_device_batch``). On the CPU, where coding a chunk both
ways costs twice, a sample guesses the winner (:func:`guess_sizes`).
"""

from __future__ import annotations

import math

import numpy as np

from s4fs import codec
from s4fs.coding._bases import readable_base
from s4fs.coding._config import IngestConfig
from s4fs.manifest import ChunkRef

FULL, DELTA, SAME = 0, 1, 2        # how a chunk is stored: coded whole, as a delta, reused
PAIR = 3                           # coded on its pair: a master on its copy, or the
                                   # copy on its master (s4fs.codec._pair)

#: a sample's share of words within half a step of the copy for a chunk to be coded on it
#: (an exact rounding: all; stochastic rounding: about half; an unrelated tensor: ~none)
PAIR_SHARE = 0.25
#: a pair coded to at most this share of its raw bytes is kept without coding the chunk
#: alone as well (an exact rounding codes to ~0.5; an fp32 weight alone to ~0.83)
PAIR_SURE = 0.7


def pair_step(chunk_size: int, dtype: str, pair) -> int:
    """The bytes of each chunk of a tensor of ``dtype`` coded on ``pair`` (or on
    nothing): each chunk holds the elements of exactly one chunk of its pair — a master
    on its copy twice the copy's chunk, a copy on its master half the master's."""
    if pair is None:
        return chunk_size
    return 2 * chunk_size if dtype == "float32" else chunk_size // 2


def code_pair(data, dtype: str, checksum: int, pair, cfg: IngestConfig) -> bytes | None:
    """A chunk coded on its pair — ``pair`` is ``(the other's dtype, its ref, its bytes
    fn)``: an fp32 master on its low-precision copy saved before it, or a bf16/fp16 copy
    on its fp32 master saved before it (``dtype`` says which) — when a sample says the
    copy is about the master rounded and the pair codes smaller than
    ``cfg.delta_min_gain`` of the chunk's raw size; None: code it by the usual rule. On
    the CPU (its blobs decode anywhere)."""
    kind, ref, other_bytes = pair
    other = readable_base(other_bytes, f"pack {ref.pack}")
    if other is None or ref.checksum != codec.checksum(other):
        return None
    if dtype == "float32":                  # the master, on its copy
        if len(other) * 2 != len(data) or codec.pair_share(data, other, kind) < PAIR_SHARE:
            return None
        blob = codec.compress(data, dtype, base=other, device="cpu", checksum=checksum,
                              base_checksum=ref.checksum, transform="pair", base_dtype=kind)
    else:                                   # the copy, on its master
        if kind != "float32" or dtype not in codec.PAIR_COPIES or \
                len(data) * 2 != len(other) or \
                codec.pair_share(other, data, dtype) < PAIR_SHARE:
            return None
        blob = codec.compress(data, dtype, base=other, device="cpu", checksum=checksum,
                              base_checksum=ref.checksum, transform="on_master")
    if len(blob) > cfg.delta_min_gain * len(data):
        return None
    if len(blob) > PAIR_SURE * len(data) and \
            len(codec.compress(data, dtype, device="cpu", checksum=checksum)) <= len(blob):
        return None          # not a rounding after all: never larger than coded alone
    return blob


def code_chunk(data, dtype: str, checksum: int, base: ChunkRef | None, base_bytes,
               cfg: IngestConfig, device: str | None = None,
               pair=None) -> tuple[bytes, int]:
    """Code one chunk: ``(blob, FULL)``, ``(delta, DELTA)`` against ``base`` (whose raw
    bytes ``base_bytes()`` returns), or ``(b"", SAME)`` when it equals its base. A delta
    is kept when it is tiny, or no larger than ``cfg.delta_min_gain`` of the full coding,
    and its chain stays within ``cfg.max_chain_read`` (:func:`chain_room`).
    The one rule for both the in-process threads and the worker processes. On the CPU a
    sample (:func:`guess_sizes`) says which way to code first, so most chunks are coded
    once; the other way is coded too only where the real size contradicts the guess."""
    device = cfg.device if device is None else device
    if pair is not None:
        blob = code_pair(data, dtype, checksum, pair, cfg)
        if blob is not None:
            return blob, PAIR

    def whole() -> bytes:         # the chunk's checksum is this data's: not taken again
        return codec.compress(data, dtype, device=device, checksum=checksum)

    if not delta_candidate(base, len(data), cfg):
        return whole(), FULL
    room = chain_room(base, cfg)            # stored bytes a delta may add to the chain
    if room <= 0 and base.checksum != checksum:
        # no delta may be kept and the chunk is not its base's bytes: coded whole
        # without reading the base (a backward save, whose newest version is whole)
        return whole(), FULL
    base_raw = readable_base(base_bytes, f"pack {base.pack}")
    if base_raw is None:
        return whole(), FULL
    if base.checksum == checksum and base_raw == data:
        return b"", SAME
    if room <= 0:
        return whole(), FULL

    def against() -> bytes:       # base_raw was checked against base.checksum
        return codec.compress(data, dtype, base=base_raw, device=device,
                              checksum=checksum, base_checksum=base.checksum)

    guess_delta, guess_full = (guess_sizes(data, dtype, base_raw) if device == "cpu"
                               else None) or (None, None)
    if guess_full is not None and not keep_delta(guess_delta, guess_full, cfg, room):
        full = whole()                                            # the sample says: whole
        if not keep_delta(guess_delta, len(full), cfg, room):
            return full, FULL
        delta = against()
        return (delta, DELTA) if keep_delta(len(delta), len(full), cfg, room) else \
            (full, FULL)
    delta = against()
    if delta_is_tiny(len(delta), len(data)) and len(delta) <= room:
        return delta, DELTA
    if guess_full is not None and keep_delta(len(delta), guess_full, cfg, room):
        return delta, DELTA                                     # the sample says: delta
    full = whole()
    if keep_delta(len(delta), len(full), cfg, room):
        return delta, DELTA
    return full, FULL


SAMPLE_MIN = 512 << 10      # a chunk this large is sampled before it is coded
SAMPLE_PARTS = 8            # evenly spaced slices, together 1/SAMPLE_SHARE of the chunk
SAMPLE_SHARE = 64
SAMPLE_SPREAD = 0.02        # changed words: the sample's share may differ by this much


def guess_sizes(data, dtype: str, base_raw) -> tuple[int, int | None] | None:
    """Coded sizes of a chunk as a delta and whole, guessed from a sample (evenly spaced
    slices, 1/64 of it, coded both ways and scaled up): ``(delta, full)``, ``(delta,
    None)`` when the delta looks tiny (the whole is then not sampled), or None — a chunk
    too small to sample, or one whose changes the sample does not represent (the share
    of 8-byte words that differ from the base, counted over the whole chunk, is not the
    sample's).

    Coding a chunk both ways to keep the smaller doubles a CPU's work for every chunk
    whose delta is not tiny (AdamW's first moment: every bit changes every step), and
    an XOR's planes code several times slower than a float's own. With the guess,
    :func:`code_chunk` codes the likely winner first and the other only where the
    winner's real size contradicts the guess. Only the choice rests on it: both ways
    decode to the same bytes."""
    got = sample_pair(data, base_raw)
    if got is None:
        return None
    sample, base_sample, scale = got
    delta = len(codec.compress(sample, dtype, base=base_sample, device="cpu")) * scale
    if delta_is_tiny(delta, len(data)):
        return int(delta), None
    return int(delta), int(len(codec.compress(sample, dtype, device="cpu")) * scale)


def sample_pair(data, base_raw):
    """A chunk's sample and its base's (evenly spaced slices, 1/64 of it) and the scale
    from the sample's coded size to the chunk's: ``(sample, base sample, scale)``, or
    None — a chunk too small to sample, or one whose changes the sample does not
    represent (the share of 8-byte words that differ from the base, counted over the
    whole chunk, is not the sample's)."""
    n = len(data)
    part = (n // (SAMPLE_PARTS * SAMPLE_SHARE)) & ~511      # a multiple of every itemsize
    if n < SAMPLE_MIN or part == 0 or n % 8:
        return None
    new = np.frombuffer(data, np.uint64)
    old = np.frombuffer(base_raw, np.uint64)
    step, w = (n - part) // (SAMPLE_PARTS - 1) // 8, part // 8       # in 8-byte words

    def slices(words: np.ndarray) -> np.ndarray:
        return np.concatenate([words[i * step:i * step + w] for i in range(SAMPLE_PARTS)])

    sample, base_sample = slices(new), slices(old)
    changed = np.count_nonzero(new != old) / len(new)
    if abs(np.count_nonzero(sample != base_sample) / len(sample) - changed) > SAMPLE_SPREAD:
        return None
    return sample.view(np.uint8), base_sample.view(np.uint8), n / sample.nbytes


TRANSFORMS = ("diff", "xor")   # how a delta is taken (s4fs.codec.compress)


def code_again(data, dtype: str, checksum: int, base_raw, base_checksum: int,
               whole: int, cfg: IngestConfig) -> bytes | None:
    """The chunk rule for a chunk already stored whole in ``whole`` bytes, coded again
    as a delta on ``base_raw`` (backward deltas, s4fs.write.backward): ``b""`` when the
    two are the same bytes, the delta blob when it is at most ``cfg.delta_min_gain`` of
    the whole one (or tiny and smaller), None when it does not pay. The delta is the
    XOR or the words' difference (zigzag), whichever codes smaller: a sample of both
    says which, and whether either can pay; a chunk too small to sample is coded both
    ways. On the CPU (its blobs then decode anywhere)."""
    if checksum == base_checksum and data == base_raw:
        return b""
    budget = cfg.delta_min_gain * whole

    def coded(transform: str, new=data, old=base_raw, sums=(checksum, base_checksum)):
        return codec.compress(new, dtype, base=old, device="cpu", checksum=sums[0],
                              base_checksum=sums[1], transform=transform)
    got = sample_pair(data, base_raw)
    if got is not None:
        sample, base_sample, scale = got
        sizes = {t: len(coded(t, sample, base_sample, (None, None))) * scale
                 for t in TRANSFORMS}
        best = min(TRANSFORMS, key=sizes.get)
        if sizes[best] > budget:
            return None                     # the sample says neither will pay
        blob = coded(best)
    else:
        blob = min((coded(t) for t in TRANSFORMS), key=len)
    if len(blob) <= budget or (delta_is_tiny(len(blob), len(data)) and len(blob) < whole):
        return blob
    return None


def chunk_result(data, dtype: str, checksum: int, base: ChunkRef | None, base_bytes,
                 cfg: IngestConfig, device: str | None = None, pair=None) -> tuple:
    """:func:`code_chunk`'s choice as ``(blob | None, base ref | None, checksum, raw
    length)`` (what ``s4fs.write.PackWriter.place`` takes): no blob when the chunk is its
    base, no base when it is coded whole."""
    blob, kind = code_chunk(data, dtype, checksum, base, base_bytes, cfg, device, pair)
    if kind == PAIR:
        return blob, pair[1], checksum, len(data)
    return (None if kind == SAME else blob), (None if kind == FULL else base), checksum, \
        len(data)


def delta_candidate(base: ChunkRef | None, raw: int, cfg: IngestConfig) -> bool:
    """Whether a chunk of ``raw`` bytes may be stored as a delta against ``base``."""
    return base is not None and base.raw == raw and base.hops < cfg.max_delta_depth


def delta_is_tiny(delta_len: int, raw: int) -> bool:
    """A delta this small is kept without coding the chunk in full to compare."""
    return delta_len < 0.25 * raw


def keep_delta(delta_len: int, full_len: int, cfg: IngestConfig,
               room: float = math.inf) -> bool:
    """A delta of ``delta_len`` is worth keeping over a full coding of ``full_len``, and
    fits the ``room`` its chain has left (:func:`chain_room`)."""
    return delta_len <= cfg.delta_min_gain * full_len and delta_len <= room


def chain_room(base: ChunkRef, cfg: IngestConfig) -> float:
    """Stored bytes a delta on ``base`` may have: a chunk's chain (its root blob and every
    delta on it, the new one included) holds at most ``cfg.max_chain_read`` times the
    root's stored bytes, so a node reading the chunk with nothing cached fetches and
    decodes at most that much more than for a whole coding. None left: <= 0."""
    total = 0
    while base.base is not None:
        total += base.stored
        base = base.base
    return cfg.max_chain_read * base.stored - (total + base.stored)


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
    if chain_room(base, cfg) <= 0:
        return None
    return ("delta", raw)
