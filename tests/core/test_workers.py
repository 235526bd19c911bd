"""Coding in worker processes (s4fs.coding._cpu_pool): a session fed from a spool file sends its
chunks to other processes as spool byte ranges; every byte must come back exact, and a
worker that dies or a spool that changes under it fails the save — never wrong bytes."""

from __future__ import annotations

import io
import os
import signal
import time

import pytest
import torch

from s4fs.coding import _cpu_pool as workers
from s4fs.errors import CodecError, S4Error
from s4fs.fs import Filesystem, FsConfig
from s4fs.runtime import current
from s4fs.coding import IngestConfig
from s4fs.write import Spool
from s4fs.stores import LocalStore
from store_damage import damage_packs


@pytest.fixture(scope="module", autouse=True)
def _pool():
    yield
    current().pools.close()


def make_fs(tmp_path, **ingest) -> Filesystem:
    cfg = IngestConfig(processes=True, workers=2, **ingest)
    return Filesystem(LocalStore(str(tmp_path / "store")),
                      FsConfig(ingest=cfg, cache_dir=str(tmp_path / "cache")))


def save(fs: Filesystem, path: str, data: bytes, *, step: int = 1 << 20, keep=False):
    """Write ``data`` the way the mount does (spool, then feed its prefix) and commit."""
    sp = Spool(fs.spool_dir, path)
    sp.write(0, data)
    s = fs.new_session(path, fs.manifest(path) if fs.exists(path) else None, sp.name)
    assert s._proc is not None or s._gpu is not None, \
        "the session should code in worker processes (or on the GPU)"
    try:
        pos = 0
        while pos < len(data):
            piece = sp.read(pos, step)
            s.write(piece, stable=True)
            pos += len(piece)
        m = s.finish()
    except BaseException:
        s.abort()
        sp.close()
        raise
    fs.commit(path, m)
    if keep and fs.decoded is not None:
        fs.decoded.adopt(m.id, sp)          # as the mount does: the spool becomes the entry
    else:
        sp.close()
    return m


def read(fs: Filesystem, path: str) -> bytes:
    r = fs.open_read(path)
    try:
        return r.read(0, r.size)
    finally:
        r.release()


def read_fresh(tmp_path, path: str) -> bytes:
    fs = Filesystem(LocalStore(str(tmp_path / "store")), FsConfig(decoded_cache_bytes=0))
    try:
        return read(fs, path)
    finally:
        fs.close()


def torch_bytes(sd) -> bytes:
    buf = io.BytesIO()
    torch.save(sd, buf)
    return buf.getvalue()


def adversarial_state(seed: int = 0) -> dict:
    g = torch.Generator().manual_seed(seed)
    bits = torch.randint(-2**31, 2**31 - 1, (300_001,), generator=g, dtype=torch.int32)
    bits16 = torch.randint(-2**15, 2**15 - 1, (200_000,), generator=g, dtype=torch.int16)
    return {
        "f32": torch.randn(1_500_001, generator=g),
        "f32_bits": bits.view(torch.float32),          # NaN payloads, denormals, -0.0
        "bf16": torch.randn(700_003, generator=g).bfloat16(),
        "bf16_bits": bits16.view(torch.bfloat16),
        "f16": torch.randn(65_537, generator=g).half(),
        "f64": torch.randn(9_999, generator=g).double(),
        "i64": torch.randint(0, 10**12, (4097,), generator=g),
        "u8": torch.randint(0, 256, (1_000_003,), generator=g, dtype=torch.uint8),
        "bool": torch.rand(777, generator=g) > 0.5,
        "empty": torch.empty(0),
        "scalar": torch.tensor(3.5),
        "ln": {f"layer{i}": torch.randn(384, generator=g) for i in range(40)},
        "step": 7,
    }


def test_every_dtype_round_trips_exactly(tmp_path):
    fs = make_fs(tmp_path, batch_bytes=2 << 20)
    try:
        data = torch_bytes(adversarial_state())
        m = save(fs, "ckpt.pt", data)
        assert m.kind != "raw" and len(m.own_packs) >= 2      # coded as tensors, in batches
        assert read(fs, "ckpt.pt") == data
    finally:
        fs.close()
    assert read_fresh(tmp_path, "ckpt.pt") == data


@pytest.mark.parametrize("size", [0, 1, 9, (4 << 20) - 1, 4 << 20, (37 << 20) + 5])
def test_raw_bytes_round_trip(tmp_path, size):
    fs = make_fs(tmp_path)
    try:
        data = os.urandom(size)
        save(fs, "blob.bin", data, step=(3 << 20) + 7)
        assert read_fresh(tmp_path, "blob.bin") == data
    finally:
        fs.close()


@pytest.mark.parametrize("base_from", ["decoded", "store", "corrupt"])
def test_delta_series_exact_with_base_from_each_place(tmp_path, base_from):
    """Consecutive checkpoints stored as deltas: the workers read the base from the
    decoded-cache copy of the previous version, from the store, or — when that copy is
    wrong — notice the checksum and fetch it from the store."""
    fs = make_fs(tmp_path)
    try:
        sd = adversarial_state(1)
        series = []
        for step in range(4):
            data = torch_bytes(sd)
            series.append(data)
            keep = base_from != "store"
            m = save(fs, "ckpt.pt", data, keep=keep)
            if base_from == "corrupt" and fs.decoded.path_of(m.id):
                with open(fs.decoded.path_of(m.id), "r+b") as f:
                    f.seek(len(data) // 2)
                    f.write(b"\xff" * 4096)
            if step:
                assert m.base is not None
                assert m.stored_bytes() < len(data) // 2, "the delta should be small"
            assert read_fresh(tmp_path, "ckpt.pt") == data
            sd["f32"][: 1000 * (step + 1)] += 0.001
            sd["bf16"][::97] = 1.0
            sd["step"] = step
    finally:
        fs.close()


def change_the_spool_during_a_save(fs, delta: bool) -> None:
    """Save a version, then write a new one whose spool changes behind the session's
    back before ``finish()`` (as a delta of the first, or whole): the save fails with
    "changed" and the old version stays."""
    data = torch_bytes(adversarial_state())
    save(fs, "ckpt.pt", data)
    sp = Spool(fs.spool_dir, "ckpt.pt")
    new = torch_bytes(adversarial_state(5))
    sp.write(0, new)
    s = fs.new_session("ckpt.pt", fs.manifest("ckpt.pt") if delta else None, sp.name)
    pos = 0
    while pos < len(new):
        piece = sp.read(pos, 1 << 20)
        s.write(piece, stable=True)
        pos += len(piece)
    sp.write(len(new) // 2, b"\x00" * 8192)          # behind the session's back
    with pytest.raises(CodecError, match="changed"):
        s.finish()
    s.abort()
    sp.close()
    assert read(fs, "ckpt.pt") == data               # the old version stays


def test_spool_changed_under_the_workers_fails_not_stored(tmp_path):
    fs = make_fs(tmp_path)
    try:
        change_the_spool_during_a_save(fs, delta=True)
    finally:
        fs.close()


def kill_workers_during_a_save(fs, tmp_path, pids, match: str) -> None:
    """Save 80 MiB in 64 MiB batches and SIGKILL the coding processes (``pids()``) while
    the first batch is out: that save fails with WorkerDied (``match``) and commits
    nothing; the next save works (a fresh process takes over) and reads back exactly."""
    g = torch.Generator().manual_seed(3)
    data = torch_bytes({f"t{i}": torch.randn(4 << 20, generator=g) for i in range(5)})
    sp = Spool(fs.spool_dir, "ckpt.pt")
    sp.write(0, data)
    s = fs.new_session("ckpt.pt", None, sp.name)
    s.write(sp.read(0, 70 << 20), stable=True)          # one 64 MiB batch goes out
    inflight = s._proc._submitted[0].future
    assert not inflight.done(), "the batch finished before the kill; make it larger"
    for pid in pids():
        os.kill(pid, signal.SIGKILL)
    with pytest.raises(workers.WorkerDied, match=match):
        s.write(sp.read(70 << 20, len(data)), stable=True)
        s.finish()
    s.abort()
    sp.close()
    assert not fs.exists("ckpt.pt")
    save(fs, "ckpt.pt", data)
    assert read_fresh(tmp_path, "ckpt.pt") == data


def test_a_killed_worker_fails_that_save_and_the_next_one_works(tmp_path):
    fs = make_fs(tmp_path, batch_bytes=64 << 20)
    try:
        pool = fs.pools.for_ingest(fs.cfg.ingest)
        pool.warm()
        kill_workers_during_a_save(fs, tmp_path, pool.pids, "died while coding 'ckpt.pt'")
    finally:
        fs.close()


# --- through a real mount -------------------------------------------------------------

def worker_pids(daemon: int) -> list[int]:
    import subprocess
    out = subprocess.run(["pgrep", "-P", str(daemon), "-f", "spawn_main"],
                         capture_output=True, text=True).stdout.split()
    return [int(p) for p in out]


def _record_nice(nice: int, parent: int) -> None:
    """A worker initializer (in place of init_worker) that records the nice value the
    worker's interpreter was started with."""
    with open(os.path.join(os.environ["S4FS_TEST_NICE_DIR"], str(os.getpid())), "w") as f:
        f.write(str(os.nice(0)))


def test_warm_starts_the_workers_at_their_own_low_priority(tmp_path, monkeypatch):
    """CpuPool.warm starts every worker but the first (whose submit also starts the
    pool's own threads, at the caller's priority) already at the pool's nice value:
    their interpreters' start-up never competes at the daemon's priority."""
    from s4fs.coding import _cpu_pool
    monkeypatch.setattr(_cpu_pool, "init_worker", _record_nice)
    monkeypatch.setenv("S4FS_TEST_NICE_DIR", str(tmp_path))
    pool = _cpu_pool.CpuPool(3, 7)
    try:
        pids = pool.warm()
        assert len(pids) == 3, pids
        started = sorted(int((tmp_path / str(p)).read_text()) for p in pids)
        assert started == [0, 7, 7], started
        assert os.nice(0) == 0                    # the caller's priority is untouched
    finally:
        pool.close()


def test_the_workers_are_up_and_below_the_requests_when_the_mount_is_ready(mount_factory):
    """A job that loads its checkpoint right after mounting does not compete with the
    coding workers starting: they are all running when the mount is ready, every one
    at the workers' low priority from its start (a process takes its creating thread's
    nice value), while the daemon itself keeps the normal one."""
    m = mount_factory(extra=["--workers", "3"])
    (daemon,) = m.daemon_pids()
    pids = worker_pids(daemon)
    assert len(pids) == 3, pids

    def nice(pid: int) -> int:
        with open(f"/proc/{pid}/stat") as f:
            return int(f.read().rsplit(")", 1)[1].split()[16])
    assert nice(daemon) == 0
    assert all(nice(p) == 10 for p in pids), [nice(p) for p in pids]
    with open(os.path.join(m.path, "a.bin"), "wb") as f:          # and they code
        f.write(os.urandom(1 << 20))
    with open(os.path.join(m.path, "a.bin"), "rb") as f:
        assert len(f.read()) == 1 << 20


def file_bytes(sd, name: str = "ckpt.pt") -> bytes:
    """What torch.save writes to a file of this name (its records are named after it)."""
    import tempfile
    with tempfile.TemporaryDirectory() as d:
        torch.save(sd, os.path.join(d, name))
        with open(os.path.join(d, name), "rb") as f:
            return f.read()


def series_state(k: int) -> dict:
    g = torch.Generator().manual_seed(100 + k)
    return {"w": torch.randn(6 << 20, generator=g),
            "h": torch.randn(1 << 20, generator=g).half(),
            "step": k}


WRITER = """
import sys, torch
sys.path[:0] = [{tests!r}]
from test_workers import series_state
for k in range({n}):
    torch.save(series_state(k), {path!r})
    print(k, flush=True)
"""


@pytest.mark.fuse
@pytest.mark.parametrize("extra", [(), ("--writeback",)], ids=["default", "writeback"])
def test_worker_killed_mid_save_never_wrong_bytes(mount_factory, extra):
    """Kill the daemon's coding workers while a save is being coded: default mode fails
    that save (the previous version stays), writeback retries it; either way every byte
    read back is one whole version."""
    m = mount_factory(extra=[*extra, "--workers", "1"])
    path = os.path.join(m.path, "ckpt.pt")
    torch.save(series_state(0), path)
    m.sync()
    v0, v1 = file_bytes(series_state(0)), file_bytes(series_state(1))
    (daemon,) = m.daemon_pids()
    assert worker_pids(daemon), "the mount should code in worker processes"
    fd = os.open(path, os.O_WRONLY | os.O_TRUNC)
    failed = None
    try:
        step = 2 << 20
        for off in range(0, len(v1), step):        # kill the workers again and again
            os.write(fd, v1[off: off + step])
            if off % (8 << 20) == 0:
                for pid in worker_pids(daemon):
                    os.kill(pid, signal.SIGKILL)
    except OSError as exc:
        failed = exc
    finally:
        try:
            os.close(fd)
        except OSError as exc:
            failed = failed or exc
    m.sync()
    got = open(path, "rb").read()
    print("the save", "failed" if failed else "went through", failed or "")
    if failed is not None:
        assert not extra, f"a writeback mount accepted the file and must retry: {failed}"
        assert failed.errno == 5 and got == v0       # EIO; the previous version stays
    else:
        assert got == v1
    torch.save(series_state(2), path)                # the next save works (fresh pool)
    m.sync()
    assert open(path, "rb").read() == file_bytes(series_state(2))


@pytest.mark.fuse
@pytest.mark.parametrize("extra", [(), ("--writeback",)], ids=["default", "writeback"])
@pytest.mark.parametrize("delay", [0.3, 0.9, 1.6])
def test_kill9_at_any_moment_leaves_a_whole_version(mount_factory, extra, delay):
    """kill -9 of the daemon mid-write, mid-coding or mid-commit, then a restart: the file
    is one whole version, at least the last one whose close() returned (writeback: the
    journal replays what close() accepted), and no worker process outlives the daemon."""
    import subprocess
    import sys
    m = mount_factory(extra=list(extra))
    path = os.path.join(m.path, "ckpt.pt")
    (daemon,) = m.daemon_pids()
    tests = os.path.dirname(os.path.abspath(__file__))
    writer = subprocess.Popen([sys.executable, "-c", WRITER.format(tests=tests, n=6,
                                                                    path=path)],
                              stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    time.sleep(delay)
    m.kill9()
    out, _ = writer.communicate(timeout=120)
    done = [int(x) for x in out.split()]
    def orphans():        # workers of the dead daemon: reparented, same session id
        found = []
        for p in worker_pids(1):
            try:
                fields = open(f"/proc/{p}/stat").read().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[3]) == daemon:
                found.append(p)
        return found
    deadline = time.monotonic() + 10
    while orphans() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not orphans(), "coding workers outlived their daemon"
    m.stop()
    m.start()
    m.sync()
    versions = [file_bytes(series_state(k)) for k in range(6)]
    if not os.path.exists(path):
        assert not done, f"saves {done} returned, but the file is gone"
        return
    got = open(path, "rb").read()
    assert got in versions, "a torn or mixed file is visible after the crash"
    k = versions.index(got)
    if done:
        assert k >= done[-1], f"save {done[-1]} returned, but version {k} is there"


# --- decode ahead (s4fs.read.fill) --------------------------------------------------------

def test_plan_places_every_byte_once():
    from s4fs.read.fill import plan
    from s4fs.parse import new_parser  # noqa: F401  (the manifest comes from a real save)
    import tempfile
    with tempfile.TemporaryDirectory() as d:
        from pathlib import Path
        fs = make_fs(Path(d), batch_bytes=2 << 20)
        try:
            data = torch_bytes(adversarial_state())
            m = save(fs, "ckpt.pt", data)
        finally:
            fs.close()
    covered = bytearray(m.size)
    for batch in plan(m, 3 << 20):
        for ref, pieces in batch:
            for coff, foff, n in pieces:
                assert 0 <= coff and coff + n <= ref.raw
                assert covered[foff: foff + n] == bytes(n)
                covered[foff: foff + n] = b"\1" * n
    assert covered == b"\1" * m.size


def cold_fs(tmp_path, name="cold") -> Filesystem:
    """Another node: the same store, its own empty cache, coding workers on."""
    return Filesystem(LocalStore(str(tmp_path / "store")),
                      FsConfig(ingest=IngestConfig(processes=True, workers=2,
                                                   batch_bytes=4 << 20),
                               cache_dir=str(tmp_path / name)))


def torch_load_pattern(r, size: int) -> bytes:
    """Read as torch.load does: the tail first, then the whole file in 1 MiB reads."""
    tail = r.read(size - 22, 22)
    out = bytearray()
    pos = 0
    while pos < size:
        out += r.read(pos, 1 << 20)
        pos = len(out)
    assert bytes(out[-22:]) == tail
    return bytes(out)


def load_fails_with(fs: Filesystem, error) -> None:
    """Reading ``ckpt.pt`` as torch.load does raises ``error`` (never wrong bytes)."""
    r = fs.open_read("ckpt.pt")
    try:
        with pytest.raises(error):
            torch_load_pattern(r, r.size)
    finally:
        r.release()


def read_cold_then_wait_for_the_copy(fs: Filesystem, m, want: bytes) -> None:
    """Read ``ckpt.pt`` as torch.load does (exact bytes, decoded ahead), then wait until
    the filled copy has become its decoded-cache entry."""
    r = fs.open_read("ckpt.pt")
    try:
        assert torch_load_pattern(r, r.size) == want
        assert r._fill is not None or r._fd is not None, "no decode ahead started"
    finally:
        r.release()
    deadline = time.monotonic() + 30
    while fs.decoded.path_of(m.id) is None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert fs.decoded.path_of(m.id), "the filled copy should become a cache entry"


def test_cold_file_decoded_ahead_exact_then_kept(tmp_path):
    fs = make_fs(tmp_path)
    sd = adversarial_state(2)
    series = []
    try:
        for step in range(3):                        # a delta chain to follow
            series.append(torch_bytes(sd))
            save(fs, "ckpt.pt", series[-1])
            sd["f32"][::7] += 1
    finally:
        fs.close()
    other = cold_fs(tmp_path)
    try:
        m = other.manifest("ckpt.pt")
        read_cold_then_wait_for_the_copy(other, m, series[-1])
        with open(other.decoded.path_of(m.id), "rb") as f:
            assert f.read() == series[-1]
        r = other.open_read("ckpt.pt")               # now a plain local read
        try:
            assert r._reader is None and r.read(0, r.size) == series[-1]
        finally:
            r.release()
    finally:
        other.close()


def test_decode_ahead_with_a_missing_pack_is_an_error_not_wrong_bytes(tmp_path):
    from s4fs.errors import MissingData
    fs = make_fs(tmp_path, batch_bytes=2 << 20)
    try:
        data = torch_bytes(adversarial_state(3))
        m = save(fs, "ckpt.pt", data)
    finally:
        fs.close()
    victim = m.own_packs[len(m.own_packs) // 2]
    LocalStore(str(tmp_path / "store")).delete(victim)
    other = cold_fs(tmp_path)
    try:
        load_fails_with(other, MissingData)
        time.sleep(0.5)
        assert other.decoded.path_of(m.id) is None
        assert not [n for n in os.listdir(other.decoded.folder) if n.startswith(".fill")]
    finally:
        other.close()


def saved_then_cold(tmp_path, **ingest):
    """An adversarial checkpoint saved as ``ckpt.pt`` through the worker processes, and
    a node that never saw it (its bytes, that filesystem)."""
    fs = make_fs(tmp_path, **ingest)
    try:
        data = torch_bytes(adversarial_state(4))
        save(fs, "ckpt.pt", data)
    finally:
        fs.close()
    return data, cold_fs(tmp_path)


def test_a_wrong_byte_in_the_filled_copy_is_refused_by_the_whole_file_hash(tmp_path,
                                                                           monkeypatch):
    """Every chunk passes its own check, yet the copy holds a wrong byte (what a bug
    placing bytes would leave): the whole-file hash, taken as the copy fills, refuses
    it. The copy never becomes the version's local copy, and the reader gets an error,
    never the wrong bytes; a reader after it gets the right ones."""
    from s4fs.errors import ChecksumError
    from s4fs.read.fill import Fill
    landed = Fill._landed

    def one_byte_off(fill, fut, k):
        if k == len(fill.batches) // 2:
            lo = fill.ranges(k)[0][0] + 5
            os.pwrite(fill.fd, bytes([os.pread(fill.fd, 1, lo)[0] ^ 0x10]), lo)
        return landed(fill, fut, k)
    monkeypatch.setattr(Fill, "_landed", one_byte_off)
    data, other = saved_then_cold(tmp_path)
    try:
        m = other.manifest("ckpt.pt")
        load_fails_with(other, ChecksumError)
        time.sleep(0.5)
        assert other.decoded.path_of(m.id) is None
        monkeypatch.setattr(Fill, "_landed", landed)
        read_cold_then_wait_for_the_copy(other, m, data)
    finally:
        other.close()


def test_decode_ahead_with_readers_on_many_threads(tmp_path):
    """FUSE reads one handle from several threads: all of them wait on one fill and get
    exact bytes."""
    import threading
    data, other = saved_then_cold(tmp_path)
    try:
        r = other.open_read("ckpt.pt")
        size = r.size
        step = 1 << 20
        got: dict[int, bytes] = {}

        def reader(k):
            for off in range(k * step, size, 4 * step):
                got[off] = r.read(off, step)
        try:
            assert r.read(size - 22, 22) == data[-22:]       # the tail: the fill starts
            ts = [threading.Thread(target=reader, args=(k,)) for k in range(4)]
            [t.start() for t in ts]
            [t.join(60) for t in ts]
            assert r._fill is not None, "no decode ahead started"
        finally:
            r.release()
        assert b"".join(got[o] for o in sorted(got)) == data
    finally:
        other.close()


def test_read_now_serves_what_the_fill_has_landed_and_declines_the_rest(tmp_path):
    """The mount answers a read of a cold file on its event loop once a fill has landed
    those bytes (``read_now``): exact bytes, the same as ``read``; before the first read
    (no fill yet) it declines, and it never waits for a batch."""
    data, other = saved_then_cold(tmp_path, batch_bytes=2 << 20)
    try:
        r = other.open_read("ckpt.pt")
        size = r.size
        try:
            assert r.read_now(0, 1 << 20) is None           # nothing decoded yet
            assert r.read(size - 22, 22) == data[-22:]       # the fill starts
            assert r._fill is not None, "no decode ahead started"
            fill = r._fill
            step = 1 << 20
            got = {}
            for off in range(0, size, step):
                end = min(off + step, size)
                now = r.read_now(off, step)
                if now is None:
                    continue
                assert fill.has(off, end), "read_now served bytes the fill had not landed"
                got[off] = bytes(now)
            assert fill.wait(0, size)
            assert r.read_now(0, step) == data[:step], \
                "a landed range, just written, should be served without a thread"
            for off in range(0, size, step):
                if off not in got:
                    now = r.read_now(off, step)
                    got[off] = bytes(now) if now is not None else r.read(off, step)
        finally:
            r.release()
        assert b"".join(got[o] for o in sorted(got)) == data
    finally:
        other.close()


@pytest.mark.parametrize("damage", ["corrupt", "missing"])
def test_a_damaged_base_does_not_stop_the_next_save(tmp_path, damage, caplog, monkeypatch):
    """The previous checkpoint's packs damaged or gone: the next save through the worker
    processes stores its chunks in full (with a warning that names `s4fs verify`), reads
    back exact, and the damaged one still refuses to read — never wrong bytes."""
    from s4fs.coding import _bases as delta
    monkeypatch.setattr(delta, "PACKS_SEEN_TTL", 0.0)     # the damage comes later than it
    fs = make_fs(tmp_path)
    sd = adversarial_state(2)
    try:
        first = torch_bytes(sd)
        m0 = save(fs, "ckpt_0.pt", first)
        damage_packs(LocalStore(str(tmp_path / "store")), m0.own_packs, damage)
        sd["f32"][:1000] += 1
        second = torch_bytes(sd)
        with caplog.at_level("WARNING", logger="s4fs.ingest"):
            m1 = save(fs, "ckpt_1.pt", second)
        if damage == "missing":           # else intact chunks of ckpt_0 may still serve
            assert all(c.pack not in m0.own_packs and c.base is None
                       for s in m1.streams for c in s.chunks)
        assert "s4fs verify" in caplog.text
    finally:
        fs.close()
    assert read_fresh(tmp_path, "ckpt_1.pt") == second
    with pytest.raises(S4Error):
        read_fresh(tmp_path, "ckpt_0.pt")
