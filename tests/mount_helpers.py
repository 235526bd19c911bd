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

    @property
    def writeback(self) -> bool:
        return "--writeback" in self.extra

    def sync(self) -> None:
        """Wait until the mount has committed everything (a no-op without writeback)."""
        res = subprocess.run([sys.executable, "-m", "s4fs.cli", "sync", self.path],
                             capture_output=True, text=True, timeout=300)
        assert res.returncode == 0, f"s4fs sync failed: {res.stderr}"

    def daemon_pids(self) -> list[int]:
        import re
        pattern = re.escape(f"s4fs.cli mount {self.store} {self.path}")
        out = subprocess.run(["pgrep", "-f", pattern],
                             capture_output=True, text=True).stdout.split()
        return [int(p) for p in out]

    def start(self) -> None:
        cmd = [sys.executable, "-m", "s4fs.cli", "mount", self.store, self.path,
               "--cache-dir", self.cache, *(a for a in self.extra if a != AUTO_TRANSPORT),
               *transport_flags(self.extra)]
        res = subprocess.run(cmd, capture_output=True, text=True, timeout=120,
                             env=transport_env(self.extra))
        assert res.returncode == 0, f"mount failed: {res.stderr}"
        assert os.path.ismount(self.path), "daemon reported ready but nothing is mounted"

    def stop(self) -> None:
        if os.path.ismount(self.path) or _stale(self.path):
            tool = ["fusermount3", "-u", "-z"] if shutil.which("fusermount3") else \
                ["umount", "-l"]
            subprocess.run(tool + [self.path], capture_output=True)
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


# Which way a test's mount moves bytes when the test does not say: FUSE requests, unless
# S4FS_TEST_TRANSPORT=passthrough (`make test` runs the mount tests both ways), whatever
# pyfuse3 the venv holds — a venv where `make demo` installed the passthrough build still
# tests the request path by default.
TRANSPORT = os.environ.get("S4FS_TEST_TRANSPORT", "requests")
# in a Mount's extra: no transport flag at all (the mount decides, as `s4fs mount` does)
AUTO_TRANSPORT = "<auto transport>"


def transport_flags(extra) -> list[str]:
    if "--passthrough" in extra or "--no-passthrough" in extra or AUTO_TRANSPORT in extra:
        return []
    return ["--passthrough"] if TRANSPORT == "passthrough" else ["--no-passthrough"]


def transport_env(extra) -> dict | None:
    """The daemon's environment: with passthrough, the pyfuse3 built for it first on its
    PYTHONPATH (S4FS_PYFUSE3_PASSTHROUGH, which `make test` sets)."""
    if "--passthrough" not in [*extra, *transport_flags(extra)]:
        return None
    site = os.environ.get("S4FS_PYFUSE3_PASSTHROUGH")
    if not site:
        return None          # the venv's own pyfuse3 (the test's pt_site, or make passthrough)
    return {**os.environ, "PYTHONPATH": site_first(site)}


def site_first(site: str) -> str:
    """This process's PYTHONPATH with ``site`` (a pyfuse3 built with passthrough) first,
    once."""
    rest = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p and p != site]
    return os.pathsep.join([site, *rest])


def _stale(path: str) -> bool:
    try:
        os.stat(path)
        return False
    except OSError:
        return True


def scrape(metrics_dir: str) -> str:
    """/metrics as the runner would serve it for a daemon recording into metrics_dir."""
    code = ("import sys; from s4fs import metrics; metrics.serve_directory(sys.argv[1]); "
            "sys.stdout.write(metrics.text().decode())")
    return subprocess.run([sys.executable, "-c", code, metrics_dir], capture_output=True,
                          text=True, check=True, timeout=60).stdout


def gauge(text: str, name: str) -> float:
    for line in text.splitlines():
        if line.startswith(name + " ") or line.startswith(name + "{"):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"{name} not in /metrics")


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
def pt_site(monkeypatch):
    """The pyfuse3 built with FUSE passthrough (``make test`` builds it and names it in
    S4FS_PYFUSE3_PASSTHROUGH), first on the PYTHONPATH of the mount daemons this test
    starts. Skipped outside ``make test``; a failure under CI."""
    site = os.environ.get("S4FS_PYFUSE3_PASSTHROUGH")
    if not site or not os.path.isdir(site):
        if os.environ.get("CI"):
            pytest.fail("S4FS_PYFUSE3_PASSTHROUGH names no pyfuse3 built with passthrough "
                        "(make test builds it)")
        pytest.skip("no pyfuse3 built with passthrough (run the suite through make test)")
    monkeypatch.setenv("PYTHONPATH", site_first(site))
    return site


@pytest.fixture(scope="session")
def s3_server_process(s3_server, request):
    """The S3 server in processes of its own, on a free loopback port: moto's, started
    here, or (``S4FS_TEST_S3=rgw``) the session's Ceph RGW, whose daemons are processes
    already.

    Mount tests cannot use the in-process moto server: a test blocked in a FUSE system
    call (torch.save's C++ writer holds the GIL) would starve the server thread that the
    mount daemon is waiting for.
    """
    if s3_server == "rgw":
        yield request.getfixturevalue("s3_endpoint")
        return
    pytest.importorskip("moto.server", reason="moto[server] is not installed")
    code = ("from moto.server import ThreadedMotoServer\n"
            "import sys, time\n"
            "s = ThreadedMotoServer(ip_address='127.0.0.1', port=0, verbose=False)\n"
            "s.start()\n"
            "print(s.get_host_and_port()[1], flush=True)\n"
            "sys.stdin.read()\n")
    proc = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True)
    try:
        port = int(proc.stdout.readline())
        yield f"http://127.0.0.1:{port}"
    finally:
        proc.stdin.close()
        proc.terminate()
        proc.wait(10)


def s3_url(request, prefix: str = "mnt") -> str:
    """An s3:// store URL on a loopback S3 server process (``s3_server_process``), in a
    fresh bucket; credentials are the ones the S3 fixtures set."""
    import uuid
    request.getfixturevalue("s3_endpoint")          # sets dummy AWS credentials
    endpoint = request.getfixturevalue("s3_server_process")
    import boto3
    bucket = f"s4fs-mnt-{uuid.uuid4().hex[:12]}"
    boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1").create_bucket(
        Bucket=bucket)
    return f"s3://{bucket}/{prefix}?endpoint_url={endpoint}"


@pytest.fixture(params=["local", "local-writeback", pytest.param("s3", marks=pytest.mark.s3)])
def mounted(request, mount_factory) -> Mount:
    """A mount on a LocalStore (in both commit modes), and on an S3Store (loopback S3
    server)."""
    if request.param == "s3":
        return mount_factory(store=s3_url(request))
    if request.param == "local-writeback":
        return mount_factory(extra=["--writeback"])
    return mount_factory()


class FaultProxyProcess:
    """tests/s3_server.py's S3FaultProxy in a process of its own (see s3_server_process
    for why), driven over stdin: inject(action, times, method) / clear()."""

    _CODE = (
        "import sys, json\n"
        "sys.path.insert(0, sys.argv[2])\n"
        "from s3_server import S3FaultProxy\n"
        "p = S3FaultProxy(sys.argv[1])\n"
        "print(p.url, flush=True)\n"
        "for line in sys.stdin:\n"
        "    cmd = json.loads(line)\n"
        "    if cmd['op'] == 'clear':\n"
        "        p.clear()\n"
        "    elif cmd['op'] == 'inject_nth':\n"
        "        seen = []\n"
        "        def when(meth, path, seen=seen, cmd=cmd):\n"
        "            if meth != cmd['method'] or cmd['contains'] not in path:\n"
        "                return False\n"
        "            key = path.split('?')[0]\n"
        "            if key not in seen:\n"
        "                seen.append(key)\n"
        "            return seen.index(key) == cmd['n']\n"
        "        p.inject(cmd['action'], None, when)\n"
        "    else:\n"
        "        m = cmd.get('method')\n"
        "        p.inject(cmd['action'], cmd.get('times'),\n"
        "                 (lambda meth, path, m=m: meth == m) if m else None)\n"
        "    print('ok', flush=True)\n"
        "p.close()\n")

    def __init__(self, upstream: str) -> None:
        here = os.path.dirname(os.path.abspath(__file__))
        self._p = subprocess.Popen([sys.executable, "-c", self._CODE, upstream, here],
                                   stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        self.url = self._p.stdout.readline().strip()

    def _send(self, cmd: dict) -> None:
        import json
        self._p.stdin.write(json.dumps(cmd) + "\n")
        self._p.stdin.flush()
        assert self._p.stdout.readline().strip() == "ok"

    def inject(self, action: str, times: int | None = None, method: str | None = None):
        self._send({"op": "inject", "action": action, "times": times, "method": method})

    def inject_nth(self, action: str, n: int, method: str, contains: str) -> None:
        """Fail every ``method`` request for the ``n``-th distinct object (0-based) whose
        path contains ``contains`` — e.g. every PUT of one pack — and no other."""
        self._send({"op": "inject_nth", "action": action, "n": n, "method": method,
                    "contains": contains})

    def clear(self) -> None:
        self._send({"op": "clear"})

    def close(self) -> None:
        self._p.stdin.close()
        self._p.wait(10)
