"""Run the GPU kernels on the CPU, for tests on machines without a GPU.

The CUDA source of ``_kernels`` is compiled as plain C++ (with a few shims for CUDA's
built-ins) and each launch runs its blocks and threads one after another. The kernels
are written so that this gives exactly the GPU's result (no shared memory, barriers or
warp intrinsics). Needs a C++ compiler (``g++`` or ``c++``); never used in production.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import shutil
import subprocess
import tempfile

from . import _kernels as K

_SHIMS = r"""
#include <cmath>
#include <cstdint>
#include <cstring>
struct dim3_ { unsigned x, y, z; };
static thread_local dim3_ threadIdx, blockIdx, blockDim, gridDim;
struct uint4 { unsigned x, y, z, w; };
struct ulonglong2 { unsigned long long x, y; };
#define __global__
#define __device__
#define __forceinline__ inline
#define __constant__ static
static inline unsigned long long __umul64hi(unsigned long long a, unsigned long long b) {
    return (unsigned long long)(((unsigned __int128)a * b) >> 64);
}
static inline unsigned atomicOr(unsigned* p, unsigned v) { unsigned o = *p; *p |= v; return o; }
static inline unsigned atomicAdd(unsigned* p, unsigned v) { unsigned o = *p; *p += v; return o; }
"""

_LAUNCH = r"""
template <class F>
static void run_grid(unsigned gx, unsigned gy, unsigned bx, F f) {
    gridDim = {gx, gy, 1}; blockDim = {bx, 1, 1};
    for (unsigned y = 0; y < gy; ++y)
        for (unsigned x = 0; x < gx; ++x)
            for (unsigned t = 0; t < bx; ++t) {
                blockIdx = {x, y, 0}; threadIdx = {t, 0, 0};
                f();
            }
}
#define P(T, a) ((T)(uintptr_t)(a))
extern "C" void emu_xxh3_blocks(unsigned gx, unsigned gy, unsigned bx, u64 items, u64 sums) {
    run_grid(gx, gy, bx, [&] { xxh3_blocks(P(const u64*, items), P(u64*, sums)); });
}
extern "C" void emu_xxh3_scan(unsigned gx, unsigned gy, unsigned bx, u64 items, u64 sums, u64 accs, u64 n) {
    run_grid(gx, gy, bx, [&] { xxh3_scan(P(const u64*, items), P(const u64*, sums), P(u64*, accs), n); });
}
extern "C" void emu_xxh3_final(unsigned gx, unsigned gy, unsigned bx, u64 items, u64 accs, u64 out, u64 n) {
    run_grid(gx, gy, bx, [&] { xxh3_final(P(const u64*, items), P(const u64*, accs), P(u64*, out), n); });
}
extern "C" void emu_copy_segments(unsigned gx, unsigned gy, unsigned bx, u64 segs, u64 n) {
    run_grid(gx, gy, bx, [&] { copy_segments(P(const u64*, segs), n); });
}
extern "C" void emu_sample_histograms(unsigned gx, unsigned gy, unsigned bx, u64 planes, u64 hist) {
    run_grid(gx, gy, bx, [&] { sample_histograms(P(const u64*, planes), P(u32*, hist)); });
}
extern "C" void emu_plane_entropy(unsigned gx, unsigned gy, unsigned bx, u64 hist, u64 out, u64 n) {
    run_grid(gx, gy, bx, [&] { plane_entropy(P(const u32*, hist), P(double*, out), n); });
}
extern "C" void emu_fill_segments(unsigned gx, unsigned gy, unsigned bx, u64 segs, u64 n) {
    run_grid(gx, gy, bx, [&] { fill_segments(P(const u64*, segs), n); });
}
extern "C" void emu_block_flags(unsigned gx, unsigned gy, unsigned bx, u64 items, u64 flags) {
    run_grid(gx, gy, bx, [&] { block_flags(P(const u64*, items), P(u8*, flags)); });
}
extern "C" void emu_xxh3_run_blocks(unsigned gx, unsigned gy, unsigned bx, u64 runs, u64 n, u64 total, u64 sums) {
    run_grid(gx, gy, bx, [&] { xxh3_run_blocks(P(const u64*, runs), n, total, P(u64*, sums)); });
}
extern "C" void emu_xxh3_chain(unsigned gx, unsigned gy, unsigned bx, u64 sums, u64 nfull, u64 accs) {
    run_grid(gx, gy, bx, [&] { xxh3_chain(P(const u64*, sums), nfull, P(u64*, accs)); });
}
extern "C" void emu_crc32_blocks(unsigned gx, unsigned gy, unsigned bx, u64 items, u64 table, u64 out) {
    run_grid(gx, gy, bx, [&] { crc32_blocks(P(const u64*, items), P(const u32*, table), P(u32*, out)); });
}
extern "C" void emu_crc32_join(unsigned gx, unsigned gy, unsigned bx, u64 items, u64 blocks, u64 shift, u64 out, u64 n) {
    run_grid(gx, gy, bx, [&] { crc32_join(P(const u64*, items), P(const u32*, blocks), P(const u32*, shift), P(u32*, out), n); });
}
"""


def _wrapper(idx: int, expr: str) -> str:
    kind = expr.split("<", 1)[0]
    if kind == "split":
        return (f'extern "C" void emu_t{idx}(unsigned gx, unsigned gy, unsigned bx, u64 d, u64 f) '
                f'{{ run_grid(gx, gy, bx, [&] {{ {expr}(P(const i64*, d), P(u32*, f)); }}); }}\n')
    return (f'extern "C" void emu_t{idx}(unsigned gx, unsigned gy, unsigned bx, u64 d, u64 f) '
            f'{{ run_grid(gx, gy, bx, [&] {{ {expr}(P(const i64*, d)); }}); }}\n')


def compiler() -> str | None:
    return shutil.which("g++") or shutil.which("c++")


class EmulatedKernels:
    """ctypes handles of every kernel, compiled as C++ for the CPU."""

    def __init__(self, expressions: list[str]) -> None:
        cxx = compiler()
        if cxx is None:
            raise RuntimeError("no C++ compiler (g++) to emulate the GPU kernels")
        code = _SHIMS + K.source() + _LAUNCH + "".join(
            _wrapper(i, e) for i, e in enumerate(expressions))
        tag = hashlib.sha256(code.encode()).hexdigest()[:16]
        folder = os.path.join(tempfile.gettempdir(), f"s4fs-emu-{os.getuid()}")
        os.makedirs(folder, exist_ok=True)
        lib = os.path.join(folder, f"kernels-{tag}.so")
        if not os.path.exists(lib):
            src = os.path.join(folder, f"kernels-{tag}.cpp")
            with open(src, "w") as fh:
                fh.write(code)
            tmp = lib + f".{os.getpid()}"
            subprocess.run([cxx, "-std=c++17", "-O1", "-fno-strict-aliasing", "-shared", "-fPIC",
                            "-Wno-unknown-pragmas", "-o", tmp, src], check=True,
                           capture_output=True)
            os.replace(tmp, lib)
        self._lib = ctypes.CDLL(lib)
        self._index = {e: i for i, e in enumerate(expressions)}

    def launch(self, name: str, grid: tuple[int, int], block: int, args: list[int]) -> None:
        if name in self._index:
            fn = getattr(self._lib, f"emu_t{self._index[name]}")
            args = list(args) + [0] * (2 - len(args))
        else:
            fn = getattr(self._lib, f"emu_{name}")
        fn(ctypes.c_uint(grid[0]), ctypes.c_uint(grid[1]), ctypes.c_uint(block),
           *[ctypes.c_uint64(int(a)) for a in args])
