"""Pieces the GPU encoder and decoder share: input staging, batched XXH3, batched copies,
split/merge launches and the plane plan (the container header is ``codec._container``'s)."""

from __future__ import annotations

import copy
import functools
import os
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np

from s4fs.errors import CodecError

from .. import _container as C
from .. import _plane_codecs as P
from .. import _planes
from .._dtypes import DType
from . import _kernels as K
from ._backend import MAX_GRID_Y, CodecSpec, round_up, row_launches
from ._profiles import GpuProfile

ALIGN = 256             # every plane and staged buffer starts on this boundary
MIN_CODED = 64          # planes shorter than this are stored raw
SEG_MAX = 1 << 18       # copy segments are cut to at most this many bytes
PIECE = 8 << 20         # host staging copies overlap in pieces of this size

CODEC_IDS = {"ans": P.NVCOMP_ANS, "gdeflate": P.NVCOMP_GDEFLATE, "deflate": P.NVCOMP_DEFLATE}
CODEC_NAMES = {v: k for k, v in CODEC_IDS.items()}


# --------------------------------------------------------------------------- inputs

@dataclass
class Buffer:
    """A device buffer's address and size (``keep`` holds whatever owns it)."""

    ptr: int
    nbytes: int
    keep: object = None


class Staging:
    """Device copies of host buffers through pinned memory, copied in pieces that overlap
    the uploads (worker threads fill piece k+1 while piece k goes up)."""

    def __init__(self, backend) -> None:
        self.b = backend
        self.views: list[tuple[int, memoryview]] = []
        self.known: dict[int, tuple] = {}       # id(object) -> (object, offset, bytes)
        self.total = 0
        self.dev = None
        self._host = None

    def add(self, mv: memoryview) -> int:
        off = self.total
        self.views.append((off, mv))
        self.total = round_up(off + len(mv), ALIGN)
        return off

    def flush(self):
        if not self.views:
            return None
        b = self.b
        self.dev = b.empty(self.total)
        host = self._host = b.pinned(self.total)
        pieces = [(off + s, mv[s: s + PIECE]) for off, mv in self.views
                  for s in range(0, len(mv), PIECE)]

        def put(job):
            off, mv = job
            host[off: off + len(mv)] = np.frombuffer(mv, dtype=np.uint8)
            return job

        if self.total < 2 * PIECE or b.emulated:
            for job in pieces:
                put(job)
            b.upload(self.dev, 0, host[: self.total])
        else:
            with ThreadPoolExecutor(max_workers=min(8, os.cpu_count() or 1)) as pool:
                for off, mv in pool.map(put, pieces):
                    b.upload(self.dev, off, host[off: off + len(mv)])
        return self.dev


def _device_types() -> tuple:
    """(torch.Tensor, cupy.ndarray) where those modules are loaded, else None each: the
    exact types the fast paths of :func:`resolve` take (no import here)."""
    import sys
    torch, cupy = sys.modules.get("torch"), sys.modules.get("cupy")
    return (getattr(torch, "Tensor", None), getattr(cupy, "ndarray", None))


def resolve(backend, datas: list, staging: Staging, keep: list) -> list:
    """A :class:`Buffer` for every device input; host inputs are added to ``staging``
    and come back as ``("host", offset, nbytes)`` until :func:`finish` places them.

    Thousands of small tensors come through here per call, so the two common device types
    (a torch tensor, a CuPy array) take a path of a few attribute reads each."""
    from .._buffers import as_bytes
    tensor_t, cupy_t = _device_types()
    out: list = []
    devices: dict = {}              # one stream wait per device, not one per tensor
    for data in datas:
        kind = type(data)
        if kind is tensor_t or (tensor_t is not None and isinstance(data, tensor_t)):
            if data.is_cuda:
                t = data if data.is_contiguous() else data.contiguous()
                dev = t.get_device()
                if dev not in devices:
                    devices[dev] = t
                keep.append(t)
                out.append(Buffer(t.data_ptr(), t.nbytes, t))
                continue
        elif kind is cupy_t and getattr(data, "_c_contiguous", False):
            if backend.emulated:
                raise CodecError("device arrays need a real GPU backend")
            keep.append(data)
            out.append(Buffer(data.data.ptr, data.nbytes, data))
            continue
        elif not kind.__module__.startswith("torch") and hasattr(data,
                                                                 "__cuda_array_interface__"):
            if backend.emulated:
                raise CodecError("device arrays need a real GPU backend")
            import cupy
            a = cupy.ascontiguousarray(cupy.asarray(data))
            keep.append(a)
            out.append(Buffer(int(a.data.ptr), int(a.nbytes), a))
            continue
        seen = staging.known.get(id(data))
        if seen is None or seen[0] is not data:        # one staged copy per object
            mv = as_bytes(data)
            seen = staging.known[id(data)] = (data, staging.add(mv), len(mv))
        out.append(("host", seen[1], seen[2]))
    for t in devices.values():      # after every copy .contiguous() queued
        backend.wait_external(t)
    return out


def device_indices(datas: list) -> list[int]:
    """Which of ``datas`` :func:`resolve` takes as device inputs (CUDA tensors, CuPy
    arrays, other ``__cuda_array_interface__`` objects), decided once per type but for
    torch tensors (each says whether it is on the device): a decode batch is thousands of
    blobs of one or two types."""
    tensor_t, _ = _device_types()
    kinds: dict = {}
    out = []
    for i, data in enumerate(datas):
        kind = type(data)
        k = kinds.get(kind)
        if k is None:
            mod = kind.__module__
            k = kinds[kind] = (
                "tensor" if tensor_t is not None and issubclass(kind, tensor_t) else
                "device" if mod.startswith("cupy") or (not mod.startswith("torch") and
                                                      hasattr(kind, "__cuda_array_interface__"))
                else "host")
        if k == "device" or (k == "tensor" and data.is_cuda):
            out.append(i)
    return out


def finish(backend, items: list, staging: Staging, keep: list) -> list[Buffer]:
    """Place staged host inputs and re-align device inputs the kernels cannot read."""
    res = []
    for it in items:
        if isinstance(it, tuple):
            _, off, n = it
            res.append(Buffer(backend.ptr(staging.dev) + off, n, staging))
        elif it.ptr % 16 and it.nbytes:
            tmp = backend.empty(it.nbytes)
            backend.copy(backend.ptr(tmp), it.ptr, it.nbytes)
            keep.append(tmp)
            res.append(Buffer(backend.ptr(tmp), it.nbytes, tmp))
        else:
            res.append(it)
    return res


# --------------------------------------------------------------------------- kernels

def hash_buffers(b, ptrs: list[int], lens: list[int], keep: list):
    """Launch XXH3-64 of every buffer (3 launches); a device array of 8 bytes each."""
    n = len(ptrs)
    out = b.empty(8 * max(n, 1))
    if n == 0:
        return out
    lens_a = np.asarray(lens, dtype=np.int64)
    blocks = np.where(lens_a > 240, (lens_a - 1) // 1024 + 1, 0)
    items = np.zeros((n, 4), dtype=np.uint64)
    items[:, 0] = np.asarray(ptrs, dtype=np.uint64)
    items[:, 1] = lens_a.astype(np.uint64)
    items[:, 2] = (np.cumsum(blocks) - blocks).astype(np.uint64)
    # eight threads per 1 KiB block; the block sums' launches over the rows by width
    order, launches = row_launches(np.minimum(-(-8 * blocks // 128), 16384))
    table = np.concatenate([items, items[order]])
    d_items = b.empty(table.nbytes)
    b.upload(d_items, 0, table.reshape(-1).view(np.uint8))
    sums = b.empty(64 * max(int(blocks.sum()), 1))
    accs = b.empty(64 * n)
    ip, sp, ap = b.ptr(d_items), b.ptr(sums), b.ptr(accs)
    for lo, hi, x in launches:
        if x:
            b.launch("xxh3_blocks", (x, hi - lo), 128, [ip + 32 * (n + lo), sp])
    b.launch("xxh3_scan", (-(-8 * n // 128), 1), 128, [ip, sp, ap, n])
    b.launch("xxh3_final", (-(-n // 128), 1), 128, [ip, ap, b.ptr(out), n])
    keep += [table, d_items, sums, accs]
    return out


def block_flags(b, ptrs, lens, log2, keep: list):
    """Launch the zero-block scan of many buffers: a device array of one byte per block
    (1: the block holds a non-zero byte), buffers' blocks back to back; and the block
    count of each buffer."""
    lens = np.asarray(lens, dtype=np.int64)
    log2 = np.asarray(log2, dtype=np.int64)
    nblocks = C.block_counts(lens, log2)
    n = len(lens)
    flags = b.zeros(max(int(nblocks.sum()), 1))
    if n:
        items = np.zeros((n, 4), dtype=np.uint64)
        items[:, 0] = np.asarray(ptrs, dtype=np.uint64)
        items[:, 1] = lens.astype(np.uint64)
        items[:, 2] = (np.cumsum(nblocks) - nblocks).astype(np.uint64)
        items[:, 3] = log2.astype(np.uint64)
        order, launches = row_launches(np.maximum(1, np.minimum(-(-lens // (256 * 128)), 4096)))
        items = items[order]
        d_items = b.empty(items.nbytes)
        b.upload(d_items, 0, items.reshape(-1).view(np.uint8))
        for lo, hi, x in launches:
            b.launch("block_flags", (x, hi - lo), 128, [b.ptr(d_items) + 32 * lo, b.ptr(flags)])
        keep += [items, d_items]
    keep.append(flags)
    return flags, nblocks


SAMPLES = 8192          # bytes sampled per plane for the entropy estimate


def sample_entropy(b, ptrs: list[int], lens: list[int], keep: list):
    """Launch byte histograms of every plane (``SAMPLES`` bytes each) and, from them, each
    plane's order-0 entropy in bits per byte and its share of zero bytes: a device array
    of two float64 per plane (``entropy_bits`` on the host gives the same entropy)."""
    n = len(ptrs)
    hist = b.zeros(1024 * max(n, 1))
    est = b.empty(16 * max(n, 1))
    if n:
        lens_a = np.asarray(lens, dtype=np.int64)
        items = np.zeros((n, 4), dtype=np.uint64)
        items[:, 0] = np.asarray(ptrs, dtype=np.uint64)
        items[:, 1] = lens_a.astype(np.uint64)
        items[:, 2] = (256 * np.arange(n)).astype(np.uint64)
        items[:, 3] = (np.maximum(1, lens_a // SAMPLES) | 1).astype(np.uint64)
        d_items = b.empty(items.nbytes)
        b.upload(d_items, 0, items.reshape(-1).view(np.uint8))
        for s in range(0, n, MAX_GRID_Y):
            b.launch("sample_histograms", (8, min(MAX_GRID_Y, n - s)), 128,
                     [b.ptr(d_items) + 32 * s, b.ptr(hist)])
        b.launch("plane_entropy", (-(-n // 128), 1), 128, [b.ptr(hist), b.ptr(est), n])
        keep += [items, d_items, hist]
    keep.append(est)
    return est


def entropy_bits(counts: np.ndarray) -> np.ndarray:
    """Order-0 entropy in bits per byte of every row of 256 counters: the host's formula
    for what ``plane_entropy`` computes on the device (the tests compare the two)."""
    c = counts.reshape(-1, 256).astype(np.float64)
    tot = np.maximum(c.sum(axis=1), 1.0)
    return np.log2(tot) - (c * np.log2(np.maximum(c, 1.0))).sum(axis=1) / tot


class Segments:
    """A batch of byte copies (or fills), run as one launch."""

    def __init__(self) -> None:
        self.parts: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []
        self.one: list[tuple[int, int, int]] = []

    def add(self, a, b, c) -> None:
        """One segment (three ints) or many (three arrays)."""
        if isinstance(c, (int, np.integer)):
            self.one.append((a, b, c))
        else:
            self.parts.append(tuple(np.asarray(x).astype(np.uint64) for x in (a, b, c)))

    def __len__(self) -> int:
        return len(self.parts) + len(self.one)

    def launch(self, backend, keep: list, kernel: str = "copy_segments") -> None:
        parts = list(self.parts)
        if self.one:
            parts.append(tuple(np.asarray(x, dtype=np.uint64) for x in zip(*self.one)))
        if not parts:
            return
        a, b_, c = (np.concatenate([p[k] for p in parts]) for k in range(3))
        if kernel == "copy_segments":
            live = c > 0
            a, b_, c = _cut(a[live], b_[live], c[live])
        else:                                   # fills: (destination, length, byte)
            live = b_ > 0
            a, c, b_ = _cut(a[live], c[live], b_[live], move_src=False)
        if len(a) == 0:
            return
        segs = np.stack([a, b_, c], axis=1).astype(np.uint64).reshape(-1)
        dev = backend.empty(segs.nbytes)
        backend.upload(dev, 0, segs.view(np.uint8))
        backend.launch(kernel, (int(min(len(a), 1 << 16)), 1), 128, [backend.ptr(dev), len(a)])
        keep += [segs, dev]


def _cut(src: np.ndarray, dst: np.ndarray, ln: np.ndarray, move_src: bool = True):
    """Cut long copies (or fills: ``move_src=False`` keeps the second column, the byte)
    into pieces so that one big plane does not run on one SM."""
    if len(ln) == 0:
        return src, dst, ln
    pieces = np.maximum(1, (ln + SEG_MAX - 1) // SEG_MAX).astype(np.int64)
    if pieces.max() == 1:
        return src, dst, ln
    idx = np.repeat(np.arange(len(ln)), pieces)
    k = np.arange(len(idx)) - np.repeat(np.cumsum(pieces) - pieces, pieces)
    off = (k * SEG_MAX).astype(np.uint64)
    return (src[idx] + off, dst[idx] + off if move_src else dst[idx],
            np.minimum(ln[idx] - off, SEG_MAX).astype(np.uint64))


def download_ranges(b, ranges: list[tuple[int, int]], keep: list) -> list[bytes]:
    """Small device reads gathered into one buffer and one copy back."""
    if not ranges:
        return []
    lens = [n for _, n in ranges]
    host, offs = download_gather(b, [p for p, _ in ranges], lens, keep)
    return [host[o: o + n].tobytes() for o, n in zip(offs.tolist(), lens)]


def download_gather(b, ptrs, lens, keep: list) -> tuple[np.ndarray, np.ndarray]:
    """Device bytes at ``ptrs`` (``lens`` each) back to back in one host array, with one
    gather launch and one copy; returns it and where each piece starts."""
    lens = np.asarray(lens, dtype=np.int64)
    offs = np.cumsum(lens) - lens
    total = int(lens.sum())
    dev = b.empty(total or 1)
    seg = Segments()
    seg.add(np.asarray(ptrs, dtype=np.int64), b.ptr(dev) + offs, lens)
    seg.launch(b, keep)
    host = np.empty(total or 1, dtype=np.uint8)
    b.download(dev, 0, host[:total])
    b.synchronize()
    return host[:total], offs


def launch_planes(b, kind: str, pl: "Plan", descs: np.ndarray, flags_ptr: int, keep: list):
    """``split`` or ``merge`` of every chunk of a plan: one launch per plane layout."""
    # about four groups of eight words per thread; rows by kernel, then by width
    width = np.maximum(1, np.minimum(-(-(pl.n // 8 + 1) // 512), 4096))
    order = np.lexsort((width, pl.var))
    d = np.ascontiguousarray(descs[order])
    dev = b.empty(d.nbytes)
    b.upload(dev, 0, d.reshape(-1).view(np.uint8))
    keep += [d, dev]
    var, width = pl.var[order], width[order]
    cuts = np.flatnonzero(np.diff(var)) + 1
    for lo, hi in zip(np.concatenate([[0], cuts]).tolist(),
                      np.concatenate([cuts, [len(order)]]).tolist()):
        v = pl.variants[int(var[lo])]
        for start, end, x in row_launches(width[lo:hi])[1]:    # already in width order
            args = [b.ptr(dev) + (lo + start) * K.DESC_FIELDS * 8]
            if kind == "split":
                args.append(flags_ptr)
            b.launch(K.kernel_name(kind, *v), (x, end - start), 128, args)


# --------------------------------------------------------------------------- plan

SIGN, EXP, MANT, OTHER, TAIL = range(5)       # plane roles


class Plan:
    """The planes of many chunks as columns (the same planes as ``_planes.split``).

    Per chunk (job): ``dts``, ``layout``, ``raw_len``, ``var`` (index into ``variants``:
    the split/merge kernel), ``n`` (whole words; bytes for FLAT), ``tail`` (bytes past
    the last word), ``p0`` / ``np`` (its planes). Per plane: ``job``, ``k`` (its index in
    the chunk), ``raw``, ``role``, ``spec`` (index into ``specs``, -1: not coded) and,
    once :meth:`place` ran, ``off`` (offset in one scratch buffer; planes are also the
    split kernel's flag indices). Chunks of the same shape share one cached template.
    """

    def __init__(self, dts: list, layouts, raw_lens, profile: GpuProfile | None = None):
        self.dts = list(dts)
        self.layout = np.asarray(layouts, dtype=np.int64).reshape(-1)
        self.raw_len = np.asarray(raw_lens, dtype=np.int64).reshape(-1)
        # one template per chunk shape (dtype, layout, length), in order of first use
        codes = np.fromiter((dt.code for dt in self.dts), np.int64, len(self.dts))
        if len(codes) and (codes.max() >= 1 << 8 or self.layout.max() >= 1 << 8 or
                           self.raw_len.max() >= 1 << 40 or min(codes.min(), self.layout.min(),
                                                               self.raw_len.min()) < 0):
            shape = np.unique(np.stack([codes, self.layout, self.raw_len], axis=1), axis=0,
                              return_inverse=True)[1].reshape(-1)   # (never in practice)
        else:
            shape = (codes << 48) | (self.layout << 40) | self.raw_len
        _, first, which = np.unique(shape, return_index=True, return_inverse=True)
        order = np.argsort(first, kind="stable")
        rank = np.empty(len(order), dtype=np.int64)
        rank[order] = np.arange(len(order))
        ids = rank[which.reshape(-1)]
        rows = [_template(self.dts[j], int(self.layout[j]), int(self.raw_len[j]), profile)
                for j in first[order].tolist()]
        self.variants = list(dict.fromkeys(r[0] for r in rows))
        self.specs = list(dict.fromkeys(sp for r in rows for _, _, sp in r[3] if sp))
        vid = {v: k for k, v in enumerate(self.variants)}
        sid = {v: k for k, v in enumerate(self.specs)}
        t_var = np.array([vid[r[0]] for r in rows], dtype=np.int64)
        t_n = np.array([r[1] for r in rows], dtype=np.int64)
        t_tail = np.array([r[2] for r in rows], dtype=np.int64)
        t_np = np.array([len(r[3]) for r in rows], dtype=np.int64)
        t_start = np.cumsum(t_np) - t_np
        flat = [p for r in rows for p in r[3]]
        tp_raw = np.array([p[0] for p in flat], dtype=np.int64)
        tp_role = np.array([p[1] for p in flat], dtype=np.int64)
        tp_spec = np.array([sid[p[2]] if p[2] else -1 for p in flat], dtype=np.int64)
        self.var, self.n, self.tail, self.np = t_var[ids], t_n[ids], t_tail[ids], t_np[ids]
        self.p0 = np.cumsum(self.np) - self.np
        self.job = np.repeat(np.arange(len(ids)), self.np)
        self.k = np.arange(len(self.job)) - self.p0[self.job]
        src = t_start[ids][self.job] + self.k
        self.raw, self.role, self.spec = tp_raw[src], tp_role[src], tp_spec[src].copy()
        self.off = np.zeros(len(self.job), dtype=np.int64)

    def __len__(self) -> int:
        return len(self.raw_len)

    def shaped_as(self, dtype_codes, layouts, raw_lens) -> "Plan | None":
        """A copy of this plan when its chunks have exactly these shapes (the plan is a
        function of them), else None."""
        if not (np.array_equal(self.layout, layouts) and np.array_equal(self.raw_len, raw_lens)
                and [dt.code for dt in self.dts] == list(dtype_codes)):
            return None
        twin = copy.copy(self)
        twin.spec = np.full(self.nplanes, -1, dtype=np.int64)
        twin.specs = []
        return twin

    @property
    def nplanes(self) -> int:
        return len(self.job)

    def place(self) -> int:
        """Offsets of every plane in one scratch buffer; returns its size."""
        size = (self.raw + ALIGN - 1) // ALIGN * ALIGN
        self.off = np.cumsum(size) - size
        return int(size.sum())

    def descriptors(self, main, bases, scratch_ptr: int) -> np.ndarray:
        """The split/merge kernels' descriptors: data (or output) and base pointers per
        chunk, plane pointers from the scratch buffer."""
        d = np.zeros((len(self), K.DESC_FIELDS), dtype=np.int64)
        d[:, K.D_SRC] = np.asarray(main, dtype=np.uint64).astype(np.int64)
        d[:, K.D_BASE] = np.asarray(bases, dtype=np.uint64).astype(np.int64)
        d[:, K.D_N], d[:, K.D_TAIL], d[:, K.D_FLAG] = self.n, self.tail, self.p0
        ptr = scratch_ptr + self.off
        tail = self.role == TAIL
        d[self.job[tail], K.D_TAILPTR] = ptr[tail]
        body = ~tail
        d[self.job[body], K.D_PLANES + self.k[body]] = ptr[body]
        return d


def gpu_layout(dt: DType, profile: GpuProfile) -> int:
    """The plane layout the GPU writes for ``dt`` under ``profile``."""
    sm = getattr(_planes, "FLOAT_SM", None)
    if profile.layout == "sm" and sm is not None and K.variant(dt, sm) is not None:
        return sm
    return _planes.layout_for(dt)


@functools.lru_cache(maxsize=1024)
def _template(dt: DType, layout: int, raw_len: int, profile: GpuProfile | None):
    """(variant, words, tail, planes as (raw, role, spec)) of one chunk shape."""
    variant = K.variant(dt, layout) or (1, K.MODE_FLAT, 0, 0)
    sizes = _planes.plane_sizes(dt, layout, raw_len)
    n, tail = divmod(raw_len, variant[0]) if layout != _planes.FLAT else (raw_len, 0)
    body = len(sizes) - (1 if tail else 0)
    if layout == getattr(_planes, "FLOAT_SM", None):
        roles = [EXP] + [MANT] * (variant[0] - 1)
    elif layout == _planes.FLOAT and dt.ebits + dt.mbits <= 7:
        roles = [SIGN, EXP]
    elif layout == _planes.FLOAT:
        roles = [SIGN] + [EXP] * ((dt.ebits + 7) // 8) + [MANT] * ((dt.mbits + 7) // 8)
    else:
        roles = [OTHER] * body
    roles = roles[:body] + ([TAIL] if tail else [])
    planes = []
    for size, role in zip(sizes, roles):
        spec = None
        name = None if profile is None else {
            SIGN: profile.other, EXP: profile.exponent, MANT: profile.mantissa,
            OTHER: profile.other, TAIL: "raw"}[role]
        if name not in (None, "raw") and size >= MIN_CODED:
            level = {"gdeflate": profile.gdeflate_algorithm, "ans": profile.ans_states,
                     "deflate": profile.deflate_algorithm}.get(name, 0)
            spec = CodecSpec(name, level, profile.chunk)
        planes.append((size, role, spec))
    return variant, n, tail, tuple(planes)
