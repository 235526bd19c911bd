"""Fixtures for real FUSE mounts: start the daemon with the CLI, always unmount."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass

import pytest


def fuse_usable() -> tuple[bool, str]:
    if not os.path.exists("/dev/fuse"):
        return False, "/dev/fuse is missing"
    if not (shutil.which("fusermount3") or os.geteuid() == 0):
        return False, "fusermount3 is not installed and we are not root"
    try:
        import pyfuse3  # noqa: F401
    except ImportError as exc:
        return False, f"pyfuse3 is not importable: {exc}"
    return True, ""


@dataclass
class Mount:
    store: str          # store URL or directory
    path: str           # mountpoint
    cache: str
    extra: tuple = ()

    def daemon_pids(self) -> list[int]:
        out = subprocess.run(["pgrep", "-f", f"s4fs.cli mount {self.store} {self.path}"],
                             capture_output=True, text=True).stdout.split()
        return [int(p) for p in out]

    def start(self) -> None:
        cmd = [sys.executable, "-m", "s4fs.cli", "mount", self.store, self.path,
               "--cache-dir", self.cache, *self.extra]
        res = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
        assert res.returncode == 0, f"mount failed: {res.stderr}"
        assert os.path.ismount(self.path), "daemon reported ready but nothing is mounted"

    def stop(self) -> None:
        if os.path.ismount(self.path) or _stale(self.path):
            subprocess.run(["fusermount3", "-u", "-z", self.path], capture_output=True)
        deadline = time.monotonic() + 20
        while self.daemon_pids() and time.monotonic() < deadline:
            time.sleep(0.1)
        for pid in self.daemon_pids():
            os.kill(pid, signal.SIGKILL)

    def kill9(self) -> None:
        for pid in self.daemon_pids():
            os.kill(pid, signal.SIGKILL)
        time.sleep(0.3)

    def restart(self) -> None:
        self.stop()
        self.start()


def _stale(path: str) -> bool:
    try:
        os.stat(path)
        return False
    except OSError:
        return True


@pytest.fixture
def mount_factory(tmp_path):
    ok, why = fuse_usable()
    if not ok:
        pytest.skip(why)
    made: list[Mount] = []

    def make(store: str | None = None, name: str = "mnt", extra=()) -> Mount:
        if store is None:
            store = str(tmp_path / f"store-{len(made)}")
            os.makedirs(store, exist_ok=True)
        mp = tmp_path / name
        mp.mkdir(exist_ok=True)
        cache = tmp_path / f"cache-{name}"
        cache.mkdir(exist_ok=True)
        m = Mount(store, str(mp), str(cache), tuple(extra))
        made.append(m)
        m.start()
        return m

    try:
        yield make
    finally:
        for m in made:
            m.stop()


@pytest.fixture
def mounted(mount_factory) -> Mount:
    return mount_factory()
