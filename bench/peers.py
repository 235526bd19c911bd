"""s4fs beside the FUSE filesystems users run today, on the same loopback S3 server.

    python bench/peers.py [--gib 0.25] [--repeat 3] [--every 5] [--link RATE]
                          [--server moto|rgw] [--peers s4fs,s4fs-writeback,s3fs,rclone,boto3]
                          [--rclone-cache-mode full|writes] [--op-timeout 600] [--work DIR]

One S3 server on a free port on 127.0.0.1, started and stopped here, serves every tool:
moto's (server mode, in a process of its own; the default) or, with ``--server rgw``,
Ceph's RADOS Gateway 16.2 (one monitor, one bluestore OSD on a sparse file in the
scratch folder, radosgw: tests/rgw_server.py; ``apt-get install radosgw ceph-mon
ceph-osd``), a real S3 server written in C++; each tool gets a fresh bucket for each
repeat. The data is one training run's two consecutive checkpoints: MiniLM
(all-MiniLM-L6-v2) fine-tuned with AdamW, ``--every`` steps apart (model + optimizer
state, fp32, about 259 MiB each; ``--gib`` scales it with replicas side by side, as
bench/mount.py does). Every tool runs the same unchanged ``torch.save(state, path)`` /
``torch.load(path)``:

* ``s4fs``: ``s4fs mount s3://BUCKET/ckpt?endpoint_url=...``; close() returns once the
  file is in the bucket (durable at close). The second checkpoint is stored as a delta.
* ``s4fs-writeback``: the same with ``--writeback``: close() returns once the bytes are
  on local disk; durable = close + ``s4fs sync MNT``.
* ``s4fs-stream`` (not in the default run): ``s4fs`` with ``--stream-cold-reads``: under
  FUSE passthrough a cold file is read through the daemon while it is decoded, instead
  of its open waiting for the whole local copy.
* ``s4fs-push`` (not in the default run): ``s4fs`` with ``--push-cold-reads``: a cold
  file's open returns at once and its decoded parts are pushed into the kernel's page
  cache as they land.
* ``s3fs``: s3fs-fuse (``-o url=...,use_path_request_style,passwd_file=...``); it uploads
  on flush, so close() returns once the object is in the bucket (checked with a HEAD).
  No ``use_cache``: its default, so every load reads the bucket.
* ``rclone``: ``rclone mount`` of an s3 remote (provider Other) with ``--vfs-cache-mode
  full`` (or ``writes``) and ``--vfs-write-back 0s`` (the default, 5 s, would add 5 s to
  durability): close() returns once the file is in rclone's cache; durable = when a
  HEAD of the object answers with the full size (polled every 20 ms).
* ``boto3``: ``torch.save`` to local disk, then ``upload_file`` (durable after the upload).

Loads, of the second checkpoint: *cold* — unmount, remount with the same cache dir,
``drop_caches``, ``torch.load`` (boto3: the local file after ``drop_caches``); *fresh
node* — a remount with an empty cache dir (boto3: ``download_file`` + ``torch.load``).
Every load is compared with the state saved (``torch.equal`` on every tensor): a wrong
load is reported as a failure and its time is not counted. The table gives medians and
min–max over ``--repeat`` runs (repeats outermost, so the tools interleave in time),
and the bytes each tool left in its bucket for the two checkpoints.

The script installs nothing: a tool that is missing is skipped, with what to install
(``apt-get install s3fs rclone``, ``pip install moto[server] boto3``) in its row. Every
process and mount it starts is bounded (``--op-timeout`` per save or load: past it the
mount is lazily unmounted and its daemon killed) and torn down in ``finally`` blocks.
Needs root (FUSE mounts, ``drop_caches``). Timings are printed, never asserted.

``--link RATE`` (``1gbit``, ``10gbit``: tc's units) runs all of it — the server and
every tool — inside a network namespace made for the run, whose loopback is limited to
RATE by a token bucket (``tc qdisc add dev lo root tbf``; this kernel has no netem), and
removes the namespace afterwards. Uploads and downloads share that one limit.

Each run also measures its floors, in the same run, through the same link: the server's
own whole-object rates (PUT and GET, the better of one 128 MiB object and four of
32 MiB side by side: the most this server moves through this link) and ``torch.save``/``torch.load`` of the checkpoint
on local disk (page cache dropped before the load). A tool's *load floor* is the bytes
its fresh-node load must fetch (s4fs: the blobs of the version and of the delta bases it
decodes through; the others: the file) over min(link rate, the server's GET rate), plus
the local ``torch.load``; its *save floor*, the bytes it stores for that save over
min(link, PUT rate) plus the local ``torch.save``. The table prints each beside the
time measured, and the ratio. Neither counts CPU, so each fresh-node load also records
the CPU seconds every process of the machine used meanwhile (``/proc/stat``; the S3
server's included): over the machine's cores that is its *CPU floor*, the least the load
could take had that work been spread over every core. A load near 1× its CPU floor was
bound by the cores, not by the link.

moto is not S3: a Python server sharing the machine's cores with every tool.
It keeps objects in its memory here (so ``drop_caches`` does not reach the server), but
it copies the whole object for every GET, ranged or not: a tool that reads a big object
in many ranges (s3fs, boto3's ``download_file``; s4fs reads 4 MiB chunks of ~32 MiB
packs) pays that per request, as no real S3 makes it pay. Absolute speeds are the
loopback's, not S3's.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from mount import drop_caches, series  # noqa: E402  (bench/mount.py: stdlib imports only)
from _common import machine_cpu  # noqa: E402

PEERS = ("s4fs", "s4fs-writeback", "s3fs", "rclone", "boto3")      # the default run
KNOWN = PEERS + ("s4fs-stream", "s4fs-push")
PREFIX = "ckpt"                       # s4fs's prefix in its bucket

#: AWS settings hidden from every tool: only the dummy credentials below reach moto
#: (an AWS_CA_BUNDLE, even unused on http, makes rclone's S3 client refuse to start)
_HIDDEN_AWS_VARS = ("AWS_PROFILE", "AWS_DEFAULT_PROFILE", "AWS_SESSION_TOKEN",
                    "AWS_SECURITY_TOKEN", "AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3",
                    "AWS_CA_BUNDLE", "AWS_ROLE_ARN", "AWS_WEB_IDENTITY_TOKEN_FILE",
                    "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI",
                    "AWS_CONTAINER_CREDENTIALS_FULL_URI")


class PeerError(Exception):
    """A tool failed (mount, save, load, durability): its row says so."""


# --- small helpers ---------------------------------------------------------------------

def run(cmd, timeout=120, check=True, **kw) -> subprocess.CompletedProcess:
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, **kw)
    if check and res.returncode != 0:
        raise PeerError(f"{' '.join(map(str, cmd[:4]))} … exited {res.returncode}: "
                        f"{(res.stderr or res.stdout).strip()[-400:]}")
    return res


def lazy_unmount(path: str) -> None:
    tool = ["fusermount3", "-u", "-z"] if shutil.which("fusermount3") else ["umount", "-l"]
    subprocess.run(tool + [path], capture_output=True, timeout=30)


def mounted(path: str) -> bool:
    real = os.path.realpath(path)
    try:
        with open("/proc/mounts") as f:
            return any(ln.split()[1] == real for ln in f)
    except OSError:
        return os.path.ismount(path)


def wait_mounted(path: str, proc: subprocess.Popen | None, log: str, timeout=60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if mounted(path):
            return
        if proc is not None and proc.poll() is not None:
            break
        time.sleep(0.05)
    raise PeerError(f"not mounted after {timeout} s; log: {tail(log)}")


def tail(path: str, n: int = 400) -> str:
    try:
        with open(path, errors="replace") as f:
            return f.read()[-n:].strip().replace("\n", " | ")
    except OSError:
        return "(no log)"


def kill(proc: subprocess.Popen | None, grace: float = 20) -> None:
    if proc is None or proc.poll() is not None:
        return
    proc.terminate()
    try:
        proc.wait(grace)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(10)


def equal(a, b, where: str = "state") -> str | None:
    """None when ``a`` and ``b`` are the same state bit for bit, else where they differ."""
    import torch
    if torch.is_tensor(a) or torch.is_tensor(b):
        if not (torch.is_tensor(a) and torch.is_tensor(b)) or a.dtype != b.dtype \
                or a.shape != b.shape or not torch.equal(a, b):
            return where
        return None
    if isinstance(a, dict) and isinstance(b, dict):
        if a.keys() != b.keys():
            return f"{where} (keys)"
        for k in a:
            bad = equal(a[k], b[k], f"{where}[{k!r}]")
            if bad:
                return bad
        return None
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        if len(a) != len(b):
            return f"{where} (length)"
        for i, (x, y) in enumerate(zip(a, b)):
            bad = equal(x, y, f"{where}[{i}]")
            if bad:
                return bad
        return None
    return None if a == b else where


class Deadline:
    """Bounds a save or a load through a FUSE mount: past ``seconds`` the mount is
    aborted (lazy unmount, daemon killed), which fails the blocked system call."""

    def __init__(self, seconds: float, abort, what: str) -> None:
        self.seconds, self.abort, self.what = seconds, abort, what
        self.expired = False

    def _fire(self) -> None:
        self.expired = True
        self.abort()

    def __enter__(self):
        self._t = threading.Timer(self.seconds, self._fire)
        self._t.daemon = True
        self._t.start()
        return self

    def __exit__(self, *exc):
        self._t.cancel()
        if self.expired:
            raise PeerError(f"{self.what} took over {self.seconds:.0f} s; mount aborted")
        return False


# --- a rate-limited link ------------------------------------------------------------

_UNITS = {"bit": 1, "kbit": 10**3, "mbit": 10**6, "gbit": 10**9, "tbit": 10**12}


def link_bits(rate: str) -> int:
    """``1gbit`` -> 1_000_000_000 (bits per second, tc's decimal units)."""
    r = rate.strip().lower()
    for unit in sorted(_UNITS, key=len, reverse=True):
        if r.endswith(unit) and r[: -len(unit)].replace(".", "", 1).isdigit():
            return int(float(r[: -len(unit)]) * _UNITS[unit])
    raise ValueError(f"--link {rate!r}: give a rate as tc writes it (1gbit, 10gbit, "
                     f"500mbit)")


def run_in_link(rate: str, argv: list[str]) -> int:
    """Run this script again inside a fresh network namespace whose loopback is limited
    to ``rate`` (a tbf qdisc); the namespace is removed afterwards, whatever happens."""
    bits = link_bits(rate)
    for tool in ("ip", "tc"):
        if not shutil.which(tool):
            print(f"cannot run --link: {tool} not found: apt-get install iproute2",
                  file=sys.stderr)
            return 2
    ns = f"s4fs-bench-{os.getpid()}"
    run(["ip", "netns", "add", ns])
    child = None
    try:
        inside = ["ip", "netns", "exec", ns]
        run(inside + ["ip", "link", "set", "lo", "up"])
        burst = max(bits // 8 // 100, 256 << 10)          # 10 ms of the rate
        run(inside + ["tc", "qdisc", "add", "dev", "lo", "root", "tbf", "rate", rate,
                      "burst", str(burst), "latency", "200ms"])
        print(f"# link: network namespace {ns}, loopback limited to {rate} "
              f"(tbf, burst {burst} B)", flush=True)
        child = subprocess.Popen(inside + [sys.executable, os.path.abspath(__file__),
                                           *argv],
                                 env=dict(os.environ, S4FS_BENCH_LINK=rate))
        return child.wait()
    finally:
        if child is not None and child.poll() is None:
            child.terminate()
            try:
                child.wait(60)
            except subprocess.TimeoutExpired:
                child.kill()
                child.wait(10)
        run(["ip", "netns", "del", ns], check=False)


def server_rates(s3: "MotoServer", nbytes: int = 128 << 20, repeat: int = 3) -> dict:
    """The server's own whole-object rates through this link (bytes/s): for PUT and for
    GET, the better of one 128 MiB object at a time and four 32 MiB objects side by
    side (median of ``repeat`` each) — the most this server moves through this link, so
    the floors built on it are the strictest."""
    from concurrent.futures import ThreadPoolExecutor
    bucket = s3.bucket("floor", 0)
    data = os.urandom(nbytes)
    quarter = memoryview(data)[: nbytes // 4]

    def put(key, body):
        s3.client.put_object(Bucket=bucket, Key=key, Body=bytes(body))

    def get(key) -> int:
        body = s3.client.get_object(Bucket=bucket, Key=key)["Body"]
        got = 0
        while True:
            piece = body.read(8 << 20)
            if not piece:
                return got
            got += len(piece)

    def rate(fn, args) -> float:
        with ThreadPoolExecutor(len(args)) as ex:
            t0 = time.perf_counter()
            list(ex.map(lambda a: fn(*a), args))
            return nbytes / (time.perf_counter() - t0)
    one_put, one_get, four_put, four_get = [], [], [], []
    try:
        for _ in range(repeat):
            one_put.append(rate(put, [("one", data)]))
            one_get.append(rate(get, [("one",)]))
            four_put.append(rate(put, [(f"q{i}", quarter) for i in range(4)]))
            four_get.append(rate(get, [(f"q{i}",) for i in range(4)]))
    finally:
        s3.remove(bucket)
    med = statistics.median
    return {"put": max(med(one_put), med(four_put)), "get": max(med(one_get), med(four_get)),
            "put1": med(one_put), "get1": med(one_get)}


def local_times(ck: dict, work: str, repeat: int = 3) -> dict:
    """``torch.save`` to local disk and a cold ``torch.load`` (page cache dropped) of
    ``ck``, seconds (medians)."""
    import torch
    path = os.path.join(work, "local-floor.pt")
    saves, loads = [], []
    try:
        for _ in range(repeat):
            t0 = time.perf_counter()
            torch.save(ck, path)
            saves.append(time.perf_counter() - t0)
            drop_caches()
            loads.append(timed(lambda: torch.load(path)))
    finally:
        try:
            os.unlink(path)
        except OSError:
            pass
    return {"save": statistics.median(saves), "load": statistics.median(loads)}


def s4fs_needed(s3: "MotoServer", bucket: str, name: str) -> tuple[int, int]:
    """Stored bytes of ``name`` in an s4fs bucket: (its own blobs, its blobs and those of
    the delta bases a read decodes through)."""
    from s4fs import keys
    from s4fs.manifest import Manifest
    body = s3.client.get_object(Bucket=bucket, Key=f"{PREFIX}/{keys.file_key(name)}")
    m = Manifest.from_bytes(body["Body"].read())
    own, chain = {}, {}
    for st in m.streams:
        for c in st.chunks:
            r = c
            if r.pack in m.own_packs:
                own[r.key()] = r.stored
            while r is not None:
                chain[r.key()] = r.stored
                r = r.base
    return sum(own.values()), sum(chain.values())


# --- the S3 server ---------------------------------------------------------------------

class MotoServer:
    """moto's S3 server in a process of its own (a FUSE call that holds this process's
    GIL must not starve the server its daemon waits for), on a free loopback port."""

    CODE = ("from moto.server import ThreadedMotoServer\n"
            "import sys\n"
            "s = ThreadedMotoServer(ip_address='127.0.0.1', port=0, verbose=False)\n"
            "s.start()\n"
            "print(s.get_host_and_port()[1], flush=True)\n"
            "sys.stdin.read()\n"
            "s.stop()\n")

    name = "moto"
    keys = ("testing", "testing")

    def __init__(self, log: str) -> None:
        self._log = open(log, "w")
        # objects kept in the server's memory: by default moto spills each object over
        # 5 MiB to a temp file, which drop_caches would then evict from under the server
        env = dict(os.environ, MOTO_S3_DEFAULT_KEY_BUFFER_SIZE=str(16 << 30))
        self.proc = subprocess.Popen([sys.executable, "-c", self.CODE], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=self._log, text=True,
                                     env=env)
        got: list[str] = []
        reader = threading.Thread(target=lambda: got.append(self.proc.stdout.readline()),
                                  daemon=True)
        reader.start()
        reader.join(60)
        if not got or not got[0].strip().isdigit():
            self.stop()
            raise RuntimeError(f"moto's server did not start: {tail(log)}")
        self.url = f"http://127.0.0.1:{int(got[0])}"
        import boto3
        self.client = boto3.client("s3", endpoint_url=self.url, region_name="us-east-1")

    def version(self) -> str:
        import moto
        return f"moto {moto.__version__}"

    def stop(self) -> None:
        try:
            self.proc.stdin.close()
        except OSError:
            pass
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            kill(self.proc, 5)
        self._log.close()

    def bucket(self, tool: str, r: int) -> str:
        name = f"peers-{tool}-{r}-{uuid.uuid4().hex[:8]}"
        self.client.create_bucket(Bucket=name)
        return name

    def stored(self, bucket: str) -> int:
        total = 0
        for page in self.client.get_paginator("list_objects_v2").paginate(Bucket=bucket):
            total += sum(o["Size"] for o in page.get("Contents", ()))
        return total

    def remove(self, bucket: str) -> None:
        try:
            for page in self.client.get_paginator("list_multipart_uploads").paginate(
                    Bucket=bucket):
                for up in page.get("Uploads", ()):
                    self.client.abort_multipart_upload(Bucket=bucket, Key=up["Key"],
                                                       UploadId=up["UploadId"])
            for page in self.client.get_paginator("list_objects_v2").paginate(Bucket=bucket):
                keys = [{"Key": o["Key"]} for o in page.get("Contents", ())]
                if keys:
                    self.client.delete_objects(Bucket=bucket,
                                               Delete={"Objects": keys, "Quiet": True})
            self.client.delete_bucket(Bucket=bucket)
        except Exception:
            pass                      # freeing the server's memory only

    def wait_object(self, bucket: str, key: str, size: int, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while True:
            try:
                if self.client.head_object(Bucket=bucket, Key=key)["ContentLength"] == size:
                    return
            except Exception:
                pass
            if time.monotonic() > deadline:
                raise PeerError(f"s3://{bucket}/{key} not in the bucket {timeout:.0f} s "
                                f"after close()")
            time.sleep(0.02)


class RgwS3(MotoServer):
    """Ceph's RADOS Gateway (tests/rgw_server.py) in ``folder``, with its own keys."""

    name = "rgw"

    def __init__(self, folder: str) -> None:
        sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(
            os.path.abspath(__file__))), "tests"))
        from rgw_server import RgwServer
        self._rgw = RgwServer.start(Path(folder))
        self.url = self._rgw.endpoint
        self.keys = (self._rgw.access_key, self._rgw.secret_key)
        self.client = self._rgw.client()

    def version(self) -> str:
        out = subprocess.run(["radosgw", "--version"], capture_output=True, text=True)
        words = out.stdout.split()
        return f"Ceph RGW {words[2] if len(words) > 2 else '?'}"

    def stop(self) -> None:
        self._rgw.stop()


# --- the tools -----------------------------------------------------------------------

class FuseTool:
    """One FUSE filesystem on one bucket: mount with a cache dir, save, load, unmount."""

    name = ""

    def __init__(self, s3: MotoServer, bucket: str, mnt: str, work: str,
                 op_timeout: float) -> None:
        self.s3, self.bucket, self.mnt, self.work = s3, bucket, mnt, work
        self.op_timeout = op_timeout
        self.proc: subprocess.Popen | None = None
        self.log = os.path.join(work, f"{self.name}.log")
        os.makedirs(mnt, exist_ok=True)

    def key(self, name: str) -> str:
        return name

    def path(self, name: str) -> str:
        return os.path.join(self.mnt, name)

    def mount(self, cache: str) -> None:
        raise NotImplementedError

    def durable(self, name: str, size: int) -> bool:
        """Returns once the file just closed is in the bucket; True when the tool puts it
        there before close() returns and it was (the durable time is then close()'s)."""
        self.s3.wait_object(self.bucket, self.key(name), size, self.op_timeout)
        return False

    def unmount(self) -> None:
        if mounted(self.mnt):
            run(["fusermount3", "-u", self.mnt], timeout=120, check=False)
        kill(self.proc)
        self.abort()

    def abort(self) -> None:
        """Leave nothing mounted and no daemon running, whatever state they are in."""
        if mounted(self.mnt):
            lazy_unmount(self.mnt)
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)
        self.proc = None

    def _start(self, cmd: list[str]) -> None:
        with open(self.log, "a") as log:
            self.proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT,
                                         stdin=subprocess.DEVNULL)
        wait_mounted(self.mnt, self.proc, self.log)


class S4fs(FuseTool):
    name = "s4fs"
    flags: tuple[str, ...] = ()

    def key(self, name: str) -> str:
        raise AssertionError("s4fs keeps packs, not files, in its bucket")

    def cli(self, *args, timeout=300, check=True):
        return run([sys.executable, "-m", "s4fs.cli", *args], timeout=timeout, check=check)

    def mount(self, cache: str) -> None:
        store = f"s3://{self.bucket}/{PREFIX}?endpoint_url={self.s3.url}"
        self.cli("mount", store, self.mnt, "--cache-dir", cache, "--gc-interval", "0",
                 "--device", "cpu", "--log-file", self.log, *self.flags, timeout=120)
        wait_mounted(self.mnt, None, self.log, timeout=10)

    def durable(self, name: str, size: int) -> bool:
        return True                           # close() returned once it was in the bucket

    def daemon_pids(self) -> list[int]:
        out = subprocess.run(["pgrep", "-f", f"s4fs.cli mount .* {self.mnt}( |$)"],
                             capture_output=True, text=True).stdout.split()
        pids = [int(p) for p in out]
        for p in list(pids):
            kids = subprocess.run(["pgrep", "-P", str(p)], capture_output=True,
                                  text=True).stdout.split()
            pids += [int(k) for k in kids]
        return pids

    def unmount(self) -> None:
        if mounted(self.mnt):
            self.cli("umount", self.mnt, check=False)
        deadline = time.monotonic() + 30
        while self.daemon_pids() and time.monotonic() < deadline:
            time.sleep(0.1)
        self.abort()

    def abort(self) -> None:
        if mounted(self.mnt):
            lazy_unmount(self.mnt)
        for pid in self.daemon_pids():
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass


class S4fsWriteback(S4fs):
    name = "s4fs-writeback"
    flags = ("--writeback",)

    def durable(self, name: str, size: int) -> bool:
        self.cli("sync", self.mnt, timeout=self.op_timeout)
        return False


class S4fsStream(S4fs):
    """s4fs reading a cold file through the daemon while it is decoded (not waiting at
    the open for the whole copy, under FUSE passthrough)."""
    name = "s4fs-stream"
    flags = ("--stream-cold-reads",)


class S4fsPush(S4fs):
    """s4fs opening a cold file at once and pushing its decoded parts into the kernel's
    page cache as they land (``--push-cold-reads``)."""
    name = "s4fs-push"
    flags = ("--push-cold-reads",)


class S3fs(FuseTool):
    name = "s3fs"

    def durable(self, name: str, size: int) -> bool:
        """s3fs uploads on flush, before close() returns: one HEAD checks it did."""
        try:
            there = self.s3.client.head_object(Bucket=self.bucket,
                                               Key=name)["ContentLength"] == size
        except Exception:
            there = False
        return there or super().durable(name, size)

    def mount(self, cache: str) -> None:
        pw = os.path.join(self.work, "s3fs.passwd")
        with open(pw, "w") as f:
            f.write("%s:%s\n" % self.s3.keys)
        os.chmod(pw, 0o600)
        self._start(["s3fs", self.bucket, self.mnt, "-f",
                     "-o", f"url={self.s3.url},use_path_request_style,passwd_file={pw},"
                           "endpoint=us-east-1"])


class Rclone(FuseTool):
    name = "rclone"
    cache_mode = "full"

    def mount(self, cache: str) -> None:
        conf = os.path.join(self.work, "rclone.conf")
        with open(conf, "w") as f:
            f.write(f"[s3]\ntype = s3\nprovider = Other\nendpoint = {self.s3.url}\n"
                    f"access_key_id = {self.s3.keys[0]}\n"
                    f"secret_access_key = {self.s3.keys[1]}\nregion = us-east-1\n")
        self._start(["rclone", "mount", f"s3:{self.bucket}", self.mnt, "--config", conf,
                     "--cache-dir", cache, "--vfs-cache-mode", self.cache_mode,
                     "--vfs-write-back", "0s", "--log-level", "NOTICE"])


TOOLS = {"s4fs": S4fs, "s4fs-writeback": S4fsWriteback, "s4fs-stream": S4fsStream,
         "s4fs-push": S4fsPush,
         "s3fs": S3fs, "rclone": Rclone}


def missing(tool: str) -> str | None:
    """Why ``tool`` cannot run here, or None."""
    if tool != "boto3":
        if not os.path.exists("/dev/fuse"):
            return "/dev/fuse is missing"
        if not shutil.which("fusermount3"):
            return "fusermount3 missing: apt-get install fuse3"
        if os.geteuid() != 0:
            return "needs root"
    if tool.startswith("s4fs"):
        try:
            import pyfuse3  # noqa: F401
        except ImportError as exc:
            return f"pyfuse3 not importable ({exc}): pip install -e ."
    if tool == "s3fs" and not shutil.which("s3fs"):
        return "s3fs not found: apt-get install s3fs"
    if tool == "rclone" and not shutil.which("rclone"):
        return "rclone not found: apt-get install rclone"
    return None


def version(tool: str) -> str:
    try:
        if tool == "s3fs":
            out = run(["s3fs", "--version"], timeout=10, check=False).stdout
            return out.split("\n")[0].split(" V")[-1].split(" ")[0]
        if tool == "rclone":
            return run(["rclone", "version"], timeout=10, check=False).stdout.split()[1]
    except Exception:
        pass
    return "?"


# --- one repeat of one tool ----------------------------------------------------------

def timed(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def checked_load(path: str, want: dict) -> float:
    import torch
    got: list = []
    took = timed(lambda: got.append(torch.load(path)))
    bad = equal(want, got[0])
    if bad:
        raise PeerError(f"load of {os.path.basename(path)} NOT bit-exact: differs at {bad}")
    return took


def run_fuse(cls, s3: MotoServer, cks: list[dict], r: int, work: str,
             op_timeout: float) -> dict:
    import torch
    bucket = s3.bucket(cls.name, r)
    base = os.path.join(work, f"{cls.name}-{r}")
    os.makedirs(base, exist_ok=True)
    t = cls(s3, bucket, os.path.join(base, "mnt"), base, op_timeout)
    res: dict = {}
    try:
        t.mount(os.path.join(base, "cache"))
        logical = 0
        for i, ck in enumerate(cks):
            name = f"ckpt_{i}.pt"
            with Deadline(op_timeout, t.abort, f"save of {name}"):
                t0 = time.perf_counter()
                torch.save(ck, t.path(name))
                close = res[f"close{i}"] = time.perf_counter() - t0
                size = os.path.getsize(t.path(name))
                at_close = t.durable(name, size)
                res[f"durable{i}"] = close if at_close else time.perf_counter() - t0
            logical += size
            if cls.name.startswith("s4fs"):
                own, chain = s4fs_needed(s3, bucket, name)
                res[f"saved{i}"], res["needed"] = own, chain
            else:
                res[f"saved{i}"] = res["needed"] = size
        res["stored"], res["logical"] = s3.stored(bucket), logical
        last = t.path(f"ckpt_{len(cks) - 1}.pt")
        for kind, cache in (("cold", "cache"), ("fresh", "cache-fresh")):
            t.unmount()
            t.mount(os.path.join(base, cache))
            res["dropped"] = drop_caches()
            with Deadline(op_timeout, t.abort, f"{kind} load"):
                c0 = machine_cpu()
                res[kind] = checked_load(last, cks[-1])
                res[f"{kind}_cpu"] = machine_cpu() - c0
    finally:
        t.unmount()
        s3.remove(bucket)
        shutil.rmtree(base, ignore_errors=True)
    return res


def run_boto3(s3: MotoServer, cks: list[dict], r: int, work: str, op_timeout: float) -> dict:
    import torch
    bucket = s3.bucket("boto3", r)
    base = os.path.join(work, f"boto3-{r}")
    os.makedirs(os.path.join(base, "fresh"), exist_ok=True)
    res: dict = {}
    try:
        logical = 0
        for i, ck in enumerate(cks):
            name = f"ckpt_{i}.pt"
            local = os.path.join(base, name)
            t0 = time.perf_counter()
            torch.save(ck, local)
            res[f"close{i}"] = time.perf_counter() - t0
            s3.client.upload_file(local, bucket, name)
            res[f"durable{i}"] = time.perf_counter() - t0
            logical += os.path.getsize(local)
            res[f"saved{i}"] = res["needed"] = os.path.getsize(local)
        res["stored"], res["logical"] = s3.stored(bucket), logical
        name = f"ckpt_{len(cks) - 1}.pt"
        res["dropped"] = drop_caches()
        res["cold"] = checked_load(os.path.join(base, name), cks[-1])
        fresh = os.path.join(base, "fresh", name)
        res["dropped"] = drop_caches()
        t0, c0 = time.perf_counter(), machine_cpu()
        s3.client.download_file(bucket, name, fresh)
        load = checked_load(fresh, cks[-1])
        res["fresh"] = time.perf_counter() - t0
        res["fresh_cpu"] = machine_cpu() - c0
        res["fresh_load_only"] = load
    finally:
        s3.remove(bucket)
        shutil.rmtree(base, ignore_errors=True)
    return res


# --- the table -----------------------------------------------------------------------

def cell(xs: list[float]) -> str:
    if not xs:
        return "-"
    m = statistics.median(xs)
    if len(xs) == 1:
        return f"{m:.2f}"
    return f"{m:.2f} ({min(xs):.2f}–{max(xs):.2f})"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--gib", type=float, default=0.25,
                    help="size of one checkpoint (MiniLM + AdamW replicas, ~0.25 GiB each)")
    ap.add_argument("--repeat", type=int, default=3, help="runs of every measurement")
    ap.add_argument("--every", type=int, default=5, help="training steps between the two "
                                                         "checkpoints")
    ap.add_argument("--peers", default=",".join(PEERS),
                    help=f"comma-separated, of: {', '.join(KNOWN)}")
    ap.add_argument("--rclone-cache-mode", default="full", choices=["full", "writes"],
                    help="rclone's --vfs-cache-mode (full: reads are cached too)")
    ap.add_argument("--op-timeout", type=float, default=600,
                    help="seconds a save (until durable) or a load may take before its "
                         "mount is aborted and the tool marked failed")
    ap.add_argument("--work", help="scratch folder (default: a temp dir on /tmp's disk)")
    ap.add_argument("--server", default="moto", choices=["moto", "rgw"],
                    help="the S3 server: moto's (an emulator) or Ceph RGW (a real one)")
    ap.add_argument("--link", help="run inside a network namespace whose loopback is "
                                   "limited to this rate (tc units: 1gbit, 10gbit)")
    args = ap.parse_args(argv)
    if args.link and not os.environ.get("S4FS_BENCH_LINK"):
        try:
            link_bits(args.link)
        except ValueError as exc:
            ap.error(str(exc))
        return run_in_link(args.link, list(sys.argv[1:] if argv is None else argv))
    peers = [p.strip() for p in args.peers.split(",") if p.strip()]
    for p in peers:
        if p not in KNOWN:
            ap.error(f"unknown peer {p!r} (known: {', '.join(KNOWN)})")
    Rclone.cache_mode = args.rclone_cache_mode

    def on_term(signum, frame):
        raise SystemExit(f"signal {signum}")
    signal.signal(signal.SIGTERM, on_term)

    from _common import machine, table
    load_before = os.getloadavg()
    why: dict[str, str] = {}
    try:
        import boto3  # noqa: F401
        import moto.server  # noqa: F401
    except ImportError as exc:
        print(f"cannot run: {exc}: pip install 'moto[server]' boto3", file=sys.stderr)
        return 2
    for p in peers:
        reason = missing(p)
        if reason:
            why[p] = "skipped: " + reason

    for name in _HIDDEN_AWS_VARS:
        os.environ.pop(name, None)
    os.environ.update(AWS_ACCESS_KEY_ID="testing", AWS_SECRET_ACCESS_KEY="testing",
                      AWS_DEFAULT_REGION="us-east-1", AWS_EC2_METADATA_DISABLED="true")

    t0 = time.perf_counter()
    cks = series(args.gib, 2, args.every)
    print(f"# built 2 checkpoints, {args.every} AdamW steps apart, in "
          f"{time.perf_counter() - t0:.0f} s", flush=True)

    work = tempfile.mkdtemp(prefix="s4fs-bench-peers-", dir=args.work)
    os.environ["AWS_CONFIG_FILE"] = os.path.join(work, "aws-config")
    os.environ["AWS_SHARED_CREDENTIALS_FILE"] = os.path.join(work, "aws-credentials")
    results: dict[str, list[dict]] = {p: [] for p in peers}
    s3 = None
    try:
        s3 = RgwS3(os.path.join(work, "rgw")) if args.server == "rgw" else \
            MotoServer(os.path.join(work, "moto.log"))
        os.environ.update(AWS_ACCESS_KEY_ID=s3.keys[0], AWS_SECRET_ACCESS_KEY=s3.keys[1])
        rates = server_rates(s3)
        local = local_times(cks[-1], work)
        print(f"# floors: server PUT {rates['put'] / 1e6:.0f} MB/s, GET "
              f"{rates['get'] / 1e6:.0f} MB/s (one stream: {rates['put1'] / 1e6:.0f}, "
              f"{rates['get1'] / 1e6:.0f}); local torch.save "
              f"{local['save']:.2f} s, cold torch.load {local['load']:.2f} s", flush=True)
        for r in range(args.repeat):
            for p in peers:
                if p in why:
                    continue
                t1 = time.perf_counter()
                try:
                    if p == "boto3":
                        res = run_boto3(s3, cks, r, work, args.op_timeout)
                    else:
                        res = run_fuse(TOOLS[p], s3, cks, r, work, args.op_timeout)
                except Exception as exc:       # a tool's failure is a row, not a crash
                    why[p] = f"FAILED (run {r + 1}): {type(exc).__name__}: {exc}"
                    print(f"# {p} run {r + 1}: {why[p]}", flush=True)
                    continue
                results[p].append(res)
                print(f"# {p} run {r + 1}: " + ", ".join(
                    f"{k} {v:.2f}" for k, v in res.items() if isinstance(v, float))
                    + f" ({time.perf_counter() - t1:.0f} s)", flush=True)
    finally:
        server_name = s3.version() if s3 is not None else args.server
        if s3 is not None:
            s3.stop()
        shutil.rmtree(work, ignore_errors=True)
        left = [ln.split()[1] for ln in open("/proc/mounts") if work in ln]
        if left:
            print(f"# WARNING: still mounted: {left}", file=sys.stderr)

    link = os.environ.get("S4FS_BENCH_LINK") or args.link
    wire = link_bits(link) / 8 if link else float("inf")
    get_rate = min(wire, rates["get"]) if s3 is not None else 0
    put_rate = min(wire, rates["put"]) if s3 is not None else 0
    rows, floors = [], []
    for p in peers:
        rs = results[p]
        col = lambda k: [x[k] for x in rs if k in x]   # noqa: E731
        stored = statistics.median(col("stored")) if rs else 0
        logical = rs[0]["logical"] if rs else 0
        dropped = all(x.get("dropped") for x in rs)
        if p in why and not rs:
            exact = "-"
        elif p in why:
            exact = f"yes, {2 * len(rs)} loads; then failed"
        else:
            exact = f"yes ({2 * len(rs)} of {2 * len(rs)})"
        if rs:
            load_floor = statistics.median(col("needed")) / get_rate + local["load"]
            save_floor = statistics.median(col("saved1")) / put_rate + local["save"]
            fresh, durable = statistics.median(col("fresh")), statistics.median(
                col("durable1"))
            cpu_floor = statistics.median(col("fresh_cpu")) / (os.cpu_count() or 1) \
                if col("fresh_cpu") else 0.0
            floors.append([p, f"{statistics.median(col('needed')) / 2**20:.0f}",
                           f"{load_floor:.2f}", cell(col("fresh")),
                           f"{fresh / load_floor:.2f}×",
                           f"{cpu_floor:.2f}" if cpu_floor else "-",
                           f"{fresh / cpu_floor:.2f}×" if cpu_floor else "-",
                           f"{statistics.median(col('saved1')) / 2**20:.0f}",
                           f"{save_floor:.2f}", cell(col("durable1")),
                           f"{durable / save_floor:.2f}×"])
        rows.append([p, cell(col("close0")), cell(col("durable0")), cell(col("close1")),
                     cell(col("durable1")), cell(col("cold")) + ("" if dropped else " *"),
                     cell(col("fresh")),
                     f"{stored / 2**20:.0f} ({100 * stored / logical:.1f} %)" if rs else "-",
                     exact, why.get(p, "")])
    load_after = os.getloadavg()
    size = next((x[0]["logical"] for x in results.values() if x), 0)
    print()
    print(f"# bench/peers.py — {machine()}")
    print(f"# load average before {load_before[0]:.2f} {load_before[1]:.2f} "
          f"{load_before[2]:.2f}, after {load_after[0]:.2f} {load_after[1]:.2f} "
          f"{load_after[2]:.2f}")
    print(f"# link: {link or 'loopback, unlimited'}; the server's whole-object PUT "
          f"{rates['put'] / 1e6:.0f} MB/s, GET {rates['get'] / 1e6:.0f} MB/s through it "
          f"(best of 1 and 4 streams; one stream: PUT {rates['put1'] / 1e6:.0f}, GET "
          f"{rates['get1'] / 1e6:.0f} MB/s); "
          f"local disk: torch.save {local['save']:.2f} s, cold torch.load "
          f"{local['load']:.2f} s")
    print(f"# one {server_name} S3 server on 127.0.0.1; s3fs "
          f"{version('s3fs')}, rclone {version('rclone')} (--vfs-cache-mode "
          f"{args.rclone_cache_mode}, --vfs-write-back 0s); 2 consecutive checkpoints "
          f"(MiniLM + AdamW, {args.every} steps apart), {size / 2 / 2**20:.0f} MiB each; "
          f"seconds, median (min–max) of {args.repeat}; loads of the 2nd checkpoint")
    print(table(["tool", "save 1 close()", "save 1 in bucket", "save 2 close()",
                 "save 2 in bucket", "cold load (remount, drop_caches)",
                 "fresh-node load", "stored MiB (of logical)", "loads bit-exact", "notes"],
                rows, align="lrrrrrrrll"))
    print("\ncold load: same cache dir (boto3: the local file). fresh node: empty cache "
          "dir (boto3: download_file + torch.load). s3fs keeps no cache (its default): "
          "both loads read the bucket." + ("" if all(
              x.get("dropped") for v in results.values() for x in v)
              else " *: drop_caches failed (not root?): the page cache was warm."))
    if floors:
        print("\nfloors (same run): load floor = MiB a fresh node must fetch ÷ min(link, "
              "server GET) + local cold torch.load; save floor = MiB stored by the 2nd "
              "save ÷ min(link, server PUT) + local torch.save; CPU floor = the CPU "
              "seconds every process of this machine used during the fresh-node load "
              "(the S3 server included) ÷ its cores: near 1× the load was bound by the "
              "cores, not the link")
        print(table(["tool", "fetch MiB", "load floor", "fresh-node load", "÷ floor",
                     "CPU floor", "÷ CPU floor",
                     "save MiB", "save floor", "save 2 in bucket", "÷ floor"],
                    floors, align="lrrrrrrrrrr"))
    return 1 if any(v.startswith("FAILED") for v in why.values()) else 0


if __name__ == "__main__":
    sys.exit(main())
