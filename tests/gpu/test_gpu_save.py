"""s4fs.save / async_save / load of CUDA tensors: coded on the device, exact torch files.

Needs a CUDA GPU with cupy and nvidia-nvcomp (marker ``gpu``); skipped elsewhere. The
same API with CPU tensors is tested in CI by tests/api/test_torch_save_cpu.py.
"""

from __future__ import annotations

import os

import pytest

torch = pytest.importorskip("torch")

from s4fs.codec import gpu  # noqa: E402
from store_damage import damage_packs  # noqa: E402

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not (torch.cuda.is_available() and gpu.is_available()),
                                 reason=f"no GPU codec here ({gpu.unavailable_reason()})")]

GPU_CODECS = {16, 17, 18}


def _adversarial(dtype, n=4096, device="cuda"):
    """Every bit pattern class: random bits, the dtype's specials, zeros, +-0, NaN payloads."""
    g = torch.Generator().manual_seed(hash(str(dtype)) & 0xFFFF)
    isz = torch.empty(0, dtype=dtype).element_size()
    raw = torch.randint(0, 256, (n * isz,), dtype=torch.uint8, generator=g)
    raw[: 64 * isz] = 0xFF
    raw[64 * isz: 128 * isz] = 0
    t = raw.view(dtype)
    return t.to(device)


def _state(device="cuda"):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.GELU(),
                                torch.nn.Linear(512, 256)).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    for _ in range(2):
        model(torch.randn(8, 256, device=device)).square().mean().backward()
        opt.step()
        opt.zero_grad()
    big = torch.randn(1 << 20, device=device).to(torch.bfloat16)
    shared = torch.arange(1000.0, device=device)
    return {"model": model.state_dict(), "opt": opt.state_dict(), "step": 2,
            "bf16": big, "view_a": shared[10:20], "view_b": shared[500:],
            "strided": torch.randn(64, 32, device=device).t(), "empty": torch.zeros(0, device=device),
            "cpu_part": torch.arange(77, dtype=torch.int64),
            "adv": {str(dt): _adversarial(dt, device=device) for dt in
                    (torch.float32, torch.bfloat16, torch.float16, torch.float64, torch.int32,
                     torch.int8, torch.uint8, torch.int64, torch.int16,
                     torch.float8_e4m3fn, torch.float8_e5m2, torch.complex64)}}


def _store(tmp_path):
    d = tmp_path / "store"
    d.mkdir()
    return d


def _gpu_coded(path) -> bool:
    import s4fs
    from s4fs.codec import _container
    fs, rel = s4fs.resolve(path)
    m = fs.manifest(rel)
    for s in m.streams:
        if s.kind == "tensor" and s.chunks:
            blob = fs.source.fetch_blob(s.chunks[0])
            if any(p.codec_id in GPU_CODECS for p in _container.unpack(blob).planes):
                return True
    return False


def test_save_of_cuda_state_is_the_torch_file_and_gpu_coded(tmp_path):
    import s4fs
    sd = _state()
    store = _store(tmp_path)
    s4fs.save(sd, str(store / "ckpt_5.pt"))
    ref = tmp_path / "ref"
    ref.mkdir()
    torch.save(sd, str(ref / "ckpt_5.pt"))
    want = (ref / "ckpt_5.pt").read_bytes()
    assert s4fs.read_bytes(str(store / "ckpt_5.pt")) == want
    assert _gpu_coded(str(store / "ckpt_5.pt"))
    fs, rel = s4fs.resolve(str(store / "ckpt_5.pt"))
    m = fs.manifest(rel)
    assert m.stored_bytes() < m.size
    # a plain torch.load of the stored bytes, and s4fs.load to the GPU, agree
    back = s4fs.load(str(store / "ckpt_5.pt"), map_location="cuda")
    assert back["bf16"].is_cuda and back["bf16"].device == torch.device("cuda", torch.cuda.current_device())
    for k in ("bf16", "view_a", "view_b", "strided", "empty"):
        assert back[k].shape == sd[k].shape and back[k].stride() == sd[k].stride()
        assert torch.equal(back[k].contiguous().view(torch.uint8),
                           sd[k].contiguous().view(torch.uint8))
    assert back["view_a"].untyped_storage().data_ptr() == back["view_b"].untyped_storage().data_ptr()
    for name, t in sd["adv"].items():
        a = back["adv"][name]
        assert a.dtype == t.dtype and torch.equal(a.view(torch.uint8), t.view(torch.uint8)), name
    for k, v in sd["model"].items():
        assert torch.equal(back["model"][k], v)
    assert back["cpu_part"].is_cuda                    # map_location moves every storage
    assert torch.equal(back["cpu_part"].cpu(), sd["cpu_part"])


def test_save_in_many_batches_of_growing_size_is_the_torch_file(tmp_path):
    """Small first batches, then full ones; CPU storages among the CUDA ones are coded
    after them: the file and the load are the same as in one batch."""
    import s4fs
    from s4fs.torch import save as torchsave
    config = torchsave.SaveConfig(gpu_first_batches=(1 << 20, 3 << 20), gpu_batch_bytes=5 << 20)
    torch.manual_seed(3)
    sd = {f"t{i}": (torch.randn(300_000 + 4099 * i, device="cuda").to(
        torch.bfloat16 if i % 2 else torch.float32)) for i in range(8)}
    sd["cpu_step"] = torch.tensor(7.0)
    sd["cpu_big"] = torch.randn(600_000)
    sd["adv"] = _adversarial(torch.float32, n=1 << 20)
    store = _store(tmp_path)
    s4fs.save(sd, str(store / "ckpt_9.pt"), config=config)
    assert torchsave.last_stages["save"]["GPU coding (blobs in pinned memory)"] > 0
    ref = tmp_path / "ckpt_9.pt"
    torch.save(sd, str(ref))
    assert s4fs.read_bytes(str(store / "ckpt_9.pt")) == ref.read_bytes()
    back = s4fs.load(str(store / "ckpt_9.pt"), map_location="cuda")
    for k, v in sd.items():
        assert torch.equal(back[k].cpu().reshape(-1).view(torch.uint8),
                           v.cpu().reshape(-1).view(torch.uint8)), k


def test_load_to_cuda_of_a_cpu_saved_delta_chain(tmp_path):
    """The oldest of three saves, re-expressed backward (deltas on the next, which is
    deltas on the newest), loads to the GPU exactly."""
    import s4fs
    store = _store(tmp_path)
    torch.manual_seed(1)
    w = torch.randn(1 << 20)
    first = None
    for step in range(3):
        w[: 1000] += 1e-3
        first = w.clone() if first is None else first
        s4fs.save({"w": w.clone(), "step": step}, str(store / f"ckpt_{step}.pt"))
    fs, rel = s4fs.resolve(str(store / "ckpt_0.pt"))
    assert fs.settle_deltas(60)
    assert max(c.depth for s in fs.manifest(rel, fresh=True).streams for c in s.chunks) == 2
    back = s4fs.load(str(store / "ckpt_0.pt"), map_location="cuda:0")
    assert back["w"].is_cuda and torch.equal(back["w"].cpu(), first)


def _stream(m, name):
    return next(s for s in m.streams if s.name == name)


def test_consecutive_cuda_saves_are_deltas_exact_and_unchanged_tensors_cost_nothing(tmp_path):
    """With forward deltas, ckpt_2 of a CUDA state is coded against ckpt_1 on the device:
    a tensor that did not change is stored as the base's own chunks, a slightly trained
    one as a small delta, adversarial bits exactly; the file is torch.save's, and it
    still loads once its base is deleted and the store collected."""
    import s4fs
    import s4fs.api
    from s4fs import gc
    from s4fs.fs import FsConfig
    store = _store(tmp_path)
    s4fs.filesystem(str(store), FsConfig(decoded_cache_bytes=0, delta_direction="forward"))
    torch.manual_seed(5)
    sd = {"frozen": torch.randn(3 << 20, device="cuda").to(torch.bfloat16),
          "w": torch.randn(3 << 20, device="cuda"),
          "adv": {str(dt): _adversarial(dt, n=1 << 16) for dt in
                  (torch.float32, torch.bfloat16, torch.float16, torch.int64, torch.uint8)},
          "cpu_big": torch.randn(1 << 20), "step": 1}
    s4fs.save(sd, str(store / "ckpt_1.pt"))
    with torch.no_grad():
        sd["w"][: 1 << 16].add_(1e-3)                 # one step touches a little of w
        for t in sd["adv"].values():
            t.view(torch.uint8)[::97] ^= 0x5A            # and flips adversarial bits
        sd["cpu_big"][:1000] += 1
    sd["step"] = 2
    s4fs.save(sd, str(store / "ckpt_2.pt"))
    ref = tmp_path / "ckpt_2.pt"
    torch.save(sd, str(ref))
    want = ref.read_bytes()
    assert s4fs.read_bytes(str(store / "ckpt_2.pt")) == want

    fs, _ = s4fs.resolve(str(store / "ckpt_2.pt"))
    m1, m2 = fs.manifest("ckpt_1.pt"), fs.manifest("ckpt_2.pt")
    assert m2.base is not None and m2.base["id"] == m1.id
    key = {n: k for k, n in m2.names.items()}          # tensor name -> record
    f1, f2 = _stream(m1, key["frozen"]), _stream(m2, key["frozen"])
    assert [(c.pack, c.offset) for c in f2.chunks] == [(c.pack, c.offset) for c in f1.chunks]
    w1, w2 = _stream(m1, key["w"]), _stream(m2, key["w"])   # 3 chunks: the first changed
    assert w2.chunks[0].base is not None and w2.chunks[0].depth == 1
    assert w2.chunks[0].stored < 0.3 * w1.chunks[0].stored
    assert [(c.pack, c.offset) for c in w2.chunks[1:]] == [(c.pack, c.offset) for c in w1.chunks[1:]]
    own = sum(c.stored for s in m2.streams for c in s.chunks if c.pack in set(m2.own_packs))
    assert own < 0.5 * m1.stored_bytes()

    back = s4fs.load(str(store / "ckpt_2.pt"), map_location="cuda")
    for name, t in sd["adv"].items():
        assert torch.equal(back["adv"][name].view(torch.uint8), t.view(torch.uint8)), name
    assert torch.equal(back["w"], sd["w"]) and torch.equal(back["frozen"], sd["frozen"])
    assert torch.equal(back["cpu_big"].cpu(), sd["cpu_big"])

    fs.unlink("ckpt_1.pt")
    gc.collect(fs.store, grace=0)
    s4fs.api.close_all()                               # no cached packs: the store's
    assert s4fs.read_bytes(str(store / "ckpt_2.pt")) == want
    assert torch.equal(s4fs.load(str(store / "ckpt_2.pt"), map_location="cuda")["w"], sd["w"])


def test_delta_chains_of_cuda_saves_stay_bounded_and_every_version_exact(tmp_path):
    import s4fs
    store = _store(tmp_path)
    torch.manual_seed(6)
    w = torch.randn(2 << 20, device="cuda")
    saved = []
    for step in range(7):
        with torch.no_grad():
            w[step * 1000: step * 1000 + 500] += 1e-2
        s4fs.save({"w": w, "step": step}, str(store / f"ckpt_{step}.pt"))
        saved.append(w.clone())
    fs, _ = s4fs.resolve(str(store / "ckpt_0.pt"))
    limit = fs.cfg.ingest.max_delta_depth
    depths = [max(c.depth for s in fs.manifest(f"ckpt_{k}.pt").streams for c in s.chunks)
              for k in range(7)]
    assert max(depths) <= limit and max(depths) >= 2
    for k in range(7):
        assert torch.equal(s4fs.load(str(store / f"ckpt_{k}.pt"), map_location="cuda")["w"], saved[k])


@pytest.mark.parametrize("how", ["corrupt", "missing"])
def test_a_damaged_base_does_not_stop_the_next_cuda_save(tmp_path, monkeypatch, caplog, how):
    """The previous checkpoint's packs rotted (its chunks fail their checksums when the
    device save decodes them as bases) or deleted (the base is passed over): the next
    save of CUDA state still commits, coded in full, warns once naming `s4fs verify`,
    and is torch.save's file; the damaged checkpoint still refuses to read."""
    import s4fs
    from s4fs.coding import _bases as delta
    from s4fs.errors import S4Error
    from s4fs.stores import LocalStore
    monkeypatch.setattr(delta, "PACKS_SEEN_TTL", 0.0)   # the damage came long after
    store = _store(tmp_path)
    torch.manual_seed(7)
    sd = {"w": torch.randn(3 << 20, device="cuda"),
          "frozen": torch.randn(1 << 20, device="cuda").to(torch.bfloat16), "step": 0}
    s4fs.save(sd, str(store / "ckpt_0.pt"))
    fs, _ = s4fs.resolve(str(store / "ckpt_0.pt"))
    m0 = fs.manifest("ckpt_0.pt")
    damage_packs(LocalStore(str(store)), m0.own_packs, how)
    with torch.no_grad():
        sd["w"][:1000] += 1
    sd["step"] = 1
    with caplog.at_level("WARNING", logger="s4fs.ingest"):
        s4fs.save(sd, str(store / "ckpt_1.pt"))
    ref = tmp_path / "ckpt_1.pt"
    torch.save(sd, str(ref))
    assert s4fs.read_bytes(str(store / "ckpt_1.pt")) == ref.read_bytes()
    m1 = fs.manifest("ckpt_1.pt")
    assert all(c.pack not in m0.own_packs and c.base is None
               for s in m1.streams for c in s.chunks)
    assert "s4fs verify" in caplog.text and "ckpt_0.pt" in caplog.text
    back = s4fs.load(str(store / "ckpt_1.pt"), map_location="cuda")
    assert torch.equal(back["w"], sd["w"]) and torch.equal(back["frozen"], sd["frozen"])
    with pytest.raises(S4Error):
        s4fs.read_bytes(str(store / "ckpt_0.pt"))


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two GPUs")
def test_a_rank_on_its_own_gpu_codes_and_decodes_there_alone(tmp_path):
    """A process whose GPU is not device 0 (every rank but one on a multi-GPU node):
    its save, delta save (async) and GPU load give back exact bytes on its GPU, and no
    thread of s4fs's — the hash thread, the async save's, the reads ahead of a load —
    puts a byte on device 0 (a new thread starts there)."""
    import json
    import subprocess
    import sys
    import textwrap
    store = _store(tmp_path)
    code = textwrap.dedent(f"""
        import json, cupy, torch, s4fs
        torch.cuda.set_device(1)
        store = {str(store)!r}
        torch.manual_seed(3)
        sd = {{"w": torch.randn(8 << 20, device="cuda"),
               "h": torch.randn(1 << 20, device="cuda").to(torch.bfloat16)}}
        s4fs.save(sd, store + "/ckpt_0.pt")
        with torch.no_grad():
            sd["w"][:4096] += 1
        s4fs.async_save(sd, store + "/ckpt_1.pt").result()
        back = s4fs.load(store + "/ckpt_1.pt", map_location="cuda")
        exact = (back["w"].device.index == 1 and torch.equal(back["w"], sd["w"])
                 and torch.equal(back["h"], sd["h"]))
        fs, _ = s4fs.resolve(store + "/ckpt_1.pt")
        delta = fs.manifest("ckpt_1.pt").base is not None
        with cupy.cuda.Device(0):
            on0 = cupy.get_default_memory_pool().total_bytes()
        print(json.dumps({{"exact": exact, "delta": delta, "device0_bytes": on0}}))
    """)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env=env, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got == {"exact": True, "delta": True, "device0_bytes": 0}, got


def test_cuda_saves_without_deltas_when_the_store_says_so(tmp_path):
    import s4fs
    from s4fs.api import filesystem
    from s4fs.fs import FsConfig
    store = _store(tmp_path)
    filesystem(str(store), FsConfig(delta=False))
    w = torch.randn(1 << 20, device="cuda")
    for step in range(2):
        s4fs.save({"w": w}, str(store / f"ckpt_{step}.pt"))
    fs, _ = s4fs.resolve(str(store / "ckpt_1.pt"))
    m = fs.manifest("ckpt_1.pt")
    assert m.base is None and all(c.base is None for s in m.streams for c in s.chunks)
    assert torch.equal(s4fs.load(str(store / "ckpt_1.pt"), map_location="cuda")["w"], w)


def test_async_save_snapshots_cuda_state_then_training_may_change_it(tmp_path):
    import s4fs
    store = _store(tmp_path)
    sd = _state()
    ref = tmp_path / "ref"
    ref.mkdir()
    torch.save(sd, str(ref / "a.pt"))
    fut = s4fs.async_save(sd, str(store / "a.pt"))
    with torch.no_grad():                       # training moves on at once
        sd["bf16"].add_(1)
        for v in sd["model"].values():
            v.mul_(-1)
    assert fut.result(timeout=300) is None
    assert s4fs.read_bytes(str(store / "a.pt")) == (ref / "a.pt").read_bytes()


def test_async_save_cuda_oom_in_the_snapshot_is_in_the_future_and_commits_nothing(tmp_path):
    import s4fs
    store = _store(tmp_path)
    sd = {"w": torch.randn(64 << 20, device="cuda")}        # 256 MiB
    free, _ = torch.cuda.mem_get_info()
    hog = torch.empty(free - (128 << 20), dtype=torch.uint8, device="cuda")
    try:
        fut = s4fs.async_save(sd, str(store / "oom.pt"))
        with pytest.raises(torch.OutOfMemoryError):
            fut.result(timeout=60)
    finally:
        del hog
        torch.cuda.empty_cache()
    assert not os.path.exists(store / "oom.pt")
    fs, _ = s4fs.resolve(str(store / "x.pt"), create=True)
    assert not fs.exists("oom.pt")


def test_async_save_device_oom_while_coding_is_in_the_future_and_commits_nothing(tmp_path):
    import cupy
    import s4fs
    store = _store(tmp_path)
    sd = {"w": torch.randn(16 << 20, device="cuda")}
    pool = cupy.get_default_memory_pool()
    pool.free_all_blocks()
    pool.set_limit(size=1 << 20)
    try:
        fut = s4fs.async_save(sd, str(store / "oom2.pt"))
        with pytest.raises(Exception) as info:
            fut.result(timeout=120)
        assert "memory" in str(info.value).lower() or "OutOfMemory" in type(info.value).__name__
    finally:
        pool.set_limit(size=0)
    fs, _ = s4fs.resolve(str(store / "x.pt"), create=True)
    assert not fs.exists("oom2.pt")
    # and the next save works
    s4fs.save(sd, str(store / "ok.pt"))
    assert torch.equal(s4fs.load(str(store / "ok.pt"), map_location="cuda")["w"], sd["w"])


# --------------------------------------------------------------------------- GPU worker

@pytest.mark.parametrize("direction", ["forward", "backward"])
@pytest.mark.parametrize("processes", [False, True], ids=["in-process", "gpu-process"])
def test_gpu_worker_series_exact_with_deltas_and_decode_ahead(tmp_path, processes, direction):
    """The data pipeline's GPU worker on a real GPU: a series of torch files (CPU state,
    as the mount receives it) coded in batches on the device, deltas from the second on
    (forward), or the older ones re-expressed as deltas on the newer (backward: the GPU
    planes decoded, the deltas coded on the CPU), read back exactly here and on a cold
    node that decodes ahead on the GPU. With ``processes`` (as a mount runs) in the GPU
    worker process, fed from spool files."""
    import io

    from s4fs.fs import Filesystem, FsConfig
    from s4fs.coding import IngestConfig
    from s4fs.runtime import Runtime
    from s4fs.stores import LocalStore
    rt = Runtime()
    cfg = FsConfig(ingest=IngestConfig(device="cuda", gpu_batch_bytes=8 << 20,
                                       processes=processes),
                   cache_dir=str(tmp_path / "cache"), delta_direction=direction)
    fs = Filesystem(LocalStore(str(tmp_path / "store")), cfg, runtime=rt)
    sd = {k: v.cpu() for k, v in _state().items() if hasattr(v, "cpu")}
    sd.update({str(dt): _adversarial(dt, 1 << 19, "cpu")
               for dt in (torch.bfloat16, torch.float16, torch.float32, torch.int64)})
    series = []
    try:
        fs.mkdir("run")
        for step in range(3):
            b = io.BytesIO()
            torch.save(sd, b)
            series.append(b.getvalue())
            if processes:
                _save_from_spool(fs, f"run/ckpt_{step}.pt", series[-1])
            else:
                h = fs.open_write(f"run/ckpt_{step}.pt")
                h.write(0, series[-1])
                h.flush()
                h.release()
            for k in list(sd):
                if sd[k].is_floating_point() and sd[k].numel():
                    t = sd[k].contiguous().clone()
                    t.view(-1)[::5] += 1e-3
                    sd[k] = t
        assert fs.settle_deltas(120)
        m = [fs.manifest(f"run/ckpt_{i}.pt", fresh=True) for i in range(3)]
        codecs = {p["codec"] for st in m[2].streams if st.kind == "tensor"
                  for c in st.chunks if c.base is None for p in _planes_of(fs, c)}
        assert codecs & {"nvcomp-ans", "nvcomp-gdeflate"}, codecs
        if direction == "forward":
            assert m[2].base is not None and m[2].stored_bytes() < m[0].stored_bytes()
        else:                       # the newest whole, the oldest deltas on the next
            assert all(c.base is None for st in m[2].streams for c in st.chunks)
            assert max(c.depth for st in m[0].streams for c in st.chunks) == 2
            assert m[0].stored_bytes() < m[2].stored_bytes()
        for i, data in enumerate(series):
            r = fs.open_read(f"run/ckpt_{i}.pt")
            assert r.read(0, len(data)) == data
            r.release()
    finally:
        fs.close()
    rt.pools.close()
    cold = Filesystem(LocalStore(str(tmp_path / "store")),
                      FsConfig(ingest=IngestConfig(device="cuda", processes=processes),
                               cache_dir=str(tmp_path / "cold")), runtime=rt)
    try:
        data = series[-1]
        r = cold.open_read("run/ckpt_2.pt")
        tail = r.read(len(data) - 22, 22)
        got = bytearray()
        while len(got) < len(data):
            got += r.read(len(got), 1 << 20)
        assert r._fill is not None or r._fd is not None, "no decode ahead started"
        r.release()
        assert bytes(got) == data and tail == data[-22:]
        if processes:
            assert rt.pools.gpu().pids(), "the GPU worker process decoded nothing"
    finally:
        cold.close()
        rt.close()


def _save_from_spool(fs, path: str, data: bytes) -> None:
    """Save as the mount does: the bytes in a spool file, the session fed its prefix
    (so the chunks go to the GPU worker process as spool ranges), then the commit."""
    from s4fs.write import Spool
    sp = Spool(fs.spool_dir, path)
    sp.write(0, data)
    s = fs.new_session(path, fs.manifest(path) if fs.exists(path) else None, sp.name)
    assert s._proc is not None, "the session should code in the GPU worker process"
    pos = 0
    while pos < len(data):
        piece = sp.read(pos, 1 << 20)
        s.write(piece, stable=True)
        pos += len(piece)
    fs.commit(path, s.finish())
    sp.close()


def _planes_of(fs, ref):
    from s4fs.codec import inspect
    return inspect(fs.source.fetch_blob(ref)).planes
