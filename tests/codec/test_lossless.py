"""s4fs.codec: lossless round trips over every bit pattern, deltas, property tests,
corruption (typed errors, never wrong bytes), the size bound, and real data."""

from __future__ import annotations

import struct

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from s4fs import codec
from s4fs.codec import _container as C
from s4fs.codec import _plane_codecs as P
from s4fs.codec import _planes, _zstd_seq
from s4fs.codec._cpu import CpuProfile
from s4fs.errors import (BaseMismatchError, ChecksumError, CodecError, FormatError,
                         UnsupportedVersionError)
from s4fs.testing import adversarial as A

FLOATS = ["bfloat16", "float16", "float32", "float64", "float8_e4m3fn", "float8_e5m2",
          "float8_e4m3fnuz", "float8_e5m2fnuz", "complex32", "complex64", "complex128"]
OTHERS = ["bytes", "bool", "uint8", "int8", "int16", "int32", "int64", "uint16",
          "uint32", "uint64"]
HEADROOM = 64


def roundtrip(data, dtype, base=None, profile=None, transform="xor") -> bytes:
    raw = codec.as_bytes(data).tobytes()
    blob = codec.compress(data, dtype, base=base, device="cpu", profile=profile,
                          transform=transform)
    assert len(blob) <= len(raw) + HEADROOM, (dtype, len(raw), len(blob))
    back = codec.decompress(blob, base=base, device="cpu")
    assert isinstance(back, bytes)
    assert back == raw
    return blob


# --- every bit pattern -----------------------------------------------------------------

@pytest.mark.parametrize("name,dtype,data", list(A.exhaustive()), ids=lambda v: str(v)[:24])
def test_every_pattern_of_16_and_8_bit_floats(name, dtype, data):
    roundtrip(data, dtype)
    # shuffled, repeated and as the other 16/8-bit float types too
    rng = np.random.default_rng(1)
    arr = np.frombuffer(data, dtype=np.uint8 if len(data) == 256 else np.uint16)
    mixed = np.concatenate([rng.permutation(arr), np.repeat(arr, 3)]).tobytes()
    roundtrip(mixed, dtype)


@pytest.mark.parametrize("dtype", ["bits8", "float4_e2m1fn_x2", "bool", "int8", "uint8"])
def test_every_byte_pattern_of_other_8_bit_types(dtype):
    roundtrip(np.arange(256, dtype=np.uint8).tobytes(), dtype)


@pytest.mark.parametrize("name,dtype,data", list(A.specials(n_random=1_000_000)),
                         ids=lambda v: str(v)[:24])
def test_specials_and_a_million_random_values(name, dtype, data):
    roundtrip(data, dtype)


def test_nan_payloads_survive_bit_for_bit():
    vals = np.array(A.FLOAT_SPECIALS_32 * 300, dtype=np.uint32)
    blob = roundtrip(vals.tobytes(), "float32")
    back = np.frombuffer(codec.decompress(blob), dtype=np.uint32)
    assert np.array_equal(back, vals)


# --- random bytes, lengths, dtypes ---------------------------------------------------------

@pytest.mark.parametrize("name,dtype,data", list(A.random_bytes()), ids=lambda v: str(v)[:24])
def test_random_bytes(name, dtype, data):
    roundtrip(data, dtype)


@pytest.mark.parametrize("dtype", FLOATS + OTHERS)
def test_random_lengths_under_every_dtype(dtype):
    rng = np.random.default_rng(abs(hash(dtype)) % 2**32)
    for n in [0, 1, 2, 3, 7, 8, 9, 15, 17, 31, 33, *rng.integers(0, 70_000, 6)]:
        roundtrip(rng.bytes(int(n)), dtype)
        roundtrip(bytes(int(n)), dtype)


@pytest.mark.parametrize("layout", _planes.LAYOUTS)
@pytest.mark.parametrize("dtype", FLOATS + ["int64", "bytes"])
def test_every_layout_decodes_on_the_cpu(layout, dtype):
    """Blobs written with any layout (FLOAT is what the GPU path writes) decode here."""
    dt = codec.lookup(dtype)
    if not _planes.fits(dt, layout):
        with pytest.raises(CodecError, match="not defined"):
            codec.compress(b"abcd", dtype, device="cpu", profile=CpuProfile(layout=layout))
        return
    rng = np.random.default_rng(3)
    normal = (rng.standard_normal(5000) * 0.02).astype(np.float32)
    for data in (normal.tobytes(), rng.bytes(4099), np.arange(1 << 16, dtype=np.uint16).tobytes()):
        for profile in (CpuProfile(layout=layout), CpuProfile(layout=layout, entropy="deflate")):
            blob = roundtrip(data, dtype, profile=profile)
            head = C.unpack(blob)
            assert head.layout in (layout, _planes.FLAT)


@pytest.mark.parametrize("dtype", ["float64", "float32", "bfloat16", "float16", "float8_e5m2"])
def test_plane_roles_name_the_planes_the_float_layout_wrote(dtype):
    """``s4fs report``'s per-plane shares: each plane of a FLOAT blob is labelled by what
    the split put in it — float64's 11-bit exponent fills two planes, its 52-bit
    mantissa seven."""
    dt = codec.lookup(dtype)
    words = (np.random.default_rng(5).standard_normal(3001) * 0.02)
    data = torch.from_numpy(words).to(getattr(torch, dtype)).view(torch.uint8).numpy()
    blob = roundtrip(data.tobytes(), dtype, profile=CpuProfile(layout=_planes.FLOAT))
    head = C.unpack(blob)
    assert head.layout == _planes.FLOAT
    want = {"float64": ["sign"] + ["exponent"] * 2 + ["mantissa"] * 7,
            "float32": ["sign", "exponent"] + ["mantissa"] * 3,
            "bfloat16": ["sign", "exponent", "mantissa"],
            "float16": ["sign", "exponent", "mantissa", "mantissa"],
            "float8_e5m2": ["sign", "exponent+mantissa"]}[dtype]
    assert codec.plane_roles(head) == want
    n = len(data) // dt.itemsize
    assert [p.raw_len for p in head.planes] == [(n + 7) // 8] + [n] * (len(want) - 1)


def test_deflate_fallback_matches_the_zstd_path():
    w = (np.random.default_rng(0).standard_normal(1 << 18) * 0.02).astype(np.float32)
    bf = torch.from_numpy(w).bfloat16()
    a = roundtrip(bf, "bfloat16")
    b = roundtrip(bf, "bfloat16", profile=CpuProfile(entropy="deflate"))
    assert {p["codec"] for p in codec.inspect(b).planes} <= {"deflate", "raw", "zstd"}
    assert abs(len(a) - len(b)) < 0.01 * len(a)


# --- deltas ------------------------------------------------------------------------------

@pytest.mark.parametrize("name,dtype,data,base", list(A.delta_cases()), ids=lambda v: str(v)[:24])
def test_delta_round_trip(name, dtype, data, base):
    blob = roundtrip(data, dtype, base=base)
    assert codec.inspect(blob).delta


@pytest.mark.parametrize("name,dtype,data,base", list(A.delta_cases()), ids=lambda v: str(v)[:24])
def test_difference_delta_round_trip(name, dtype, data, base):
    """The other delta transform: the zigzag-coded difference of the words."""
    blob = roundtrip(data, dtype, base=base, transform="diff")
    assert codec.inspect(blob).delta and C.unpack(blob).diff


def test_difference_delta_of_moving_fp32_weights_beats_the_xor():
    """Weights that move a little: their words' difference has more leading zero bits
    than their XOR (no carries spread), so it codes smaller."""
    rng = np.random.default_rng(3)
    w = rng.standard_normal(1 << 18).astype(np.float32) * 0.02
    w2 = (w * (1 + rng.standard_normal(w.size).astype(np.float32) * 1e-3)).astype(np.float32)
    xor = roundtrip(w2, "float32", base=w)
    diff = roundtrip(w2, "float32", base=w, transform="diff")
    assert len(diff) < 0.95 * len(xor)


def test_delta_of_nearby_weights_is_small_and_identical_is_tiny():
    rng = np.random.default_rng(5)
    w = torch.from_numpy(rng.standard_normal(1 << 18).astype(np.float32) * 0.02).bfloat16()
    w2 = w.clone()
    idx = torch.from_numpy(rng.choice(w.numel(), w.numel() // 10, replace=False))
    w2[idx] = (w2[idx].float() * 1.01).bfloat16()
    full = roundtrip(w2, "bfloat16")
    delta = roundtrip(w2, "bfloat16", base=w)
    assert len(delta) < 0.4 * len(full)
    same = roundtrip(w, "bfloat16", base=w)
    assert len(same) < 100


@pytest.mark.parametrize("dtype", ["bfloat16", "float32", "float16", "bytes"])
def test_delta_against_adversarial_bases(dtype):
    rng = np.random.default_rng(7)
    n = 8192
    data = rng.bytes(n)
    for base in (bytes(n), b"\xff" * n, rng.bytes(n), data[::-1],
                 bytes(a ^ 0x80 for a in data), np.arange(n // 2, dtype=np.uint16).tobytes()):
        for transform in ("xor", "diff"):
            roundtrip(data, dtype, base=base, transform=transform)
            roundtrip(base, dtype, base=data, transform=transform)


def test_delta_base_errors():
    data, base = b"a" * 1000, b"b" * 1000
    blob = codec.compress(data, "bytes", base=base, device="cpu")
    with pytest.raises(BaseMismatchError, match="pass the base"):
        codec.decompress(blob)
    with pytest.raises(BaseMismatchError, match="different base"):
        codec.decompress(blob, base=b"c" * 1000)
    with pytest.raises(BaseMismatchError, match="different base"):
        codec.decompress(blob, base=b"b" * 999)
    with pytest.raises(BaseMismatchError, match="not a delta"):
        codec.decompress(codec.compress(data, "bytes"), base=base)
    with pytest.raises(CodecError, match="exactly as long"):
        codec.compress(data, "bytes", base=b"short")



def test_checksums_given_by_the_caller_make_the_same_blob_and_wrong_ones_fail_loudly():
    """A caller that has just hashed the bytes hands the checksums in (the chunk rule
    does): the blob is the one compress makes itself. A wrong checksum never gives wrong
    bytes back: decompress refuses what it restores, or the base, with an error."""
    rng = np.random.default_rng(5)
    data = rng.standard_normal(4096).astype(np.float32).tobytes()
    base = (np.frombuffer(data, np.float32) + 1e-3).astype(np.float32).tobytes()
    sd, sb = codec.checksum(data), codec.checksum(base)
    assert codec.compress(data, "float32", device="cpu", checksum=sd) == \
        codec.compress(data, "float32", device="cpu")
    assert codec.compress(data, "float32", base=base, device="cpu", checksum=sd,
                          base_checksum=sb) == \
        codec.compress(data, "float32", base=base, device="cpu")
    with pytest.raises(ChecksumError):
        codec.decompress(codec.compress(data, "float32", device="cpu", checksum=sd ^ 1))
    with pytest.raises(BaseMismatchError, match="different base"):
        codec.decompress(codec.compress(data, "float32", base=base, device="cpu",
                                        base_checksum=sb ^ 1), base=base)


# --- property tests ------------------------------------------------------------------------

DTYPES = st.sampled_from(FLOATS + OTHERS)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.binary(max_size=6000), dtype=DTYPES)
def test_property_round_trip(data, dtype):
    roundtrip(data, dtype)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(pair=st.integers(0, 5000).flatmap(
    lambda n: st.tuples(st.binary(min_size=n, max_size=n), st.binary(min_size=n, max_size=n))),
    dtype=DTYPES)
def test_property_round_trip_with_base(pair, dtype):
    data, base = pair
    roundtrip(data, dtype, base=base)
    roundtrip(data, dtype, base=base, transform="diff")


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(values=st.lists(st.floats(allow_nan=True, allow_infinity=True, width=32), max_size=3000),
       zeros=st.integers(0, 3000), dtype=st.sampled_from(["float32", "bfloat16", "float16"]))
def test_property_floats_with_zero_runs(values, zeros, dtype):
    t = torch.tensor(values + [0.0] * zeros + values, dtype=torch.float32)
    roundtrip(t.to(getattr(torch, dtype)), dtype)


# --- inputs --------------------------------------------------------------------------------

@pytest.mark.parametrize("tdtype", [torch.float32, torch.bfloat16, torch.float16, torch.float64,
                                    torch.float8_e4m3fn, torch.float8_e5m2, torch.int64,
                                    torch.bool, torch.complex64, torch.uint8])
def test_torch_tensor_inputs(tdtype):
    t = (torch.randn(33, 17, generator=torch.Generator().manual_seed(0)) * 3)
    t = t.to(tdtype) if not tdtype.is_complex else torch.complex(t, -t).to(tdtype)
    name = str(tdtype).replace("torch.", "")
    raw = t.contiguous().view(torch.uint8).numpy().tobytes() if t.element_size() else b""
    blob = codec.compress(t, name, device="cpu")
    assert codec.decompress(blob) == raw
    # a non-contiguous view and a tensor that requires grad
    view = t.t()
    assert codec.decompress(codec.compress(view, name, device="cpu")) == \
        view.contiguous().view(torch.uint8).numpy().tobytes()
    if tdtype.is_floating_point:
        g = t.float().requires_grad_()
        assert codec.decompress(codec.compress(g, "float32", device="cpu")) == \
            g.detach().numpy().tobytes()
    scalar = t.reshape(-1)[:1].reshape(())           # a 0-d tensor
    assert codec.decompress(codec.compress(scalar, name, device="cpu")) == \
        scalar.reshape(1).view(torch.uint8).numpy().tobytes()


def test_numpy_and_bytes_like_inputs():
    a = np.random.default_rng(0).standard_normal((64, 33)).astype(np.float32)
    raw = a.tobytes()
    for x in (a, a.T.copy().T, raw, bytearray(raw), memoryview(raw)):
        assert codec.decompress(codec.compress(x, "float32", device="cpu")) == \
            np.ascontiguousarray(x).tobytes() if isinstance(x, np.ndarray) else raw
    strided = a[:, ::2]
    assert codec.decompress(codec.compress(strided, "float32", device="cpu")) == \
        np.ascontiguousarray(strided).tobytes()
    assert codec.decompress(codec.compress(np.float16(1.0), "float16", device="cpu")) == \
        np.float16(1.0).tobytes()


def test_dtype_names_and_errors():
    assert codec.lookup(torch.bfloat16).name == "bfloat16"
    assert codec.lookup("torch.float").name == "float32"
    with pytest.raises(CodecError, match="unknown dtype"):
        codec.compress(b"x", "float13")
    with pytest.raises(CodecError, match="device must be"):
        codec.compress(b"x", "bytes", device="tpu")


# --- sizes --------------------------------------------------------------------------------

def test_constant_planes_cost_a_few_bytes():
    assert len(roundtrip(bytes(4 << 20), "float32")) < 64
    ones = torch.ones(1 << 20, dtype=torch.float32)
    assert len(roundtrip(ones, "float32")) < 64
    # the sign of Adam's exp_avg_sq is all zeros: in the CPU layout it rides in the
    # mantissa byte and costs nothing; in the GPU layout (FLOAT) it is a constant plane
    rng = np.random.default_rng(0)
    sq = (rng.standard_normal(1 << 18).astype(np.float32) * 1e-3) ** 2
    signed = sq * np.where(rng.random(sq.size) < 0.5, -1, 1).astype(np.float32)
    pos, neg = len(roundtrip(sq, "float32")), len(roundtrip(signed, "float32"))
    assert neg - pos > 0.95 * sq.size / 8
    flt = roundtrip(sq, "float32", profile=CpuProfile(layout=_planes.FLOAT))
    assert codec.inspect(flt).planes[0]["codec"] == "const"


def test_zero_runs_of_optimizer_state_are_nearly_free():
    rng = np.random.default_rng(2)
    rows = rng.standard_normal((2048, 384)).astype(np.float32) * 1e-4
    rows[rng.random(2048) < 0.6] = 0            # untouched embedding rows
    blob = roundtrip(rows, "float32")
    nonzero_bytes = np.count_nonzero(rows.any(axis=1)) * 384 * 4
    assert len(blob) < 0.85 * nonzero_bytes


def test_incompressible_input_is_stored_raw_within_the_bound():
    data = np.random.default_rng(9).bytes(1 << 20)
    for dtype in ("bytes", "float32", "bfloat16", "float16", "int64"):
        blob = roundtrip(data, dtype)
        assert len(blob) <= len(data) + 32


def test_exponent_plane_reaches_its_order0_entropy():
    """Literal-only coding of an exponent plane: within 3 % of its order-0 entropy
    (zstd's own matching loses 5-10 % there)."""
    if not _zstd_seq.available():
        pytest.skip("python-zstandard's sequence API (cffi backend) is not available")
    normal = np.random.default_rng(4).standard_normal(1 << 20).astype(np.float32)
    w = torch.from_numpy(normal * 0.02)
    e = (w.bfloat16().view(torch.int16).numpy().view(np.uint16) >> 7).astype(np.uint8)
    counts = np.bincount(e, minlength=256)
    p = counts[counts > 0] / e.size
    bound = -(p * np.log2(p)).sum() * e.size / 8
    frame = _zstd_seq.encode(e)
    assert len(frame) < 1.03 * bound
    import zstandard
    assert zstandard.ZstdDecompressor().decompress(frame, max_output_size=e.size) == e.tobytes()


# --- corruption ---------------------------------------------------------------------------

def _small_blobs():
    rng = np.random.default_rng(11)
    w = (rng.standard_normal(300) * 0.05).astype(np.float32)
    w[100:200] = 0
    yield "fp32", codec.compress(w, "float32", device="cpu"), None, w.tobytes()
    bf = torch.from_numpy(w).bfloat16()
    yield "bf16", codec.compress(bf, "bfloat16", device="cpu"), None, \
        bf.view(torch.uint8).numpy().tobytes()
    base = (w + 0.001).astype(np.float32).tobytes()
    yield "fp32 delta", codec.compress(w, "float32", base=base, device="cpu"), base, w.tobytes()
    yield "fp32 diff", codec.compress(w, "float32", base=base, device="cpu",
                                      transform="diff"), base, w.tobytes()
    raw = rng.bytes(200)
    yield "raw", codec.compress(raw, "bytes", device="cpu"), None, raw
    yield "deflate", codec.compress(bf, "bfloat16", device="cpu",
                                    profile=CpuProfile(entropy="deflate")), None, \
        bf.view(torch.uint8).numpy().tobytes()


@pytest.mark.parametrize("name,blob,base,raw", list(_small_blobs()), ids=lambda v: str(v)[:12])
def test_every_flipped_byte_is_an_error_or_harmless(name, blob, base, raw):
    assert codec.decompress(blob, base=base) == raw
    header_end = C.unpack(blob).payload_offset
    harmless = []
    for pos in range(len(blob)):
        for flip in (0x01, 0x80, 0xFF):
            bad = bytearray(blob)
            bad[pos] ^= flip
            try:
                out = codec.decompress(bytes(bad), base=base, device="cpu")
            except CodecError as exc:
                assert str(exc)
                continue
            assert out == raw, f"flip 0x{flip:02x} at {pos} returned wrong bytes"
            harmless.append(pos)
    # in the header only the minor version (and, for a flat blob, the dtype, which then
    # only names the bytes) may change without an error; inside a zstd frame a few
    # descriptor bits are ignored by every zstd decoder
    assert {p for p in harmless if p < header_end} <= {5, 6}


@pytest.mark.parametrize("name,blob,base,raw", list(_small_blobs()), ids=lambda v: str(v)[:12])
def test_every_truncation_is_a_format_error(name, blob, base, raw):
    for n in range(len(blob)):
        with pytest.raises(FormatError):
            codec.decompress(blob[:n], base=base)
    with pytest.raises(FormatError, match="extra bytes"):
        codec.decompress(blob + b"\0", base=base)


def test_wrong_magic_future_versions_and_unknown_codecs():
    blob = bytearray(codec.compress(np.ones(1000, np.float32) * 3.3, "float32", device="cpu"))
    with pytest.raises(FormatError, match="magic"):
        codec.decompress(b"PK\x03\x04" + bytes(blob[4:]))
    with pytest.raises(FormatError, match="magic"):
        codec.decompress(b"XY")
    with pytest.raises(FormatError, match="truncated"):
        codec.decompress(b"S4")
    future = bytearray(blob)
    future[4] = C.MAJOR + 1
    with pytest.raises(UnsupportedVersionError, match="upgrade s4fs"):
        codec.decompress(bytes(future))
    newer_minor = bytearray(blob)
    newer_minor[5] = 200                       # minor additions are readable
    assert codec.decompress(bytes(newer_minor)) == codec.decompress(bytes(blob))
    flags = bytearray(blob)
    flags[7] |= 0x40
    with pytest.raises(UnsupportedVersionError, match="flags"):
        codec.decompress(bytes(flags))
    layout = bytearray(blob)
    layout[8] = 99
    with pytest.raises(UnsupportedVersionError, match="layout"):
        codec.decompress(bytes(layout))
    dcode = bytearray(blob)
    dcode[6] = 250
    with pytest.raises(UnsupportedVersionError, match="dtype code"):
        codec.decompress(bytes(dcode))
    head = C.unpack(bytes(blob))
    first_plane = C._FIXED.size + len(C._varint(head.raw_len))
    unknown = bytearray(blob)
    unknown[first_plane] = 200
    with pytest.raises(UnsupportedVersionError, match="codec id 200"):
        codec.decompress(bytes(unknown))
    major = bytearray(blob)
    major[first_plane + 1] = 9
    with pytest.raises(UnsupportedVersionError, match="v9"):
        codec.decompress(bytes(major))


def test_checksum_mismatch_is_a_checksum_error():
    data = np.random.default_rng(1).standard_normal(4096).astype(np.float32).tobytes()
    blob = bytearray(codec.compress(data, "float32", device="cpu"))
    blob[10] ^= 1                               # the recorded checksum itself
    with pytest.raises(ChecksumError, match="corrupt"):
        codec.decompress(bytes(blob))
    raw = bytearray(codec.compress(np.random.default_rng(2).bytes(500), "bytes"))
    raw[-1] ^= 0x10                             # a raw payload byte
    with pytest.raises(ChecksumError, match="never returns bytes it cannot verify"):
        codec.decompress(bytes(raw))


def test_plane_sizes_that_do_not_fit_the_layout_are_refused():
    rows = [(P.RAW, 1, 10, b"x" * 10)]
    blob = C.pack(codec.lookup("float32").code, 0, _planes.FLOAT_SM, 0, None, 10, rows)
    with pytest.raises(FormatError, match="do not fit"):
        codec.decompress(blob)


def test_inspect_describes_planes():
    w = torch.randn(1 << 16).bfloat16()
    info = codec.inspect(codec.compress(w, "bfloat16", device="cpu"))
    assert info.dtype == "bfloat16" and info.raw_len == 2 << 16 and not info.delta
    assert [p["raw"] for p in info.planes] == [1 << 16, 1 << 16]
    assert info.planes[0]["stored"] < 0.45 * (1 << 16)


def test_plane_codec_configs_round_trip_through_json():
    import json
    for c in (P.Zstd(3), P.Deflate("rle"), P.Raw(), P.Const()):
        cfg = json.loads(json.dumps(c.get_config()))
        again = type(c).from_config(cfg)
        assert again.get_config() == c.get_config()
    with pytest.raises(ValueError):
        P.Deflate("lz77")


# --- real data -----------------------------------------------------------------------------

@pytest.fixture(scope="module")
def minilm_weights():
    import _minilm as minilm
    return minilm.load_weights()


def test_real_weights_round_trip_and_compress(minilm_weights):
    w = minilm_weights["embeddings.word_embeddings.weight"][:4000]
    sizes = {}
    for name, dt in (("float32", torch.float32), ("bfloat16", torch.bfloat16),
                     ("float16", torch.float16)):
        t = w.to(dt)
        sizes[name] = len(roundtrip(t, name)) / (t.numel() * t.element_size())
    assert sizes["bfloat16"] < 0.675
    assert sizes["float32"] < 0.835
    assert sizes["float16"] < 0.86
    pos = minilm_weights["embeddings.position_ids"]
    assert len(roundtrip(pos, "int64")) < 0.1 * pos.numel() * 8


def test_struct_layout_of_the_fixed_header_is_stable():
    """Other code already writes these fields: never move one."""
    assert C._FIXED.format == "<4sBBBBBBQ"
    assert (C.MAGIC, C.MAJOR, C.FLAG_DELTA) == (b"S4CK", 1, 1)
    assert (P.RAW, P.CONST, P.ZSTD, P.DEFLATE) == (0, 1, 2, 3)
    assert (P.NVCOMP_ANS, P.NVCOMP_GDEFLATE, P.NVCOMP_DEFLATE) == (16, 17, 18)
    assert (_planes.FLAT, _planes.FLOAT, _planes.BYTES, _planes.FLOAT_SM,
            _planes.SIGN_BYTES) == (0, 1, 2, 3, 4)
    assert struct.calcsize(C._FIXED.format) == 18
    codes = {n: codec.lookup(n).code for n in ("bytes", "float32", "bfloat16", "float16",
                                                "float8_e4m3fn", "int64", "bool")}
    assert codes == {"bytes": 0, "float32": 1, "bfloat16": 4, "float16": 3,
                     "float8_e4m3fn": 5, "int64": 27, "bool": 20}


@pytest.mark.skipif(not _zstd_seq.available(), reason="python-zstandard's cffi backend is missing")
@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(n=st.integers(1, 300_000), seed=st.integers(0, 2**32 - 1),
       runs=st.lists(st.tuples(st.integers(0, 299_999), st.integers(1, 200_000)), max_size=12))
@example(n=65564, seed=0, runs=[(65532, 32)])        # a run cut to 4 bytes at a block edge
def test_hand_built_zstd_frames_decode_exactly(n, seed, runs):
    """Literal-only and zero-run frames: runs at the edges, across 64 KiB block edges,
    shorter than MIN_RUN, covering everything."""
    import zstandard
    arr = np.random.default_rng(seed).integers(0, 5, n).astype(np.uint8)
    for start, length in runs:
        arr[start: start + length] = 0
    for with_runs in (False, True):
        frame = _zstd_seq.encode(arr, runs=with_runs)
        assert zstandard.ZstdDecompressor().decompress(frame, max_output_size=n) == arr.tobytes()


def test_without_zstd_sequences_the_codec_probes_once_and_falls_back_exactly(monkeypatch):
    """No cffi (python-zstandard without its cffi backend): the codec codes those planes
    with deflate, every byte comes back, and the failed import is tried once, not for
    every plane (each retry searched sys.path and loaded the extension again)."""
    tries = []

    def broken():
        tries.append(1)
        raise ImportError("no _cffi_backend")

    monkeypatch.setattr(_zstd_seq, "_api", broken)
    _zstd_seq.available.cache_clear()
    try:
        rng = np.random.default_rng(11)
        for k in range(6):
            data = (rng.standard_normal(3000 + k) * 0.02).astype(np.float32).tobytes()
            blob = codec.compress(data, "float32", device="cpu")
            assert codec.decompress(blob) == data
            ids = {p.codec_id for p in C.unpack(blob).planes}
            assert P.DEFLATE in ids            # the exponent plane's order-0 coder
        assert len(tries) == 1
    finally:
        monkeypatch.undo()
        _zstd_seq.available.cache_clear()


def test_minilm_tokenizer_model_and_finetune_are_real_and_deterministic():
    import _minilm as minilm
    tok = minilm.WordPiece()
    assert tok.encode("Hello, world! Unaffable.") == \
        [7592, 1010, 2088, 999, 14477, 20961, 3468, 1012]
    model = minilm.load_model().eval()
    with torch.no_grad():
        emb = model(minilm._batch([[tok.cls, *tok.encode(s), tok.sep] for s in
                                   ("a man is eating food", "a man eats a meal",
                                    "the market fell today")]))
    assert float(emb[0] @ emb[1]) > float(emb[0] @ emb[2]) + 0.3
    runs = [list(minilm.finetune(2, seed=3, freeze=("encoder.layer.0.",)))[-1] for _ in range(2)]
    (step, ms, opt), (_, ms2, opt2) = runs
    assert step == 2 and all(torch.equal(ms[k], ms2[k]) for k in ms)
    w0 = minilm.load_weights()
    assert all(torch.equal(w0[k], ms[k]) for k in w0 if k.startswith("encoder.layer.0."))
    assert not torch.equal(w0["encoder.layer.1.output.dense.weight"],
                           ms["encoder.layer.1.output.dense.weight"])
    adam = minilm.adam_state(opt)
    ea = torch.cat([t.reshape(-1) for t in adam["exp_avg"].values()])
    assert 0.3 < float((ea == 0).float().mean()) < 0.7      # untouched embedding rows
    blob = roundtrip(ea, "float32")
    assert len(blob) < 0.55 * ea.numel() * 4
