"""Decode ahead: a cold file is decoded into the decoded cache by the worker processes,
ahead of its reader.

A file read on a node that did not write it (or after its decoded copy was evicted) has
to be fetched and decoded chunk by chunk, through delta chains. Done inside the daemon
that is one interpreter's worth of decoding, behind the FUSE requests. Instead, at the
first read of a cold file of at least :data:`MIN_SIZE`, the mount starts a
:class:`Fill`: the whole version is cut into batches of chunks, each with the file
ranges its bytes belong at, and a coding pool (``s4fs.coding``: the worker processes, or
threads on this process's GPU) decodes them (every chunk checked against its checksum)
and ``pwrite``s them into ``<cache>/decoded/.fill-<id>``. From a remote store the
batches' stored bytes are fetched ahead first, many GETs in flight
(``s4fs.read.fetch``); from a local one the workers read them in place. A read waits
only for the batch that holds its bytes — the first read's batch goes first, then the
tail's (torch.load's zip directory), the rest in file order — then is a ``pread`` of
that file. Once every batch is in and the whole-file hash of the filled
copy matches the manifest, it becomes the version's decoded-cache entry (later opens
read it like a file written here). A batch that fails (the store down, a
worker killed) ends the fill: its readers go back to decoding in the daemon, which
reports the error if there is one.

:class:`Fills` is the read policy the filesystem asks for: which versions are decoded
ahead, by which pool, in batches of what size.
"""

from __future__ import annotations

import bisect
import logging
import mmap
import os
import pickle
import threading
import time
import xxhash

from s4fs.coding import DecodeJob, IngestConfig, Pools, mapped_copy, placement
from s4fs.manifest import Manifest
from s4fs.read.fetch import PREFIX as FETCH_PREFIX, Fetch

log = logging.getLogger(__name__)

FILL_PREFIX = ".fill-"
MIN_SIZE = 8 << 20          # smaller files decode in the daemon as before


def plan(m: Manifest, batch_bytes: int) -> list[list[tuple]]:
    """The version's chunks grouped into batches, each item ``(ref, pieces)`` with
    ``pieces`` = ((offset in the chunk, file offset, length), ...), batches in file order."""
    per_chunk: dict[tuple[int, int], list] = {}
    for foff, n, sidx, soff in m.extents:
        stream = m.streams[sidx]
        starts = stream.starts()
        k = stream.locate(soff)
        pos, end = soff, soff + n
        while pos < end:
            c0 = starts[k]
            take = min(end, c0 + stream.chunks[k].raw) - pos
            per_chunk.setdefault((sidx, k), []).append((pos - c0, foff + pos - soff, take))
            pos += take
            k += 1
    items = sorted(((pieces[0][1], m.streams[sidx].chunks[k], tuple(pieces))
                    for (sidx, k), pieces in per_chunk.items()), key=lambda t: t[0])
    batches: list[list[tuple]] = []
    cur: list[tuple] = []
    nbytes = 0
    for _, ref, pieces in items:
        cur.append((ref, pieces))
        nbytes += ref.raw
        if nbytes >= batch_bytes:
            batches.append(cur)
            cur, nbytes = [], 0
    if cur:
        batches.append(cur)
    return _with_their_pairs(batches)


def _with_their_pairs(batches: list[list[tuple]]) -> list[list[tuple]]:
    """Each pair of this version (s4fs.write.pairs: a master on its copy, or the copy on
    its master) in one batch, so that one worker decodes both and the first once (its
    decoded cache), where batches apart would each decode it: the copy's chunk (half the
    bytes) goes to its master's batch, before it or after it as it is decoded. Masters
    lie spread over the file's batches, so the batches stay about even."""
    home = {ref.key(): k for k, b in enumerate(batches) for ref, _ in b}
    items = {ref.key(): (ref, pieces) for b in batches for ref, pieces in b}
    moves = []                      # (the copy's key, the master's key, copy goes after)
    for b in batches:
        for ref, _ in b:
            base = ref.base
            if not ref.paired or base.key() not in home:
                continue
            if ref.raw < base.raw:              # a copy on its master: after it
                moves.append((ref.key(), base.key(), True))
            else:                               # a master on its copy: the copy before
                moves.append((base.key(), ref.key(), False))
    moves = [m for m in moves if home[m[0]] != home[m[1]]]
    if not moves:
        return batches
    out = [list(b) for b in batches]
    for copy, master, after in moves:
        item = items[copy]
        out[home[copy]].remove(item)
        to = out[home[master]]
        at = next(i for i, (r, _) in enumerate(to) if r.key() == master)
        to.insert(at + 1 if after else at, item)
        home[copy] = home[master]
    return [b for b in out if b]


LEAD = 1 << 20      # bytes after the first read, and before the file's end, decoded first


def order(batches: list, first: int, lead: int = LEAD) -> list:
    """``batches`` in the order they are decoded: those holding the first read's bytes
    (``first`` and the ``lead`` bytes the kernel reads ahead of it), then those
    holding the file's last ``lead`` bytes (torch.load reads the zip's directory
    there next: its pages also hold the end of the last storage, whose chunks may lie in
    any batch), then the rest in file order."""
    if len(batches) < 2:
        return batches
    size = max(fo + n for b in batches for _, ps in b for _, fo, n in ps)

    def holds(b, lo: int, hi: int) -> bool:
        return any(fo < hi and lo < fo + n for _, ps in b for _, fo, n in ps)

    picked = [i for i, b in enumerate(batches) if holds(b, first, first + lead)]
    picked += [i for i, b in enumerate(batches)
               if i not in picked and holds(b, max(0, size - lead), size)]
    return [batches[i] for i in picked] + \
        [b for i, b in enumerate(batches) if i not in picked]


class Ranges:
    """Disjoint sorted [lo, hi) intervals of the file that are filled."""

    def __init__(self) -> None:
        self.lo: list[int] = []
        self.hi: list[int] = []

    def add(self, lo: int, hi: int) -> None:
        i = bisect.bisect_left(self.hi, lo)
        j = bisect.bisect_right(self.lo, hi)
        if i < j:
            lo = min(lo, self.lo[i])
            hi = max(hi, self.hi[j - 1])
        self.lo[i:j] = [lo]
        self.hi[i:j] = [hi]

    def covers(self, lo: int, hi: int) -> bool:
        i = bisect.bisect_right(self.lo, lo) - 1
        return i >= 0 and self.hi[i] >= hi

    def prefix(self) -> int:
        """The end of the filled run that starts at 0 (0: none)."""
        return self.hi[0] if self.lo and self.lo[0] == 0 else 0

    def gap(self, lo: int, hi: int) -> tuple[int, int] | None:
        """The first part of [lo, hi) that no interval covers, or None."""
        i = bisect.bisect_right(self.lo, lo) - 1
        if i >= 0 and self.hi[i] > lo:
            lo = self.hi[i]
        if lo >= hi:
            return None
        j = bisect.bisect_right(self.lo, lo)
        return lo, min(hi, self.lo[j]) if j < len(self.lo) else hi


class _Mapped:
    """The copy's bytes for the hash, read through a mapping (no copy into the
    process); ``pread`` where it cannot be mapped."""

    def __init__(self, fd: int, size: int) -> None:
        self.fd = fd
        try:
            self._map = mmap.mmap(fd, size, mmap.MAP_SHARED, mmap.PROT_READ)
            self._mv = memoryview(self._map)
        except (OSError, ValueError):
            self._map = self._mv = None

    def __call__(self, pos: int, n: int):
        if self._mv is not None:
            return self._mv[pos: pos + n]
        data = os.pread(self.fd, n, pos)
        if len(data) != n:
            raise OSError(f"the copy ends at {pos + len(data)}, before {pos + n}")
        return data

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        if self._mv is not None:
            self._mv.release()
            try:
                self._map.close()
            except BufferError:         # a slice still held: the mapping goes with it
                pass


class Fill:
    """One version being decoded into the decoded cache (shared by its readers)."""

    def __init__(self, m: Manifest, store, cache, pool, batch_bytes: int,
                 on_done, first: int = 0, fetcher=None) -> None:
        self.m = m
        self.cache = cache
        self.pool = pool
        self.path = os.path.join(cache.folder, FILL_PREFIX + m.id)
        self._cond = threading.Condition()
        self._done = Ranges()
        self._landings = 0                     # batches accounted so far
        self.failed: BaseException | None = None
        self._left = 0
        self._on_done = on_done
        self._started = time.monotonic()
        self._first: float | None = None       # when the first batch landed
        self._over = False                      # _finish is done: ``ok`` says how
        self.ok = False
        # the whole-file hash, taken over the copy's filled prefix as it grows
        self._hash = xxhash.xxh3_128() if m.xxh128 else None
        self._hashed = 0
        self._hasher: threading.Thread | None = None
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            os.ftruncate(fd, m.size)
            # how the workers write it (a shared mapping in tmpfs, pwrite elsewhere),
            # its blocks reserved now: a cache disk without room for the copy is found
            # here, and its reads decode in the daemon
            self.mapped = mapped_copy(fd, m.size)
        except OSError:
            os.close(fd)
            os.unlink(self.path)
            raise
        self.fd = fd
        self.batches = order(plan(m, batch_bytes), first)
        self._spec = pickle.dumps(store)
        self._left = self._batches = len(self.batches)
        self.fetch = None
        log.info("decoding %s ahead: %d batches%s", m.id, len(self.batches),
                 ", fetched ahead" if fetcher is not None else "")
        if not self.batches:
            self._finish()
            return
        if self._hash is not None:
            self._hasher = threading.Thread(target=self._follow, daemon=True,
                                            name="s4fs-fill-hash")
            self._hasher.start()
        if fetcher is None:
            for k in range(len(self.batches)):
                self._decode(k, None)
            return
        # a remote store: the stored bytes come in first, many GETs in flight, and each
        # batch is decoded from local bytes once they are all in (s4fs.read.fetch)
        try:
            self.fetch = Fetch(store, self.batches,
                               os.path.join(cache.folder, FETCH_PREFIX + m.id),
                               self._decode, self._not_fetched)
        except OSError as exc:
            log.warning("cannot fetch %s ahead (%s); its batches fetch as they decode",
                        m.id, exc)
            for k in range(len(self.batches)):
                self._decode(k, None)
            return
        self.fetch.start(fetcher)

    def ranges(self, k: int) -> list[tuple[int, int]]:
        """The file ranges batch ``k`` (of ``batches``, in the order they decode) fills."""
        return [(fo, fo + n) for _, ps in self.batches[k] for _, fo, n in ps]

    def _decode(self, k: int, staged) -> None:
        """Submit batch ``k`` to the pool (its stored bytes in ``staged``, or None: the
        worker fetches them itself)."""
        job = DecodeJob(self._spec, self.path, tuple(self.batches[k]), staged, self.mapped)
        try:
            fut = self.pool.submit_decode(job)
        except BaseException as exc:                # noqa: BLE001 - reported to readers
            self._account(exc, None)
            return
        fut.add_done_callback(lambda f, k=k: self._landed(f, k))

    def _not_fetched(self, k: int, exc: BaseException) -> None:
        self._account(exc, None)

    def _landed(self, fut, k: int) -> None:
        try:
            self.pool.result(fut, f"version {self.m.id}", doing="decoding",
                             then="its readers decode in the daemon")
            exc = None
        except BaseException as e:                  # noqa: BLE001 - reported to readers
            exc = e
        self._account(exc, self.ranges(k))

    def _account(self, exc: BaseException | None, ranges) -> None:
        """One batch ended: decoded into the copy (its file ``ranges``), or ``exc``."""
        with self._cond:
            if exc is not None:
                if self.failed is None:
                    self.failed = exc
                    log.warning("decoding %s ahead failed (%s); its readers decode in the "
                                "daemon", self.m.id, exc)
            else:
                for lo, hi in ranges:
                    self._done.add(lo, hi)
                if self._first is None:
                    self._first = time.monotonic() - self._started
            self._left -= 1
            self._landings += 1
            last = self._left == 0
            self._cond.notify_all()
        if last:
            threading.Thread(target=self._finish, daemon=True, name="s4fs-fill-end").start()

    def attach(self) -> int | None:
        """A descriptor of the copy being filled, for one reader; None once it is over."""
        with self._cond:
            if self.fd < 0 or self.failed is not None:
                return None
            return os.dup(self.fd)

    def has(self, lo: int, hi: int) -> bool:
        """Whether [lo, hi) is filled already (no waiting)."""
        with self._cond:
            return self._done.covers(lo, hi)

    def wait(self, lo: int, hi: int) -> bool:
        """Block until [lo, hi) is filled; False if the fill failed first."""
        with self._cond:
            while not self._done.covers(lo, hi):
                if self.failed is not None:
                    return False
                self._cond.wait()
            return True

    def landed(self, seen: int = -1):
        """``(landings, ranges, over)`` once more than ``seen`` batches have ended (at
        once for -1, or when no more will): ``ranges`` the file's filled ranges, merged
        and sorted; ``landings`` what to pass as ``seen`` next; ``over`` whether no more
        will land (every batch ended, or the fill failed: ``failed``)."""
        with self._cond:
            while self._landings <= seen and self.failed is None and self._left > 0:
                self._cond.wait()
            over = self.failed is not None or self._left == 0
            return self._landings, list(zip(self._done.lo, self._done.hi)), over

    def _follow(self) -> None:
        """Hash the copy's filled prefix as it grows (batches land about in file
        order), so that the whole-file check, which a reader waiting for the whole
        copy waits for, has little left to read once the last batch is in. Batches
        are disjoint and a batch's bytes are all written when it is accounted, so the
        bytes hashed are the copy's final bytes."""
        pos, size = 0, self.m.size
        try:
            with _Mapped(self.fd, size) as view:
                while pos < size:
                    with self._cond:
                        while (end := self._done.prefix()) <= pos:
                            if self.failed is not None or self._left == 0:
                                return
                            self._cond.wait()
                    while pos < end:
                        n = min(16 << 20, end - pos)
                        self._hash.update(view(pos, n))
                        pos += n
        except (OSError, ValueError) as exc:   # the check at the end reads the copy again
            log.warning("hashing the copy of %s as it filled: %s", self.m.id, exc)
        finally:
            self._hashed = pos

    def _finish(self) -> None:
        """Every batch is in: check the whole copy, then hand it to the decoded cache."""
        if self.fetch is not None:
            self.fetch.close()
        if self._hasher is not None:        # done with the copy before it is closed
            self._hasher.join()
        ok = self.failed is None and self._hash_ok()
        if ok and self._batches:
            log.info("decoded %s ahead: %d batches, %.1f MiB in %.2f s (the first landed "
                     "after %.2f s)", self.m.id, self._batches, self.m.size / 2**20,
                     time.monotonic() - self._started, self._first or 0.0)
        if ok:
            ok = self.cache.adopt_file(self.m.id, self.path, self.m.size)
        else:
            try:
                os.unlink(self.path)
            except OSError:
                pass
        with self._cond:
            fd, self.fd = self.fd, -1
        os.close(fd)
        self._on_done(self, ok)
        with self._cond:
            self._over, self.ok = True, ok
            self._cond.notify_all()

    def wait_whole(self) -> bool:
        """Block until the fill is over: True when the copy is whole, checked against
        the whole-file hash and the decoded cache's entry; False when it failed."""
        with self._cond:
            while not self._over:
                self._cond.wait()
            return self.ok

    def _hash_ok(self) -> bool:
        if not self.m.xxh128:
            return True
        if self._hashed == self.m.size:
            h, pos = self._hash, self._hashed
        else:                           # not followed to the end: the copy read again
            h = xxhash.xxh3_128()
            pos = 0
            while pos < self.m.size:
                data = os.pread(self.fd, min(16 << 20, self.m.size - pos), pos)
                if not data:
                    break
                h.update(data)
                pos += len(data)
        if pos == self.m.size and h.hexdigest() == self.m.xxh128:
            return True
        log.error("the copy of %s decoded ahead does not match its whole-file hash; it "
                  "was dropped (every chunk passed its own check: report this)", self.m.id)
        with self._cond:
            self.failed = self.failed or RuntimeError("whole-file hash mismatch")
            self._cond.notify_all()
        return False


class Fills:
    """The versions one filesystem is decoding ahead, and where that runs: the CPU
    worker processes, or the GPU (its worker process on a mount, threads of this process
    for the API). Needs the decoded cache the copies become entries of; ``pools``: the
    worker processes; ``gpu_batch``: the most bytes of one batch decoded on the GPU;
    ``fetcher``: the threads that fetch a remote store's bytes ahead of the decode
    (s4fs.read.fetch), or None (a local store: the workers read it in place)."""

    def __init__(self, store, decoded, ingest: IngestConfig, source, pools: Pools,
                 gpu_batch: int, fetcher=None) -> None:
        self.store, self.decoded, self.ingest, self.source = store, decoded, ingest, source
        self.pools, self.gpu_batch, self.fetcher = pools, gpu_batch, fetcher
        self._lock = threading.RLock()
        self._fills: dict[str, Fill] = {}

    def start(self, m: Manifest, first: int = 0):
        """Decode version ``m`` ahead, the bytes at file offset ``first`` first: ``(fill,
        fd)`` for a reader — ``fill`` to wait on (None when the copy is already whole),
        ``fd`` to read it — or None (then the reader decodes in this process)."""
        if self.decoded is None or not placement(self.ingest).decodes_ahead or \
                m.size < MIN_SIZE or m.size > self.decoded.max_bytes:
            return None
        with self._lock:
            f = self._fills.get(m.id)
            if f is None:
                fd = self.decoded.open(m.id)
                if fd is not None:
                    return None, fd
                pool, batch = self.pools.decode_ahead(self.ingest, self.source,
                                                      self.gpu_batch)
                try:
                    f = Fill(m, self.store, self.decoded, pool, batch, self._done,
                             first, self.fetcher)
                except OSError as exc:
                    log.warning("cannot decode %s ahead: %s", m.id, exc)
                    return None
                if f.fd >= 0:
                    self._fills[m.id] = f
        fd = f.attach()
        if fd is None:
            fd = self.decoded.open(m.id)
            return (None, fd) if fd is not None else None
        return f, fd

    def _done(self, f: Fill, ok: bool) -> None:
        with self._lock:
            if self._fills.get(f.m.id) is f:
                del self._fills[f.m.id]
