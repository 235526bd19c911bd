"""Real FUSE mount tests: unchanged torch.save / torch.load and everyday file tools."""

from __future__ import annotations

import ctypes
import errno
import hashlib
import io
import os
import shutil
import subprocess
import sys
import tarfile
import time

import pytest
import torch

pytestmark = pytest.mark.fuse


def local_twin(tmp_path, name):
    """torch.save names records after the file: a byte-for-byte twin needs the same name."""
    d = tmp_path / "local-twins"
    d.mkdir(exist_ok=True)
    return d / name


def sha(path) -> str:
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def state(seed=0, n=4):
    g = torch.Generator().manual_seed(seed)
    return {
        "emb": torch.randn(3000, 64, generator=g),
        "w16": torch.randn(256, 256, generator=g).to(torch.bfloat16),
        "h": torch.randn(1000, generator=g).half(),
        "step": torch.tensor(seed),
        "layers": [torch.randn(128, 128, generator=g) for _ in range(n)],
        "name": f"run-{seed}",
    }


def assert_same(a, b):
    if isinstance(a, dict):
        assert a.keys() == b.keys()
        for k in a:
            assert_same(a[k], b[k])
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b)
        for x, y in zip(a, b):
            assert_same(x, y)
    elif isinstance(a, torch.Tensor):
        assert a.dtype == b.dtype and torch.equal(a.view(torch.uint8) if a.dtype.is_floating_point and a.element_size() == 1 else a, b.view(torch.uint8) if b.dtype.is_floating_point and b.element_size() == 1 else b)
    else:
        assert a == b


def test_torch_save_load_unchanged(mounted, tmp_path):
    sd = state(1)
    dst = os.path.join(mounted.path, "ckpt_100.pt")
    torch.save(sd, dst)
    twin = local_twin(tmp_path, "ckpt_100.pt")
    torch.save(sd, twin)
    assert sha(dst) == sha(twin)
    assert os.path.getsize(dst) == os.path.getsize(twin)
    assert_same(torch.load(dst), sd)                       # default weights_only=True
    assert_same(torch.load(dst, mmap=True), sd)
    assert_same(torch.load(dst, weights_only=False), sd)
    mounted.restart()                                       # survives a remount
    assert sha(dst) == sha(twin)


def test_stored_smaller_and_stat_cli(mounted):
    sd = {"w": torch.randn(512, 512).to(torch.bfloat16), "opt": torch.zeros(100000)}
    dst = os.path.join(mounted.path, "small.pt")
    torch.save(sd, dst)
    mounted.sync()              # writeback: the stored size exists once it is committed
    out = subprocess.run([sys.executable, "-m", "s4fs.cli", "stat", dst, "--json"],
                         capture_output=True, text=True, check=True).stdout
    import json
    r = json.loads(out)
    assert r["logical"] == os.path.getsize(dst)
    assert 0 < r["stored"] < r["logical"]


def test_a_mixed_precision_checkpoint_stores_its_masters_on_their_copies(mounted, tmp_path):
    """torch.save of a bf16 model with its fp32 masters and AdamW state, unchanged code:
    read back exact after a remount, stored within 2 % of the same file without the
    copy, and ``s4fs stat`` names the copy each master is coded on (issue 57); the
    same with the optimizer saved first, each copy then coded on its master."""
    import json
    g = torch.Generator().manual_seed(3)
    master = {f"block{i}.weight": torch.randn(512, 1024, generator=g) * 0.02
              for i in range(3)}
    opt = {"state": {i: {"exp_avg": v * 1e-3} for i, v in enumerate(master.values())},
           "fp32_from_fp16_params": list(master.values())}
    sd = {"model": {k: v.bfloat16() for k, v in master.items()}, "optimizer": opt}
    dst = os.path.join(mounted.path, "mixed.pt")
    alone = os.path.join(mounted.path, "masters.pt")
    first = os.path.join(mounted.path, "masters-first.pt")
    sd_first = {"optimizer": opt, "model": sd["model"]}
    torch.save(sd, dst)
    torch.save({"optimizer": opt}, alone)
    torch.save(sd_first, first)
    twin = local_twin(tmp_path, "mixed.pt")
    torch.save(sd, twin)
    twin_first = local_twin(tmp_path, "masters-first.pt")
    torch.save(sd_first, twin_first)
    mounted.sync()
    mounted.restart()
    assert sha(dst) == sha(twin) and sha(first) == sha(twin_first)
    assert_same(torch.load(dst), sd)
    assert_same(torch.load(first), sd_first)

    def stat(path):
        return json.loads(subprocess.run([sys.executable, "-m", "s4fs.cli", "stat", path,
                                          "--json"], capture_output=True, text=True,
                                         check=True).stdout)
    pair, masters = stat(dst), stat(alone)
    assert pair["stored"] <= 1.02 * masters["stored"], (pair["stored"], masters["stored"])
    on = [t for t in pair["tensors"] if t.get("paired_on")]
    assert len(on) == 3 and all("model" in t["paired_on"] for t in on), pair["tensors"]
    later = stat(first)
    assert later["stored"] <= 1.02 * masters["stored"], (later["stored"], masters["stored"])
    on = [t for t in later["tensors"] if t.get("paired_on")]
    assert len(on) == 3 and all(t["dtype"] == "bfloat16" and "optimizer" in t["paired_on"]
                                for t in on), later["tensors"]


def test_cp_mv_rm_ls_stat(mounted, tmp_path):
    src = tmp_path / "blob.bin"
    src.write_bytes(os.urandom(3_000_000) + bytes(2_000_000))
    subprocess.run(["cp", str(src), mounted.path + "/"], check=True)
    m = os.path.join(mounted.path, "blob.bin")
    assert os.stat(m).st_size == src.stat().st_size
    ls = subprocess.run(["ls", "-la", mounted.path], capture_output=True, text=True,
                        check=True).stdout
    rows = {line.split()[-1]: line.split() for line in ls.splitlines()[1:]}
    assert {".", "..", "blob.bin"} <= set(rows)
    assert int(rows["blob.bin"][4]) == src.stat().st_size
    subprocess.run(["cp", m, str(tmp_path / "back.bin")], check=True)
    assert sha(tmp_path / "back.bin") == sha(src)
    os.mkdir(os.path.join(mounted.path, "sub"))
    subprocess.run(["mv", m, os.path.join(mounted.path, "sub", "moved.bin")], check=True)
    assert not os.path.exists(m)
    assert sha(os.path.join(mounted.path, "sub", "moved.bin")) == sha(src)
    assert sorted(os.listdir(mounted.path)) == ["sub"]
    os.remove(os.path.join(mounted.path, "sub", "moved.bin"))
    os.rmdir(os.path.join(mounted.path, "sub"))
    assert os.listdir(mounted.path) == []
    with pytest.raises(FileNotFoundError):
        os.stat(os.path.join(mounted.path, "sub"))


def test_non_torch_and_empty_files(mounted):
    p = os.path.join(mounted.path, "notes.json")
    with open(p, "w") as f:
        f.write('{"a": 1}\n')
    assert open(p).read() == '{"a": 1}\n'
    e = os.path.join(mounted.path, "empty")
    open(e, "w").close()
    assert os.path.getsize(e) == 0 and open(e, "rb").read() == b""


def test_overwrite_checkpoint_in_place(mounted, tmp_path):
    dst = os.path.join(mounted.path, "latest.pt")
    for seed in range(3):
        sd = state(seed)
        torch.save(sd, dst)
        torch.save(sd, local_twin(tmp_path, "latest.pt"))
        assert sha(dst) == sha(local_twin(tmp_path, "latest.pt"))
        assert_same(torch.load(dst), sd)


def test_append_truncate_and_dd(mounted):
    log = os.path.join(mounted.path, "train.log")
    expect = b""
    for i in range(5):
        line = f"step {i} loss {1.0 / (i + 1):.4f}\n".encode()
        with open(log, "ab") as f:
            f.write(line)
        expect += line
        assert open(log, "rb").read() == expect
    os.truncate(log, 10)
    assert open(log, "rb").read() == expect[:10]
    os.truncate(log, 20)
    assert open(log, "rb").read() == expect[:10] + bytes(10)
    data = os.path.join(mounted.path, "data.bin")
    payload = bytearray(os.urandom(1 << 20))
    with open(data, "wb") as f:
        f.write(payload)
    patch = os.urandom(4096)
    subprocess.run(["dd", "of=" + data, "bs=4096", "seek=7", "conv=notrunc", "status=none"],
                   input=patch, check=True)
    payload[7 * 4096: 8 * 4096] = patch
    assert open(data, "rb").read() == bytes(payload)
    with open(data, "r+b") as f:                   # read-write handle, seek back
        f.seek(100)
        f.write(b"xyz")
        f.seek(0)
        head = f.read(103)
    payload[100:103] = b"xyz"
    assert head == bytes(payload[:103])
    assert open(data, "rb").read() == bytes(payload)


def _writer(path, seed):
    import torch as t
    t.save({"x": t.randn(200_000, generator=t.Generator().manual_seed(seed)),
            "seed": seed}, path)


def test_four_processes_write_at_once(mounted, tmp_path):
    import multiprocessing as mp
    ctx = mp.get_context("spawn")
    paths = [os.path.join(mounted.path, f"rank{i}.pt") for i in range(4)]
    procs = [ctx.Process(target=_writer, args=(p, i)) for i, p in enumerate(paths)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
        assert p.exitcode == 0
    for i, p in enumerate(paths):
        _writer(local_twin(tmp_path, f"rank{i}.pt"), i)
        assert sha(p) == sha(local_twin(tmp_path, f"rank{i}.pt"))


def test_kill9_during_save_leaves_no_torn_file(mounted, tmp_path):
    good = os.path.join(mounted.path, "ckpt_1.pt")
    sd = state(5)
    torch.save(sd, good)
    ref = sha(good)
    code = (
        "import torch,sys\n"
        "sd={f'w{i}': torch.randn(1<<20) for i in range(200)}\n"
        f"torch.save(sd, {os.path.join(mounted.path, 'ckpt_2.pt')!r})\n"
    )
    writer = subprocess.Popen([sys.executable, "-c", code], stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 60
    target = os.path.join(mounted.path, "ckpt_2.pt")
    while time.monotonic() < deadline:
        try:
            if os.stat(target).st_size > 50 << 20:
                break
        except OSError:
            pass
        time.sleep(0.05)
    mounted.kill9()
    writer.wait(60)
    assert writer.returncode != 0
    mounted.restart()
    assert not os.path.exists(target), "a torn checkpoint is visible after the crash"
    assert sha(good) == ref
    assert_same(torch.load(good), sd)


def test_tar_and_rsync_out_of_the_mount(mounted, tmp_path):
    src = tmp_path / "tree"
    (src / "a" / "b").mkdir(parents=True)
    (src / "a" / "x.bin").write_bytes(os.urandom(100_000))
    (src / "a" / "b" / "y.txt").write_text("hello\n" * 1000)
    torch.save(state(2), src / "a" / "b" / "c.pt")
    shutil.copytree(src, os.path.join(mounted.path, "tree"))
    with tarfile.open(tmp_path / "t.tar", "w") as tf:
        tf.add(os.path.join(mounted.path, "tree"), arcname="tree")
    out = tmp_path / "untar"
    with tarfile.open(tmp_path / "t.tar") as tf:
        tf.extractall(out)
    for rel in ("a/x.bin", "a/b/y.txt", "a/b/c.pt"):
        assert sha(out / "tree" / rel) == sha(src / rel)
    if shutil.which("rsync"):
        dst = tmp_path / "rs"
        subprocess.run(["rsync", "-a", os.path.join(mounted.path, "tree") + "/", str(dst)],
                       check=True)
        for rel in ("a/x.bin", "a/b/y.txt", "a/b/c.pt"):
            assert sha(dst / rel) == sha(src / rel)
        # and rsync into the mount (temp file + rename)
        subprocess.run(["rsync", "-a", str(src) + "/", os.path.join(mounted.path, "rs2")],
                       check=True)
        for rel in ("a/x.bin", "a/b/y.txt", "a/b/c.pt"):
            assert sha(os.path.join(mounted.path, "rs2", rel)) == sha(src / rel)


def test_rename_noreplace(mounted):
    a = os.path.join(mounted.path, "a")
    b = os.path.join(mounted.path, "b")
    open(a, "w").write("A")
    open(b, "w").write("B")
    libc = ctypes.CDLL(None, use_errno=True)
    AT_FDCWD, RENAME_NOREPLACE = -100, 1
    rc = libc.renameat2(AT_FDCWD, a.encode(), AT_FDCWD, b.encode(), RENAME_NOREPLACE)
    assert rc == -1 and ctypes.get_errno() == errno.EEXIST
    assert open(b).read() == "B"
    os.rename(a, b)
    assert open(b).read() == "A" and not os.path.exists(a)


def test_failed_store_makes_close_fail(mount_factory, tmp_path):
    """A store that cannot take the data: torch.save raises, nothing half-written shows."""
    if os.geteuid() != 0:
        pytest.skip("needs root to mount a tiny tmpfs as the store")
    small = tmp_path / "tiny"
    small.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(small)], check=True)
    try:
        m = mount_factory(store=str(small), name="tiny-mnt")
        dst = os.path.join(m.path, "big.pt")
        # torch reports the failed close() as RuntimeError (its C++ stream) or OSError
        with pytest.raises((OSError, RuntimeError)):
            torch.save({"x": torch.randn(4 << 20)}, dst)
        assert not os.path.exists(dst)
        m.stop()
    finally:
        subprocess.run(["umount", "-l", str(small)])


def test_mount_helper_and_fstab_form(tmp_path):
    from mount_helpers import fuse_usable
    ok, why = fuse_usable()
    if not ok or os.geteuid() != 0:
        pytest.skip(why or "needs root")
    helper = shutil.which("mount.fuse.s4fs") or os.path.join(os.path.dirname(sys.executable),
                                                            "mount.fuse.s4fs")
    store, mp = tmp_path / "st", tmp_path / "mp"
    store.mkdir()
    mp.mkdir()
    link = "/sbin/mount.fuse.s4fs"
    made_link = not os.path.exists(link)
    if made_link:
        os.symlink(helper, link)
    try:
        opts = "rw,noatime,nodelta,nopassthrough,code_while_written,max_chain_read=1.5"
        res = subprocess.run(["mount", "-t", "fuse.s4fs", "-o", opts, str(store), str(mp)],
                             capture_output=True, text=True, timeout=120)
        assert res.returncode == 0, res.stderr
        assert "unknown option" not in res.stderr
        assert os.path.ismount(mp)
        (mp / "f.txt").write_text("via mount -t")
        assert (mp / "f.txt").read_text() == "via mount -t"
        w = torch.arange(1 << 16, dtype=torch.float32)
        torch.save({"w": w}, mp / "ckpt_1.pt")
        torch.save({"w": w + 1}, mp / "ckpt_2.pt")      # a delta of ckpt_1 by default
        raw = (mp / "ckpt_2.pt").read_bytes()
    finally:
        subprocess.run(["fusermount3", "-u", "-z", str(mp)], capture_output=True)
        if made_link:
            os.unlink(link)
    from s4fs.fs import Filesystem
    from s4fs.report import file_report
    from s4fs.stores import LocalStore
    fs = Filesystem(LocalStore(str(store)))
    try:
        assert file_report(fs, "ckpt_2.pt")["base"] is None      # nodelta: stored whole
        assert fs.open_read("ckpt_2.pt").read(0, len(raw)) == raw
    finally:
        fs.close()


def _resident_pages(path: str) -> tuple[int, int]:
    """(pages of the file in the kernel's page cache, pages in all) — mincore on a
    mapping of one descriptor, which itself keeps the cache (keep_cache)."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int,
                          ctypes.c_int, ctypes.c_long]
    fd = os.open(path, os.O_RDONLY)
    try:
        n = os.fstat(fd).st_size
        addr = libc.mmap(None, n, 1, 1, fd, 0)          # PROT_READ, MAP_SHARED
        pages = (n + 4095) // 4096
        vec = (ctypes.c_ubyte * pages)()
        try:
            assert libc.mincore(ctypes.c_void_p(addr), ctypes.c_size_t(n), vec) == 0
        finally:
            libc.munmap(ctypes.c_void_p(addr), ctypes.c_size_t(n))
        return sum(v & 1 for v in vec), pages
    finally:
        os.close(fd)


def test_pages_torch_save_wrote_stay_cached_for_the_load(mounted):
    """The load right after a save is served by the kernel's page cache: the save's pages
    survive the stat and the open that follow (the mtime does not move mid-write)."""
    if mounted.writeback:
        pytest.skip("writeback: close() returns before the commit, and the open that follows "
                    "cannot yet tell the kernel that its pages are the committed version "
                    "(docs/SEMANTICS.md, mtime)")
    path = os.path.join(mounted.path, "fresh.pt")
    torch.save({"w": torch.randn(4 << 20), "h": torch.randn(1 << 20).half()}, path)
    os.stat(path)
    resident, pages = _resident_pages(path)
    # all but pages no single write covered whole (the kernel does not mark those
    # up to date: record boundaries, the tail; how many depends on torch's write sizes)
    # — before, a moving mtime dropped every page: 0 of them
    assert resident >= 0.9 * pages, f"only {resident} of {pages} pages still cached"
    before = os.stat(path).st_mtime
    with open(path, "ab") as f:                 # a new version moves the mtime
        f.write(b"x")
    assert os.stat(path).st_mtime >= before


def test_pages_stay_cached_for_an_open_before_the_release(mounted):
    """close() returns once the commit is done; the kernel sends the release after it.
    An open that comes first (here: a second descriptor keeps the release from being
    sent at all) must still find the pages it holds are the committed version — it
    found nothing cached once in five CI runs before the commit was noted at flush."""
    if mounted.writeback:
        pytest.skip("writeback: close() returns before the commit (see the test above)")
    path = os.path.join(mounted.path, "early.pt")
    buf = io.BytesIO()
    torch.save({"w": torch.randn(2 << 20)}, buf)
    data = buf.getvalue()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    for at in range(0, len(data), 1 << 20):
        os.write(fd, data[at: at + (1 << 20)])
    other = os.dup(fd)
    os.close(fd)                                # flush: the commit; no release yet
    try:
        os.stat(path)
        resident, pages = _resident_pages(path)
        assert resident >= 0.9 * pages, f"only {resident} of {pages} pages still cached"
        with open(path, "rb") as f:
            assert f.read() == data
    finally:
        os.close(other)


def test_read_ahead_is_raised_before_the_mount_reports_ready(mount_factory):
    """A file takes the connection's read-ahead when it is opened. A file opened the
    moment the mount reports ready (a fresh node's first torch.load) must get the raised
    one: with the kernel's 128 KiB the whole load goes in 128 KiB requests, each a trip
    through the daemon (measured: 2074 reads for a 259 MiB checkpoint instead of 261)."""
    from s4fs.mount._daemon import READAHEAD_KB, mounts_at
    m = mount_factory()
    knob = f"/sys/class/bdi/{mounts_at(m.path)[-1].device}/read_ahead_kb"
    if not os.access(knob, os.W_OK):
        pytest.skip(f"{knob} is not writable here (not root, or no sysfs)")
    with open(knob) as f:
        assert int(f.read()) == READAHEAD_KB


def test_the_kernel_keeps_more_reads_in_flight_when_the_mount_is_ready(mount_factory):
    """A cold file read through FUSE requests waits on a disk read per request: the
    kernel must keep more than its default 12 read-ahead requests in flight (the
    daemon mounts fusectl, where a container lacks it, to say so)."""
    from s4fs.mount._daemon import FUSECTL, MAX_BACKGROUND, mounts_at
    if os.geteuid() != 0 or not os.path.isdir(FUSECTL):
        pytest.skip(f"needs root and {FUSECTL}")
    m = mount_factory(extra=("--no-passthrough",))
    conn = os.path.join(FUSECTL, mounts_at(m.path)[-1].device.partition(":")[2])
    with open(os.path.join(conn, "max_background")) as f:
        assert int(f.read()) == MAX_BACKGROUND
    data = os.urandom(3 << 20)
    with open(os.path.join(m.path, "a.bin"), "wb") as f:
        f.write(data)
    with open(os.path.join(m.path, "a.bin"), "rb") as f:
        assert f.read() == data
