"""What users do in a checkpoint folder beyond saving and loading (issue 47): a symbolic
link to the newest checkpoint that training scripts and ``torch.load`` follow, and
owners and modes kept per file and folder on a mount shared by several users
(``--allow-other``; the kernel checks permissions against what the mount reports).
Through a real mount, both transports (tests/conftest.py KERNEL_SUITE), and across a
remount and a second mount of the same store."""

from __future__ import annotations

import os
import pathlib
import stat
import subprocess
import tempfile

import pytest
import torch

pytestmark = pytest.mark.fuse

NOBODY = 65534


def as_user(uid: int, gid: int, *cmd: str) -> subprocess.CompletedProcess:
    """``cmd`` run as ``uid``:``gid`` with no other groups (setpriv, util-linux)."""
    return subprocess.run(["setpriv", f"--reuid={uid}", f"--regid={gid}", "--clear-groups",
                           *cmd], capture_output=True, text=True, timeout=60)


def test_a_latest_link_is_followed_by_torch_load_and_kept_across_mounts(mount_factory):
    m = mount_factory(extra=["--allow-other"])
    sd = {"w": torch.arange(10_000, dtype=torch.float32)}
    torch.save(sd, os.path.join(m.path, "ckpt_1000.pt"))
    os.symlink("ckpt_1000.pt", os.path.join(m.path, "latest.tmp"))
    os.replace(os.path.join(m.path, "latest.tmp"), os.path.join(m.path, "latest"))
    link = os.path.join(m.path, "latest")
    assert os.readlink(link) == "ckpt_1000.pt"
    assert stat.S_ISLNK(os.lstat(link).st_mode)
    assert torch.equal(torch.load(link)["w"], sd["w"])
    assert sorted(os.listdir(m.path)) == ["ckpt_1000.pt", "latest"]
    other = mount_factory(store=m.store, name="other", extra=["--allow-other"])
    there = os.path.join(other.path, "latest")
    assert os.readlink(there) == "ckpt_1000.pt"
    assert torch.equal(torch.load(there)["w"], sd["w"])
    # the link moves to the next checkpoint; the other mount sees it (metadata TTL)
    torch.save({"w": sd["w"] + 1}, os.path.join(m.path, "ckpt_2000.pt"))
    os.symlink("ckpt_2000.pt", os.path.join(m.path, "latest.tmp"))
    os.replace(os.path.join(m.path, "latest.tmp"), link)
    m.stop()
    again = mount_factory(store=m.store, name="again")
    assert os.readlink(os.path.join(again.path, "latest")) == "ckpt_2000.pt"
    assert torch.equal(torch.load(os.path.join(again.path, "latest"))["w"], sd["w"] + 1)
    os.unlink(os.path.join(again.path, "latest"))
    assert sorted(os.listdir(again.path)) == ["ckpt_1000.pt", "ckpt_2000.pt"]


@pytest.fixture
def reachable(tmp_path):
    """Other users may pass through the folders above the test's mounts (pytest's own
    are root's alone): execute-only for the test, their own modes again after it."""
    top = pathlib.Path(tempfile.gettempdir())
    dirs = [d for d in [tmp_path, *tmp_path.parents] if top in d.parents]
    modes = [stat.S_IMODE(d.stat().st_mode) for d in dirs]
    for d, mode in zip(dirs, modes):
        d.chmod(mode | 0o111)
    try:
        yield
    finally:
        for d, mode in zip(dirs, modes):
            d.chmod(mode)


def test_owners_and_modes_are_kept_and_checked(mount_factory, reachable):
    m = mount_factory(extra=["--allow-other"])
    shared = os.path.join(m.path, "shared")
    os.mkdir(shared, 0o755)
    os.chown(shared, NOBODY, NOBODY)
    os.chmod(shared, 0o750)
    # its owner may write in it; another user may not even list it
    assert as_user(NOBODY, NOBODY, "sh", "-c", f"echo hi > {shared}/mine").returncode == 0
    denied = as_user(1000, 1000, "ls", shared)
    assert denied.returncode != 0 and "ermission denied" in denied.stderr
    st = os.stat(os.path.join(shared, "mine"))
    assert (st.st_uid, st.st_gid) == (NOBODY, NOBODY)     # its creator's
    p = os.path.join(m.path, "ckpt.pt")
    with open(p, "wb") as f:
        f.write(b"x" * 4096)
    os.chown(p, 1000, 1000)
    os.chmod(p, 0o600)
    assert as_user(1000, 1000, "cat", p).returncode == 0
    assert as_user(1001, 1001, "cat", p).returncode != 0
    os.symlink("ckpt.pt", os.path.join(m.path, "link"))
    os.chown(os.path.join(m.path, "link"), 1000, 1000, follow_symlinks=False)
    m.stop()
    again = mount_factory(store=m.store, name="again", extra=["--allow-other"])
    d = os.stat(os.path.join(again.path, "shared"))
    assert (stat.S_IMODE(d.st_mode), d.st_uid, d.st_gid) == (0o750, NOBODY, NOBODY)
    f = os.stat(os.path.join(again.path, "ckpt.pt"))
    assert (stat.S_IMODE(f.st_mode), f.st_uid, f.st_gid) == (0o600, 1000, 1000)
    ln = os.lstat(os.path.join(again.path, "link"))
    assert (ln.st_uid, ln.st_gid) == (1000, 1000)
    with open(os.path.join(again.path, "shared", "mine")) as f:
        assert f.read() == "hi\n"
