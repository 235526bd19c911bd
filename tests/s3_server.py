"""Pytest fixtures for S3 tests: a real S3 HTTP server on loopback, and a proxy that
makes it misbehave.

Which server: ``S4FS_TEST_S3=moto`` (the default: moto's server mode, an emulator
written for tests) or ``S4FS_TEST_S3=rgw`` (Ceph's RADOS Gateway, a real S3 server:
one monitor, one OSD and radosgw started for the session, tests/rgw_server.py; the S3
tests skip, saying why, where its Debian packages are missing). ``make test`` runs every
test on moto, then the ``s3`` tests again on RGW.

``tests/conftest.py`` imports every public name of this module, so these fixtures are
visible to every test:

* ``s3_server`` (session): ``"moto"`` or ``"rgw"``, the server the S3 tests talk to.
* ``s3_endpoint`` (session): URL of that server (real HTTP on 127.0.0.1, a free port).
  Its credentials are set in the environment, and the user's own AWS config files,
  profile and endpoint variables are hidden, for the session.
* ``s3_client`` (session): a plain boto3 client on that server, to look behind a store.
* ``s3_bucket`` (function): a fresh, empty bucket; emptied and removed afterwards.
* ``make_s3_store`` (function): ``make_s3_store(prefix="run", bucket=None, **options)``
  returns an ``S3Store`` on the fresh bucket with quick test retries; closed afterwards.
* ``s3_store`` (function): ``make_s3_store()``.
* ``s3_fault_proxy`` (function): an :class:`S3FaultProxy` in front of the server.

Tests that use these are marked ``s3``.
"""

from __future__ import annotations

import http.client as _http_client
import os as _os
import socket as _socket
import threading as _threading
import uuid as _uuid
from collections import deque as _deque
from http.server import BaseHTTPRequestHandler as _Handler
from http.server import ThreadingHTTPServer as _ThreadingHTTPServer
from typing import Callable as _Callable
from urllib.parse import urlsplit as _urlsplit

import pytest

#: retry settings that keep failure tests fast (milliseconds of backoff)
QUICK_RETRY = {"max_attempts": 4, "retry_seconds": 10.0, "backoff_base": 0.002,
               "backoff_max": 0.02}

_HIDDEN_AWS_VARS = ("AWS_PROFILE", "AWS_DEFAULT_PROFILE", "AWS_SESSION_TOKEN",
                    "AWS_SECURITY_TOKEN", "AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3",
                    "AWS_MAX_ATTEMPTS", "AWS_RETRY_MODE", "AWS_ROLE_ARN",
                    "AWS_WEB_IDENTITY_TOKEN_FILE", "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI",
                    "AWS_CONTAINER_CREDENTIALS_FULL_URI")


SERVERS = ("moto", "rgw")


@pytest.fixture(scope="session")
def s3_server() -> str:
    which = _os.environ.get("S4FS_TEST_S3", "moto")
    if which not in SERVERS:
        raise pytest.UsageError(f"S4FS_TEST_S3 is one of {', '.join(SERVERS)}, "
                                f"not {which!r}")
    return which


@pytest.fixture(scope="session")
def s3_endpoint(s3_server, tmp_path_factory):
    pytest.importorskip("boto3", reason="boto3 is not installed")
    if s3_server == "rgw":
        from rgw_server import RgwServer, rgw_available
        missing = rgw_available()
        if missing is not None:
            pytest.skip(missing)
        server = RgwServer.start(tmp_path_factory.mktemp("rgw"))
        keys = (server.access_key, server.secret_key)
        url = server.endpoint
    else:
        server_mod = pytest.importorskip("moto.server",
                                         reason="moto[server] is not installed")
        server = server_mod.ThreadedMotoServer(ip_address="127.0.0.1", port=0,
                                               verbose=False)
        server.start()
        host, port = server.get_host_and_port()
        keys, url = ("testing", "testing"), f"http://{host}:{port}"
    aws_dir = tmp_path_factory.mktemp("aws-config")
    env = pytest.MonkeyPatch()
    for name in _HIDDEN_AWS_VARS:
        env.delenv(name, raising=False)
    env.setenv("AWS_ACCESS_KEY_ID", keys[0])
    env.setenv("AWS_SECRET_ACCESS_KEY", keys[1])
    env.setenv("AWS_DEFAULT_REGION", "us-east-1")
    env.setenv("AWS_CONFIG_FILE", str(aws_dir / "config"))
    env.setenv("AWS_SHARED_CREDENTIALS_FILE", str(aws_dir / "credentials"))
    env.setenv("AWS_EC2_METADATA_DISABLED", "true")
    try:
        yield url
    finally:
        server.stop()
        env.undo()


@pytest.fixture(scope="session")
def s3_client(s3_endpoint):
    import boto3
    client = boto3.client("s3", endpoint_url=s3_endpoint, region_name="us-east-1")
    yield client
    client.close()


@pytest.fixture
def s3_bucket(s3_client):
    name = f"s4fs-test-{_uuid.uuid4().hex[:16]}"
    s3_client.create_bucket(Bucket=name)
    yield name
    _remove_bucket(s3_client, name)


def _remove_bucket(client, name: str) -> None:
    try:
        for page in client.get_paginator("list_multipart_uploads").paginate(Bucket=name):
            for up in page.get("Uploads", ()):
                client.abort_multipart_upload(Bucket=name, Key=up["Key"],
                                              UploadId=up["UploadId"])
        for page in client.get_paginator("list_objects_v2").paginate(Bucket=name):
            objects = [{"Key": o["Key"]} for o in page.get("Contents", ())]
            if objects:
                client.delete_objects(Bucket=name, Delete={"Objects": objects, "Quiet": True})
        client.delete_bucket(Bucket=name)
    except Exception:
        pass                     # a test that broke the bucket must not hide its own error


@pytest.fixture
def make_s3_store(s3_endpoint, s3_bucket):
    from s4fs.stores.s3 import S3Store
    opened = []

    def make(prefix: str = "run", bucket: str | None = None, **options):
        options.setdefault("endpoint_url", s3_endpoint)
        options.setdefault("region", "us-east-1")
        for name, value in QUICK_RETRY.items():
            options.setdefault(name, value)
        store = S3Store(bucket or s3_bucket, prefix, **options)
        opened.append(store)
        return store

    yield make
    for store in opened:
        store.close()


@pytest.fixture
def s3_store(make_s3_store):
    return make_s3_store()


@pytest.fixture
def s3_fault_proxy(s3_endpoint):
    proxy = S3FaultProxy(s3_endpoint)
    yield proxy
    proxy.close()


# --- a misbehaving S3 front ----------------------------------------------------------

_ERRORS = {
    "slowdown": (503, "SlowDown", "Please reduce your request rate."),
    "unavailable": (503, "ServiceUnavailable", "Service is unable to handle request."),
    "internal": (500, "InternalError", "We encountered an internal error. Please try again."),
    "denied": (403, "AccessDenied", "Access Denied"),
    "nosuchbucket": (404, "NoSuchBucket", "The specified bucket does not exist"),
}


class S3FaultProxy:
    """A loopback HTTP proxy in front of a real S3 server that fails requests on command.

    ``inject(action, times=None, when=None)`` queues a rule: the next ``times`` requests
    (every request when ``times`` is None) for which ``when(method, path)`` is true get
    ``action`` instead of being forwarded. Actions: ``"slowdown"`` (503 SlowDown),
    ``"unavailable"`` (503 ServiceUnavailable), ``"internal"`` (500 InternalError),
    ``"denied"`` (403 AccessDenied), ``"nosuchbucket"`` (404), ``"drop"`` (close the
    connection without answering), ``"corrupt"`` (forward it with one byte of its body
    flipped, as a link that damages data would). Error answers carry the request id
    ``s4fs-proxy-<n>`` in the body and in ``x-amz-request-id``.

    ``requests`` lists ``(method, path, action)`` of every request seen, in order.
    """

    def __init__(self, upstream: str) -> None:
        parts = _urlsplit(upstream)
        self._upstream = (parts.hostname, parts.port)
        self._rules: _deque = _deque()
        self._lock = _threading.Lock()
        self.requests: list[tuple[str, str, str]] = []
        proxy = self

        class Handler(_Handler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):          # keep test output quiet
                pass

            def _handle(self):
                proxy._serve(self)

            do_GET = do_PUT = do_POST = do_DELETE = do_HEAD = _handle

        self._server = _ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        self._thread = _threading.Thread(target=self._server.serve_forever, args=(0.05,),
                                         name="s3-fault-proxy", daemon=True)
        self._thread.start()

    def inject(self, action: str, times: int | None = None,
               when: _Callable[[str, str], bool] | None = None) -> None:
        if action not in _ERRORS and action not in ("drop", "corrupt"):
            raise ValueError(f"unknown proxy action {action!r}")
        with self._lock:
            self._rules.append([action, times, when])

    def clear(self) -> None:
        with self._lock:
            self._rules.clear()

    def count(self, action: str | None = None) -> int:
        with self._lock:
            return sum(1 for r in self.requests if action is None or r[2] == action)

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=10)

    def _decide(self, method: str, path: str) -> tuple[str, int]:
        with self._lock:
            action = "forward"
            for rule in self._rules:
                name, times, when = rule
                if when is not None and not when(method, path):
                    continue
                if times is not None:
                    if times <= 0:
                        continue
                    rule[1] = times - 1
                action = name
                break
            self.requests.append((method, path, action))
            return action, len(self.requests)

    def _serve(self, h: _Handler) -> None:
        length = int(h.headers.get("Content-Length") or 0)
        body = h.rfile.read(length) if length else b""
        action, number = self._decide(h.command, h.path)
        if action == "drop":
            h.close_connection = True
            try:
                h.connection.shutdown(_socket.SHUT_RDWR)
            except OSError:
                pass
            return
        if action == "corrupt" and body:
            damaged = bytearray(body)
            damaged[len(damaged) // 2] ^= 0x10
            body = bytes(damaged)
        elif action not in ("forward", "corrupt"):
            status, code, message = _ERRORS[action]
            rid = f"s4fs-proxy-{number}"
            payload = (f'<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>{code}</Code>'
                       f"<Message>{message}</Message><RequestId>{rid}</RequestId>"
                       f"<HostId>s4fs-proxy-host</HostId></Error>").encode()
            h.send_response(status)
            h.send_header("Content-Type", "application/xml")
            h.send_header("x-amz-request-id", rid)
            h.send_header("x-amz-id-2", "s4fs-proxy-host")
            h.send_header("Content-Length", str(len(payload)))
            h.end_headers()
            if h.command != "HEAD":
                h.wfile.write(payload)
            return
        headers = {k: v for k, v in h.headers.items()
                   if k.lower() not in ("connection", "keep-alive", "expect",
                                        "transfer-encoding", "proxy-connection")}
        conn = _http_client.HTTPConnection(*self._upstream, timeout=60)
        try:
            conn.request(h.command, h.path, body=body, headers=headers)
            response = conn.getresponse()
            data = response.read()
            h.send_response(response.status)
            for k, v in response.getheaders():
                if k.lower() not in ("connection", "keep-alive", "transfer-encoding",
                                     "content-length", "server", "date"):
                    h.send_header(k, v)
            length = response.getheader("Content-Length") if h.command == "HEAD" else None
            h.send_header("Content-Length", length or str(len(data)))
            h.end_headers()
            if h.command != "HEAD":
                h.wfile.write(data)
        finally:
            conn.close()
