"""The byte window a push parser reads through, and the emitter of classified pieces.

A :class:`Window` sees the stream as *held* bytes (received earlier, not yet classified;
a private copy) followed by the current ``feed()`` input (the caller's buffer, viewed,
never copied unless it must be held past the call). Parsers look ahead with
:meth:`Window.peek` and classify bytes with :meth:`Window.take`; every byte is taken
exactly once, in order, which is what makes the output lossless by construction.
"""

from __future__ import annotations

from dataclasses import dataclass

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
    if mv.format == "B" and mv.ndim == 1:
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

    def search(self, pattern, start: int = 0, width: int = 4) -> int:
        """Offset (from the first available byte) of the first match of a compiled
        bytes regex whose matches are ``width`` bytes long, at or after ``start``; -1."""
        h = len(self.held)
        if start < h:
            m = pattern.search(self.held, start)
            if m:
                return m.start()
            if self._ipos < len(self._inp):
                js = max(start, h - (width - 1))
                junction = bytes(self.held[js:]) + \
                    self._inp[self._ipos:self._ipos + width - 1].tobytes()
                m = pattern.search(junction)
                if m and m.start() < h - js:
                    return js + m.start()
        m = pattern.search(self._inp, self._ipos + max(0, start - h))
        return h + m.start() - self._ipos if m else -1

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
