"""Pairs within one file: a weight kept twice — an fp32 master and its low-precision
copy — stored about once.

Mixed-precision training keeps each weight twice — the bf16 (or fp16) copy the model
computes with and the fp32 master the optimizer updates — and saves both. Whichever of
the two the file holds first is stored as before, the second is coded on it
(``s4fs.codec._pair``):

* the copy first (Megatron's ``model`` beside ``optimizer['fp32_from_fp16_params']``,
  a loop's ``{"model": ..., "optimizer": ..., "master": ...}``): a master word is known
  but for its place within half a step of the copy's precision, so the master's chunks
  cost about their low half, and the copy reads on its own;
* the master first (``{"optimizer": ..., "model": ...}``): the copy is the master
  rounded to nearest, so its chunks cost next to nothing.

docs/DELTA.md says why each way. A second tensor is never held back waiting for a first
that may not come: the file streams in, and each tensor is coded as it arrives.

Which tensors pair is found from the bytes, never from names: a pair is an fp32 tensor
and a bf16 or fp16 tensor of half its bytes. A master looks for its copy among the
unpaired copies of that size, in file order; a copy looks for its master first by key
(its first words, which an exact rounding of the master's first words equals), then
among the first unpaired fp32 tensors of that size. A candidate is taken where a sample
of the first bytes says the copy is about the master rounded (``PAIR_SHARE`` of the
words within half a step). Each chunk is then coded on its pair only where it pays
(``s4fs.coding.code_pair``): a wrong guess costs the sample, never bytes or
correctness.
"""

from __future__ import annotations

from typing import Callable

import numpy as np

from s4fs import codec
from s4fs.coding import PAIR_SHARE
from s4fs.manifest import Stream

#: the most bytes of a master's first piece sampled to find its copy
SAMPLE_BYTES = 64 << 10
#: a master's first piece must hold this many bytes to be matched (else: no pair)
MIN_SAMPLE = 256
#: candidates of one size tried without a matching key
TRIES = 8
#: the copy's first words a key holds
KEY_WORDS = 32


class Pairs:
    """The tensors of one file seen so far that a later one may pair with, and which
    pairs were made. ``head_of(stream, n)``: the first ``n`` bytes of an earlier tensor
    (None where they cannot be had)."""

    def __init__(self, head_of: Callable[[Stream, int], bytes | None]) -> None:
        self._head_of = head_of
        self._copies: dict[int, list[Stream]] = {}     # byte length -> unpaired copies
        self._masters: dict[int, list[Stream]] = {}    # byte length -> unpaired fp32
        # (copy dtype, copy byte length, the master's first words rounded) -> masters
        self._keyed: dict[tuple, list[Stream]] = {}
        self._keys: dict[int, dict[str, bytes]] = {}   # id(fp32 tensor) -> its keys
        self._taken: set[int] = set()                  # ids of masters paired since

    def begin(self, stream: Stream, length: int | None, head) -> Stream | None:
        """Tensor ``stream`` (``length`` bytes, its first bytes ``head``) starts: the
        earlier tensor it is coded on, or None."""
        if not length or len(head) < MIN_SAMPLE:
            return None
        if stream.dtype == "float32" and not length % 4:
            copy = self._copy_for(length, head)
            if copy is None:
                words = np.frombuffer(memoryview(head)[:4 * KEY_WORDS], dtype="<u4")
                self._keys[id(stream)] = {k: codec.pair_rounding(words, k).tobytes()
                                          for k in codec.PAIR_COPIES}
            return copy
        if stream.dtype in codec.PAIR_COPIES and not length % 2:
            return self._master_for(stream.dtype, length, head)
        return None

    def end(self, stream: Stream, length: int, paired: bool) -> None:
        """Tensor ``stream`` ended after ``length`` bytes: a candidate for later tensors
        unless it was ``paired``."""
        keys = self._keys.pop(id(stream), None)
        if paired or not length:
            return
        if stream.dtype in codec.PAIR_COPIES:
            self._copies.setdefault(length, []).append(stream)
        elif keys is not None:
            self._masters.setdefault(length, []).append(stream)
            for kind, key in keys.items():
                self._keyed.setdefault((kind, length // 2, key), []).append(stream)

    def _copy_for(self, length: int, head) -> Stream | None:
        copies = self._copies.get(length // 2)
        n = min(len(head), SAMPLE_BYTES, length) // 4 * 4
        if not copies:
            return None
        sample = bytes(memoryview(head)[:n])
        for i, copy in enumerate(copies[:TRIES]):
            twin = self._head_of(copy, n // 2)
            if twin is not None and len(twin) == n // 2 and \
                    codec.pair_share(sample, twin, copy.dtype) >= PAIR_SHARE:
                del copies[i]
                return copy
        return None

    def _master_for(self, kind: str, length: int, head) -> Stream | None:
        n = min(len(head), SAMPLE_BYTES // 2, length) // 2 * 2
        sample = bytes(memoryview(head)[:n])
        keyed = self._keyed.get((kind, length, sample[:2 * KEY_WORDS]), [])
        tried, seen, by_key = 0, set(self._taken), len(keyed)
        for i, master in enumerate(keyed + self._masters.get(2 * length, [])):
            if id(master) in seen:
                continue
            seen.add(id(master))
            if i >= by_key:                 # no key matched: the first few of its size
                if tried == TRIES:
                    break
                tried += 1
            twin = self._head_of(master, 2 * n)
            if twin is not None and len(twin) == 2 * n and \
                    codec.pair_share(twin, sample, kind) >= PAIR_SHARE:
                self._taken.add(id(master))
                return master
        return None
