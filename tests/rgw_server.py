"""A throw-away single-node Ceph RADOS Gateway (RGW) S3 server for tests.

A real S3 implementation other than moto: one Ceph monitor, one OSD and one radosgw,
Debian 12's own packages (Ceph 16.2 "pacific": ``apt-get install --no-install-recommends
radosgw ceph-mon ceph-osd``), started as child processes on 127.0.0.1 and killed after.
No pytest fixtures here; tests build them from this::

    reason = rgw_available()                  # None, or why not (for pytest.skip)
    with RgwServer.start(tmp_path) as rgw:    # running, its S3 user checked by a PUT
        s3 = rgw.client()                     # boto3, path-style, rgw's keys and region
        ...                                   # rgw.endpoint / access_key / secret_key

One cluster per workdir: its own fsid, ceph.conf, data, admin sockets, run dir and logs
(``<workdir>/log/*.log``, the daemons' stdout/stderr in ``*.out``), its own free ports
(chosen at start; a port someone takes in between is retried), so pytest-xdist workers
may each start their own. No cephx (auth none), no manager. The OSD is bluestore on a
16 GiB sparse file (``<workdir>/osd-block``; it grows with the data, up to its high
water mark) or, with ``objectstore="memstore"``, in RAM (starts ~1 s sooner, but the OSD
holds ~2x the data stored in memory). Deleted objects are freed after ~10-20 s.

The daemons never outlive the test run: stop() (also at interpreter exit, atexit)
sends SIGTERM by pid (radosgw, OSD, then monitor: each stops in ~0.1 s while the ones
it talks to still run) and SIGKILL after 2 s; each daemon also gets SIGKILL from the
kernel (PR_SET_PDEATHSIG) when the thread that started it dies, so a killed pytest
worker leaves nothing behind. Start servers from a long-lived thread (the main one).

Measured on a 2-core VM: start to first successful PUT 2.1-2.9 s (memstore 1.2-1.5 s),
~4-4.6 s while other tests load the machine, ~8 s each with 4 starting at once; RSS
idle: monitor 35 MiB, OSD 55 MiB, radosgw 46 MiB (OSD ~90-100 MiB and radosgw ~100-150
MiB once data flowed); idle CPU ~3.5 % of a core; stop 0.2-0.6 s.

How RGW 16.2 differs from AWS S3 (probed with boto3 1.44):

* CompleteMultipartUpload answers ``ETag: ''``; HEAD/GET give ``"<md5>-<parts>"``.
* GetObject/HeadObject ignore PartNumber: the whole object, 200, no PartsCount.
* PutObject If-Match compares the ETag *unquoted*: the quoted ETag that HEAD/GET
  return gives 412 PreconditionFailed, the bare hex works (GET If-Match takes the
  quoted one); a wrong one, or a missing key, gives 412 (AWS: 404 for a missing key).
  ``If-Match: *`` works.
* PutObject If-None-Match: * gives 412 on an existing key (as AWS);
  CompleteMultipartUpload ignores If-None-Match and If-Match (it overwrites).
  DeleteObject ignores If-Match.
* x-amz-checksum-* headers (CRC32, SHA256) are ignored: never verified (an upload
  with a wrong one succeeds), never returned. Content-MD5 is verified (BadDigest; InvalidDigest when
  malformed), for PutObject and UploadPart.
* boto3 >= 1.36 sends checksums by default: over plain HTTP as a header (accepted,
  ignored); over HTTPS as an aws-chunked trailer, which RGW 16.2 refuses (411
  MissingContentLength) unless the client sets ``request_checksum_calculation=
  "when_required"`` (client_config() does).
* Range past the end (or on an empty object): 416 InvalidRange; a range that only
  ends past it is clipped (206); an inverted range (10-5) is 416 (RFC 7233: ignored).
* ListObjectsV2 is consistent right after a PUT; NextContinuationToken is the last key
  in clear, and an unknown token is taken as a start-after key (AWS: 400).
* Missing key: GET NoSuchKey, HEAD 404, DELETE 204. Missing bucket: NoSuchBucket (HEAD
  404). CopyObject's ETag comes unquoted. Completing an aborted upload: 500
  InternalError (AWS: 404 NoSuchUpload).
"""

from __future__ import annotations

import atexit
import ctypes
import http.client
import importlib.util
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

#: the programs a cluster needs (``ceph`` is the CLI that registers the OSD)
_BINARIES = ("ceph-mon", "ceph-osd", "radosgw", "radosgw-admin", "monmaptool", "ceph",
             "rados")

#: names that start() creates inside its workdir (and ``stop(remove=True)`` deletes)
_OWN_NAMES = ("ceph.conf", "ceph.tmp", "monmap", "mon", "osd", "osd-block", "run", "log",
              "crash")

_PR_SET_PDEATHSIG = 1


def rgw_available() -> str | None:
    """None when a server can be started here, else the reason (for ``pytest.skip``)."""
    if not sys.platform.startswith("linux"):
        return "the Ceph RGW test server needs Linux"
    missing = [name for name in _BINARIES if shutil.which(name) is None]
    if missing:
        return ("Ceph RGW binaries not found: " + ", ".join(missing)
                + " (apt-get install --no-install-recommends radosgw ceph-mon ceph-osd)")
    return None


class RgwStartError(RuntimeError):
    """The cluster did not come up in time; the message carries the daemons' log tails."""


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _listening_inodes(port: int) -> set[str]:
    """Socket inodes listening on 127.0.0.1/0.0.0.0:port (from /proc/net/tcp)."""
    inodes = set()
    try:
        with open("/proc/net/tcp") as table:
            next(table)
            for line in table:
                fields = line.split()
                local, state, inode = fields[1], fields[3], fields[9]
                if state == "0A" and int(local.rsplit(":", 1)[1], 16) == port:
                    inodes.add(inode)
    except OSError:
        pass
    return inodes


def _owns_listener(pid: int, port: int) -> bool:
    """True when process ``pid`` itself holds the socket listening on ``port``.

    A port answering is not enough: when the port was taken by someone else between our
    probe and the daemon's bind, the daemon exits while the port still answers.
    """
    inodes = _listening_inodes(port)
    if not inodes:
        return False
    fd_dir = f"/proc/{pid}/fd"
    try:
        for fd in os.listdir(fd_dir):
            try:
                link = os.readlink(f"{fd_dir}/{fd}")
            except OSError:
                continue
            if link.startswith("socket:[") and link[8:-1] in inodes:
                return True
    except OSError:
        pass
    return False


def _child_setup(parent_pid: int):
    """preexec_fn: the child gets SIGKILL when the thread that started it dies.

    PR_SET_PDEATHSIG follows the creating *thread*: start servers from a thread that
    lives as long as they should (pytest's main thread does).
    """
    libc = ctypes.CDLL(None, use_errno=True)

    def setup():
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
        if os.getppid() != parent_pid:  # the parent died before prctl took effect
            os._exit(1)
    return setup


def _tail(path: Path, lines: int = 25) -> str:
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - 64 * 1024))
            text = f.read().decode("utf-8", "replace")
    except OSError:
        return "(no log)"
    return "\n".join(text.splitlines()[-lines:])


def _config(workdir: Path, fsid: str, mon_port: int, rgw_port: int, objectstore: str) -> str:
    """ceph.conf of one throw-away cluster; every path lies inside ``workdir``."""
    w = str(workdir)
    return f"""\
[global]
fsid = {fsid}
mon initial members = a
mon host = [v2:127.0.0.1:{mon_port}]
public addr = 127.0.0.1
cluster addr = 127.0.0.1
# msgr2 only, on loopback
ms bind msgr1 = false
ms bind ipv6 = false
# a taken port fails at once (the start retries on another port)
ms bind retry count = 1
ms bind retry delay = 0

# no cephx; with auth off the clients must not ask for "secure" mode, else radosgw
# loops on "get_initial_auth_request returned -13"
auth cluster required = none
auth service required = none
auth client required = none
ms mon client mode = crc
ms mon cluster mode = crc
ms mon service mode = crc
ms client mode = crc
ms cluster mode = crc
ms service mode = crc

# everything the daemons write stays in the workdir (never /var/run/ceph, /var/log)
run dir = {w}/run
admin socket = {w}/run/$name.asok
pid file =
log file = {w}/log/$name.log
crash dir = {w}/crash
keyring = {w}/keyring
log to stderr = false
err to stderr = true

# one OSD: pools of one replica, few PGs, no autoscaler (there is no manager)
osd pool default size = 1
osd pool default min size = 1
osd pool default pg num = 8
osd pool default pgp num = 8
osd pool default pg autoscale mode = off
mon allow pool size one = true
mon warn on pool no redundancy = false
osd crush chooseleaf type = 0
# pool changes commit at once (default 1 s a change: start 13 s -> 2.5 s)
paxos propose interval = 0.01
# clients re-check ops stuck on a pool made before the OSD booted every 5 s by default:
# that cost 3-5 s of every start
objecter tick interval = 0.2
# test machines run with a nearly full /tmp: never stop for lack of space
mon data avail crit = 0
mon data avail warn = 1

[mon]
mon data = {w}/mon/$cluster-$id

[osd]
osd data = {w}/osd/$cluster-$id
osd objectstore = {objectstore}
# bluestore: a sparse file *outside* the OSD's folder (inside, mkfs links the folder's
# "block" to itself)
bluestore block path = {w}/osd-block
bluestore block create = true
bluestore block size = {16 << 30}
bluestore fsck on mkfs = false
# each close of the block file waits out one aio poll (250 ms by default); bluestore
# closes it ~10 times from mkfs to boot
bdev aio poll ms = 20
bluestore cache autotune = false
bluestore cache size = {64 << 20}
# memstore: virtual size only; RAM grows with the data stored
memstore device bytes = {16 << 30}
# the lowest target it accepts; it only steers the cache autotuner, which is off
osd memory target = {896 << 20}
osd op num shards = 2
osd op num threads per shard = 1
# no scrubs in a test run
osd scrub min interval = 1000000000
osd scrub max interval = 1000000000
osd deep scrub interval = 1000000000

[client]
rgw frontends = beast endpoint=127.0.0.1:{rgw_port}
rgw thread pool size = 32
# deleted and overwritten objects are freed within ~20 s, not after 2 h (the wait
# covers GETs still reading the old tail)
rgw gc obj min wait = 10
rgw gc processor period = 10
rgw gc processor max time = 10
rgw enable lc threads = false
rgw dynamic resharding = false
rgw enable usage log = false
rgw init timeout = 120
"""


class RgwServer:
    """One throw-away cluster (monitor, OSD, radosgw) serving S3 on 127.0.0.1.

    ``RgwServer.start(workdir)`` returns a running server (its S3 user made and checked
    with a put/get/delete); ``stop()`` kills its daemons. Also a context manager.
    """

    region = "us-east-1"
    user = "s4fs-test"

    def __init__(self, workdir: Path, *, objectstore: str = "bluestore") -> None:
        if objectstore not in ("bluestore", "memstore"):
            raise ValueError(f"objectstore must be bluestore or memstore, not {objectstore!r}")
        self.workdir = Path(workdir).absolute()
        self.objectstore = objectstore
        self.fsid = str(uuid.uuid4())
        self.access_key = "S4FS" + uuid.uuid4().hex[:16].upper()
        self.secret_key = uuid.uuid4().hex + uuid.uuid4().hex[:8]
        self.mon_port = 0
        self.rgw_port = 0
        self.endpoint = ""
        #: seconds from start() to the first successful PUT
        self.start_seconds = 0.0
        self._started_at = 0.0
        self._procs: dict[str, subprocess.Popen] = {}  # daemon name -> process
        self._lock = threading.Lock()
        self._env = {k: v for k, v in os.environ.items() if not k.startswith("CEPH_")}

    # --- public API -------------------------------------------------------------------

    @classmethod
    def start(cls, workdir: Path, *, timeout: float = 60.0,
              objectstore: str = "bluestore") -> RgwServer:
        """Start a cluster in ``workdir`` (created if missing) and return it, running.

        ``workdir`` should be the server's own folder: start() replaces what it finds
        there under the names it uses (``_OWN_NAMES``). ``objectstore`` is "bluestore"
        (a sparse file on disk) or "memstore" (RAM). Raises RgwStartError (with the
        daemons' log tails) after ``timeout`` seconds; nothing is left running then.
        """
        server = cls(workdir, objectstore=objectstore)
        atexit.register(server.stop)  # never outlive the interpreter
        server._started_at = time.monotonic()
        try:
            server._start(server._started_at + timeout)
        except BaseException:
            server.stop()
            raise
        return server

    @property
    def conf(self) -> Path:
        """The cluster's ceph.conf (pass as ``-c`` to ceph, radosgw-admin, rados)."""
        return self.workdir / "ceph.conf"

    @property
    def pids(self) -> dict[str, int]:
        """Daemon name -> pid of every daemon this server started (running or not)."""
        return {name: proc.pid for name, proc in self._procs.items()}

    def alive(self) -> bool:
        """True while every daemon of the cluster runs."""
        return bool(self._procs) and all(p.poll() is None for p in self._procs.values())

    def rss(self) -> dict[str, int]:
        """Daemon name -> resident memory in bytes (0 when gone)."""
        sizes = {}
        for name, proc in self._procs.items():
            sizes[name] = 0
            try:
                with open(f"/proc/{proc.pid}/status") as status:
                    for line in status:
                        if line.startswith("VmRSS:"):
                            sizes[name] = int(line.split()[1]) * 1024
            except OSError:
                pass
        return sizes

    def client_config(self, **s3_options):
        """A botocore Config for this server: path-style, and checksums only when required.

        boto3 >= 1.36 adds a CRC32 to every upload by default ("when_supported"). RGW
        16.2 ignores it as a plain header (how boto3 sends it over http), but refuses
        the aws-chunked trailer boto3 uses over https (411 MissingContentLength); it
        never verifies nor returns such checksums anyway.
        """
        from botocore.config import Config
        return Config(s3={"addressing_style": "path", **s3_options},
                      request_checksum_calculation="when_required",
                      response_checksum_validation="when_required",
                      retries={"max_attempts": 2, "mode": "standard"})

    def client(self, **kwargs):
        """A boto3 S3 client on this server (keyword arguments go to boto3.client)."""
        import boto3
        kwargs.setdefault("config", self.client_config())
        kwargs.setdefault("region_name", self.region)
        kwargs.setdefault("aws_access_key_id", self.access_key)
        kwargs.setdefault("aws_secret_access_key", self.secret_key)
        return boto3.client("s3", endpoint_url=self.endpoint, **kwargs)

    def stop(self, *, grace: float = 2.0, remove: bool = False) -> None:
        """Kill every daemon (SIGTERM, SIGKILL after ``grace`` s) and wait for them.

        Daemons stop in reverse start order (radosgw, OSD, monitor): each exits in
        ~0.1 s while the ones it talks to still run, but a radosgw or OSD whose monitor
        is gone hangs 5 s and more, hence also the short grace. ``remove=True`` also
        deletes what start() wrote in the workdir (nothing else of it).
        """
        with self._lock:
            atexit.unregister(self.stop)
            for proc in reversed(list(self._procs.values())):
                _signal(proc, signal.SIGTERM)
                try:
                    proc.wait(grace)
                except subprocess.TimeoutExpired:
                    _signal(proc, signal.SIGKILL)
                    proc.wait()
            if remove:
                self._remove_own_files()

    def __enter__(self) -> RgwServer:
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def __repr__(self) -> str:
        return f"RgwServer({self.endpoint or 'not started'}, workdir={str(self.workdir)!r})"

    # --- start, step by step ------------------------------------------------------------

    def _start(self, deadline: float) -> None:
        self.workdir.mkdir(parents=True, exist_ok=True)
        self._remove_own_files()  # a previous run's leftovers would confuse mkfs
        for name in ("run", "log", "crash", "mon", "osd"):
            (self.workdir / name).mkdir()
        self._start_mon(deadline)
        self._start_osd(deadline)
        # the user is made before radosgw starts: radosgw-admin then notifies no
        # radosgw of it (a radosgw that died on a taken port would stall that notify
        # for its 30 s watch timeout)
        self._run(["radosgw-admin", "-c", str(self.conf), "user", "create",
                   "--uid", self.user, "--display-name", "s4fs test user",
                   "--access-key", self.access_key, "--secret", self.secret_key],
                  deadline)
        self._start_rgw(deadline)
        self._self_test(deadline)

    def _start_mon(self, deadline: float) -> None:
        """Monitor "a" on a free port; a new port (and monmap) when the port was taken."""
        for _ in range(5):
            self.mon_port = _free_port()
            self._write_config()
            monmap = self.workdir / "monmap"
            shutil.rmtree(self.workdir / "mon", ignore_errors=True)
            (self.workdir / "mon").mkdir()
            self._run(["monmaptool", "--create", "--clobber", "--fsid", self.fsid,
                       "--addv", "a", f"[v2:127.0.0.1:{self.mon_port}]", str(monmap)],
                      deadline)
            self._run(["ceph-mon", "-c", str(self.conf), "--mkfs", "-i", "a",
                       "--monmap", str(monmap)], deadline)
            if self._spawn_listening("mon.a", ["ceph-mon", "-c", str(self.conf), "-f",
                                               "-i", "a"], self.mon_port, deadline):
                return
        raise self._error("ceph-mon found no free port in 5 tries")

    def _start_osd(self, deadline: float) -> None:
        """Register osd.0 with the monitor, make its store, start it."""
        osd_uuid = str(uuid.uuid4())
        self._run(["ceph", "-c", str(self.conf), "--connect-timeout",
                   str(max(1, int(deadline - time.monotonic()))),
                   "osd", "new", osd_uuid, "0"], deadline)
        (self.workdir / "osd" / "ceph-0").mkdir()
        self._run(["ceph-osd", "-c", str(self.conf), "--mkfs", "-i", "0",
                   "--osd-uuid", osd_uuid], deadline)
        self._spawn("osd.0", ["ceph-osd", "-c", str(self.conf), "-f", "-i", "0"])

    def _start_rgw(self, deadline: float) -> None:
        """radosgw on a free port; ready when *it* listens and answers S3 on that port."""
        for _ in range(5):
            self.rgw_port = _free_port()
            self._write_config()
            if self._spawn_listening("client.rgw", ["radosgw", "-c", str(self.conf), "-f",
                                                    "-n", "client.rgw"],
                                     self.rgw_port, deadline):
                self.endpoint = f"http://127.0.0.1:{self.rgw_port}"
                self._wait(self._answers_s3, deadline, "radosgw to answer S3 requests")
                return
            self._drop_dead_watchers(deadline)
        raise self._error("radosgw found no free port in 5 tries")

    def _drop_dead_watchers(self, deadline: float) -> None:
        """Blocklist the watches a dead radosgw left on its control objects.

        radosgw binds its port only after it registered them; the OSD keeps them for 30 s
        (osd client watch timeout), and until then every bucket or user change waits for
        the dead one's answer. No other radosgw runs now, so every watcher is a dead one.
        """
        listing = self._run(["rados", "-c", str(self.conf), "-p", "default.rgw.control",
                             "listwatchers", "notify.0"], deadline, check=False)
        for line in listing.splitlines():
            if line.startswith("watcher="):
                addr = line.split()[0].split("=", 1)[1]
                self._run(["ceph", "-c", str(self.conf), "osd", "blocklist", "add", addr],
                          deadline)

    def _answers_s3(self) -> bool:
        conn = http.client.HTTPConnection("127.0.0.1", self.rgw_port, timeout=2)
        try:
            conn.request("GET", "/")
            response = conn.getresponse()
            return response.status == 200 and b"ListAllMyBucketsResult" in response.read()
        except OSError:
            return False
        finally:
            conn.close()

    def _self_test(self, deadline: float) -> None:
        """Make a bucket, put, get and delete an object as the test user."""
        if importlib.util.find_spec("boto3") is None:
            return  # nothing to check with; radosgw answered anonymous requests already
        client = self.client()
        bucket = f"selftest-{uuid.uuid4().hex[:12]}"
        while True:
            try:
                client.create_bucket(Bucket=bucket)
                client.put_object(Bucket=bucket, Key="probe", Body=b"rgw ready")
                break
            except Exception as exc:  # the user may need a moment to be seen
                if time.monotonic() > deadline:
                    raise self._error(f"S3 self test failed: {exc!r}") from exc
                time.sleep(0.1)
        self.start_seconds = time.monotonic() - self._started_at
        body = client.get_object(Bucket=bucket, Key="probe")["Body"].read()
        if body != b"rgw ready":
            raise self._error(f"S3 self test read back {body!r}")
        client.delete_object(Bucket=bucket, Key="probe")
        client.delete_bucket(Bucket=bucket)
        client.close()

    # --- helpers ------------------------------------------------------------------------

    def _write_config(self) -> None:
        text = _config(self.workdir, self.fsid, self.mon_port, self.rgw_port,
                       self.objectstore)
        tmp = self.conf.with_suffix(".tmp")
        tmp.write_text(text)
        tmp.replace(self.conf)

    def _popen_kwargs(self) -> dict:
        return dict(cwd=self.workdir, env=self._env, stdin=subprocess.DEVNULL,
                    start_new_session=True, preexec_fn=_child_setup(os.getpid()))

    def _run(self, argv: list[str], deadline: float, *, check: bool = True) -> str:
        """Run a one-shot command and return its output; RgwStartError (with the
        output) when it times out, or fails and ``check`` is set."""
        timeout = deadline - time.monotonic()
        if timeout <= 0:
            raise self._error(f"timed out before {' '.join(argv[:1])} could run")
        try:
            done = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                  timeout=timeout, **self._popen_kwargs())
        except subprocess.TimeoutExpired as exc:
            raise self._error(f"{argv[0]} timed out after {timeout:.0f} s: {argv}") from exc
        output = done.stdout.decode("utf-8", "replace")
        if check and done.returncode != 0:
            raise self._error(f"{' '.join(argv)} exited {done.returncode}:\n"
                              f"{output[-4000:]}")
        return output

    def _spawn(self, name: str, argv: list[str]) -> subprocess.Popen:
        """Start a daemon in the foreground; its stdout/stderr go to log/<name>.out."""
        with open(self.workdir / "log" / f"{name}.out", "ab") as out:
            proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT,
                                    **self._popen_kwargs())
        self._procs[name] = proc
        return proc

    def _spawn_listening(self, name: str, argv: list[str], port: int,
                         deadline: float) -> bool:
        """Start a daemon and wait until it holds ``port``.

        False when it died because someone else holds the port (the caller retries on
        another); RgwStartError when it died for another reason or time ran out.
        """
        proc = self._spawn(name, argv)
        while not _owns_listener(proc.pid, port):
            if proc.poll() is not None:
                if _listening_inodes(port):  # lost the race for the port
                    del self._procs[name]
                    return False
                raise self._error(f"{name} exited with status {proc.returncode}")
            self._check_alive()
            if time.monotonic() > deadline:
                raise self._error(f"timed out waiting for {name} to listen on {port}")
            time.sleep(0.05)
        return True

    def _wait(self, ready, deadline: float, what: str) -> None:
        while not ready():
            self._check_alive()
            if time.monotonic() > deadline:
                raise self._error(f"timed out waiting for {what}")
            time.sleep(0.05)

    def _check_alive(self) -> None:
        for name, proc in self._procs.items():
            if proc.poll() is not None:
                raise self._error(f"{name} exited with status {proc.returncode}")

    def _error(self, message: str) -> RgwStartError:
        """RgwStartError whose message ends with the tail of every daemon log."""
        parts = [f"Ceph RGW test server in {self.workdir}: {message}"]
        log_dir = self.workdir / "log"
        for path in sorted(log_dir.glob("*")) if log_dir.is_dir() else ():
            parts.append(f"--- {path.name} (tail) ---\n{_tail(path)}")
        return RgwStartError("\n".join(parts))

    def _remove_own_files(self) -> None:
        for name in _OWN_NAMES:
            path = self.workdir / name
            if path.is_dir() and not path.is_symlink():
                shutil.rmtree(path, ignore_errors=True)
            else:
                try:
                    path.unlink()
                except FileNotFoundError:
                    pass


def _signal(proc: subprocess.Popen, sig: int) -> None:
    """Signal one child by pid (never by name or group); gone already is fine."""
    if proc.poll() is None:
        try:
            os.kill(proc.pid, sig)
        except ProcessLookupError:
            pass


def start_rgw(workdir: Path, **kwargs) -> RgwServer:
    """Shorthand for ``RgwServer.start(workdir, **kwargs)``."""
    return RgwServer.start(workdir, **kwargs)
