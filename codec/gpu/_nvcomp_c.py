"""nvCOMP ANS through its batched C API (``libnvcomp``, called with ctypes).

The Python API (``nvidia.nvcomp.Codec``) builds a Python object per chunk, a
configuration per batch, and allocates and frees pinned host memory (cudaHostAlloc /
cudaFreeHost) on every call: more host time per batch of thousands of chunks than the
ANS kernels take on the device, and cudaFreeHost also waits for the device. The C API takes device arrays of chunk pointers and sizes, a scratch buffer we
allocate from CuPy's pool, and writes sizes and statuses to device memory: one upload
of the pointer table, one launch, no allocation.

The bitstream is the one the Python API writes with ``BitstreamKind.RAW`` (the same
library function underneath); ``CudaBackend`` checks that on first use by coding a
sample each way and decoding it the other way, and falls back to the Python API if
anything differs. Only nvCOMP 6 (the header this binding follows) is bound.
"""

from __future__ import annotations

import ctypes
import glob
import os

import numpy as np

NVCOMP_TYPE_UCHAR = 1           # the Python API's data_type "|u1"
NVCOMP_TYPE_BITS = 0xFF         # decompression: read the type from the bitstream
SUCCESS = 0


class CompressOpts(ctypes.Structure):
    _fields_ = [("type", ctypes.c_int), ("data_type", ctypes.c_int),
                ("max_sub_chunk_count", ctypes.c_uint8), ("states_per_lane", ctypes.c_uint8),
                ("histogram_reduction_log2", ctypes.c_uint8), ("reserved", ctypes.c_char * 53)]


class DecompressOpts(ctypes.Structure):
    _fields_ = [("backend", ctypes.c_int), ("data_type", ctypes.c_int),
                ("max_sub_chunk_count", ctypes.c_uint8), ("states_per_lane", ctypes.c_uint8),
                ("skip_validate", ctypes.c_uint8), ("reserved", ctypes.c_char * 53)]


def _library():
    try:
        import nvidia.libnvcomp as pkg
        here = os.path.dirname(pkg.__file__)
        for sub in ("lib64", "lib", "bin"):
            for path in sorted(glob.glob(os.path.join(here, sub, "libnvcomp.so.6*"))):
                return ctypes.CDLL(path, ctypes.RTLD_LOCAL)
    except ImportError:
        pass
    return ctypes.CDLL("libnvcomp.so.6", ctypes.RTLD_LOCAL)


class AnsC:
    """Batched ANS compress/decompress over device pointer tables."""

    def __init__(self) -> None:
        lib = self.lib = _library()
        P, S, V = ctypes.c_void_p, ctypes.c_size_t, ctypes.POINTER(ctypes.c_size_t)
        lib.nvcompBatchedANSCompressGetTempSize.argtypes = [S, S, CompressOpts, V, S, P]
        lib.nvcompBatchedANSCompressGetMaxOutputChunkSize.argtypes = [S, CompressOpts, V]
        lib.nvcompBatchedANSCompressAsync.argtypes = [P, P, S, S, P, S, P, P, CompressOpts, P, P]
        lib.nvcompBatchedANSDecompressGetTempSize.argtypes = [S, S, DecompressOpts, V, S, P]
        lib.nvcompBatchedANSDecompressAsync.argtypes = [P, P, P, P, S, P, S, P, DecompressOpts,
                                                        P, P]
        for fn in ("nvcompBatchedANSCompressGetTempSize",
                   "nvcompBatchedANSCompressGetMaxOutputChunkSize",
                   "nvcompBatchedANSCompressAsync", "nvcompBatchedANSDecompressGetTempSize",
                   "nvcompBatchedANSDecompressAsync"):
            getattr(lib, fn).restype = ctypes.c_int
        self.copts = CompressOpts(0, NVCOMP_TYPE_UCHAR, 0, 0, 0)
        self.dopts = DecompressOpts(0, NVCOMP_TYPE_BITS, 0, 0, 0)

    @staticmethod
    def _check(status: int, what: str) -> None:
        if status != SUCCESS:
            raise RuntimeError(f"nvCOMP {what} returned status {status}")

    def max_output(self, chunk: int) -> int:
        out = ctypes.c_size_t()
        self._check(self.lib.nvcompBatchedANSCompressGetMaxOutputChunkSize(
            chunk, self.copts, ctypes.byref(out)), "GetMaxOutputChunkSize")
        return out.value

    def _temp_bytes(self, kind: str, n: int, chunk: int, total: int, stream: int) -> int:
        out = ctypes.c_size_t()
        if kind == "compress":
            st = self.lib.nvcompBatchedANSCompressGetTempSize(
                n, chunk, self.copts, ctypes.byref(out), total, stream)
        else:
            st = self.lib.nvcompBatchedANSDecompressGetTempSize(
                n, chunk, self.dopts, ctypes.byref(out), total, stream)
        self._check(st, "GetTempSize")
        return out.value

    def _run(self, b, kind: str, columns: list, chunk: int, total: int, call):
        """One batched call: the u64 ``columns`` (pointers, sizes) go up as one table
        followed by room for a size and a status per chunk; ``call(table, temp, temp
        bytes)`` launches. Returns a function that gives the sizes and statuses nvCOMP
        wrote once the stream has run (they come back into pinned memory: nothing waits
        here)."""
        n = len(columns[0])
        table = np.concatenate([np.asarray(c, dtype=np.uint64) for c in columns])
        dev = b.empty(8 * len(table) + 12 * n)
        b.upload(dev, 0, table.view(np.uint8))
        temp_n = self._temp_bytes(kind, n, chunk, total, b.stream.ptr)
        temp = b.empty(max(temp_n, 1))
        self._check(call(b.ptr(dev), b.ptr(temp), temp_n), f"ANS {kind}")
        out = b.pinned(12 * n)
        b.download(dev, 8 * len(table), out)

        def result(held=(dev, temp)):       # the tables and scratch live until it is read
            return out[: 8 * n].view(np.uint64), out[8 * n:].view(np.int32)
        return result

    def compress(self, b, src_ptrs, sizes, dst_ptrs, chunk: int) -> np.ndarray:
        """Compress chunks (device pointers and sizes) into ``dst_ptrs``; returns the
        compressed sizes."""
        n = len(sizes)
        sizes = np.asarray(sizes, dtype=np.uint64)
        result = self._run(
            b, "compress", [src_ptrs, sizes, dst_ptrs], chunk, int(sizes.sum()),
            lambda t, temp, temp_n: self.lib.nvcompBatchedANSCompressAsync(
                t, t + 8 * n, chunk, n, temp, temp_n, t + 16 * n, t + 24 * n, self.copts,
                t + 32 * n, b.stream.ptr))
        b.synchronize()
        out, status = result()
        if np.any(status != SUCCESS):
            raise RuntimeError(f"nvCOMP ANS compress: chunk status {int(status[status != 0][0])}")
        return out.astype(np.int64)

    def decompress(self, b, src_ptrs, src_sizes, dst_ptrs, dst_sizes, chunk: int,
                   wait: bool = True):
        """Decompress chunks; True when every chunk decoded to exactly its expected size
        (``wait=False``: a function that says so once the stream has run)."""
        n = len(src_sizes)
        dst_sizes = np.asarray(dst_sizes, dtype=np.uint64)
        result = self._run(
            b, "decompress", [src_ptrs, src_sizes, dst_sizes, dst_ptrs], chunk,
            int(dst_sizes.sum()),
            lambda t, temp, temp_n: self.lib.nvcompBatchedANSDecompressAsync(
                t, t + 8 * n, t + 16 * n, t + 32 * n, n, temp, temp_n, t + 24 * n,
                self.dopts, t + 40 * n, b.stream.ptr))

        def ok() -> bool:
            got, status = result()
            return bool(np.all(status == SUCCESS) and np.all(got == dst_sizes))
        if not wait:
            return ok
        b.synchronize()
        return ok()
