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
