"""Mounting where a mount already is: a dead one (its daemon was killed) is replaced, never
stacked on, even within the attribute timeout after the kill, while the kernel still
answers ``stat`` of the dead mount from its cache; a live one is refused and keeps
working. Real FUSE mounts (tests/mount_helpers.py), always unmounted in teardown."""

from __future__ import annotations

import os
import re
import select
import signal
import subprocess
import sys
import time

import pytest

pytestmark = pytest.mark.fuse

#: a FUSE filesystem that is not s4fs (pyfuse3's do-nothing Operations): stands for
#: whatever else might sit on the mountpoint
_OTHER_FUSE = ("import sys, pyfuse3, trio\n"
               "pyfuse3.init(pyfuse3.Operations(), sys.argv[1], ['fsname=other-fuse'])\n"
               "print('ready', flush=True)\n"
               "trio.run(pyfuse3.main)\n")


def mount_table(path: str) -> list[tuple[str, str]]:
    """(fstype, source) of every mount at exactly ``path``, from /proc/self/mountinfo
    (octal escapes such as \\040 for a space undone)."""
    def unescape(field: str) -> str:
        return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), field)
    target = os.path.realpath(os.path.dirname(path))
    target = os.path.join(target, os.path.basename(path))
    out = []
    with open("/proc/self/mountinfo") as f:
        for line in f:
            left, _, right = line.partition(" - ")
            if unescape(left.split()[4]) == target:
                fstype, source = right.split()[:2]
                out.append((fstype, unescape(source)))
    return out


def _kill9_and_wait(pids: list[int], timeout: float = 10.0) -> None:
    for pid in pids:
        os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and any(_running(p) for p in pids):
        time.sleep(0.01)
    assert not any(_running(p) for p in pids), "the killed daemon is still running"


def _running(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


@pytest.fixture
def leftovers():
    """Paths and processes a test may leave behind; every mount at those paths is
    detached and every process killed afterwards, whatever the test did."""
    paths: list[str] = []
    procs: list[subprocess.Popen] = []
    yield paths, procs
    for p in procs:
        if p.poll() is None:
            p.kill()
        p.wait(10)
    for path in paths:
        for _ in range(8):                        # every stacked mount, bounded
            if not mount_table(path):
                break
            subprocess.run(["fusermount3", "-u", "-z", path], capture_output=True,
                           timeout=30)


def _cli_mount(m, cache: str, *extra: str, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "s4fs.cli", "mount", m.store, m.path,
                           "--cache-dir", cache, *extra],
                          capture_output=True, text=True, timeout=timeout)


def _assert_works(m, name: str, data: bytes) -> None:
    path = os.path.join(m.path, name)
    with open(path, "wb") as f:
        f.write(data)
    with open(path, "rb") as f:
        assert f.read() == data


@pytest.mark.parametrize("name", ["mnt", "mnt with space"])
def test_quick_restart_after_kill9_replaces_the_dead_mount(mount_factory, leftovers, name):
    m = mount_factory(name=name)
    leftovers[0].append(m.path)
    before = os.urandom(100_000)
    _assert_works(m, "before.bin", before)
    os.stat(os.path.join(m.path, "before.bin"))           # fill the kernel's attribute cache
    os.stat(m.path)
    _kill9_and_wait(m.daemon_pids())
    # at once: for attr_timeout (1 s) the kernel may still answer stat of the dead mount
    m.start()                                             # s4fs mount ...: must succeed
    assert mount_table(m.path) == [("fuse.s4fs", m.store)], "mounts stacked"
    assert len(m.daemon_pids()) == 1
    with open(os.path.join(m.path, "before.bin"), "rb") as f:
        assert f.read() == before                         # committed before the kill
    _assert_works(m, "after.bin", os.urandom(50_000))


def test_every_stacked_dead_mount_is_cleared(mount_factory, leftovers):
    """Two dead FUSE mounts stacked on the mountpoint (as the old restart race left
    them): the next mount detaches both and mounts alone."""
    m = mount_factory()
    leftovers[0].append(m.path)
    other = subprocess.Popen([sys.executable, "-c", _OTHER_FUSE, m.path],
                             stdout=subprocess.PIPE, text=True)
    leftovers[1].append(other)
    ready, _, _ = select.select([other.stdout], [], [], 30)
    assert ready and other.stdout.readline().strip() == "ready"
    assert [t for t, _ in mount_table(m.path)] == ["fuse.s4fs", "fuse"]
    _kill9_and_wait([other.pid, *m.daemon_pids()])
    other.wait(10)
    m.start()
    assert mount_table(m.path) == [("fuse.s4fs", m.store)]
    _assert_works(m, "x.bin", os.urandom(10_000))


@pytest.mark.parametrize("mode", [(), ("--foreground",)], ids=["background", "foreground"])
def test_mounting_over_a_live_mount_is_refused(mount_factory, leftovers, tmp_path, mode):
    m = mount_factory()
    leftovers[0].append(m.path)
    data = os.urandom(30_000)
    _assert_works(m, "kept.bin", data)
    # a cache dir of its own: the mountpoint, not the cache dir's lock, is what refuses
    res = _cli_mount(m, str(tmp_path / "cache-second"), *mode)
    assert res.returncode != 0
    assert "already mounted" in res.stderr and f"s4fs umount {m.path}" in res.stderr, \
        res.stderr
    assert mount_table(m.path) == [("fuse.s4fs", m.store)]
    assert len(m.daemon_pids()) == 1
    with open(os.path.join(m.path, "kept.bin"), "rb") as f:
        assert f.read() == data                           # the live mount still works
    _assert_works(m, "more.bin", os.urandom(1000))


def test_a_live_foreign_fuse_mount_is_refused_too(tmp_path, leftovers):
    from mount_helpers import fuse_usable
    ok, why = fuse_usable()
    if not ok:
        pytest.skip(why)
    mp = tmp_path / "mnt"
    mp.mkdir()
    leftovers[0].append(str(mp))
    other = subprocess.Popen([sys.executable, "-c", _OTHER_FUSE, str(mp)],
                             stdout=subprocess.PIPE, text=True)
    leftovers[1].append(other)
    ready, _, _ = select.select([other.stdout], [], [], 30)
    assert ready and other.stdout.readline().strip() == "ready"
    store = tmp_path / "store"
    store.mkdir()
    res = subprocess.run([sys.executable, "-m", "s4fs.cli", "mount", str(store), str(mp),
                          "--cache-dir", str(tmp_path / "cache")],
                         capture_output=True, text=True, timeout=60)
    assert res.returncode != 0 and "already mounted" in res.stderr, res.stderr
    assert mount_table(str(mp)) == [("fuse", "other-fuse")]
    assert other.poll() is None                           # left alone
