"""The daemon's side of coding in worker processes: a file fed from a spool file
becomes batches of spool byte ranges (never the bytes), sent to the process pool
(:meth:`s4fs.coding.Pools.for_ingest`), and the answers become chunk references. The
daemon keeps only hashes and positions."""

from __future__ import annotations

import pickle
from collections import deque
from concurrent.futures import Future

import xxhash

from s4fs import keys
from s4fs.codec import PAIR_COPIES
from s4fs.coding._bases import BaseFile, base_chunk, note_unreadable_base, saw_pack
from s4fs.coding._config import IngestConfig, placement
from s4fs.coding._jobs import Item, Job
from s4fs.coding._pools import Pools
from s4fs.coding._rule import DELTA, PAIR, SAME, pair_step
from s4fs.coding._worker import read_ranges
from s4fs.manifest import ChunkRef, Stream


class _Chunk:
    """A chunk being gathered for a worker: its spool ranges and a running hash."""

    __slots__ = ("ranges", "length", "hasher")

    def __init__(self) -> None:
        self.ranges: list[tuple[int, int]] = []
        self.length = 0
        self.hasher = xxhash.xxh3_64()

    def add(self, offset: int, piece) -> None:
        n = len(piece)
        if self.ranges and sum(self.ranges[-1]) == offset:
            o, m = self.ranges[-1]
            self.ranges[-1] = (o, m + n)
        else:
            self.ranges.append((offset, n))
        self.length += n
        self.hasher.update(piece)


class _Batch:
    __slots__ = ("items", "left", "nbytes", "key", "future", "result", "lane")

    def __init__(self, lane: int = 0) -> None:
        self.items: list = []
        self.left = 0                   # its chunks not yet given their reference
        self.nbytes = 0
        self.key = ""
        self.future: Future | None = None
        self.result = None
        self.lane = lane


class SpoolCoding:
    """The worker-process side of one file fed from a spool file: chunks become spool
    byte ranges, batched (one pack per batch), and each chunk's reference is appended to
    its stream in order as the batches come back.

    ``raw`` is the file's raw stream; tensor pieces name their stream and its base
    stream (``bases``: where the base version's chunks lie in its decoded copy);
    ``label`` names the file in errors; ``pools``: where the worker processes are.
    ``lanes``: the base chunks (keys) whose counterparts go to packs of their own
    (backward deltas: the chunks likely to be replaced by deltas later, so that their
    packs die whole). ``packs`` lists the packs written."""

    def __init__(self, store, cfg: IngestConfig, pools: Pools, spool_path: str,
                 raw: Stream, bases: BaseFile, label: str = "",
                 lanes: frozenset = frozenset()) -> None:
        self.store, self.cfg, self.label = store, cfg, label
        self.pool = pools.for_ingest(cfg)
        self.batch_bytes = placement(cfg).batch_bytes(cfg)
        self.store_spec = pickle.dumps(store)
        self.spool = spool_path
        self._bases = bases
        self.base_file = bases.path
        self.packs: list[str] = []
        self._pending: deque = deque()      # (stream, batch, index, raw, checksum, base)
        self._lanes = lanes
        self._batches = [_Batch(0), _Batch(1)]   # one being filled per lane
        self._submitted: deque[_Batch] = deque()
        self._raw_stream = raw
        self._raw = _Chunk()
        self._tensor = _Chunk()
        self._tensor_stream: Stream | None = None
        self._tensor_base: Stream | None = None
        self._tensor_pair: Stream | None = None  # the tensor the current one is coded on
        self._tensor_idx = 0                # chunks emitted for the current tensor
        # the spool ranges of each chunk of the bf16, fp16 and fp32 tensors (a later
        # tensor may be their pair: s4fs.write.pairs), by id of their stream
        self._kept_ranges: dict[int, list] = {}

    # --- pieces in -------------------------------------------------------------------

    def raw_piece(self, offset: int, piece) -> None:
        self._cut(offset, piece, "_raw", self._emit_raw)

    def tensor_piece(self, offset: int, piece, stream: Stream, base: Stream | None,
                     pair: Stream | None = None) -> None:
        """``piece`` of tensor ``stream`` (coded against ``base``, a stream of the base
        version, if any; or on ``pair``, the master or the low-precision copy of this
        tensor earlier in the file) lies at ``offset`` of the spool."""
        self._tensor_stream, self._tensor_base, self._tensor_pair = stream, base, pair
        step = pair_step(self.cfg.chunk_size, stream.dtype, pair)
        self._cut(offset, piece, "_tensor", self._emit_tensor, step)

    def head(self, stream: Stream, n: int) -> bytes | None:
        """The first ``n`` bytes of earlier tensor ``stream`` (from the spool)."""
        ranges, got = [], 0
        for chunk in self._kept_ranges.get(id(stream), []):
            for o, m in chunk:
                take = min(m, n - got)
                if take > 0:
                    ranges.append((o, take))
                    got += take
        return read_ranges(self.spool, ranges) if got == n else None

    def _cut(self, offset: int, piece, which: str, emit, step: int = 0) -> None:
        """Add ``piece`` (at spool ``offset``) to the chunk ``which``; each time it is
        ``step`` bytes long (default: the chunk size), ``emit`` sends it off and starts
        the next."""
        step = step or self.cfg.chunk_size
        mv = memoryview(piece)
        while len(mv):
            chunk = getattr(self, which)
            take = mv[: step - chunk.length]
            chunk.add(offset, take)
            offset += len(take)
            mv = mv[len(take):]
            if chunk.length == step:
                emit()

    def _emit_raw(self) -> None:
        self._emit(self._raw_stream, self._raw, "bytes", None, None)
        self._raw = _Chunk()

    def end_tensor_chunk(self) -> None:
        """The current tensor ends: its last, shorter chunk goes too."""
        if self._tensor.length:
            self._emit_tensor()
        self._tensor_idx = 0

    def _emit_tensor(self) -> None:
        stream = self._tensor_stream
        pair = self._pair_of(self._tensor_idx) if self._tensor_pair is not None else None
        if pair is not None:
            self._emit(stream, self._tensor, stream.dtype, pair[2], None, pair)
        else:
            base = base_chunk(self._tensor_base, self._tensor_idx)
            where = (self._bases.range_of(self._tensor_base, self._tensor_idx)
                     if base is not None else None)
            if stream.dtype in PAIR_COPIES or stream.dtype == "float32":
                self._kept_ranges.setdefault(id(stream), []).append(
                    tuple(self._tensor.ranges))
            self._emit(stream, self._tensor, stream.dtype, base, where)
        self._tensor_idx += 1
        self._tensor = _Chunk()

    # --- batches ---------------------------------------------------------------------

    def _pair_of(self, idx: int) -> tuple | None:
        """(dtype, spool ranges, ChunkRef) of chunk ``idx`` of the tensor the current one
        is coded on — its reference known once its batch is back, so waited for here (it
        came earlier in the file: its batches are among the first in flight)."""
        other = self._tensor_pair
        ranges = self._kept_ranges.get(id(other), [])
        if idx >= len(ranges):
            return None
        while len(other.chunks) <= idx and self._pending:
            self._drain_one()
        if len(other.chunks) <= idx:
            return None
        return other.dtype, ranges[idx], other.chunks[idx]

    def _emit(self, stream: Stream, chunk: _Chunk, dtype: str, base, where,
              pair: tuple | None = None) -> None:
        """``pair``: the chunk's pair (``_pair_of``); ``base`` is then the pair's ref."""
        sum_ = chunk.hasher.intdigest()
        lane = int(base is not None and base.key() in self._lanes)
        b = self._batches[lane]
        b.items.append(Item(tuple(chunk.ranges), dtype, sum_,
                            None if pair is not None else base, where, pair))
        b.nbytes += chunk.length
        b.left += 1
        self._pending.append((stream, b, len(b.items) - 1, chunk.length, sum_, base))
        if b.nbytes >= self.batch_bytes or len(b.items) >= 1024:
            self._submit(lane)

    def _submit(self, lane: int, wait: bool = True) -> None:
        """Send ``lane``'s batch; ``wait``: first for room among the batches in flight
        (not when a chunk being given its reference needs this very batch)."""
        b = self._batches[lane]
        if not b.items:
            return
        while wait and len(self._submitted) >= self.pool.max_in_flight:
            self._drain_oldest()
        b = self._batches[lane]
        if not b.items:              # the draining had to send it already
            return
        self._batches[lane] = _Batch(lane)
        b.key = keys.new_pack_key()
        b.future = self.pool.submit(Job(self.store_spec, self.spool, b.key, tuple(b.items),
                                        self.base_file, self.cfg))
        self._submitted.append(b)

    def _drain_oldest(self) -> None:
        b = self._submitted[0]
        while b.left:
            self._drain_one()        # in file order: the chunks before b's last ones too

    def _drain_one(self) -> None:
        if self._pending[0][1].future is None:   # still being filled (its lane's): send it
            self._submit(self._pending[0][1].lane, wait=False)
        stream, b, i, raw, sum_, base = self._pending.popleft()
        if b.result is None:
            b.result = self.pool.result(b.future, repr(self.label or self.spool))
            if b.result.stored:
                self.packs.append(b.key)
                saw_pack(self.store, b.key, b.result.stored)
            for what, why in b.result.notes:
                note_unreadable_base(what, why)
        r = b.result.items[i]
        if r.kind == SAME:
            ref = base
        elif r.kind in (DELTA, PAIR):     # on the base version's chunk, or the copy
            ref = ChunkRef(b.key, r.offset, r.stored, raw, sum_, base.depth + 1, base)
        else:
            ref = ChunkRef(b.key, r.offset, r.stored, raw, sum_, 0, None)
        stream.chunks.append(ref)
        b.left -= 1
        if not b.left:
            self._submitted.remove(b)

    def finish(self) -> None:
        """Send what is left and wait until every batch's pack is stored."""
        if self._raw.length:
            self._emit_raw()
        self._submit(0)
        self._submit(1)
        while self._pending:
            self._drain_one()

    def abort(self) -> None:
        for b in self._submitted:
            if b.future is not None:
                b.future.cancel()
        self._submitted.clear()
        self._pending.clear()
