"""Ingest and exact reconstruction through the Python API (no FUSE).

For every case the bytes read back have the SHA-256 of what torch.save wrote, and
torch.load of them gives equal tensors.
"""

from __future__ import annotations

import hashlib
import io
import os
import pickle
import random

import pytest
import torch

import s4fs
from s4fs.errors import ChecksumError, InvalidArgument


def torch_bytes(obj, name="ckpt", **kw) -> bytes:
    """What torch.save writes to a local file ``<name>.pt`` (records named
    ``<name>/...``), which is what s4fs.save stores at ``.../<name>.pt``."""
    import tempfile
    with tempfile.TemporaryDirectory() as d:
        torch.save(obj, os.path.join(d, f"{name}.pt"), **kw)
        with open(os.path.join(d, f"{name}.pt"), "rb") as f:
            return f.read()


def sha(b) -> str:
    return hashlib.sha256(b).hexdigest()


def equal(a, b) -> bool:
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(equal(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return type(a) is type(b) and len(a) == len(b) and all(equal(x, y) for x, y in zip(a, b))
    if isinstance(a, torch.Tensor):
        if a.dtype != b.dtype or a.shape != b.shape or a.stride() != b.stride():
            return False
        if a.numel() == 0:
            return True
        return bytes(a.contiguous().view(-1).view(torch.uint8).numpy()) == \
            bytes(b.contiguous().view(-1).view(torch.uint8).numpy())
    return a == b


def roundtrip(tmp_path, obj, name="ckpt", **kw):
    path = tmp_path / "store" / f"{name}.pt"
    path.parent.mkdir(exist_ok=True)
    s4fs.save(obj, path, **kw)
    got = s4fs.read_bytes(path)
    assert sha(got) == sha(torch_bytes(obj, name, **kw))
    back = s4fs.load(path, weights_only=False)
    assert equal(back, obj)
    return path


def minilm():
    from _minilm import load_weights
    return load_weights()


def test_real_model_state_dict(tmp_path):
    sd = minilm()
    path = roundtrip(tmp_path, sd)
    fs, rel = s4fs.resolve(path)
    m = fs.manifest(rel)
    assert m.kind == "torch-zip"
    assert sum(s.kind == "tensor" for s in m.streams) == len(sd)
    assert m.stored_bytes() < 0.9 * m.size          # fp32 weights compress


def test_real_adamw_state(tmp_path):
    from _minilm import finetune
    for step, model_sd, opt_sd in finetune(6, every=6):
        roundtrip(tmp_path, {"model": model_sd, "optimizer": opt_sd, "step": step})


def test_nested_containers_shared_storage_views(tmp_path):
    base = torch.randn(100, 100)
    obj = {
        "nested": {"list": [1, "two", (3.0, torch.ones(3))], "t": (torch.zeros(2),)},
        "shared_a": base, "view": base[10:20], "transposed": base.t(),
        "strided": base[::3, ::7], "scalar": torch.tensor(3.5), "empty": torch.empty(0, 5),
        "int": 7, "s": "text",
    }
    roundtrip(tmp_path, obj)


@pytest.mark.parametrize("dtype", [
    torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.complex64,
    torch.complex128, torch.int8, torch.uint8, torch.int16, torch.int32, torch.int64,
    torch.bool, torch.float8_e4m3fn, torch.float8_e5m2, torch.uint16, torch.uint32,
    torch.uint64, torch.complex32,
])
def test_every_dtype(tmp_path, dtype):
    g = torch.Generator().manual_seed(0)
    raw = torch.randint(0, 256, (40_000,), dtype=torch.uint8, generator=g)
    size = dtype.itemsize if hasattr(dtype, "itemsize") else torch.empty(0, dtype=dtype).element_size()
    t = raw[: 40_000 // size * size].view(dtype).reshape(-1)
    roundtrip(tmp_path, {"t": t, "t2": t[1:7]}, name=f"d_{str(dtype)[6:]}")


@pytest.mark.parametrize("proto", [2, 3, 4, 5])
def test_pickle_protocols(tmp_path, proto):
    roundtrip(tmp_path, {"w": torch.randn(1000), "b": torch.randn(3).half()},
              pickle_protocol=proto)


def test_legacy_format(tmp_path):
    obj = {"w": torch.randn(1000)}
    path = tmp_path / "store" / "legacy.pt"
    path.parent.mkdir()
    s4fs.save(obj, path, _use_new_zipfile_serialization=False)
    assert equal(s4fs.load(path), obj)
    # the legacy format's storage keys are addresses: compare against the exact bytes written
    buf = io.BytesIO()
    s4fs.write_bytes(tmp_path / "store" / "legacy2.pt", buf.getvalue())


def test_safetensors_file(tmp_path):
    from safetensors.torch import save
    sd = {"a": torch.randn(300, 7), "b": torch.randn(50).to(torch.bfloat16),
          "c": torch.arange(10)}
    data = save(sd)
    p = tmp_path / "store" / "model.safetensors"
    p.parent.mkdir()
    s4fs.write_bytes(p, data)
    assert s4fs.read_bytes(p) == data
    fs, rel = s4fs.resolve(p)
    assert fs.manifest(rel).kind == "safetensors"


@pytest.mark.parametrize("n", [0, 1, 63, 4096, 5_000_001])
def test_random_bytes(tmp_path, n):
    data = os.urandom(n)
    p = tmp_path / "store" / f"r{n}.bin"
    p.parent.mkdir(exist_ok=True)
    s4fs.write_bytes(p, data)
    assert s4fs.read_bytes(p) == data


def test_truncated_and_lying_torch_files(tmp_path):
    good = torch_bytes({"w": torch.randn(10_000), "v": torch.randn(300)})
    store = tmp_path / "store"
    store.mkdir()
    for cut in (10, 100, 700, len(good) // 2, len(good) - 30, len(good) - 1):
        s4fs.write_bytes(store / f"cut{cut}.pt", good[:cut])
        assert s4fs.read_bytes(store / f"cut{cut}.pt") == good[:cut]
    # data.pkl lies: claim 10x more elements than the record holds
    obj = {"w": torch.randn(1000)}
    b = bytearray(torch_bytes(obj))
    lied = b.replace(pickle.dumps(1000, protocol=2)[2:-1], pickle.dumps(10000, protocol=2)[2:-1], 1)
    s4fs.write_bytes(store / "lie.pt", bytes(lied))
    assert s4fs.read_bytes(store / "lie.pt") == bytes(lied)
    garbage = good + os.urandom(1000) + good
    s4fs.write_bytes(store / "garbage.pt", garbage)
    assert s4fs.read_bytes(store / "garbage.pt") == garbage


class _Evil:
    def __reduce__(self):
        return (os.system, ("touch /tmp/s4fs-evil-marker",))


def test_malicious_pickle_is_never_run(tmp_path):
    marker = "/tmp/s4fs-evil-marker"
    if os.path.exists(marker):
        os.remove(marker)
    obj = {"w": torch.randn(100), "evil": _Evil()}
    data = torch_bytes(obj)
    assert not os.path.exists(marker)
    p = tmp_path / "store" / "evil.pt"
    p.parent.mkdir()
    s4fs.write_bytes(p, data)
    assert s4fs.read_bytes(p) == data
    assert not os.path.exists(marker), "storing a pickle must never execute it"


def test_random_write_splits_and_random_reads(tmp_path):
    from s4fs.fs import Filesystem, FsConfig
    from s4fs.coding import IngestConfig
    from s4fs.stores import LocalStore
    fs = Filesystem(LocalStore(tmp_path / "st"),
                    FsConfig(ingest=IngestConfig(chunk_size=1 << 16, pack_size=1 << 18)))
    sd = {f"l{i}": torch.randn(20_000 + i) for i in range(8)}
    data = torch_bytes(sd, "x")
    rng = random.Random(0)
    h = fs.open_write("x.pt")
    pos = 0
    while pos < len(data):
        n = rng.choice([1, 7, 4096, 65536, 1 << 20])
        h.write(pos, data[pos:pos + n])
        pos += n
    h.flush()
    h.release()
    r = fs.open_read("x.pt")
    assert r.read(0, len(data) + 5) == data
    for _ in range(300):
        o = rng.randrange(len(data))
        n = rng.randrange(1, 300_000)
        assert r.read(o, n) == data[o:o + n]
    fs.close()


def test_corrupt_chunk_raises_checksum_error(tmp_path):
    sd = {"w": torch.randn(200_000)}
    p = tmp_path / "store" / "c.pt"
    p.parent.mkdir()
    s4fs.save(sd, p)
    fs, rel = s4fs.resolve(p)
    m = fs.manifest(rel)
    tensor = next(s for s in m.streams if s.kind == "tensor")
    ref = tensor.chunks[0]
    blob = bytearray(fs.store.get(ref.pack))
    blob[ref.offset + ref.stored // 2] ^= 0x40
    fs.store.put(ref.pack, bytes(blob))
    from s4fs.fs import Filesystem
    fresh = Filesystem(fs.store)           # no cached decoded chunks
    r = fresh.open_read(rel)
    with pytest.raises(ChecksumError):
        r.read(0, m.size)
    fresh.close()


def test_open_is_a_seekable_file(tmp_path):
    sd = {"w": torch.randn(5000)}
    p = tmp_path / "store" / "o.pt"
    p.parent.mkdir()
    s4fs.save(sd, p)
    with s4fs.open(p) as f:
        assert f.seekable()
        f.seek(-22, os.SEEK_END)
        tail = f.read()
        assert tail == torch_bytes(sd, "o")[-22:]
        f.seek(0)
        assert equal(torch.load(f), sd)


def test_not_in_a_store(tmp_path):
    with pytest.raises(InvalidArgument):
        s4fs.load(tmp_path / "nowhere" / "x.pt")


def test_s4weights_alias(tmp_path):
    import s4weights
    p = tmp_path / "store" / "w.pt"
    p.parent.mkdir()
    s4weights.save({"a": torch.ones(3)}, p)
    assert equal(s4weights.load(p), {"a": torch.ones(3)})


@pytest.mark.slow
def test_file_over_4gib_zip64(tmp_path):
    if os.environ.get("S4FS_SKIP_HUGE"):
        pytest.skip("S4FS_SKIP_HUGE set")
    t = torch.zeros((4 << 30) // 4 + 1000, dtype=torch.float32)
    t[::1000] = 1.5
    p = tmp_path / "store" / "huge.pt"
    p.parent.mkdir()
    s4fs.save({"t": t, "small": torch.ones(3)}, p)
    fs, rel = s4fs.resolve(p)
    m = fs.manifest(rel)
    assert m.size > 4 << 30
    assert m.stored_bytes() < m.size // 20
    back = s4fs.load(p, mmap=False)
    assert torch.equal(back["t"], t) and torch.equal(back["small"], torch.ones(3))
