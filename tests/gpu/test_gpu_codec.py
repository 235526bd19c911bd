"""GPU codec tests.

* ``gpu``-marked tests run on a CUDA machine with CuPy and nvCOMP (skipped elsewhere,
  with the reason): every adversarial set GPU→GPU for every profile, CPU→GPU,
  GPU(portable)→CPU, golden fixtures, corruption, device inputs and outputs.
* The rest run anywhere: golden GPU blobs on a CPU-only machine, ``device="cuda"``
  without a GPU, imports that must not load CuPy, and the whole GPU pipeline on the
  CPU emulation of its kernels (needs g++), which checks every kernel bit for bit
  against ``_planes`` and ``xxhash``.

Golden fixtures (tests/fixtures/gpu/) were written once on an H200 with
``S4FS_WRITE_GPU_FIXTURES=1 pytest tests/gpu/test_gpu_codec.py -k write_golden`` and are never
regenerated: every later version must still read them.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import subprocess
import sys

import numpy as np
import pytest
import xxhash

from s4fs.codec import (CodecError, CodecUnavailableError, FormatError,
                        as_bytes, compress, decompress, gpu_available, inspect)
from s4fs.codec import _container as C
from s4fs.codec import _plane_codecs as P
from s4fs.codec import _planes
from s4fs.codec._dtypes import lookup
from s4fs.errors import BaseMismatchError, UnsupportedVersionError
from s4fs.testing import adversarial as A

FIXTURES = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                        "fixtures", "gpu")
MANIFEST = os.path.join(FIXTURES, "manifest.json")
# nvcomp-deflate / nvcomp-gdeflate blobs written by the CPU twins (zlib, nvCOMP's CPU
# library): the same bitstreams the GPU writes and reads (test_codec_twins_decode_each_other)
TWINS = os.path.join(FIXTURES, "twins")
ZERO_BLOCKS = os.path.join(FIXTURES, "zero-blocks")     # container minor 2, written on a GPU
gpu = pytest.mark.gpu


def _cases(n_random: int = 200_000):
    out = [(name, dt, data, None) for name, dt, data in A.all_cases(n_random=n_random)]
    return out + list(A.delta_cases())


def _manifest() -> dict:
    if not os.path.exists(MANIFEST):
        pytest.skip("golden GPU fixtures are not written yet (they are made once on a GPU)")
    with open(MANIFEST) as fh:
        return json.load(fh)


def _fixture(name: str, entry: dict, folder: str = FIXTURES):
    with open(os.path.join(folder, name + ".s4"), "rb") as fh:
        blob = fh.read()
    base = None
    if entry.get("base"):
        with open(os.path.join(folder, entry["base"]), "rb") as fh:
            base = fh.read()
    return blob, base


def _twins() -> dict:
    with open(os.path.join(TWINS, "manifest.json")) as fh:
        return json.load(fh)


def _synthetic_ans_blob() -> bytes:
    """A well-formed blob whose exponent plane claims nvCOMP ANS (payload not decodable:
    a CPU must refuse it before looking at the chunk)."""
    from s4fs.codec import _nvcomp_payload as _payload
    data = np.arange(1 << 12, dtype=np.uint16).tobytes()
    dt = lookup("bfloat16")
    planes = _planes.split(memoryview(data), dt, _planes.FLOAT)
    coded = [(P.RAW, 1, len(bytes(p)), bytes(p)) for p in planes]
    fake = _payload.pack_header((6, 0, 0), 0, 1 << 16, [5]) + b"\0" * 5
    coded[1] = (P.NVCOMP_ANS, 1, coded[1][2], fake)
    return C.pack(dt.code, 0, _planes.FLOAT, xxhash.xxh3_64_intdigest(data), None, len(data), coded)


# --------------------------------------------------------------------------- anywhere

def test_import_loads_no_gpu_library():
    code = ("import sys, s4fs, s4fs.codec, s4fs.codec.gpu; "
            "bad = [m for m in sys.modules if m.split('.')[0] == 'cupy' or "
            "m.startswith('nvidia.nvcomp')]; print(bad); sys.exit(1 if bad else 0)")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr


@pytest.mark.skipif(gpu_available(), reason="a GPU is present here")
def test_device_cuda_without_gpu_fails_clearly():
    with pytest.raises(CodecUnavailableError) as exc:
        compress(b"\0" * 1024, "bfloat16", device="cuda")
    msg = str(exc.value)
    assert "device='cuda' needs a CUDA GPU" in msg and "pip install" in msg
    blob = compress(b"\1" * 4096, "bfloat16", device="cpu")
    with pytest.raises(CodecUnavailableError):
        decompress(blob, device="cuda")
    assert decompress(blob, device="auto") == b"\1" * 4096


@pytest.mark.skipif(gpu_available(), reason="a GPU is present here")
def test_ans_blob_on_a_cpu_only_machine_says_what_is_needed():
    blob = _synthetic_ans_blob()
    assert "nvcomp-ans" in {p["codec"] for p in inspect(blob).planes}
    for device in ("auto", "cpu"):
        with pytest.raises(CodecUnavailableError) as exc:
            decompress(blob, device=device)
        msg = str(exc.value)
        assert "nvCOMP ANS" in msg and "GPU" in msg and "pip install" in msg


def test_twin_fixtures_decode_on_the_cpu():
    """Golden nvcomp-deflate blobs (and nvcomp-gdeflate where nvCOMP's CPU library is
    installed) decode on any CPU; GDeflate without it says what to install."""
    from s4fs.codec import _nvcomp_twins as _codecs
    manifest = _twins()
    assert manifest
    for name, entry in manifest.items():
        blob, base = _fixture(name, entry, TWINS)
        info = inspect(blob)
        assert info.dtype == entry["dtype"] and info.raw_len == entry["raw_len"], name
        assert sorted({p["codec"] for p in info.planes}) == entry["codecs"], name
        if "nvcomp-gdeflate" in entry["codecs"] and _codecs.cpu_gdeflate() is None:
            with pytest.raises(CodecUnavailableError, match="GDeflate"):
                decompress(blob, base=base, device="cpu")
            continue
        out = decompress(blob, base=base, device="cpu")
        assert hashlib.sha256(out).hexdigest() == entry["sha256"], name


@pytest.mark.skipif(gpu_available(), reason="a GPU is present here")
def test_golden_gpu_blobs_on_a_cpu_only_machine():
    from s4fs.codec import _nvcomp_twins as _codecs
    manifest = _manifest()
    seen_ans = 0
    for name, entry in manifest.items():
        blob, base = _fixture(name, entry)
        codecs = {p["codec"] for p in inspect(blob).planes}
        if "nvcomp-ans" in codecs:
            seen_ans += 1
            with pytest.raises(CodecUnavailableError) as exc:
                decompress(blob, base=base)
            msg = str(exc.value)
            assert "nvCOMP ANS" in msg and "GPU" in msg and "pip install" in msg
        elif "nvcomp-gdeflate" in codecs and _codecs.cpu_gdeflate() is None:
            with pytest.raises(CodecUnavailableError, match="GDeflate"):
                decompress(blob, base=base)
        else:      # portable blobs (and GDeflate with nvCOMP's CPU library) decode here
            out = decompress(blob, base=base)
            assert hashlib.sha256(out).hexdigest() == entry["sha256"], name
    assert seen_ans


def test_golden_fixtures_are_what_they_claim():
    manifest = _manifest()
    for name, entry in manifest.items():
        blob, _ = _fixture(name, entry)
        info = inspect(blob)
        assert info.dtype == entry["dtype"] and info.raw_len == entry["raw_len"], name
        assert sorted({p["codec"] for p in info.planes}) == sorted(entry["codecs"]), name
        for p in info.planes:
            if p["codec"].startswith("nvcomp"):
                assert p["major"] == 1


def test_profile_config_round_trips():
    from s4fs.codec.gpu import PROFILES, GpuProfile
    assert set(PROFILES) == {"default", "float", "gdeflate-mantissa", "portable", "zero-runs"}
    for p in PROFILES.values():
        assert GpuProfile.from_config(json.loads(json.dumps(p.get_config()))) == p
    with pytest.raises(ValueError):
        GpuProfile(exponent="lz4")
    assert PROFILES["portable"].portable and not PROFILES["default"].portable


def test_ans_version_is_refused_across_majors():
    from s4fs.codec import _nvcomp_twins as _codecs
    _codecs.check_ans_version((6, 0, 0), (6, 1, 2))
    with pytest.raises(CodecUnavailableError, match="nvCOMP ANS 5.0.1.*6.0.0.*5.x"):
        _codecs.check_ans_version((5, 0, 1), (6, 0, 0))


def test_deflate_twin_and_payload_checks():
    """The CPU twin of nvcomp-deflate writes what zlib (and nvCOMP) reads."""
    from s4fs.codec import _nvcomp_payload as _payload
    from s4fs.codec import _nvcomp_twins as _codecs
    rng = np.random.default_rng(3)
    plane = (rng.standard_normal(300_000) * 4).astype(np.int8).view(np.uint8).tobytes()
    codec = _codecs.NvcompDeflate()
    enc = codec.encode(plane)
    assert enc is not None and len(enc) < len(plane)
    assert codec.decode(enc, len(plane)) == plane
    head = _payload.parse(enc, len(plane), "nvcomp-deflate")
    assert head.nchunks == -(-len(plane) // codec.chunk) and head.version == (0, 0, 0)
    bad = bytearray(enc)
    bad[_payload.FIXED_SIZE] ^= 1                       # chunk table no longer adds up
    with pytest.raises(FormatError):
        codec.decode(bytes(bad), len(plane))
    with pytest.raises(FormatError):
        codec.decode(enc[:5], len(plane))


# --------------------------------------------------------------------------- emulation

def _emulated():
    from s4fs.codec.gpu import _emulate
    if _emulate.compiler() is None:
        pytest.skip("no C++ compiler to emulate the GPU kernels")
    from s4fs.codec.gpu._backend import EmulatedBackend
    return EmulatedBackend()


@pytest.fixture(scope="module")
def emu():
    return _emulated()


def test_emulated_xxh3_matches_xxhash(emu):
    from s4fs.codec.gpu import _common
    rng = np.random.default_rng(0)
    lens = list(range(0, 260)) + [1023, 1024, 1025, 1088, 2049, 65536 + 17, 1 << 20]
    bufs = [emu.empty(n) for n in lens]
    for buf, n in zip(bufs, lens):
        buf[:n] = rng.integers(0, 256, n, dtype=np.uint8)
    keep: list = []
    d = _common.hash_buffers(emu, [emu.ptr(x) for x in bufs], lens, keep)
    got = np.frombuffer(d[: 8 * len(lens)].tobytes(), dtype=np.uint64)
    want = [xxhash.xxh3_64_intdigest(x[:n].tobytes()) for x, n in zip(bufs, lens)]
    assert [int(g) for g in got] == want


def test_emulated_entropy_estimates_match_the_host_formula(emu):
    """The device's per-plane entropy and zero share are the order-0 figures of the same
    sampled histogram (the codec choice rests on them)."""
    from s4fs.codec.gpu import _common
    rng = np.random.default_rng(1)
    planes = [np.zeros(5000, np.uint8), np.full(3000, 7, np.uint8),
              rng.integers(0, 256, 200_000, dtype=np.uint8),
              (rng.standard_normal(70_000) * 3).astype(np.int8).view(np.uint8),
              rng.integers(0, 2, 1, dtype=np.uint8), np.zeros(0, np.uint8)]
    bufs = [emu.empty(len(x)) for x in planes]
    for buf, x in zip(bufs, planes):
        buf[: len(x)] = x
    keep: list = []
    est = _common.sample_entropy(emu, [emu.ptr(x) for x in bufs], [len(x) for x in planes],
                                 keep)
    got = np.frombuffer(est[: 16 * len(planes)].tobytes(), dtype=np.float64).reshape(-1, 2)
    # the sample: every step-th byte, step odd and about len / SAMPLES
    rows = np.array([np.bincount(x[:: max(1, len(x) // _common.SAMPLES) | 1], minlength=256)
                     for x in planes], dtype=np.uint32)
    np.testing.assert_allclose(got[:, 0], _common.entropy_bits(rows), atol=1e-9)
    np.testing.assert_allclose(got[:, 1], rows[:, 0] / np.maximum(rows.sum(axis=1), 1))
    assert got[0].tolist() == [0.0, 1.0] and got[1, 0] == 0.0 and 7.9 < got[2, 0] <= 8.0
    assert got[5].tolist() == [0.0, 0.0]


def test_device_inputs_are_told_from_host_ones_by_resolves_rule():
    """The decoder sends a blob to the device path exactly when ``resolve`` would take it
    as a device input: CUDA-array-interface objects yes; bytes, NumPy arrays and CPU
    tensors no."""
    import torch
    from s4fs.codec.gpu import _common

    class FakeDeviceArray:
        __cuda_array_interface__ = property(lambda self: {})

    blobs = [b"x", np.zeros(3, np.uint8), FakeDeviceArray(), torch.zeros(2), bytearray(2),
             FakeDeviceArray(), memoryview(b"yz")]
    assert _common.device_indices(blobs) == [2, 5]


def test_plan_shapes_the_same_through_its_fast_and_general_keys():
    """A plan has one template per chunk shape, numbered in order of first use; a batch
    with a shape too large for the one-integer key (a length of 2**41 bytes) takes the
    general path and must plan every chunk as it would be planned alone."""
    from s4fs.codec.gpu import _common
    from s4fs.codec.gpu._profiles import DEFAULT
    names = ["bfloat16", "float32", "bfloat16", "uint8", "float32", "bfloat16"]
    lens = [4096, 1000, 4096, 77, 1000, 2048]
    dts = [lookup(n) for n in names]
    lays = [_common.gpu_layout(d, DEFAULT) for d in dts]
    for extra in ([], [1 << 41]):
        ds, ls, ns = dts + [lookup("bfloat16")] * len(extra), lays + [lays[0]] * len(extra), \
            lens + extra
        pl = _common.Plan(ds, ls, ns, DEFAULT)
        for i, (d, lay, n) in enumerate(zip(ds, ls, ns)):
            one = _common.Plan([d], [lay], [n], DEFAULT)
            rows = slice(int(pl.p0[i]), int(pl.p0[i] + pl.np[i]))
            assert pl.raw[rows].tolist() == one.raw.tolist() and sum(one.raw) >= n
            assert pl.role[rows].tolist() == one.role.tolist()
            assert [pl.specs[k] if k >= 0 else None for k in pl.spec[rows]] == \
                [one.specs[k] if k >= 0 else None for k in one.spec]
            assert pl.variants[pl.var[i]] == one.variants[one.var[0]]
        # the same shapes share their plan rows; first use decides the numbering
        assert pl.var[0] == pl.var[2] and pl.n[0] == pl.n[2]
        assert pl.variants[0] == _common.Plan([dts[0]], [lays[0]], [4096], DEFAULT).variants[0]


def test_plane_specs_group_planes_by_configuration_on_both_key_paths():
    """The decoder groups coded planes by (codec, option, chunk size) from their payload
    tables: one configuration per distinct triple, each plane pointing at its own, also
    when a value is out of the one-integer key's range (the general path)."""
    from s4fs.codec.gpu import _decode
    from s4fs.codec.gpu._common import CODEC_NAMES
    ans, gd = P.NVCOMP_ANS, P.NVCOMP_GDEFLATE
    cq = np.array([0, 2, 3, 5, 6])
    cid = np.array([ans, 0, ans, gd, 0, gd, ans])
    for big in (1 << 17, 1 << 33):
        option = np.array([0, 0, 1, 1, 0])
        chunk = np.array([65536, 65536, 65536, big, 65536])
        spec, specs, count = _decode._plane_specs(7, cq, cid, option, chunk,
                                                  np.array([3, 1, 4, 1, 5]))
        assert spec.tolist()[1] == spec.tolist()[4] == -1
        got = [(s.name, s.level, s.chunk) for s in (specs[k] for k in spec[cq])]
        want = [(CODEC_NAMES[c], o, ch) for c, o, ch in
                zip(cid[cq].tolist(), option.tolist(), chunk.tolist())]
        assert got == want and len(specs) == len(set(want)) == 3
        assert spec[0] == spec[6] and count.tolist() == [3, 0, 1, 4, 0, 1, 5]


def test_row_launches_cover_every_row_once_at_its_width():
    """Kernels with one row per grid y are launched over rows of similar width: every
    row exactly once, in a launch at least as wide as it and at most twice as wide (a
    launch of one 4 MiB chunk's width over thousands of small tensors' rows ran
    millions of idle blocks)."""
    from s4fs.codec.gpu._backend import MAX_GRID_Y, row_launches
    rng = np.random.default_rng(5)
    width = np.concatenate([rng.integers(0, 3, 70_000), rng.integers(1, 5000, 3000),
                            [4096, 1, 0, 16384]])
    rng.shuffle(width)
    order, launches = row_launches(width)
    assert sorted(order.tolist()) == list(range(len(width)))
    seen = 0
    for lo, hi, x in launches:
        assert lo == seen and 0 < hi - lo <= MAX_GRID_Y
        seen = hi
        w = width[order[lo:hi]]
        assert w.max() == x
        assert (w == 0).all() if x == 0 else (w.min() > 0 and x < 2 * w.min())
    assert seen == len(width)
    assert row_launches([])[1] == []


def test_emulated_one_big_chunk_among_many_small_ones_round_trips(emu):
    """A checkpoint's tensors as s4fs cuts them: thousands of small storages (biases,
    norms, odd sizes) beside a few 1 MiB chunks, of several dtypes, in one batch; every
    byte comes back and the container checksums are the data's."""
    from s4fs.codec.gpu import _decode, _encode
    rng = np.random.default_rng(6)
    items = []
    for k in range(3000):
        dt = ("bfloat16", "float32", "float16", "uint8")[k % 4]
        unit = {"bfloat16": 2, "float32": 4, "float16": 2, "uint8": 1}[dt]
        n = int(rng.integers(0, 400)) * unit if k % 500 else (1 << 20)
        items.append(((rng.standard_normal(n // 4 + 1).astype(np.float32).view(np.uint8)[:n]
                       if k % 3 else rng.integers(0, 256, n, dtype=np.uint8)).tobytes(), dt))
    blobs = _encode.compress_many(items, backend=emu)
    outs = _decode.decompress_many(blobs, backend=emu)
    for (data, _), blob, out in zip(items, blobs, outs):
        assert out == data
        assert C.unpack(blob).checksum == xxhash.xxh3_64_intdigest(data)


@pytest.mark.parametrize("profile", ["default", "float", "portable", "gdeflate-mantissa",
                                     "zero-runs"])
def test_emulated_pipeline_round_trips_every_adversarial_set(emu, profile):
    from s4fs.codec.gpu import PROFILES, _decode, _encode
    prof = PROFILES[profile]
    cases = _cases(20_000)
    blobs = _encode.compress_many([(x, d, b) for _, d, x, b in cases], profile=prof, backend=emu)
    outs = _decode.decompress_many(blobs, [b for *_, b in cases], backend=emu)
    for (name, _, data, _), blob, out in zip(cases, blobs, outs):
        assert out == data, name
        assert len(blob) <= len(data) + 64, name
        C.unpack(blob)
    if prof.portable:          # every plane is raw, const or deflate: any CPU reads it
        for (name, _, data, base), blob in zip(cases, blobs):
            assert decompress(blob, base=base, device="cpu") == data, name


def test_emulated_zero_runs_take_gdeflate_and_round_trip(emu):
    """Optimizer state with many zeros (short runs, so no whole zero block): under
    ``zero-runs`` the zero-heavy planes are GDeflate-coded (LZ), the others keep ANS, and
    every byte comes back."""
    from s4fs.codec.gpu import PROFILES, _decode, _encode
    rng = np.random.default_rng(11)
    sq = (rng.standard_normal(200_000).astype(np.float32) * 1e-3) ** 2
    sq.reshape(-1, 8)[:, :5] = 0
    dense = (rng.standard_normal(200_000) * 0.02).astype(np.float32)
    items = [(sq.tobytes(), "float32"), (dense.tobytes(), "float32")]
    blobs = _encode.compress_many(items, profile=PROFILES["zero-runs"], backend=emu)
    assert _decode.decompress_many(blobs, backend=emu) == [x for x, _ in items]
    assert "nvcomp-gdeflate" in {p["codec"] for p in inspect(blobs[0]).planes}
    assert "nvcomp-gdeflate" not in {p["codec"] for p in inspect(blobs[1]).planes}


def _zero_block_cases():
    """Chunks with all-zero blocks in every place: at the start, to the end (the partial
    last block included), alternating, all but one byte; optimizer state."""
    rng = np.random.default_rng(5)
    dense = rng.integers(1, 256, 64 * 4096 + 77, dtype=np.uint8)
    cases = {}
    x = dense.copy(); x[: 20 * 4096] = 0; cases["zeros at the start"] = x
    x = dense.copy(); x[40 * 4096:] = 0; cases["zeros to the end (partial block)"] = x
    x = dense.copy().reshape(-1)[: 64 * 4096].reshape(64, 4096); x[::2] = 0
    cases["every other block"] = x.reshape(-1)
    x = np.zeros(64 * 4096 + 77, dtype=np.uint8); x[123_457] = 9; cases["one byte"] = x
    sq = (rng.standard_normal(300_000).astype(np.float32) * 1e-3) ** 2
    sq[: 300_000 * 44 // 100] = 0
    sq[200_000: 210_000] = 0
    cases["exp_avg_sq"] = sq.view(np.uint8)
    out = []
    for name, arr in cases.items():
        for dt in ("float32", "bfloat16", "uint8"):
            data = arr.tobytes()
            out.append((f"{name} {dt}", dt, data[: len(data) // lookup(dt).itemsize
                                                  * lookup(dt).itemsize]))
    return out


@pytest.mark.parametrize("profile", ["default", "portable"])
def test_emulated_zero_blocks_round_trip(emu, profile):
    """Chunks with all-zero blocks are stored with a keep map and without those blocks:
    every byte comes back through the batch decoder, the blob-by-blob decoder and (for
    the portable profile) the CPU. (That this stores less is a GPU test: zlib, which
    stands in for nvCOMP ANS here, codes zero runs almost for free anyway.)"""
    import dataclasses

    from s4fs.codec.gpu import PROFILES, _decode, _encode
    prof = dataclasses.replace(PROFILES[profile], zero_blocks=True)
    off = dataclasses.replace(prof, zero_blocks=False)
    cases = _zero_block_cases()
    items = [(data, dt) for _, dt, data in cases]
    blobs = _encode.compress_many(items, profile=prof, backend=emu)
    plain = _encode.compress_many(items, profile=off, backend=emu)
    assert _decode.decompress_many(blobs, backend=emu) == [d for d, _ in items]
    for (name, dt, data), blob, other in zip(cases, blobs, plain):
        head = C.unpack(blob)
        assert head.block == 4096 and head.kept_len < len(data), name
        assert C.unpack(other).block == 0
        assert len(blob) <= len(data) + 64, name
        assert _decode.decompress_many([blob], backend=emu) == [data], name
        if prof.portable:
            assert decompress(blob, device="cpu") == data, name


def test_emulated_zero_blocks_only_where_they_pay(emu):
    """Dense chunks, chunks with a few zero blocks, all-zero chunks (constant planes) and
    deltas keep every byte stored."""
    from s4fs.codec.gpu import _decode, _encode
    rng = np.random.default_rng(8)
    dense = rng.integers(1, 256, 64 * 4096, dtype=np.uint8)
    few = dense.copy()
    few[:4096] = 0                                  # 1 of 64 blocks: under 1/32
    base = dense.copy()
    base[: 32 * 4096] = 0
    items = [(dense.tobytes(), "uint8", None), (few.tobytes(), "uint8", None),
             (bytes(len(dense)), "float32", None), (dense.tobytes(), "uint8", base.tobytes())]
    blobs = _encode.compress_many(items, backend=emu)
    assert [C.unpack(b).block for b in blobs] == [0, 0, 0, 0]
    assert len(blobs[2]) < 64
    assert _decode.decompress_many(blobs, [None, None, None, base.tobytes()],
                                   backend=emu) == [x for x, _, _ in items]


def test_emulated_zero_block_damage_is_an_error_never_wrong_bytes(emu):
    """A flipped bit anywhere in a zero-block blob (its keep map included) gives a clear
    error, or the exact bytes, in the batch decoder, blob by blob and on the CPU."""
    import dataclasses

    from s4fs.codec.gpu import PROFILES, _decode, _encode
    rng = random.Random(3)
    name, dt, data = _zero_block_cases()[0]
    prof = dataclasses.replace(PROFILES["portable"], zero_blocks=True)
    blob = _encode.compress_many([(data, dt)], profile=prof, backend=emu)[0]
    head = C.unpack(blob)
    map_at = blob.index(head.keep_map, 10)
    spots = list(range(map_at, map_at + len(head.keep_map))) + \
        [rng.randrange(len(blob)) for _ in range(40)]
    errors = 0
    for at in spots:
        bad = bytearray(blob)
        bad[at] ^= 1 << rng.randrange(8)
        for decode in (lambda x: _decode.decompress_many([x], backend=emu)[0],
                       lambda x: decompress(x, device="cpu")):
            try:
                out = decode(bytes(bad))
            except CodecError:
                errors += 1
                continue
            assert out == data, at
    assert errors >= 2 * len(head.keep_map)


def test_emulated_planes_are_the_cpu_planes(emu):
    """The split kernel writes exactly ``_planes.split``'s planes, for every layout."""
    from s4fs.codec.gpu import _common, _kernels
    for name, dtn, data in A.all_cases(n_random=5000):
        dt = lookup(dtn)
        for layout in _planes.LAYOUTS:
            if _kernels.variant(dt, layout) is None or (layout == _planes.FLOAT and not dt.is_float):
                continue
            pl = _common.Plan([dt], [layout], [len(data)])
            total, nplanes = pl.place(), pl.nplanes
            src, scratch, flags = emu.empty(len(data)), emu.empty(total), emu.zeros(4 * nplanes + 4)
            src[: len(data)] = np.frombuffer(data, dtype=np.uint8)
            keep: list = []
            d = pl.descriptors([emu.ptr(src)], [0], emu.ptr(scratch))
            _common.launch_planes(emu, "split", pl, d, emu.ptr(flags), keep)
            ref = _planes.split(memoryview(data), dt, layout)
            got = [scratch[o: o + r].tobytes() for o, r in zip(pl.off.tolist(), pl.raw.tolist())]
            assert got == [bytes(r) for r in ref], (name, layout)


def test_emulated_cpu_blobs_decode(emu):
    from s4fs.codec.gpu import _decode
    cases = _cases(20_000)
    blobs = [compress(x, d, base=b, device="cpu") for _, d, x, b in cases]
    outs = _decode.decompress_many(blobs, [b for *_, b in cases], backend=emu)
    assert [o == x for o, (_, _, x, _) in zip(outs, cases)] == [True] * len(cases)


def test_emulated_difference_deltas_decode_beside_xor_ones(emu):
    """Difference deltas (written on the CPU: backward deltas) decode in a GPU batch
    beside XOR deltas and whole blobs, every one exact; a wrong base is refused."""
    from s4fs.codec.gpu import _decode
    cases = [c for c in _cases(20_000) if c[3] is not None]
    blobs, bases, want = [], [], []
    for _, d, x, b in cases:
        for transform in ("diff", "xor"):
            blobs.append(compress(x, d, base=b, device="cpu", transform=transform))
            bases.append(b)
            want.append(as_bytes(x).tobytes())
    assert any(C.unpack(blob).diff for blob in blobs)
    assert _decode.decompress_many(blobs, bases, backend=emu) == want
    wrong = bytearray(bases[0])
    wrong[0] ^= 1
    with pytest.raises(CodecError):
        _decode.decompress_many(blobs[:1], [bytes(wrong)], backend=emu)


def test_emulated_headers_are_the_containers(emu):
    from s4fs.codec.gpu import _encode
    rng = np.random.default_rng(1)
    data = (rng.standard_normal(50_000).astype(np.float32).view(np.uint32) >> 16).astype(np.uint16)
    blob = _encode.compress_many([(data.tobytes(), "bfloat16")], backend=emu)[0]
    head = C.unpack(blob)
    payloads = []
    pos = head.payload_offset
    for p in head.planes:
        payloads.append(bytes(blob[pos: pos + p.enc_len]))
        pos += p.enc_len
    again = C.pack(head.dtype_code, head.flags, head.layout, head.checksum, head.base_checksum,
                   head.raw_len, [(p.codec_id, p.codec_major, p.raw_len, x)
                                  for p, x in zip(head.planes, payloads)])
    assert again == blob


def test_emulated_corruption_raises_typed_errors(emu):
    from s4fs.codec.gpu import _decode, _encode
    rng = np.random.default_rng(2)
    data = (rng.standard_normal(100_000) * 0.02).astype(np.float16).tobytes()
    base = rng.bytes(len(data))
    blob = _encode.compress_many([(data, "float16")], backend=emu)[0]
    head = C.unpack(blob)
    for pos in (head.payload_offset + 9, len(blob) // 2, len(blob) - 3, 12):
        bad = bytearray(blob)
        bad[pos] ^= 0x5A
        with pytest.raises(CodecError):
            _decode.decompress_many([bytes(bad)], backend=emu)
    with pytest.raises(FormatError):
        _decode.decompress_many([blob[:-1]], backend=emu)
    delta = _encode.compress_many([(data, "float16", base)], backend=emu)[0]
    with pytest.raises(BaseMismatchError):
        _decode.decompress_many([delta], [rng.bytes(len(data))], backend=emu)
    with pytest.raises(BaseMismatchError):
        _decode.decompress_many([delta], backend=emu)


def test_emulated_ans_blob_from_another_nvcomp_major_is_refused(emu):
    from s4fs.codec.gpu import _decode, _encode
    rng = np.random.default_rng(4)
    data = rng.standard_normal(40_000).astype(np.float32).tobytes()
    blob = bytearray(_encode.compress_many([(data, "float32")], backend=emu)[0])
    head = C.unpack(bytes(blob))
    pos = head.payload_offset
    for p in head.planes:
        if p.codec_id == P.NVCOMP_ANS:
            blob[pos] = 5                                 # "written by nvCOMP 5"
        pos += p.enc_len
    with pytest.raises(CodecUnavailableError, match="nvCOMP ANS 5"):
        _decode.decompress_many([bytes(blob)], backend=emu)


def test_emulated_self_check_replaces_blobs_that_do_not_restore(emu):
    """A codec that writes a bad chunk (injected) never costs data: the encoder decodes
    what it wrote, and codes the failing chunk on the CPU instead."""
    import dataclasses
    from s4fs.codec.gpu import DEFAULT, _decode, _encode

    class Faulty(type(emu)):
        def __init__(self, inner):
            self.__dict__.update(inner.__dict__)

        def encode(self, spec, src, src_off, sizes, dst, dst_off, cap):
            out = super().encode(spec, src, src_off, sizes, dst, dst_off, cap)
            dst[dst_off[0]: dst_off[0] + 4] ^= 0x55            # first chunk of the batch
            return out

    faulty = Faulty(emu)
    rng = np.random.default_rng(7)
    datas = [(rng.standard_normal(30_000) * 0.02).astype(np.float16).tobytes() for _ in range(3)]
    items = [(d, "float16") for d in datas]
    blobs = _encode.compress_many(items, backend=faulty)
    assert [p["codec"] for p in inspect(blobs[0]).planes] != \
        [p["codec"] for p in inspect(blobs[1]).planes]         # blob 0 came from the CPU
    assert _decode.decompress_many(blobs, backend=emu) == datas
    unchecked = _encode.compress_many(items, backend=faulty,
                                      profile=dataclasses.replace(DEFAULT, verify=False))
    with pytest.raises(CodecError):
        _decode.decompress_many(unchecked, backend=emu)


def test_emulated_self_check_reads_what_the_header_says(emu, monkeypatch):
    """The self-check decodes each blob from its written header, not from what the
    encoder meant: a payload table that lies about its chunk sizes is caught, and the
    blob is coded on the CPU instead."""
    from s4fs.codec import _nvcomp_payload as _payload
    from s4fs.codec.gpu import _decode, _encode
    real = _payload.pack_many

    def lying(version, option, chunk, sizes, counts):
        sizes, counts = np.asarray(sizes).copy(), np.asarray(counts)
        sizes[(np.cumsum(counts) - counts)[counts > 0]] += 1     # every table's first chunk
        return real(version, option, chunk, sizes, counts)
    monkeypatch.setattr(_payload, "pack_many", lying)
    rng = np.random.default_rng(9)
    datas = [(rng.standard_normal(40_000) * 0.02).astype(np.float32).tobytes() for _ in range(2)]
    blobs = _encode.compress_many([(d, "float32") for d in datas], backend=emu)
    monkeypatch.setattr(_payload, "pack_many", real)
    assert _decode.decompress_many(blobs, backend=emu) == datas
    for blob in blobs:                            # came from the CPU: no nvCOMP planes
        assert not {p["codec"] for p in inspect(blob).planes} & {"nvcomp-ans", "nvcomp-deflate"}


# --------------------------------------------------------------------------- on a GPU

PROFILE_NAMES = ["default", "float", "portable", "gdeflate-mantissa", "zero-runs", "sm-raw",
                 "unchecked"]


def _profile(name):
    from s4fs.codec.gpu import PROFILES, GpuProfile
    if name == "sm-raw":
        return GpuProfile(name="sm-raw", mantissa="raw")
    if name == "unchecked":
        return GpuProfile(name="unchecked", verify=False)
    return PROFILES[name]


@gpu
@pytest.mark.parametrize("profile", PROFILE_NAMES)
def test_gpu_round_trips_every_adversarial_set(profile):
    from s4fs.codec import gpu as G
    prof = _profile(profile)
    cases = _cases()
    blobs = G.compress_many([(x, d, b) for _, d, x, b in cases], profile=prof)
    outs = G.decompress_many(blobs, [b for *_, b in cases])
    for (name, _, data, base), blob, out in zip(cases, blobs, outs):
        assert out == data, name
        assert len(blob) <= len(data) + 64, name
        # the single-chunk API agrees, on the GPU and (portable) on the CPU
        assert decompress(blob, base=base, device="cuda") == data, name
        if prof.portable:
            assert decompress(blob, base=base, device="cpu") == data, name


@gpu
def test_gpu_single_chunk_api():
    cases = _cases()
    for name, dt, data, base in cases:
        blob = compress(data, dt, base=base, device="cuda")
        assert decompress(blob, base=base, device="cuda") == data, name


@gpu
def test_cpu_encode_gpu_decode():
    from s4fs.codec import gpu as G
    cases = _cases()
    blobs = [compress(x, d, base=b, device="cpu") for _, d, x, b in cases]
    outs = G.decompress_many(blobs, [b for *_, b in cases])
    for (name, _, data, base), blob, out in zip(cases, blobs, outs):
        assert out == data, name
        assert decompress(blob, base=base, device="cuda") == data, name


@gpu
def test_cpu_difference_deltas_decode_on_the_gpu():
    """Backward deltas' difference blobs (coded on the CPU) decode in GPU batches, as
    device outputs too, and one by one on the device: every byte exact."""
    from s4fs.codec import gpu as G
    cases = [c for c in _cases() if c[3] is not None]
    blobs = [compress(x, d, base=b, device="cpu", transform="diff") for _, d, x, b in cases]
    assert all(C.unpack(blob).diff for blob in blobs)
    bases = [b for *_, b in cases]
    outs = G.decompress_many(blobs, bases)
    for (name, _, data, base), blob, out in zip(cases, blobs, outs):
        want = as_bytes(data).tobytes()
        assert out == want, name
        assert decompress(blob, base=base, device="cuda") == want, name
    some = [i for i, b in enumerate(bases) if len(b)]          # device bases, outputs
    dev = G.decompress_many([blobs[i] for i in some],
                            [G.to_device(np.frombuffer(bases[i], np.uint8)) for i in some],
                            out="device")
    for i, d in zip(some, dev):
        assert bytes(d.get()) == outs[i], cases[i][0]


@gpu
def test_codec_twins_decode_each_other():
    """nvCOMP Deflate ↔ zlib and nvCOMP GDeflate ↔ nvCOMP's CPU library, plane by plane."""
    from s4fs.codec import gpu as G
    from s4fs.codec import _nvcomp_twins as _codecs
    from s4fs.codec.gpu import GpuProfile
    rng = np.random.default_rng(5)
    data = (rng.standard_normal(1 << 20).astype(np.float32).view(np.uint32) >> 16)
    data = data.astype(np.uint16).tobytes()
    for name, twin in (("deflate", _codecs.NvcompDeflate()), ("gdeflate", _codecs.NvcompGdeflate())):
        if name == "gdeflate" and _codecs.cpu_gdeflate() is None:
            continue
        prof = GpuProfile(name=name, exponent=name, mantissa=name, other=name)
        blob = G.compress(data, lookup("bfloat16"), profile=prof)
        assert decompress(blob, device="cpu") == data               # GPU → CPU
        dt = lookup("bfloat16")
        planes = _planes.split(memoryview(data), dt, _planes.FLOAT)
        coded = []
        for p in planes:
            enc = twin.encode(p)
            raw = bytes(p)
            coded.append((twin.codec_id, 1, len(raw), enc) if enc else (P.RAW, 1, len(raw), raw))
        cpu_blob = C.pack(dt.code, 0, _planes.FLOAT, xxhash.xxh3_64_intdigest(data), None,
                          len(data), coded)
        assert decompress(cpu_blob, device="cuda") == data           # CPU → GPU


@gpu
def test_device_inputs_and_outputs():
    import cupy
    import torch
    from s4fs.codec import gpu as G
    torch.manual_seed(0)
    w = torch.randn(3, 1 << 20, device="cuda").to(torch.bfloat16)
    b = w + 1e-3 * torch.randn_like(w)
    odd = cupy.asarray(np.frombuffer(np.random.default_rng(0).bytes(1 << 20 | 7), np.uint8))[3:]
    items = [(w[0], "bfloat16"), (w[1:], "bfloat16", b[1:]), (cupy.asarray(w[2].float()), "float32"),
             (odd, "float32"), (w[0].cpu(), "bfloat16"), (w[0].float().cpu().numpy(), "float32")]
    want = [w[0].cpu(), w[1:].cpu(), w[2].float().cpu(), cupy.asnumpy(odd), w[0].cpu(),
            w[0].float().cpu()]
    want = [(x.contiguous().view(torch.uint8).numpy() if isinstance(x, torch.Tensor) else x)
            .tobytes() for x in want]
    for out in ("device", "host", "bytes"):
        blobs = G.compress_many(items, out=out)
        outs = G.decompress_many(blobs, [None, b[1:], None, None, None, None], out=out)
        for k, (blob, res, exp) in enumerate(zip(blobs, outs, want)):
            got = cupy.asnumpy(res).tobytes() if out == "device" else bytes(res)
            assert got == exp, (out, k)
    assert torch.equal(torch.as_tensor(G.decompress_many(G.compress_many(items[:1], out="device"),
                                                         out="device")[0], device="cuda"),
                       w[0].contiguous().view(torch.uint8).reshape(-1))


@gpu
def test_gpu_corruption_raises_typed_errors():
    from s4fs.codec import gpu as G
    rng = np.random.default_rng(6)
    data = (rng.standard_normal(1 << 19) * 0.02).astype(np.float16).tobytes()
    blob = G.compress(data, lookup("float16"))
    head = C.unpack(blob)
    assert any(p.codec_id >= 16 for p in head.planes)
    for pos in (head.payload_offset + 9, len(blob) // 2, len(blob) - 3, 12, 20):
        bad = bytearray(blob)
        bad[pos] ^= 0x5A
        with pytest.raises(CodecError):
            decompress(bytes(bad), device="cuda")
        with pytest.raises(CodecError):
            G.decompress_many([bytes(bad)])
    with pytest.raises(FormatError):
        G.decompress_many([blob[:-1]])
    bad = bytearray(blob)
    bad[4] = 9                                  # container major from the future
    with pytest.raises(UnsupportedVersionError):
        G.decompress_many([bytes(bad)])


@gpu
def test_gpu_decodes_twin_fixtures():
    from s4fs.codec import gpu as G
    for name, entry in _twins().items():
        blob, base = _fixture(name, entry, TWINS)
        out = G.decompress_many([blob], [base])[0]
        assert hashlib.sha256(out).hexdigest() == entry["sha256"], name


@gpu
def test_gpu_golden_fixtures():
    from s4fs.codec import gpu as G
    manifest = _manifest()
    for name, entry in manifest.items():
        blob, base = _fixture(name, entry)
        out = G.decompress_many([blob], [base])[0]
        assert hashlib.sha256(out).hexdigest() == entry["sha256"], name
        assert hashlib.sha256(decompress(blob, base=base, device="cuda")).hexdigest() == entry["sha256"]


# --------------------------------------------------------------------------- fixtures

def _golden_inputs():
    rng = np.random.default_rng(20240601)
    bf = (rng.standard_normal(1 << 16).astype(np.float32).view(np.uint32) >> 16).astype(np.uint16)
    f32 = rng.standard_normal(1 << 15).astype(np.float32).view(np.uint32)
    f32[::97] = np.resize(np.array(A.FLOAT_SPECIALS_32, dtype=np.uint32), len(f32[::97]))
    base = f32.copy()
    base[::3] ^= np.uint32(0x10)
    f16 = (rng.standard_normal(1 << 15) * 0.02).astype(np.float16)
    return {
        "bf16-weights": ("bfloat16", bf.tobytes(), None),
        "bf16-all-patterns": ("bfloat16", np.arange(1 << 16, dtype=np.uint16).tobytes(), None),
        "fp32-specials": ("float32", f32.tobytes(), None),
        "fp32-delta": ("float32", f32.tobytes(), base.tobytes()),
        "fp16-weights": ("float16", f16.tobytes(), None),
        "fp8-all-patterns": ("float8_e4m3fn", bytes(range(256)) * 64, None),
        "int64-steps": ("int64", np.arange(1 << 13, dtype=np.int64).tobytes(), None),
    }


@gpu
@pytest.mark.skipif(not os.environ.get("S4FS_WRITE_GPU_FIXTURES"),
                    reason="writes golden fixtures once (S4FS_WRITE_GPU_FIXTURES=1)")
def test_write_golden_fixtures():
    from s4fs.codec import gpu as G
    target = os.environ.get("S4FS_GPU_FIXTURE_DIR", FIXTURES)
    if os.path.exists(os.path.join(target, "manifest.json")):
        pytest.skip("golden fixtures exist; they are never regenerated")
    os.makedirs(target, exist_ok=True)
    manifest = {}
    for profile in ("default", "float", "gdeflate-mantissa", "portable"):
        prof = _profile(profile)
        for name, (dt, data, base) in _golden_inputs().items():
            blob = G.compress(data, lookup(dt), base=base, profile=prof)
            key = f"{name}.{profile}"
            with open(os.path.join(target, key + ".s4"), "wb") as fh:
                fh.write(blob)
            entry = {"dtype": dt, "raw_len": len(data), "profile": profile,
                     "sha256": hashlib.sha256(data).hexdigest(),
                     "codecs": sorted({p["codec"] for p in inspect(blob).planes}),
                     "nvcomp": ".".join(map(str, G.nvcomp_version() or ())), "base": None}
            if base is not None:
                entry["base"] = name + ".base"
                with open(os.path.join(target, name + ".base"), "wb") as fh:
                    fh.write(base)
            manifest[key] = entry
            assert decompress(blob, base=base, device="cuda") == data
    with open(os.path.join(target, "manifest.json"), "w") as fh:
        json.dump(manifest, fh, indent=1, sort_keys=True)


def _zero_block_inputs():
    rng = np.random.default_rng(20261202)
    sq = (rng.standard_normal(1 << 18).astype(np.float32) * 1e-3) ** 2
    sq[: (1 << 18) * 44 // 100] = 0                      # rows that saw no gradient
    sq[200_000: 210_000] = 0
    bf = (rng.standard_normal(1 << 18).astype(np.float32).view(np.uint32) >> 16)
    bf = bf.astype(np.uint16)
    bf.reshape(64, -1)[::3] = 0                          # pruned rows
    return {"fp32-exp-avg-sq": ("float32", sq.tobytes()),
            "bf16-pruned": ("bfloat16", bf.tobytes())}


def _zero_block_profile(name):
    import dataclasses
    return dataclasses.replace(_profile(name), zero_blocks=True)


@gpu
@pytest.mark.skipif(not os.environ.get("S4FS_WRITE_GPU_FIXTURES"),
                    reason="writes golden fixtures once (S4FS_WRITE_GPU_FIXTURES=1)")
def test_write_zero_block_fixtures():
    from s4fs.codec import gpu as G
    target = os.path.join(os.environ.get("S4FS_GPU_FIXTURE_DIR", FIXTURES), "zero-blocks")
    if os.path.exists(os.path.join(target, "manifest.json")):
        pytest.skip("zero-block fixtures exist; they are never regenerated")
    os.makedirs(target, exist_ok=True)
    manifest = {}
    for profile in ("default", "portable"):
        for name, (dt, data) in _zero_block_inputs().items():
            blob = G.compress(data, lookup(dt), profile=_zero_block_profile(profile))
            assert C.unpack(blob).block, name
            key = f"{name}.{profile}"
            with open(os.path.join(target, key + ".s4"), "wb") as fh:
                fh.write(blob)
            manifest[key] = {"dtype": dt, "raw_len": len(data), "profile": profile,
                             "sha256": hashlib.sha256(data).hexdigest(),
                             "codecs": sorted({p["codec"] for p in inspect(blob).planes}),
                             "nvcomp": ".".join(map(str, G.nvcomp_version() or ())),
                             "base": None}
            assert decompress(blob, device="cuda") == data
    with open(os.path.join(target, "manifest.json"), "w") as fh:
        json.dump(manifest, fh, indent=1, sort_keys=True)


def _zero_block_manifest() -> dict:
    path = os.path.join(ZERO_BLOCKS, "manifest.json")
    if not os.path.exists(path):
        pytest.skip("zero-block fixtures are written on a GPU (S4FS_WRITE_GPU_FIXTURES=1)")
    with open(path) as fh:
        return json.load(fh)


def test_zero_block_fixtures_read_anywhere():
    """GPU-written blobs with zero blocks: the portable ones decode on any CPU to their
    exact bytes; ANS ones need a GPU and say so on a machine without one."""
    for name, entry in _zero_block_manifest().items():
        blob, _ = _fixture(name, entry, ZERO_BLOCKS)
        head = C.unpack(blob)
        assert head.block and head.kept_len < head.raw_len == entry["raw_len"], name
        if "nvcomp-ans" in entry["codecs"] and not gpu_available():
            with pytest.raises(CodecUnavailableError, match="GPU"):
                decompress(blob, device="cpu")
            continue
        out = decompress(blob, device="auto")
        assert hashlib.sha256(out).hexdigest() == entry["sha256"], name


@gpu
def test_gpu_zero_block_fixtures():
    from s4fs.codec import gpu as G
    entries = _zero_block_manifest()
    blobs = [_fixture(name, entry, ZERO_BLOCKS)[0] for name, entry in entries.items()]
    outs = G.decompress_many(blobs)
    for (name, entry), out in zip(entries.items(), outs):
        assert hashlib.sha256(out).hexdigest() == entry["sha256"], name


@gpu
def test_gpu_zero_blocks_store_less():
    """On nvCOMP ANS, leaving out the zero blocks stores optimizer state and pruned
    weights smaller, and every byte comes back (batch, one by one, through decompress)."""
    import dataclasses

    from s4fs.codec import gpu as G
    items = [(data, dt) for dt, data in _zero_block_inputs().values()]
    on = G.compress_many(items, profile=_zero_block_profile("default"))
    off = G.compress_many(items, profile=dataclasses.replace(_profile("default"),
                                                             zero_blocks=False))
    assert G.decompress_many(on) == [d for d, _ in items]
    for (data, dt), a, b in zip(items, on, off):
        assert C.unpack(a).block and not C.unpack(b).block
        assert len(a) < 0.99 * len(b), (dt, len(a), len(b))
        assert decompress(a, device="cuda") == data


@pytest.mark.skipif(not os.environ.get("S4FS_WRITE_TWIN_FIXTURES"),
                    reason="writes the CPU-twin fixtures once (S4FS_WRITE_TWIN_FIXTURES=1)")
def test_write_twin_fixtures():
    from s4fs.codec import _nvcomp_twins as _codecs
    if os.path.exists(os.path.join(TWINS, "manifest.json")):
        pytest.skip("twin fixtures exist; they are never regenerated")
    assert _codecs.cpu_gdeflate() is not None, "needs nvCOMP's CPU library (nvidia-libnvcomp)"
    os.makedirs(TWINS, exist_ok=True)
    manifest = {}
    for twin in (_codecs.NvcompDeflate(), _codecs.NvcompGdeflate()):
        for name, (dtn, data, base) in _golden_inputs().items():
            dt = lookup(dtn)
            layout = _planes.layout_for(dt)
            src = data if base is None else bytes(np.frombuffer(data, np.uint8) ^
                                                  np.frombuffer(base, np.uint8))
            coded = []
            for p in _planes.split(memoryview(src), dt, layout):
                raw = bytes(p)
                enc = twin.encode(raw) if len(raw) >= 64 else None
                coded.append((twin.codec_id, 1, len(raw), enc) if enc else (P.RAW, 1, len(raw), raw))
            blob = C.pack(dt.code, C.FLAG_DELTA if base is not None else 0, layout,
                          xxhash.xxh3_64_intdigest(data),
                          None if base is None else xxhash.xxh3_64_intdigest(base), len(data), coded)
            key = f"{name}.{twin.name}"
            with open(os.path.join(TWINS, key + ".s4"), "wb") as fh:
                fh.write(blob)
            entry = {"dtype": dtn, "raw_len": len(data), "sha256": hashlib.sha256(data).hexdigest(),
                     "codecs": sorted({p["codec"] for p in inspect(blob).planes}),
                     "writer": twin.name + " CPU twin", "base": None}
            if base is not None:
                entry["base"] = name + ".base"
                with open(os.path.join(TWINS, name + ".base"), "wb") as fh:
                    fh.write(base)
            manifest[key] = entry
            assert decompress(blob, base=base, device="cpu") == data
    with open(os.path.join(TWINS, "manifest.json"), "w") as fh:
        json.dump(manifest, fh, indent=1, sort_keys=True)


def test_emulated_decoder_reads_gpu_blobs_in_one_batch(emu, monkeypatch):
    """GPU-written blobs (raw, constant and nvCOMP planes, deltas, odd sizes) are read by
    the batch header reader; only blobs it cannot take go blob by blob."""
    from s4fs.codec.gpu import _decode, _encode
    cases = [c for c in _cases(6_000) if c[3] is None or len(c[3]) == len(c[2])]
    blobs = _encode.compress_many([(x, d, b) for _, d, x, b in cases], backend=emu)

    def refuse(self):
        raise AssertionError("went blob by blob")
    monkeypatch.setattr(_decode._Decode, "_headers_each", refuse)
    outs = _decode.decompress_many(blobs, [b for *_, b in cases], backend=emu)
    assert outs == [x for _, _, x, _ in cases]
    data = (np.random.default_rng(4).standard_normal(50_000) * 0.02).astype(np.float32).tobytes()
    cpu = compress(data, "float32", device="cpu")             # zstd planes: host-decoded
    with pytest.raises(AssertionError, match="blob by blob"):
        _decode.decompress_many([cpu], backend=emu)


def test_nvcomp_c_options_match_the_header():
    """The ctypes option structs are nvCOMP 6's layout: 64 bytes, fields where ans.h puts
    them (passed by value, a wrong layout would pass garbage options)."""
    import ctypes
    from s4fs.codec.gpu import _nvcomp_c as N
    for cls, names in ((N.CompressOpts, ["type", "data_type", "max_sub_chunk_count",
                                         "states_per_lane", "histogram_reduction_log2"]),
                       (N.DecompressOpts, ["backend", "data_type", "max_sub_chunk_count",
                                           "states_per_lane", "skip_validate"])):
        assert ctypes.sizeof(cls) == 64
        assert [getattr(cls, n).offset for n in names] == [0, 4, 8, 9, 10]
        assert cls.reserved.offset == 11 and cls.reserved.size == 53


@gpu
def test_gpu_ans_c_api_and_python_api_read_each_other(monkeypatch):
    """ANS goes through nvCOMP's C API where nvCOMP 6 is installed (a silent fallback to
    the slower Python API would show here), and blobs written either way decode the
    other way."""
    from s4fs.codec import gpu as G
    from s4fs.codec.gpu import _backend
    b = _backend.cuda_backend()
    if b.nvcomp_version[0] == 6:
        assert b._ans_c() is not None
    rng = np.random.default_rng(11)
    datas = [(rng.standard_normal(300_000) * 0.02).astype(np.float32).tobytes() for _ in range(3)]
    via_c = G.compress_many([(d, "float32") for d in datas])
    monkeypatch.setenv("S4FS_NVCOMP_CAPI", "0")
    py = _backend.CudaBackend()
    assert py._ans_c() is None
    from s4fs.codec.gpu import _decode, _encode
    via_py = _encode.compress_many([(d, "float32") for d in datas], backend=py)
    assert _decode.decompress_many(via_c, backend=py) == datas
    monkeypatch.delenv("S4FS_NVCOMP_CAPI")
    assert G.decompress_many(via_py) == datas


def test_emulated_batch_decode_refuses_every_damaged_blob(emu):
    _damaged_batches(emu)


@gpu
def test_gpu_batch_decode_refuses_every_damaged_blob():
    from s4fs.codec.gpu._backend import cuda_backend
    _damaged_batches(cuda_backend())


def _damaged_batches(backend):
    """One byte flipped anywhere in one blob of a batch (header, payload table, constant,
    chunk bytes), or a blob cut short or extended: the batch decode raises a CodecError,
    or (a flip the codec does not read, such as a deflate stream's final-block bit) gives
    back exactly the original bytes, checked — never other bytes."""
    from s4fs.codec.gpu import _decode, _encode
    rng = np.random.default_rng(12)
    datas = [(rng.standard_normal(20_000) * 0.02).astype(np.float32).tobytes(),
             (rng.standard_normal(30_000) * 0.02).astype(np.float16).tobytes(),
             bytes(4096), rng.bytes(3000)]
    dts = ["float32", "float16", "bfloat16", "uint8"]
    blobs = _encode.compress_many(list(zip(datas, dts)), backend=backend)
    assert _decode.decompress_many(blobs, backend=backend) == datas
    pick = random.Random(12)
    refused = 0
    for trial in range(150):
        k = pick.randrange(len(blobs))
        bad = bytearray(blobs[k])
        kind = trial % 5
        if kind < 3:
            at = pick.randrange(min(len(bad), 96)) if kind == 0 else pick.randrange(len(bad))
            bad[at] ^= 1 << pick.randrange(8)
        elif kind == 3:
            bad = bad[: pick.randrange(len(bad))]
        else:
            bad += bytes(pick.randrange(1, 9))
        batch = list(blobs)
        batch[k] = bytes(bad)
        try:
            got = _decode.decompress_many(batch, backend=backend)
        except CodecError:
            refused += 1
            continue
        assert got == datas, (trial, k, kind)
    assert refused >= 140


def test_nvcomp_c_tables_reach_the_right_arguments(emu):
    """The C API binding's one device table (pointers, sizes, then room for the sizes and
    statuses nvCOMP writes) hands every argument the right column: checked with a stand-in
    library that copies chunks through (on the emulated backend, device pointers are host
    addresses)."""
    import ctypes
    import types
    from s4fs.codec.gpu import _nvcomp_c as N

    def col(addr, n, typ=ctypes.c_uint64):
        return list((typ * n).from_address(addr))

    def temp_size(n, chunk, opts, out, total, stream):
        out._obj.value = 64
        return 0

    def compress(src, sizes, chunk, n, temp, temp_n, dst, out_sizes, opts, status, stream):
        for k, (s, m, d) in enumerate(zip(col(src, n), col(sizes, n), col(dst, n))):
            ctypes.memmove(d, s, m)
            (ctypes.c_uint64 * n).from_address(out_sizes)[k] = m
            (ctypes.c_int32 * n).from_address(status)[k] = 0
        return 0

    def decompress(src, src_sizes, bufs, actual, n, temp, temp_n, dst, opts, status, stream):
        for k, (s, m, cap, d) in enumerate(zip(col(src, n), col(src_sizes, n), col(bufs, n),
                                                col(dst, n))):
            ctypes.memmove(d, s, min(m, cap))
            (ctypes.c_uint64 * n).from_address(actual)[k] = m        # what the stream holds
            (ctypes.c_int32 * n).from_address(status)[k] = 0
        return 0

    c = N.AnsC.__new__(N.AnsC)
    c.lib = types.SimpleNamespace(
        nvcompBatchedANSCompressGetTempSize=temp_size,
        nvcompBatchedANSDecompressGetTempSize=temp_size,
        nvcompBatchedANSCompressAsync=compress, nvcompBatchedANSDecompressAsync=decompress)
    c.copts, c.dopts = N.CompressOpts(), N.DecompressOpts()
    emu.stream = types.SimpleNamespace(ptr=0)
    rng = np.random.default_rng(13)
    sizes = [1000, 4096, 7]
    src = emu.empty(3 << 13)
    src[:] = rng.integers(0, 256, len(src), dtype=np.uint8)
    offs = np.array([0, 1 << 13, 2 << 13])
    dst, back = emu.zeros(3 << 13), emu.zeros(3 << 13)
    got = c.compress(emu, emu.ptr(src) + offs, sizes, emu.ptr(dst) + offs, 1 << 13)
    assert got.tolist() == sizes
    assert c.decompress(emu, emu.ptr(dst) + offs, got, emu.ptr(back) + offs, sizes, 1 << 13)
    for o, n in zip(offs, sizes):
        assert back[o: o + n].tobytes() == src[o: o + n].tobytes()
    assert not c.decompress(emu, emu.ptr(dst) + offs, got, emu.ptr(back) + offs,
                            [1000, 4096, 6], 1 << 13)                     # a short chunk
    # the verdicts left for after the batch's last wait: the same answers, and a batch
    # that did not decode is an error then
    from s4fs.codec.gpu._backend import settle
    from s4fs.errors import FormatError
    ok = c.decompress(emu, emu.ptr(dst) + offs, got, emu.ptr(back) + offs, sizes, 1 << 13,
                      wait=False)
    short = c.decompress(emu, emu.ptr(dst) + offs, got, emu.ptr(back) + offs,
                         [1000, 4096, 6], 1 << 13, wait=False)
    assert ok() and not short()
    settle([ok])
    with pytest.raises(FormatError, match="could not decode"):
        settle([ok, short])


def test_zero_heavy_planes_take_the_smaller_nvcomp_chunk(emu):
    """Dense planes are coded in ``chunk``-sized nvCOMP chunks, planes with many zero
    bytes in ``zero_chunk``-sized ones (what each payload records), and both kinds of
    blob decode to exactly their bytes."""
    from s4fs.codec import _container as C
    from s4fs.codec import _plane_codecs as P
    from s4fs.codec import _nvcomp_payload as _payload
    from s4fs.codec.gpu import GpuProfile, _decode, _encode
    rng = np.random.default_rng(21)
    dense = (rng.standard_normal(1 << 20) * 0.02).astype(np.float32)
    sparse = ((rng.standard_normal(1 << 20) * 1e-4) ** 2).astype(np.float32)
    sparse.reshape(-1, 4)[:, :3] = 0             # 75 % zeros (no whole zero block)
    prof = GpuProfile(chunk=3 << 16, zero_chunk=1 << 16)
    blobs = _encode.compress_many([(dense, "float32"), (sparse, "float32")], profile=prof,
                                  backend=emu, out="bytes")
    assert _decode.decompress_many(blobs, backend=emu) == [dense.tobytes(), sparse.tobytes()]
    chunks = []
    for blob in blobs:
        head = C.unpack(blob)
        pos, seen = head.payload_offset, set()
        for ph in head.planes:
            if ph.codec_id == P.NVCOMP_ANS:
                seen.add(_payload.parse(blob[pos: pos + ph.enc_len], ph.raw_len, "ans").chunk)
            pos += ph.enc_len
        chunks.append(seen)
    assert chunks == [{3 << 16}, {1 << 16}]


def test_pinned_memory_comes_in_few_size_classes():
    """CuPy's pinned pool reuses a freed block only for a request of its exact size:
    the sizes s4fs asks for are rounded to classes, so batches of varying sizes reuse
    a few blocks instead of pinning new memory every time (and keeping it)."""
    from s4fs.codec.gpu._backend import pinned_size
    rng = random.Random(7)
    sizes = [1, 4095, 4096, 4097, 65535, 65536, 65537, 1 << 20, (1 << 20) + 1] + \
        [rng.randrange(1, 3 << 30) for _ in range(2000)]
    for n in sizes:
        c = pinned_size(n)
        assert n <= c <= max(n + 4095, n * 5 // 4 + 1), (n, c)
        assert pinned_size(c) == c
    ordered = sorted(sizes)
    assert all(pinned_size(a) <= pinned_size(b) for a, b in zip(ordered, ordered[1:]))
    # a mount's batches: blob totals of 40-50 MiB, decode-ahead reads of 10-13 MiB
    assert len({pinned_size(rng.randrange((40 << 20) + 1, 50 << 20)) for _ in range(500)}) <= 2
    assert len({pinned_size(rng.randrange((10 << 20) + 1, 13 << 20)) for _ in range(500)}) <= 2


@gpu
def test_pinned_host_memory_is_reused_and_given_back():
    """Host buffers of varying sizes (every batch's) reuse a few pinned blocks; the
    release after a save keeps them for the next save (a training process that saves
    every few minutes pins no more memory with every save, and does not pin again
    either); release_memory(pinned=True) gives them back."""
    import cupy

    from s4fs.codec import gpu as g
    pool = cupy.get_default_pinned_memory_pool()
    g.release_memory(pinned=True)
    rng = random.Random(3)
    for _ in range(60):
        buf = g.host_buffer(rng.randrange((40 << 20) + 1, 50 << 20))
        buf[:: 1 << 20] = 1
        del buf
        g.release_memory()                      # what every s4fs.save does at its end
    assert 1 <= pool.n_free_blocks() <= 2, pool.n_free_blocks()
    blobs = g.compress_many([(bytes(rng.randrange(256) for _ in range(1 << 16)) * 16,
                              "bfloat16")], out="host")
    del blobs
    g.release_memory(pinned=True)
    assert pool.n_free_blocks() == 0


@gpu
def test_a_threads_codec_backend_is_on_the_threads_current_device():
    """``cuda_backend()`` (what compress_many / decompress_many use) is the backend of
    the calling thread's current device, the same one ``cuda_backend(that device)``
    gives — not the first device the thread ever used; a new thread's is its own."""
    import threading

    import cupy

    from s4fs.codec.gpu._backend import cuda_backend
    last = cupy.cuda.runtime.getDeviceCount() - 1
    with cupy.cuda.Device(last):
        b = cuda_backend()
        assert b is cuda_backend(last) and b.device.id == last
    seen = []
    t = threading.Thread(target=lambda: seen.append(cuda_backend()))
    t.start()
    t.join()
    assert seen[0] is not b and seen[0].device.id == 0
