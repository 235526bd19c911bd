"""--writeback mounts: close() returns once the spool holds the bytes; commits run in the
background, journalled, retried, replayed after a crash; `s4fs sync` / `s4fs status`."""

from __future__ import annotations

import hashlib
import io
import json
import os
import subprocess
import sys
import threading
import time

import pytest
import torch

from s4fs import keys
from s4fs.errors import NotFound
from s4fs.fs import Filesystem, FsConfig
from s4fs.stores import LocalStore, open_store

from mount_helpers import FaultProxyProcess, gauge, s3_url, scrape

pytestmark = pytest.mark.fuse


def cli(*args, timeout=120):
    return subprocess.run([sys.executable, "-m", "s4fs.cli", *args], capture_output=True,
                          text=True, timeout=timeout)


def torch_bytes(sd) -> bytes:
    buf = io.BytesIO()
    torch.save(sd, buf)
    return buf.getvalue()


def committed(store_url: str, path: str) -> bytes | None:
    """The file as a fresh node reads it from the store (None: not committed)."""
    store = open_store(store_url) if "://" in store_url else LocalStore(store_url)
    try:
        store.get(keys.file_key(path))
    except NotFound:
        return None
    fs = Filesystem(store, FsConfig(decoded_cache_bytes=0))
    try:
        r = fs.open_read(path)
        return r.read(0, r.size)
    finally:
        fs.close()


def wait_for(pred, timeout=60.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return True
        time.sleep(0.1)
    return False


def test_close_returns_then_commits_in_background(mount_factory):
    m = mount_factory(extra=["--writeback"])
    sd = {"w": torch.randn(1 << 20), "b": torch.randn(1000).to(torch.bfloat16)}
    path = os.path.join(m.path, "ckpt.pt")
    torch.save(sd, path)
    # listed and readable at once, from the spool
    assert "ckpt.pt" in os.listdir(m.path)
    back = torch.load(path)
    assert torch.equal(back["w"], sd["w"]) and torch.equal(back["b"], sd["b"])
    res = cli("sync", m.path)
    assert res.returncode == 0, res.stderr
    data = open(path, "rb").read()
    assert committed(m.store, "ckpt.pt") == data
    st = json.loads(cli("status", m.path, "--json").stdout)
    assert st["writeback"] is True and st["pending"] == []


def test_fsync_waits_for_the_commit(mount_factory):
    m = mount_factory(extra=["--writeback"])
    path = os.path.join(m.path, "f.bin")
    payload = os.urandom(3 << 20)
    with open(path, "wb") as f:
        f.write(payload)
        f.flush()
        os.fsync(f.fileno())
        assert committed(m.store, "f.bin") == payload


@pytest.mark.s3
def test_store_down_status_sync_then_recovery_commits(request, mount_factory,
                                                      s3_server_process, tmp_path,
                                                      monkeypatch):
    from s4fs.service.health import commits_probe
    metrics_dir = str(tmp_path / "metrics")
    os.makedirs(metrics_dir)
    monkeypatch.setenv("PROMETHEUS_MULTIPROC_DIR", metrics_dir)   # the daemon records here
    proxy = FaultProxyProcess(s3_server_process)
    request.addfinalizer(proxy.close)
    bucket = s3_url(request, "x").split("/")[2]
    url = (f"s3://{bucket}/wb?endpoint_url={proxy.url}"
           f"&max_attempts=2&retry_seconds=1&backoff_base=0.01&backoff_max=0.05")
    direct = f"s3://{bucket}/wb?endpoint_url={s3_server_process}"
    m = mount_factory(store=url, name="wbdown", extra=["--writeback"])
    proxy.inject("internal", method="PUT")                # the store refuses every put
    sd = {"w": torch.randn(200_000)}
    path = os.path.join(m.path, "ckpt.pt")
    torch.save(sd, path)                                  # accepted: close() succeeds
    assert wait_for(lambda: json.loads(cli("status", m.path, "--json").stdout)
                    ["pending"][0]["attempts"] >= 1)
    st = cli("status", m.path)
    assert "ckpt.pt" in st.stdout and "failing" in st.stdout
    st = cli("stat", path)              # not in the store yet: said so, not "no such file"
    assert st.returncode == 1 and "not in the store yet" in st.stderr and \
        "commit failed" in st.stderr, st.stderr
    # /metrics and /healthz say so too
    text = scrape(metrics_dir)
    assert gauge(text, "s4fs_pending_commit_files") == 1
    assert gauge(text, "s4fs_failing_commits") == 1
    assert gauge(text, "s4fs_pending_commit_bytes") > 0
    with pytest.raises(RuntimeError, match="ckpt.pt"):
        commits_probe(m.path)()
    res = cli("sync", m.path, "--timeout", "20")
    assert res.returncode == 1 and "ckpt.pt" in res.stderr
    assert committed(direct, "ckpt.pt") is None
    # the bytes are kept: this mount reads them back exactly
    assert torch.equal(torch.load(path)["w"], sd["w"])
    proxy.clear()                                         # the store comes back
    res = cli("sync", m.path, "--timeout", "120")
    assert res.returncode == 0, res.stderr
    assert gauge(scrape(metrics_dir), "s4fs_pending_commit_files") == 0
    assert "0 files pending" in commits_probe(m.path)()
    got = committed(direct, "ckpt.pt")
    assert got is not None and hashlib.sha256(got).digest() == \
        hashlib.sha256(open(path, "rb").read()).digest()
    assert torch.equal(torch.load(io.BytesIO(got))["w"], sd["w"])


@pytest.mark.s3
def test_kill9_after_close_before_commit_replays_the_journal(request, mount_factory,
                                                            s3_server_process):
    proxy = FaultProxyProcess(s3_server_process)
    request.addfinalizer(proxy.close)
    bucket = s3_url(request, "x").split("/")[2]
    url = (f"s3://{bucket}/crash?endpoint_url={proxy.url}"
           f"&max_attempts=2&retry_seconds=1&backoff_base=0.01&backoff_max=0.05")
    direct = f"s3://{bucket}/crash?endpoint_url={s3_server_process}"
    m = mount_factory(store=url, name="wbcrash", extra=["--writeback"])
    proxy.inject("internal", method="PUT")
    sd = {"w": torch.randn(300_000), "h": torch.randn(5000).half()}
    path = os.path.join(m.path, "ckpt.pt")
    torch.save(sd, path)
    expect = open(path, "rb").read()
    m.kill9()                                  # accepted, never committed
    m.stop()
    proxy.clear()
    m.start()                                  # the same cache dir: the journal replays
    assert open(path, "rb").read() == expect   # shown again at once
    res = cli("sync", m.path, "--timeout", "120")
    assert res.returncode == 0, res.stderr
    assert committed(direct, "ckpt.pt") == expect


def test_kill9_mid_write_leaves_nothing_torn(mount_factory, tmp_path):
    m = mount_factory(extra=["--writeback"])
    path = os.path.join(m.path, "ckpt.pt")
    data = torch_bytes({"w": torch.randn(1 << 21)})
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        os.write(fd, data[: len(data) // 2])
        m.kill9()
    finally:
        try:
            os.close(fd)
        except OSError:
            pass
    m.stop()
    m.start()
    assert committed(m.store, "ckpt.pt") is None
    assert not os.path.exists(path)
    torch.save({"x": torch.ones(3)}, path)
    assert torch.equal(torch.load(path)["x"], torch.ones(3))


def test_reads_while_committing_are_exact(mount_factory):
    m = mount_factory(extra=["--writeback"])
    sds = [{"w": torch.randn(1 << 19, generator=torch.Generator().manual_seed(i))}
           for i in range(4)]
    for i, sd in enumerate(sds):
        torch.save(sd, os.path.join(m.path, f"ckpt_{i}.pt"))
        # read back while this one (and earlier ones) commit in the background
        for j in range(i + 1):
            assert torch.equal(torch.load(os.path.join(m.path, f"ckpt_{j}.pt"))["w"],
                               sds[j]["w"])
    assert cli("sync", m.path).returncode == 0
    for i, sd in enumerate(sds):
        got = committed(m.store, f"ckpt_{i}.pt")
        assert torch.equal(torch.load(io.BytesIO(got))["w"], sd["w"])


class PutsRefused(LocalStore):
    """A local store that refuses every put while ``down`` is set (a store outage)."""
    down = False

    def put(self, key, data, *args, **kw):
        if self.down:
            raise OSError("the store is down (test)")
        return super().put(key, data, *args, **kw)

    def put_parts(self, key, parts, *args, **kw):
        if self.down:
            raise OSError("the store is down (test)")
        return super().put_parts(key, parts, *args, **kw)


@pytest.mark.parametrize("change", ["utime", "chmod", "truncate"])
def test_a_change_to_an_accepted_file_before_its_commit_is_committed(tmp_path, change):
    """utime / chmod / truncate by path of a file that close() accepted but whose commit
    has not landed yet (the store is down): the change is kept, and the file, with it,
    is committed once the store is back — not dropped at unmount."""
    store = PutsRefused(str(tmp_path / "store"))
    cfg = FsConfig(writeback=True, metadata_ttl=0.0, decoded_cache_bytes=0,
                   cache_dir=str(tmp_path / "cache"))
    fs = Filesystem(store, cfg)
    data = os.urandom(200_000)
    store.down = True
    h = fs.open_write("f.bin")
    h.write(0, data)
    h.flush()
    h.release()                                    # accepted; its commit fails for now
    assert wait_for(lambda: fs.pending() and fs.pending()[0]["attempts"] >= 1)
    want = data
    if change == "utime":
        fs.set_attrs("f.bin", mtime_ns=1_700_000_000_987_654_321,
                     atime_ns=1_600_000_000_123_456_789)
    elif change == "chmod":
        fs.set_attrs("f.bin", mode=0o600)
    else:
        fs.set_attrs("f.bin", size=1000)
        want = data[:1000]
    assert [p["path"] for p in fs.pending()] == ["f.bin"]   # still to be committed
    store.down = False
    assert fs.sync(timeout=60) == []
    fs.close()
    fs = Filesystem(PutsRefused(str(tmp_path / "store")), FsConfig(
        metadata_ttl=0.0, decoded_cache_bytes=0, cache_dir=str(tmp_path / "cache2")))
    try:
        r = fs.open_read("f.bin")
        assert r.read(0, r.size) == want
        a = fs.stat("f.bin")
        if change == "utime":
            assert a.times_ns()[:2] == (1_600_000_000_123_456_789,
                                        1_700_000_000_987_654_321)
        if change == "chmod":
            assert a.mode & 0o7777 == 0o600
    finally:
        fs.close()


class CommitLandsInTheRename(PutsRefused):
    """A store that, at one step of a rename (``op`` on ``key``), first brings the store
    back and gives the committer the chance to commit the accepted file (up to ``hold``
    seconds for its manifest to land as ``lands``)."""
    hold = 2.0

    def __init__(self, root, op, key, lands):
        super().__init__(root)
        self.op, self.key, self.lands = op, key, keys.file_key(lands)
        self.fs = None
        self.landed = threading.Event()

    def _step(self, op, key):
        if op == self.op and key == self.key and self.fs is not None and self.down:
            self.down = False
            self.landed.clear()
            threading.Thread(target=self.fs.sync, kwargs={"timeout": 30},
                             daemon=True).start()
            self.landed.wait(self.hold)

    def put(self, key, data, *args, **kw):
        return self.put_parts(key, [data], *args, **kw)

    def put_parts(self, key, parts, *args, **kw):
        if key.startswith(keys.DIRS):      # the outage is of the file's objects only
            return LocalStore.put_parts(self, key, parts, *args, **kw)
        out = super().put_parts(key, parts, *args, **kw)
        if key == self.lands:
            self.landed.set()
        return out

    def delete(self, key):
        self._step("delete", key)
        return super().delete(key)

    def list(self, prefix=""):
        out = list(super().list(prefix))
        self._step("list", prefix)
        return out


@pytest.mark.parametrize("what", ["file", "folder"])
def test_a_rename_while_the_commit_of_an_accepted_file_lands_keeps_the_file(tmp_path, what):
    """--writeback: a file is accepted (its commit still pending), then renamed (the
    safetensors temp file + rename over + chmod; or its folder), and the commit lands
    in the middle of the rename. The file must be at its new name, whole. (It once
    vanished: the chmod after the rename saw ENOENT and the checkpoint was gone.)"""
    if what == "file":
        src, dst = ".tmp-b.bin", "b.bin"
        store = CommitLandsInTheRename(str(tmp_path / "store"), "delete",
                                       keys.file_key(dst), dst)
    else:
        src, dst = "d/b.bin", "e/b.bin"
        store = CommitLandsInTheRename(str(tmp_path / "store"), "list",
                                       keys.FILES + "d/", src)
    cfg = FsConfig(writeback=True, metadata_ttl=0.0, decoded_cache_bytes=0,
                   cache_dir=str(tmp_path / "cache"))
    fs = Filesystem(store, cfg)
    store.fs = fs
    try:
        old, new = os.urandom(150_000), os.urandom(200_000)
        if what == "folder":
            fs.mkdir("d")
        h = fs.open_write("b.bin")
        h.write(0, old)
        h.release()
        assert fs.sync(timeout=60) == []
        store.down = True
        h = fs.open_write(src)
        h.write(0, new)
        h.release()                                # accepted; its commit waits
        if what == "folder":
            fs.rename("d", "e")
        else:
            fs.rename(src, dst)
        fs.set_attrs(dst, mode=0o600)              # once ENOENT
        assert fs.sync(timeout=60) == []
        r = fs.open_read(dst)
        assert r.read(0, r.size) == new
        assert fs.stat(dst).mode & 0o7777 == 0o600
        assert not fs.exists(src)
    finally:
        fs.close()
    assert committed(str(tmp_path / "store"), dst) == new
    assert committed(str(tmp_path / "store"), src) is None
