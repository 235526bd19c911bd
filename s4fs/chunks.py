"""Chunks of committed versions, fetched, checked and decoded.

``ChunkSource`` fetches a chunk's blob with a ranged get from its pack (nearby blobs of
one pack in one read), decodes it (recursively through its delta base), verifies it
against the checksum in the manifest, and keeps recently decoded chunks in a bounded LRU
shared by every open file. ``decode_on_gpu`` decodes many chunks in large batches on the
GPU; ``WholeFileHash`` checks a whole version read in order.

Below both the read path (``s4fs.read``: byte ranges of a file, the decode ahead) and the
coding workers (``s4fs.coding``, whose decode jobs use a source of their own): neither
imports the other for it.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections import OrderedDict
from concurrent.futures import Future, ThreadPoolExecutor

import os

import numpy as np
import xxhash

from s4fs import codec
from s4fs.codec import has_gpu_planes, read_header
from s4fs.errors import ChecksumError, MissingData, NotFound, S4Error
from s4fs.manifest import ChunkRef, Manifest
from s4fs.stores import Store

log = logging.getLogger(__name__)


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


def plan_runs(refs: list) -> tuple[list[list], list[tuple[int, int]]]:
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
    runs, place = plan_runs(group)
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
        runs, place = plan_runs(refs)
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
