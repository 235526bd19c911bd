"""s4fs.save / async_save / load with CPU tensors: the stored file is byte for byte what
torch.save writes to a local file of the same name (archive folder, CRCs, serialization
id), deltas still apply, async_save snapshots. The device-side whole-file hash and CRCs
are checked here on the CPU through the kernel emulator."""

from __future__ import annotations

import zlib

import numpy as np
import pytest
import xxhash

torch = pytest.importorskip("torch")

import s4fs  # noqa: E402
from s4fs.parse import layout as torch_layout  # noqa: E402
from s4fs.torch import load as torch_load  # noqa: E402
from s4fs.torch import save as torch_save  # noqa: E402


def _adversarial(dtype, n=2048):
    g = torch.Generator().manual_seed(7)
    isz = torch.empty(0, dtype=dtype).element_size()
    raw = torch.randint(0, 256, (n * isz,), dtype=torch.uint8, generator=g)
    raw[: 32 * isz] = 0xFF
    raw[32 * isz: 64 * isz] = 0
    return raw.view(dtype)


def _state():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(128, 256), torch.nn.Linear(256, 8))
    opt = torch.optim.AdamW(model.parameters())
    model(torch.randn(4, 128)).sum().backward()
    opt.step()
    shared = torch.arange(300.0)
    return {"model": model.state_dict(), "opt": opt.state_dict(), "step": 1,
            "a": shared[5:50], "b": shared[100:], "t": torch.randn(40, 30).t(),
            "empty": torch.zeros(0), "scalar": torch.tensor(3.5),
            "adv": {str(dt): _adversarial(dt) for dt in
                    (torch.float32, torch.bfloat16, torch.float16, torch.float64, torch.int8,
                     torch.uint8, torch.int16, torch.int32, torch.int64, torch.bool,
                     torch.float8_e4m3fn, torch.float8_e5m2, torch.complex64)}}


def _ref(tmp_path, obj, name, **kw):
    d = tmp_path / "ref"
    d.mkdir(exist_ok=True)
    torch.save(obj, str(d / name), **kw)
    return (d / name).read_bytes()


@pytest.mark.parametrize("name", ["ckpt_100.pt", "model.bin", "noext", "grüße.pt"])
def test_save_is_byte_identical_to_torch_save_of_the_same_name(tmp_path, name):
    store = tmp_path / "store"
    store.mkdir()
    sd = _state()
    s4fs.save(sd, str(store / name))
    assert s4fs.read_bytes(str(store / name)) == _ref(tmp_path, sd, name)
    back = s4fs.load(str(store / name))
    assert torch.equal(back["model"]["0.weight"], sd["model"]["0.weight"])
    assert back["a"].untyped_storage().data_ptr() == back["b"].untyped_storage().data_ptr()
    for k, t in sd["adv"].items():
        assert torch.equal(back["adv"][k].view(torch.uint8), t.view(torch.uint8)), k
    fs, rel = s4fs.resolve(str(store / name))
    m = fs.manifest(rel)
    assert m.kind == "torch-zip" and m.stored_bytes() < m.size


def test_save_keeps_torch_save_options(tmp_path):
    store = tmp_path / "store"
    store.mkdir()
    sd = {"w": torch.randn(1000)}
    s4fs.save(sd, str(store / "p4.pt"), pickle_protocol=4)
    assert s4fs.read_bytes(str(store / "p4.pt")) == _ref(tmp_path, sd, "p4.pt", pickle_protocol=4)
    # the legacy format cannot be laid out by skip_data: streamed, still loadable
    s4fs.save(sd, str(store / "old.pt"), _use_new_zipfile_serialization=False)
    assert torch.equal(s4fs.load(str(store / "old.pt"))["w"], sd["w"])


def test_second_save_stores_the_first_as_a_delta_on_it_and_both_exact(tmp_path):
    store = tmp_path / "store"
    store.mkdir()
    w = torch.randn(1 << 20)
    s4fs.save({"w": w}, str(store / "ckpt_1.pt"))
    w2 = w.clone()
    w2[:100] += 1
    s4fs.save({"w": w2}, str(store / "ckpt_2.pt"))
    fs, rel = s4fs.resolve(str(store / "ckpt_2.pt"))
    assert fs.settle_deltas(60)                  # the re-expression runs in the background
    newest, older = fs.manifest(rel, fresh=True), fs.manifest("ckpt_1.pt", fresh=True)
    assert not any(c.base is not None for s in newest.streams for c in s.chunks)
    assert any(c.base is not None for s in older.streams for c in s.chunks)
    assert older.stored_bytes() < 0.2 * older.size
    assert s4fs.read_bytes(str(store / "ckpt_2.pt")) == _ref(tmp_path, {"w": w2}, "ckpt_2.pt")
    assert s4fs.read_bytes(str(store / "ckpt_1.pt")) == _ref(tmp_path, {"w": w}, "ckpt_1.pt")


def test_async_save_snapshots_then_the_tensors_may_change(tmp_path):
    store = tmp_path / "store"
    store.mkdir()
    sd = _state()
    want = _ref(tmp_path, sd, "a.pt")
    fut = s4fs.async_save(sd, str(store / "a.pt"))
    with torch.no_grad():
        for v in sd["model"].values():
            v.add_(1)
        sd["a"].zero_()
    assert fut.result(timeout=120) is None
    assert s4fs.read_bytes(str(store / "a.pt")) == want


def test_async_save_failure_is_in_the_future_and_commits_nothing(tmp_path):
    store = tmp_path / "store"
    store.mkdir()
    s4fs.save({"x": torch.ones(3)}, str(store / "f.pt"))
    # "f.pt" is a file: nothing can be saved under it
    fut = s4fs.async_save({"x": torch.ones(3)}, str(store / "f.pt" / "sub.pt"))
    with pytest.raises(Exception):
        fut.result(timeout=60)
    fs, _ = s4fs.resolve(str(store / "f.pt"))
    assert fs.exists("f.pt") and not fs.exists("f.pt/sub.pt")
    assert torch.equal(s4fs.load(str(store / "f.pt"))["x"], torch.ones(3))


def test_a_store_failure_in_the_background_is_in_the_future(tmp_path, monkeypatch):
    store = tmp_path / "store"
    store.mkdir()
    s4fs.save({"x": torch.ones(3)}, str(store / "seed.pt"))
    fs, _ = s4fs.resolve(str(store / "seed.pt"))
    real = fs.store.put_parts

    def broken(key, parts, *a, **k):
        if key.startswith("packs/") or "pack" in key:
            raise OSError("injected: the bucket refused the upload")
        return real(key, parts, *a, **k)
    monkeypatch.setattr(fs.store, "put_parts", broken)
    fut = s4fs.async_save({"y": torch.randn(1 << 18)}, str(store / "y.pt"))
    with pytest.raises(OSError, match="injected"):
        fut.result(timeout=60)
    monkeypatch.setattr(fs.store, "put_parts", real)
    assert not fs.exists("y.pt")


# ------------------------------------------------------------- device math, emulated

def _emu():
    from s4fs.codec.gpu import _emulate
    if _emulate.compiler() is None:
        pytest.skip("no C++ compiler to emulate the GPU kernels")
    from s4fs.codec.gpu._backend import EmulatedBackend
    return EmulatedBackend()


@pytest.mark.parametrize("misalign", [0, 1, 5])
def test_device_whole_file_hash_and_crcs_match_the_torch_file(tmp_path, misalign):
    from s4fs.codec.gpu import _wholefile as W
    b = _emu()
    sd = _state()
    sd["big"] = torch.randn(70000)
    lay = torch_save.layout(sd, "h.pt")
    views = [torch_save.storage_bytes(st) for st in lay.storages]
    keep: list = []
    dev = []
    for v in views:                               # "device" copies, deliberately misaligned
        arr = b.empty(len(v) + 8)[misalign: misalign + len(v)]
        arr[:] = np.frombuffer(v, dtype=np.uint8)
        keep.append(arr)
        dev.append(arr)
    crcs = W.crc32_many(b, [b.ptr(a) for a in dev], [len(v) for v in views])
    assert crcs == [zlib.crc32(v) for v in views]
    torch_layout.finish_layout(lay, crcs)
    pieces = []
    for off, (kind, what) in lay.pieces():
        if kind == "host":
            pieces.append((off, len(what), what))
        else:
            pieces.append((off, len(views[what]), b.ptr(dev[what])))
    want = _ref(tmp_path, sd, "h.pt")
    assert W.xxh3_128_pieces(b, pieces, lay.size, keep) == xxhash.xxh3_128(want).hexdigest()
    assert W.crc32_of_zeros(123457) == zlib.crc32(bytes(123457))


def test_zip_metadata_is_read_from_the_raw_stream_only(tmp_path):
    """What s4fs.load(map_location='cuda') reads before decoding on the device: the zip's
    directory and small records, never a tensor chunk (tensor bytes read as zeros)."""
    import io
    import zipfile
    store = tmp_path / "store"
    store.mkdir()
    sd = _state()
    s4fs.save(sd, str(store / "z.pt"))
    fs, rel = s4fs.resolve(str(store / "z.pt"))
    m = fs.manifest(rel)
    want = _ref(tmp_path, sd, "z.pt")
    fs.source._lru.clear()
    with io.BufferedReader(torch_load._RawOnly(fs, rel, m), 1 << 16) as f:
        with zipfile.ZipFile(f) as z:
            pkl = z.read("z/data.pkl")
            names = z.namelist()
    with zipfile.ZipFile(io.BytesIO(want)) as z:
        assert pkl == z.read("z/data.pkl") and names == z.namelist()
    tensor_keys = {c.key() for s in m.streams if s.kind == "tensor" for c in s.chunks}
    assert not tensor_keys & set(fs.source._lru)      # no tensor chunk was decoded


@pytest.mark.parametrize("uploads", [None, 16])
def test_pack_writer_keeps_at_most_its_bound_of_packs_in_flight(tmp_path, uploads):
    """A device save writes up to 16 packs at once (views of its pinned batch, no copies);
    every other writer keeps the config's bound. Every pack lands, with its bytes."""
    import threading
    import time
    from s4fs.coding import IngestConfig
    from s4fs.write import PackWriter
    from s4fs.stores.local import LocalStore

    class Slow(LocalStore):
        def __init__(self, root):
            super().__init__(root)
            self.lock, self.now, self.most = threading.Lock(), 0, 0

        def put_parts(self, key, parts):
            with self.lock:
                self.now += 1
                self.most = max(self.most, self.now)
            time.sleep(0.05)
            try:
                super().put_parts(key, parts)
            finally:
                with self.lock:
                    self.now -= 1

    store = Slow(str(tmp_path))
    cfg = IngestConfig(pack_size=1 << 10, max_uploads=4)
    w = PackWriter(store, cfg, uploads=uploads)
    blobs = [bytes([k]) * 1000 for k in range(40)]
    where = [w.add(b) for b in blobs]
    w.finish()
    assert store.most == (uploads or 4)
    for (key, off), b in zip(where, blobs):
        assert store.get(key)[off: off + len(b)] == b
