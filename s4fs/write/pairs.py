"""Pairs within one file: an fp32 tensor stored on a low-precision copy of it that the
same file holds earlier.

Mixed-precision training keeps each weight twice — the bf16 (or fp16) copy the model
computes with and the fp32 master the optimizer updates — and saves both, the model
first (Megatron's ``model`` beside ``optimizer['fp32_from_fp16_params']``, a hand-written
loop's ``{"model": ..., "optimizer": ..., "master": ...}``). Given the copy, a master
word is known but for its place within half a step of the copy's precision, so the
master's chunks are coded on the copy's (``s4fs.codec._pair``) and cost about their low
half; the copy is stored as before and reads on its own (a job that loads only the
model fetches none of the masters). docs/DELTA.md says why this direction.

Which tensors pair is found from the bytes, never from names: a copy is a bf16 or fp16
tensor, a master an fp32 one of twice its bytes saved after it; among the copies of
that size not yet paired, the first whose values a sample of the master's first bytes
rounds to (``PAIR_SHARE`` of the words within half a step) is taken. Each chunk is then
coded on its copy only where it pays (``s4fs.coding.code_pair``): a wrong guess costs
the sample, never bytes or correctness.
"""

from __future__ import annotations

from typing import Callable

from s4fs import codec
from s4fs.coding import PAIR_SHARE
from s4fs.manifest import Stream

#: the most bytes of a master's first piece sampled to find its copy
SAMPLE_BYTES = 64 << 10
#: a master's first piece must hold this many bytes to be matched (else: no pair)
MIN_SAMPLE = 256
#: copies of one size tried per master
TRIES = 8


class Pairs:
    """The low-precision tensors of one file seen so far, and which fp32 tensor each is
    the copy of. ``head_of(stream, n)``: the first ``n`` bytes of a copy (None where
    they cannot be had)."""

    def __init__(self, head_of: Callable[[Stream, int], bytes | None]) -> None:
        self._head_of = head_of
        self._copies: dict[int, list[Stream]] = {}   # byte length -> unpaired copies

    def copy_done(self, stream: Stream, length: int) -> None:
        """Tensor ``stream`` (``length`` bytes) ended: a copy candidate if low-precision."""
        if stream.dtype in codec.PAIR_COPIES and length:
            self._copies.setdefault(length, []).append(stream)

    def match(self, dtype: str, length: int | None, head) -> Stream | None:
        """The copy a new tensor of ``dtype`` and ``length`` bytes, whose first bytes are
        ``head``, is the master of; None where it is none's."""
        if dtype != "float32" or not length or length % 4:
            return None
        copies = self._copies.get(length // 2)
        n = min(len(head), SAMPLE_BYTES, length) // 4 * 4
        if not copies or n < MIN_SAMPLE:
            return None
        sample = bytes(memoryview(head)[:n])
        for i, copy in enumerate(copies[:TRIES]):
            twin = self._head_of(copy, n // 2)
            if twin is not None and len(twin) == n // 2 and \
                    codec.pair_share(sample, twin, copy.dtype) >= PAIR_SHARE:
                del copies[i]
                return copy
        return None
