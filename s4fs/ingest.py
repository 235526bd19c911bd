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
import time
import uuid
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Callable

import xxhash

from s4fs import codec, keys, metrics
from s4fs.errors import CodecError
from s4fs.manifest import ChunkRef, Manifest, Stream
from s4fs.stores import Store


@dataclass(frozen=True)
class IngestConfig:
    chunk_size: int = 4 << 20          # raw bytes per chunk (a multiple of every itemsize)
    pack_size: int = 32 << 20          # stored bytes per pack object
    workers: int = max(2, os.cpu_count() or 2)
    max_pending_chunks: int = 0        # chunks being coded at once; 0: twice the workers
    max_uploads: int = 4
    # The pipeline codes chunks on the CPU unless asked: the GPU codec is exact here but,
    # fed one 4 MiB chunk at a time, slower than the CPU pool (docs/BENCHMARKS.md, H200).
    device: str = "cpu"
    # background coding yields the CPU to the training job and to the FUSE requests it
    # waits on (a nice value for the coding threads; 0 keeps the normal priority)
    nice: int = 10
    max_delta_depth: int = 4           # a delta chain never grows past this
    delta_min_gain: float = 0.9        # keep a delta only if <= this fraction of full size


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

    def __init__(self, store: Store, cfg: IngestConfig, on_pack: Callable | None = None):
        self.store, self.cfg = store, cfg
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

    def _submit(self) -> None:
        if not self._buf:
            return
        key, data = self._key, b"".join(self._buf)
        self.keys.append(key)
        self._buf, self._buf_len = [], 0
        self._key = keys.new_pack_key()
        while len(self._uploads) >= self.cfg.max_uploads:
            self._uploads.popleft().result()
        metrics.uploads_started()

        def upload():
            try:
                self.store.put(key, data)
                if self._on_pack is not None:
                    self._on_pack(key, data)
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
                 parser=None, on_pack: Callable | None = None) -> None:
        if parser is None:
            from s4fs.parse import new_parser
            parser = new_parser()
        self.store, self.cfg = store, cfg
        self.parser = parser
        self.packs = PackWriter(store, cfg, on_pack)
        self.size = 0
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
        self._base_streams = self._index_base(base)
        self._closed = False
        self._stable = False
        self.started = time.time()

    # --- input -------------------------------------------------------------------------

    def write(self, data, *, stable: bool = False) -> int:
        """Take the next bytes of the file. ``stable``: ``data`` never changes (an
        immutable ``bytes``), so whole chunks are coded straight from it, not copied."""
        if self._closed:
            raise ValueError("write to a finished ingest session")
        mv = memoryview(data).cast("B")
        self._hash.update(mv)
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
            self._routed.update(piece)
            if seg.kind == "tensor":
                self._tensor_piece(seg, piece)
            else:
                self._end_tensor()
                self._extend(0, self._raw_len, n)
                self._raw_buf += piece
                self._raw_len += n
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
        if not self._tensor_buf:
            return
        self._emit_tensor(bytes(self._tensor_buf))
        self._tensor_buf = bytearray()

    def _emit_tensor(self, chunk) -> None:
        idx = len(self._tensor.chunks) + sum(1 for p in self._pending if p.stream is self._tensor)
        base = None
        if self._tensor_base is not None and idx < len(self._tensor_base):
            base = self._tensor_base[idx]
        self._emit(self._tensor, chunk, self._tensor.dtype, base)

    def _end_tensor(self) -> None:
        if self._tensor is not None:
            self._flush_tensor()
            self._tensor = None
            self._tensor_seg = -1

    # --- delta bases -------------------------------------------------------------------

    @staticmethod
    def _index_base(base: Manifest | None) -> dict:
        if base is None:
            return {}
        return {(s.name, s.dtype, s.length): s for s in base.streams
                if s.kind == "tensor" and s.name is not None}

    def _match_base(self, seg) -> list[ChunkRef] | None:
        if not self._base_streams or seg.length is None:
            return None
        s = self._base_streams.get((seg.name, seg.dtype, seg.length))
        return s.chunks if s is not None else None

    # --- coding ------------------------------------------------------------------------

    def _emit(self, stream: Stream, data: bytes, dtype: str, base: ChunkRef | None) -> None:
        while len(self._pending) >= (self.cfg.max_pending_chunks or 2 * self.cfg.workers):
            self._drain_one()
        fut = _Pools.codec(self.cfg.workers, self.cfg.nice).submit(self._encode, data, dtype, base)
        self._pending.append(_Pending(stream, fut))

    def _encode(self, data: bytes, dtype: str, base: ChunkRef | None):
        """Runs on the codec pool. Returns (blob | None, base ref | None, checksum, raw)."""
        sum_ = codec.checksum(data)
        cfg = self.cfg
        if base is not None and self._source is not None and base.raw == len(data) \
                and base.depth < cfg.max_delta_depth:
            if base.checksum == sum_:
                base_raw = self._source.get(base)
                if base_raw == data:
                    return None, base, sum_, len(data)     # unchanged: reuse the base chunk
            else:
                base_raw = self._source.get(base)
            delta = codec.compress(data, dtype, base=base_raw, device=cfg.device)
            if len(delta) < 0.25 * len(data):
                return delta, base, sum_, len(data)
            full = codec.compress(data, dtype, device=cfg.device)
            if len(delta) <= cfg.delta_min_gain * len(full):
                return delta, base, sum_, len(data)
            return full, None, sum_, len(data)
        return codec.compress(data, dtype, device=cfg.device), None, sum_, len(data)

    def _drain_one(self) -> None:
        p = self._pending.popleft()
        blob, base, sum_, raw = p.future.result()
        if blob is None:
            ref = base                                   # the very same chunk as the base
        else:
            pack, off = self.packs.add(blob)
            depth = base.depth + 1 if base is not None else 0
            ref = ChunkRef(pack, off, len(blob), raw, sum_, depth, base)
        p.stream.chunks.append(ref)

    # --- end ---------------------------------------------------------------------------

    def finish(self, *, mode: int = 0o100644, mtime: float | None = None) -> Manifest:
        """Flush everything, wait until every pack is stored, and return the manifest."""
        self._route(self.parser.finish())
        self._end_tensor()
        if self._raw_buf:
            self._emit(self._raw, bytes(self._raw_buf), "bytes", None)
            self._raw_buf = bytearray()
        while self._pending:
            self._drain_one()
        if self._routed.digest() != self._hash.digest():
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
        return Manifest(size=self.size, xxh128=self._hash.hexdigest(),
                        mtime=time.time() if mtime is None else mtime, mode=mode,
                        kind=getattr(self.parser, "format", "raw"), id=uuid.uuid4().hex,
                        streams=streams, extents=[tuple(e) for e in self._extents],
                        names=names, own_packs=list(self.packs.keys),
                        base=self._base_info)

    def abort(self) -> None:
        """Give up: nothing becomes visible; uploaded packs are left to the collector."""
        self._closed = True
        for p in self._pending:
            p.future.cancel()
        self._pending.clear()
        self.packs.abandon()
