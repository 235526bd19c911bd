"""The ingest pipeline: bytes in (in order) → segments → chunks → codec → packs → store.

``IngestSession.write`` takes the bytes of one file as they arrive. A stream parser
(``s4fs.parse``) says which ranges are tensor storages and of what dtype; tensor bytes
are cut into element-aligned chunks, every other byte goes to the file's "raw" stream.
Chunks are coded on a worker pool (the codec releases the GIL; the GPU codec plugs in
through ``s4fs.codec``'s device choice), appended in order to packs of a few tens of MiB,
and packs are uploaded while the file is still being written. Memory stays bounded: at
most ``max_pending_chunks`` chunks are being coded and ``max_uploads`` packs uploaded.

``finish()`` waits until every pack is durable and returns the manifest; the caller
writes it (the commit). Nothing the session wrote is visible before that.
"""

from __future__ import annotations

import os
import pickle
import time
import uuid
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Callable

import xxhash

from s4fs import codec, keys, metrics
from s4fs.codec import _device
from s4fs.delta import note_unreadable_base, readable_base, saw_pack
from s4fs.errors import CodecError
from s4fs.manifest import ChunkRef, Manifest, Stream, seconds_to_ns
from s4fs.stores import Store


@dataclass(frozen=True)
class IngestConfig:
    chunk_size: int = 4 << 20          # raw bytes per chunk (a multiple of every itemsize)
    pack_size: int = 32 << 20          # stored bytes per pack object
    workers: int = max(2, os.cpu_count() or 2)
    max_pending_chunks: int = 0        # chunks being coded at once; 0: twice the workers
    max_uploads: int = 4
    # "cpu", "cuda" or "auto" (the GPU when one is usable: s4fs.codec._device.pipeline).
    # On the GPU, chunks are coded in batches of about gpu_batch_bytes by one worker on
    # the process's GPU thread (s4fs.gpu_worker); the API keeps the CPU unless asked.
    device: str = "cpu"
    gpu_batch_bytes: int = 64 << 20
    # the GPU profile's name (s4fs.codec.gpu.PROFILES): "default" codes planes with nvCOMP
    # ANS (a GPU decodes them); "portable" writes blobs any CPU decodes
    gpu_profile: str = "default"
    # background coding yields the CPU to the training job and to the FUSE requests it
    # waits on (a nice value for the coding threads; 0 keeps the normal priority)
    nice: int = 10
    max_delta_depth: int = 4           # a delta chain never grows past this
    delta_min_gain: float = 0.9        # keep a delta only if <= this fraction of full size
    # A session fed from a spool file codes in worker processes (s4fs.workers) when
    # this is set (the mount sets it): chunks are sent as spool byte ranges in batches
    # of about batch_bytes, one pack each.
    processes: bool = False
    batch_bytes: int = 16 << 20


FULL, DELTA, SAME = 0, 1, 2        # how a chunk is stored: coded whole, as a delta, reused


def code_chunk(data, dtype: str, checksum: int, base: ChunkRef | None, base_bytes,
               cfg: IngestConfig, device: str | None = None) -> tuple[bytes, int]:
    """Code one chunk: ``(blob, FULL)``, ``(delta, DELTA)`` against ``base`` (whose raw
    bytes ``base_bytes()`` returns), or ``(b"", SAME)`` when it equals its base. A delta
    is kept when it is tiny, or no larger than ``cfg.delta_min_gain`` of the full coding.
    The one rule for both the in-process pool and the worker processes (s4fs.workers)."""
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
    length)`` (what :meth:`PackWriter.place` takes): no blob when the chunk is its
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


def base_streams(base: Manifest | None) -> dict:
    """The base version's tensor streams by (record name, dtype, length): a new
    tensor's chunks are coded against those of the stream with its key."""
    if base is None:
        return {}
    return {(s.name, s.dtype, s.length): s for s in base.streams
            if s.kind == "tensor" and s.name is not None}


def base_chunk(base: Stream | None, idx: int) -> ChunkRef | None:
    """Chunk ``idx`` of a base stream (one of :func:`base_streams`), if it has one."""
    if base is not None and idx < len(base.chunks):
        return base.chunks[idx]
    return None


def lower_priority(nice: int) -> None:
    """Give the calling thread (Linux: threads have their own nice value) a lower CPU
    priority; a no-op where that is not possible."""
    if nice <= 0:
        return
    try:
        import threading
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), nice)
    except (AttributeError, OSError):
        pass


class _Pools:
    """Process-wide thread pools shared by every session (codec work and uploads)."""

    _codec: ThreadPoolExecutor | None = None
    _upload: ThreadPoolExecutor | None = None

    @classmethod
    def codec(cls, workers: int, nice: int = 0) -> ThreadPoolExecutor:
        if cls._codec is None:
            cls._codec = ThreadPoolExecutor(workers, thread_name_prefix="s4fs-codec",
                                            initializer=lower_priority, initargs=(nice,))
        return cls._codec

    @classmethod
    def upload(cls) -> ThreadPoolExecutor:
        if cls._upload is None:
            cls._upload = ThreadPoolExecutor(16, thread_name_prefix="s4fs-upload")
        return cls._upload


class PackWriter:
    """Appends blobs to packs and uploads full packs in the background."""

    def __init__(self, store: Store, cfg: IngestConfig, on_pack: Callable | None = None,
                 uploads: int | None = None):
        self.store, self.cfg = store, cfg
        self.max_uploads = uploads or cfg.max_uploads     # packs written at once
        self.keys: list[str] = []
        self._buf: list[bytes] = []
        self._buf_len = 0
        self._key = keys.new_pack_key()
        self._uploads: deque[Future] = deque()
        self._on_pack = on_pack
        self.stored = 0

    def add(self, blob: bytes) -> tuple[str, int]:
        if self._buf and self._buf_len + len(blob) > self.cfg.pack_size:
            self._submit()
        off = self._buf_len
        self._buf.append(blob)
        self._buf_len += len(blob)
        self.stored += len(blob)
        return self._key, off

    def place(self, blob, base: ChunkRef | None, checksum: int, raw: int) -> ChunkRef:
        """The reference of a coded chunk (what the delta rule returned): ``base``
        itself when the chunk is its base (no blob), else ``blob`` added to a pack, as a
        delta on ``base`` or whole."""
        if blob is None:
            return base
        pack, off = self.add(blob)
        return ChunkRef(pack, off, len(blob), raw, checksum,
                        base.depth + 1 if base is not None else 0, base)

    def _submit(self) -> None:
        if not self._buf:
            return
        key, parts = self._key, self._buf
        self.keys.append(key)
        self._buf, self._buf_len = [], 0
        self._key = keys.new_pack_key()
        while len(self._uploads) >= self.max_uploads:
            self._uploads.popleft().result()
        metrics.uploads_started()

        def upload():
            try:
                if self._on_pack is None:
                    self.store.put_parts(key, parts)        # no joined copy of the pack
                else:
                    data = b"".join(parts)
                    self.store.put(key, data)
                    self._on_pack(key, data)
                saw_pack(self.store, key, sum(memoryview(p).nbytes for p in parts))
            finally:
                metrics.uploads_finished()
        self._uploads.append(_Pools.upload().submit(upload))

    def finish(self) -> None:
        self._submit()
        while self._uploads:
            self._uploads.popleft().result()

    def abandon(self) -> None:
        for f in self._uploads:
            f.cancel()
        self._uploads.clear()


@dataclass
class _Pending:
    stream: Stream
    future: Future


class IngestSession:
    """One file being written. Not thread-safe: one writer calls write()/finish()."""

    def __init__(self, store: Store, cfg: IngestConfig = IngestConfig(), *,
                 base: Manifest | None = None, base_path: str | None = None, source=None,
                 parser=None, on_pack: Callable | None = None,
                 spool_path: str | None = None, base_file: str | None = None,
                 label: str = "") -> None:
        if parser is None:
            from s4fs.parse import new_parser
            parser = new_parser()
        self.store, self.cfg = store, cfg
        self.parser = parser
        self.packs = PackWriter(store, cfg, on_pack)
        self.size = 0
        self.label = label
        self._written = 0                     # bytes given to write()
        self._hash = xxhash.xxh3_128()        # over the bytes given to write()
        self._routed = xxhash.xxh3_128()      # over the bytes the parser handed back
        self._raw = Stream("raw")
        self._streams: list[Stream] = [self._raw]
        self._extents: list[list[int]] = []
        self._raw_buf = bytearray()
        self._raw_len = 0                     # bytes of the raw stream so far
        self._tensor: Stream | None = None    # tensor stream being filled
        self._tensor_seg = -1
        self._tensor_buf = bytearray()
        self._tensor_len = 0
        self._tensor_base: list[ChunkRef] | None = None
        self._pending: deque[_Pending] = deque()
        self._base = base
        self._base_info = {"path": base_path, "id": base.id} if base is not None else None
        self._source = source
        self._base_streams = base_streams(base)
        self._closed = False
        self._stable = False
        self.started = time.time()
        # worker-process coding (s4fs.workers): the bytes stay in the spool file
        self._proc = None
        self._gpu = None
        if spool_path is not None and cfg.processes:
            # the CPU worker processes, or the GPU worker process (s4fs.gpu_pool)
            self._proc = _ProcessCoding(self, spool_path, base_file)
        elif _device.pipeline(cfg.device) == "cuda":
            from s4fs.gpu_worker import GpuCoding
            self._gpu = GpuCoding(self, _BaseFile(base, base_file))

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
                self._extend(0, self._raw_len, n)
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

    def _extend(self, sidx: int, soff: int, n: int) -> None:
        if self._extents:
            last = self._extents[-1]
            if last[2] == sidx and last[3] + last[1] == soff and last[0] + last[1] == self.size:
                last[1] += n
                return
        self._extents.append([self.size, n, sidx, soff])

    def _tensor_piece(self, seg, piece) -> None:
        if seg.index != self._tensor_seg:
            self._end_tensor()
            self._tensor = Stream("tensor", seg.dtype, seg.name)
            self._streams.append(self._tensor)
            self._tensor_seg = seg.index
            self._tensor_len = 0
            self._tensor_base = self._match_base(seg)
        sidx = len(self._streams) - 1
        self._extend(sidx, self._tensor_len, len(piece))
        self._tensor_len += len(piece)
        if self._proc is not None:
            self._proc.tensor_piece(self.size, piece)
            return
        step = self.cfg.chunk_size
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
        base = self._base_chunk(idx)
        where = None
        if self._gpu is not None and base is not None:
            where = self._gpu.bases.range_of(self._tensor_base, idx)
        self._emit(self._tensor, chunk, self._tensor.dtype, base, where)

    def _base_chunk(self, idx: int) -> ChunkRef | None:
        return base_chunk(self._tensor_base, idx)

    def _end_tensor(self) -> None:
        if self._tensor is not None:
            self._flush_tensor()
            self._tensor = None
            self._tensor_seg = -1

    # --- delta bases -------------------------------------------------------------------

    def _match_base(self, seg) -> Stream | None:
        if not self._base_streams or seg.length is None:
            return None
        return self._base_streams.get((seg.name, seg.dtype, seg.length))

    # --- coding ------------------------------------------------------------------------

    def _emit(self, stream: Stream, data: bytes, dtype: str, base: ChunkRef | None,
              where: tuple[int, int] | None = None) -> None:
        limit = self.cfg.max_pending_chunks or 2 * self.cfg.workers
        if self._gpu is not None:       # room for one batch coding and the next filling
            limit = max(limit, 2 * self._gpu.batch_chunks)
        while len(self._pending) >= limit:
            self._drain_one()
        if self._gpu is not None:
            fut = self._gpu.add(data, dtype, base if self._source is not None else None, where)
        else:
            fut = _Pools.codec(self.cfg.workers, self.cfg.nice).submit(self._encode, data,
                                                                      dtype, base)
        self._pending.append(_Pending(stream, fut))

    def _encode(self, data: bytes, dtype: str, base: ChunkRef | None):
        """Runs on the codec pool. Returns (blob | None, base ref | None, checksum, raw)."""
        sum_ = codec.checksum(data)
        if self._source is None:
            base = None
        return chunk_result(data, dtype, sum_, base, (lambda: self._source.get(base)),
                            self.cfg)

    def _drain_one(self) -> None:
        p = self._pending.popleft()
        if self._gpu is not None:
            self._gpu.flush_if_holding(p.future)
        p.stream.chunks.append(self.packs.place(*p.future.result()))

    # --- end ---------------------------------------------------------------------------

    def finish(self, *, mode: int = 0o100644, mtime: float | None = None,
               mtime_ns: int | None = None, atime_ns: int | None = None) -> Manifest:
        """Flush everything, wait until every pack is stored, and return the manifest
        (its mtime ``mtime_ns``, else ``mtime`` in seconds, else now)."""
        self._route(self.parser.finish())
        self._end_tensor()
        if self._proc is not None:
            self._proc.finish()
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
        streams = self._streams
        now = time.time_ns()
        if mtime_ns is None:
            mtime_ns = now if mtime is None else seconds_to_ns(mtime)
        return Manifest(size=self.size, xxh128=self._hash.hexdigest(),
                        mtime=mtime_ns / 1e9, mtime_ns=mtime_ns, atime_ns=atime_ns,
                        ctime_ns=now, mode=mode,
                        kind=getattr(self.parser, "format", "raw"), id=uuid.uuid4().hex,
                        streams=streams, extents=[tuple(e) for e in self._extents],
                        names=names, own_packs=list(self.packs.keys) +
                        (self._proc.packs if self._proc is not None else []),
                        base=self._base_info)

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


class _BaseFile:
    """Where the chunks of the base version lie in its decoded copy on local disk (the
    file a delta's base bytes are read from, instead of decoding them again)."""

    def __init__(self, base: Manifest | None, path: str | None) -> None:
        self.path = path if base is not None else None
        self._ext: dict[int, list[tuple[int, int, int]]] = {}
        self._idx: dict[int, int] = {}
        if self.path is not None:
            for foff, n, sidx, soff in base.extents:
                self._ext.setdefault(sidx, []).append((soff, foff, n))
            self._idx = {id(st): i for i, st in enumerate(base.streams)}

    def range_of(self, stream: Stream | None, idx: int) -> tuple[int, int] | None:
        """(file offset, length) of chunk ``idx`` of base ``stream``, if in one extent."""
        if not self._ext or stream is None:
            return None
        sidx = self._idx.get(id(stream))
        soff = stream.starts()[idx]
        n = stream.chunks[idx].raw
        for es, fo, en in self._ext.get(sidx, ()):
            if es <= soff and soff + n <= es + en:
                return (fo + soff - es, n)
        return None


def base_bytes(fd: int | None, where: tuple[int, int] | None, base: ChunkRef,
               source) -> bytes:
    """The verified raw bytes of chunk ``base``: from the base version's decoded copy
    (:func:`base_from_file`) when it holds them intact, else from ``source`` (a
    ChunkSource: the store, decoded and checked)."""
    data = base_from_file(fd, where, base)
    return data if data is not None else source.get(base)


def base_from_file(fd: int | None, where: tuple[int, int] | None,
                   base: ChunkRef) -> bytes | None:
    """The raw bytes of chunk ``base`` read at ``where`` (offset, length) in the base
    version's decoded copy open at ``fd``, or None when that copy cannot give them intact
    (no copy, short read, an error, or bytes that fail the manifest's checksum)."""
    if fd is None or where is None:
        return None
    off, n = where
    parts, got = [], 0
    try:
        while got < n:
            more = os.pread(fd, n - got, off + got)
            if not more:
                return None
            parts.append(more)
            got += len(more)
    except OSError:
        return None
    data = parts[0] if len(parts) == 1 else b"".join(parts)
    if len(data) != base.raw or codec.checksum(data) != base.checksum:
        return None
    return data


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
    __slots__ = ("items", "pending", "nbytes", "key", "future", "result")

    def __init__(self) -> None:
        self.items: list = []
        self.nbytes = 0
        self.key = ""
        self.future: Future | None = None
        self.result = None


def coding_pool(cfg: IngestConfig):
    """The process pool that codes and decodes ahead for a mount (``cfg.processes``):
    the CPU worker processes (s4fs.workers), or the GPU worker process (s4fs.gpu_pool)
    where ``cfg.device`` puts the pipeline on the GPU."""
    if _device.pipeline(cfg.device) == "cuda":
        from s4fs import gpu_pool
        return gpu_pool.pool(cfg.nice)
    from s4fs import workers
    return workers.pool(cfg.workers, cfg.nice)


class _ProcessCoding:
    """The worker-process side of a session fed from a spool file (s4fs.workers): chunks
    become spool byte ranges, batched; the daemon keeps only hashes and positions."""

    def __init__(self, session: "IngestSession", spool_path: str,
                 base_file: str | None) -> None:
        self.s = session
        self.cfg = session.cfg
        self.pool = coding_pool(self.cfg)
        self.batch_bytes = (self.cfg.gpu_batch_bytes if _device.pipeline(self.cfg.device)
                            == "cuda" else self.cfg.batch_bytes)
        self.store_spec = pickle.dumps(session.store)
        self.spool = spool_path
        self._bases = _BaseFile(session._base, base_file)
        self.base_file = self._bases.path
        self.packs: list[str] = []
        self._pending: deque = deque()      # (stream, batch, index, raw, checksum, base)
        self._batch = _Batch()
        self._submitted: deque[_Batch] = deque()
        self._raw = _Chunk()
        self._tensor = _Chunk()
        self._tensor_idx = 0                # chunks emitted for the current tensor

    # --- pieces in -------------------------------------------------------------------

    def raw_piece(self, offset: int, piece) -> None:
        self._cut(offset, piece, "_raw", self._emit_raw)

    def tensor_piece(self, offset: int, piece) -> None:
        self._cut(offset, piece, "_tensor", self._emit_tensor)

    def _cut(self, offset: int, piece, which: str, emit) -> None:
        """Add ``piece`` (at spool ``offset``) to the chunk ``which``; each time it is
        full, ``emit`` sends it off and starts the next."""
        step = self.cfg.chunk_size
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
        self._emit(self.s._raw, self._raw, "bytes", None, None)
        self._raw = _Chunk()

    def end_tensor_chunk(self) -> None:
        """The current tensor ends: its last, shorter chunk goes too."""
        if self._tensor.length:
            self._emit_tensor()
        self._tensor_idx = 0

    def _emit_tensor(self) -> None:
        base = self.s._base_chunk(self._tensor_idx)
        where = self._base_range(self._tensor_idx) if base is not None else None
        self._emit(self.s._tensor, self._tensor, self.s._tensor.dtype, base, where)
        self._tensor_idx += 1
        self._tensor = _Chunk()

    def _base_range(self, idx: int) -> tuple[int, int] | None:
        return self._bases.range_of(self.s._tensor_base, idx)

    # --- batches ---------------------------------------------------------------------

    def _emit(self, stream: Stream, chunk: _Chunk, dtype: str, base, where) -> None:
        from s4fs.workers import Item
        sum_ = chunk.hasher.intdigest()
        b = self._batch
        b.items.append(Item(tuple(chunk.ranges), dtype, sum_, base, where))
        b.nbytes += chunk.length
        self._pending.append((stream, b, len(b.items) - 1, chunk.length, sum_, base))
        if b.nbytes >= self.batch_bytes or len(b.items) >= 1024:
            self._submit()

    def _submit(self) -> None:
        from s4fs.workers import Job
        b = self._batch
        if not b.items:
            return
        self._batch = _Batch()
        while len(self._submitted) >= self.pool.max_in_flight:
            self._drain_oldest()
        b.key = keys.new_pack_key()
        b.future = self.pool.submit(Job(self.store_spec, self.spool, b.key, tuple(b.items),
                                        self.base_file, self.cfg))
        self._submitted.append(b)

    def _drain_oldest(self) -> None:
        b = self._submitted[0]
        while self._submitted and self._submitted[0] is b:
            self._drain_one()                 # pops the batch with its last chunk

    def _drain_one(self) -> None:
        stream, b, i, raw, sum_, base = self._pending.popleft()
        if b.result is None:
            b.result = self.pool.result(b.future, repr(self.s.label or self.spool))
            if b.result.stored:
                self.packs.append(b.key)
                saw_pack(self.s.store, b.key, b.result.stored)
            for what, why in b.result.notes:
                note_unreadable_base(what, why)
        r = b.result.items[i]
        if r.kind == SAME:
            ref = base
        elif r.kind == DELTA:
            ref = ChunkRef(b.key, r.offset, r.stored, raw, sum_, base.depth + 1, base)
        else:
            ref = ChunkRef(b.key, r.offset, r.stored, raw, sum_, 0, None)
        stream.chunks.append(ref)
        if self._submitted and self._submitted[0] is b and \
                (not self._pending or self._pending[0][1] is not b):
            self._submitted.popleft()

    def finish(self) -> None:
        if self._raw.length:
            self._emit_raw()
        self._submit()
        while self._pending:
            self._drain_one()
        if self.s.size != self.s._written:
            raise CodecError(
                "internal error: the stream parser did not return the bytes it was given; "
                "the file was not stored (please report this with the file)")

    def abort(self) -> None:
        for b in self._submitted:
            if b.future is not None:
                b.future.cancel()
        self._submitted.clear()
        self._pending.clear()
