"""The C plane split/merge (codec/_shuffle.c) against its NumPy reference (_planes.py):
identical planes and identical merges for every CPU layout, on adversarial bit patterns
and random bytes of every length (tails included), and on property-generated inputs."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from s4fs.codec import _dtypes, _planes
from s4fs.testing import adversarial

pytestmark = pytest.mark.skipif(_planes._shuffle is None,
                                reason="the C extension s4fs.codec._shuffle is not built")

DTYPES = ["bfloat16", "float16", "float32", "float64", "complex64", "complex32", "int16",
          "int32", "int64", "uint16", "bytes", "float8_e4m3fn"]


def both(data: bytes, dtype: str):
    dt = _dtypes.lookup(dtype)
    layout = _planes.cpu_layout_for(dt)
    try:
        _planes.USE_C = True
        fast = [bytes(p) for p in _planes.split(memoryview(data), dt, layout)]
        _planes.USE_C = False
        ref = [bytes(p) for p in _planes.split(memoryview(data), dt, layout)]
        merged_ref = _planes.merge(ref, dt, layout, len(data))
        _planes.USE_C = True
        merged_fast = _planes.merge(fast, dt, layout, len(data))
    finally:
        _planes.USE_C = True
    return layout, fast, ref, merged_fast, merged_ref


@pytest.mark.parametrize("dtype", DTYPES)
def test_c_split_and_merge_equal_the_reference(dtype):
    rng = np.random.default_rng(7)
    cases = [case for _, dt, case in adversarial.all_cases(n_random=50_000) if dt == dtype]
    cases += [rng.integers(0, 256, n, dtype=np.uint8).tobytes()
              for n in (0, 1, 2, 3, 7, 8, 9, 15, 16, 17, 1023, 4096, 100_003)]
    for data in cases:
        layout, fast, ref, mf, mr = both(data, dtype)
        assert fast == ref, (dtype, layout, len(data))
        assert mf == mr == data, (dtype, layout, len(data))


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=5000), st.sampled_from(DTYPES))
def test_c_twin_property(data, dtype):
    _, fast, ref, mf, mr = both(data, dtype)
    assert fast == ref and mf == mr == data


def test_c_merge_rejects_short_planes():
    with pytest.raises(ValueError):
        _planes._shuffle.merge_sm([b"\0" * 3, b"\0" * 4], bytearray(8), 2)
    with pytest.raises(ValueError):
        _planes._shuffle.split_bytes(b"\0" * 7, bytearray(7), 2)


def _runs_both(arr: np.ndarray, min_run: int):
    from s4fs.codec import _zstd_seq
    fast = _zstd_seq._zero_runs(arr, min_run)
    ref = _zstd_seq._zero_runs_numpy(arr, min_run)
    return [x.tolist() for x in fast], [x.tolist() for x in ref]


@pytest.mark.parametrize("min_run", [1, 5, 14, 15, 16, 32])
def test_c_zero_runs_equal_the_reference(min_run):
    """The long zero runs zstd's parse gets (codec/_zstd_seq.py) from C equal NumPy's:
    runs at both ends, runs across 8-byte words, every run length around min_run, the
    most runs a buffer can hold."""
    rng = np.random.default_rng(11)
    cases = [np.zeros(n, np.uint8) for n in (0, 1, 7, 8, 9, 31, 32, 33, 4097)]
    cases += [np.ones(n, np.uint8) for n in (1, 8, 100)]
    for p in (0.3, 0.9, 0.99):
        for n in (1, 13, 64, 1000, 65_537):
            cases.append(np.where(rng.random(n) < p, 0, rng.integers(1, 256, n)).astype(np.uint8))
    packed = np.ones(10 * (min_run + 1), np.uint8)     # the most runs there can be
    packed.reshape(-1, min_run + 1)[:, :min_run] = 0
    cases += [packed, packed[1:], np.concatenate([packed, np.zeros(min_run, np.uint8)])]
    for length in range(1, 3 * min_run + 10):        # one run of each length, any offset
        for at in range(9):
            a = np.full(at + length + 9, 7, np.uint8)
            a[at:at + length] = 0
            cases.append(a)
    for arr in cases:
        fast, ref = _runs_both(arr, min_run)
        assert fast == ref, (arr.size, min_run)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 200), st.integers(0, 40)), max_size=30),
       st.integers(1, 64))
def test_c_zero_runs_property(pieces, min_run):
    """Random alternations of zero runs and non-zero bytes."""
    arr = np.concatenate([np.zeros(0, np.uint8)] + [
        np.concatenate([np.zeros(z, np.uint8), np.full(k, 3, np.uint8)]) for z, k in pieces])
    fast, ref = _runs_both(arr, min_run)
    assert fast == ref


def test_c_zero_runs_rejects_too_little_room():
    with pytest.raises(ValueError, match="room for"):
        _planes._shuffle.zero_runs(b"\0" * 100, np.empty((1, 2), np.int64), 4)
    with pytest.raises(ValueError, match="min_run"):
        _planes._shuffle.zero_runs(b"\0", np.empty((2, 2), np.int64), 0)
