"""A store that stops answering fails a call within the documented bound, not after many
minutes; throttling and 5xx are still retried. Everything runs on loopback: a TCP server
that accepts connections and never answers, a port with nothing listening, and the
fault-injecting proxy of tests/s3_server.py in front of moto's S3 server."""

from __future__ import annotations

import errno
import os
import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from s4fs.errors import Busy, StoreUnavailable

MiB = 1 << 20
pytestmark = pytest.mark.s3


@pytest.fixture(autouse=True)
def _one_server_is_enough(s3_server):
    # what answers here is a silent socket or the proxy's own errors, never the server
    # behind it: the second pass of the S3 tests (on Ceph RGW) leaves these out
    if s3_server != "moto":
        pytest.skip("the server behind makes no difference here: run on moto only")

#: what S3Options' docstring promises for the defaults: "about a minute"
DEFAULT_BOUND = 60.0


class SilentServer:
    """Accepts every TCP connection on a free loopback port, never reads, never answers."""

    def __init__(self) -> None:
        self._sock = socket.create_server(("127.0.0.1", 0), backlog=128)
        self._sock.settimeout(0.1)
        self.url = f"http://127.0.0.1:{self._sock.getsockname()[1]}"
        self._held: list[socket.socket] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._accept, name="silent-server",
                                        daemon=True)
        self._thread.start()

    def _accept(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self._sock.accept()
            except OSError:                  # timeout: look at the stop flag again
                continue
            self._held.append(conn)

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)
        for conn in self._held:
            conn.close()
        self._sock.close()


@pytest.fixture
def silent_server():
    server = SilentServer()
    yield server
    server.close()


@pytest.fixture
def refused_url():
    """A loopback port that refuses connections: bound (so nothing else takes it while
    the test runs) but not listening."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        yield f"http://127.0.0.1:{s.getsockname()[1]}"


def _store(endpoint: str, **options):
    from s4fs.stores.s3 import S3Store
    return S3Store("s4fs-timeouts", "run", endpoint_url=endpoint, region="us-east-1",
                   **options)


def _bound(options) -> float:
    """The documented worst case of one call against a store that stopped answering
    (S3Options' docstring): retry_seconds + connect_timeout + read_timeout + 1 s."""
    return options.retry_seconds + options.connect_timeout + options.read_timeout + 1.0


def _timed(call) -> tuple[BaseException | None, float]:
    started = time.monotonic()
    try:
        call()
    except BaseException as exc:          # noqa: BLE001 - the test looks at it
        return exc, time.monotonic() - started
    return None, time.monotonic() - started


def _assert_unavailable(exc: BaseException | None, endpoint: str) -> None:
    assert isinstance(exc, StoreUnavailable), f"expected StoreUnavailable, got {exc!r}"
    assert exc.errno == errno.EIO                       # what the mount reports
    assert isinstance(exc, ConnectionError)
    message = str(exc)
    assert "gave up after" in message and endpoint in message and "reachable" in message


def test_default_bound_is_about_a_minute():
    pytest.importorskip("botocore")
    from s4fs.stores.s3 import S3Options
    o = S3Options()
    assert _bound(o) <= DEFAULT_BOUND
    assert o.max_attempts >= 5 and o.backoff_base > 0       # throttling is still retried
    assert o.read_timeout >= 15                # room for a pack's tail to drain (docstring)


@pytest.mark.slow            # it waits out the default bound, about 45 s: not in make check
@pytest.mark.timeout(240)
def test_dead_endpoint_fails_within_the_bound_with_defaults(s3_endpoint, silent_server,
                                                            refused_url):
    """With the default options, puts and gets against an endpoint that accepts and
    never answers, and against one that refuses connections, fail with EIO within the
    documented bound. They run side by side, as a save's parallel uploads do."""
    silent, refused = _store(silent_server.url), _store(refused_url)
    calls = {
        "silent get": (silent, lambda: silent.get("packs/a")),
        "silent put": (silent, lambda: silent.put("packs/b", b"x" * 1000)),
        "silent put 32 MiB": (silent, lambda: silent.put("packs/c", os.urandom(32 * MiB))),
        "refused get": (refused, lambda: refused.get("packs/a")),
        "refused put": (refused, lambda: refused.put("packs/b", b"x" * 1000)),
    }
    try:
        with ThreadPoolExecutor(len(calls)) as pool:
            results = dict(zip(calls, pool.map(lambda c: _timed(c[1]), calls.values())))
        for name, (exc, took) in results.items():
            store = calls[name][0]
            _assert_unavailable(exc, store.options.endpoint_url)
            assert took < DEFAULT_BOUND + 30, f"{name} took {took:.0f} s"
        assert "read_timeout=20 s" in str(results["silent get"][0])
        assert silent.stats()["retries"] >= 3        # timeouts are retried, not final
        assert refused.stats()["retries"] >= 2
        # a refused connection is quick to see: only the backoff sleeps count
        for name in ("refused get", "refused put"):
            assert results[name][1] < silent.options.retry_seconds + 5, name
    finally:
        silent.close()
        refused.close()


@pytest.mark.parametrize("action", ["get", "put"])
def test_bound_follows_the_options(s3_endpoint, silent_server, action):
    """The bound is the options' own: short timeouts and a short budget give up fast,
    after more than one attempt."""
    store = _store(silent_server.url, connect_timeout=0.5, read_timeout=1.0,
                   retry_seconds=3.0, backoff_base=0.01, backoff_max=0.05)
    call = (lambda: store.get("k")) if action == "get" else (lambda: store.put("k", b"v"))
    try:
        exc, took = _timed(call)
        _assert_unavailable(exc, silent_server.url)
        assert "ReadTimeoutError" in str(exc)
        assert took < _bound(store.options) + 5
        assert store.stats()["retries"] >= 1
    finally:
        store.close()


@pytest.mark.parametrize("fault", ["slowdown", "unavailable", "internal"])
def test_throttling_and_5xx_are_still_retried_with_defaults(s3_endpoint, s3_bucket,
                                                           s3_fault_proxy, fault):
    """Two 503 SlowDown (or 500) answers, then the real server: the default options
    retry, and the bytes land and come back."""
    from s4fs.stores.s3 import S3Store
    store = S3Store(s3_bucket, "run", endpoint_url=s3_fault_proxy.url, region="us-east-1")
    data = os.urandom(200_000)
    try:
        s3_fault_proxy.inject(fault, times=2)
        store.put("packs/p1", data)
        assert s3_fault_proxy.count(fault) == 2
        s3_fault_proxy.inject(fault, times=2)
        assert store.get("packs/p1") == data
        assert s3_fault_proxy.count(fault) == 4
        assert store.stats()["retries"] == 4
    finally:
        store.close()


@pytest.mark.timeout(120)
def test_endless_throttling_gives_up_as_busy_within_the_budget(s3_endpoint, s3_bucket,
                                                               s3_fault_proxy):
    """A store that answers, but only SlowDown, is retried with backoff for the whole
    budget and then reported as busy (EBUSY), still well within a minute."""
    from s4fs.stores.s3 import S3Store
    store = S3Store(s3_bucket, "run", endpoint_url=s3_fault_proxy.url, region="us-east-1")
    s3_fault_proxy.inject("slowdown")
    try:
        exc, took = _timed(lambda: store.put("packs/p1", b"x" * 1000))
        assert isinstance(exc, Busy), repr(exc)
        assert exc.errno == errno.EBUSY
        assert "SlowDown" in str(exc) and "gave up after" in str(exc)
        assert took < store.options.retry_seconds + 5
        assert s3_fault_proxy.count("slowdown") >= 5            # backoff, not one try
    finally:
        store.close()
