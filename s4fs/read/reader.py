"""Reading files back: chunk fetch + decode with an LRU, and byte ranges of a file.

``ChunkSource`` fetches a chunk's blob with a ranged get from its pack, decodes it
(recursively through its delta base), verifies it against the checksum in the manifest,
and keeps recently decoded chunks in a bounded LRU shared by every open file.
``FileReader`` maps ``read(offset, size)`` onto the manifest's extents and streams, and
reads ahead when access is sequential (``torch.load`` reads record by record).
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections import OrderedDict
from concurrent.futures import Future, ThreadPoolExecutor

import os
import time

import numpy as np
import xxhash

from s4fs import codec, metrics
from s4fs.codec import has_gpu_planes, read_header
from s4fs.errors import ChecksumError, MissingData, NotFound, S4Error
from s4fs.manifest import ChunkRef, Manifest
from s4fs.stores import Store

log = logging.getLogger(__name__)
# preadv flag: fail with EAGAIN instead of waiting for the disk (Linux >= 4.14)
_NOWAIT = getattr(os, "RWF_NOWAIT", None)


def _truncated(pack: str, offset: int, got: int, want: int) -> ChecksumError:
    return ChecksumError(
        f"chunk at {pack}@{offset} is truncated in the store ({got} of {want} bytes); the "
        f"file cannot be read back intact")


@contextlib.contextmanager
def _corrupt(what: str):
    """A blob the codec refuses (malformed, or not matching its base) as a ChecksumError
    naming ``what``: to a reader, both mean the stored bytes are corrupt."""
    try:
        yield
    except ChecksumError:
        raise
    except (codec.FormatError, codec.BaseMismatchError) as exc:
        raise ChecksumError(f"{what} is corrupt: {exc}") from None


class WholeFileHash:
    """The whole-file hash of a version, extended over bytes read in order from offset 0;
    ``see`` returns False once the end is reached and the hash does not match (True
    otherwise). Reads out of order (torch.load's) simply stop the check."""

    def __init__(self, m: Manifest) -> None:
        self._m = m
        self._h = xxhash.xxh3_128() if m.xxh128 else None
        self._done = 0
        # one descriptor is read from several threads (and the mount's event loop) at
        # once: two reads of the same bytes must not both extend the hash
        self._lock = threading.Lock()

    def see(self, offset: int, data) -> bool:
        with self._lock:
            h = self._h
            end = offset + len(data)
            if h is None or offset > self._done or end <= self._done:
                return True
            h.update(memoryview(data)[self._done - offset:])
            self._done = end
            if end < self._m.size:
                return True
            self._h = None
        return h.hexdigest() == self._m.xxh128


def decode_on_gpu(source: "ChunkSource", refs, *, batch_bytes: int = 1 << 30,
                  readers: int = 16, gpu_thread: bool = False, to_host: bool = False) -> dict:
    """The bytes of every chunk in ``refs`` decoded on the current CUDA device, as device
    arrays keyed by ``ref.key()`` (their delta bases' too): bases decode before the
    chunks written against them, level by level, in ``s4fs.codec.gpu.decompress_many``
    batches of about ``batch_bytes``, the next batch's blobs read while one decodes.
    Every blob is checked against the manifest's checksum and length before it is
    decoded, and every output against its blob's checksum on the device. ``gpu_thread``:
    only the decoding runs on the process's GPU thread (the mount's), the reads here.
    A batch's blobs are read into one pinned host buffer, one read per run of adjacent
    blobs in a pack, and go up to the device in one copy. ``to_host``: batches of chunks
    asked for that no other chunk needs as its base come back as host memoryviews (one
    copy into pinned memory per batch, not one per chunk)."""
    from s4fs.codec import gpu, on_gpu_thread
    run = on_gpu_thread if gpu_thread else (lambda fn, *a, **k: fn(*a, **k))
    # the reads ahead run on a thread of their own, which starts on device 0: they name
    # the caller's device (a rank's own GPU), where the blobs must land
    device = None if gpu_thread else gpu.current_device()
    todo: dict = {}
    for ref in refs:
        r = ref
        while r is not None and r.key() not in todo:
            todo[r.key()] = r
            r = r.base
    groups = [g for d in sorted({r.depth for r in todo.values()})
              for g in _groups([r for r in todo.values() if r.depth == d], batch_bytes)]
    asked = {r.key() for r in refs}
    bases = {r.base.key() for r in todo.values() if r.base is not None}
    decoded: dict = {}
    with ThreadPoolExecutor(readers, thread_name_prefix="s4fs-load") as pool, \
            ThreadPoolExecutor(1, thread_name_prefix="s4fs-load-ahead") as ahead:
        def read(group):
            with gpu.on_device(device):
                host, at = _read_runs(source, group, pool)
                dev = run(gpu.to_device, host)
            return [dev[p: p + r.stored] for r, p in zip(group, at)]
        nxt = ahead.submit(read, groups[0]) if groups else None
        for k, group in enumerate(groups):
            blobs = nxt.result()
            if k + 1 < len(groups):
                nxt = ahead.submit(read, groups[k + 1])
            host = to_host and all(r.key() in asked and r.key() not in bases for r in group)
            # pairs (fp32 words coded on their low-precision copy) restore on the host
            pairs = [j for j, r in enumerate(group) if r.paired]
            rest = [j for j in range(len(group)) if not group[j].paired]
            with _corrupt("a chunk of this file"):
                outs = run(gpu.decompress_many, [blobs[j] for j in rest],
                           [decoded[group[j].base.key()] if group[j].base is not None
                            else None for j in rest], out="host" if host else "device")
            decoded.update((group[j].key(), o) for j, o in zip(rest, outs))
            for j in pairs:
                r = group[j]
                with _corrupt("a chunk of this file"):
                    data = codec.decompress(_on_host(blobs[j]),
                                            base=_on_host(decoded[r.base.key()]),
                                            device="cpu")
                arr = np.frombuffer(data, dtype=np.uint8)
                decoded[r.key()] = memoryview(arr) if host else run(gpu.to_device, arr)
    return decoded


def _on_host(arr) -> bytes:
    """A decoded or fetched buffer's bytes on the host (a CuPy array is copied back)."""
    if hasattr(arr, "get"):
        return arr.get().tobytes()
    return bytes(memoryview(arr).cast("B"))


RUN_GAP = 1 << 16          # blobs this close in one pack are read in one go


def _plan_runs(refs: list) -> tuple[list[list], list[tuple[int, int]]]:
    """Runs of adjacent blobs, one pack each: ``[pack, lo, hi]``, and where each ref's
    blob lies (run index, offset in the run), in the order of ``refs``."""
    order = sorted(range(len(refs)), key=lambda i: (refs[i].pack, refs[i].offset))
    runs: list[list] = []
    place: list = [None] * len(refs)
    for i in order:
        r = refs[i]
        last = runs[-1] if runs else None
        if last is not None and last[0] == r.pack and r.offset <= last[2] + RUN_GAP:
            last[2] = max(last[2], r.offset + r.stored)
        else:
            runs.append([r.pack, r.offset, r.offset + r.stored])
        place[i] = (len(runs) - 1, r.offset - runs[-1][1])
    return runs, place


def _read_runs(source: "ChunkSource", group: list, pool):
    """Every blob of ``group`` in one pinned host buffer, read a run of adjacent blobs
    of one pack at a time and checked against the manifest; returns the buffer and
    each blob's offset in it (group order)."""
    from s4fs.codec import gpu
    runs, place = _plan_runs(group)
    starts, total = [], 0
    for _, lo, hi in runs:
        starts.append(total)
        total += hi - lo
    host = gpu.host_buffer(total)

    def fill(k: int) -> None:
        pack, lo, hi = runs[k]
        source.read_into(pack, lo, hi, host[starts[k]: starts[k] + hi - lo])
    list(pool.map(fill, range(len(runs))))
    at = [starts[k] + off for k, off in place]
    for r, p in zip(group, at):
        source.check_blob(r, host[p: p + r.stored])
    return host, at


def _groups(refs: list, limit: int):
    group, size = [], 0
    for r in refs:
        if group and size + r.raw > limit:
            yield group
            group, size = [], 0
        group.append(r)
        size += r.raw
    if group:
        yield group


class ChunkSource:
    """Chunks fetched, decoded and checked, with a cache of recent ones. ``threads``: the
    executor its prefetches run on, its owner's (``Runtime.thread``; left running by
    :meth:`close`); None: one of its own of ``workers`` threads (default: one per core,
    at least 4), stopped by :meth:`close`."""

    def __init__(self, store: Store, *, cache_bytes: int = 256 << 20, device: str = "auto",
                 workers: int = 0, blob_cache=None, offload=None,
                 threads: ThreadPoolExecutor | None = None) -> None:
        self.store = store
        self.device = device
        # offload(blob, base bytes) -> raw bytes: where blobs with nvCOMP planes decode
        # when this process should not touch the GPU (a mount's daemon: its GPU worker)
        self.offload = offload
        self.cache_bytes = cache_bytes
        self.blob_cache = blob_cache      # optional local cache of packs (delta bases)
        self._lru: OrderedDict[tuple, bytes] = OrderedDict()
        self._size = 0
        self._lock = threading.Lock()
        self._inflight: dict[tuple, Future] = {}
        self._own_pool = threads is None
        self._pool = threads or ThreadPoolExecutor(workers or max(4, os.cpu_count() or 4),
                                                   thread_name_prefix="s4fs-read")
        self.chunk_hint = 4 << 20         # reads larger than this decode in parallel
        self._preloaded: dict[tuple[str, int], memoryview] = {}   # see preloaded()
        # pack -> [(lo, hi, offset, fd)]: stored byte ranges fetched ahead into a local
        # staging file (see staged(); s4fs.read.fetch)
        self._staged: dict[str, list[tuple[int, int, int, int]]] = {}

    def get(self, ref: ChunkRef) -> bytes:
        """The verified raw bytes of ``ref``."""
        key = ref.key()
        with self._lock:
            data = self._lru.get(key)
            if data is not None:
                self._lru.move_to_end(key)
                return data
            fut = self._inflight.get(key)
            owner = fut is None
            if owner:
                fut = self._inflight[key] = Future()
        if not owner:
            return fut.result()
        try:
            data = self._decode(ref)
        except BaseException as exc:
            with self._lock:
                del self._inflight[key]
            fut.set_exception(exc)
            raise
        with self._lock:
            del self._inflight[key]
            self._remember(key, data)
        fut.set_result(data)
        return data

    def _remember(self, key, data: bytes) -> None:
        if len(data) > self.cache_bytes:
            return
        self._lru[key] = data
        self._size += len(data)
        while self._size > self.cache_bytes:
            _, old = self._lru.popitem(last=False)
            self._size -= len(old)

    @contextlib.contextmanager
    def preloaded(self, refs):
        """Within the block, the blobs of ``refs`` (a batch about to be decoded) and of
        their delta bases come from one read per run of adjacent blobs in a pack, not one
        read per blob: a fresh node's decode ahead makes a few large GETs instead of many
        small ones. Each blob is still checked against the manifest when it is decoded."""
        chain, seen = [], set()
        for r in refs:                   # and the delta bases they decode through
            while r is not None and r.key() not in seen:
                seen.add(r.key())
                chain.append(r)
                r = r.base
        with self._lock:
            refs = [r for r in chain if r.key() not in self._lru]
        runs, place = _plan_runs(refs)
        bufs = []
        for pack, lo, hi in runs:
            buf = bytearray(hi - lo)
            self.read_into(pack, lo, hi, buf)
            bufs.append(memoryview(buf))
        mine = {(r.pack, r.offset): bufs[k][off: off + r.stored]
                for r, (k, off) in zip(refs, place)}
        with self._lock:
            self._preloaded.update(mine)
        try:
            yield
        finally:
            with self._lock:
                for key in mine:
                    self._preloaded.pop(key, None)

    @contextlib.contextmanager
    def staged(self, staging):
        """Within the block, reads of the stored byte ranges listed in ``staging``
        (``(path, ((pack, lo, hi, offset), ...))``, or None: nothing staged) come from
        that local file — where s4fs.read.fetch put them ahead of this decode — not from
        the store. Its bytes are checked like the store's: every blob against the
        manifest and its checksum, when it is decoded."""
        if not staging or not staging[1]:
            yield
            return
        path, runs = staging
        fd = os.open(path, os.O_RDONLY)
        mine = [(pack, (lo, hi, at, fd)) for pack, lo, hi, at in runs]
        with self._lock:
            for pack, entry in mine:
                self._staged.setdefault(pack, []).append(entry)
        try:
            yield
        finally:
            with self._lock:
                for pack, entry in mine:
                    left = self._staged[pack]
                    left.remove(entry)
                    if not left:
                        del self._staged[pack]
            os.close(fd)

    def _read_staged(self, pack: str, lo: int, hi: int, out) -> bool:
        """Bytes [lo, hi) of ``pack`` into ``out`` from a staging file, if one holds
        them all; False otherwise (or when the staging file comes up short)."""
        with self._lock:
            hit = next(((s_lo, at, fd) for s_lo, s_hi, at, fd in self._staged.get(pack, ())
                        if s_lo <= lo and hi <= s_hi), None)
        if hit is None:
            return False
        s_lo, at, fd = hit
        mv = memoryview(out).cast("B")[: hi - lo]
        got = 0
        while got < len(mv):
            n = os.preadv(fd, [mv[got:]], at + lo - s_lo + got)
            if n <= 0:
                return False
            got += n
        return True

    def fetch_blob(self, ref: ChunkRef) -> bytes:
        with self._lock:
            blob = self._preloaded.get((ref.pack, ref.offset))
        if blob is not None and len(blob) == ref.stored:
            return bytes(blob)
        if self._staged:
            buf = bytearray(ref.stored)
            if self._read_staged(ref.pack, ref.offset, ref.offset + ref.stored, buf):
                return bytes(buf)
        blob = None
        if self.blob_cache is not None:
            blob = self.blob_cache.get(ref.pack, ref.offset, ref.stored)
        if blob is None:
            with self._missing(ref.pack):
                blob = self.store.get(ref.pack, ref.offset, ref.offset + ref.stored)
        if len(blob) != ref.stored:
            raise _truncated(ref.pack, ref.offset, len(blob), ref.stored)
        return blob

    def read_into(self, pack: str, lo: int, hi: int, out) -> None:
        """Bytes [lo, hi) of ``pack`` into ``out`` (a staging file or the local pack cache
        first)."""
        if self._staged and self._read_staged(pack, lo, hi, out):
            return
        data = self.blob_cache.get(pack, lo, hi - lo) if self.blob_cache is not None else None
        if data is not None:
            got = len(data)
            memoryview(out).cast("B")[:got] = data
        else:
            with self._missing(pack):
                got = self.store.get_into(pack, lo, hi, out)
        if got != hi - lo:
            raise _truncated(pack, lo, got, hi - lo)

    @contextlib.contextmanager
    def _missing(self, pack: str):
        """The store's NotFound for ``pack`` as MissingData (the file exists, its data
        does not: never ENOENT)."""
        try:
            yield
        except NotFound:
            raise MissingData(
                f"object {pack} is missing from the store ({self.store.url}); the file that "
                f"needs it cannot be read back (was it deleted by hand, or by a lifecycle "
                f"rule?)") from None

    def check_blob(self, ref: ChunkRef, blob):
        """``blob`` if its header is the one the manifest expects of ``ref``."""
        try:
            head = read_header(blob)
        except S4Error as exc:
            raise ChecksumError(
                f"chunk at {ref.pack}@{ref.offset} is corrupt ({exc}); the file cannot be "
                f"read back intact") from None
        if head.checksum != ref.checksum or head.raw_len != ref.raw:
            raise ChecksumError(
                f"chunk at {ref.pack}@{ref.offset} is not the one the manifest expects "
                f"(checksum mismatch); the store is corrupt")
        return blob

    def _decode(self, ref: ChunkRef) -> bytes:
        blob = self.check_blob(ref, self.fetch_blob(ref))
        base = self.get(ref.base) if ref.base is not None else None
        with _corrupt(f"chunk at {ref.pack}@{ref.offset}"):
            if self.offload is not None and \
                    has_gpu_planes(read_header(blob, whole=False)):
                data = self.offload(blob, base)
                if len(data) != ref.raw:
                    raise ChecksumError(f"chunk at {ref.pack}@{ref.offset} decoded to "
                                        f"{len(data)} bytes, not {ref.raw}")
                return data
            return codec.decompress(blob, base=base, device=self.device)

    def prefetch(self, refs) -> None:
        for ref in refs:
            with self._lock:
                if ref.key() in self._lru or ref.key() in self._inflight:
                    continue
            self._pool.submit(self._quiet_get, ref)

    def _quiet_get(self, ref) -> None:
        try:
            self.get(ref)
        except Exception:
            pass   # the foreground read reports the error

    def close(self) -> None:
        if self._own_pool:
            self._pool.shutdown(wait=False, cancel_futures=True)


class FileReader:
    """Random-access reads over one manifest."""

    def __init__(self, manifest: Manifest, source: ChunkSource, *,
                 readahead: int = 16 << 20, path: str = "") -> None:
        self.m = manifest
        self.source = source
        self.readahead = readahead
        self.path = path
        self._last_end = -1
        self._whole = WholeFileHash(manifest)

    @property
    def size(self) -> int:
        return self.m.size

    def read(self, offset: int, size: int) -> bytes:
        end = min(offset + size, self.m.size)
        if offset >= end:
            return b""
        buf = bytearray(end - offset)
        self.readinto(offset, memoryview(buf))
        return bytes(buf) if len(buf) < 65536 else buf

    def readinto(self, offset: int, dest: memoryview) -> int:
        """Copy file bytes at ``offset`` into ``dest``; returns the count (short at EOF)."""
        m = self.m
        end = min(offset + len(dest), m.size)
        if offset >= end:
            return 0
        sequential = offset == self._last_end
        if end - offset > self.source.chunk_hint:
            # a large read (torch.load reads a whole storage at once): decode its chunks
            # in parallel on the pool; the loop below then picks them up in order
            self.source.prefetch(self.refs_for(offset, end - offset)[1:])
        pos = offset
        i = m.locate(pos)
        try:
            while pos < end:
                foff, flen, sidx, soff = m.extents[i]
                take = min(end, foff + flen) - pos
                self._stream_into(sidx, soff + pos - foff,
                                  dest[pos - offset: pos - offset + take])
                pos += take
                i += 1
        except MissingData as exc:
            raise MissingData(f"{self.path or 'a file'}: {exc}") from None
        self._last_end = end
        if not self._whole.see(offset, dest[: end - offset]):
            raise ChecksumError(
                f"{self.path or 'a file'}: the bytes read back do not match the file's "
                f"recorded hash (every chunk passed its own check, so the manifest "
                f"itself is wrong); do not trust this file — report it, with the store")
        if sequential and self.readahead and end < m.size:
            self.source.prefetch(self.refs_for(end, self.readahead))
        return end - offset

    def _stream_into(self, sidx: int, soff: int, dest: memoryview) -> None:
        stream = self.m.streams[sidx]
        starts = stream.starts()
        k = stream.locate(soff)
        done, n = 0, len(dest)
        while done < n:
            data = self.source.get(stream.chunks[k])
            lo = soff + done - starts[k]
            take = min(n - done, len(data) - lo)
            dest[done: done + take] = memoryview(data)[lo: lo + take]
            done += take
            k += 1

    def refs_for(self, offset: int, length: int) -> list[ChunkRef]:
        """Chunk refs covering [offset, offset+length), in file order, without repeats."""
        m = self.m
        end = min(offset + length, m.size)
        refs, seen = [], set()
        i = m.locate(offset) if offset < m.size else len(m.extents)
        pos = offset
        while pos < end and i < len(m.extents):
            foff, flen, sidx, soff = m.extents[i]
            stream = m.streams[sidx]
            s_lo = soff + pos - foff
            s_hi = soff + min(end, foff + flen) - foff
            k = stream.locate(s_lo)
            starts = stream.starts()
            while k < len(stream.chunks) and starts[k] < s_hi:
                ref = stream.chunks[k]
                if ref.key() not in seen:
                    seen.add(ref.key())
                    refs.append(ref)
                k += 1
            pos = min(end, foff + flen)
            i += 1
        return refs


class ReadHandle:
    """A read-only view of one file: a committed version read through the store, a
    committed version kept whole on local disk (``staged_fd`` with its ``manifest``), or
    — on the mount that writes it — the spool of a file being written."""

    def __init__(self, reader: FileReader | None = None, staged_fd: int | None = None,
                 size_fn=None, path: str = "", manifest: Manifest | None = None,
                 on_bad=None, fill_fn=None, version: str | None = None):
        self._reader = reader
        self._fd = staged_fd
        self._size_fn = size_fn
        self._m = manifest if manifest is not None else (reader.m if reader else None)
        # the committed version these bytes are (a spool holding exactly it has no
        # manifest to check against: later writes through its handle may change it)
        self._version = version if version is not None else (self._m.id if self._m else None)
        self._on_bad = on_bad
        # local copies of a committed version are checked like the store's bytes: the
        # whole-file hash, when the file is read from start to end in order
        self._whole = WholeFileHash(self._m) if self._m is not None else None
        # a cold file: decoded ahead by the coding pool from its first read on
        # (s4fs.read.fill; ``fill_fn(offset of the first read)``), read from that copy
        # as its batches land
        self._fill_fn = fill_fn
        self._fill = None
        self._fill_lock = threading.Lock()      # FUSE may read one handle from threads
        self._dead_fds: list[int] = []
        self.path = path
        self.opened = time.monotonic()
        self.nbytes = 0
        self.nreads = 0

    @property
    def manifest(self) -> Manifest | None:
        return self._m

    @property
    def version(self) -> str | None:
        """The id of the committed version this handle reads, or None (a spool that is
        not exactly one)."""
        return self._version

    @property
    def size(self) -> int:
        return self._reader.size if self._reader is not None else self._size_fn()

    @property
    def is_spool(self) -> bool:
        """Whether this view reads a writer's spool on this mount (no manifest)."""
        return self._reader is None and self._m is None

    @property
    def held_size(self) -> int:
        """The bytes this view can still give: its file's own size where it reads a
        local file (a spool emptied into a new file since keeps its old inode's), else
        the version's."""
        if self._fd is not None:
            return os.fstat(self._fd).st_size
        return self.size

    def read_held(self, offset: int, size: int) -> bytes:
        """Bytes at ``offset`` of what this view held (``held_size``): a read past the
        end of the file it now reads (s4fs.read.node)."""
        if self._fd is not None:
            return os.pread(self._fd, max(0, size), offset)
        return self.read(offset, size)

    def local_file(self) -> int | None:
        """The descriptor of a whole local copy of the committed version this handle
        reads (the decoded cache), or None (a spool, or the store)."""
        if self._reader is None and self._m is not None and self._fd is not None:
            return self._fd
        return None

    def read(self, offset: int, size: int) -> bytes:
        self._count_read(offset, size)
        fd = self._copy_fd(offset, size)
        if fd is None:                  # decoded here, through the store
            buf = bytearray(max(0, min(size, self._reader.size - offset)))
            n = self._reader.readinto(offset, memoryview(buf))
            self.nbytes += n
            return bytes(buf[:n]) if n < 65536 else buf[:n]
        data = os.pread(fd, max(0, min(size, self._size_fn() - offset)), offset)
        self._check(offset, data)
        self.nbytes += len(data)
        return data

    def read_now(self, offset: int, size: int) -> bytearray | None:
        """``read`` of bytes of a local copy (the whole file on local disk, or the part of
        a copy being decoded ahead that has landed) that are in the page cache: there is
        nothing to wait for (the caller may be an event loop). Else None, and the caller
        reads with ``read``. A file just written and read back, or decoded ahead of
        its reader, skips a trip through a thread per read."""
        fd = self._fd
        if fd is None or _NOWAIT is None or self._fill_fn is not None or \
                (self._reader is None and self._m is None):
            return None
        end = min(offset + size, self._m.size)
        fill = self._fill
        if offset < end and fill is not None and not fill.has(offset, end):
            return None
        buf = bytearray(max(0, end - offset))
        try:
            n = os.preadv(fd, [buf], offset, _NOWAIT) if buf else 0
        except OSError:            # EAGAIN: not all cached; any other error: ``read`` says
            return None
        if n < len(buf):           # cached in part: the rest would wait for the disk
            return None
        self._count_read(offset, size)
        self._check(offset, buf)
        self.nbytes += n
        return buf

    def decode_whole(self) -> bool:
        """A cold file decoded ahead whole now, and waited for: True when its copy is
        then whole in the decoded cache (an open from now on reads it on local disk);
        False where it is not decoded ahead (too small, larger than the cache, no
        pool) or the decode failed — this handle then reads as it would have."""
        if self._reader is None:
            return False
        self._start_fill(0)
        fill = self._fill
        if self._fd is None:
            return False
        if fill is None or fill.wait_whole():         # None: the copy was whole already
            return True
        with self._fill_lock:       # failed (a batch, or the whole-file check): nothing
            if self._fill is fill:  # of that copy is read, it decodes here instead
                self._dead_fds.append(self._fd)
                self._fd, self._fill = None, None
        return False

    def decoding(self):
        """The decode ahead of this cold file, started now where it is not yet (as a
        first read at 0 would start it): ``(fill, fd)`` — the s4fs.read.fill.Fill and a
        descriptor of its copy of the caller's own (to close) — or None where it is not
        decoded ahead (too small, no pool, a local copy whole already) or failed."""
        if self._reader is None:
            return None
        self._start_fill(0)
        with self._fill_lock:
            fill, fd = self._fill, self._fd
            if fill is None or fd is None or fill.failed is not None:
                return None
            return fill, os.dup(fd)

    def _start_fill(self, offset: int) -> None:
        """The first read of a cold file: decode it ahead, from that read's batch on. A
        checkpoint is read whole, and waiting for torch.load's pattern (the zip
        directory at the tail) first cost a chunk fetched and decoded here in between."""
        size = self._reader.size
        with self._fill_lock:
            if self._fill_fn is None:
                return                        # another thread started it
            got, self._fill_fn = self._fill_fn(offset), None
            if got is not None:
                self._size_fn = lambda: size
                self._fill, self._fd = got

    def _copy_fd(self, offset: int, size: int) -> int | None:
        """The descriptor to read [offset, offset + size) from — a spool, a whole local
        copy, or a copy being decoded ahead once those bytes are in it — or None: decode
        them here through the store (a cold file not decoded ahead, or whose fill
        failed)."""
        if self._reader is None:
            return self._fd
        if self._fill_fn is not None:
            self._start_fill(offset)
        fd, fill = self._fd, self._fill
        if fd is None:
            return None
        end = min(offset + size, self._reader.size)
        if fill is None or offset >= end or fill.wait(offset, end):
            return fd
        with self._fill_lock:             # the fill failed: decode here from now on
            if self._fd == fd:
                self._fd, self._fill = None, None
                self._dead_fds.append(fd)     # closed at release: others may use it
        return None

    def _count_read(self, offset: int, size: int) -> None:
        """One read request (for the release's log line); the first one is logged."""
        self.nreads += 1
        if not self.nbytes and self._m is not None:
            log.info("%s: first read, %d bytes at %d, %.3f s after the open (%s)",
                     self.path, size, offset, time.monotonic() - self.opened,
                     "decoding" if self._reader is not None else "a local copy")

    def readinto(self, offset: int, dest) -> int:
        self._count_read(offset, len(dest))
        mv = memoryview(dest).cast("B")
        fd = self._copy_fd(offset, len(mv))
        if fd is None:
            n = self._reader.readinto(offset, mv)
        else:
            want = max(0, min(len(mv), self._size_fn() - offset))
            n = os.preadv(fd, [mv[:want]], offset) if want else 0
            self._check(offset, mv[:n])
        self.nbytes += n
        return n

    def _check(self, offset: int, data) -> None:
        if self._whole is not None and not self._whole.see(offset, data):
            if self._on_bad is not None:
                self._on_bad()
            raise ChecksumError(
                f"{self.path}: the local copy of this file does not match its recorded "
                f"hash (the cache disk corrupted it); it was dropped from the cache — "
                f"open the file again to read it from the store")

    def release(self) -> None:
        if self.nbytes:
            if self._m is not None:
                log.info("%s: released after %d bytes read in %d reads, %.3f s after the "
                         "open", self.path, self.nbytes, self.nreads,
                         time.monotonic() - self.opened)
            metrics.observe_load(self.path, self.nbytes, time.monotonic() - self.opened)
            self.nbytes = 0
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
        for fd in self._dead_fds:
            os.close(fd)
        self._dead_fds.clear()
