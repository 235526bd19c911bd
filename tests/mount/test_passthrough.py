"""``mount --passthrough`` (default mode and ``--writeback``): the kernel writes a file
being saved straight into its spool (FUSE passthrough), the daemon sees no write
request, and everything else holds as on the request path: the bytes that come back,
what is committed, readers of the file while it is written, truncates, a crash after
close(). In the default mode the daemon follows the spool as it grows and codes it
meanwhile; the commit at close() stores the spool's final bytes, rewrites included.

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

from mount_helpers import AUTO_TRANSPORT, TRANSPORT, Mount

pytestmark = pytest.mark.fuse

MiB = 1 << 20


def data(seed: str, n: int) -> bytes:
    out, k = bytearray(), 0
    while len(out) < n:
        out += hashlib.sha256(f"{seed}-{k}".encode()).digest()
        k += 1
    return bytes(out[:n])


# --writeback codes after close() by default; "writeback-follow" keeps its other way
# (--code-while-written: the spool followed as the kernel writes it) under these tests
PT_MODES = {"default": [], "writeback": ["--writeback"],
            "writeback-follow": ["--writeback", "--code-while-written"]}


@pytest.fixture(params=list(PT_MODES))
def pt_mount(request, pt_site, mount_factory):
    return mount_factory(extra=[*PT_MODES[request.param], "--passthrough", "-v"])


@pytest.fixture
def pt_wb_mount(pt_site, mount_factory):
    return mount_factory(extra=["--writeback", "--passthrough", "-v"])


def log_of(m: Mount) -> str:
    with open(os.path.join(m.cache, "s4fs-mount.log"), errors="replace") as f:
        return f.read()


def passed_through(m: Mount, name: str) -> bool:
    return f"{name}: written through FUSE passthrough" in log_of(m)


def wait_for_log(m: Mount, line: str, timeout: float = 20) -> None:
    """Wait until the daemon's log has ``line`` (the kernel sends a release after the
    close() that caused it has returned)."""
    deadline = time.monotonic() + timeout
    while line not in log_of(m):
        assert time.monotonic() < deadline, f"never logged: {line}"
        time.sleep(0.05)


def remounted_store(m: Mount) -> str:
    """``m``'s store, once ``m`` has committed everything and is gone."""
    m.sync()
    m.stop()
    return m.store


def remounted(m: Mount, tmp_path, name: str) -> Mount:
    """The same store on a plain mount (no passthrough, no writeback), once ``m`` has
    committed everything and is gone: what the store holds."""
    m.sync()
    m.stop()
    return plain_mount(m.store, tmp_path, name)


def stored(store: str, tmp_path, name: str) -> bytes:
    """File ``name`` as a plain mount of ``store`` reads it (the daemon that wrote it gone)."""
    plain = plain_mount(store, tmp_path)
    try:
        with open(os.path.join(plain.path, name), "rb") as f:
            return f.read()
    finally:
        plain.stop()


def plain_mount(store: str, tmp_path, name: str = "plain") -> Mount:
    """A plain mount (no passthrough, no writeback) of ``store``: what the store holds."""
    plain = Mount(store, str(tmp_path / name), str(tmp_path / f"cache-{name}"),
                  ("--no-passthrough",))
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


def test_a_save_over_a_file_readers_hold_is_written_in_place(pt_mount, tmp_path):
    """A reader of a committed file reads its local copy through passthrough; a save
    over it (the kernel allows one backing file per inode) takes that copy over as its
    spool: the reader sees the new bytes, as on a local disk, and the store has them."""
    p = os.path.join(pt_mount.path, "shared.bin")
    old, new = data("old", 2 * MiB), data("new", 3 * MiB + 1)
    with open(p, "wb") as f:
        f.write(old)
    pt_mount.sync()
    with open(p, "rb", buffering=0) as reader:     # no buffer of its own: the file
        assert reader.read(4096) == old[:4096]
        with open(p, "wb") as f:
            f.write(new)
        reader.seek(0)
        assert reader.read() == new
        assert open(p, "rb").read() == new
    assert "shared.bin: written through FUSE passthrough in place" in log_of(pt_mount)
    assert stored(remounted_store(pt_mount), tmp_path, "shared.bin") == new


def test_a_save_over_a_file_read_through_the_page_cache_stays_on_write_requests(
        pt_site, mount_factory, tmp_path):
    """A fresh node has no local copy to pass a reader through to: it reads through the
    daemon and the kernel's page cache, and a save over the file while it is open goes
    through write requests (the kernel allows no passthrough open beside cached ones),
    and succeeds."""
    writer = mount_factory(extra=["--passthrough"])
    p = os.path.join(writer.path, "shared.bin")
    old, new = data("old", 2 * MiB), data("new", 3 * MiB + 1)
    with open(p, "wb") as f:
        f.write(old)
    writer.sync()
    writer.stop()
    fresh = mount_factory(store=writer.store, name="fresh", extra=["--passthrough", "-v"])
    q = os.path.join(fresh.path, "shared.bin")
    with open(q, "rb") as reader:
        assert reader.read() == old
        with open(q, "wb") as f:
            f.write(new)
        assert open(q, "rb").read() == new
    assert "shared.bin: written through" not in log_of(fresh)
    assert stored(remounted_store(fresh), tmp_path, "shared.bin") == new


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


def test_a_save_over_a_file_a_reader_opened_during_its_last_save_is_written_in_place(
        pt_mount, tmp_path):
    """A reader that opened the file during a passthrough save reads that save's spool,
    which becomes the version's local copy; the next save takes it over: the reader
    reads the new bytes from then on, as on a local disk."""
    p = os.path.join(pt_mount.path, "latest.pt")
    first, second = data("first", 3 * MiB + 1), data("second", 2 * MiB)
    w = open(p, "wb", buffering=0)
    w.write(first[:MiB])
    r = open(p, "rb", buffering=0)                # during the save
    w.write(first[MiB:])
    w.close()
    assert r.read() == first
    pt_mount.sync()
    wait_for_log(pt_mount, "latest.pt: the passthrough save's descriptors are closed")
    with open(p, "wb") as w2:
        w2.write(second)
    r.seek(0)
    assert r.read() == second
    r.close()
    assert open(p, "rb").read() == second
    assert stored(remounted_store(pt_mount), tmp_path, "latest.pt") == second


def test_a_save_over_a_file_whose_held_copy_is_gone_is_refused_whole(
        pt_site, mount_factory, tmp_path):
    """Where the file a reader holds through passthrough is no longer a local copy of
    the version (a decoded cache too small to keep it), the next save cannot take it
    over: it fails with EBUSY, saying why in the log, and changes nothing; once the
    reader is closed, saving works."""
    import errno
    m = mount_factory(extra=["--passthrough", "--cache-size", "1M", "-v"])
    p = os.path.join(m.path, "latest.pt")
    first = data("first", 3 * MiB + 1)
    w = open(p, "wb", buffering=0)
    w.write(first[:MiB])
    r = open(p, "rb")                             # during the save: shares its spool
    w.write(first[MiB:])
    w.close()
    wait_for_log(m, "latest.pt: the passthrough save's descriptors are closed")
    with pytest.raises(OSError) as exc:
        with open(p, "wb") as w2:
            w2.write(data("second", 2 * MiB))
    assert exc.value.errno == errno.EBUSY
    assert "close them, or mount without --passthrough" in log_of(m)
    assert r.read() == first
    assert open(p, "rb").read() == first
    r.close()
    third = data("third", MiB + 3)
    with open(p, "wb") as w3:
        w3.write(third)
    assert open(p, "rb").read() == third
    assert stored(remounted_store(m), tmp_path, "latest.pt") == third


def test_loads_read_the_local_copy_through_passthrough(pt_mount, tmp_path):
    """torch.load right after torch.save, and after a remount with the same cache dir,
    reads the version's local copy through passthrough (the kernel reads it itself),
    bit-exact."""
    model = torch.nn.Linear(1024, 1024)
    p = os.path.join(pt_mount.path, "warm.pt")
    torch.save(model.state_dict(), p)
    pt_mount.sync()
    wait_for_log(pt_mount, "warm.pt: the passthrough save's descriptors are closed")
    back = torch.load(p)
    assert torch.equal(back["weight"], model.weight.detach())
    assert "warm.pt: read through FUSE passthrough" in log_of(pt_mount)
    pt_mount.restart()
    back = torch.load(p)
    assert torch.equal(back["weight"], model.weight.detach())
    assert log_of(pt_mount).count("warm.pt: read through FUSE passthrough") == 2


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


def test_a_file_accepted_through_passthrough_survives_a_crash(pt_wb_mount, tmp_path):
    """--writeback: close() returned, then the daemon is killed: the journal has the
    spool's size (read from the file, not from write requests), and the file is
    committed after the mount comes back."""
    pt_mount = pt_wb_mount
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
    assert stored(pt_mount.store, tmp_path, "crash.bin") == want


def test_passthrough_says_what_it_needs(tmp_path, monkeypatch):
    """With a pyfuse3 that cannot ask for passthrough, the mount refuses at once, saying
    what to do."""
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

    import pyfuse3
    if hasattr(pyfuse3, "get_session_fd"):
        pytest.skip("this venv's own pyfuse3 is the passthrough build")
    for mode in ([], ["--writeback"]):
        r, took = mount(*mode)
        assert r.returncode != 0 and "pyfuse3 built with FUSE passthrough" in r.stderr
        assert took < 30 and not os.path.ismount(mp)


@pytest.fixture
def pt_default_mount(pt_site, mount_factory):
    return mount_factory(extra=["--passthrough", "-v"])


def test_default_mode_passthrough_save_is_in_the_store_when_close_returns(
        pt_default_mount, tmp_path):
    """Default mode: when torch.save's close() returns, the checkpoint (a model and its
    AdamW state) is in the store — the daemon killed right after, a plain mount of the
    store reads it back bit-exact."""
    m = pt_default_mount
    model = torch.nn.Sequential(torch.nn.Linear(512, 2048), torch.nn.GELU(),
                                torch.nn.Linear(2048, 512))
    opt = torch.optim.AdamW(model.parameters())
    model(torch.randn(8, 512)).sum().backward()
    opt.step()
    p = os.path.join(m.path, "ckpt_1.pt")
    torch.save({"model": model.state_dict(), "optim": opt.state_dict()}, p)
    raw = open(p, "rb").read()
    assert passed_through(m, "ckpt_1.pt")
    m.kill9()
    m.stop()
    assert stored(m.store, tmp_path, "ckpt_1.pt") == raw


def test_a_rewrite_of_bytes_the_daemon_already_coded_is_stored_as_rewritten(
        pt_default_mount, tmp_path):
    """Default mode: the daemon codes a passthrough file while it grows, and cannot see
    a later rewrite of bytes it already took (same size, no write request): the commit
    finds it and stores the file's final bytes — here a header patched after the body
    is written, as zip writers do, and a hole filled late."""
    m = pt_default_mount
    p = os.path.join(m.path, "patched.bin")
    body = data("body", 24 * MiB + 11)
    local = tmp_path / "local.bin"
    for path, pause in ((p, 1.0), (str(local), 0)):
        with open(path, "wb", buffering=0) as f:
            f.seek(30 * MiB)
            f.write(b"tail")                      # a hole: read as zeros at first
            f.seek(0)
            f.write(body)
            time.sleep(pause)                     # the daemon has read and coded it
            f.seek(MiB)
            f.write(data("patch", 4096))
            f.seek(24 * MiB + 11)
            f.write(data("fill", 6 * MiB - 11))
    want = local.read_bytes()
    assert open(p, "rb").read() == want
    assert passed_through(m, "patched.bin")
    m.stop()
    assert stored(m.store, tmp_path, "patched.bin") == want


@pytest.mark.s3
@pytest.mark.parametrize("mode", [(), ("--writeback",)], ids=["default", "writeback"])
def test_passthrough_saves_to_s3_read_bit_exact_on_another_node(request, pt_site,
                                                                mount_factory, mode):
    """On an S3 store (a real S3 server on loopback): two consecutive checkpoints (a
    model and its AdamW state; the second a delta of the first) saved through
    passthrough, loaded back through it, and read bit-exact by a fresh node."""
    from mount_helpers import s3_url
    url = s3_url(request, "pt")
    m = mount_factory(store=url, extra=[*mode, "--passthrough", "-v"])
    model = torch.nn.Sequential(torch.nn.Linear(512, 1024), torch.nn.Linear(1024, 512))
    opt = torch.optim.AdamW(model.parameters())
    raws = []
    for step in range(2):
        model(torch.randn(8, 512)).sum().backward()
        opt.step()
        p = os.path.join(m.path, f"ckpt_{step}.pt")
        torch.save({"model": model.state_dict(), "optim": opt.state_dict()}, p)
        back = torch.load(p)
        assert all(torch.equal(back["model"][k], v) for k, v in model.state_dict().items())
        raws.append(open(p, "rb").read())
        assert passed_through(m, f"ckpt_{step}.pt")
    m.sync()
    other = mount_factory(store=url, name="other")
    for step, raw in enumerate(raws):
        with open(os.path.join(other.path, f"ckpt_{step}.pt"), "rb") as f:
            assert f.read() == raw


def test_passthrough_is_the_default_where_pyfuse3_can_ask_for_it(pt_site, mount_factory,
                                                                   tmp_path):
    """With no flag, a mount whose pyfuse3 can ask for FUSE passthrough (and runs as
    root on a kernel that has it) saves through it; ``--no-passthrough`` keeps every
    write a FUSE request. Both store the exact bytes."""
    raw = data("auto", 3 << 20)
    auto = mount_factory(extra=["-v", AUTO_TRANSPORT])
    off = mount_factory(store=auto.store, name="off", extra=["--no-passthrough", "-v"])
    for m, name in ((auto, "a.bin"), (off, "b.bin")):
        with open(os.path.join(m.path, name), "wb") as f:
            f.write(raw)
    assert passed_through(auto, "a.bin")
    assert not passed_through(off, "b.bin")
    assert "FUSE passthrough off" not in log_of(auto)
    for m in (auto, off):
        m.stop()
    plain = plain_mount(auto.store, tmp_path)
    try:
        for name in ("a.bin", "b.bin"):
            assert open(os.path.join(plain.path, name), "rb").read() == raw
    finally:
        plain.stop()


def test_without_the_binding_the_default_mount_says_why_it_uses_requests(mount_factory):
    """A stock pyfuse3 (no passthrough in it): the mount works on FUSE requests and its
    log says what passthrough would need."""
    import pyfuse3
    if hasattr(pyfuse3, "get_session_fd"):
        pytest.skip("this environment's own pyfuse3 has passthrough "
                    "(`s4fs build-passthrough`)")
    if TRANSPORT == "passthrough":
        pytest.skip("this run's mounts use the pyfuse3 built with passthrough "
                    "(S4FS_TEST_TRANSPORT); the request-path run covers this")
    m = mount_factory(extra=["-v", AUTO_TRANSPORT])
    raw = data("stock", 1 << 20)
    with open(os.path.join(m.path, "c.bin"), "wb") as f:
        f.write(raw)
    assert open(os.path.join(m.path, "c.bin"), "rb").read() == raw
    said = log_of(m)
    assert "FUSE passthrough off: it needs pyfuse3 built with FUSE passthrough" in said
    assert "`s4fs build-passthrough`" in said          # what to run to get it
    assert not passed_through(m, "c.bin")



def _status(m: Mount) -> tuple[dict, str]:
    def run(*extra):
        return subprocess.run([sys.executable, "-m", "s4fs.cli", "status", m.path, *extra],
                              capture_output=True, text=True, check=True, timeout=60).stdout
    import json
    return json.loads(run("--json")), run()


def test_status_says_the_mount_goes_through_passthrough(pt_mount):
    st, text = _status(pt_mount)
    assert st["transport"].startswith("FUSE passthrough"), st
    assert "through FUSE passthrough" in text


def test_status_says_the_mount_goes_through_requests_and_why(mount_factory):
    st, text = _status(mount_factory(extra=["--no-passthrough"]))
    assert st["transport"] == "FUSE requests (--no-passthrough)"
    assert "through FUSE requests (--no-passthrough)" in text
