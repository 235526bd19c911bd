"""Ordinary events that once committed torn files or returned wrong bytes (issue 11).

Each test drives a real FUSE mount (or, where the event is about the store, the core
against a real store) the way a user or a training job does, and asserts what the user
cares about: the bytes that come back, whether a save raised, what another node sees.
"""

from __future__ import annotations

import errno
import io
import os
import subprocess
import sys
import textwrap
import time

import pytest
import torch

from s4fs import keys
from s4fs.errors import ChecksumError, NotFound, S4Error
from s4fs.fs import Filesystem, FsConfig
from s4fs.parse import looks_complete
from s4fs.stores import LocalStore
from s4fs.stores.faulty import FailingStore

import disk_helpers
from mount_helpers import FaultProxyProcess, s3_url

def torch_bytes(sd, name="ckpt") -> bytes:
    buf = io.BytesIO()
    torch.save(sd, buf)
    return buf.getvalue()


def big_state(mib: int, seed: int = 0) -> dict:
    g = torch.Generator().manual_seed(seed)
    n = (mib << 20) // 4 // 8
    return {f"layer{i}": torch.randn(n, generator=g) for i in range(8)}


def store_has(store_dir: str, path: str) -> bool:
    try:
        LocalStore(store_dir).get(keys.file_key(path))
        return True
    except NotFound:
        return False


def read_fresh(store_dir: str, path: str) -> bytes:
    """The file as a fresh mount (another node, an empty cache) would read it."""
    fs = Filesystem(LocalStore(store_dir), FsConfig())
    try:
        r = fs.open_read(path)
        try:
            return r.read(0, r.size)
        finally:
            r.release()
    finally:
        fs.close()


# --- 0: a failed pack upload fails the save and commits nothing ------------------------

@pytest.mark.fuse
@pytest.mark.s3
def test_one_failed_pack_upload_fails_the_save(request, mount_factory, s3_server_process):
    proxy = FaultProxyProcess(s3_server_process)
    request.addfinalizer(proxy.close)
    bucket = s3_url(request, "x").split("/")[2]
    url = (f"s3://{bucket}/one-bad-pack?endpoint_url={proxy.url}"
           f"&max_attempts=2&retry_seconds=2&backoff_base=0.01&backoff_max=0.05")
    m = mount_factory(store=url, name="onebad")
    path = os.path.join(m.path, "ckpt.pt")
    old = {"x": torch.arange(1000)}
    torch.save(old, path)
    proxy.inject_nth("internal", 1, "PUT", "/packs/")        # the second pack, every try
    with pytest.raises((OSError, RuntimeError)):
        torch.save(big_state(96), path)
    proxy.clear()
    # the previous version stays, on this mount and on a fresh one
    assert torch.equal(torch.load(path)["x"], old["x"])
    fresh = mount_factory(store=url, name="onebad-fresh")
    assert torch.equal(torch.load(os.path.join(fresh.path, "ckpt.pt"))["x"], old["x"])


def test_failed_pack_put_in_the_core_commits_nothing(tmp_path):
    store = FailingStore(LocalStore(tmp_path / "s"), fail_on={"put"},
                         key_prefix=keys.PACKS, after=1)
    fs = Filesystem(store, FsConfig(cache_dir=str(tmp_path / "c")))
    try:
        data = torch_bytes(big_state(80))
        h = fs.open_write("a.pt")
        with pytest.raises(S4Error):
            for off in range(0, len(data), 1 << 20):
                h.write(off, data[off: off + (1 << 20)])
            h.fsync()
        # every later call on that handle fails the same way; nothing was committed
        with pytest.raises(S4Error):
            h.write(len(data), b"more")
        with pytest.raises(S4Error):
            h.flush()
        h.release()
        assert not fs.exists("a.pt")
    finally:
        fs.close()
    assert not store_has(str(tmp_path / "s"), "a.pt")


def test_whole_file_hash_checked_when_read_end_to_end(tmp_path):
    fs = Filesystem(LocalStore(tmp_path / "s"), FsConfig(cache_dir=str(tmp_path / "c")))
    try:
        h = fs.open_write("f.bin")
        h.write(0, os.urandom(3 << 20))
        h.fsync()
        h.release()
        m = fs.manifest("f.bin", fresh=True)
        m.xxh128 = "0" * 32                       # a manifest that lies about the file
        fs.commit("f.bin", m)
    finally:
        fs.close()
    fs = Filesystem(LocalStore(tmp_path / "s"), FsConfig(cache_dir=str(tmp_path / "c2")))
    try:
        r = fs.open_read("f.bin")
        with pytest.raises(ChecksumError):
            pos = 0
            while pos < r.size:
                pos += len(r.read(pos, 1 << 20))
    finally:
        fs.close()


# --- 1: appends land at the true end ----------------------------------------------------

@pytest.mark.fuse
def test_appends_after_stat_land_at_the_end(mounted, tmp_path):
    lines = [b"ok\n", b"epoch 1 loss 0.42\n", b"epoch 2 loss 0.31\n"]
    for target in (os.path.join(mounted.path, "train.log"), str(tmp_path / "train.log")):
        with open(target, "ab") as f:
            f.write(lines[0])
        os.stat(target)
        for line in lines[1:]:
            with open(target, "ab") as f:
                f.write(line)
            os.stat(target)
    assert open(os.path.join(mounted.path, "train.log"), "rb").read() == b"".join(lines)
    assert os.stat(os.path.join(mounted.path, "train.log")).st_size == \
        os.stat(tmp_path / "train.log").st_size


@pytest.mark.fuse
def test_appends_to_a_torch_file_while_open_see_true_size(mounted):
    # a file whose format holds bytes back (a torch zip being streamed): size is exact
    path = os.path.join(mounted.path, "partial.pt")
    data = torch_bytes({"w": torch.randn(10000)})
    with open(path, "wb") as f:
        f.write(data[:1000])
        f.flush()
        assert os.stat(path).st_size == 1000
        assert os.fstat(f.fileno()).st_size == 1000
        f.write(data[1000:])
    assert open(path, "rb").read() == data


# --- 2: a forked child or a dup'd fd closing mid-save commits nothing ------------------

MODES = [pytest.param((), id="default"), pytest.param(("--writeback",), id="writeback")]


@pytest.mark.fuse
@pytest.mark.parametrize("extra", MODES)
def test_fork_and_dup_mid_save_commit_no_torn_file(mount_factory, extra):
    m = mount_factory(extra=extra)
    path = os.path.join(m.path, "ckpt.pt")
    data = torch_bytes(big_state(16))
    half = len(data) // 2
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        os.write(fd, data[:half])
        # a child that inherited the descriptor exits (the kernel sends a FLUSH)
        subprocess.run([sys.executable, "-c", "pass"], pass_fds=(fd,), check=True,
                       timeout=60)
        # and a dup'd descriptor is closed
        os.close(os.dup(fd))
        time.sleep(0.3)
        assert not store_has(m.store, "ckpt.pt"), "a torn checkpoint was committed"
        os.write(fd, data[half:])
    finally:
        os.close(fd)
    # close() of the writer committed the whole file before it returned (writeback:
    # accepted it; `s4fs sync` waits for the commit)
    m.sync()
    assert store_has(m.store, "ckpt.pt")
    assert read_fresh(m.store, "ckpt.pt") == data


@pytest.mark.fuse
@pytest.mark.parametrize("extra", MODES)
def test_torch_save_with_a_forked_child_mid_save(mount_factory, extra):
    """torch.save while another thread forks a child that inherits its descriptor."""
    m = mount_factory(extra=extra)
    code = textwrap.dedent(f"""
        import os, subprocess, sys, threading, torch
        path = {os.path.join(m.path, 'ckpt.pt')!r}
        sd = {{f"l{{i}}": torch.randn(1 << 20) for i in range(8)}}
        stop = threading.Event()
        def forker():
            while not stop.is_set():
                subprocess.run([sys.executable, "-c", "pass"], close_fds=False)
        t = threading.Thread(target=forker); t.start()
        try:
            torch.save(sd, path)
        finally:
            stop.set(); t.join()
        back = torch.load(path)
        assert all(torch.equal(back[k], sd[k]) for k in sd)
        print("ok")
    """)
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=300)
    assert res.returncode == 0 and "ok" in res.stdout, res.stderr
    m.sync()
    data = read_fresh(m.store, "ckpt.pt")
    assert len(data) > 32 << 20 and looks_complete(lambda o, n: data[o: o + n], len(data))


# --- 3: a full cache disk fails the write and close, and the old version stays ----------

@pytest.fixture
def small_disk(tmp_path):
    """A 16 MiB disk (loop-mounted ext4: the writeback modes refuse a cache in memory)."""
    with disk_helpers.small_disk(tmp_path / "small", 16 << 20) as path:
        yield path


@pytest.mark.fuse
@pytest.mark.parametrize("extra", MODES)
def test_full_cache_disk_fails_write_and_close_old_version_stays(mount_factory, tmp_path,
                                                                   small_disk, extra):
    store = str(tmp_path / "store")
    os.makedirs(store)
    m = mount_factory(store=store, name="smallcache", extra=extra)
    # the mount's cache dir lives on the 16 MiB disk
    m.stop()
    m.cache = small_disk
    m.start()
    path = os.path.join(m.path, "data.bin")
    old = os.urandom(4 << 20)
    with open(path, "wb") as f:
        f.write(old)
    m.sync()
    raised = None
    f = open(path, "r+b", buffering=0)
    try:
        for i in range(32):
            f.write(os.urandom(1 << 20))
    except OSError as exc:
        raised = exc
    finally:
        with pytest.raises(OSError) as close_err:
            f.close()
    assert raised is not None and raised.errno == errno.ENOSPC
    assert close_err.value.errno == errno.ENOSPC
    assert open(path, "rb").read() == old
    assert read_fresh(store, "data.bin") == old
    # once the failed handle is released its spool is gone: the next save works
    deadline = time.monotonic() + 10
    while os.statvfs(small_disk).f_bfree * os.statvfs(small_disk).f_bsize < 8 << 20 \
            and time.monotonic() < deadline:
        time.sleep(0.1)
    with open(path, "wb") as f:
        f.write(b"new")
    assert open(path, "rb").read() == b"new"


# --- 5: read-your-writes through an O_RDWR handle -------------------------------------

@pytest.mark.fuse
def test_read_your_writes_on_rdwr(mounted, tmp_path):
    for target in (os.path.join(mounted.path, "rmw.bin"), str(tmp_path / "rmw.bin")):
        fd = os.open(target, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            os.pwrite(fd, b"RMW", 0)
            assert os.pread(fd, 10, 0) == b"RMW"
            assert os.fstat(fd).st_size == 3
            os.pwrite(fd, b"x", 5)
            assert os.pread(fd, 10, 0) == b"RMW\0\0x"
            assert os.fstat(fd).st_size == 6
        finally:
            os.close(fd)
    assert open(os.path.join(mounted.path, "rmw.bin"), "rb").read() == b"RMW\0\0x"


# --- 6: reopening one path in a loop never freezes the mount ---------------------------

@pytest.mark.fuse
@pytest.mark.parametrize("extra", MODES)
def test_reopen_one_path_300_rounds_never_freezes(mount_factory, tmp_path, extra):
    m = mount_factory(extra=extra)
    code = textwrap.dedent(f"""
        import io, os, torch
        d = {m.path!r}
        sd = {{"w": torch.randn(4096), "b": torch.randn(64).to(torch.bfloat16)}}
        for i in range(300):
            sd["step"] = torch.tensor(i)
            torch.save(sd, os.path.join(d, "latest.pt"))
        assert torch.load(os.path.join(d, "latest.pt"))["step"].item() == 299
        expect = b""
        for i in range(300):
            line = f"step {{i}}\\n".encode()
            with open(os.path.join(d, "log.txt"), "ab") as f:
                f.write(line)
            expect += line
        assert open(os.path.join(d, "log.txt"), "rb").read() == expect
        for i in range(300):
            with open(os.path.join(d, "state.txt"), "w") as f:
                f.write(f"round {{i}}\\n" * (i % 7 + 1))
        assert open(os.path.join(d, "state.txt")).read() == "round 299\\n" * (299 % 7 + 1)
        print("ok")
    """)
    try:
        res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                             timeout=400)
    except subprocess.TimeoutExpired:
        m.kill9()                     # frees the blocked process before failing
        pytest.fail("the mount froze while one path was reopened in a loop")
    assert res.returncode == 0 and "ok" in res.stdout, res.stderr[-3000:]


# --- 8: missing data behind an existing file is EIO, never ENOENT ----------------------

@pytest.mark.fuse
def test_missing_pack_reads_as_eio_not_enoent(mount_factory, tmp_path):
    store = str(tmp_path / "store")
    os.makedirs(store)
    m = mount_factory(store=store, name="missing")
    path = os.path.join(m.path, "ckpt.pt")
    torch.save({"w": torch.randn(100000)}, path)
    m.stop()
    s = LocalStore(store)
    for obj in list(s.list(keys.PACKS)):
        s.delete(obj.key)
    m.cache = str(tmp_path / "cache-empty")       # a fresh mount: nothing cached locally
    os.makedirs(m.cache)
    m.start()
    assert os.path.exists(path)
    with pytest.raises(Exception) as err:
        torch.load(path)
    assert not isinstance(err.value, FileNotFoundError)
    with pytest.raises(OSError) as err2:
        open(path, "rb").read()
    assert err2.value.errno == errno.EIO
    assert not isinstance(err2.value, FileNotFoundError)
    with open(os.path.join(m.cache, "s4fs-mount.log")) as f:
        log = f.read()
    assert "missing from the store" in log and "ckpt.pt" in log


def test_only_a_whole_torch_file_looks_complete():
    """The rule behind commit-at-flush: no prefix of a torch.save file looks complete."""
    data = torch_bytes({"w": torch.randn(300), "b": torch.randn(7).half(), "n": 3})
    read = lambda o, n: data[o: o + n]                      # noqa: E731
    assert looks_complete(read, len(data))
    for cut in range(len(data)):
        assert not looks_complete(read, cut), cut
    # safetensors: complete once as long as its header says; other bytes: always
    import safetensors.torch
    st = safetensors.torch.save({"w": torch.randn(100)})
    st_read = lambda o, n: st[o: o + n]                     # noqa: E731
    assert looks_complete(st_read, len(st))
    assert not any(looks_complete(st_read, cut) for cut in range(9, len(st)))
    text = b"epoch 1 loss 0.42\n"
    assert looks_complete(lambda o, n: text[o: o + n], len(text))
    assert not looks_complete(lambda o, n: text[o: o + n], 5)   # could start anything


@pytest.mark.fuse
@pytest.mark.parametrize("extra", MODES)
def test_rename_over_a_file_just_closed(mount_factory, extra):
    """write a, write b, rename a over b at once (the closes' releases still in flight):
    b holds a's bytes, also in the store, never b's."""
    m = mount_factory(extra=extra)
    a, b = os.path.join(m.path, "a"), os.path.join(m.path, "b")
    for i in range(60):
        body = f"A{i}" if i % 2 else f"A{i} " * 20          # below and above 9 bytes
        with open(a, "w") as f:
            f.write(body)
        with open(b, "w") as f:
            f.write(f"B{i}")
        os.rename(a, b)
        assert open(b).read() == body and not os.path.exists(a), i
    m.sync()
    time.sleep(1.2)                           # past the metadata TTL
    assert read_fresh(m.store, "b").decode() == body


def _temp_cache(parent, name, *, age=3600.0, journal=False):
    d = parent / f"s4fs-cache-{name}"
    (d / "decoded").mkdir(parents=True)
    (d / "decoded" / "x").write_bytes(b"\0" * 4096)
    lock = d / ".lock"
    lock.touch()
    os.utime(lock, (time.time() - age, time.time() - age))
    if journal:
        (d / "journal").mkdir()
        (d / "journal" / "a.json").write_text("{}")
    return d


def test_dead_processes_temp_caches_are_swept_live_ones_kept(tmp_path, monkeypatch):
    """A process killed without closing left a temporary cache dir (CI once filled its
    disk with hundreds of them): the next Filesystem with no --cache-dir removes the
    dead ones, and keeps a locked one, a just-made one and one holding a journal."""
    import fcntl
    import tempfile
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    dead = _temp_cache(tmp_path, "dead")
    live = _temp_cache(tmp_path, "live")
    young = _temp_cache(tmp_path, "young", age=0)
    accepted = _temp_cache(tmp_path, "journal", journal=True)
    other = tmp_path / "s4fs-cache-notours"
    other.mkdir()
    fd = os.open(live / ".lock", os.O_RDWR)
    fcntl.flock(fd, fcntl.LOCK_EX)
    try:
        store = tmp_path / "store"
        store.mkdir()
        fs = Filesystem(LocalStore(str(store)), FsConfig())
        try:
            assert not dead.exists()
            assert live.exists() and young.exists() and other.exists()
            assert (accepted / "journal" / "a.json").exists()
            assert os.path.dirname(fs.cache_dir) == str(tmp_path)
            own = fs.cache_dir
        finally:
            fs.close()
        assert not os.path.exists(own)           # its own temp cache goes at close
    finally:
        os.close(fd)
