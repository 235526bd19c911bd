"""Where the GPU pipeline runs: CuPy + nvCOMP on a CUDA device, or a CPU emulation.

The pipeline (``_pipeline``) only talks to a backend: device buffers, copies, kernel
launches and batched nvCOMP calls over one buffer carved by offsets. ``CudaBackend``
is the real thing; ``EmulatedBackend`` runs the same kernels compiled for the CPU and
stands zlib in for nvCOMP, so the pipeline's logic is tested where no GPU exists. Its
blobs record nvCOMP version 255.0.0, so a real GPU refuses their ANS planes.
"""

from __future__ import annotations

import atexit
import ctypes
import logging
import os
import threading
import weakref
import zlib
from dataclasses import dataclass

import numpy as np

from s4fs.errors import CodecUnavailableError, FormatError

from . import _kernels

log = logging.getLogger("s4fs.codec.gpu")

ALGORITHMS = {"ans": "ANS", "gdeflate": "GDeflate", "deflate": "Deflate"}
SMALL_UPLOAD = 1 << 20  # pageable uploads up to this size are copied to pinned memory first


@dataclass(frozen=True)
class CodecSpec:
    """One nvCOMP codec configuration (what a batch is coded with)."""

    name: str                  # "ans" | "gdeflate" | "deflate"
    level: int = 0             # (G)Deflate algorithm_type; ANS: states per lane (0 auto)
    chunk: int = 1 << 16

    @property
    def option(self) -> int:
        return self.level if self.name != "ans" else 0


def _round(n: int, a: int) -> int:
    return (n + a - 1) // a * a


class CudaBackend:
    """CuPy buffers and kernels, nvCOMP batches, all on one CUDA stream."""

    emulated = False

    def __init__(self, device_id: int | None = None) -> None:
        import cupy
        from nvidia import nvcomp
        self.cp, self.nv = cupy, nvcomp
        self.device = cupy.cuda.Device(device_id if device_id is not None else cupy.cuda.Device().id)
        with self.device:
            self.stream = cupy.cuda.Stream(non_blocking=False)
            self._module = cupy.RawModule(code=_kernels.source(),
                                          name_expressions=_kernels.expressions())
        self._fns: dict[str, object] = {}
        self._codecs: dict[CodecSpec, object] = {}
        self._bounds: dict[tuple[CodecSpec, int], int] = {}
        self._configs: dict[tuple, object] = {}        # decompression configs, recent last
        self._capi = None                              # nvCOMP's C API: untried
        v = nvcomp.__version__.split(".")
        self.nvcomp_version = tuple(int(x) for x in (v + ["0", "0"])[:3])
        self._lent: list = []       # pinned copies of small uploads, until the next sync
        _LIVE.add(self)

    def __del__(self) -> None:
        self.release()

    def release(self) -> None:
        """Free nvCOMP's codecs and configurations while their stream still exists (left
        to the garbage collector, the stream could go first: nvCOMP then crashes the
        process when a backend is dropped, and at interpreter exit)."""
        stream = getattr(self, "stream", None)
        if stream is not None:
            try:
                stream.synchronize()
            except Exception:       # noqa: BLE001 - a broken device: free what we can
                pass
        for name in ("_configs", "_codecs"):
            getattr(self, name, {}).clear()

    # ---- memory
    def empty(self, nbytes: int):
        with self.device, self.stream:
            return self.cp.empty(max(int(nbytes), 1), dtype=self.cp.uint8)

    def zeros(self, nbytes: int):
        with self.device, self.stream:
            return self.cp.zeros(max(int(nbytes), 1), dtype=self.cp.uint8)

    @staticmethod
    def ptr(arr) -> int:
        return int(arr.data.ptr)

    def pinned(self, nbytes: int) -> np.ndarray:
        return pinned_host(nbytes)

    def upload(self, dst, offset: int, host: np.ndarray) -> None:
        """Asynchronous host-to-device copy of ``host`` at ``offset``. Small pageable
        arrays (descriptor tables) go through a pinned copy kept until the next
        ``synchronize``, so the copy does not hold the host up."""
        n = host.nbytes
        if n:
            src = host.ctypes.data
            if n <= SMALL_UPLOAD:
                if len(self._lent) > 4096:      # a caller that never synchronizes
                    self.synchronize()
                copy = pinned_host(n)
                ctypes.memmove(copy.ctypes.data, src, n)
                self._lent.append(copy)
                src = copy.ctypes.data
            self.cp.cuda.runtime.memcpyAsync(self.ptr(dst) + offset, src, n,
                                             self.cp.cuda.runtime.memcpyHostToDevice,
                                             self.stream.ptr)

    def download(self, src, offset: int, out: np.ndarray) -> None:
        n = out.nbytes
        if n:
            self.cp.cuda.runtime.memcpyAsync(out.ctypes.data, self.ptr(src) + offset, n,
                                             self.cp.cuda.runtime.memcpyDeviceToHost,
                                             self.stream.ptr)

    def copy(self, dst_ptr: int, src_ptr: int, n: int) -> None:
        if n:
            self.cp.cuda.runtime.memcpyAsync(dst_ptr, src_ptr, n,
                                             self.cp.cuda.runtime.memcpyDeviceToDevice,
                                             self.stream.ptr)

    def xor_into(self, dst_ptr: int, a_ptr: int, b_ptr: int, n: int) -> None:
        cp = self.cp
        mk = lambda p: cp.ndarray((n,), cp.uint8, cp.cuda.MemoryPointer(
            cp.cuda.UnownedMemory(p, n, self, self.device.id), 0))
        with self.device, self.stream:
            cp.bitwise_xor(mk(a_ptr), mk(b_ptr), out=mk(dst_ptr))

    def undiff_into(self, dst_ptr: int, base_ptr: int, n: int, itemsize: int) -> None:
        """``dst`` (a difference delta's merged planes) becomes the bytes it was taken
        of: the base's words plus its zigzag-decoded words (s4fs.codec._buffers.undiff)."""
        cp = self.cp
        mk = lambda p: cp.ndarray((n,), cp.uint8, cp.cuda.MemoryPointer(  # noqa: E731
            cp.cuda.UnownedMemory(p, n, self, self.device.id), 0))
        from s4fs.codec._buffers import word_size
        itemsize = word_size(itemsize)
        words = n // itemsize * itemsize
        u = {1: cp.uint8, 2: cp.uint16, 4: cp.uint32, 8: cp.uint64}[itemsize]
        with self.device, self.stream:
            d, base = mk(dst_ptr), mk(base_ptr)
            if words:
                w, bw = d[:words].view(u), base[:words].view(u)
                one, zero = cp.asarray(1, dtype=u), cp.asarray(0, dtype=u)
                cp.add(bw, (w >> one) ^ (zero - (w & one)), out=w)
            if n > words:
                cp.bitwise_xor(d[words:], base[words:], out=d[words:])

    def views(self, arr, offsets, lens) -> list:
        """Views of ``arr`` at many offsets: built from the pointer, about a third of
        a slice's cost (thousands per call for a model of small tensors)."""
        nd, u8, base = self.cp.ndarray, self.cp.uint8, arr.data
        return [nd((n,), u8, base + o) for o, n in zip(offsets, lens)]

    def synchronize(self) -> None:
        self.stream.synchronize()
        self._lent.clear()

    def wait_external(self, obj) -> None:
        """Order this stream after the work torch queued for a tensor (no host wait)."""
        import torch
        ts = torch.cuda.current_stream(obj.device)
        if ts.cuda_stream == 0:
            return                      # legacy default stream: our blocking stream syncs with it
        ev = self.cp.cuda.Event()
        ev.record(self.cp.cuda.ExternalStream(ts.cuda_stream))
        self.stream.wait_event(ev)

    # ---- kernels
    def launch(self, name: str, grid: tuple[int, int], block: int, args: list[int]) -> None:
        fn = self._fns.get(name)
        if fn is None:
            fn = self._fns[name] = self._module.get_function(name)
        with self.device, self.stream:
            fn(grid, (block,), tuple(np.uint64(a) for a in args))

    # ---- nvCOMP
    def _codec(self, spec: CodecSpec):
        c = self._codecs.get(spec)
        if c is None:
            nv = self.nv
            kw = dict(algorithm=ALGORITHMS[spec.name], device_id=self.device.id,
                      cuda_stream=self.stream.ptr, uncomp_chunk_size=spec.chunk,
                      bitstream_kind=nv.BitstreamKind.RAW)
            if spec.name == "ans":
                kw["data_type"] = "|u1"
                if spec.level:
                    kw["states_per_lane"] = spec.level
            else:
                kw["algorithm_type"] = spec.level
            c = self._codecs[spec] = nv.Codec(**kw)
        return c

    def max_compressed(self, spec: CodecSpec) -> int:
        key = (spec, spec.chunk)
        if key not in self._bounds:
            bound = self._py_bound(spec)
            c = self._ans_c() if spec.name == "ans" else None
            if c is not None:
                bound = max(bound, c.max_output(spec.chunk))
            self._bounds[key] = bound
        return self._bounds[key]

    def _py_bound(self, spec: CodecSpec) -> int:
        """The Python API's largest compressed chunk for ``spec``."""
        probe = self.nv.as_array(self.empty(spec.chunk), self.stream.ptr)
        return int(self._codec(spec).get_max_comp_buffer_size(probe))

    def _ans_c(self):
        """nvCOMP ANS through the C API (``_nvcomp_c``) once it has shown, on this machine,
        that it writes and reads the Python API's bitstream; None: use the Python API
        (``S4FS_NVCOMP_CAPI=0`` forces that)."""
        if self._capi is None:
            self._capi = False
            if os.environ.get("S4FS_NVCOMP_CAPI", "1") != "0" and self.nvcomp_version[0] == 6:
                try:
                    from ._nvcomp_c import AnsC
                    c = AnsC()
                    if self._capi_agrees(c):
                        self._capi = c
                    else:
                        log.warning("nvCOMP's C API and Python API disagree on ANS here; "
                                    "using the Python API")
                except Exception as exc:        # noqa: BLE001 - the Python API still works
                    log.warning("nvCOMP's C API is not usable (%s: %s); using the Python API",
                                type(exc).__name__, exc)
        return self._capi or None

    def _capi_agrees(self, c) -> bool:
        """Code a sample with each API and decode it with the other: the same bytes back."""
        spec = CodecSpec("ans", 0, 1 << 16)
        rng = np.random.default_rng(5)
        parts = [np.minimum(rng.geometric(0.05, 1 << 16), 255).astype(np.uint8),
                 np.full(1 << 16, 7, dtype=np.uint8),
                 rng.integers(0, 256, 1000, dtype=np.uint8)]
        sizes = [len(x) for x in parts]
        offs = [0, 1 << 16, 2 << 16]
        src = self.empty(3 << 16)
        self.upload(src, 0, np.concatenate(parts))
        stride = round_up(max(self._py_bound(spec), c.max_output(spec.chunk)), 256)
        for enc_c in (False, True):
            dst = self.empty(3 * stride)
            dst_off = [0, stride, 2 * stride]
            if enc_c:
                comp = c.compress(self, self.ptr(src) + np.asarray(offs), sizes,
                                  self.ptr(dst) + np.asarray(dst_off), spec.chunk)
            else:
                comp = self._encode_py(spec, src, offs, sizes, dst, dst_off, stride)
            out = self.zeros(3 << 16)
            if enc_c:
                self._decode_py(spec, dst, dst_off, comp.tolist(), out, offs, sizes)
            elif not c.decompress(self, self.ptr(dst) + np.asarray(dst_off), comp,
                                  self.ptr(out) + np.asarray(offs), sizes, spec.chunk):
                return False
            got = np.empty(3 << 16, dtype=np.uint8)
            self.download(out, 0, got)
            self.synchronize()
            if not all(np.array_equal(got[o: o + len(x)], x) for o, x in zip(offs, parts)):
                return False
        return True

    def decompress_alignment(self, spec: CodecSpec) -> int:
        return max(16, int(self._codec(spec).get_required_decompression_alignment()))

    def encode(self, spec: CodecSpec, src, src_off, sizes, dst, dst_off, cap: int) -> np.ndarray:
        """Compress chunks of ``src`` (offsets, sizes) into ``dst`` (offsets, ``cap`` bytes
        each); returns the compressed sizes."""
        c = self._ans_c() if spec.name == "ans" else None
        if c is not None and len(sizes):
            return c.compress(self, self.ptr(src) + np.asarray(src_off, dtype=np.int64),
                              sizes, self.ptr(dst) + np.asarray(dst_off, dtype=np.int64),
                              spec.chunk)
        return self._encode_py(spec, src, _ints(src_off), _ints(sizes), dst, _ints(dst_off),
                               cap)

    def decode(self, spec: CodecSpec, src, src_off, src_sizes, dst, dst_off, dst_sizes,
               later: list | None = None) -> None:
        """Decompress chunks of ``src`` into ``dst``; FormatError when one does not decode
        to exactly its size. With a ``later`` list, the check may be left there to run
        after the next ``synchronize`` (``settle``), so the host does not wait now."""
        c = self._ans_c() if spec.name == "ans" else None
        if c is not None and len(src_sizes):
            ok = c.decompress(self, self.ptr(src) + np.asarray(src_off, dtype=np.int64),
                              src_sizes, self.ptr(dst) + np.asarray(dst_off, dtype=np.int64),
                              dst_sizes, spec.chunk, wait=later is None)
            if later is not None:
                later.append(ok)
            elif not ok:
                raise FormatError(ANS_FAILED)
            return
        self._decode_py(spec, src, _ints(src_off), _ints(src_sizes), dst, _ints(dst_off),
                        _ints(dst_sizes))
        if later is not None:
            # nvCOMP's Python objects for the batch go when this returns: let the kernels
            # that use them finish first
            self.synchronize()

    def _encode_py(self, spec: CodecSpec, src, src_off: list[int], sizes: list[int],
                   dst, dst_off: list[int], cap: int) -> np.ndarray:
        nv = self.nv
        codec = self._codec(spec)
        ins = nv.as_arrays(src, src_off, sizes, self.stream.ptr)
        outs = nv.as_arrays(dst, dst_off, [cap] * len(dst_off), self.stream.ptr)
        res = codec.encode(ins, out=outs)
        return np.asarray(res.buffer_sizes, dtype=np.int64)

    def _decode_py(self, spec: CodecSpec, src, src_off: list[int], src_sizes: list[int],
                   dst, dst_off: list[int], dst_sizes: list[int]) -> None:
        nv = self.nv
        codec = self._codec(spec)
        ins = nv.as_arrays(src, src_off, src_sizes, self.stream.ptr)
        outs = nv.as_arrays(dst, dst_off, dst_sizes, self.stream.ptr)
        # the configuration depends on the chunk sizes alone, and checkpoints repeat their
        # shapes: building it costs about as much as the decode's own launch
        key = (spec, tuple(dst_sizes))
        cfg = self._configs.pop(key, None)
        if cfg is None:
            cfg = codec.decompression_config(codec.compression_config(list(dst_sizes)))
        self._configs[key] = cfg
        while len(self._configs) > 16:
            self._configs.pop(next(iter(self._configs)))
        try:
            codec.decode(ins, out=outs, decompression_config=cfg)
        except (RuntimeError, ValueError) as exc:
            raise FormatError(f"nvCOMP {ALGORITHMS[spec.name]} could not decode a chunk "
                              f"(corrupt data?): {exc}") from None


ANS_FAILED = "nvCOMP ANS could not decode a chunk (corrupt data?)"


def settle(later: list) -> None:
    """Run the checks ``decode`` left in ``later`` (after a ``synchronize``); raises
    FormatError for a batch that did not decode."""
    if not later:
        return
    failed = [ok for ok in later if not ok()]
    later.clear()
    if failed:
        raise FormatError(ANS_FAILED)


def _ints(x) -> list[int]:
    """Python ints, as nvCOMP's Python API takes offsets and sizes."""
    return np.asarray(x, dtype=np.int64).tolist()


class EmulatedBackend:
    """The same pipeline on the CPU: kernels compiled as C++, zlib standing in for nvCOMP."""

    emulated = True
    nvcomp_version = (255, 0, 0)

    def __init__(self) -> None:
        from ._emulate import EmulatedKernels
        self._kernels = EmulatedKernels(_kernels.expressions())
        self._keep: list[np.ndarray] = []

    def empty(self, nbytes: int) -> np.ndarray:
        n = max(int(nbytes), 1)
        raw = np.empty(n + 256, dtype=np.uint8)
        off = (-raw.ctypes.data) % 256
        return raw[off: off + n]

    def zeros(self, nbytes: int) -> np.ndarray:
        a = self.empty(nbytes)
        a[:] = 0
        return a

    @staticmethod
    def ptr(arr) -> int:
        return int(arr.ctypes.data)

    def pinned(self, nbytes: int) -> np.ndarray:
        return self.empty(nbytes)

    def upload(self, dst, offset: int, host: np.ndarray) -> None:
        dst[offset: offset + host.nbytes] = host.reshape(-1).view(np.uint8)

    def download(self, src, offset: int, out: np.ndarray) -> None:
        out.reshape(-1).view(np.uint8)[:] = src[offset: offset + out.nbytes]

    def copy(self, dst_ptr: int, src_ptr: int, n: int) -> None:
        if n:
            ctypes.memmove(dst_ptr, src_ptr, n)

    def xor_into(self, dst_ptr: int, a_ptr: int, b_ptr: int, n: int) -> None:
        if n:
            a = np.frombuffer((ctypes.c_uint8 * n).from_address(a_ptr), dtype=np.uint8)
            b = np.frombuffer((ctypes.c_uint8 * n).from_address(b_ptr), dtype=np.uint8)
            d = np.frombuffer((ctypes.c_uint8 * n).from_address(dst_ptr), dtype=np.uint8)
            np.bitwise_xor(a, b, out=d)

    def undiff_into(self, dst_ptr: int, base_ptr: int, n: int, itemsize: int) -> None:
        if n:
            from s4fs.codec._buffers import undiff
            d = np.frombuffer((ctypes.c_uint8 * n).from_address(dst_ptr), dtype=np.uint8)
            b = np.frombuffer((ctypes.c_uint8 * n).from_address(base_ptr), dtype=np.uint8)
            d[:] = undiff(d.copy(), b, itemsize)

    def views(self, arr, offsets, lens) -> list:
        return [arr[o: o + n] for o, n in zip(offsets, lens)]

    def synchronize(self) -> None:
        pass

    def wait_external(self, obj) -> None:
        pass

    def launch(self, name: str, grid: tuple[int, int], block: int, args: list[int]) -> None:
        # small blocks keep the emulation quick; results do not depend on the shape
        self._kernels.launch(name, grid, block, args)

    def max_compressed(self, spec: CodecSpec) -> int:
        return spec.chunk + spec.chunk // 8 + 64

    def decompress_alignment(self, spec: CodecSpec) -> int:
        return 16

    def encode(self, spec, src, src_off, sizes, dst, dst_off, cap) -> np.ndarray:
        out = np.empty(len(sizes), dtype=np.int64)
        for i, (so, n, do) in enumerate(zip(src_off, sizes, dst_off)):
            z = zlib.compressobj(1, zlib.DEFLATED, -15)
            c = z.compress(src[so: so + n].tobytes()) + z.flush()
            assert len(c) <= cap
            dst[do: do + len(c)] = np.frombuffer(c, dtype=np.uint8)
            out[i] = len(c)
        return out

    def decode(self, spec, src, src_off, src_sizes, dst, dst_off, dst_sizes,
               later=None) -> None:
        for so, sn, do, dn in zip(src_off, src_sizes, dst_off, dst_sizes):
            d = zlib.decompressobj(-15)
            try:
                piece = d.decompress(src[so: so + sn].tobytes(), dn)
            except zlib.error as exc:
                raise FormatError(f"emulated nvCOMP could not decode a chunk: {exc}") from None
            dst[do: do + len(piece)] = np.frombuffer(piece, dtype=np.uint8)


# Per thread (nvCOMP codecs and CUDA streams belong to the thread that made them: mostly
# the process's one GPU thread, s4fs.codec._device), and every live one, which the exit
# hook must reach to free nvCOMP's objects before CuPy's streams go.
_local = threading.local()
_LIVE: "weakref.WeakSet[CudaBackend]" = weakref.WeakSet()


@atexit.register
def _release_all() -> None:
    for b in list(_LIVE):
        b.release()


def pinned_size(nbytes: int) -> int:
    """The size class a request for ``nbytes`` of pinned memory is allocated in.

    CuPy's pinned pool gives a freed block back only to a request of exactly its size.
    Every batch asks for a different size (its blobs, its staged inputs), so without
    classes each batch pinned new memory (slow) and the pool kept every freed block: a mount's GPU worker, or a training process calling
    ``s4fs.save``, pinned more host memory with every save. Classes: 4 KiB steps up to
    64 KiB, then four per doubling (at most 25 % more than asked)."""
    n = max(int(nbytes), 1)
    if n <= 1 << 16:
        return -(-n // 4096) * 4096
    step = (1 << (n - 1).bit_length()) // 8
    return -(-n // step) * step


def pinned_host(nbytes: int) -> np.ndarray:
    """``nbytes`` (at least one) of pinned host memory from CuPy's pool, as uint8 (the
    block behind it is of ``pinned_size(nbytes)``)."""
    import cupy
    n = max(int(nbytes), 1)
    mem = cupy.cuda.alloc_pinned_memory(pinned_size(n))
    return np.frombuffer(mem, dtype=np.uint8, count=n)


def cuda_backend(device_id: int | None = None) -> CudaBackend:
    """This thread's backend for a device (nvCOMP codecs are per thread); ``None``: the
    thread's current CUDA device, asked at every call (``torch.cuda.device(n)`` or
    ``cupy.cuda.Device(n)`` change it), so a thread that moves between GPUs codes on
    the one it is on, not on the first it used."""
    cache = getattr(_local, "backends", None)
    if cache is None:
        cache = _local.backends = {}
    try:
        if device_id is None:
            import cupy
            device_id = cupy.cuda.runtime.getDevice()
        b = cache.get(device_id)
        if b is None:
            b = cache[device_id] = CudaBackend(device_id)
    except ImportError as exc:
        raise CodecUnavailableError(
            f"the GPU codec needs cupy and nvidia-nvcomp: {exc}") from None
    return b


def round_up(n: int, a: int) -> int:
    return _round(n, a)


MAX_GRID_Y = 65535      # CUDA's limit on a grid's second dimension


def row_launches(width) -> tuple[np.ndarray, list[tuple[int, int, int]]]:
    """How to launch a kernel that takes one row per grid y and ``width[row]`` blocks
    along x: the rows in an order (``order``: sort the row table by it) and launches
    ``(lo, hi, x)`` over ``order[lo:hi]``, whose widths are within a factor of two (and
    at most ``MAX_GRID_Y`` rows), with x the widest of them (0: nothing to launch).
    One launch over all rows runs the widest row's width for every row: one 4 MiB chunk
    among thousands of small tensors' chunks made millions of idle blocks."""
    width = np.asarray(width, dtype=np.int64).reshape(-1)
    order = np.argsort(width, kind="stable")
    w = width[order]
    bucket = np.zeros(len(w), dtype=np.int64)
    live = w > 0
    bucket[live] = np.floor(np.log2(w[live])).astype(np.int64) + 1
    cuts = (np.flatnonzero(np.diff(bucket)) + 1).tolist()
    out = []
    for lo, hi in zip([0] + cuts, cuts + [len(w)]):
        for s in range(lo, hi, MAX_GRID_Y):
            e = min(hi, s + MAX_GRID_Y)
            out.append((s, e, int(w[e - 1])))
    return order, out
