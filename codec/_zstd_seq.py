"""Standard zstd frames built from sequences we choose ourselves.

zstd's own match finders cost exponent planes 5-10 % against their order-0 entropy:
they take every 5-7 byte repeat of a low-entropy stream, and each such match costs more
than the Huffman-coded literals it replaces. ``ZSTD_compressSequences`` lets us hand
zstd the parse instead: no matches at all (so every byte goes through zstd's Huffman
literal coder, ~0.01 bit above the order-0 entropy, at several hundred MB/s), or only
the long runs of zero bytes (offset-1 matches), which is what the untouched rows of
optimizer state and unchanged stretches of a delta need.

The result is an ordinary zstd frame: the ``zstd`` plane codec decodes it (any zstd
decoder does). The sequence API lives in python-zstandard's cffi backend; when that
cannot be loaded, :func:`available` is False and callers use deflate instead.
"""

from __future__ import annotations

import functools
import threading

import numpy as np

from . import _planes

BLOCK = 1 << 16           # zstd blocks hold at most 128 KiB; 64 KiB tables adapt better
MIN_RUN = 32              # zero runs shorter than this stay literals
_SEQ = np.dtype([("offset", "<u4"), ("litLength", "<u4"), ("matchLength", "<u4"),
                 ("rep", "<u4")])
_local = threading.local()


@functools.lru_cache(maxsize=1)
def _api():
    from zstandard import _cffi  # noqa: PLC0415  (optional: needs cffi)
    ffi, lib = _cffi.ffi, _cffi.lib
    if ffi.sizeof("ZSTD_Sequence") != _SEQ.itemsize:
        raise ImportError("unexpected ZSTD_Sequence layout")
    return ffi, lib


@functools.lru_cache(maxsize=1)
def available() -> bool:
    """True when python-zstandard's sequence API can be used. Probed once: a failed
    import is not cached by Python (nor by ``_api``'s cache, which keeps results, not
    exceptions), and retrying it for every plane cost a save of many small CPU tensors
    0.1-0.2 s on a machine without cffi."""
    try:
        _api()
    except Exception:      # no cffi, or a zstandard build without its cffi backend
        return False
    return True


def _cctx():
    ctx = getattr(_local, "cctx", None)
    if ctx is not None:
        return ctx
    ffi, lib = _api()
    ctx = ffi.gc(lib.ZSTD_createCCtx(), lib.ZSTD_freeCCtx)
    for param, value in ((lib.ZSTD_c_compressionLevel, 1), (lib.ZSTD_c_checksumFlag, 0),
                         (lib.ZSTD_c_contentSizeFlag, 0), (lib.ZSTD_c_dictIDFlag, 0),
                         (lib.ZSTD_c_blockDelimiters, 1),      # explicit delimiters
                         (lib.ZSTD_c_validateSequences, 1)):   # refuse a bad parse
        _check(lib, ffi, lib.ZSTD_CCtx_setParameter(ctx, param, value))
    _local.cctx = ctx
    return ctx


def _check(lib, ffi, r: int) -> int:
    if lib.ZSTD_isError(r):
        raise RuntimeError(ffi.string(lib.ZSTD_getErrorName(r)).decode())
    return r


def _zero_runs(arr: np.ndarray, min_run: int) -> tuple[np.ndarray, np.ndarray]:
    """Starts and ends of the runs of zero bytes at least ``min_run`` long: one pass in
    C without the GIL where the extension is built (five NumPy passes otherwise, a
    fifth of a plane's coding)."""
    if _planes.USE_C:
        pairs = np.empty((arr.size // (min_run + 1) + 1, 2), dtype=np.int64)
        count = _planes._shuffle.zero_runs(arr, pairs, min_run)
        return pairs[:count, 0], pairs[:count, 1]
    return _zero_runs_numpy(arr, min_run)


def _zero_runs_numpy(arr: np.ndarray, min_run: int) -> tuple[np.ndarray, np.ndarray]:
    """The NumPy reference of :func:`_zero_runs`."""
    z = np.empty(arr.size + 2, dtype=np.int8)
    z[0] = z[-1] = 0
    np.equal(arr, 0, out=z[1:-1].view(np.bool_))
    edges = np.flatnonzero(np.diff(z))
    starts, ends = edges[0::2], edges[1::2]
    keep = ends - starts >= min_run
    return starts[keep], ends[keep]


def _sequences(n: int, starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
    """Sequences with explicit block delimiters. Each zero run [s, e) becomes the literal
    zero at s plus an offset-1 match of e-s-1 bytes; runs are cut at block edges."""
    nblocks = (n + BLOCK - 1) // BLOCK
    if not starts.size:                      # literals only: one delimiter per block
        seq = np.zeros(nblocks, dtype=_SEQ)
        seq["litLength"] = BLOCK
        seq["litLength"][-1] = n - (nblocks - 1) * BLOCK
        return seq
    pieces_s, pieces_e = [], []
    while starts.size:                       # cut every run at the block edges inside it
        edge = np.minimum((starts // BLOCK + 1) * BLOCK, n)
        cut = np.minimum(ends, edge)
        pieces_s.append(starts)
        pieces_e.append(cut)
        more = ends > edge
        starts, ends = edge[more], ends[more]
    rs, re_ = np.concatenate(pieces_s), np.concatenate(pieces_e)
    # one literal zero + a match of at least 4: zstd's sequence check refuses shorter
    # matches at its default minMatch (a run cut to 4 bytes at a block edge made
    # ZSTD_compressSequences fail; hypothesis found it)
    keep = re_ - rs >= 5
    rs, re_ = rs[keep], re_[keep]
    order = np.argsort(rs, kind="stable")
    rs, re_ = rs[order], re_[order]
    blk = rs // BLOCK
    blk_start = np.arange(nblocks, dtype=np.int64) * BLOCK
    blk_end = np.minimum(blk_start + BLOCK, n)
    # literals before a run start where the previous run of the same block ended
    prev = np.empty_like(rs)
    if rs.size:
        prev[0] = 0
        prev[1:] = re_[:-1]
        prev = np.maximum(prev, blk * BLOCK)
    # the block's delimiter carries the literals after its last run
    last = np.searchsorted(blk, np.arange(nblocks), side="right") - 1
    tail_from = blk_start.copy()
    has = last >= 0
    has[has] = blk[last[has]] == np.flatnonzero(has)
    tail_from[has] = re_[last[has]]
    seq = np.zeros(rs.size + nblocks, dtype=_SEQ)
    key = np.concatenate([2 * rs, 2 * blk_end - 1])
    order = np.argsort(key, kind="stable")
    rows = np.empty_like(order)
    rows[order] = np.arange(order.size)
    run_rows, delim_rows = rows[: rs.size], rows[rs.size:]
    seq["litLength"][run_rows] = rs - prev + 1
    seq["matchLength"][run_rows] = re_ - rs - 1
    seq["offset"][run_rows] = 1
    seq["litLength"][delim_rows] = blk_end - tail_from
    return seq


def encode(arr: np.ndarray, *, runs: bool = False) -> bytes | None:
    """A zstd frame of ``arr`` (uint8, contiguous) with Huffman-coded literals and, when
    ``runs``, offset-1 matches over zero runs of at least ``MIN_RUN`` bytes; None when
    zstd refuses the parse (never expected: the caller then codes the plane otherwise)."""
    ffi, lib = _api()
    n = arr.size
    if runs:
        starts, ends = _zero_runs(arr, MIN_RUN)
    else:
        starts = ends = np.empty(0, dtype=np.int64)
    seq = _sequences(n, starts, ends)
    cap = lib.ZSTD_compressBound(n)
    dst = np.empty(cap, dtype=np.uint8)
    r = lib.ZSTD_compressSequences(
        _cctx(), ffi.from_buffer(dst), cap,
        ffi.cast("ZSTD_Sequence *", ffi.from_buffer(seq)), seq.size,
        ffi.from_buffer(arr), n)
    if lib.ZSTD_isError(r):
        return None
    return dst[:r].tobytes()
