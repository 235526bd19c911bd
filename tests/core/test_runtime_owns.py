"""The runtime owns what s4fs starts (STYLE 8b, 8c): the threads a save runs on are its
runtime's and stop with it; a save leaves torch as it found it; one function says where
a pipeline's coding runs; one builder makes a new version's manifest."""

from __future__ import annotations

import threading

import torch

import s4fs
from s4fs.coding import IngestConfig
from s4fs.fs import Filesystem, FsConfig
from s4fs.runtime import Runtime
from s4fs.stores import LocalStore
from s4fs.write import IngestSession


def _threads() -> set[threading.Thread]:
    return set(threading.enumerate())


def test_a_sessions_uploads_run_on_its_runtime_and_stop_with_it(tmp_path):
    before = _threads()
    rt = Runtime()
    store = LocalStore(str(tmp_path / "store"))
    s = IngestSession(store, IngestConfig(chunk_size=1 << 12, pack_size=1 << 14),
                      pools=rt.pools)
    data = bytes(range(256)) * 1024
    s.write(data)
    m = s.finish()
    started = {t.name.split("_")[0] for t in _threads() - before}
    assert "s4fs-upload" in started
    assert m.size == len(data) and all(store.head(k).size > 0 for k in m.own_packs)
    rt.close()
    assert not [t for t in _threads() - before if t.is_alive()]


def test_a_save_leaves_torch_as_it_was(tmp_path):
    tag = torch.serialization.location_tag
    store = tmp_path / "store"
    store.mkdir()
    w = torch.randn(1000)
    state = {"a": w[10:], "b": w[:5], "c": torch.zeros(7, dtype=torch.int8),
             "p": torch.nn.Parameter(torch.randn(3, 4)), "step": 3}
    s4fs.save(state, str(store / "ckpt.pt"))
    assert torch.serialization.location_tag is tag
    from s4fs.runtime import current
    from s4fs.torch import save as torchsave
    assert "commit" in current().stages["save"]        # its stages: the runtime's
    assert torchsave.last_stages is current().stages
    ref = tmp_path / "ckpt.pt"
    torch.save(state, str(ref))
    assert s4fs.read_bytes(str(store / "ckpt.pt")) == ref.read_bytes()


def test_a_filesystem_on_its_own_runtime_starts_no_other(tmp_path):
    """Everything a save through a filesystem starts stops when its runtime closes."""
    before = _threads()
    rt = Runtime()
    fs = Filesystem(LocalStore(str(tmp_path / "store")),
                    FsConfig(cache_dir=str(tmp_path / "cache")), runtime=rt)
    s = fs.new_session("x.bin", None)
    s.write(b"\x01" * (5 << 20))
    fs.commit("x.bin", s.finish())
    fs.close()
    rt.close()
    assert not [t.name for t in _threads() - before if t.is_alive()]


def test_one_builder_makes_a_new_versions_manifest():
    from s4fs.manifest import Manifest, ManifestBuilder, Stream, stored_split
    from s4fs.report import stored_split as from_report
    b = ManifestBuilder()
    b.place(0, 10, 0, 0)
    b.place(10, 4, b.add(Stream("tensor", "float32", "data/0")), 0)
    b.place(14, 3, 0, 10)                # the raw stream again: a new extent
    b.place(17, 3, 0, 13)                # contiguous in file and stream: joins it
    m = b.build(size=20, xxh128="0" * 32, kind="raw", names={}, own_packs=[], base=None,
                mtime=1.5)
    assert m.extents == [(0, 10, 0, 0), (10, 4, 1, 0), (14, 6, 0, 10)]
    assert m.mtime_ns == 1_500_000_000 and m.ctime_ns >= m.mtime_ns and m.id
    assert from_report is stored_split
    assert stored_split(m)["stored_full"] == 0
    assert isinstance(m, Manifest)


def test_a_cpu_worker_never_decodes_on_the_gpu(tmp_path, monkeypatch):
    """A chunk with nvCOMP planes (nvCOMP-Deflate: a CPU decodes it too) decoded ahead by
    a CPU worker comes back exact from its CPU, even where a GPU is usable: a CPU worker
    makes no CUDA context (each would hold one), whatever the device setting."""
    import io
    import os
    import pickle

    from emulated_gpu import emulated_gpu
    from s4fs.codec import _device, gpu, inspect
    from s4fs.coding import DecodeJob, _cpu_pool
    from s4fs.read.fill import plan
    emulated_gpu(monkeypatch)
    rt = Runtime()
    store = LocalStore(str(tmp_path / "store"))
    cfg = IngestConfig(device="cuda", gpu_profile="portable", chunk_size=1 << 18)
    buf = io.BytesIO()
    torch.save({"w": torch.randn(1 << 18).to(torch.bfloat16)}, buf)
    data = buf.getvalue()
    s = IngestSession(store, cfg, pools=rt.pools)
    s.write(data)
    m = s.finish()
    rt.close()
    chunks = [c for st in m.streams if st.kind == "tensor" for c in st.chunks]
    assert any(p["codec"] == "nvcomp-deflate" for c in chunks
               for p in inspect(store.get(c.pack)[c.offset: c.offset + c.stored]).planes)

    def on_the_gpu(*a, **k):
        raise AssertionError("a CPU worker decoded on the GPU")
    monkeypatch.setattr(_device, "gpu_available", lambda: True)   # "auto" would use it
    monkeypatch.setattr(gpu, "decompress_planes", on_the_gpu)
    target = tmp_path / "copy"
    target.write_bytes(b"\0" * len(data))
    for batch in plan(m, 1 << 30):
        _cpu_pool.decode_batch(DecodeJob(pickle.dumps(store), str(target), tuple(batch)))
    assert target.read_bytes() == data
    assert os.path.getsize(target) == m.size


def test_one_function_says_where_a_pipeline_runs(monkeypatch):
    from emulated_gpu import emulated_gpu
    from s4fs.coding import CodingPool, placement
    rt = Runtime()
    try:
        cpu = IngestConfig(device="cpu", processes=True, batch_bytes=3 << 20)
        assert placement(cpu) == placement(cpu, spool=True)
        assert placement(cpu).processes and not placement(cpu, spool=False).processes
        assert rt.pools.decode_ahead(IngestConfig(device="cpu"), None, 1 << 30) is None
        pool, batch = rt.pools.decode_ahead(cpu, None, 1 << 30)
        assert isinstance(pool, CodingPool) and batch == 3 << 20
        emulated_gpu(monkeypatch)
        gpu = IngestConfig(device="auto", gpu_batch_bytes=64 << 20)
        assert placement(gpu).gpu and not placement(gpu).gpu_worker
        pool, batch = rt.pools.decode_ahead(gpu, None, 16 << 20)
        assert batch == 16 << 20 and not pool.pids()    # threads of this process
    finally:
        rt.close()
