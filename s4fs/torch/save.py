"""``s4fs.save`` / ``s4fs.async_save``: torch files stored without ever being written
out as one byte stream.

A file saved here has exactly the bytes ``torch.save(obj, path)`` writes to a local file
of that name: torch itself lays the file out (``torch.save`` under
``torch.serialization.skip_data()`` into a sparse scratch file of the same name, which
holds every zip header, the pickle and the small records, and only holes where the
storages go); s4fs fills in what depends on the storage bytes — the CRC-32 of every
storage record (zip data descriptor and central directory) and the serialization id
(a hash of those CRCs; ``s4fs.parse.layout``) — and stores the storages themselves:

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
coding and the commit run on one background thread.
"""

from __future__ import annotations

import concurrent.futures as cf
import logging
import os
import shutil
import tempfile
import time
import zlib
from dataclasses import dataclass

from s4fs.errors import InvalidArgument
from s4fs.torch import Unsupported
from s4fs.parse.layout import Layout, finish_layout, read_layout

log = logging.getLogger("s4fs.save")


@dataclass(frozen=True)
class SaveConfig:
    """How a save of CUDA storages batches its coding and writes its packs."""
    gpu_batch_bytes: int = 1 << 30          # raw bytes coded per GPU batch (bounds the
                                            # device memory it takes)
    # a device save's first batches are smaller: its first packs reach the disk after a
    # few ms of coding
    gpu_first_batches: tuple[int, ...] = (64 << 20, 256 << 20)
    uploads: int = 16                       # packs written at once (no pack cache)


class Stages:
    """Wall time of each stage of one save / load since ``start``, kept as the last one's
    in ``into`` (its filesystem's runtime's ``stages``; benchmarks print it)."""

    def __init__(self, what: str, into: dict, start: float) -> None:
        self.what, self.into, self.t, self.out = what, into, start, {}

    def mark(self, stage: str) -> None:
        now = time.perf_counter()
        self.out[stage] = self.out.get(stage, 0.0) + now - self.t
        self.t = now
        self.into[self.what] = dict(self.out)


def __getattr__(name: str):
    # ``last_stages``, as benchmarks and tests read it: the stages of the last save and
    # load of the Python API's runtime (s4fs.runtime.current), which records them
    if name == "last_stages":
        from s4fs.runtime import current
        return current().stages
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


class _Nowhere:
    """A file that takes every write and keeps nothing."""

    def write(self, data) -> int:
        return len(data)


def saved_storages(obj, pickle_module=None, pickle_protocol: int | None = None) -> list:
    """The storages ``torch.save(obj, ...)`` writes, in the order of their keys
    (``data/0``, ``data/1``, ...). torch keys a storage at its first ``persistent_id``
    while it pickles ``obj`` (``torch.serialization._save``); a pickler of the same
    module and protocol, writing nowhere, meets them in the same order. Called under
    ``skip_data`` as torch's own pickling was: tensors reduce the same way there."""
    import pickle
    import torch
    module = pickle_module if pickle_module is not None else pickle
    protocol = (pickle_protocol if pickle_protocol is not None
                else torch.serialization.DEFAULT_PROTOCOL)
    seen: dict = {}                 # storage._cdata -> (key, storage), in key order

    class Scan(module.Pickler):
        def persistent_id(self, o):
            if isinstance(o, torch.storage.TypedStorage):
                o = o._untyped_storage
            elif not torch.is_storage(o):
                return None
            return seen.setdefault(o._cdata, (str(len(seen)), o))[0]

    Scan(_Nowhere(), protocol=protocol).dump(obj)
    return [st for _, st in seen.values()]


def layout(obj, name: str, **save_kwargs) -> Layout:
    """torch's layout of ``torch.save(obj, <dir>/name)``: a sparse scratch file written
    by torch with ``skip_data``, read back (its headers only), and the storages it
    holds (:func:`saved_storages`)."""
    import torch
    if save_kwargs.get("_use_new_zipfile_serialization", True) is False:
        raise Unsupported("the legacy (non-zip) torch format")
    if not hasattr(torch.serialization, "skip_data"):
        raise Unsupported("this torch has no serialization.skip_data")
    tmp = tempfile.mkdtemp(prefix="s4fs-layout-")
    path = os.path.join(tmp, name)
    try:
        with torch.serialization.skip_data():
            torch.save(obj, path, **save_kwargs)
            storages = saved_storages(obj, save_kwargs.get("pickle_module"),
                                      save_kwargs.get("pickle_protocol"))
        return read_layout(path, storages)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


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


def save(obj, path, *, profile=None, config: SaveConfig = SaveConfig(),
         **save_kwargs) -> None:
    """``torch.save(obj, path)`` into the store that holds ``path``."""
    _Save(obj, path, save_kwargs, profile=profile, config=config).run()


class _Save:
    """One save: the layout taken at construction (a snapshot of the pickle), the
    storages coded and the file committed by :meth:`run`."""

    def __init__(self, obj, path, save_kwargs: dict, *, snapshot: bool = False,
                 profile=None, config: SaveConfig = SaveConfig()) -> None:
        from s4fs.paths import resolve
        self.path = path
        self.t0 = time.perf_counter()
        self.fs, self.rel = resolve(path, create=True)
        self.stages = Stages("save", self.fs.runtime.stages, self.t0)
        if not self.rel:
            raise InvalidArgument(f"{path} names a store, not a file in it")
        self.lay = layout(obj, _archive_name(path), **save_kwargs)
        self.stages.mark("layout (torch, skip_data)")
        self.profile = profile
        self.config = config
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
        from s4fs.manifest import stored_split
        split = stored_split(m)
        metrics.observe_save(self.rel, m.size, m.stored_bytes(),
                             time.perf_counter() - self.t0,
                             stored_delta=split["stored_delta"], unchanged=split["unchanged"])

    def _previous(self):
        return self.fs.manifest_or_none(self.rel)

    def _ingest(self):
        """CPU storages: the exact file bytes through the ingest pipeline."""
        lay = self.lay
        views = [storage_bytes(st) for st in lay.storages]
        crcs = list(self.fs.runtime.thread("s4fs-save-crc", 8).map(zlib.crc32, views))
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
        self.cfg = job.fs.save_ingest
        self.base_info = None                   # the delta base's path and id, once chosen

    def manifest(self):
        """Code the file on the device and return its manifest, in steps: the CRC-32s
        torch's zip needs, the file as pieces for its hash, the streams, the coding."""
        from s4fs.codec import gpu
        from s4fs.parse import scan_pickle
        gpu.require()
        lay, st = self.job.lay, self.job.stages
        host = self._on_one_device()
        self._finish_layout(host)
        st.mark("CRC-32 (device)")
        pkl = next(r for r in lay.records if r.name == "data.pkl")
        scan = scan_pickle(lay.read(pkl.data, pkl.size))
        version, jobs = self._streams(scan)
        packs = self._pack_writer()
        bases = self._bases()
        st.mark("plan (pickle scan, streams, delta base)")
        digest = self._code(version.raw, jobs, host, packs, bases)
        names = {f"data/{k}": v for k, v in scan.names.items()}
        return version.build(size=lay.size, xxh128=digest, kind="torch-zip", names=names,
                             own_packs=packs.keys, base=self.base_info)

    def _on_one_device(self) -> dict:
        """Check the storages lie on one CUDA device (kept in ``device``), wait for
        their last writes there; the host storages' bytes by storage index."""
        import torch
        lay = self.job.lay
        devs = {s.device for s in lay.storages if s.device.type == "cuda"}
        if len(devs) != 1:
            raise Unsupported("storages on more than one CUDA device")
        dev = devs.pop()
        self.device = dev.index if dev.index is not None else torch.cuda.current_device()
        host = {i: storage_bytes(s) for i, s in enumerate(lay.storages)
                if s.device.type == "cpu"}
        torch.cuda.current_stream(dev).synchronize()   # the tensors are final on the device
        return host

    def _finish_layout(self, host: dict) -> None:
        """The CRC-32 of every storage (device ones on the device) into the zip's
        records."""
        from s4fs.codec import gpu
        lay = self.job.lay
        on_dev = [i for i in range(len(lay.storages)) if i not in host]
        crcs = dict(zip(on_dev, gpu.crc32_many([lay.storages[i].data_ptr() for i in on_dev],
                                               [lay.storages[i].nbytes() for i in on_dev],
                                               device=self.device)))
        crcs.update((i, zlib.crc32(mv)) for i, mv in host.items())
        finish_layout(lay, [crcs[i] for i in range(len(lay.storages))])

    def _pieces(self, host: dict) -> list:
        """The file as ``(offset, length, host bytes | device pointer)`` pieces, for its
        XXH3-128 on the device."""
        lay, pieces = self.job.lay, []
        for off, (kind, what) in lay.pieces():
            if kind == "host":
                pieces.append((off, len(what), what))
            else:
                n = lay.storage_records[what].size
                pieces.append((off, n, host[what] if what in host
                               else int(lay.storages[what].data_ptr())))
        return pieces

    def _streams(self, scan):
        """The version's streams as the parser makes them: raw (every host byte) and
        one per storage record; ``(builder, [(stream, storage index)])``."""
        from s4fs.manifest import ManifestBuilder, Stream
        from s4fs.parse import itemsize
        lay = self.job.lay
        version = ManifestBuilder()
        raw_len, jobs = 0, []
        for off, (kind, what) in lay.pieces():
            if kind == "host":
                version.place(off, len(what), 0, raw_len)
                raw_len += len(what)
                continue
            size = lay.storage_records[what].size
            info = scan.storages.get(str(what))
            dtype = info.dtype if info is not None else "bytes"
            s = Stream("tensor", dtype if size % itemsize(dtype) == 0 else "bytes",
                       f"data/{what}")
            version.place(off, size, version.add(s), 0)
            jobs.append((s, what))
        return version, jobs

    def _pack_writer(self):
        from s4fs.write import PackWriter
        cache = self.fs.pack_cache
        # without a pack cache a pack in flight is a list of views of the batch's pinned
        # buffer (no copy of its own), so more of them at once cost no memory, and a local
        # disk takes them faster from 16 writers than from 4
        # (docs/BENCHMARKS-HISTORY.md §7)
        return PackWriter(self.fs.store, self.cfg, cache.put if cache is not None else None,
                          uploads=None if cache is not None else
                          max(self.cfg.max_uploads, self.job.config.uploads),
                          pools=self.fs.pools)

    def _code(self, raw, jobs, host: dict, packs, bases) -> bytes:
        """Code every stream (device storages on the device, then the host's), write
        the packs; the file's XXH3-128."""
        from s4fs.codec import gpu
        lay, st = self.job.lay, self.job.stages
        hashing = None
        try:
            self._code_device(jobs, host, packs, bases)
            # the file's hash, on a thread (and stream) of its own, starts once the GPU
            # batches are coded and runs beside the CPU storages and the last pack
            # writes: started beside the coding, it held the first batch up by about its
            # own length. The save does not end (nor free a snapshot) before it is done.
            hashing = self.fs.runtime.thread("s4fs-save-hash").submit(
                gpu.xxh3_128_pieces, self._pieces(host), lay.size, device=self.device)
            for s, i in jobs:
                if i in host:
                    self._code_host(s, host[i], packs,
                                    bases.get((s.name, s.dtype, len(host[i]))))
            self._code_host(raw, memoryview(b"".join(bytes(buf) for _, buf in lay.host)),
                            packs)
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
        return digest

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
        writing after a few ms of coding), then up to ``SaveConfig.gpu_batch_bytes``
        (half of it when there is a delta base: the base chunks are decoded on the device
        beside the batch). The CPU ones (``host``) are left to the caller.

        Deltas follow the rule of every other save (``s4fs.coding.code_chunk``): a chunk
        whose base chunk (same record, dtype and length; chain not too deep) has its
        exact bytes is stored as that chunk; otherwise the smaller of its XOR delta and
        its full coding is kept. The base chunks come from the store, decoded on the
        device (``s4fs.chunks.decode_on_gpu``) before their batch is coded, while the
        packs of the batches before it are being written. (Decoded one batch ahead on a
        thread of their own, beside the coding, they made the save slower: the coding
        and the pack writes contended with the decoding; docs/BENCHMARKS.md,
        "Measurements behind the code's choices".)"""
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
        GPU batches of growing size (``SaveConfig.gpu_first_batches``, then the full size)."""
        import torch
        from s4fs.coding import base_chunk, delta_candidate
        lay, step = self.job.lay, self.cfg.chunk_size
        config = self.job.config
        full = config.gpu_batch_bytes // 2 if bases else config.gpu_batch_bytes
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
                first = config.gpu_first_batches
                limit = first[len(out) - 1] if len(out) <= len(first) else full
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
        from s4fs.chunks import decode_on_gpu
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

def async_save(obj, path, *, profile=None, config: SaveConfig = SaveConfig(),
               **save_kwargs) -> cf.Future:
    """Snapshot ``obj`` now, store it in the background; see :func:`s4fs.async_save`."""
    try:
        job = _Save(obj, path, save_kwargs, snapshot=True, profile=profile, config=config)
    except Unsupported:
        raise
    except BaseException as exc:         # CUDA OOM while copying, a bad path, ...
        if isinstance(exc, (KeyboardInterrupt, SystemExit)):
            raise
        fut: cf.Future = cf.Future()
        fut.set_exception(exc)
        return fut
    # one thread of the filesystem's runtime: async saves run one after another
    return job.fs.runtime.thread("s4fs-async-save").submit(job.run)
