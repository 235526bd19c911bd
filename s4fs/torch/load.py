"""``s4fs.load``: ``torch.load`` of a stored file; with ``map_location`` naming a CUDA
device, the storages are decoded on that device (delta chains level by level) and the
objects rebuilt with torch's own unpickling (``torch.serialization._load``), reading
only the file's raw stream (zip headers, pickle, small records) on the host.
"""

from __future__ import annotations

import io
import time
import zipfile

from s4fs.errors import InvalidArgument, S4Error
from s4fs.parse.layout import LOCAL_FIXED, local_header_length
from s4fs.torch.save import Stages

LOAD_BATCH_BYTES = 1 << 30         # raw bytes decoded per batch while the next is read


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
    from s4fs.codec import gpu_available
    try:
        return _cuda_target(map_location) is not None and gpu_available()
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
    t0 = time.perf_counter()
    fs, rel = paths.resolve(path)
    stages = Stages("load", fs.runtime.stages, t0)
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
                off = info.header_offset + local_header_length(g.read(LOCAL_FIXED.size))
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
        from s4fs.codec import gpu
        gpu.release_memory(device=dev.index)


def _decode_storages(fs, m, offsets: dict, dev, path, stages) -> dict:
    """Every storage record's bytes as a uint8 CUDA tensor on ``dev``: tensor streams
    decoded on the device (delta chains level by level), anything else read on the host
    and copied up."""
    import torch

    from s4fs.chunks import decode_on_gpu
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
