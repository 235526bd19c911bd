"""Delta chains: consecutive checkpoints stored as XOR deltas, safe deletes, GC."""

from __future__ import annotations

import hashlib
import io
import itertools
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest
import torch

import s4fs
from s4fs.report import file_report
from s4fs.fs import Filesystem, FsConfig
from s4fs.gc import collect
from s4fs.coding import IngestConfig
from s4fs.stores import LocalStore


def tbytes(obj, name: str | None = None) -> bytes:
    """torch.save's bytes: to a file object, or (``name``) to a local file of that name,
    which is what s4fs.save stores at a path ending in that name."""
    if name is None:
        b = io.BytesIO()
        torch.save(obj, b)
        return b.getvalue()
    import tempfile
    with tempfile.TemporaryDirectory() as d:
        torch.save(obj, os.path.join(d, name))
        with open(os.path.join(d, name), "rb") as f:
            return f.read()


def put(fs, path, data: bytes):
    parts = path.split("/")[:-1]
    for i in range(1, len(parts) + 1):
        if not fs.exists("/".join(parts[:i])):
            fs.mkdir("/".join(parts[:i]))
    h = fs.open_write(path)
    h.write(0, data)
    h.flush()
    h.release()


def get(fs, path) -> bytes:
    r = fs.open_read(path)
    return r.read(0, fs.stat(path).size)


def chain_len(ref) -> int:
    n = 0
    while ref.base is not None:
        n += 1
        ref = ref.base
    return n


def series(n=5, size=1 << 18, seed=0):
    """A slowly drifting fp32 'weight' plus a bf16 copy and a frozen tensor."""
    rng = np.random.default_rng(seed)
    w = rng.standard_normal(size).astype(np.float32)
    frozen = torch.from_numpy(rng.standard_normal(size).astype(np.float32))
    out = []
    for i in range(n):
        w = w + rng.standard_normal(size).astype(np.float32) * 1e-3 * (rng.random(size) < 0.2)
        t = torch.from_numpy(w.copy())
        out.append({"w": t, "w16": t.to(torch.bfloat16), "frozen": frozen, "step": i})
    return [tbytes(o) for o in out]


def make_fs(root, direction="forward", **ingest):
    """Forward deltas unless told (these tests are about forward chains and the rule;
    backward deltas: tests/core/test_backward.py). Pairs off: the series' bf16 copy is
    here to be a delta on its previous version, not on its master (test_pairs.py)."""
    ingest.setdefault("pairs", False)
    cfg = FsConfig(ingest=IngestConfig(chunk_size=1 << 16, **ingest),
                   delta_direction=direction)
    return Filesystem(LocalStore(root), cfg)


def test_delta_is_smaller_and_exact(tmp_path):
    fs = make_fs(tmp_path / "s")
    data = series()
    for i, d in enumerate(data):
        put(fs, f"run/ckpt_{i * 100}.pt", d)
    sizes = [fs.manifest(f"run/ckpt_{i * 100}.pt").stored_bytes() for i in range(len(data))]
    assert all(s < 0.6 * sizes[0] for s in sizes[1:]), sizes
    for i, d in enumerate(data):
        assert get(fs, f"run/ckpt_{i * 100}.pt") == d
    r = file_report(fs, "run/ckpt_200.pt")
    assert r["base"] == "run/ckpt_100.pt" and r["stored_delta"] > 0
    frozen = next(t for t in r["tensors"] if t["name"] == "frozen")
    assert frozen["stored"] == 0                     # unchanged: a reference only
    fs.close()


@pytest.mark.parametrize("processes", [False, True], ids=["threads", "workers"])
def test_delta_bases_come_from_the_previous_versions_local_copy(tmp_path, processes):
    """The previous checkpoint, just saved, is kept whole on local disk: the next save's
    delta bases are read from that copy (checked against their checksums), not decoded
    again from the store — in the daemon's threads (``--workers 0``) as in the worker
    processes — and the new file reads back exact."""
    fs = make_fs(str(tmp_path / "s"), processes=processes, workers=2)
    try:
        data = series(2)
        put(fs, "ckpt_0.pt", data[0])
        assert fs.decoded.path_of(fs.manifest("ckpt_0.pt").id) is not None
        decoded_from_store = []
        real_get = fs.source.get
        fs.source.get = lambda ref, *a, **k: (decoded_from_store.append(ref),
                                             real_get(ref, *a, **k))[1]
        put(fs, "ckpt_1.pt", data[1])
        m1 = fs.manifest("ckpt_1.pt")
        assert any(c.base is not None for st in m1.streams for c in st.chunks)
        assert decoded_from_store == []
    finally:
        fs.close()
    fresh = Filesystem(LocalStore(str(tmp_path / "s")), FsConfig(decoded_cache_bytes=0))
    try:
        assert get(fresh, "ckpt_1.pt") == data[1]
    finally:
        fresh.close()


@pytest.mark.parametrize("depth", [1, 2, 3])
def test_depth_bound(tmp_path, depth):
    # the read budget (max_chain_read) bounds chains too: out of the way here
    fs = make_fs(tmp_path / "s", max_delta_depth=depth, max_chain_read=100.0)
    data = series(7)
    for i, d in enumerate(data):
        put(fs, f"c/step-{i}.pt", d)
    longest = 0
    for i, d in enumerate(data):
        m = fs.manifest(f"c/step-{i}.pt")
        longest = max(longest, max(chain_len(c) for s in m.streams for c in s.chunks))
        assert get(fs, f"c/step-{i}.pt") == d
    assert longest == depth                          # reached, never exceeded
    fs.close()


def dense_series(n=4, size=1 << 18, seed=1):
    """Every weight moves every step, as in dense training: an XOR delta keeps about
    half the bytes of the whole coding (worth storing only while chains stay short)."""
    rng = np.random.default_rng(seed)
    w = rng.standard_normal(size).astype(np.float32)
    out = []
    for i in range(n):
        w = w + rng.standard_normal(size).astype(np.float32) * 1e-4
        out.append(tbytes({"w": torch.from_numpy(w.copy()), "step": i}))
    return out


def chain_stored(ref) -> tuple[int, int]:
    total = 0
    while ref.base is not None:
        total += ref.stored
        ref = ref.base
    return total + ref.stored, ref.stored


@pytest.mark.parametrize("budget", [None, 1.0, 2.0, 100.0])
def test_chains_keep_within_their_read_budget(tmp_path, budget):
    """A chunk's delta chain (root blob + every delta on it) never holds more than
    max_chain_read times its root's stored bytes — what a node with nothing cached
    fetches for it — and every version reads back exactly; a larger budget still
    stores deltas, 1.0 none."""
    kw = {} if budget is None else {"max_chain_read": budget}
    fs = make_fs(tmp_path / "s", **kw)
    limit = fs.cfg.ingest.max_chain_read
    assert budget is not None or limit == 1.25                   # the default
    data = dense_series()
    for i, d in enumerate(data):
        put(fs, f"run/ckpt_{i}.pt", d)
    deltas, worst = 0, 0.0
    for i, d in enumerate(data):
        m = fs.manifest(f"run/ckpt_{i}.pt")
        blobs = {}
        for st in m.streams:
            for c in st.chunks:
                total, root = chain_stored(c)
                worst = max(worst, total / root)
                deltas += c.base is not None
                while c is not None:
                    blobs[c.key()] = c.stored
                    c = c.base
        # what `s4fs stat` says a fresh node fetches: every blob of every chain, once
        assert file_report(fs, f"run/ckpt_{i}.pt")["read_cold"] == sum(blobs.values())
        assert get(fs, f"run/ckpt_{i}.pt") == d
    assert worst <= limit, (worst, limit)
    if limit == 1.0:
        assert deltas == 0
    if limit >= 2.0:
        assert deltas > 0 and worst > 1.25        # the dense deltas this budget allows
    fs.close()


def test_an_unchanged_chunk_reuses_its_base_whatever_the_budget(tmp_path):
    """Identical chunks cost nothing to store or read: a budget of 1 does not turn them
    into copies."""
    fs = make_fs(tmp_path / "s", max_chain_read=1.0)
    data = series(3)
    for i, d in enumerate(data):
        put(fs, f"run/ckpt_{i}.pt", d)
    first, last = fs.manifest("run/ckpt_0.pt"), fs.manifest("run/ckpt_2.pt")
    reused = [a.name for a, b in zip(first.streams, last.streams)
              if a.kind == "tensor" and [c.key() for c in a.chunks] == [c.key() for c in b.chunks]]
    assert len(reused) == 1, reused                    # the frozen tensor, and only it
    assert not any(c.base for st in last.streams for c in st.chunks)    # no deltas
    assert get(fs, "run/ckpt_2.pt") == data[2]
    fs.close()


def test_every_subset_of_deletes_then_gc(tmp_path):
    data = series(4, size=1 << 15)
    src = tmp_path / "src"
    fs = make_fs(src)
    names = [f"r/ckpt_{i}.pt" for i in range(len(data))]
    for n, d in zip(names, data):
        put(fs, n, d)
    fs.close()
    for k in range(1, len(names)):
        for gone in itertools.combinations(range(len(names)), k):
            root = tmp_path / f"case-{'-'.join(map(str, gone))}"
            shutil.copytree(src, root)
            fs = make_fs(root)
            for i in gone:
                fs.unlink(names[i])
            report = collect(fs.store, grace=0)
            for i, n in enumerate(names):
                if i not in gone:
                    assert get(fs, n) == data[i], (gone, n)
            assert report.manifests == len(names) - k
            fs.close()
            shutil.rmtree(root)


def test_overwrite_and_rename_keep_deltas_alive(tmp_path):
    fs = make_fs(tmp_path / "s")
    a, b, c = series(3)
    put(fs, "ckpt_1.pt", a)
    put(fs, "ckpt_2.pt", b)                          # delta of ckpt_1
    put(fs, "ckpt_1.pt", c)                          # overwrite the base
    fs.rename("ckpt_2.pt", "kept.pt")
    collect(fs.store, grace=0)
    fresh = make_fs(tmp_path / "s")                  # no cached chunks
    assert get(fresh, "kept.pt") == b and get(fresh, "ckpt_1.pt") == c
    fs.close()
    fresh.close()


def test_gc_grace_and_dry_run(tmp_path):
    fs = make_fs(tmp_path / "s")
    a, b = series(2)
    put(fs, "x.pt", a)
    fs.unlink("x.pt")
    dry = collect(fs.store, grace=0, dry_run=True)
    assert dry.freed and all(fs.store.exists(k) for k, _ in dry.freed)
    young = collect(fs.store, grace=3600)
    assert not young.freed and young.young == len(dry.freed)
    out = subprocess.run([sys.executable, "-m", "s4fs.cli", "gc", str(tmp_path / "s"),
                          "--grace", "0"], capture_output=True, text=True, check=True).stdout
    assert "freed" in out
    assert not any(fs.store.exists(k) for k, _ in dry.freed)
    fs.close()


def test_nan_and_denormal_base(tmp_path):
    special = np.array([0x7FC00001, 0x7F800001, 0xFFFFFFFF, 0x00000001, 0x807FFFFF,
                        0x7F800000, 0x80000000], dtype=np.uint32)
    base = np.resize(special, 1 << 16).view(np.float32).copy()
    new = base.copy()
    new.view(np.uint32)[::5] ^= 1                   # flip payload/low bits everywhere
    fs = make_fs(tmp_path / "s")
    d0 = tbytes({"t": torch.from_numpy(base)})
    d1 = tbytes({"t": torch.from_numpy(new)})
    put(fs, "n/ckpt_0.pt", d0)
    put(fs, "n/ckpt_1.pt", d1)
    assert fs.manifest("n/ckpt_1.pt").base["path"] == "n/ckpt_0.pt"
    assert get(make_fs(tmp_path / "s"), "n/ckpt_1.pt") == d1
    fs.close()


def test_rotating_sibling_directories(tmp_path):
    fs = make_fs(tmp_path / "s")
    a, b = series(2)
    put(fs, "out/checkpoint-500/optimizer.pt", a)
    put(fs, "out/checkpoint-1000/optimizer.pt", b)
    m = fs.manifest("out/checkpoint-1000/optimizer.pt")
    assert m.base["path"] == "out/checkpoint-500/optimizer.pt"
    assert m.stored_bytes() < 0.6 * fs.manifest("out/checkpoint-500/optimizer.pt").stored_bytes()
    fs.close()


@pytest.mark.slow
def test_real_finetuning_series_api(tmp_path):
    """Real AdamW fine-tuning of all-MiniLM-L6-v2 with frozen layers, saved via the API."""
    from _minilm import finetune
    root = tmp_path / "run"
    root.mkdir()
    frozen = ("embeddings.", "encoder.layer.0.")
    saved = {}
    for step, model_sd, opt_sd in finetune(60, every=20, freeze=frozen):
        obj = {"model": model_sd, "optimizer": opt_sd, "step": step}
        s4fs.save_checkpoint(root, step, obj)
        saved[step] = hashlib.sha256(tbytes(obj, f"step-{step}.pt")).hexdigest()
    assert s4fs.list_checkpoints(root) == [20, 40, 60]
    fs, _ = s4fs.resolve(root / "step-20.pt")
    first = file_report(fs, "step-20.pt")
    last = file_report(fs, "step-60.pt")
    assert last["base"] == "step-40.pt" and last["stored"] < first["stored"]
    for t in last["tensors"]:
        if t["name"].startswith("model.embeddings.") or t["name"].startswith("model.encoder.layer.0."):
            assert t["stored"] == 0, t                 # frozen parameters cost nothing
    fs.unlink("step-20.pt")                              # the root of the chain
    collect(fs.store, grace=0)
    fresh = Filesystem(LocalStore(root))
    for step in (40, 60):
        assert hashlib.sha256(get(fresh, f"step-{step}.pt")).hexdigest() == saved[step]
    back = s4fs.load_checkpoint(root)
    assert back["step"] == 60
    fresh.close()


@pytest.mark.fuse
@pytest.mark.slow
def test_real_series_through_the_mount(mount_factory, tmp_path):
    from _minilm import finetune
    # forward chains: dense fine-tuning deltas are too large for the default read
    # budget, allow them (backward deltas through the mount: tests/core/test_backward.py)
    m = mount_factory(extra=["--forward-deltas", "--max-chain-read", "4"])
    run = os.path.join(m.path, "run")
    os.mkdir(run)
    twins = tmp_path / "twins"
    twins.mkdir()
    for step, model_sd, opt_sd in finetune(40, every=20):
        obj = {"model": model_sd, "optimizer": opt_sd}
        torch.save(obj, os.path.join(run, f"ckpt_{step}.pt"))
        torch.save(obj, twins / f"ckpt_{step}.pt")
    out = subprocess.run([sys.executable, "-m", "s4fs.cli", "stat", "--json",
                          os.path.join(run, "ckpt_40.pt")], capture_output=True, text=True,
                         check=True).stdout
    import json
    r = json.loads(out)
    assert r["base"] == "run/ckpt_20.pt" and r["chain_depth"] >= 1
    # a fresh node fetches the base's blobs too, and `s4fs stat` says how much
    assert r["read_cold"] > r["stored"]
    text = subprocess.run([sys.executable, "-m", "s4fs.cli", "stat",
                           os.path.join(run, "ckpt_40.pt")], capture_output=True, text=True,
                          check=True).stdout
    assert f"a node with nothing cached fetches {r['read_cold']} bytes" in text, text
    os.remove(os.path.join(run, "ckpt_20.pt"))
    subprocess.run([sys.executable, "-m", "s4fs.cli", "gc", m.store, "--grace", "0"],
                   check=True, capture_output=True)
    m.restart()
    with open(os.path.join(run, "ckpt_40.pt"), "rb") as f:
        got = hashlib.sha256(f.read()).hexdigest()
    assert got == hashlib.sha256((twins / "ckpt_40.pt").read_bytes()).hexdigest()


# --------------------------------------------------------------------------- GPU worker

from emulated_gpu import emulated_gpu  # noqa: E402


def test_gpu_worker_codes_in_batches_with_deltas(tmp_path, monkeypatch):
    calls = emulated_gpu(monkeypatch)
    fs = make_fs(tmp_path / "s", device="cuda", gpu_profile="portable",
                 gpu_batch_bytes=1 << 19)
    data = series(3)
    for i, d in enumerate(data):
        put(fs, f"run/ckpt_{i}.pt", d)
    assert calls["encode"] and max(calls["encode"]) > 1     # chunks went up in batches
    sizes = [fs.manifest(f"run/ckpt_{i}.pt").stored_bytes() for i in range(3)]
    assert all(s < 0.6 * sizes[0] for s in sizes[1:]), sizes
    r = file_report(fs, "run/ckpt_2.pt")
    assert r["base"] == "run/ckpt_1.pt" and r["stored_delta"] > 0
    fs.close()
    fresh = Filesystem(LocalStore(tmp_path / "s"))    # portable blobs: any CPU reads them
    for i, d in enumerate(data):
        assert get(fresh, f"run/ckpt_{i}.pt") == d
    fresh.close()


def test_gpu_worker_failure_codes_on_the_cpu(tmp_path, monkeypatch, caplog):
    from s4fs.codec import gpu
    emulated_gpu(monkeypatch)

    def broken(items, **kw):
        raise MemoryError("out of memory allocating 64 MiB on the device")
    monkeypatch.setattr(gpu, "compress_many", broken)
    fs = make_fs(tmp_path / "s", device="cuda", gpu_batch_bytes=1 << 19)
    data = series(2)
    with caplog.at_level("WARNING", logger="s4fs.ingest"):
        for i, d in enumerate(data):
            put(fs, f"run/ckpt_{i}.pt", d)
    assert "coding it on the CPU" in caplog.text
    for i, d in enumerate(data):
        assert get(fs, f"run/ckpt_{i}.pt") == d
    assert fs.manifest("run/ckpt_1.pt").stored_bytes() < 0.6 * \
        fs.manifest("run/ckpt_0.pt").stored_bytes()
    fs.close()


def test_the_gpu_delta_rule_with_a_device_sameness_check(monkeypatch):
    """``gpu_worker.code_on_device`` (the device save's rule, and the mount GPU
    worker's): a chunk equal to its base is the base's own chunk, asked of ``same`` only
    when its checksum is the base's; a small change is a delta, a big one full; every
    kept blob decodes (against its base) to the chunk's exact bytes."""
    import numpy as np
    from s4fs import codec
    from s4fs.codec import gpu
    from s4fs.coding import code_on_device
    from s4fs.coding import IngestConfig
    from s4fs.manifest import ChunkRef
    emulated_gpu(monkeypatch)
    rng = np.random.default_rng(4)
    n = 1 << 16
    base = rng.standard_normal(n // 4).astype(np.float32).tobytes()
    touched = bytearray(base)
    touched[100:108] = bytes(8)
    other = rng.integers(0, 256, n, dtype=np.uint8).tobytes()
    ref = ChunkRef("p", 0, n // 2, n, codec.checksum(base), 0, None)    # a whole root
    batch = [(base, "float32", ref), (base, "float32", ref), (bytes(touched), "float32", ref),
             (other, "float32", ref), (other, "float32", None)]
    prep = [("delta", base)] * 4 + [None]
    asked = []

    def same(i):
        asked.append(i)
        return i == 0                 # item 1: "not the same" though its checksum is

    out = code_on_device(batch, prep, gpu.PROFILES["portable"], IngestConfig(), same)
    assert asked == [0, 1]
    assert out[0] == (None, ref, ref.checksum, n)
    blob1, base1, _, _ = out[1]
    assert base1 is ref and len(blob1) < 0.01 * n        # the zero XOR: a tiny delta
    blob2, base2, sum2, _ = out[2]
    assert base2 is ref and sum2 == codec.checksum(bytes(touched)) and len(blob2) < 0.25 * n
    for blob, want in ((blob1, base), (blob2, bytes(touched))):
        assert codec.decompress(bytes(blob), base=base) == want
    for k in (3, 4):
        blob, b, sum_, raw = out[k]
        assert b is None and raw == n and sum_ == codec.checksum(other)
        assert codec.decompress(bytes(blob)) == other


def test_the_cpu_delta_rule_codes_the_sampled_winner_first(monkeypatch):
    """``code_chunk`` on the CPU: a sample says which way to code a large chunk first,
    so a chunk whose delta does not pay (AdamW's first moment) is coded once, not both
    ways; the kept blob is the one the exact rule (both ways, the smaller) keeps, and
    decodes to the chunk's bytes. A chunk whose changes lie where the sample does not
    look (or only where it looks) is coded by the exact rule."""
    from s4fs import codec
    from s4fs.coding import DELTA, FULL, code_chunk, delta_is_tiny, keep_delta
    from s4fs.coding import IngestConfig
    from s4fs.coding import _rule
    from s4fs.manifest import ChunkRef
    rng = np.random.default_rng(5)
    n = 4 << 20
    # the size rule alone (the chains' read budget: test_chains_keep_within_their_read_budget)
    cfg = IngestConfig(max_chain_read=100.0)
    weights = rng.standard_normal(n // 4).astype(np.float32) * 0.02
    moment = rng.standard_normal(n // 4).astype(np.float32) * 1e-3
    noise = rng.integers(0, 256, n, dtype=np.uint8)
    part = n // (_rule.SAMPLE_PARTS * _rule.SAMPLE_SHARE)
    step = (n - part) // (_rule.SAMPLE_PARTS - 1) // 8 * 8
    sampled = np.zeros(n, bool)
    for i in range(_rule.SAMPLE_PARTS):
        sampled[i * step:i * step + part] = True
    fresh = rng.integers(0, 256, n, dtype=np.uint8)
    off = np.where((rng.random(n) < 0.5) & ~sampled, fresh, noise)    # half the bytes
    inside = np.where(sampled, fresh, noise)                         # 1/64 of them
    cases = {
        "weights": (weights, weights + rng.standard_normal(n // 4).astype(np.float32) * 1e-4),
        "moment": (moment, (0.9 * moment + 0.1 * rng.standard_normal(n // 4) * 1e-3)
                   .astype(np.float32)),
        "changed off the sample": (noise, off),
        "changed in the sample": (noise, inside),
    }
    coded = []
    real = codec.compress
    monkeypatch.setattr(_rule.codec, "compress",
                        lambda data, *a, **k: coded.append(len(data)) or real(data, *a, **k))
    kinds = {}
    for name, (old, new) in cases.items():
        base, data = old.tobytes(), new.tobytes()
        delta = real(data, "float32", base=base, device="cpu")
        full = real(data, "float32", device="cpu")
        want = DELTA if (delta_is_tiny(len(delta), n) or keep_delta(len(delta), len(full), cfg)) \
            else FULL
        coded.clear()
        ref = ChunkRef("p", 0, n, n, codec.checksum(base), 0, None)
        blob, kind = code_chunk(data, "float32", codec.checksum(data), ref, lambda: base, cfg,
                                device="cpu")
        assert kind == want, name
        assert codec.decompress(blob, base=base if kind == DELTA else None) == data
        kinds[name] = (kind, coded.count(n))
    assert kinds["moment"] == (FULL, 1)                  # one coding of the whole chunk
    assert kinds["weights"][1] == 1 and kinds["weights"][0] == DELTA
    assert kinds["changed off the sample"] == (DELTA, 2)  # the sample is not trusted:
    assert kinds["changed in the sample"] == (DELTA, 1)   # the exact rule, delta first


from store_damage import damage_packs  # noqa: E402


@pytest.mark.parametrize("how", ["corrupt", "missing"])
@pytest.mark.parametrize("where", ["api", "gpu-worker"])
def test_a_damaged_base_does_not_stop_the_next_save(tmp_path, monkeypatch, caplog, how, where):
    """The previous checkpoint's packs damaged or gone: the next save (s4fs.save in
    process; the ingest's GPU worker, emulated) codes its chunks in full and reads back
    exact, and a warning names `s4fs verify` (the save's, where it read the damaged
    base; else the re-expression's, which reads it after); the damaged file still
    refuses to read."""
    from s4fs.coding import _bases as delta
    from s4fs.errors import S4Error
    # packs seen whole (written here, or looked at) are trusted for PACKS_SEEN_TTL; the
    # damage here stands for one done later than that (a lifecycle rule, days later)
    monkeypatch.setattr(delta, "PACKS_SEEN_TTL", 0.0)
    w = torch.randn(1 << 20)
    state = {"w": w, "frozen": torch.randn(1 << 18), "step": 0}
    if where == "api":
        store = tmp_path / "store"
        store.mkdir()
        s4fs.save(state, str(store / "ckpt_0.pt"))
        fs, _ = s4fs.resolve(str(store / "ckpt_0.pt"))
        damage_packs(LocalStore(str(store)), fs.manifest("ckpt_0.pt").own_packs, how)
        w[:1000] += 1
        with caplog.at_level("WARNING", logger="s4fs.ingest"):
            s4fs.save(state, str(store / "ckpt_1.pt"))
            fs.settle_deltas()            # the re-expression after it, in the background
        m0, m1 = fs.manifest("ckpt_0.pt"), fs.manifest("ckpt_1.pt")
        assert s4fs.read_bytes(str(store / "ckpt_1.pt")) == tbytes(state, "ckpt_1.pt")
        with pytest.raises(S4Error):
            s4fs.read_bytes(str(store / "ckpt_0.pt"))
    else:
        emulated_gpu(monkeypatch)
        # with the decoded copy of ckpt_0 kept, the bases would come from it: a corrupt
        # pack is then not seen (s4fs verify's job), a missing one is (delta.missing_packs)
        fs = Filesystem(LocalStore(tmp_path / "s"), FsConfig(
            ingest=IngestConfig(chunk_size=1 << 16, device="cuda", gpu_profile="portable",
                                gpu_batch_bytes=1 << 19),
            decoded_cache_bytes=0 if how == "corrupt" else None))
        put(fs, "run/ckpt_0.pt", tbytes(state))
        m0 = fs.manifest("run/ckpt_0.pt")
        damage_packs(LocalStore(str(tmp_path / "s")), m0.own_packs, how)
        w[:1000] += 1
        with caplog.at_level("WARNING", logger="s4fs.ingest"):
            put(fs, "run/ckpt_1.pt", tbytes(state))
        m1 = fs.manifest("run/ckpt_1.pt")
        fs.close()
        fresh = Filesystem(LocalStore(tmp_path / "s"), FsConfig(decoded_cache_bytes=0))
        assert get(fresh, "run/ckpt_1.pt") == tbytes(state)
        with pytest.raises(S4Error):
            get(fresh, "run/ckpt_0.pt")
        fresh.close()
    if how == "missing":                  # else intact chunks of ckpt_0 may still serve
        assert all(c.pack not in m0.own_packs and c.base is None
                   for s in m1.streams for c in s.chunks)
    assert "s4fs verify" in caplog.text


