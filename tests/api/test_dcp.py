"""torch.distributed.checkpoint with s4fs: the plug-in writer/reader straight into a store
(local and S3), and — the whole multi-node story — 4 ranks under torchrun writing through
two mounts of one S3 prefix, loaded back at 2 ranks and at 1 (resharded), while old step
folders are deleted and collected."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import threading

import pytest
import torch
import torch.distributed.checkpoint as dcp

import s4fs
from s4fs.dcp import StorageReader, StorageWriter
from s4fs.report import file_report

TESTS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))   # dcp_job.py


def train_state(steps: int):
    """A real model + AdamW after ``steps`` steps, as a DCP state dict."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.GELU(),
                                torch.nn.Linear(512, 256))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    for _ in range(steps):
        model(torch.randn(8, 256)).pow(2).mean().backward()
        opt.step()
        opt.zero_grad()
    return {"model": model.state_dict(), "optim": opt.state_dict()}


def empty_like_state():
    sd = train_state(1)
    return torch.utils._pytree.tree_map(
        lambda t: torch.zeros_like(t) if torch.is_tensor(t) else t, sd)


def same(a, b) -> bool:
    fa, _ = torch.utils._pytree.tree_flatten(a)
    fb, _ = torch.utils._pytree.tree_flatten(b)
    return len(fa) == len(fb) and all(
        (torch.equal(x, y) if torch.is_tensor(x) else x == y) for x, y in zip(fa, fb))


def check_series(root: str, steps=(2, 4, 6)):
    for i, step in enumerate(steps):
        sd = train_state(step)
        w = StorageWriter(f"{root}/step_{step}")
        if i == len(steps) - 1:
            dcp.async_save(sd, storage_writer=w).result()      # async_save works too
        else:
            dcp.save(sd, storage_writer=w)
    fs, _ = s4fs.resolve(f"{root}/step_{steps[-1]}/.metadata")
    for i, step in enumerate(steps):
        back = empty_like_state()
        dcp.load(back, storage_reader=StorageReader(f"{root}/step_{step}"))
        assert same(back, train_state(step)), f"step {step} came back different"
        shard = [n for n in fs.listdir(f"step_{step}") if n.endswith(".distcp")]
        assert shard and ".metadata" in fs.listdir(f"step_{step}")
        rep = file_report(fs, f"step_{step}/{shard[0]}")
        if i:
            assert rep["base"] == f"step_{steps[i - 1]}/{shard[0]}", \
                "a shard should be a delta on the same rank's shard of the step before"
        assert rep["stored"] < rep["logical"]


def test_writer_into_a_local_store(tmp_path):
    check_series(str(tmp_path / "run"))
    fs, rel = s4fs.resolve(str(tmp_path / "run" / "step_2" / ".metadata"))
    assert fs.store.url.endswith("/run") and rel == "step_2/.metadata"   # run/ is the store


@pytest.mark.s3
def test_writer_into_s3(s3_endpoint, s3_bucket, monkeypatch):
    monkeypatch.setenv("AWS_ENDPOINT_URL", s3_endpoint)
    check_series(f"s3://{s3_bucket}/run7")


def test_a_checkpoint_that_is_not_there_is_a_clear_error(tmp_path):
    check_series(str(tmp_path / "run"), steps=(1,))
    with pytest.raises(BaseException) as info:         # DCP's CheckpointException
        dcp.load(empty_like_state(), storage_reader=StorageReader(str(tmp_path / "run" /
                                                                      "step_9")))
    assert "no file 'step_9/.metadata'" in str(info.value)


# --- torchrun, two nodes (two mounts of one S3 prefix) ------------------------------------

def torchrun(nproc: int, *args: str, timeout=600) -> subprocess.CompletedProcess:
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=TESTS + os.pathsep +
               os.environ.get("PYTHONPATH", ""))
    return subprocess.run([sys.executable, "-m", "torch.distributed.run",
                           "--standalone", f"--nproc-per-node={nproc}",
                           os.path.join(TESTS, "dcp_job.py"), *args],
                          capture_output=True, text=True, timeout=timeout, env=env)


def ok(res: subprocess.CompletedProcess) -> str:
    assert res.returncode == 0, (res.stdout[-3000:], res.stderr[-3000:])
    return res.stdout


@pytest.mark.fuse
@pytest.mark.s3
@pytest.mark.slow
def test_four_ranks_two_nodes_one_bucket_reshard_and_delete_while_saving(
        request, mount_factory):
    from mount_helpers import s3_url
    url = s3_url(request, "job")
    node_a = mount_factory(store=url, name="nodeA")
    node_b = mount_factory(store=url, name="nodeB")
    roots = f"{node_a.path},{node_b.path}"
    for d in (node_a.path, node_b.path):
        os.makedirs(os.path.join(d, "run"), exist_ok=True)
    out = ok(torchrun(4, "save", "--roots", roots, "--steps", "1,2,3"))
    assert "save step 3 ok at world size 4" in out
    # every rank's shard is in the one bucket: both nodes list all four
    for d in (node_a.path, node_b.path):
        names = sorted(os.listdir(os.path.join(d, "run", "step_3")))
        assert names == [".metadata"] + [f"__{r}_0.distcp" for r in range(4)], names
    # resume with fewer ranks: 2 (one per node), then 1 — DCP reshards, every byte exact
    assert "load step 3 ok at world size 2" in ok(
        torchrun(2, "load", "--roots", roots, "--steps", "1,2,3", "--per-node", "1"))
    assert "load step 2 ok at world size 1" in ok(
        torchrun(1, "load", "--roots", node_b.path, "--steps", "2,3"))
    # node A deletes the oldest step (and gc runs) while both nodes save the next one
    saver = {}
    t = threading.Thread(target=lambda: saver.setdefault(
        "res", torchrun(4, "save", "--roots", roots, "--steps", "4")))
    t.start()
    shutil.rmtree(os.path.join(node_a.path, "run", "step_1"))
    gc = subprocess.run([sys.executable, "-m", "s4fs.cli", "gc", url, "-q"],
                        capture_output=True, text=True, timeout=300)
    t.join(600)
    assert gc.returncode == 0, gc.stderr
    ok(saver["res"])
    node_a.sync()
    node_b.sync()
    # deltas of step 2 on step 1 still read (gc keeps what later steps need)
    assert "load step 4 ok at world size 2" in ok(
        torchrun(2, "load", "--roots", roots, "--steps", "2,3,4", "--per-node", "1"))
    assert not os.path.exists(os.path.join(node_b.path, "run", "step_1"))


@pytest.mark.s3
@pytest.mark.slow
def test_four_ranks_with_the_s4fs_writer_no_mount(request, s3_server_process,
                                                   monkeypatch):
    from mount_helpers import s3_url
    url = s3_url(request, "direct")
    bucket = url.split("/")[2]
    env_root = f"s3://{bucket}/direct"
    monkeypatch.setenv("AWS_ENDPOINT_URL", s3_server_process)
    ok(torchrun(4, "save", "--roots", env_root, "--steps", "1,2", "--writer", "s4fs"))
    assert "load step 2 ok at world size 2" in ok(
        torchrun(2, "load", "--roots", env_root, "--steps", "1,2", "--writer", "s4fs"))


@pytest.mark.fuse
@pytest.mark.s3
def test_two_nodes_write_one_path_last_commit_wins(request, mount_factory):
    """Two nodes save the same path at the same moment: afterwards the file is exactly
    one of the two versions, the same on both nodes — never a mix."""
    import time
    from mount_helpers import s3_url
    url = s3_url(request, "race")
    node_a = mount_factory(store=url, name="raceA")
    node_b = mount_factory(store=url, name="raceB")
    versions = {}
    for node, seed in ((node_a, 1), (node_b, 2)):
        g = torch.Generator().manual_seed(seed)
        versions[node.path] = {"w": torch.randn(3 << 20, generator=g), "who": seed}
    errors = []

    def save(node):
        try:
            torch.save(versions[node.path], os.path.join(node.path, "latest.pt"))
        except Exception as exc:                 # noqa: BLE001 - reported below
            errors.append(exc)
    for _ in range(3):
        ts = [threading.Thread(target=save, args=(n,)) for n in (node_a, node_b)]
        [t.start() for t in ts]
        [t.join(300) for t in ts]
        assert not errors, errors
        time.sleep(2.5)                          # past both nodes' metadata caches
        seen = [torch.load(os.path.join(n.path, "latest.pt")) for n in (node_a, node_b)]
        assert seen[0]["who"] == seen[1]["who"], "the two nodes disagree"
        expect = versions[node_a.path] if seen[0]["who"] == 1 else versions[node_b.path]
        for s in seen:
            assert torch.equal(s["w"], expect["w"])
