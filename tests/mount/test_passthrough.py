"""``mount --writeback --passthrough``: the kernel writes a file being saved straight into
its spool (FUSE passthrough), the daemon sees no write request, and everything else
holds as on the request path: the bytes that come back, what is committed, readers of
the file while it is written, truncates, a crash after close().

Needs pyfuse3 built with passthrough (``make test`` builds it beside the venv's own and
names it in S4FS_PYFUSE3_PASSTHROUGH; the daemon imports it through PYTHONPATH)."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import time

import pytest
import torch

from mount_helpers import Mount

pytestmark = pytest.mark.fuse

MiB = 1 << 20


def data(seed: str, n: int) -> bytes:
    out, k = bytearray(), 0
    while len(out) < n:
        out += hashlib.sha256(f"{seed}-{k}".encode()).digest()
        k += 1
    return bytes(out[:n])


@pytest.fixture
def pt_mount(pt_site, mount_factory):
    m = mount_factory(extra=["--writeback", "--passthrough", "-v"])
    return m


def log_of(m: Mount) -> str:
    with open(os.path.join(m.cache, "s4fs-mount.log"), errors="replace") as f:
        return f.read()


def passed_through(m: Mount, name: str) -> bool:
    return f"{name}: written through FUSE passthrough" in log_of(m)


def remounted(m: Mount, tmp_path, name: str) -> Mount:
    """The same store on a plain mount (no passthrough, no writeback), once ``m`` has
    committed everything and is gone: what the store holds."""
    m.sync()
    m.stop()
    plain = Mount(m.store, str(tmp_path / name), str(tmp_path / f"cache-{name}"))
    os.makedirs(plain.path)
    os.makedirs(plain.cache)
    plain.start()
    return plain


def test_torch_save_through_passthrough_is_committed_bit_exact(pt_mount, tmp_path):
    """A model and its AdamW state saved through passthrough load back equal, are
    written without write requests, and the store holds the same bytes, compressed."""
    model = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.GELU(),
                                torch.nn.Linear(512, 256))
    opt = torch.optim.AdamW(model.parameters())
    model(torch.randn(8, 256)).sum().backward()
    opt.step()
    state = {"model": model.state_dict(), "optim": opt.state_dict()}
    p = os.path.join(pt_mount.path, "ckpt_1.pt")
    torch.save(state, p)
    raw = open(p, "rb").read()
    back = torch.load(p)
    assert all(torch.equal(back["model"][k], v) for k, v in state["model"].items())
    assert passed_through(pt_mount, "ckpt_1.pt"), "the save went through write requests"
    plain = remounted(pt_mount, tmp_path, "plain")
    try:
        assert open(os.path.join(plain.path, "ckpt_1.pt"), "rb").read() == raw
        stored = sum(os.path.getsize(os.path.join(d, f))
                     for d, _, fs in os.walk(pt_mount.store) for f in fs)
        assert stored < len(raw), f"the store holds {stored} bytes for {len(raw)}"
    finally:
        plain.stop()


def test_a_reader_of_a_file_being_written_through_passthrough_reads_what_is_written(
        pt_mount, tmp_path):
    """While the kernel writes the spool, another open of the file reads the same spool:
    its size and bytes are what has been written so far; after close() a fresh open
    reads the whole file, and so does the store after the commit."""
    p = os.path.join(pt_mount.path, "growing.bin")
    first, second = data("first", 3 * MiB + 5), data("second", 2 * MiB + 7)
    with open(p, "wb", buffering=0) as w:
        w.write(first)
        with open(p, "rb") as r:
            assert os.fstat(r.fileno()).st_size == len(first)
            assert r.read() == first
            w.write(second)
            assert os.fstat(r.fileno()).st_size == len(first) + len(second)
            r.seek(0)
            assert r.read() == first + second
    assert open(p, "rb").read() == first + second
    assert passed_through(pt_mount, "growing.bin")
    plain = remounted(pt_mount, tmp_path, "plain")
    try:
        assert open(os.path.join(plain.path, "growing.bin"), "rb").read() == first + second
    finally:
        plain.stop()


def test_truncate_and_rewrite_through_passthrough_match_a_local_disk(pt_mount, tmp_path):
    """ftruncate (a SETATTR the daemon does get) between writes the kernel passes
    through: the file, then the store, hold what a local disk holds."""
    local = tmp_path / "local.bin"
    for p in (os.path.join(pt_mount.path, "t.bin"), str(local)):
        with open(p, "wb", buffering=0) as f:
            f.write(data("a", 4 * MiB + 3))
            f.truncate(MiB + 1)
            f.seek(0, os.SEEK_END)
            f.write(data("b", 700_001))
            f.seek(100)
            f.write(b"in place")
    want = local.read_bytes()
    assert open(os.path.join(pt_mount.path, "t.bin"), "rb").read() == want
    assert passed_through(pt_mount, "t.bin")
    plain = remounted(pt_mount, tmp_path, "plain")
    try:
        assert open(os.path.join(plain.path, "t.bin"), "rb").read() == want
    finally:
        plain.stop()


def test_an_overwrite_while_another_process_reads_stays_on_write_requests(pt_mount):
    """The kernel allows no passthrough open beside cached ones: a save over a file that
    another descriptor reads goes through write requests, and succeeds."""
    p = os.path.join(pt_mount.path, "shared.bin")
    old, new = data("old", 2 * MiB), data("new", 3 * MiB + 1)
    with open(p, "wb") as f:
        f.write(old)
    pt_mount.sync()
    with open(p, "rb") as reader:
        assert reader.read(4096) == old[:4096]
        with open(p, "wb") as f:
            f.write(new)
        assert open(p, "rb").read() == new
    assert "shared.bin: written through FUSE passthrough" in log_of(pt_mount)  # the first
    assert log_of(pt_mount).count("shared.bin: written through FUSE passthrough") == 1


def test_a_reader_opening_right_after_the_save_leaves_the_next_save_free(pt_mount):
    """A reader that opens the file the moment its passthrough save's close() returns
    (before the kernel's release reaches the daemon) gets the page cache, not the
    save's spool: holding it open does not refuse the next save of the path."""
    p = os.path.join(pt_mount.path, "eval.pt")
    versions = [data(f"v{k}", 2 * MiB + k) for k in range(4)]
    readers = []
    try:
        for k, v in enumerate(versions):
            with open(p, "wb") as f:
                f.write(v)
            r = open(p, "rb")                     # at once, and kept open
            readers.append(r)
            assert r.read() == v
        assert open(p, "rb").read() == versions[-1]
    finally:
        for r in readers:
            r.close()


def test_a_save_over_a_file_a_reader_opened_during_its_last_save_is_refused_whole(
        pt_mount, tmp_path):
    """A reader that opened the file during a passthrough save holds the kernel to that
    save's spool (one backing file per inode): the next save of the path fails with
    EBUSY, saying why in the log, and changes nothing — the reader reads the first save
    whole, so does a fresh open and the store; once the reader is closed, saving works."""
    import errno
    p = os.path.join(pt_mount.path, "latest.pt")
    first = data("first", 3 * MiB + 1)
    w = open(p, "wb", buffering=0)
    w.write(first[:MiB])
    r = open(p, "rb")                             # during the save
    w.write(first[MiB:])
    w.close()
    # the kernel sends the release after close() returns; until the daemon has it, a
    # new open joins the same save (in place, as on a local disk): wait for it
    deadline = time.monotonic() + 20
    while "latest.pt: the passthrough save's descriptors are closed" not in log_of(pt_mount):
        assert time.monotonic() < deadline, "the first save was never released"
        time.sleep(0.05)
    with pytest.raises(OSError) as exc:
        with open(p, "wb") as w2:
            w2.write(data("second", 2 * MiB))
    assert exc.value.errno == errno.EBUSY
    assert "close that reader, or mount without --passthrough" in log_of(pt_mount)
    assert r.read() == first
    assert open(p, "rb").read() == first
    r.close()
    third = data("third", MiB + 3)
    with open(p, "wb") as w3:
        w3.write(third)
    assert open(p, "rb").read() == third
    plain = remounted(pt_mount, tmp_path, "plain")
    try:
        assert open(os.path.join(plain.path, "latest.pt"), "rb").read() == third
    finally:
        plain.stop()


def test_temp_file_renamed_over_and_chmodded_through_passthrough(pt_mount, tmp_path):
    """The safetensors >= 0.8 save (a temp file, renamed over the name, then chmod): the
    name holds the new bytes with the new mode, also in the store; a descriptor opened
    on the old file before keeps reading it."""
    p = os.path.join(pt_mount.path, "model.safetensors")
    tmp = os.path.join(pt_mount.path, ".model.safetensors.tmp")
    old, new = data("old", 2 * MiB + 1), data("new", 3 * MiB + 7)
    with open(p, "wb") as f:
        f.write(old)
    pt_mount.sync()
    with open(p, "rb") as before:
        with open(tmp, "wb") as f:
            f.write(new)
        os.rename(tmp, p)
        os.chmod(p, 0o600)
        assert before.read() == old
    assert open(p, "rb").read() == new and os.stat(p).st_mode & 0o777 == 0o600
    assert passed_through(pt_mount, ".model.safetensors.tmp")
    plain = remounted(pt_mount, tmp_path, "plain")
    try:
        q = os.path.join(plain.path, "model.safetensors")
        assert open(q, "rb").read() == new and os.stat(q).st_mode & 0o777 == 0o600
    finally:
        plain.stop()


def test_a_file_accepted_through_passthrough_survives_a_crash(pt_mount, tmp_path):
    """close() returned, then the daemon is killed: the journal has the spool's size
    (read from the file, not from write requests), and the file is committed after the
    mount comes back."""
    p = os.path.join(pt_mount.path, "crash.bin")
    want = data("crash", 6 * MiB + 9)
    with open(p, "wb") as f:
        f.write(want)
    assert passed_through(pt_mount, "crash.bin")
    pt_mount.kill9()
    pt_mount.stop()
    pt_mount.start()
    try:
        pt_mount.sync()
        assert open(p, "rb").read() == want
    finally:
        pt_mount.stop()
    plain = Mount(pt_mount.store, str(tmp_path / "plain"), str(tmp_path / "cache-plain"))
    os.makedirs(plain.path)
    os.makedirs(plain.cache)
    plain.start()
    try:
        assert open(os.path.join(plain.path, "crash.bin"), "rb").read() == want
    finally:
        plain.stop()


def test_passthrough_says_what_it_needs(tmp_path, monkeypatch):
    """Without --writeback, or with a pyfuse3 that cannot ask for passthrough, the mount
    refuses at once, saying what to do."""
    monkeypatch.delenv("PYTHONPATH", raising=False)
    mp = tmp_path / "mnt"
    mp.mkdir()
    store = tmp_path / "store"
    store.mkdir()

    def mount(*extra):
        t = time.monotonic()
        r = subprocess.run([sys.executable, "-m", "s4fs.cli", "mount", str(store), str(mp),
                            "--cache-dir", str(tmp_path / "cache"), "--passthrough", *extra],
                           capture_output=True, text=True, timeout=120)
        return r, time.monotonic() - t

    r, took = mount()
    assert r.returncode != 0 and "--passthrough needs --writeback" in r.stderr
    assert not os.path.ismount(mp)
    import pyfuse3
    if not hasattr(pyfuse3, "get_session_fd"):        # the venv's own, stock pyfuse3
        r, took = mount("--writeback")
        assert r.returncode != 0 and "pyfuse3 built with FUSE passthrough" in r.stderr
        assert took < 30 and not os.path.ismount(mp)
