"""Backward deltas: the newest checkpoint whole, the ones before it re-expressed as XOR
deltas on it in the background (s4fs.write.backward).

What a user cares about: every version reads back exact (from a node with nothing
cached too), the newest costs a fresh node what a whole file costs, the series takes
fewer bytes in the bucket (after the collector ran), and a failure at any step of a
re-expression — or a newer commit racing it — loses nothing.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest
import torch

from s4fs import keys
from s4fs.coding import IngestConfig
from s4fs.errors import StoreUnavailable
from s4fs.fs import Filesystem, FsConfig
from s4fs.gc import collect
from s4fs.report import file_report
from s4fs.stores import LocalStore
from s4fs.stores.faulty import FailingStore
from s4fs.write.backward import reexpress


def tbytes(obj) -> bytes:
    b = io.BytesIO()
    torch.save(obj, b)
    return b.getvalue()


def drifting(n=5, size=1 << 18, seed=0) -> list[bytes]:
    """Dense training in miniature: every weight moves a little at every save (fp32 and
    a bf16 copy), one tensor is frozen."""
    rng = np.random.default_rng(seed)
    w = rng.standard_normal(size).astype(np.float32)
    frozen = torch.from_numpy(rng.standard_normal(size).astype(np.float32))
    out = []
    for i in range(n):
        w = w * (1 + rng.standard_normal(size).astype(np.float32) * 1e-4)
        t = torch.from_numpy(w.copy())
        out.append(tbytes({"w": t, "w16": t.to(torch.bfloat16), "frozen": frozen, "step": i}))
    return out


def make_fs(store, **kw) -> Filesystem:
    """Pairs off unless told: the series' bf16 copy is here to be a delta on its other
    versions, not on its master (tests/core/test_pairs.py)."""
    kw.setdefault("pairs", False)
    ingest = IngestConfig(chunk_size=1 << 16, pack_size=1 << 18,
                          **{k: kw.pop(k) for k in list(kw)
                             if k in ("max_delta_depth", "pairs")})
    if not isinstance(store, (LocalStore, FailingStore)):
        store = LocalStore(store)
    return Filesystem(store, FsConfig(ingest=ingest, **kw))


def put(fs, path: str, data: bytes) -> None:
    h = fs.open_write(path)
    h.write(0, data)
    h.flush()
    h.release()


def read(fs, path: str) -> bytes:
    r = fs.open_read(path)
    try:
        return r.read(0, fs.stat(path).size)
    finally:
        r.release()


def fresh_reads(root, paths) -> dict:
    """Every file read by a node with nothing cached (no decoded copies)."""
    fs = Filesystem(LocalStore(root), FsConfig(decoded_cache_bytes=0))
    try:
        return {p: read(fs, p) for p in paths}
    finally:
        fs.close()


def bucket_bytes(root) -> int:
    """What the store holds in packs once the collector has run."""
    store = LocalStore(root)
    collect(store, grace=0)
    return sum(o.size for o in store.list(keys.PACKS))


def save_series(fs, data, folder="run") -> list[str]:
    paths = [f"{folder}/ckpt_{i * 10}.pt" for i in range(len(data))]
    if not fs.exists(folder):
        fs.mkdir(folder)
    for p, d in zip(paths, data):
        put(fs, p, d)
    assert fs.settle_deltas(120)
    return paths


def test_newest_whole_older_deltas_exact_and_smaller(tmp_path):
    data = drifting()
    fs = make_fs(tmp_path / "b")
    paths = save_series(fs, data)
    reports = [file_report(fs, p) for p in paths]
    fs.close()
    off = make_fs(tmp_path / "off", delta=False)
    save_series(off, data)
    whole = file_report(off, paths[-1])
    off.close()

    got = fresh_reads(tmp_path / "b", paths)
    assert all(got[p] == d for p, d in zip(paths, data))
    newest = reports[-1]
    assert newest["direction"] == "whole" and newest["chain_depth"] == 0
    # a fresh node fetches for the newest what it fetches for the same file stored whole
    assert newest["read_cold"] <= 1.01 * whole["read_cold"]
    for i, r in enumerate(reports[:-1]):
        assert r["direction"] == "backward", r
        assert r["newer"] == paths[i + 1]
        assert r["chain_depth"] == len(paths) - 1 - i
    frozen = next(t for t in newest["tensors"] if t["name"] == "frozen")
    assert frozen["stored"] == 0                 # unchanged: shared, never stored again
    # in the bucket, after the collector: the whole blobs the deltas replaced are gone
    assert bucket_bytes(tmp_path / "b") < 0.7 * bucket_bytes(tmp_path / "off")


def test_the_bucket_never_grows_where_deltas_cannot_free_a_pack(tmp_path):
    """Pretraining in miniature: most bytes change completely every save (no delta
    pays), a small tensor moves a little (its delta would pay) and shares packs with
    them. Replacing it would leave its whole blob in a pack the collector cannot free,
    so the packs are left as they are: the bucket is never larger than deltas off."""
    rng = np.random.default_rng(2)
    small = rng.standard_normal(1 << 15).astype(np.float32)
    data = []
    for i in range(4):
        small = small * (1 + rng.standard_normal(small.size).astype(np.float32) * 1e-4)
        data.append(tbytes({f"dense{j}": torch.from_numpy(
            rng.standard_normal(1 << 16).astype(np.float32)) for j in range(3)} |
            {"small": torch.from_numpy(small.copy()), "step": i}))
    fs = make_fs(tmp_path / "b")
    paths = save_series(fs, data)
    fs.close()
    off = make_fs(tmp_path / "off", delta=False)
    save_series(off, data)
    off.close()
    got = fresh_reads(tmp_path / "b", paths)
    assert all(got[p] == d for p, d in zip(paths, data))
    assert bucket_bytes(tmp_path / "b") <= bucket_bytes(tmp_path / "off")


@pytest.mark.parametrize("depth", [1, 2])
def test_chains_stay_within_max_delta_depth(tmp_path, depth):
    data = drifting(n=7)
    fs = make_fs(tmp_path / "b", max_delta_depth=depth)
    paths = save_series(fs, data)
    reports = [file_report(fs, p) for p in paths]
    fs.close()
    assert max(r["chain_depth"] for r in reports) == depth
    # a version that would take an older one past the bound stays whole: their root
    assert sum(r["direction"] == "whole" for r in reports) >= len(paths) // (depth + 1)
    got = fresh_reads(tmp_path / "b", paths)
    assert all(got[p] == d for p, d in zip(paths, data))
    bucket_bytes(tmp_path / "b")
    got = fresh_reads(tmp_path / "b", paths)
    assert all(got[p] == d for p, d in zip(paths, data))


# which step of a re-expression fails: the upload of its delta packs, the rewrite of the
# previous version's manifest, the rewrite of an older version's (the first one succeeds)
STEPS = {
    "packs": dict(fail_on={"put"}, key_prefix=keys.PACKS),
    "previous": dict(fail_on={"replace"}),
    "older": dict(fail_on={"replace"}, after=1),
    "previous-applied": dict(fail_on={"replace"}, applied=True),
}


@pytest.mark.parametrize("step", list(STEPS))
def test_a_failure_at_any_step_loses_nothing(tmp_path, step):
    data = drifting(n=4)
    fs = make_fs(tmp_path / "b")
    paths = save_series(fs, data[:3])          # two of them deltas on their successors
    fs.close()
    fwd = make_fs(tmp_path / "b", delta_direction="forward")  # the next save, queued
    last = "run/ckpt_30.pt"                                    # nothing behind it
    put(fwd, last, data[3])
    m = fwd.manifest(last)
    fwd.close()
    store = FailingStore(LocalStore(tmp_path / "b"), **STEPS[step])
    fs = make_fs(store)
    with pytest.raises(StoreUnavailable):
        reexpress(fs, fs.cfg.ingest, last, m)
    fs.close()
    paths.append(last)
    for _ in range(2):                          # before and after the collector
        got = fresh_reads(tmp_path / "b", paths)
        assert all(got[p] == d for p, d in zip(paths, data))
        bucket_bytes(tmp_path / "b")


def test_a_newer_commit_of_the_previous_file_is_never_undone(tmp_path):
    """The previous version's path is written again (another node, a user) before its
    re-expression runs: the re-expression leaves it alone, the newer bytes stay."""
    data = drifting(n=3)
    fwd = make_fs(tmp_path / "b", delta_direction="forward")   # no background rewrites
    put(fwd, "ckpt_1.pt", data[0])
    put(fwd, "ckpt_2.pt", data[1])
    b = fwd.manifest("ckpt_2.pt")
    put(fwd, "ckpt_1.pt", data[2])                   # a newer version of ckpt_1.pt
    fwd.close()
    fs = make_fs(tmp_path / "b")
    out = reexpress(fs, fs.cfg.ingest, "ckpt_2.pt", b)
    assert not out.done and "replaced" in out.why
    fs.close()
    got = fresh_reads(tmp_path / "b", ["ckpt_1.pt", "ckpt_2.pt"])
    assert got == {"ckpt_1.pt": data[2], "ckpt_2.pt": data[1]}


def test_deletes_renames_and_gc_keep_every_version(tmp_path):
    data = drifting(n=5)
    fs = make_fs(tmp_path / "b")
    paths = save_series(fs, data)
    fs.unlink(paths[-1])                        # the newest: the others' chains end in it
    fs.rename(paths[2], "run/kept.pt")
    fs.unlink(paths[1])
    fs.close()
    left = {paths[0]: data[0], "run/kept.pt": data[2], paths[3]: data[3]}
    bucket_bytes(tmp_path / "b")
    assert fresh_reads(tmp_path / "b", list(left)) == left


def test_two_mounts_read_every_version_while_one_re_expresses(tmp_path):
    data = drifting(n=4)
    one = make_fs(tmp_path / "b")
    two = make_fs(tmp_path / "b")
    try:
        paths = save_series(one, data)
        assert all(read(two, p) == d for p, d in zip(paths, data))
        put(two, "run/ckpt_40.pt", data[0])     # the other mount saves next
        assert two.settle_deltas(120)
        assert file_report(one, paths[-1])["direction"] == "backward"
        assert all(read(one, p) == d for p, d in zip(paths, data))
    finally:
        one.close()
        two.close()
    got = fresh_reads(tmp_path / "b", [*paths, "run/ckpt_40.pt"])
    assert [got[p] for p in paths] == data and got["run/ckpt_40.pt"] == data[0]


def test_forward_direction_is_still_offered(tmp_path):
    data = drifting(n=3)
    fs = make_fs(tmp_path / "b", delta_direction="forward")
    paths = save_series(fs, data)
    reports = [file_report(fs, p) for p in paths]
    fs.close()
    assert [r["direction"] for r in reports] == ["whole", "forward", "forward"]
    got = fresh_reads(tmp_path / "b", paths)
    assert all(got[p] == d for p, d in zip(paths, data))


@pytest.mark.fuse
@pytest.mark.slow
def test_real_series_through_the_mount(mount_factory, tmp_path):
    """MiniLM + AdamW fine-tuned for real, saved through the mount by torch.save: after
    `s4fs sync` the older checkpoints are deltas on the newer ones, and every one loads
    bit-exact on a fresh mount (nothing cached)."""
    from _minilm import finetune
    m = mount_factory()
    run = os.path.join(m.path, "run")
    os.mkdir(run)
    want = {}
    for step, model_sd, opt_sd in finetune(15, every=5):
        path = os.path.join(run, f"ckpt_{step}.pt")
        twin = tmp_path / f"ckpt_{step}.pt"         # the same torch.save to local disk
        for p in (path, twin):
            torch.save({"model": model_sd, "optimizer": opt_sd}, p)
        want[path] = hashlib.sha256(twin.read_bytes()).hexdigest()
    m.sync()                  # commits, then the re-expressions they queued

    def stat(path):
        out = subprocess.run([sys.executable, "-m", "s4fs.cli", "stat", "--json", path],
                             capture_output=True, text=True, check=True).stdout
        return json.loads(out)
    paths = sorted(want, key=lambda p: int(p.rsplit("_", 1)[1][:-3]))
    assert stat(paths[-1])["direction"] == "whole"
    assert [stat(p)["direction"] for p in paths[:-1]] == ["backward"] * (len(paths) - 1)
    text = subprocess.run([sys.executable, "-m", "s4fs.cli", "stat", paths[0]],
                          capture_output=True, text=True, check=True).stdout
    assert f"as deltas on the newer run/{os.path.basename(paths[1])} (backward)" in text
    m.stop()                                        # a fresh node: nothing cached
    shutil.rmtree(m.cache)
    m.start()
    for p in paths:
        with open(p, "rb") as f:
            assert hashlib.sha256(f.read()).hexdigest() == want[p], p
