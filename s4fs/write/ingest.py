"""The ingest pipeline: bytes in (in order) → segments → chunks → codec → packs → store.

``IngestSession.write`` takes the bytes of one file as they arrive. A stream parser
(``s4fs.parse``) says which ranges are tensor storages and of what dtype; tensor bytes
are cut into element-aligned chunks, every other byte goes to the file's "raw" stream.
Chunks are coded under the chunk rule by a coding pool (``s4fs.coding``: threads of
this process — the codec releases the GIL, the GPU codes batches — or, for a file fed
from a spool, worker processes), appended in order to packs of a few tens of MiB,
and packs are uploaded while the file is still being written. Memory stays bounded: at
most ``max_pending_chunks`` chunks are being coded and ``max_uploads`` packs uploaded.

``finish()`` waits until every pack is durable and returns the manifest; the caller
writes it (the commit). Nothing the session wrote is visible before that.
"""

from __future__ import annotations

import time
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Callable

import xxhash

from s4fs import keys, metrics
from s4fs.codec import PAIR_COPIES
from s4fs.coding import (BaseFile, ChunkBatch, GpuBatches, IngestConfig, Pools,
                         SpoolCoding, ThreadPool, base_chunk, base_streams, pair_step,
                         placement, saw_pack)
from s4fs.errors import CodecError
from s4fs.manifest import ChunkRef, Manifest, ManifestBuilder, Stream
from s4fs.stores import Store
from s4fs.write.pairs import Pairs

__all__ = ["IngestSession", "PackWriter"]


UPLOAD_THREADS = 16     # packs put in the store at once, over every session of an owner


#: a pack's blobs are written ahead to the store (Store.writer) in pieces of this size
#: (at most a quarter of a pack), while the pack fills: at its end only the last piece
#: is left to write
WRITE_AHEAD = 8 << 20
#: in-process coding keeps at most this many bytes of fp32 chunks in memory for a copy
#: saved after its master to be coded on (s4fs.write.pairs)
KEEP_MASTERS = 1 << 30


class _Open:
    """The pack a lane is filling: its blobs, how many of them went to the store ahead
    (``sent``, ``sent_bytes``), and the last write-ahead task (the next waits for it)."""

    __slots__ = ("parts", "size", "key", "sent", "sent_bytes", "out", "tail")

    def __init__(self) -> None:
        self.parts: list[bytes] = []
        self.size = 0
        self.key = keys.new_pack_key()
        self.sent = self.sent_bytes = 0
        self.out = None                     # its ObjectWriter, from the first piece on
        self.tail: Future | None = None


class PackWriter:
    """Appends blobs to packs and uploads full packs in the background. Blobs of
    different *lanes* go to different packs (backward deltas: chunks likely to be
    replaced by deltas later are packed apart, so that their packs die whole).
    ``pools``: whose owner's threads upload the packs (``pools.thread``, shared by every
    session of that runtime); None: threads of this writer's own, ``uploads`` of them,
    stopped by :meth:`finish` and :meth:`abandon`."""

    def __init__(self, store: Store, cfg: IngestConfig, on_pack: Callable | None = None,
                 uploads: int | None = None, *, pools: Pools | None = None):
        self.store, self.cfg = store, cfg
        self._pools = pools
        self._own: ThreadPoolExecutor | None = None     # without pools
        self.max_uploads = uploads or cfg.max_uploads     # packs written at once
        self.keys: list[str] = []
        self._open: dict[int, _Open] = {}
        self._uploads: deque[tuple] = deque()    # (future, its writer, the piece before)
        self._on_pack = on_pack
        self.stored = 0
        self._ahead = max(1, min(WRITE_AHEAD, cfg.pack_size // 4))

    def add(self, blob: bytes, lane: int = 0) -> tuple[str, int]:
        p = self._open.get(lane)
        if p is not None and p.parts and p.size + len(blob) > self.cfg.pack_size:
            self._submit(lane)
            p = None
        if p is None:
            p = self._open[lane] = _Open()
        off = p.size
        p.parts.append(blob)
        p.size += len(blob)
        self.stored += len(blob)
        if p.size - p.sent_bytes >= self._ahead:
            self._write_ahead(p)
        return p.key, off

    def place(self, blob, base: ChunkRef | None, checksum: int, raw: int,
              lane: int = 0) -> ChunkRef:
        """The reference of a coded chunk (what the delta rule returned): ``base``
        itself when the chunk is its base (no blob), else ``blob`` added to a pack of
        ``lane``, as a delta on ``base`` or whole."""
        if blob is None:
            return base
        pack, off = self.add(blob, lane)
        return ChunkRef(pack, off, len(blob), raw, checksum,
                        base.depth + 1 if base is not None else 0, base)

    def _write_ahead(self, p: _Open) -> None:
        """Send ``p``'s blobs not yet sent to its store writer, on an upload thread,
        after the pack's earlier pieces."""
        if p.out is None:
            p.out = self.store.writer(p.key)
        parts, prev, out = p.parts[p.sent:], p.tail, p.out
        p.sent, p.sent_bytes = len(p.parts), p.size

        def piece():
            if prev is not None:
                prev.result()              # pieces in order; a failed one fails the rest
            out.write(parts)
        p.tail = self._threads().submit(piece)

    def _submit(self, lane: int) -> None:
        p = self._open.get(lane)
        if p is None or not p.parts:
            self._open.pop(lane, None)
            return
        while len(self._uploads) >= self.max_uploads:
            self._uploads.popleft()[0].result()     # a failure: the pack stays open
        del self._open[lane]
        key, parts, size = p.key, p.parts, p.size
        out = p.out if p.out is not None else self.store.writer(key)
        rest, prev = parts[p.sent:], p.tail
        self.keys.append(key)
        metrics.uploads_started()

        def upload():
            try:
                if prev is not None:
                    prev.result()
                out.write(rest)
                out.commit()
                if self._on_pack is not None:
                    self._on_pack(key, b"".join(parts))
                saw_pack(self.store, key, size)
            except BaseException:
                out.abort()
                raise
            finally:
                metrics.uploads_finished()
        self._uploads.append((self._threads().submit(upload), out, prev))

    def _threads(self) -> ThreadPoolExecutor:
        if self._pools is not None:
            return self._pools.thread("s4fs-upload", UPLOAD_THREADS)
        if self._own is None:
            self._own = ThreadPoolExecutor(self.max_uploads, thread_name_prefix="s4fs-upload")
        return self._own

    def finish(self) -> None:
        try:
            for lane in list(self._open):
                self._submit(lane)
            while self._uploads:
                self._uploads.popleft()[0].result()
        finally:
            self._stop(wait=True)

    def abandon(self) -> None:
        """Stop: nothing more is stored, and nothing of this writer is being written
        when this returns — a pack whose upload never started is dropped with what was
        written ahead of it, one being uploaded ends first (stored whole, for the
        collector, or dropped)."""
        for f, out, tail in self._uploads:
            if f.cancel():    # a pack whose upload never starts: its pieces are dropped
                _drop(out, tail)
            else:
                _drop(None, f)
        self._uploads.clear()
        for p in self._open.values():
            if p.out is not None:
                _drop(p.out, p.tail)
        self._open.clear()
        self._stop(wait=False)

    def _stop(self, wait: bool) -> None:
        own, self._own = self._own, None
        if own is not None:
            own.shutdown(wait=wait)


def _drop(out, after: Future | None) -> None:
    """Abort ``out`` (None: nothing) once its pieces in flight (``after``) are done."""
    if after is not None:
        try:
            after.result()
        except BaseException:
            pass
    if out is not None:
        out.abort()


@dataclass
class _Pending:
    stream: Stream
    future: Future
    batch: bool = False         # the future holds a one-chunk batch's results
    lane: int = 0               # the packs its blob goes to (PackWriter)


class IngestSession:
    """One file being written. Not thread-safe: one writer calls write()/finish().
    ``pools``: its owner's (``Runtime.pools``): the threads it codes on and uploads its
    packs on; fed from ``spool_path`` with ``cfg.processes``, the worker processes it
    codes in."""

    def __init__(self, store: Store, cfg: IngestConfig = IngestConfig(), *,
                 base: Manifest | None = None, base_path: str | None = None, source=None,
                 parser=None, on_pack: Callable | None = None,
                 spool_path: str | None = None, base_file: str | None = None,
                 label: str = "", pools: Pools | None = None,
                 lanes: frozenset = frozenset()) -> None:
        if parser is None:
            from s4fs.parse import new_parser
            parser = new_parser()
        self.store, self.cfg = store, cfg
        self.parser = parser
        self.packs = PackWriter(store, cfg, on_pack, pools=pools)
        self.size = 0
        self.label = label
        self._written = 0                     # bytes given to write()
        self._hash = xxhash.xxh3_128()        # over the bytes given to write()
        self._routed = xxhash.xxh3_128()      # over the bytes the parser handed back
        self._m = ManifestBuilder()           # the streams and extents so far
        self._raw = self._m.raw
        self._raw_buf = bytearray()
        self._raw_len = 0                     # bytes of the raw stream so far
        self._tensor: Stream | None = None    # tensor stream being filled
        self._tensor_sidx = 0                 # its index
        self._tensor_seg = -1
        self._tensor_buf = bytearray()
        self._tensor_len = 0
        self._tensor_base: list[ChunkRef] | None = None
        self._tensor_pair: Stream | None = None  # the copy the tensor is coded on
        self._pending: deque[_Pending] = deque()
        self._base = base
        self._base_info = {"path": base_path, "id": base.id} if base is not None else None
        self._source = source
        self._base_streams = base_streams(base)
        self._bases = BaseFile(base, base_file)
        # the base chunks whose counterparts are packed apart (PackWriter's lanes)
        self._lanes = lanes
        self._closed = False
        self._stable = False
        self.started = time.time()
        # worker-process coding: the bytes stay in the spool file
        self._proc: SpoolCoding | None = None
        self._threads: ThreadPool | None = None
        self._gpu: GpuBatches | None = None
        where = placement(cfg, spool=spool_path is not None)
        if where.processes:
            # the CPU worker processes, or the GPU worker process
            self._proc = SpoolCoding(store, cfg, pools, spool_path, self._raw, self._bases,
                                     label, lanes)
        else:
            self._threads = ThreadPool(cfg, source, self._bases.path, pools=pools)
            if self._threads.gpu:
                self._gpu = GpuBatches(self._threads)
        # a master and its low-precision copy: the later coded on the earlier (pairs are
        # coded on the CPU: by the CPU workers, the GPU worker process, or this process's
        # threads, not in this process's GPU batches)
        self._pairs = Pairs(self._head) \
            if cfg.pairs and (where.processes or not where.gpu) else None
        # in-process: the chunk bytes of each tensor a later one may be coded on (fp32
        # ones within KEEP_MASTERS bytes)
        self._kept_chunks: dict[int, list] = {}
        self._kept_masters = 0

    # --- input -------------------------------------------------------------------------

    def write(self, data, *, stable: bool = False) -> int:
        """Take the next bytes of the file. ``stable``: ``data`` never changes (an
        immutable ``bytes``), so whole chunks are coded straight from it, not copied."""
        if self._closed:
            raise ValueError("write to a finished ingest session")
        mv = memoryview(data).cast("B")
        self._hash.update(mv)
        self._written += len(mv)
        self._stable = stable
        try:
            self._route(self.parser.feed(mv))
        finally:
            self._stable = False
        return len(mv)

    def _route(self, pieces) -> None:
        for seg, piece in pieces:
            n = len(piece)
            if n == 0:
                continue
            if self._proc is None:
                self._routed.update(piece)
            if seg.kind == "tensor":
                self._tensor_piece(seg, piece)
            else:
                self._end_tensor()
                self._m.place(self.size, n, 0, self._raw_len)
                self._raw_len += n
                if self._proc is not None:
                    self._proc.raw_piece(self.size, piece)
                    self.size += n
                    continue
                self._raw_buf += piece
                while len(self._raw_buf) >= self.cfg.chunk_size:
                    chunk = bytes(self._raw_buf[: self.cfg.chunk_size])
                    del self._raw_buf[: self.cfg.chunk_size]
                    self._emit(self._raw, chunk, "bytes", None)
            self.size += n

    def _tensor_piece(self, seg, piece) -> None:
        if seg.index != self._tensor_seg:
            self._end_tensor()
            self._tensor = Stream("tensor", seg.dtype, seg.name)
            self._tensor_sidx = self._m.add(self._tensor)
            self._tensor_seg = seg.index
            self._tensor_len = 0
            self._tensor_pair = self._pairs.begin(self._tensor, seg.length, piece) \
                if self._pairs is not None else None
            # a pair is coded on its pair, not on its previous version
            self._tensor_base = self._match_base(seg) if self._tensor_pair is None else None
        self._m.place(self.size, len(piece), self._tensor_sidx, self._tensor_len)
        self._tensor_len += len(piece)
        if self._proc is not None:
            self._proc.tensor_piece(self.size, piece, self._tensor, self._tensor_base,
                                    self._tensor_pair)
            return
        step = pair_step(self.cfg.chunk_size, self._tensor.dtype, self._tensor_pair)
        mv = memoryview(piece)
        while len(mv):
            if self._stable and not self._tensor_buf and len(mv) >= step:
                self._emit_tensor(mv[:step])            # zero-copy: a view of the input
                mv = mv[step:]
                continue
            room = step - len(self._tensor_buf)
            self._tensor_buf += mv[:room]
            mv = mv[room:]
            if len(self._tensor_buf) == step:
                self._flush_tensor()

    def _flush_tensor(self) -> None:
        if self._proc is not None:
            self._proc.end_tensor_chunk()
            return
        if not self._tensor_buf:
            return
        self._emit_tensor(bytes(self._tensor_buf))
        self._tensor_buf = bytearray()

    def _emit_tensor(self, chunk) -> None:
        idx = len(self._tensor.chunks) + sum(1 for p in self._pending if p.stream is self._tensor)
        if self._tensor_pair is not None:
            pair = self._pair_of(idx)
            if pair is not None:
                self._emit(self._tensor, chunk, self._tensor.dtype, None, None, pair)
                return
        elif self._pairs is not None and self._keeps(len(chunk)):
            self._kept_chunks.setdefault(id(self._tensor), []).append(chunk)
        base = base_chunk(self._tensor_base, idx)
        where = None
        if base is not None:            # where its bytes lie in the base's local copy
            where = self._bases.range_of(self._tensor_base, idx)
        self._emit(self._tensor, chunk, self._tensor.dtype, base, where)

    def _end_tensor(self) -> None:
        if self._tensor is not None:
            self._flush_tensor()
            if self._pairs is not None:
                self._pairs.end(self._tensor, self._tensor_len,
                                paired=self._tensor_pair is not None)
            self._tensor = None
            self._tensor_pair = None
            self._tensor_seg = -1

    # --- pairs (s4fs.write.pairs) ------------------------------------------------------

    def _head(self, stream: Stream, n: int) -> bytes | None:
        """The first ``n`` bytes of earlier tensor ``stream``."""
        if self._proc is not None:
            return self._proc.head(stream, n)
        chunks = self._kept_chunks.get(id(stream))
        if not chunks:
            return None
        head = bytes(memoryview(chunks[0]).cast("B")[:n])
        return head if len(head) == n else None

    def _keeps(self, n: int) -> bool:
        """Whether the current tensor's next chunk (``n`` bytes) is kept for a later
        tensor to be coded on: a copy's always (half a master's), an fp32 one's within
        KEEP_MASTERS bytes in all (the worker processes read them back from the spool
        instead, with no bound)."""
        if self._tensor.dtype in PAIR_COPIES:
            return True
        if self._tensor.dtype != "float32" or self._kept_masters + n > KEEP_MASTERS:
            return False
        self._kept_masters += n
        return True

    def _pair_of(self, idx: int) -> tuple | None:
        """(dtype, ref, bytes fn) of chunk ``idx`` of the tensor the current one is
        coded on, its reference waited for (it was sent earlier); None past its end."""
        other = self._tensor_pair
        chunks = self._kept_chunks.get(id(other), [])
        if idx >= len(chunks):
            return None
        while len(other.chunks) <= idx and self._pending:
            self._drain_one()
        if len(other.chunks) <= idx:
            return None
        data = chunks[idx]
        return other.dtype, other.chunks[idx], lambda: data

    # --- delta bases -------------------------------------------------------------------

    def _match_base(self, seg) -> Stream | None:
        if not self._base_streams or seg.length is None:
            return None
        return self._base_streams.get((seg.name, seg.dtype, seg.length))

    # --- coding ------------------------------------------------------------------------

    def _emit(self, stream: Stream, data: bytes, dtype: str, base: ChunkRef | None,
              where: tuple[int, int] | None = None, pair: tuple | None = None) -> None:
        limit = self._threads.max_in_flight
        if self._gpu is not None:       # room for one batch coding and the next filling
            limit = max(limit, 2 * self._gpu.batch_chunks)
        while len(self._pending) >= limit:
            self._drain_one()
        lane = int(base is not None and base.key() in self._lanes)
        if self._gpu is not None:
            fut = self._gpu.add(data, dtype, base if self._source is not None else None, where)
            self._pending.append(_Pending(stream, fut, lane=lane))
        else:                           # a batch of one chunk: coded on a codec thread
            item = (data, dtype, base, where) + ((pair,) if pair is not None else ())
            fut = self._threads.submit(ChunkBatch((item,)))
            self._pending.append(_Pending(stream, fut, batch=True, lane=lane))

    def _drain_one(self) -> None:
        p = self._pending.popleft()
        if self._gpu is not None:
            self._gpu.flush_if_holding(p.future)
        res = p.future.result()
        p.stream.chunks.append(self.packs.place(*(res[0] if p.batch else res), lane=p.lane))

    # --- end ---------------------------------------------------------------------------

    def finish(self, *, mode: int = 0o100644, mtime: float | None = None,
               mtime_ns: int | None = None, atime_ns: int | None = None) -> Manifest:
        """Flush everything, wait until every pack is stored, and return the manifest
        (its mtime ``mtime_ns``, else ``mtime`` in seconds, else now)."""
        self._route(self.parser.finish())
        self._end_tensor()
        if self._proc is not None:
            self._proc.finish()
            if self.size != self._written:
                raise CodecError(
                    "internal error: the stream parser did not return the bytes it was "
                    "given; the file was not stored (please report this with the file)")
        if self._raw_buf:
            self._emit(self._raw, bytes(self._raw_buf), "bytes", None)
            self._raw_buf = bytearray()
        if self._gpu is not None:
            self._gpu.flush()
        while self._pending:
            self._drain_one()
        if self._proc is None and self._routed.digest() != self._hash.digest():
            # the parser must hand back exactly the bytes it was fed; never commit otherwise
            raise CodecError(
                "internal error: the stream parser did not return the bytes it was given; "
                "the file was not stored (please report this with the file)")
        self.packs.finish()
        self._closed = True
        names = {}
        try:
            names = dict(self.parser.tensor_names())
        except Exception:
            pass
        return self._m.build(size=self.size, xxh128=self._hash.hexdigest(),
                             kind=getattr(self.parser, "format", "raw"), names=names,
                             own_packs=list(self.packs.keys) +
                             (self._proc.packs if self._proc is not None else []),
                             base=self._base_info, mode=mode, mtime=mtime,
                             mtime_ns=mtime_ns, atime_ns=atime_ns)

    def abort(self) -> None:
        """Give up: nothing becomes visible; uploaded packs are left to the collector."""
        self._closed = True
        for p in self._pending:
            p.future.cancel()
        self._pending.clear()
        if self._gpu is not None:
            self._gpu.drop()
        self.packs.abandon()
        if self._proc is not None:
            self._proc.abort()
