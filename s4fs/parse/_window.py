"""The byte window a push parser reads through, and the emitter of classified pieces.

A :class:`Window` sees the stream as *held* bytes (received earlier, not yet classified;
a private copy) followed by the current ``feed()`` input (the caller's buffer, viewed,
never copied unless it must be held past the call). Parsers look ahead with
:meth:`Window.peek` and classify bytes with :meth:`Window.take`; every byte is taken
exactly once, in order, which is what makes the output lossless by construction.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

# Zip signatures are found by searching for "PK" and checking the next two bytes: on this
# data that is faster than searching for the four-byte signatures themselves.
_PK = re.compile(b"PK")


@dataclass(frozen=True)
class Segment:
    """A classified run of stream bytes; pieces of one segment share this object."""

    index: int                 # 0, 1, 2, ... strictly increasing in stream order
    kind: str                  # "raw" or "tensor"
    dtype: str = "bytes"       # s4fs.codec dtype name for tensors; "bytes" for raw
    name: str | None = None    # stable record name ("data/3", "1:data/3", safetensors key)
    length: int | None = None  # expected byte length of a tensor segment; None for raw


class TensorSpec:
    """What the next tensor segment will be; compared by identity, one per payload."""

    __slots__ = ("dtype", "name", "length")

    def __init__(self, dtype: str, name: str, length: int) -> None:
        self.dtype = dtype
        self.name = name
        self.length = length


RAW = None              # the spec of raw bytes: consecutive raw takes merge
_NOTHING = object()     # the spec before anything was emitted

Piece = tuple[Segment, memoryview]


def as_view(data) -> memoryview:
    """A flat unsigned-byte view of any bytes-like object (copied only if not contiguous)."""
    mv = data if isinstance(data, memoryview) else memoryview(data)
    if mv.format == "B" and mv.ndim == 1 and mv.c_contiguous:
        return mv
    try:
        return mv.cast("B")
    except TypeError:
        return memoryview(mv.tobytes())


class Window:
    def __init__(self) -> None:
        self.held = bytearray()
        self._inp = memoryview(b"")
        self._ipos = 0
        self._out: list[Piece] = []
        self._spec: object = _NOTHING
        self._seg: Segment | None = None
        self._next_index = 0
        self._merge = (-1, -1)     # input range of the last piece, while it can grow
        self.offset = 0            # stream offset of the first byte not yet taken

    # -- call boundaries -------------------------------------------------------------

    def begin(self, data) -> None:
        self._inp = as_view(data)
        self._ipos = 0
        self._merge = (-1, -1)

    def end(self) -> list[Piece]:
        """Finish one call: hold what was not taken (a copy), hand back the pieces."""
        if self._ipos < len(self._inp):
            self.held += self._inp[self._ipos:]
        self._inp = memoryview(b"")
        self._ipos = 0
        self._merge = (-1, -1)
        out, self._out = self._out, []
        return out

    # -- looking ahead -----------------------------------------------------------------

    @property
    def avail(self) -> int:
        return len(self.held) + len(self._inp) - self._ipos

    def peek(self, n: int) -> bytes | None:
        """The next ``n`` bytes (a copy), or None while fewer are available."""
        h = len(self.held)
        if h >= n:
            return bytes(self.held[:n])
        left = len(self._inp) - self._ipos
        if h == 0 and left >= n:
            return self._inp[self._ipos:self._ipos + n].tobytes()
        if h + left < n:
            return None
        self.absorb(n - h)
        return bytes(self.held[:n])

    def ensure(self, n: int) -> bool:
        """Make the next ``n`` bytes contiguous in ``held``; False while fewer exist."""
        h = len(self.held)
        if h >= n:
            return True
        if h + len(self._inp) - self._ipos < n:
            return False
        self.absorb(n - h)
        return True

    def absorb(self, n: int) -> int:
        """Copy up to ``n`` bytes of input into the held buffer; returns how many."""
        k = min(n, len(self._inp) - self._ipos)
        if k > 0:
            self.held += self._inp[self._ipos:self._ipos + k]
            self._ipos += k
            self._merge = (-1, -1)
        return max(k, 0)

    def search(self, tails: frozenset, start: int = 0) -> int:
        """Offset (from the first available byte) of the first ``PK`` followed by one of
        the two-byte ``tails`` (a zip signature), at or after ``start``; -1 if none.

        A ``PK`` too close to the end to read its tail is not reported: callers keep the
        last three bytes back and search again when more arrive."""
        h = len(self.held)
        pos = start
        while pos < h:
            m = _PK.search(self.held, pos)
            if not m:
                break
            if self._two(m.start() + 2) in tails:
                return m.start()
            pos = m.start() + 1
        inp, ipos = self._inp, self._ipos
        if (h and start < h and self.held[-1] == 0x50 and ipos < len(inp)
                and inp[ipos] == 0x4B and self._two(h + 1) in tails):
            return h - 1
        pos = ipos + max(0, start - h)
        while True:
            m = _PK.search(inp, pos)
            if not m:
                return -1
            off = h + m.start() - ipos
            if self._two(off + 2) in tails:
                return off
            pos = m.start() + 1

    def _two(self, off: int) -> bytes:
        """The (up to) two bytes at ``off`` from the first available byte."""
        h = len(self.held)
        if off + 2 <= h:
            return bytes(self.held[off:off + 2])
        head = bytes(self.held[off:]) if off < h else b""
        a = self._ipos + max(0, off - h)
        return head + self._inp[a:a + 2 - len(head)].tobytes()

    # -- classifying -------------------------------------------------------------------

    def take(self, n: int, spec: TensorSpec | None) -> int:
        """Emit up to ``n`` next bytes as ``spec`` (RAW or a tensor); returns how many."""
        taken = 0
        h = len(self.held)
        if h and n > 0:
            k = min(n, h)
            if k == h:
                piece, self.held = self.held, bytearray()
            else:
                piece = self.held[:k]
                del self.held[:k]
            self._emit(spec, memoryview(piece), -1)
            taken = k
        if taken < n:
            k = min(n - taken, len(self._inp) - self._ipos)
            if k > 0:
                a = self._ipos
                self._ipos += k
                self._emit(spec, self._inp[a:a + k], a)
                taken += k
        self.offset += taken
        return taken

    def _emit(self, spec, view: memoryview, start: int) -> None:
        if spec is not self._spec or self._seg is None:
            if spec is RAW:
                seg = Segment(self._next_index, "raw")
            else:
                seg = Segment(self._next_index, "tensor", spec.dtype, spec.name, spec.length)
            self._next_index += 1
            self._seg, self._spec = seg, spec
        elif start >= 0 and start == self._merge[1] and self._out:
            # contiguous with the previous input piece of the same segment: grow it
            a = self._merge[0]
            b = start + len(view)
            self._out[-1] = (self._seg, self._inp[a:b])
            self._merge = (a, b)
            return
        self._out.append((self._seg, view))
        self._merge = (start, start + len(view)) if start >= 0 else (-1, -1)
