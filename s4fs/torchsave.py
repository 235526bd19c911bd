"""``s4fs.save`` / ``s4fs.async_save`` / ``s4fs.load``: torch files stored without ever
being written out as one byte stream.

A file saved here has exactly the bytes ``torch.save(obj, path)`` writes to a local file
of that name: torch itself lays the file out (``torch.save`` under
``torch.serialization.skip_data()`` into a sparse scratch file of the same name, which
holds every zip header, the pickle and the small records, and only holes where the
storages go); s4fs fills in what depends on the storage bytes — the CRC-32 of every
storage record (zip data descriptor and central directory) and the serialization id
(a hash of those CRCs) — and stores the storages themselves:

* **CPU storages**: the file's bytes, in order, go through the ingest pipeline
  (parser, chunks, delta against the previous version, CPU codec), as a mount would
  store them.
* **CUDA storages**: coded on the device, straight from the tensors' memory, batched
  across tensors (``s4fs.codec.gpu.compress_many``); the CRC-32s and the file's
  XXH3-128 are computed on the device too (``s4fs.codec.gpu._wholefile``; the hash on
  a thread and stream of its own once the storages are coded), so only coded bytes
  cross to the host. The manifest is built here, with the same streams,
  names and dtypes the parser would give.

``async_save`` takes a snapshot first (the pickle, and a copy of every storage: on the
device for CUDA storages, in host memory for CPU ones) and returns a Future; the
coding and the commit run on one background thread. ``load(..., map_location="cuda")``
decodes the storages on the device and rebuilds the objects with torch's own
unpickling (``torch.serialization._load``).
"""

from __future__ import annotations

import bisect
import concurrent.futures as cf
import io
import logging
import os
import shutil
import struct
import tempfile
import threading
import time
import uuid
import zipfile
import zlib
from dataclasses import dataclass, field

from s4fs.errors import InvalidArgument, S4Error
from s4fs.coding import ProcessWide

log = logging.getLogger("s4fs.save")

_tls = threading.local()
_hook_lock = threading.Lock()
_DESC_SIG = b"PK\x07\x08"
_CD_SIG = b"PK\x01\x02"
_M64 = (1 << 64) - 1
GPU_BATCH_BYTES = 1 << 30          # raw bytes coded per GPU batch (bounds device memory)
GPU_FIRST_BATCHES = (64 << 20, 256 << 20)   # a device save's first batches are smaller:
                                   # its first packs reach the disk after a few ms of coding
LOAD_BATCH_BYTES = 1 << 30         # raw bytes decoded per batch while the next is read
DEVICE_SAVE_UPLOADS = 16           # packs a device save writes at once (no pack cache)


last_stages: dict[str, dict[str, float]] = {}   # "save" / "load": seconds per stage


class _Stages:
    """Wall time of each stage of the last save / load (benchmarks print it)."""

    def __init__(self, what: str) -> None:
        self.what, self.t, self.out = what, time.perf_counter(), {}

    def mark(self, stage: str) -> None:
        now = time.perf_counter()
        self.out[stage] = self.out.get(stage, 0.0) + now - self.t
        self.t = now
        last_stages[self.what] = dict(self.out)


class Unsupported(S4Error):
    """This object or call cannot take the direct path; the caller streams instead."""


# --------------------------------------------------------------------------- layout

@dataclass
class Record:
    name: str                # inside the archive folder, e.g. "data/3"
    header: int              # local header offset
    data: int                # first data byte
    size: int
    crc: int
    central: int             # offset of its central directory entry
    descriptor: int | None   # offset of its data descriptor (None: no data)


@dataclass
class Layout:
    """A torch file as torch lays it out: host pieces (every byte that is not storage
    data) and the storages, in file order."""
    size: int
    records: list[Record]
    storages: list           # torch.UntypedStorage per key "0", "1", ... (key order)
    storage_records: list[Record]
    host: list[tuple[int, bytearray]] = field(default_factory=list)   # (file offset, bytes)

    def __post_init__(self) -> None:
        self._starts = [o for o, _ in self.host]

    def patch(self, off: int, data: bytes) -> None:
        i = bisect.bisect_right(self._starts, off) - 1
        start, buf = self.host[i]
        if off + len(data) > start + len(buf):
            raise S4Error("internal error: a zip field to patch straddles a storage")
        buf[off - start: off - start + len(data)] = data

    def read(self, off: int, n: int) -> bytes:
        i = bisect.bisect_right(self._starts, off) - 1
        start, buf = self.host[i]
        return bytes(buf[off - start: off - start + n])

    def pieces(self):
        """(file offset, ("host", bytes) | ("storage", index)) in file order."""
        out = [(o, ("host", b)) for o, b in self.host]
        out += [(r.data, ("storage", i)) for i, r in enumerate(self.storage_records)
                if r.size]
        return sorted(out, key=lambda x: x[0])


def _install_hook() -> None:
    """Record, per thread, the storages ``torch.save`` meets, in the order it numbers
    them (first appearance: torch keys storages by their first ``location_tag``)."""
    import torch.serialization as ts
    with _hook_lock:
        if getattr(ts.location_tag, "_s4fs_hook", False):
            return
        orig = ts.location_tag

        def location_tag(storage):
            seen = getattr(_tls, "storages", None)
            if seen is not None:
                seen.setdefault(storage._cdata, storage)
            return orig(storage)
        location_tag._s4fs_hook = True
        ts.location_tag = location_tag


def layout(obj, name: str, **save_kwargs) -> Layout:
    """torch's layout of ``torch.save(obj, <dir>/name)``: a sparse scratch file written
    by torch with ``skip_data``, read back (its headers only)."""
    import torch
    if save_kwargs.get("_use_new_zipfile_serialization", True) is False:
        raise Unsupported("the legacy (non-zip) torch format")
    if not hasattr(torch.serialization, "skip_data"):
        raise Unsupported("this torch has no serialization.skip_data")
    _install_hook()
    tmp = tempfile.mkdtemp(prefix="s4fs-layout-")
    path = os.path.join(tmp, name)
    _tls.storages = {}
    try:
        with torch.serialization.skip_data():
            torch.save(obj, path, **save_kwargs)
        storages = list(_tls.storages.values())
        return _read_layout(path, storages)
    finally:
        _tls.storages = None
        shutil.rmtree(tmp, ignore_errors=True)


def _read_layout(path: str, storages: list) -> Layout:
    size = os.path.getsize(path)
    fd = os.open(path, os.O_RDONLY)
    try:
        with zipfile.ZipFile(path) as z:
            infos = z.infolist()
            start_dir = z.start_dir
        records: list[Record] = []
        cd = start_dir
        for info in infos:
            head = os.pread(fd, 30, info.header_offset)
            nlen, elen = struct.unpack_from("<HH", head, 26)
            data = info.header_offset + 30 + nlen + elen
            ent = os.pread(fd, 46, cd)
            if ent[:4] != _CD_SIG:
                raise Unsupported("an unexpected zip central directory")
            n2, e2, c2 = struct.unpack_from("<HHH", ent, 28)
            desc = None
            if info.file_size:
                desc = data + info.file_size
                if os.pread(fd, 4, desc) != _DESC_SIG:
                    raise Unsupported("a zip record without a data descriptor")
            rel = info.filename.split("/", 1)[1] if "/" in info.filename else info.filename
            records.append(Record(rel, info.header_offset, data, info.file_size, info.CRC, cd,
                                  desc))
            cd += 46 + n2 + e2 + c2
        by_name = {r.name: r for r in records}
        for key, st in enumerate(storages):
            r = by_name.get(f"data/{key}")
            if r is None or r.size != st.nbytes():
                raise Unsupported("torch's storage records do not match the storages seen")
        if sum(1 for r in records if r.name.startswith("data/")) != len(storages):
            raise Unsupported("torch wrote storage records s4fs did not see")
        srecs = [by_name[f"data/{k}"] for k in range(len(storages))]
        holes = sorted((r.data, r.data + r.size) for r in srecs if r.size)
        host, pos = [], 0
        for lo, hi in holes + [(size, size)]:
            if lo > pos:
                host.append((pos, bytearray(os.pread(fd, lo - pos, pos))))
            pos = max(pos, hi)
        return Layout(size, records, storages, srecs, host)
    finally:
        os.close(fd)


def finish_layout(lay: Layout, crcs: list[int]) -> None:
    """Write the storages' CRC-32s into the zip fields and the serialization id."""
    for r, c in zip(lay.storage_records, crcs):
        r.crc = c
        if r.descriptor is not None:
            lay.patch(r.descriptor + 4, struct.pack("<I", c))
            lay.patch(r.central + 16, struct.pack("<I", c))
    sid = next((r for r in lay.records if r.name == ".data/serialization_id"), None)
    if sid is None:
        return
    old = lay.read(sid.data, sid.size)
    if len(old) != 40 or not old.isdigit():
        raise Unsupported("an unknown serialization id form")
    seed = 0
    for r in sorted(lay.records, key=lambda r: r.header):
        if r is sid or not r.size:
            continue
        seed ^= (r.crc + 0x9E3779B9 + ((seed << 6) & _M64) + (seed >> 2)) & _M64
        seed &= _M64
    new = old[:20] + b"%020d" % seed
    lay.patch(sid.data, new)
    sid.crc = zlib.crc32(new)
    lay.patch(sid.descriptor + 4, struct.pack("<I", sid.crc))
    lay.patch(sid.central + 16, struct.pack("<I", sid.crc))


def storage_bytes(st) -> memoryview:
    """A memoryview of a CPU storage's bytes (no copy)."""
    import torch
    n = st.nbytes()
    if n == 0:
        return memoryview(b"")
    t = torch.empty(0, dtype=torch.uint8).set_(st, 0, (n,))
    return memoryview(t.numpy()).cast("B")


# --------------------------------------------------------------------------- saving

def _archive_name(path: str) -> str:
    return os.path.basename(os.fspath(path).rstrip("/")) or "archive"


def save(obj, path, *, profile=None, **save_kwargs) -> None:
    """``torch.save(obj, path)`` into the store that holds ``path``."""
    _Save(obj, path, save_kwargs, profile=profile).run()


class _Save:
    """One save: the layout taken at construction (a snapshot of the pickle), the
    storages coded and the file committed by :meth:`run`."""

    def __init__(self, obj, path, save_kwargs: dict, *, snapshot: bool = False,
                 profile=None) -> None:
        from s4fs.paths import resolve
        self.path = path
        self.t0 = time.perf_counter()
        self.stages = _Stages("save")
        self.fs, self.rel = resolve(path, create=True)
        if not self.rel:
            raise InvalidArgument(f"{path} names a store, not a file in it")
        self.lay = layout(obj, _archive_name(path), **save_kwargs)
        self.stages.mark("layout (torch, skip_data)")
        self.profile = profile
        self.on_cuda = any(st.device.type == "cuda" for st in self.lay.storages)
        self.snap: list = []          # snapshot copies (async): keep them alive
        if snapshot:
            self._snapshot()
            self.stages.mark("snapshot")

    def _snapshot(self) -> None:
        import torch
        copies = []
        streams = set()
        for st in self.lay.storages:
            n = st.nbytes()
            if st.device.type == "cuda":
                t = torch.empty(n, dtype=torch.uint8, device=st.device)
                t.untyped_storage().copy_(st)
                streams.add(st.device)
            elif st.device.type == "cpu":
                t = torch.empty(n, dtype=torch.uint8)
                t.untyped_storage().copy_(st)
            else:
                raise Unsupported(f"storages on {st.device}")
            copies.append(t.untyped_storage())
        for dev in streams:
            torch.cuda.current_stream(dev).synchronize()
        self.snap = copies
        self.lay.storages = copies

    # -- the two paths ---------------------------------------------------------------

    def run(self) -> None:
        if self.on_cuda:
            m = _DeviceSave(self).manifest()
        else:
            m = self._ingest()
        self.stages.mark("code + store")
        self.fs.commit(self.rel, m)
        self.stages.mark("commit")
        self.snap = []
        from s4fs import metrics
        from s4fs.report import stored_split
        split = stored_split(m)
        metrics.observe_save(self.rel, m.size, m.stored_bytes(),
                             time.perf_counter() - self.t0,
                             stored_delta=split["stored_delta"], unchanged=split["unchanged"])

    def _previous(self):
        return self.fs._manifest_or_none(self.rel)

    def _ingest(self):
        """CPU storages: the exact file bytes through the ingest pipeline."""
        lay = self.lay
        views = [storage_bytes(st) for st in lay.storages]
        with cf.ThreadPoolExecutor(min(8, max(1, len(views)))) as ex:
            crcs = list(ex.map(zlib.crc32, views))
        finish_layout(lay, crcs)
        s = self.fs.new_session(self.rel, self._previous())
        try:
            for _, (kind, what) in lay.pieces():
                if kind == "host":
                    s.write(bytes(what), stable=True)
                else:
                    s.write(views[what], stable=True)
            return s.finish()
        except BaseException:
            s.abort()
            raise


class _DeviceSave:
    """The manifest of a save whose storages live (partly) on a CUDA device."""

    def __init__(self, job: _Save) -> None:
        self.job = job
        self.fs = job.fs
        self.cfg = job.fs.cfg.ingest
        self.base_info = None                   # the delta base's path and id, once chosen

    def manifest(self):
        import torch
        from s4fs.codec import gpu
        from s4fs.write import PackWriter
        from s4fs.manifest import Manifest, Stream
        from s4fs.parse._pickle_scan import itemsize, scan_pickle
        gpu.require()
        lay, st = self.job.lay, self.job.stages
        devs = {s.device for s in lay.storages if s.device.type == "cuda"}
        if len(devs) != 1:
            raise Unsupported("storages on more than one CUDA device")
        dev = devs.pop()
        self.device = dev.index if dev.index is not None else torch.cuda.current_device()
        host = {i: storage_bytes(s) for i, s in enumerate(lay.storages) if s.device.type == "cpu"}
        on_dev = [i for i in range(len(lay.storages)) if i not in host]
        torch.cuda.current_stream(dev).synchronize()   # the tensors are final on the device

        # 1. CRC-32 of every storage (device ones on the device)
        crcs = dict(zip(on_dev, gpu.crc32_many([lay.storages[i].data_ptr() for i in on_dev],
                                               [lay.storages[i].nbytes() for i in on_dev],
                                               device=self.device)))
        crcs.update((i, zlib.crc32(mv)) for i, mv in host.items())
        finish_layout(lay, [crcs[i] for i in range(len(lay.storages))])
        st.mark("CRC-32 (device)")

        # 2. the file as pieces, for its XXH3-128 on the device (hashed below)
        pieces = []                       # (offset, length, host bytes | device pointer)
        for off, (kind, what) in lay.pieces():
            if kind == "host":
                pieces.append((off, len(what), what))
            else:
                n = lay.storage_records[what].size
                pieces.append((off, n, host[what] if what in host
                               else int(lay.storages[what].data_ptr())))

        # 3. streams: raw (every host byte) + one per storage record, as the parser makes
        pkl = next(r for r in lay.records if r.name == "data.pkl")
        scan = scan_pickle(lay.read(pkl.data, pkl.size))
        raw = Stream("raw")
        streams, extents, raw_len, jobs = [raw], [], 0, []
        for off, (kind, what) in lay.pieces():
            if kind == "host":
                extents.append((off, len(what), 0, raw_len))
                raw_len += len(what)
                continue
            size = lay.storage_records[what].size
            info = scan.storages.get(str(what))
            dtype = info.dtype if info is not None else "bytes"
            s = Stream("tensor", dtype if size % itemsize(dtype) == 0 else "bytes", f"data/{what}")
            streams.append(s)
            extents.append((off, size, len(streams) - 1, 0))
            jobs.append((s, what))
        cache = self.fs.pack_cache
        # without a pack cache a pack in flight is a list of views of the batch's pinned
        # buffer (no copy of its own), so more of them at once cost no memory, and a local
        # disk takes them faster from 16 writers than from 4 (docs/BENCHMARKS.md)
        packs = PackWriter(self.fs.store, self.cfg, cache.put if cache is not None else None,
                           uploads=None if cache is not None else
                           max(self.cfg.max_uploads, DEVICE_SAVE_UPLOADS))
        bases = self._bases()
        st.mark("plan (pickle scan, streams, delta base)")
        hashing = None
        try:
            self._code_device(jobs, host, packs, bases)
            # the file's hash, on a thread (and stream) of its own, starts once the GPU
            # batches are coded and runs beside the CPU storages and the last pack
            # writes. Started beside the coding, it held the first batch up by about its
            # own length (0.14 s instead of 0.02 for 1.77 GiB on the H200). The save
            # does not end (nor free a snapshot) before it is done.
            hashing = _hashing.get(_one_thread("s4fs-save-hash")).submit(
                gpu.xxh3_128_pieces, pieces, lay.size, device=self.device)
            for s, i in jobs:
                if i in host:
                    self._code_host(s, host[i], packs, bases.get((s.name, s.dtype, len(host[i]))))
            self._code_host(raw, memoryview(b"".join(bytes(buf) for _, buf in lay.host)), packs)
            st.mark("CPU storages (CPU codec)")
            packs.finish()
            st.mark("store (pack uploads)")
            digest = hashing.result()
            st.mark("XXH3-128 (device, after the coding): the wait")
        except BaseException:
            packs.abandon()
            if hashing is not None:
                cf.wait([hashing])      # it reads the storages: done before they may go
            raise
        finally:
            _gpu_release(self.device)
        names = {f"data/{k}": v for k, v in scan.names.items()}
        return Manifest(size=lay.size, xxh128=digest, mtime=time.time(), mode=0o100644,
                        kind="torch-zip", id=uuid.uuid4().hex, streams=streams,
                        extents=extents, names=names, own_packs=list(packs.keys),
                        base=self.base_info)

    def _bases(self) -> dict:
        """The delta base's tensor streams by (name, dtype, length), its record kept in
        ``base_info``; none when deltas are off or no stored file resembles this one
        (``s4fs.write.choose_base``, the rule of every other save)."""
        if not self.fs.cfg.delta:
            return {}
        from s4fs.write import choose_base
        from s4fs.coding import base_streams
        chosen = choose_base(self.fs, self.job.rel, self.job._previous())
        if chosen is None:
            return {}
        path, base = chosen
        self.base_info = {"path": path, "id": base.id}
        return base_streams(base)

    def _code_device(self, jobs, host: dict, packs, bases: dict) -> None:
        """The device storages in GPU batches: the first ones small (the disk starts
        writing after a few ms of coding), then up to GPU_BATCH_BYTES (half of it when
        there is a delta base: the base chunks are decoded on the device beside the
        batch). The CPU ones (``host``) are left to the caller.

        Deltas follow the rule of every other save (``s4fs.coding.code_chunk``): a chunk
        whose base chunk (same record, dtype and length; chain not too deep) has its
        exact bytes is stored as that chunk; otherwise the smaller of its XOR delta and
        its full coding is kept. The base chunks come from the store, decoded on the
        device (``s4fs.read.reader.decode_on_gpu``) before their batch is coded, while the
        packs of the batches before it are being written. (Decoded one batch ahead on a
        thread of their own, beside the coding, they made the save slower on the H200:
        1.59 s instead of 1.13 for a 1.77 GiB GPT + AdamW, the coding and the pack
        writes contending with the decoding; docs/BENCHMARKS.md.)"""
        import torch
        # the codec, and the base decoding, work on the calling thread's current device:
        # the storages' (an async save's thread, a rank's other GPU)
        with torch.cuda.device(self.device):
            for batch in self._batches(jobs, host, bases):
                self.job.stages.mark("batching")
                prep = self._decode_bases(batch)
                self.job.stages.mark("delta bases (read, decoded on the device)")
                self._code_batch(batch, prep, packs)

    def _batches(self, jobs, host: dict, bases: dict) -> list[list]:
        """The device storages' chunks, ``(stream, device view, base ref | None)``, in
        GPU batches of growing size (GPU_FIRST_BATCHES, then the full size)."""
        import torch
        from s4fs.coding import base_chunk, delta_candidate
        lay, step = self.job.lay, self.cfg.chunk_size
        full = GPU_BATCH_BYTES // 2 if bases else GPU_BATCH_BYTES
        out: list[list] = [[]]
        held = 0                                  # raw bytes in the last batch
        for s, i in jobs:
            if i in host:
                continue
            stg = lay.storages[i]
            n = stg.nbytes()
            whole = torch.empty(0, dtype=torch.uint8, device=stg.device).set_(stg, 0, (n,))
            base = bases.get((s.name, s.dtype, n))
            for k, o in enumerate(range(0, n, step)):
                piece = whole[o: o + step]
                ref = base_chunk(base, k)
                out[-1].append((s, piece, ref if delta_candidate(ref, piece.numel(), self.cfg)
                                else None))
                held += piece.numel()
                limit = (GPU_FIRST_BATCHES[len(out) - 1] if len(out) <= len(GPU_FIRST_BATCHES)
                         else full)
                if held >= limit:
                    out.append([])
                    held = 0
        return [b for b in out if b]

    def _decode_bases(self, batch: list) -> list:
        """Per chunk of ``batch``: None, or ``("delta", its base chunk's bytes on the
        device)`` (``s4fs.coding.code_on_device``'s ``prep``)."""
        refs = [ref for _, _, ref in batch if ref is not None]
        if not refs:
            return [None] * len(batch)
        from s4fs.coding import readable_base
        from s4fs.read.reader import decode_on_gpu
        # complete when it returns; None (a damaged older checkpoint): coded in full
        decoded = readable_base(lambda: decode_on_gpu(self.fs.source, refs),
                                f"file {self.base_info['path']}", key=self.base_info["id"])
        if decoded is None:
            return [None] * len(batch)
        return [("delta", decoded[ref.key()]) if ref is not None else None
                for _, _, ref in batch]

    def _code_batch(self, batch: list, prep: list, packs) -> None:
        """One GPU batch, every chunk coded in one call by the delta rule
        (``s4fs.coding.code_on_device``); blobs to the pack writer."""
        import torch
        from s4fs.coding import code_on_device
        stages = self.job.stages

        def same(k: int) -> bool:
            t = batch[k][1]
            return torch.equal(t, torch.as_tensor(prep[k][1], device=t.device))

        results = code_on_device([(t, s.dtype, ref) for s, t, ref in batch], prep,
                                 self.job.profile, self.cfg, same)
        stages.mark("GPU coding (blobs in pinned memory)")
        for (s, _, _), res in zip(batch, results):
            s.chunks.append(packs.place(*res))    # blobs: views of pinned memory
        stages.mark("packing (and waiting for pack writes)")

    def _code_host(self, stream, mv, packs, base=None) -> None:
        """Host bytes into ``stream``'s chunks, coded on the CPU by the chunk rule
        (``s4fs.coding``: deltas against ``base``'s chunks where they pay)."""
        from s4fs import codec
        from s4fs.coding import base_chunk, chunk_result
        step = self.cfg.chunk_size
        for k, o in enumerate(range(0, len(mv), step)):
            piece = mv[o: o + step]
            ref = base_chunk(base, k)
            stream.chunks.append(packs.place(*chunk_result(
                piece, stream.dtype, codec.checksum(piece), ref,
                lambda: self.fs.source.get(ref), self.cfg, device="cpu")))


def _gpu_release(device: int) -> None:
    """The codec's cached device memory on ``device`` (the save's or load's) back."""
    from s4fs.codec import gpu
    gpu.release_memory(device=device)


# --------------------------------------------------------------------------- async

_background = ProcessWide()         # the thread async saves run on, one after another
_hashing = ProcessWide()            # the thread that hashes device saves' files after
                                    # their coding (one codec backend and stream, kept)


def _one_thread(name: str):
    return lambda: cf.ThreadPoolExecutor(1, thread_name_prefix=name)


def async_save(obj, path, *, profile=None, **save_kwargs) -> cf.Future:
    """Snapshot ``obj`` now, store it in the background; see :func:`s4fs.async_save`."""
    try:
        job = _Save(obj, path, save_kwargs, snapshot=True, profile=profile)
    except Unsupported:
        raise
    except BaseException as exc:         # CUDA OOM while copying, a bad path, ...
        if isinstance(exc, (KeyboardInterrupt, SystemExit)):
            raise
        fut: cf.Future = cf.Future()
        fut.set_exception(exc)
        return fut
    return _background.get(_one_thread("s4fs-async-save")).submit(job.run)


# --------------------------------------------------------------------------- loading

def _cuda_target(map_location):
    """The CUDA device ``map_location`` sends every storage to, or None."""
    import torch
    if isinstance(map_location, (str, torch.device)):
        dev = torch.device(map_location)
        if dev.type == "cuda":
            return torch.device("cuda", dev.index if dev.index is not None
                                else torch.cuda.current_device())
    return None


def wants_device_load(map_location) -> bool:
    from s4fs.codec import _device
    try:
        return _cuda_target(map_location) is not None and _device.gpu_available()
    except Exception:                      # noqa: BLE001 - no torch CUDA: the stream path
        return False


class _RawOnly(io.RawIOBase):
    """A file object over a stored torch file that reads only its raw stream (zip
    headers, pickle, small records): bytes of tensor streams read as zeros, so reading
    the zip's metadata never decodes a tensor chunk."""

    def __init__(self, fs, rel: str, m) -> None:
        super().__init__()
        self._r = fs.open_read(rel)
        self._m = m
        self._pos = 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def close(self) -> None:
        if self._r is not None:
            self._r.release()
            self._r = None
        super().close()

    def tell(self) -> int:
        return self._pos

    def seek(self, offset: int, whence: int = 0) -> int:
        self._pos = {0: 0, 1: self._pos, 2: self._m.size}[whence] + offset
        return self._pos

    def readinto(self, buf) -> int:
        mv = memoryview(buf).cast("B")
        n = max(0, min(len(mv), self._m.size - self._pos))
        lo, hi = self._pos, self._pos + n
        for off, length, s, _ in self._m.extents:
            a, b = max(lo, off), min(hi, off + length)
            if a >= b:
                continue
            if s == 0:
                got = self._r.read(a, b - a)
                mv[a - lo: a - lo + len(got)] = got
            else:
                mv[a - lo: b - lo] = bytes(b - a)
        self._pos = hi
        return n


class _Records:
    """What ``torch.serialization._load`` reads from a zip reader: small records from the
    stored file, storages already decoded on the device."""

    def __init__(self, small: dict[str, bytes], storages: dict[str, object], sid: str):
        self._small, self._storages, self._sid = small, storages, sid

    def has_record(self, name: str) -> bool:
        return name in self._small or name in self._storages

    def get_record(self, name: str) -> bytes:
        return self._small[name]

    def get_storage_from_record(self, name: str, nbytes: int, _cls):
        t = self._storages[name]
        if t.numel() != nbytes:
            raise S4Error(f"record {name} holds {t.numel()} bytes, the pickle asks for {nbytes}")
        return t

    def get_all_records(self) -> list[str]:
        return list(self._small) + list(self._storages)

    def serialization_id(self) -> str:
        return self._sid


def load(path, map_location=None, **load_kwargs):
    """``torch.load`` of a stored file; with ``map_location`` naming a CUDA device (and a
    usable GPU codec) the storages are decoded on that device."""
    import pickle
    import torch
    from s4fs import paths
    if "mmap" in load_kwargs or not wants_device_load(map_location):
        with paths.open(path) as f:
            return torch.load(f, map_location=map_location, **load_kwargs)
    dev = _cuda_target(map_location)
    stages = _Stages("load")
    fs, rel = paths.resolve(path)
    m = fs.manifest(rel)
    weights_only = load_kwargs.pop("weights_only", None)
    pickle_module = load_kwargs.pop("pickle_module", None)
    if weights_only is None:
        weights_only = pickle_module is None
    if weights_only:
        if pickle_module is not None:
            raise InvalidArgument("pass either weights_only=True or a pickle_module, not both")
        pickle_module = torch.serialization._weights_only_unpickler
    elif pickle_module is None:
        pickle_module = pickle
    load_kwargs.setdefault("encoding", "utf-8")
    with io.BufferedReader(_RawOnly(fs, rel, m), 1 << 16) as f:
        with zipfile.ZipFile(f) as z:
            infos = z.infolist()
            prefix = infos[0].filename.split("/", 1)[0] + "/" if infos else ""
            small, sizes = {}, {}
            for info in infos:
                rel_name = info.filename[len(prefix):]
                if rel_name.startswith("data/") and "/" not in rel_name[5:]:
                    sizes[rel_name] = info
                else:
                    small[rel_name] = z.read(info)
    offsets = {}
    starts = {m.streams[s].name: off for off, _, s, s_off in m.extents
              if s_off == 0 and m.streams[s].kind == "tensor"}
    for name, info in sizes.items():
        off = starts.get(name)
        if off is None:                   # not a tensor stream: its header, read for real
            with paths.open(path) as g:
                g.seek(info.header_offset)
                nlen, elen = struct.unpack_from("<HH", g.read(30), 26)
            off = info.header_offset + 30 + nlen + elen
        offsets[name] = (off, info.file_size)
    stages.mark("manifest + zip records")
    storages = _decode_storages(fs, m, offsets, dev, path, stages)
    sid = small.get(".data/serialization_id", b"").decode("ascii", "replace")
    try:
        out = torch.serialization._load(_Records(small, storages, sid), map_location,
                                        pickle_module, **load_kwargs)
        stages.mark("unpickle")
        return out
    finally:
        _gpu_release(dev.index)


def _decode_storages(fs, m, offsets: dict, dev, path, stages) -> dict:
    """Every storage record's bytes as a uint8 CUDA tensor on ``dev``: tensor streams
    decoded on the device (delta chains level by level), anything else read on the host
    and copied up."""
    import torch

    from s4fs.read.reader import decode_on_gpu
    by_name = {s.name: (k, s) for k, s in enumerate(m.streams) if s.kind == "tensor"}
    out: dict[str, object] = {}
    plans = []                                  # (record name, stream)
    for name, (off, n) in offsets.items():
        hit = by_name.get(name)
        if hit is not None and _stream_at(m, hit[0], off, n):
            plans.append((name, hit[1]))
        else:
            from s4fs import paths
            with paths.open(path) as f:
                f.seek(off)
                data = f.read(n)
            t = torch.empty(n, dtype=torch.uint8, device=dev)
            if n:
                t.copy_(torch.frombuffer(bytearray(data), dtype=torch.uint8))
            out[name] = t
    refs = [c for _, s in plans for c in s.chunks]
    with torch.cuda.device(dev):
        decoded = decode_on_gpu(fs.source, refs, batch_bytes=LOAD_BATCH_BYTES)
        stages.mark("read + decode (GPU)")
        for name, s in plans:
            n = s.length
            t = torch.empty(n, dtype=torch.uint8, device=dev)
            at = 0
            for c in s.chunks:
                if c.raw:
                    t[at: at + c.raw].copy_(torch.as_tensor(decoded[c.key()], device=dev))
                at += c.raw
            out[name] = t
        torch.cuda.current_stream(dev).synchronize()
        stages.mark("storages")
    return out


def _stream_at(m, sidx: int, off: int, n: int) -> bool:
    """Whether file bytes [off, off+n) are exactly stream ``sidx`` from its start."""
    for e_off, e_len, s, s_off in m.extents:
        if s == sidx:
            return e_off == off and e_len == n and s_off == 0
    return n == 0
