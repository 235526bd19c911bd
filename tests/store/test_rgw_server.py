"""The throw-away Ceph RGW test server (tests/rgw_server.py): it serves S3 to boto3, two
run side by side without seeing each other, and nothing of it outlives stop().

Skipped where the Ceph binaries are missing (Debian: apt-get install
--no-install-recommends radosgw ceph-mon ceph-osd).
"""

from __future__ import annotations

import os
import socket
import time
import uuid

import pytest

from rgw_server import RgwServer, RgwStartError, rgw_available

_MISSING = rgw_available()

pytestmark = [
    pytest.mark.s3,
    pytest.mark.slow,          # clusters started and stopped: not in make check
    pytest.mark.skipif(_MISSING is not None, reason=_MISSING or ""),
]

boto3 = pytest.importorskip("boto3", reason="boto3 is not installed")
from botocore.exceptions import ClientError  # noqa: E402  (after the importorskip)


def _processes_in(workdir) -> list[str]:
    """Processes whose command line names ``workdir`` (every daemon gets -c <workdir>/...)."""
    found = []
    needle = str(workdir).encode()
    for pid in os.listdir("/proc"):
        if not pid.isdigit() or int(pid) == os.getpid():
            continue
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmdline = f.read()
        except OSError:
            continue
        if needle in cmdline:
            found.append(pid + ": " + cmdline.replace(b"\0", b" ").decode(errors="replace"))
    return found


def _gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


def _code(exc: ClientError) -> str:
    return exc.response["Error"]["Code"]


@pytest.fixture(scope="module")
def rgw(tmp_path_factory):
    server = RgwServer.start(tmp_path_factory.mktemp("rgw"))
    yield server
    server.stop()


def test_put_get_range_list_delete(rgw):
    s3 = rgw.client()
    bucket = f"b-{uuid.uuid4().hex[:12]}"
    s3.create_bucket(Bucket=bucket)
    data = os.urandom(3 * 1024 * 1024 + 7)
    etag = s3.put_object(Bucket=bucket, Key="dir/blob", Body=data)["ETag"]
    s3.put_object(Bucket=bucket, Key="dir/small", Body=b"small")

    got = s3.get_object(Bucket=bucket, Key="dir/blob")
    assert got["Body"].read() == data and got["ETag"] == etag
    part = s3.get_object(Bucket=bucket, Key="dir/blob", Range="bytes=1000-1999")
    assert part["ContentRange"] == f"bytes 1000-1999/{len(data)}"
    assert part["Body"].read() == data[1000:2000]
    tail = s3.get_object(Bucket=bucket, Key="dir/blob", Range=f"bytes={len(data) - 5}-")
    assert tail["Body"].read() == data[-5:]
    with pytest.raises(ClientError) as err:      # a range that starts past the end
        s3.get_object(Bucket=bucket, Key="dir/small", Range="bytes=5-9")
    assert _code(err.value) == "InvalidRange"

    listed = s3.list_objects_v2(Bucket=bucket, Prefix="dir/")
    assert [(o["Key"], o["Size"]) for o in listed["Contents"]] == [
        ("dir/blob", len(data)), ("dir/small", 5)]
    page = s3.list_objects_v2(Bucket=bucket, MaxKeys=1)
    assert page["IsTruncated"] and [o["Key"] for o in page["Contents"]] == ["dir/blob"]
    rest = s3.list_objects_v2(Bucket=bucket, MaxKeys=1,
                              ContinuationToken=page["NextContinuationToken"])
    assert [o["Key"] for o in rest["Contents"]] == ["dir/small"]

    s3.delete_object(Bucket=bucket, Key="dir/blob")
    s3.delete_object(Bucket=bucket, Key="dir/small")
    s3.delete_object(Bucket=bucket, Key="never-there")   # deleting a missing key is fine
    with pytest.raises(ClientError) as err:
        s3.get_object(Bucket=bucket, Key="dir/blob")
    assert _code(err.value) == "NoSuchKey"
    with pytest.raises(ClientError) as err:
        s3.head_object(Bucket=bucket, Key="dir/blob")
    assert err.value.response["ResponseMetadata"]["HTTPStatusCode"] == 404
    assert s3.list_objects_v2(Bucket=bucket)["KeyCount"] == 0
    s3.delete_bucket(Bucket=bucket)
    with pytest.raises(ClientError) as err:
        s3.list_objects_v2(Bucket=bucket)
    assert _code(err.value) == "NoSuchBucket"


def test_two_servers_are_independent_and_stop_kills_every_daemon(rgw, tmp_path):
    other = RgwServer.start(tmp_path / "other")
    try:
        assert other.endpoint != rgw.endpoint and other.fsid != rgw.fsid
        assert not set(other.pids.values()) & set(rgw.pids.values())
        a, b = rgw.client(), other.client()
        bucket = f"only-a-{uuid.uuid4().hex[:8]}"
        a.create_bucket(Bucket=bucket)
        a.put_object(Bucket=bucket, Key="k", Body=b"in a")
        with pytest.raises(ClientError) as err:
            b.head_bucket(Bucket=bucket)
        assert err.value.response["ResponseMetadata"]["HTTPStatusCode"] == 404
        b.create_bucket(Bucket=bucket)                  # the same name, its own bucket
        b.put_object(Bucket=bucket, Key="k", Body=b"in b")
        assert a.get_object(Bucket=bucket, Key="k")["Body"].read() == b"in a"
        assert b.get_object(Bucket=bucket, Key="k")["Body"].read() == b"in b"
        # each cluster has its own user: one server's keys mean nothing to the other
        stranger = other.client(aws_access_key_id=rgw.access_key,
                                aws_secret_access_key=rgw.secret_key)
        with pytest.raises(ClientError) as err:
            stranger.list_buckets()
        assert _code(err.value) == "InvalidAccessKeyId"
    finally:
        pids = other.pids
        started = time.monotonic()
        other.stop()
        stopped_in = time.monotonic() - started
    assert set(pids) == {"mon.a", "osd.0", "client.rgw"}
    assert all(_gone(pid) for pid in pids.values()), pids
    assert not _processes_in(tmp_path / "other")
    assert stopped_in < 10
    with pytest.raises(OSError):                        # nothing listens there any more
        socket.create_connection(("127.0.0.1", other.rgw_port), timeout=2).close()
    # stopping one left the other serving
    assert rgw.alive()
    a.delete_object(Bucket=bucket, Key="k")
    a.delete_bucket(Bucket=bucket)


def test_taken_ports_are_skipped(tmp_path, monkeypatch):
    """A port another process takes between our probe and the daemon's bind: the monitor
    and radosgw die on it (while the port still answers) and the start moves on."""
    import rgw_server

    holders = []
    for _ in range(2):
        sock = socket.socket()
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        holders.append(sock)
    taken = [holders[0].getsockname()[1], None, holders[1].getsockname()[1]]
    real = rgw_server._free_port
    # _free_port is asked for the monitor's port, the monitor's retry, then radosgw's
    monkeypatch.setattr(rgw_server, "_free_port", lambda: (taken.pop(0) if taken else None)
                        or real())
    try:
        with RgwServer.start(tmp_path) as server:
            assert not taken                    # both daemons were given a taken port
            assert server.mon_port != holders[0].getsockname()[1]
            assert server.rgw_port != holders[1].getsockname()[1]
            s3 = server.client()
            s3.create_bucket(Bucket="after-collisions")
            s3.put_object(Bucket="after-collisions", Key="k", Body=b"ok")
            assert s3.get_object(Bucket="after-collisions", Key="k")["Body"].read() == b"ok"
    finally:
        for sock in holders:
            sock.close()
    assert not _processes_in(tmp_path)


def test_start_timeout_leaves_nothing(tmp_path):
    with pytest.raises(RgwStartError, match="timed out"):
        RgwServer.start(tmp_path, timeout=0.5)
    assert not _processes_in(tmp_path)


def test_failed_step_reports_its_output_and_the_logs(tmp_path, monkeypatch):
    import rgw_server

    real = rgw_server._config
    # the OSD's block file in a folder that does not exist: its mkfs fails
    monkeypatch.setattr(rgw_server, "_config", lambda *args: real(*args).replace(
        "/osd-block", "/no-such-folder/osd-block"))
    with pytest.raises(RgwStartError) as err:
        RgwServer.start(tmp_path)
    message = str(err.value)
    assert "ceph-osd -c" in message and "--mkfs" in message
    # with the OSD's own words for it (which of its lines it prints varies: on a loaded
    # machine "mkfs failed" once did not come before it exited)
    assert "mkfs failed" in message or "No such file or directory" in message, message
    assert "--- mon.a.log (tail) ---" in message          # the daemons' log tails
    assert not _processes_in(tmp_path)
