"""Whole-file checksums on the device: zip CRC-32 of many records, and the XXH3-128 of a
file that exists only as pieces (host bytes and device buffers), without assembling it.

``s4fs.save`` of CUDA tensors needs both: the zip records a CRC-32 of every storage
(``torch.load`` checks it), and a manifest records the XXH3-128 of the whole file (every
full read is checked against it). The host side here is plain Python: the CRC shift
operators (GF(2) linear maps, built once with ``zlib``), the XXH3 last stripe and the
128-bit merge (a few dozen integer operations).
"""

from __future__ import annotations

import bisect
import functools
import zlib

import numpy as np

from ._backend import row_launches
from ._kernels import XXH3_SECRET

CRC_BLOCK = 16384               # bytes per CRC block (the kernels' CRC_BLOCK)
_M32 = 0xFFFFFFFF
_M64 = (1 << 64) - 1


# ---------------------------------------------------------------- CRC-32 algebra

def _raw_shift_bytes(reg: int, n: int) -> int:
    """The CRC register ``reg`` advanced over ``n`` zero bytes (zlib, small n)."""
    return zlib.crc32(bytes(n), reg ^ _M32) ^ _M32


@functools.lru_cache(maxsize=1)
def crc_tables() -> tuple[np.ndarray, np.ndarray]:
    """(slice-by-4 byte tables, shift-by-CRC_BLOCK tables): 4 x 256 uint32 each."""
    t0 = [_raw_shift_bytes(i, 1) for i in range(256)]
    tabs = [t0]
    for _ in range(3):
        prev = tabs[-1]
        tabs.append([(v >> 8) ^ t0[v & 0xFF] for v in prev])
    cols = [_raw_shift_bytes(1 << i, CRC_BLOCK) for i in range(32)]
    shift = [[_apply(cols, v << (8 * k)) for v in range(256)] for k in range(4)]
    return (np.asarray(tabs, dtype=np.uint32).reshape(-1),
            np.asarray(shift, dtype=np.uint32).reshape(-1))


def _apply(cols: list[int], v: int) -> int:
    out = 0
    i = 0
    while v:
        if v & 1:
            out ^= cols[i]
        v >>= 1
        i += 1
    return out


def _compose(a: list[int], b: list[int]) -> list[int]:
    """The operator ``a`` after ``b`` (32 column images each)."""
    return [_apply(a, c) for c in b]


@functools.lru_cache(maxsize=1)
def _pow2_ops() -> list[list[int]]:
    """Operators advancing a register over 2**k zero bytes, k = 0..47."""
    ops = [[_raw_shift_bytes(1 << i, 1) for i in range(32)]]
    for _ in range(47):
        ops.append(_compose(ops[-1], ops[-1]))
    return ops


def crc32_of_zeros(n: int) -> int:
    """``zlib.crc32(bytes(n))`` for any ``n``, in ~log2(n) small steps."""
    reg = _M32
    k = 0
    ops = _pow2_ops()
    while n:
        if n & 1:
            reg = _apply(ops[k], reg)
        n >>= 1
        k += 1
    return reg ^ _M32


def finish_crc(raw: int, n: int) -> int:
    """The zip CRC-32 of ``n`` bytes whose zero-start, uninverted register is ``raw``."""
    return (raw ^ crc32_of_zeros(n)) & _M32


def crc32_records(b, ptrs: list[int], lens: list[int], keep: list):
    """Launch the CRC registers of every record (device pointers); returns the device
    array of uint32 registers, to be read back and passed through :func:`finish_crc`."""
    n = len(ptrs)
    out = b.zeros(4 * max(n, 1))
    if n == 0:
        return out
    lens_a = np.asarray(lens, dtype=np.int64)
    nb = (lens_a + CRC_BLOCK - 1) // CRC_BLOCK
    items = np.zeros((n, 4), dtype=np.uint64)
    items[:, 0] = np.asarray(ptrs, dtype=np.uint64)
    items[:, 1] = lens_a.astype(np.uint64)
    items[:, 2] = (np.cumsum(nb) - nb).astype(np.uint64)
    items[:, 3] = nb.astype(np.uint64)
    tables, shift = crc_tables()
    # the block CRCs' launches over the records by width; the join in record order
    order, launches = row_launches(np.minimum(-(-nb // 128), 8192))
    items = np.concatenate([items, items[order]])
    d_items, d_tab, d_shift = b.empty(items.nbytes), b.empty(tables.nbytes), b.empty(shift.nbytes)
    b.upload(d_items, 0, items.reshape(-1).view(np.uint8))
    b.upload(d_tab, 0, tables.view(np.uint8))
    b.upload(d_shift, 0, shift.view(np.uint8))
    blocks = b.zeros(4 * max(int(nb.sum()), 1))
    ip = b.ptr(d_items)
    for lo, hi, x in launches:
        if x:
            b.launch("crc32_blocks", (x, hi - lo), 128,
                     [ip + 32 * (n + lo), b.ptr(d_tab), b.ptr(blocks)])
    b.launch("crc32_join", (-(-n // 128), 1), 128,
             [ip, b.ptr(blocks), b.ptr(d_shift), b.ptr(out), n])
    keep += [items, tables, shift, d_items, d_tab, d_shift, blocks]
    return out


def crc32_many(b, ptrs: list[int], lens: list[int]) -> list[int]:
    """The zip CRC-32 of every record (device pointers); synchronizes."""
    keep: list = []
    d = crc32_records(b, ptrs, lens, keep)
    regs = np.empty(max(len(ptrs), 1), dtype=np.uint32)
    b.download(d, 0, regs.view(np.uint8))
    b.synchronize()
    return [finish_crc(int(r), n) for r, n in zip(regs.tolist(), lens)]


# ---------------------------------------------------------------- XXH3-128

def _u64(buf: bytes, off: int) -> int:
    return int.from_bytes(buf[off: off + 8], "little")


def _mulfold(a: int, b: int) -> int:
    p = a * b
    return (p ^ (p >> 64)) & _M64


def _aval3(h: int) -> int:
    h ^= h >> 37
    h = (h * 0x165667919E3779F9) & _M64
    return h ^ (h >> 32)


def _merge(accs: list[int], off: int, start: int) -> int:
    r = start & _M64
    for k in range(4):
        r = (r + _mulfold(accs[2 * k] ^ _u64(XXH3_SECRET, off + 16 * k),
                          accs[2 * k + 1] ^ _u64(XXH3_SECRET, off + 16 * k + 8))) & _M64
    return _aval3(r)


def xxh3_128_finish(accs: list[int], size: int, last64: bytes) -> str:
    """The XXH3-128 hex digest (as ``xxhash.xxh3_128().hexdigest()``) of a ``size``-byte
    input (> 240 bytes) from its accumulators after every stripe but the last, and its
    last 64 bytes."""
    if size <= 240 or len(last64) != 64:
        raise ValueError("xxh3_128_finish is for inputs longer than 240 bytes")
    accs = list(accs)
    for lane in range(8):
        dv = _u64(last64, 8 * lane)
        dk = dv ^ _u64(XXH3_SECRET, 121 + 8 * lane)
        accs[lane ^ 1] = (accs[lane ^ 1] + dv) & _M64
        accs[lane] = (accs[lane] + (dk & _M32) * (dk >> 32)) & _M64
    lo = _merge(accs, 11, size * 0x9E3779B185EBCA87)
    hi = _merge(accs, len(XXH3_SECRET) - 64 - 11, ~(size * 0xC2B2AE3D27D4EB4F))
    return f"{hi:016x}{lo:016x}"


def xxh3_128_runs(b, runs: list[tuple[int, int, int]], size: int, last64: bytes,
                  keep: list) -> str:
    """XXH3-128 of a ``size``-byte file laid out as ``runs`` of (first stripe, stripe
    count, device pointer) covering at least its first ``(size - 1) // 64`` stripes, in
    order; ``last64``: its last 64 bytes. Synchronizes (one 64-byte readback)."""
    total = (size - 1) // 64
    arr = np.asarray(runs, dtype=np.uint64).reshape(-1, 3)
    d_runs = b.empty(max(arr.nbytes, 8))
    b.upload(d_runs, 0, arr.reshape(-1).view(np.uint8))
    nblocks = total // 16 + 1
    sums = b.empty(64 * nblocks)
    accs = b.empty(64)
    b.launch("xxh3_run_blocks", (min(-(-nblocks // 128), 8192), 1), 128,
             [b.ptr(d_runs), len(arr), total, b.ptr(sums)])
    b.launch("xxh3_chain", (1, 1), 8, [b.ptr(sums), total // 16, b.ptr(accs)])
    h = np.empty(8, dtype=np.uint64)
    b.download(accs, 0, h.view(np.uint8))
    b.synchronize()
    keep += [arr, d_runs, sums, accs]
    return xxh3_128_finish([int(x) for x in h], size, last64)


def xxh3_128_pieces(b, pieces: list, size: int, keep: list) -> str:
    """XXH3-128 of a file given as ``pieces`` (offset, length, host bytes or a device
    pointer) tiling it in order. The stripes (64 bytes) wholly inside a device storage are
    read where they lie; every other stripe is copied into one patch buffer: host
    bytes uploaded, the device bytes of stripes that straddle a storage's ends
    gathered into it on the device."""
    from ._common import Segments
    starts = [p[0] for p in pieces]
    patch = bytearray()
    gathers: list[tuple[int, int, int]] = []    # (device source, patch offset, length)

    def fill(lo: int, hi: int) -> None:          # file bytes [lo, hi) onto the patch
        i = bisect.bisect_right(starts, lo) - 1
        while lo < hi:
            off, n, src = pieces[i]
            k = min(hi, off + n) - lo
            if isinstance(src, int):
                gathers.append((src + lo - off, len(patch), k))
                patch.extend(bytes(k))
            else:
                patch.extend(src[lo - off: lo - off + k])
            lo += k
            i += 1

    runs: list[tuple[int, int, int]] = []       # (first stripe, count, ptr | ~patch offset)
    pos = 0
    for off, n, src in pieces:
        if not isinstance(src, int):
            continue
        first, last = -(-off // 64) * 64, (off + n) // 64 * 64
        if first >= last:
            continue                             # no whole stripe: all of it patched
        if first > pos:
            runs.append((pos // 64, (first - pos) // 64, ~len(patch)))
            fill(pos, first)
        runs.append((first // 64, (last - first) // 64, src + first - off))
        pos = last
    if pos < size:
        runs.append((pos // 64, -(-(size - pos) // 64), ~len(patch)))
        fill(pos, size)
        patch.extend(bytes(-len(patch) % 64))
    d_patch = b.empty(max(len(patch), 64))
    h_patch = np.frombuffer(bytes(patch) or bytes(64), dtype=np.uint8)
    b.upload(d_patch, 0, h_patch)
    base = b.ptr(d_patch)
    if gathers:
        seg = Segments()
        for src, at, k in gathers:
            seg.add(src, base + at, k)
        seg.launch(b, keep)
    keep += [d_patch, h_patch]
    runs = [(s, c, base + ~p if p < 0 else p) for s, c, p in runs]
    end_off, end_n, end_src = pieces[-1]
    if isinstance(end_src, int) or end_off + end_n != size or end_n < 64:
        raise ValueError("the file must end in at least 64 bytes of host memory")
    last64 = bytes(end_src[end_n - 64: end_n])
    return xxh3_128_runs(b, runs, size, last64, keep)
