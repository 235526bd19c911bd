"""The runner's mount runs as the unprivileged user s4fs. FUSE passthrough needs
CAP_SYS_ADMIN (the kernel registers backing files only for it), not root: with the
capability (systemd/s4fs-runner.service.d/passthrough.conf gives it as an ambient one)
a non-root mount moves bytes by passthrough; without it the mount says why it goes
through FUSE requests. Real mounts, as a non-root user started with ``setpriv``."""

from __future__ import annotations

import os
import pathlib
import shutil
import subprocess
import sys
import tempfile

import pytest

from s4fs.mount import _daemon

from mount_helpers import TRANSPORT, fuse_usable, gauge, scrape

pytestmark = pytest.mark.fuse

USER, GROUP = "nobody", "nogroup"
# What the test harness needs beyond the service's own CAP_SYS_ADMIN, not the service:
# this machine's Python may live under /root (dac_read_search to run it), and a
# container's /dev/fuse may be 0600 where a host's is 0666 (dac_override to open it).
HARNESS_CAPS = ["dac_read_search", "dac_override"]


def _status(capeff: int, tmp_path) -> str:
    p = tmp_path / "status"
    p.write_text(f"Name:\tpython\nCapInh:\t0000000000000000\nCapEff:\t{capeff:016x}\n")
    return str(p)


def test_the_capability_not_the_uid_decides(tmp_path):
    assert _daemon.has_sys_admin(_status(1 << 21, tmp_path))
    assert _daemon.has_sys_admin(_status(0x000001ffffffffff, tmp_path))     # root's set
    assert not _daemon.has_sys_admin(_status(0, tmp_path))
    assert not _daemon.has_sys_admin(_status((1 << 21) - 1, tmp_path))      # all but it
    if os.geteuid() == 0:                          # this process: root's full set
        assert _daemon.has_sys_admin()


@pytest.fixture
def open_dir():
    """A folder the non-root user can reach (fusermount3 checks the mountpoint's path as
    that user; pytest's own folders are root's alone)."""
    d = tempfile.mkdtemp(prefix="s4fs-service-user-")
    os.chmod(d, 0o755)
    try:
        yield pathlib.Path(d)
    finally:
        subprocess.run(["umount", "-l", os.path.join(d, "mnt")], capture_output=True)
        shutil.rmtree(d, ignore_errors=True)


def _as_service_user(tmp_path, caps: list[str]):
    """Run the s4fs CLI as ``nobody`` with ``caps`` ambient (and the harness's)."""
    if os.geteuid() != 0 or not shutil.which("setpriv"):
        pytest.skip("needs root and setpriv (util-linux) to start a non-root mount")
    ok, why = fuse_usable()
    if not ok:
        pytest.skip(why)
    env = dict(os.environ, HOME=str(tmp_path))     # PYTHONPATH: pt_site's binding first
    all_caps = ",".join(f"+{c}" for c in [*caps, *HARNESS_CAPS])
    setpriv = ["setpriv", f"--reuid={USER}", f"--regid={GROUP}", "--clear-groups",
               f"--inh-caps={all_caps}", f"--ambient-caps={all_caps}"]
    dirs = {d: tmp_path / d for d in ("store", "mnt", "cache")}
    for d in dirs.values():
        d.mkdir()
        shutil.chown(d, USER, GROUP)

    def run_as(cmd):
        return subprocess.run([*setpriv, *cmd], env=env, capture_output=True, text=True,
                              timeout=180)

    def cli(*args, check=True):
        r = run_as([sys.executable, "-m", "s4fs.cli", *args])
        if check:
            assert r.returncode == 0, r.stdout + r.stderr
        return r
    return dirs, cli, run_as


def _save_and_status(dirs, cli, run_as) -> str:
    """Mount as the user, write 16 MiB through the mount and read them back (as the
    user too: without allow_other a FUSE mount serves its owner only), and what
    ``s4fs status`` says of the transport."""
    mnt = str(dirs["mnt"])
    cli("mount", str(dirs["store"]), mnt, "--cache-dir", str(dirs["cache"]))
    try:
        code = ("import os, sys\n"
                "data = os.urandom(8 << 20) + bytes(8 << 20)\n"
                "p = os.path.join(sys.argv[1], 'ckpt.bin')\n"
                "open(p, 'wb').write(data)\n"
                "assert open(p, 'rb').read() == data, 'bytes differ'\n")
        r = run_as([sys.executable, "-c", code, mnt])
        assert r.returncode == 0, r.stdout + r.stderr
        return cli("status", mnt).stdout
    finally:
        cli("umount", mnt, check=False)
        subprocess.run(["umount", "-l", mnt], capture_output=True)


def test_a_service_user_with_cap_sys_admin_writes_through_passthrough(open_dir, pt_site):
    said = _save_and_status(*_as_service_user(open_dir, ["sys_admin"]))
    assert "through FUSE passthrough" in said, said


@pytest.fixture
def world_fuse():
    """/dev/fuse open to every user, as udev makes it on a host (0666): the non-root
    mount without the capability goes through fusermount3, which opens it as the user.
    A container's may be 0600; it is put back as it was."""
    mode = os.stat("/dev/fuse").st_mode & 0o777
    if mode & 0o666 != 0o666:
        os.chmod("/dev/fuse", mode | 0o666)
    try:
        yield
    finally:
        os.chmod("/dev/fuse", mode)


def test_a_service_user_without_it_says_why_requests(open_dir, pt_site, world_fuse):
    said = _save_and_status(*_as_service_user(open_dir, []))
    assert "through FUSE requests" in said, said
    assert "needs CAP_SYS_ADMIN" in said and "docs/OPERATING.md" in said


def test_the_runners_health_says_which_way_the_bytes_go(mount_factory):
    """/healthz's commits check (the runner's) names the transport, healthy either way."""
    from s4fs.service.health import commits_probe
    m = mount_factory()
    with open(os.path.join(m.path, "a.bin"), "wb") as f:
        f.write(os.urandom(1 << 20))
    said = commits_probe(m.path)()
    assert said.startswith("0 files pending commit; through FUSE ")
    if TRANSPORT == "passthrough":
        assert "through FUSE passthrough" in said, said
    else:
        assert "through FUSE requests (--no-passthrough)" in said, said


def test_metrics_say_whether_the_mount_uses_passthrough(mount_factory, tmp_path,
                                                        monkeypatch):
    """s4fs_mount_passthrough: 1 through passthrough, 0 through requests — an alert can
    catch a mount that fell back to the slow path."""
    metrics_dir = str(tmp_path / "metrics")
    os.makedirs(metrics_dir)
    monkeypatch.setenv("PROMETHEUS_MULTIPROC_DIR", metrics_dir)   # the daemon records here
    m = mount_factory()
    with open(os.path.join(m.path, "a.bin"), "wb") as f:
        f.write(os.urandom(1 << 20))
    value = gauge(scrape(metrics_dir), "s4fs_mount_passthrough")
    assert value == (1.0 if TRANSPORT == "passthrough" else 0.0)
