"""Pairs within one file (s4fs.write.pairs): an fp32 master saved after its bf16 or fp16
copy is stored on that copy, and a copy saved after its master on the master, so the two
cost about what the master costs alone.

What a user cares about: the bytes read back exact (on a node with nothing cached too),
the stored bytes (the pair within 2 % of the master alone; never more than with pairs
off), and that the copy's file keeps every version readable through deletes, renames,
backward deltas and the collector.
"""

from __future__ import annotations

import io
import time

import pytest
import torch

from s4fs import keys
from s4fs.coding import IngestConfig
from s4fs.fs import Filesystem, FsConfig
from s4fs.gc import collect
from s4fs.stores import LocalStore

KINDS = {"bfloat16": torch.bfloat16, "float16": torch.float16}


def tbytes(obj) -> bytes:
    b = io.BytesIO()
    torch.save(obj, b)
    return b.getvalue()


def weights(seed: int = 0, n: int = 6, shape=(256, 512)) -> dict:
    g = torch.Generator().manual_seed(seed)
    return {f"layer{i}.weight": torch.randn(*shape, generator=g) * 0.02 for i in range(n)}


def mixed(master: dict, kind: str = "bfloat16", *, copy: dict | None = None) -> dict:
    """A mixed-precision checkpoint as Megatron's legacy format lays it out: the model
    in low precision first, then the optimizer with its fp32 masters and AdamW state."""
    model = copy if copy is not None else {k: v.to(KINDS[kind]) for k, v in master.items()}
    state = {i: {"exp_avg": v * 1e-3, "exp_avg_sq": (v * 1e-3) ** 2}
             for i, v in enumerate(master.values())}
    return {"model": model, "optimizer": {"state": state,
                                          "fp32_from_fp16_params": list(master.values())}}


def make_fs(root, cache, **ingest) -> Filesystem:
    cfg = IngestConfig(chunk_size=1 << 17, pack_size=1 << 20, **ingest)
    return Filesystem(LocalStore(root), FsConfig(ingest=cfg, cache_dir=str(cache)))


def put(fs, path: str, data: bytes, piece: int = 1 << 20) -> None:
    h = fs.open_write(path)
    for i in range(0, len(data), piece):
        h.write(i, data[i:i + piece])
    h.flush()
    h.release()


def fresh_read(root, tmp_path, path: str) -> bytes:
    """``path`` read by a node with nothing cached."""
    fs = Filesystem(LocalStore(root), FsConfig(decoded_cache_bytes=0,
                                               cache_dir=str(tmp_path / "fresh")))
    try:
        r = fs.open_read(path)
        try:
            return r.read(0, fs.stat(path).size)
        finally:
            r.release()
    finally:
        fs.close()


def stored(tmp_path, name: str, data: bytes, **ingest) -> tuple[int, int]:
    """(stored bytes, paired chunks) of ``data`` saved alone in a store of its own, read
    back exact by a fresh node."""
    root = tmp_path / f"store-{name}"
    fs = make_fs(root, tmp_path / f"cache-{name}", **ingest)
    try:
        put(fs, "ckpt.pt", data)
        m = fs.manifest("ckpt.pt")
    finally:
        fs.close()
    assert fresh_read(root, tmp_path, "ckpt.pt") == data
    return m.stored_bytes(), sum(c.paired for s in m.streams for c in s.chunks)


@pytest.mark.parametrize("processes", [False, True], ids=["threads", "processes"])
@pytest.mark.parametrize("kind", KINDS)
def test_a_copy_and_its_master_cost_what_the_master_costs_alone(tmp_path, kind, processes):
    master = weights()
    with_copy = tbytes(mixed(master, kind))
    without = tbytes({"optimizer": mixed(master, kind)["optimizer"]})
    pair, paired = stored(tmp_path, "pair", with_copy, processes=processes)
    alone, _ = stored(tmp_path, "alone", without, processes=processes)
    off, none = stored(tmp_path, "off", with_copy, processes=processes, pairs=False)
    assert paired == 2 * len(master)            # two chunks a tensor at this chunk size
    assert none == 0
    assert pair <= 1.02 * alone, (pair, alone)  # the goal: within 2 % of the master alone
    assert pair < 0.9 * off                     # and well under what it cost before


def test_copies_that_are_no_rounding_never_cost_more(tmp_path):
    master = weights()
    g = torch.Generator().manual_seed(9)
    # the same shapes, other values: matched by size, refused by the sample
    strangers = {k: (torch.randn(v.shape, generator=g) * 0.02).to(torch.bfloat16)
                 for k, v in master.items()}
    # stochastic rounding: each weight rounded up or down at random
    words = torch.stack(list(master.values())).view(torch.int32)
    down = (words >> 16).to(torch.int16)
    up = ((words + 0xFFFF) >> 16).to(torch.int16)
    coin = torch.rand(words.shape, generator=g) < 0.5
    stochastic = torch.where(coin, up, down).view(torch.bfloat16)
    noisy = {k: stochastic[i].clone() for i, k in enumerate(master)}   # storages apart
    for name, copy in (("strangers", strangers), ("stochastic", noisy)):
        data = tbytes(mixed(master, copy=copy))
        on, paired = stored(tmp_path, f"{name}-on", data)
        off, _ = stored(tmp_path, f"{name}-off", data, pairs=False)
        assert on <= off, (name, on, off)
        if name == "strangers":
            assert paired == 0
        else:
            assert paired == 2 * len(master) and on < 0.95 * off   # pays: ~1 bit more


@pytest.mark.parametrize("processes", [False, True], ids=["threads", "processes"])
@pytest.mark.parametrize("kind", KINDS)
def test_a_copy_saved_after_its_master_costs_next_to_nothing(tmp_path, kind, processes):
    """The masters first (``{"optimizer": ..., "model": ...}``): each copy is coded on
    its master, the pair stored within 2 % of the masters alone, among AdamW states of
    the very same shapes (which the copies must not be taken for)."""
    master = weights()
    optim = mixed(master, kind)["optimizer"]
    copies = {k: v.to(KINDS[kind]) for k, v in master.items()}
    data = tbytes({"optimizer": optim, "model": copies})
    on, paired = stored(tmp_path, "on", data, processes=processes)
    off, none = stored(tmp_path, "off", data, processes=processes, pairs=False)
    alone, _ = stored(tmp_path, "alone", tbytes({"optimizer": optim}), processes=processes)
    assert paired == 4 * len(master) and none == 0    # 4 half-size chunks a copy
    assert on <= 1.02 * alone, (on, alone)
    assert on < 0.9 * off


def test_copies_after_their_masters_that_are_no_rounding_never_cost_more(tmp_path):
    master = weights()
    g = torch.Generator().manual_seed(4)
    words = torch.stack(list(master.values())).view(torch.int32)
    down = (words >> 16).to(torch.int16)
    coin = torch.rand(words.shape, generator=g) < 0.5
    stochastic = torch.where(coin, down + 1, down).view(torch.bfloat16)
    cases = {"stochastic": {k: stochastic[i].clone() for i, k in enumerate(master)},
             "strangers": {k: (torch.randn(v.shape, generator=g) * 0.02).bfloat16()
                           for k, v in master.items()},
             "stepped": {k: (v - 3e-3 * torch.sign(v)).bfloat16() for k, v in master.items()}}
    for name, copy in cases.items():
        data = tbytes({"master": master, "model": copy})
        on, paired = stored(tmp_path, f"{name}-on", data)
        off, _ = stored(tmp_path, f"{name}-off", data, pairs=False)
        assert on <= off, (name, on, off)
        if name == "strangers":
            assert paired == 0
        if name == "stochastic":
            assert paired and on < 0.95 * off


def masters_first(master: dict, kind: str = "bfloat16") -> dict:
    """The same state with the optimizer (and the masters) saved before the model."""
    state = mixed(master, kind)
    return {"optimizer": state["optimizer"], "model": state["model"]}


def save_series(fs, layout, master: dict, n: int) -> tuple[list[str], list[bytes]]:
    """``n`` checkpoints of a training run in ``run/`` (every weight a step further),
    their re-expression as deltas settled: their paths and bytes."""
    data, paths = [], []
    fs.mkdir("run")
    for step in range(n):
        master = {k: v - 1e-4 * torch.sign(v) for k, v in master.items()}
        data.append(tbytes(layout(master)))
        paths.append(f"run/ckpt_{step}.pt")
        put(fs, paths[-1], data[-1])
    assert fs.settle_deltas(120)
    return paths, data


@pytest.mark.parametrize("layout", [mixed, masters_first], ids=["copy-first", "master-first"])
def test_a_series_keeps_every_version_through_deletes_renames_and_gc(tmp_path, layout):
    """Backward deltas re-express each previous checkpoint on the next (the chunks of
    the tensor saved first become deltas; the second stays on them): every version reads
    back exact after the newest is deleted, one renamed, one deleted, and the collector
    ran."""
    root = tmp_path / "store"
    fs = make_fs(root, tmp_path / "cache")
    paths, data = save_series(fs, layout, weights(), 4)
    m = fs.manifest(paths[-1])
    assert any(c.paired for s in m.streams for c in s.chunks)
    fs.unlink(paths[-1])
    fs.rename(paths[1], "run/kept.pt")
    fs.unlink(paths[2])
    fs.close()
    collect(LocalStore(root), grace=0)
    left = {paths[0]: data[0], "run/kept.pt": data[1]}
    for p, want in left.items():
        assert fresh_read(root, tmp_path, p) == want, p
    # the collector freed what no version uses: the bucket is not the sum of the saves
    held = sum(o.size for o in LocalStore(root).list(keys.PACKS))
    assert held < sum(map(len, data[:2]))


@pytest.mark.parametrize("direction", ["forward", "backward"])
@pytest.mark.parametrize("layout", [mixed, masters_first], ids=["copy-first", "master-first"])
def test_a_pair_is_no_hop_on_a_chain_and_chains_keep_their_bound(tmp_path, layout,
                                                                 direction):
    """``max_delta_depth`` bounds the deltas on other versions a chunk is read through;
    a pair adds one link within its file, never another version: with the bound at 1,
    every chunk of every version is at most one version away, pairs or not."""
    root = tmp_path / "store"
    fs = Filesystem(LocalStore(root), FsConfig(
        ingest=IngestConfig(chunk_size=1 << 17, pack_size=1 << 20, max_delta_depth=1),
        cache_dir=str(tmp_path / "cache"), delta_direction=direction))
    try:
        paths, data = save_series(fs, layout, weights(n=3), 5)
        refs = [c for p in paths for s in fs.manifest(p).streams for c in s.chunks]
    finally:
        fs.close()
    assert any(c.paired for c in refs) and max(c.hops for c in refs) <= 1
    if direction == "backward":          # the older versions are deltas on the newer
        assert max(c.hops for c in refs) == 1
    assert all(c.depth <= c.hops + 2 for c in refs)
    for p, want in zip(paths, data):
        assert fresh_read(root, tmp_path, p) == want, p


@pytest.mark.parametrize("layout", [mixed, masters_first], ids=["copy-first", "master-first"])
def test_stat_says_what_a_tensor_is_coded_on(tmp_path, layout):
    from s4fs.report import file_report
    root = tmp_path / "store"
    fs = make_fs(root, tmp_path / "cache")
    try:
        put(fs, "ckpt.pt", tbytes(layout(weights(n=2))))
        report = file_report(fs, "ckpt.pt")
    finally:
        fs.close()
    rows = [t for t in report["tensors"] if t.get("paired_on")]
    assert len(rows) == 2, report["tensors"]
    # the one saved second names the one saved first: its copy, or its master
    second, first = ("float32", "model") if layout is mixed else ("bfloat16", "optimizer")
    assert all(r["dtype"] == second and first in r["paired_on"] for r in rows), rows


@pytest.mark.parametrize("layout", [mixed, masters_first], ids=["copy-first", "master-first"])
@pytest.mark.parametrize("to_host", [False, True])
def test_a_gpu_decode_restores_pairs(tmp_path, monkeypatch, to_host, layout):
    """The GPU's batched decode (s4fs.load to CUDA, a --device cuda decode ahead) hands
    back a master chunk coded on its copy exactly as the CPU does (on the emulated GPU:
    the real pipeline on the CPU)."""
    import sys
    sys.path.insert(0, str(__import__("pathlib").Path(__file__).parents[1]))
    from emulated_gpu import emulated_gpu
    from s4fs.chunks import decode_on_gpu
    root = tmp_path / "store"
    fs = make_fs(root, tmp_path / "cache")
    try:
        put(fs, "ckpt.pt", tbytes(layout(weights(n=2))))
        m = fs.manifest("ckpt.pt")
        refs = [c for s in m.streams for c in s.chunks]
        want = {c.key(): bytes(fs.source.get(c)) for c in refs}
        assert any(c.paired for c in refs)
        emulated_gpu(monkeypatch)
        got = decode_on_gpu(fs.source, refs, to_host=to_host)
    finally:
        fs.close()
    for c in refs:
        arr = got[c.key()]
        data = arr.get() if hasattr(arr, "get") else arr
        assert bytes(memoryview(data).cast("B")) == want[c.key()], c


def test_a_dcp_shard_holding_copies_and_masters_stores_the_pair_once(tmp_path):
    """torch DCP writes each rank's items as torch files back to back in one ``.distcp``
    shard: the bf16 model and the fp32 masters of one shard pair as in one torch file
    (within 2 % of the same shard saved without the copy), and the shard comes back
    exact to a fresh node, which DCP then loads."""
    import os
    import warnings
    import torch.distributed.checkpoint as dcp
    master = weights(n=4, shape=(512, 512))
    state = mixed(master)
    sizes = {}
    for name, sd in (("pair", state), ("alone", {"optimizer": state["optimizer"]})):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")          # one process: no process group
            dcp.save(sd, checkpoint_id=str(tmp_path / name))
        root = tmp_path / f"store-{name}"
        fs = make_fs(root, tmp_path / f"cache-{name}")
        try:
            fs.mkdir(name)
            for f in sorted(os.listdir(tmp_path / name)):
                put(fs, f"{name}/{f}", (tmp_path / name / f).read_bytes())
            shard = fs.manifest(f"{name}/__0_0.distcp")
        finally:
            fs.close()
        sizes[name] = shard.stored_bytes()
        if name == "pair":
            assert sum(c.paired for s in shard.streams for c in s.chunks) == 4 * len(master)
            back = tmp_path / "back"
            back.mkdir()
            for f in os.listdir(tmp_path / name):
                (back / f).write_bytes(fresh_read(root, tmp_path, f"{name}/{f}"))
                assert (back / f).read_bytes() == (tmp_path / name / f).read_bytes()
            again = mixed({k: torch.zeros_like(v) for k, v in master.items()})
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                dcp.load(again, checkpoint_id=str(back))
            got = again["optimizer"]["fp32_from_fp16_params"]
            assert all(torch.equal(a, b) for a, b in zip(got, master.values()))
    assert sizes["pair"] <= 1.02 * sizes["alone"], sizes


@pytest.mark.parametrize("layout", [mixed, masters_first], ids=["copy-first", "master-first"])
def test_a_fresh_nodes_decode_ahead_puts_each_pair_in_one_batch(tmp_path, layout):
    """The decode ahead (worker processes, batches in file order) moves a chunk coded
    on its pair into its pair's batch, so that one worker decodes the pair once; the
    copy it fills is the file's bytes."""
    from s4fs.read.fill import MIN_SIZE, plan
    master = weights(n=6, shape=(512, 1024))
    data = tbytes(layout(master))
    assert len(data) >= MIN_SIZE                 # large enough to be decoded ahead
    root = tmp_path / "store"
    cfg = dict(processes=True, batch_bytes=1 << 20)
    fs = make_fs(root, tmp_path / "cache", **cfg)
    try:
        put(fs, "ckpt.pt", data)
        m = fs.manifest("ckpt.pt")
    finally:
        fs.close()
    batches = plan(m, 1 << 20)
    home = {ref.key(): k for k, b in enumerate(batches) for ref, _ in b}
    paired = [ref for b in batches for ref, _ in b if ref.paired]
    assert paired and all(home[r.key()] == home[r.base.key()] for r in paired)
    # every chunk exactly once
    assert sorted(home) == sorted({c.key() for s in m.streams for c in s.chunks})
    fresh = Filesystem(LocalStore(root), FsConfig(
        ingest=IngestConfig(chunk_size=1 << 17, **cfg),
        cache_dir=str(tmp_path / "fresh")))
    try:
        r = fresh.open_read("ckpt.pt")
        assert bytes(r.read(0, len(data) + 1)) == data
        r.release()
        # decoded ahead, whole: the copy is the decoded cache's once its whole-file
        # hash is checked, which may be just after the last read returned
        deadline = time.monotonic() + 30
        while fresh.decoded.path_of(m.id) is None and time.monotonic() < deadline:
            time.sleep(0.02)
        assert fresh.decoded.path_of(m.id) is not None
    finally:
        fresh.close()
