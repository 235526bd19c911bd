"""Health checks and the HTTP server for ``GET /healthz`` and ``GET /metrics``.

``/healthz`` answers 200 only when every check passes, 503 otherwise; the JSON body
names each check, whether it passed and why::

    {"status": "unhealthy", "failed": ["store"],
     "checks": {"mount": {"ok": true, "detail": "..."}, "store": {"ok": false, ...}, ...}}

A check is a named probe. Probes that touch the outside world (the mount, the store) run
in a worker thread with a timeout, one at a time: a probe that hangs (a wedged FUSE
daemon, a store that never answers) is reported as failing instead of piling up threads.
Facts settled at boot (codec self-check, entitlement) are :class:`StateCheck` objects.
"""

from __future__ import annotations

import errno
import json
import logging
import os
import socket
import threading
import time
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Callable

from s4fs.mtab import mounts_at

log = logging.getLogger(__name__)

#: store keys probed by the store check; nothing lives there, so listing it is cheap
STORE_PROBE_PREFIX = ".s4fs-health/"


@dataclass(frozen=True)
class CheckResult:
    ok: bool
    detail: str

    def as_json(self) -> dict:
        return {"ok": self.ok, "detail": self.detail}


class StateCheck:
    """A check whose result is set by the runner (boot-time facts)."""

    def __init__(self, name: str, ok: bool = False, detail: str = "not checked yet") -> None:
        self.name = name
        self._result = CheckResult(ok, detail)

    def set(self, ok: bool, detail: str) -> None:
        self._result = CheckResult(ok, detail)

    def run(self) -> CheckResult:
        return self._result


class ProbeCheck:
    """A check that calls ``probe()`` with a timeout. ``probe`` returns a detail string
    when healthy and raises when not; the exception's text becomes the detail."""

    def __init__(self, name: str, probe: Callable[[], str], timeout_s: float = 5.0) -> None:
        self.name = name
        self._probe = probe
        self._timeout = timeout_s
        self._lock = threading.Lock()
        self._inflight: threading.Thread | None = None
        self._started = 0.0
        self._result: CheckResult | None = None

    def run(self) -> CheckResult:
        with self._lock:
            if self._inflight is not None and self._inflight.is_alive():
                worker = self._inflight      # join the probe already running
            else:
                box: list[CheckResult] = []
                worker = threading.Thread(target=self._call, args=(box,), daemon=True,
                                          name=f"s4fs-health-{self.name}")
                worker.box = box             # type: ignore[attr-defined]
                self._inflight, self._started = worker, time.monotonic()
                worker.start()
        worker.join(max(0.0, self._started + self._timeout - time.monotonic()))
        if worker.is_alive():
            waited = time.monotonic() - self._started
            return CheckResult(False, f"no answer after {waited:.1f} s (hung?)")
        box = worker.box                     # type: ignore[attr-defined]
        return box[0] if box else CheckResult(False, "probe ended without a result")

    def _call(self, box: list) -> None:
        try:
            box.append(CheckResult(True, self._probe()))
        except Exception as exc:             # a failing probe is a result, not a crash
            box.append(CheckResult(False, _describe(exc)))


def _describe(exc: BaseException) -> str:
    text = str(exc) or type(exc).__name__
    return text if type(exc).__module__.startswith("s4fs") else f"{type(exc).__name__}: {text}"


class Health:
    """Runs every check and builds the ``/healthz`` answer."""

    def __init__(self, checks) -> None:
        self.checks = list(checks)

    def report(self) -> tuple[bool, dict]:
        # checks run side by side: the answer takes as long as the slowest one
        from concurrent.futures import ThreadPoolExecutor
        with ThreadPoolExecutor(max(1, len(self.checks)), thread_name_prefix="s4fs-check") as pool:
            runs = [(c.name, pool.submit(c.run)) for c in self.checks]
            results = {name: fut.result() for name, fut in runs}
        failed = [name for name, r in results.items() if not r.ok]
        from s4fs import __version__
        body = {"status": "ok" if not failed else "unhealthy", "failed": failed,
                "checks": {name: r.as_json() for name, r in results.items()},
                "version": __version__}
        return not failed, body


# --- probes --------------------------------------------------------------------------

def mount_entry(path: str) -> tuple[str, str] | None:
    """``(fstype, source)`` of the mount on top at exactly ``path``, or None. Read from the
    mount table (:mod:`s4fs.mtab`), which never calls into the filesystem, so a hung FUSE
    daemon cannot block it (``os.path.ismount`` would stat the mount, and as a user
    without ``allow_other`` access that stat fails even when the mount is fine)."""
    entries = mounts_at(path)
    return (entries[-1].fstype, entries[-1].source) if entries else None


def mount_probe(mountpoint: str) -> Callable[[], str]:
    """Healthy when an s4fs FUSE mount sits at ``mountpoint`` and answers statvfs."""
    def probe() -> str:
        entry = mount_entry(mountpoint)
        if entry is None:
            raise RuntimeError(f"nothing is mounted at {mountpoint}")
        fstype, source = entry
        if fstype != "fuse" and not fstype.startswith("fuse."):
            raise RuntimeError(f"{mountpoint} is a {fstype} mount, not an s4fs FUSE mount")
        try:
            os.statvfs(mountpoint)
        except OSError as exc:
            if exc.errno == errno.ENOTCONN:
                raise RuntimeError(f"{mountpoint} is a dead FUSE mount (its daemon exited); "
                                   "restart the service") from None
            raise RuntimeError(f"{mountpoint} is mounted but statvfs failed: {exc}") from None
        return f"{fstype} mounted at {mountpoint} from {source or '?'}, answering"
    return probe


def commits_probe(mountpoint: str) -> Callable[[], str]:
    """Healthy unless the mount has accepted files whose commit keeps failing
    (``--writeback``): those are on local disk only until the store takes them. Its
    detail also says how the mount moves bytes (FUSE passthrough, or FUSE requests and
    why): a mount on the slow path is healthy, and the operator can see it."""
    def probe() -> str:
        from s4fs.control import request
        answer = request(mountpoint, "status", wait=5)
        pending = answer.get("pending", [])
        failing = [p for p in pending if p.get("attempts")]
        if failing:
            first = failing[0]
            raise RuntimeError(
                f"{len(failing)} of {len(pending)} pending files cannot be committed (e.g. "
                f"{first['path']}: {first['error']}); their bytes are kept on local disk "
                f"and retried — fix the store, then `s4fs sync {mountpoint}`")
        how = answer.get("transport")
        return f"{len(pending)} files pending commit" + (f"; through {how}" if how else "")
    return probe


def store_probe(store_or_url) -> Callable[[], str]:
    """Healthy when the store answers a listing of an empty prefix (one cheap request;
    permitted by a role limited to the store's prefix). A URL is opened on first use and
    again after a failure to open."""
    cache: dict = {}

    def probe() -> str:
        store = cache.get("store")
        if store is None:
            if isinstance(store_or_url, str):
                from s4fs.stores import open_store
                store = open_store(store_or_url)
            else:
                store = store_or_url
            cache["store"] = store
        for _ in store.list(STORE_PROBE_PREFIX):
            break
        return f"{getattr(store, 'url', store_or_url)} answers"
    return probe


# --- HTTP ----------------------------------------------------------------------------

class _Handler(BaseHTTPRequestHandler):
    server_version = "s4fs-runner"
    protocol_version = "HTTP/1.1"

    def do_GET(self) -> None:
        self._answer(send_body=True)

    def do_HEAD(self) -> None:
        self._answer(send_body=False)

    def _answer(self, send_body: bool) -> None:
        path = self.path.split("?", 1)[0]
        try:
            if path == "/healthz":
                ok, body = self.server.health.report()          # type: ignore[attr-defined]
                self._send(200 if ok else 503, "application/json",
                           (json.dumps(body, indent=1) + "\n").encode(), send_body)
            elif path == "/metrics":
                self._metrics(send_body)
            elif path == "/":
                self._send(200, "text/plain; charset=utf-8",
                           b"s4fs runner: GET /healthz, GET /metrics\n", send_body)
            else:
                self._send(404, "text/plain; charset=utf-8", b"not found\n", send_body)
        except Exception:                                      # never kill the server
            log.exception("error answering %s", path)
            self._send(500, "text/plain; charset=utf-8", b"internal error\n", send_body)

    def _metrics(self, send_body: bool) -> None:
        from s4fs import metrics
        reg = metrics.registry()
        if reg is None:
            self._send(503, "text/plain; charset=utf-8",
                       b"metrics need prometheus-client: pip install 's4fs[service]'\n",
                       send_body)
            return
        from prometheus_client.exposition import CONTENT_TYPE_LATEST, generate_latest
        self._send(200, CONTENT_TYPE_LATEST, generate_latest(reg), send_body)

    def _send(self, code: int, ctype: str, body: bytes, send_body: bool) -> None:
        self.send_response(code)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Cache-Control", "no-store")
        self.end_headers()
        if send_body:
            self.wfile.write(body)

    def log_message(self, fmt: str, *args) -> None:
        log.debug("%s %s", self.address_string(), fmt % args)


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True


class _Server6(_Server):
    address_family = socket.AF_INET6


class HealthServer:
    """``GET /healthz`` and ``GET /metrics`` on ``address:port`` (port 0: a free one)."""

    def __init__(self, health: Health, address: str = "0.0.0.0", port: int = 8080) -> None:
        cls = _Server6 if ":" in address else _Server
        self._httpd = cls((address, port), _Handler)
        self._httpd.health = health          # type: ignore[attr-defined]
        self._thread: threading.Thread | None = None

    @property
    def port(self) -> int:
        return self._httpd.server_address[1]

    def start(self) -> "HealthServer":
        self._thread = threading.Thread(target=self._httpd.serve_forever, kwargs={"poll_interval": 0.2},
                                        name="s4fs-health-http", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._thread is not None:
            self._httpd.shutdown()
            self._thread.join(5)
        self._httpd.server_close()

    def __enter__(self) -> "HealthServer":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
