"""s4fs.parse — push-style stream parsers that classify checkpoint bytes as they arrive.

The ingest pipeline feeds a file's bytes in order, in pieces of any size, and gets back
``(Segment, memoryview)`` pieces saying which bytes are tensor storages (and their dtype)
and which are raw (zip headers, pickle, anything else)::

    p = new_parser()
    for data in writes:
        for seg, piece in p.feed(data):
            ...                     # seg.kind "tensor" -> s4fs.codec.compress(piece, seg.dtype)
    for seg, piece in p.finish():
        ...

Contract:

* Lossless: the pieces, concatenated in order across every ``feed()`` and ``finish()``,
  are exactly the bytes fed, for any input and any split of it.
* Pieces of one segment share one :class:`Segment` object and are contiguous; segment
  indices strictly increase. Adjacent raw bytes are merged into one raw segment, also
  across calls (the raw segment object of one call may continue in the next).
* A tensor segment's pieces add up to ``length`` bytes unless the stream ends first
  (a truncated file): then the segment is simply shorter, and ``finish()`` emits nothing
  more for it. Empty storages produce no segment.
* The classification (segment kinds, dtypes, names, boundaries) depends only on the
  bytes, never on how they were split into ``feed()`` calls.
* Memory: tensor payloads (and long raw runs) come back as views of the buffer passed
  to ``feed()``, zero-copy; such a view is valid only until the caller's buffer changes,
  so use it (or copy it) before the next call. Pieces of bytes the parser had to hold back
  (headers, ``data.pkl``, small records, a split signature) are private copies that stay
  valid. The parser holds at most about ``ParserLimits.record_cap`` (or ``header_cap``)
  bytes plus what was left of the last ``feed()`` while it waits for more.
* Classification never affects correctness, only the ratio: on anything unexpected the
  parser resynchronises at the next zip signature or classifies the rest as raw. A
  ``data.pkl`` over ``record_cap`` ends tensor-awareness: the rest of that stream is raw.
* ``data.pkl`` is read by an opcode walker that never imports or calls anything.

Formats: ``"torch-zip"`` (torch.save since 1.6, including several archives back to back
as in DCP ``.distcp`` files), ``"safetensors"``, and ``"raw"`` for everything else.
"""

from __future__ import annotations

from s4fs.parse.layout import LOCAL

from ._complete import looks_complete
from ._machine import Machine, ParserLimits
from ._pickle_scan import PickleScan, StorageInfo, itemsize, scan_pickle
from ._safetensors import SafetensorsMachine, looks_like
from ._torchzip import TorchZipMachine
from ._window import RAW, Piece, Segment, Window

__all__ = ["Segment", "StreamParser", "ParserLimits", "new_parser", "scan_pickle",
           "PickleScan", "StorageInfo", "itemsize", "looks_complete"]


class StreamParser:
    """Classifies a byte stream pushed through :meth:`feed`; see the module docstring.

    ``format`` is ``"unknown"`` until the first bytes decide it, then ``"torch-zip"``,
    ``"safetensors"`` or ``"raw"`` (a stream that ended before deciding is ``"raw"``).
    """

    def __init__(self, limits: ParserLimits | None = None) -> None:
        self.format = "unknown"
        self._limits = limits or ParserLimits()
        self._win = Window()
        self._machine: Machine | None = None
        self._finished = False

    @property
    def offset(self) -> int:
        """Bytes classified so far (the stream offset of the next piece)."""
        return self._win.offset

    def feed(self, data) -> list[Piece]:
        """Push the next bytes (any bytes-like object); returns the pieces now classified."""
        if self._finished:
            raise ValueError("feed() after finish(): start a new parser for a new stream")
        self._win.begin(data)
        self._run()
        return self._win.end()

    def finish(self) -> list[Piece]:
        """End of stream: everything still held back comes out (as raw)."""
        if not self._finished:
            self._finished = True
            if self.format == "unknown":
                self.format = "raw"
            self._win.take(self._win.avail, RAW)
        return self._win.end()

    def tensor_names(self) -> dict[str, str]:
        """Segment name -> human tensor name where known (best effort, may be empty)."""
        return self._machine.names() if self._machine is not None else {}

    def _run(self) -> None:
        if self._machine is None and not self._detect():
            return
        while self._machine.step():
            pass

    def _detect(self) -> bool:
        win = self._win
        head = win.peek(4)
        if head is None:
            return False
        if head == LOCAL:
            machine: Machine = TorchZipMachine(win, self._limits)
        else:
            head = win.peek(9)
            if head is None:
                return False
            if looks_like(head, self._limits.header_cap):
                machine = SafetensorsMachine(win, self._limits)
            else:
                machine = Machine(win, self._limits)
        self._machine = machine
        self.format = machine.format
        return True


def new_parser(limits: ParserLimits | None = None) -> StreamParser:
    """A parser for one stream."""
    return StreamParser(limits)
