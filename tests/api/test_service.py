"""The service layer: config, metrics, /healthz and /metrics over real HTTP, the
fail-closed Marketplace entitlement, and the runner supervising a real FUSE mount as a
non-root user."""

from __future__ import annotations

import contextlib
import http.server
import json
import logging
import os
import pwd
import shutil
import signal
import socket
import stat
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
import urllib.error
import urllib.request
import uuid

import pytest

from s4fs.config import Config, ConfigError, load_config, parse_config
from s4fs.errors import StoreUnavailable
from s4fs.service import entitlement, runner
from s4fs.service.health import (Health, HealthServer, ProbeCheck, StateCheck, mount_probe,
                                 store_probe)
from s4fs.stores import LocalStore
from s4fs.stores.faulty import FailingStore

PY = sys.executable


# --- helpers ---------------------------------------------------------------------------

def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def get(url: str, timeout: float = 10.0) -> tuple[int, bytes, str]:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return r.status, r.read(), r.headers.get("Content-Type", "")
    except urllib.error.HTTPError as e:
        return e.code, e.read(), e.headers.get("Content-Type", "")


def listening(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(0.5)
        return s.connect_ex(("127.0.0.1", port)) == 0


def mounted_at(path: str) -> str | None:
    """fstype of the mount at ``path`` per /proc/mounts (stat would need allow_other)."""
    real = os.path.realpath(path)
    with open("/proc/mounts") as f:
        for line in f:
            parts = line.split()
            if parts[1].replace("\\040", " ") == real:
                return parts[2]
    return None


def write_config(path, **over) -> str:
    body = {
        "top": over.pop("top", ""),
        "health": over.pop("health", 'address = "127.0.0.1"\nport = 0'),
        "marketplace": over.pop("marketplace", "enabled = false"),
        "runner": over.pop("runner", ""),
    }
    assert not over
    text = f"{body['top']}\n[health]\n{body['health']}\n[marketplace]\n{body['marketplace']}\n" \
           f"[runner]\n{body['runner']}\n"
    with open(path, "w") as f:
        f.write(text)
    return str(path)


# --- config ----------------------------------------------------------------------------

def test_config_defaults_when_default_file_is_missing(monkeypatch, tmp_path):
    monkeypatch.delenv("S4FS_CONFIG", raising=False)
    monkeypatch.setattr("s4fs.config.DEFAULT_PATH", str(tmp_path / "absent.toml"))
    cfg = load_config()
    assert cfg == Config()
    assert (cfg.mountpoint, cfg.health.address, cfg.health.port) == ("/mnt/s4", "0.0.0.0", 8080)
    assert cfg.marketplace.enabled is False and cfg.runner.manage_mount is True


def test_config_full_file_and_env_override(monkeypatch, tmp_path):
    p = tmp_path / "c.toml"
    p.write_text(textwrap.dedent("""
        store = "s3://my-bucket/ckpt?region=eu-west-1"
        mountpoint = "/mnt/ckpt"
        cache_dir = "/srv/cache"
        device = "cuda"
        allow_other = false
        [health]
        address = "::"
        port = 9090
        [marketplace]
        enabled = true
        product_code = "abc123xyz"
        public_key_version = 2
        region = "us-gov-west-1"
        [runner]
        manage_mount = false
        mount_command = ["/usr/bin/env", "true"]
    """))
    monkeypatch.setenv("S4FS_CONFIG", str(p))
    cfg = load_config()
    assert cfg.source == str(p)
    assert cfg.store == "s3://my-bucket/ckpt?region=eu-west-1"
    assert (cfg.mountpoint, cfg.cache_dir, cfg.device, cfg.allow_other) == \
        ("/mnt/ckpt", "/srv/cache", "cuda", False)
    assert (cfg.health.address, cfg.health.port) == ("::", 9090)
    mp = cfg.marketplace
    assert (mp.enabled, mp.product_code, mp.public_key_version, mp.region) == \
        (True, "abc123xyz", 2, "us-gov-west-1")
    assert cfg.runner.manage_mount is False
    assert cfg.runner.mount_command == ("/usr/bin/env", "true")
    with pytest.raises(Exception):
        cfg.device = "cpu"                       # frozen


def test_config_missing_named_file_is_an_error(monkeypatch, tmp_path):
    monkeypatch.setenv("S4FS_CONFIG", str(tmp_path / "nope.toml"))
    with pytest.raises(ConfigError, match="nope.toml does not exist"):
        load_config()


@pytest.mark.parametrize("text, expected", [
    ('store = "relative/dir"', ["store", "absolute"]),
    ('store = "s3://Bad_Bucket/x"', ["store", "bucket"]),
    ('mountpoint = "mnt"', ["mountpoint", "absolute path"]),
    ('mountpoint = "/"', ["mountpoint", "must not be '/'"]),
    ('device = "gpu"', ["device", '"cuda"']),
    ('allow_other = "yes"', ["allow_other", "true or false"]),
    ('mount_point = "/mnt/x"', ["unknown key 'mount_point'", "did you mean 'mountpoint'"]),
    ('[health]\nport = 70000', ["[health] port", "0 to 65535"]),
    ('[health]\nport = "8080"', ["[health] port", "integer"]),
    ('[health]\nstore = "/x"', ["unknown key 'store' in [health]", "top-level key"]),
    ('[marketplace]\nenabled = true', ["product_code", "enabled = false"]),
    ('[marketplace]\nregion = "mars-1"', ["[marketplace] region", "us-east-1"]),
    ('[marketplace]\npublic_key_version = 0', ["public_key_version", ">= 1"]),
    ('[runner]\nmount_timeout_s = -1', ["mount_timeout_s", "greater than 0"]),
    ('[runner]\nmount_command = "s4fs mount"', ["mount_command", "list"]),
    ('health = 3', ["'health' must be a table"]),
    ('store = "/x', ["not valid TOML"]),
])
def test_config_errors_name_the_key_and_the_fix(text, expected):
    with pytest.raises(ConfigError) as info:
        parse_config(text, source="/etc/s4fs/config.toml")
    msg = str(info.value)
    assert "/etc/s4fs/config.toml" in msg
    for part in expected:
        assert part in msg, msg


def test_runner_bad_config_exits_78(tmp_path, caplog):
    p = tmp_path / "c.toml"
    p.write_text('device = "tpu"\n')
    with caplog.at_level(logging.ERROR, logger="s4fs.runner"):
        assert runner.main(["--config", str(p)]) == runner.EX_CONFIG
    assert "refusing to start" in caplog.text and "device" in caplog.text


# --- codec self-check --------------------------------------------------------------------

def test_codec_self_check_passes_on_cpu():
    from s4fs.service import selfcheck
    r = selfcheck.run("cpu")
    assert r.ok and r.cases >= 50, r.detail
    assert "bit-exact" in r.detail


def test_runner_refuses_to_start_when_the_codec_check_fails(tmp_path, caplog):
    """device = "cuda" on a machine without a usable GPU: the self-check fails, the
    runner exits 70 before serving or mounting anything."""
    from s4fs.codec import gpu_available
    if gpu_available():
        pytest.skip("a usable GPU is present, so the cuda self-check passes here")
    port = free_port()
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    cfg = write_config(tmp_path / "c.toml",
                       top=f'store = "{tmp_path / "store"}"\nmountpoint = "{mnt}"\n'
                           'device = "cuda"',
                       health=f'address = "127.0.0.1"\nport = {port}')
    with caplog.at_level(logging.ERROR, logger="s4fs.runner"):
        assert runner.main(["--config", cfg]) == runner.EX_SOFTWARE
    assert "refusing to start" in caplog.text and "cuda" in caplog.text
    assert not listening(port) and mounted_at(str(mnt)) is None


# --- metrics ---------------------------------------------------------------------------

def _sample(text: str, name: str) -> float:
    total = 0.0
    found = False
    for line in text.splitlines():
        if line.startswith(name + " ") or line.startswith(name + "{"):
            total += float(line.rsplit(" ", 1)[1])
            found = True
    assert found, f"{name} not in metrics"
    return total


METRIC_NAMES = ["s4fs_logical_bytes_total", "s4fs_stored_bytes_total",
                "s4fs_compression_ratio", "s4fs_save_seconds_bucket", "s4fs_save_seconds_count",
                "s4fs_load_seconds_count", "s4fs_loaded_bytes_total", "s4fs_uploads_in_flight",
                "s4fs_last_save_timestamp_seconds"]


def test_metrics_without_prometheus_client_are_noops():
    code = textwrap.dedent("""
        import sys
        sys.modules["prometheus_client"] = None       # as if not installed
        from s4fs import metrics
        metrics.observe_save("a", 10, 5, 0.1); metrics.observe_load("a", 10, 0.1)
        metrics.uploads_started(); metrics.uploads_finished(); metrics.observe_error("x")
        assert not metrics.is_available() and metrics.registry() is None
        assert metrics.text() == b""
        print("ok")
    """)
    res = subprocess.run([PY, "-c", code], capture_output=True, text=True, timeout=60)
    assert res.returncode == 0 and res.stdout.strip() == "ok", res.stderr


def test_metrics_of_a_child_process_reach_the_runner_registry(tmp_path):
    """The mount daemon records into PROMETHEUS_MULTIPROC_DIR; the runner reads it."""
    d = tmp_path / "metrics"
    writer = textwrap.dedent("""
        from s4fs import metrics
        metrics.observe_save("run/ckpt.pt", 1000, 250, 0.5, stored_delta=100, unchanged=30)
        metrics.uploads_started(4); metrics.uploads_finished(1)
        metrics.observe_error("Upload failed")
    """)
    for _ in range(2):                               # two daemons, one after the other
        env = dict(os.environ, PROMETHEUS_MULTIPROC_DIR=str(d))
        subprocess.run([PY, "-c", writer], env=env, check=True, timeout=60)
    reader = textwrap.dedent(f"""
        from s4fs import metrics
        metrics.serve_directory({str(d)!r})
        metrics.observe_save("ignored", 1, 1, 1)     # a reader records nothing
        print(metrics.text().decode())
    """)
    out = subprocess.run([PY, "-c", reader], capture_output=True, text=True, check=True,
                         timeout=60).stdout
    assert _sample(out, "s4fs_logical_bytes_total") == 2000
    assert _sample(out, "s4fs_stored_bytes_total") == 500
    assert _sample(out, "s4fs_stored_delta_bytes_total") == 200
    assert _sample(out, "s4fs_unchanged_bytes_total") == 60
    assert _sample(out, "s4fs_compression_ratio") == pytest.approx(0.25)
    assert _sample(out, "s4fs_save_seconds_count") == 2
    assert _sample(out, 's4fs_errors_total{kind="upload_failed"}') == 2
    assert _sample(out, "s4fs_uploads_in_flight") == 6


# --- /healthz and /metrics over HTTP -----------------------------------------------------

@contextlib.contextmanager
def serving(checks):
    server = HealthServer(Health(checks), "127.0.0.1", 0).start()
    try:
        yield f"http://127.0.0.1:{server.port}"
    finally:
        server.stop()


def _ok_checks(tmp_path, **replace):
    checks = {
        "mount": ProbeCheck("mount", lambda: "fuse.s4fs mounted (stand-in for a FUSE mount)"),
        "store": ProbeCheck("store", store_probe(LocalStore(tmp_path / "store"))),
        "codec": StateCheck("codec", True, "60 round trips bit-exact"),
        "entitlement": StateCheck("entitlement", True, "not required"),
    }
    checks.update(replace)
    return list(checks.values())


def test_healthz_200_when_every_check_passes(tmp_path):
    with serving(_ok_checks(tmp_path)) as url:
        code, body, ctype = get(url + "/healthz")
        assert code == 200 and ctype == "application/json"
        doc = json.loads(body)
        assert doc["status"] == "ok" and doc["failed"] == []
        assert set(doc["checks"]) == {"mount", "store", "codec", "entitlement"}
        assert all(c["ok"] for c in doc["checks"].values())
        assert get(url + "/nope")[0] == 404


@pytest.mark.parametrize("part", ["mount", "store", "codec", "entitlement"])
def test_healthz_503_names_the_failing_part(tmp_path, part):
    unmounted = tmp_path / "mnt"
    unmounted.mkdir()
    broken = {
        # the real probe, on a directory where nothing is mounted
        "mount": ProbeCheck("mount", mount_probe(str(unmounted))),
        # a store that does not answer
        "store": ProbeCheck("store", store_probe(FailingStore(
            LocalStore(tmp_path / "s"), fail_on={"list"},
            error=StoreUnavailable("s3://b/p did not answer after 10 tries")))),
        "codec": StateCheck("codec", False, "round trip of 'all bf16 patterns' not bit-exact"),
        "entitlement": StateCheck("entitlement", False, "CustomerNotEntitledException"),
    }[part]
    with serving(_ok_checks(tmp_path, **{part: broken})) as url:
        code, body, _ = get(url + "/healthz")
    doc = json.loads(body)
    assert code == 503
    assert doc["status"] == "unhealthy" and doc["failed"] == [part]
    assert doc["checks"][part]["ok"] is False
    expected = {"mount": "nothing is mounted at", "store": "did not answer",
                "codec": "not bit-exact", "entitlement": "CustomerNotEntitled"}[part]
    assert expected in doc["checks"][part]["detail"]
    assert all(c["ok"] for n, c in doc["checks"].items() if n != part)


def test_healthz_reports_a_hung_probe_instead_of_hanging(tmp_path):
    release = threading.Event()
    hung = ProbeCheck("store", lambda: release.wait(30) and "late", timeout_s=0.3)
    try:
        with serving(_ok_checks(tmp_path, store=hung)) as url:
            t0 = time.monotonic()
            code, body, _ = get(url + "/healthz")
            code2, _, _ = get(url + "/healthz")      # the stuck probe is joined, not re-run
            assert time.monotonic() - t0 < 5
    finally:
        release.set()
    assert code == code2 == 503
    assert "no answer after" in json.loads(body)["checks"]["store"]["detail"]


def test_metrics_endpoint_serves_text_that_moves_after_a_save(tmp_path):
    from s4fs import metrics
    if not metrics.is_available():
        pytest.skip("prometheus-client is not installed (pip install 's4fs[service]')")
    with serving(_ok_checks(tmp_path)) as url:
        code, body, ctype = get(url + "/metrics")
        assert code == 200 and ctype.startswith("text/plain")
        before = body.decode()
        for name in METRIC_NAMES:
            assert name in before, name
        metrics.observe_save("run7/ckpt_100.pt", 4 << 20, 1 << 20, 0.25)
        metrics.observe_load("run7/ckpt_100.pt", 4 << 20, 0.1)
        metrics.observe_error("checksum")
        after = get(url + "/metrics")[1].decode()
    for name, delta in [("s4fs_logical_bytes_total", 4 << 20),
                        ("s4fs_stored_bytes_total", 1 << 20),
                        ("s4fs_loaded_bytes_total", 4 << 20),
                        ("s4fs_save_seconds_count", 1), ("s4fs_load_seconds_count", 1)]:
        assert _sample(after, name) - _sample(before, name) == delta, name
    assert 's4fs_errors_total{kind="checksum"}' in after
    assert 0 < _sample(after, "s4fs_compression_ratio") < 1


def test_a_real_save_moves_the_delta_metrics_as_s4fs_stat_counts(tmp_path):
    import torch

    import s4fs
    from s4fs import metrics
    from s4fs.report import file_report
    if not metrics.is_available():
        pytest.skip("prometheus-client is not installed (pip install 's4fs[service]')")
    g = torch.Generator().manual_seed(0)
    sd = {"w": torch.randn(1 << 20, generator=g), "frozen": torch.randn(1 << 20, generator=g)}
    s4fs.save(sd, tmp_path / "ckpt_1.pt")
    before = metrics.text().decode()
    sd["w"][::50] += 0.01                     # a training step; "frozen" stays the same
    s4fs.save(sd, tmp_path / "ckpt_2.pt")
    after = metrics.text().decode()
    fs, rel = s4fs.resolve(tmp_path / "ckpt_2.pt")
    r = file_report(fs, rel)
    # the newest is stored whole (backward deltas): "frozen" shared, "w" coded whole
    assert r["stored_delta"] == 0 and r["unchanged_bytes"] >= 4 << 20
    for name, value in [("s4fs_stored_delta_bytes_total", r["stored_delta"]),
                        ("s4fs_unchanged_bytes_total", r["unchanged_bytes"]),
                        ("s4fs_stored_bytes_total", r["stored"])]:
        assert _sample(after, name) - _sample(before, name) == value, name


# --- entitlement (AWS Marketplace RegisterUsage, fail-closed) ---------------------------

DOCUMENTED_ERRORS = [
    ("CustomerNotEntitledException", 400, False),
    ("DisabledApiException", 400, False),
    ("InternalServiceErrorException", 500, True),
    ("InvalidProductCodeException", 400, False),
    ("InvalidPublicKeyVersionException", 400, False),
    ("InvalidRegionException", 400, False),
    ("PlatformNotSupportedException", 400, False),
    ("ThrottlingException", 400, True),
]


def _stubbed_client():
    import botocore.session
    from botocore.stub import Stubber
    client = botocore.session.get_session().create_client(
        "meteringmarketplace", region_name="us-east-1",
        aws_access_key_id="AKIDTEST", aws_secret_access_key="secret")
    return client, Stubber(client)


def _market_config(tmp_path, port, region='"us-east-1"', extra=""):
    mnt = tmp_path / "mnt"
    mnt.mkdir(exist_ok=True)
    return write_config(
        tmp_path / "c.toml",
        top=f'store = "{tmp_path / "store"}"\nmountpoint = "{mnt}"\n'
            f'cache_dir = "{tmp_path / "cache"}"',
        health=f'address = "127.0.0.1"\nport = {port}',
        marketplace=f'enabled = true\nproduct_code = "prod4s4fs"\npublic_key_version = 1\n'
                    f'region = {region}\ntimeout_s = 1\n{extra}')


def test_register_usage_success_sends_product_key_and_nonce():
    from botocore.stub import ANY
    client, stub = _stubbed_client()
    import datetime
    when = datetime.datetime(2026, 1, 2, tzinfo=datetime.timezone.utc)
    stub.add_response("register_usage",
                      {"PublicKeyRotationTimestamp": when, "Signature": "eyJhbGciOi.sig"},
                      {"ProductCode": "prod4s4fs", "PublicKeyVersion": 1, "Nonce": ANY})
    cfg = parse_config('[marketplace]\nenabled = true\nproduct_code = "prod4s4fs"\n'
                       'region = "us-east-1"').marketplace
    with stub:
        reg = entitlement.register_usage(cfg, client=client)
    stub.assert_no_pending_responses()
    assert reg.region == "us-east-1" and reg.signature == "eyJhbGciOi.sig"
    assert reg.public_key_rotation_timestamp.startswith("2026-01-02")
    assert len(reg.nonce) >= 16


@pytest.mark.parametrize("code, status, transient", DOCUMENTED_ERRORS)
def test_each_registerusage_error_stops_the_start(tmp_path, caplog, code, status, transient):
    client, stub = _stubbed_client()
    stub.add_client_error("register_usage", service_error_code=code,
                          service_message=f"simulated {code}", http_status_code=status)
    port = free_port()
    cfg = _market_config(tmp_path, port)
    with stub, caplog.at_level(logging.INFO, logger="s4fs"):
        status_code = runner.main(["--config", cfg], metering_client=client)
    assert status_code == (runner.EX_UNAVAILABLE if transient else runner.EX_NOPERM)
    errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert any("refusing to start" in m and code in m for m in errors), errors
    # nothing was started: no codec check, no server, no mount
    assert not any("codec self-check" in r.getMessage() for r in caplog.records)
    assert not listening(port)
    assert mounted_at(str(tmp_path / "mnt")) is None


def test_network_failure_stops_the_start(tmp_path, caplog, monkeypatch):
    """A real boto3 client pointed at a closed loopback port: EndpointConnectionError."""
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIDTEST")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "secret")
    monkeypatch.setenv("AWS_MAX_ATTEMPTS", "1")
    closed = free_port()
    port = free_port()
    cfg = _market_config(tmp_path, port, extra=f'endpoint_url = "http://127.0.0.1:{closed}"')
    with caplog.at_level(logging.ERROR, logger="s4fs.runner"):
        assert runner.main(["--config", cfg]) == runner.EX_UNAVAILABLE
    assert "refusing to start" in caplog.text and "could not be reached" in caplog.text
    assert f"127.0.0.1:{closed}" in caplog.text
    assert not listening(port)


def test_imds_failure_stops_the_start(tmp_path, caplog):
    closed = free_port()
    port = free_port()
    client, stub = _stubbed_client()                 # never reached
    cfg = _market_config(tmp_path, port, region='""',
                         extra=f'imds_url = "http://127.0.0.1:{closed}"')
    with stub, caplog.at_level(logging.ERROR, logger="s4fs.runner"):
        assert runner.main(["--config", cfg], metering_client=client) == runner.EX_UNAVAILABLE
    assert "refusing to start" in caplog.text and "IMDSv2" in caplog.text
    assert not listening(port)


class _FakeImds(http.server.BaseHTTPRequestHandler):
    """IMDSv2 on loopback: a PUT gives a token; GETs without it get 401."""

    token = "tok-" + uuid.uuid4().hex

    def do_PUT(self):
        ok = self.path == "/latest/api/token" and \
            self.headers.get("X-aws-ec2-metadata-token-ttl-seconds")
        self._reply(200 if ok else 400, self.token if ok else "")

    def do_GET(self):
        if self.headers.get("X-aws-ec2-metadata-token") != self.token:
            return self._reply(401, "")
        if self.path == "/latest/meta-data/placement/region":
            return self._reply(200, "eu-north-1")
        self._reply(404, "")

    def _reply(self, code, text):
        data = text.encode()
        self.send_response(code)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *a):
        pass


def test_region_comes_from_imdsv2_token_then_get():
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _FakeImds)
    t = threading.Thread(target=srv.serve_forever, daemon=True)
    t.start()
    try:
        url = f"http://127.0.0.1:{srv.server_address[1]}"
        assert entitlement.imds_region(url, timeout_s=2) == "eu-north-1"
        client, stub = _stubbed_client()
        stub.add_client_error("register_usage", service_error_code="InvalidRegionException",
                              service_message="no", http_status_code=400)
        cfg = parse_config('[marketplace]\nenabled = true\nproduct_code = "p1"\n'
                           f'imds_url = "{url}"').marketplace
        with stub, pytest.raises(entitlement.EntitlementError) as info:
            entitlement.register_usage(cfg, client=client)
        assert "eu-north-1" in str(info.value) and not info.value.transient
    finally:
        srv.shutdown()
        srv.server_close()


# --- the runner with a real FUSE mount --------------------------------------------------

def _mount_cli_missing() -> str:
    res = subprocess.run([PY, "-m", "s4fs.cli", "mount", "--help"], capture_output=True,
                         text=True, timeout=60)
    return "" if res.returncode == 0 else f"`s4fs mount` is not available: {res.stderr[-300:]}"


def _fuse_skip_reason(need_root_for: str) -> str:
    if os.geteuid() != 0:
        return f"needs root ({need_root_for})"
    if not os.path.exists("/dev/fuse"):
        return "/dev/fuse is missing"
    if not shutil.which("fusermount3"):
        return "fusermount3 is not installed (apt-get install fuse3)"
    try:
        import pyfuse3  # noqa: F401
    except ImportError as exc:
        return f"pyfuse3 is not importable: {exc}"
    return _mount_cli_missing()


class _Notify:
    """A stand-in for systemd's notification socket."""

    def __init__(self, folder: str) -> None:
        self.path = os.path.join(folder, "notify.sock")
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(self.path)
        os.chmod(self.path, 0o777)                   # the service user sends to it
        self.messages: list[str] = []

    def wait_for(self, key: str, timeout: float, proc=None) -> str:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for m in self.messages:
                if key in m.split("\n"):
                    return m
            if proc is not None and proc.poll() is not None:
                raise AssertionError(f"runner exited with {proc.returncode} before {key}")
            self.sock.settimeout(0.2)
            with contextlib.suppress(socket.timeout):
                self.messages.append(self.sock.recv(4096).decode())
        raise AssertionError(f"no {key} from the runner within {timeout} s: {self.messages}")

    def close(self) -> None:
        self.sock.close()


def _health_port(ready: str) -> int:
    status = next(line for line in ready.split("\n") if line.startswith("STATUS="))
    return int(status.rsplit(":", 1)[1])


@contextlib.contextmanager
def _world_rw_dev_fuse():
    """A non-root FUSE mount needs /dev/fuse mode 0666 (the fuse3 udev rule sets it on a
    normal system; some VMs and containers leave it 0600). Restored afterwards."""
    mode = stat.S_IMODE(os.stat("/dev/fuse").st_mode)
    if mode & 0o006 != 0o006:
        os.chmod("/dev/fuse", 0o666)
    try:
        yield
    finally:
        if mode & 0o006 != 0o006:
            os.chmod("/dev/fuse", mode)


@contextlib.contextmanager
def _throwaway_user():
    name = "s4t" + uuid.uuid4().hex[:8]
    subprocess.run(["useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin",
                    name], check=True, capture_output=True)
    try:
        yield pwd.getpwnam(name)
    finally:
        for _ in range(50):                  # its processes may take a moment to go
            if subprocess.run(["userdel", name], capture_output=True).returncode in (0, 6):
                break
            time.sleep(0.1)


def _children(pid: int) -> list[int]:
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as f:
            return [int(x) for x in f.read().split()]
    except OSError:
        return []


def _runs_as(user, py: str, env: dict) -> bool:
    try:
        res = subprocess.run([py, "-c", "import s4fs.service.runner, s4fs.mount"],
                             user=user.pw_uid, group=user.pw_gid, extra_groups=[], cwd="/",
                             env=dict(os.environ, **env), capture_output=True, timeout=60)
    except PermissionError:
        return False
    return res.returncode == 0


def _interpreter_for(user, folder: str) -> tuple[str, dict]:
    """An interpreter the unprivileged ``user`` can run, with this environment's
    packages: the test's own, or — when that one lives where the user cannot reach it
    (a pyenv build under /root) — the system Python of the same version, pointed at this
    environment's site-packages by a ``sitecustomize`` in ``folder``."""
    if _runs_as(user, PY, {}):
        return PY, {}
    system = f"/usr/bin/python{sys.version_info.major}.{sys.version_info.minor}"
    import site
    dirs = [d for d in site.getsitepackages() if os.path.isdir(d)]
    if os.path.exists(system) and dirs:
        with open(os.path.join(folder, "sitecustomize.py"), "w") as f:
            f.write("import site\n" + "".join(f"site.addsitedir({d!r})\n" for d in dirs))
        os.chmod(os.path.join(folder, "sitecustomize.py"), 0o644)
        env = {"PYTHONPATH": folder}
        if _runs_as(user, system, env):
            return system, env
    pytest.skip(f"neither {PY} nor {system} with this environment's packages can be run by an "
                "unprivileged user; run the suite from a venv made with a system Python")


def _kill_runner(proc) -> None:
    """Teardown after a failure: the runner and the mount daemon it started (which runs
    in its own session, so killing the runner alone would leave it behind)."""
    if proc is None or proc.poll() is not None:
        return
    for pid in _children(proc.pid):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    proc.kill()
    proc.wait()


def _uid_of(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("Uid:"):
                return int(line.split()[1])
    raise AssertionError("no Uid line")


@pytest.mark.fuse
def test_runner_as_non_root_user_mounts_reports_healthy_and_unmounts_on_sigterm():
    why = _fuse_skip_reason("to create a throwaway user and run the runner as it")
    if why:
        pytest.skip(why)
    with _throwaway_user() as user, _world_rw_dev_fuse():
        base = tempfile.mkdtemp(prefix="s4fs-runner-test-")
        os.chmod(base, 0o755)
        proc = notify = None
        mnt = os.path.join(base, "mnt")
        try:
            py, py_env = _interpreter_for(user, base)
            notify = _Notify(base)
            for d in ("store", "mnt", "cache"):
                os.mkdir(os.path.join(base, d))
                os.chown(os.path.join(base, d), user.pw_uid, user.pw_gid)
            cfg = write_config(
                os.path.join(base, "config.toml"),
                top=f'store = "{base}/store"\nmountpoint = "{mnt}"\ncache_dir = "{base}/cache"\n'
                    'device = "cpu"\nallow_other = false',
                runner="mount_timeout_s = 60\nstop_timeout_s = 20")
            os.chmod(cfg, 0o644)
            env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST")}
            env.update(py_env, NOTIFY_SOCKET=notify.path, HOME=base)
            proc = subprocess.Popen([py, "-m", "s4fs.cli", "runner", "--config", cfg],
                                    user=user.pw_uid, group=user.pw_gid, extra_groups=[],
                                    env=env, cwd=base, stdout=subprocess.PIPE,
                                    stderr=subprocess.STDOUT, text=True)
            ready = notify.wait_for("READY=1", 90, proc)
            # READY=1 came only once the mount was there
            assert mounted_at(mnt) == "fuse.s4fs"
            port = _health_port(ready)
            code, body, _ = get(f"http://127.0.0.1:{port}/healthz")
            assert code == 200, body
            doc = json.loads(body)
            assert doc["status"] == "ok" and "fuse.s4fs mounted at" in doc["checks"]["mount"]["detail"]
            code, body, _ = get(f"http://127.0.0.1:{port}/metrics")
            assert code == 200 and b"s4fs_logical_bytes_total" in body
            # the runner and the mount daemon both run as the unprivileged user
            daemons = _children(proc.pid)
            assert daemons and _uid_of(proc.pid) == user.pw_uid
            assert all(_uid_of(p) == user.pw_uid for p in daemons)
            # bytes written through the mount by that user come back exactly
            payload = os.urandom(100_000)
            rt = subprocess.run(
                [py, "-c", "import sys; p=sys.argv[1]; d=sys.stdin.buffer.read(); "
                 "open(p,'wb').write(d); sys.stdout.buffer.write(open(p,'rb').read())",
                 os.path.join(mnt, "x.bin")], input=payload, capture_output=True,
                user=user.pw_uid, group=user.pw_gid, extra_groups=[], timeout=60, cwd="/",
                env=dict(os.environ, **py_env))
            assert rt.returncode == 0 and rt.stdout == payload, rt.stderr[-500:]

            proc.send_signal(signal.SIGTERM)
            out, _ = proc.communicate(timeout=60)
            assert proc.returncode == 0, out[-2000:]
            notify.wait_for("STOPPING=1", 5)
            assert mounted_at(mnt) is None, "SIGTERM left the mount behind"
            assert "unmounted" in out
            assert all(not os.path.exists(f"/proc/{p}") for p in daemons)
        finally:
            _kill_runner(proc)
            if mounted_at(mnt):
                subprocess.run(["fusermount3", "-u", "-z", mnt], capture_output=True)
            if notify is not None:
                notify.close()
            shutil.rmtree(base, ignore_errors=True)


@pytest.mark.fuse
def test_runner_exits_69_and_clears_the_mount_when_the_daemon_dies(tmp_path):
    why = _fuse_skip_reason("FUSE mounts")
    if why:
        pytest.skip(why)
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    notify = _Notify(str(tmp_path))
    cfg = write_config(tmp_path / "c.toml",
                       top=f'store = "{tmp_path / "store"}"\nmountpoint = "{mnt}"\n'
                           f'cache_dir = "{tmp_path / "cache"}"\ndevice = "cpu"')
    env = dict(os.environ, NOTIFY_SOCKET=notify.path)
    proc = subprocess.Popen([PY, "-m", "s4fs.cli", "runner", "--config", cfg], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        notify.wait_for("READY=1", 90, proc)
        daemons = _children(proc.pid)
        assert daemons
        for pid in daemons:
            os.kill(pid, signal.SIGKILL)
        out, _ = proc.communicate(timeout=30)
        assert proc.returncode == runner.EX_UNAVAILABLE, out[-2000:]
        assert "the mount daemon exited" in out
        assert mounted_at(str(mnt)) is None, "a dead FUSE mount was left behind"
    finally:
        _kill_runner(proc)
        if mounted_at(str(mnt)):
            subprocess.run(["fusermount3", "-u", "-z", str(mnt)], capture_output=True)
        notify.close()


@pytest.mark.fuse
def test_runner_with_an_external_mount_waits_for_it_and_leaves_it(tmp_path):
    """manage_mount = false (the mount comes from mnt-s4.mount): the runner reports on
    it, and stopping the runner does not unmount it."""
    why = _fuse_skip_reason("FUSE mounts")
    if why:
        pytest.skip(why)
    store, mnt, cache = (tmp_path / n for n in ("store", "mnt", "cache"))
    for d in (store, mnt, cache):
        d.mkdir()
    res = subprocess.run([PY, "-m", "s4fs.cli", "mount", str(store), str(mnt),
                          "--cache-dir", str(cache)], capture_output=True, text=True, timeout=90)
    assert res.returncode == 0, res.stderr
    notify = _Notify(str(tmp_path))
    # a runner that would make its own mount refuses, and leaves the existing one alone
    cfg = write_config(tmp_path / "own.toml",
                       top=f'store = "{store}"\nmountpoint = "{mnt}"\ndevice = "cpu"')
    res = subprocess.run([PY, "-m", "s4fs.cli", "runner", "--config", cfg],
                         capture_output=True, text=True, timeout=60)
    assert res.returncode == runner.EX_UNAVAILABLE and "already mounted" in res.stderr
    assert mounted_at(str(mnt)) == "fuse.s4fs"
    cfg = write_config(tmp_path / "c.toml",
                       top=f'store = "{store}"\nmountpoint = "{mnt}"\ndevice = "cpu"',
                       runner=f'manage_mount = false\nmetrics_dir = "{tmp_path / "m"}"')
    proc = subprocess.Popen([PY, "-m", "s4fs.cli", "runner", "--config", cfg],
                            env=dict(os.environ, NOTIFY_SOCKET=notify.path),
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        port = _health_port(notify.wait_for("READY=1", 60, proc))
        code, body, _ = get(f"http://127.0.0.1:{port}/healthz")
        assert code == 200, body
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=30)
        assert proc.returncode == 0, out[-2000:]
        assert mounted_at(str(mnt)) == "fuse.s4fs", "the runner unmounted a mount it did not make"
    finally:
        _kill_runner(proc)
        subprocess.run(["fusermount3", "-u", str(mnt)], capture_output=True)
        deadline = time.monotonic() + 10
        while mounted_at(str(mnt)) and time.monotonic() < deadline:
            time.sleep(0.1)
        notify.close()
