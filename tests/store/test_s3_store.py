"""S3Store beyond the shared conformance suite: URLs and options, prefixes, server-side
encryption, multipart puts, and what the user sees when S3 misbehaves (throttling, 5xx,
dropped connections, access denied) — all over real HTTP on loopback: moto or Ceph RGW
mode, behind a small proxy that fails requests on command."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from s4fs.errors import (Busy, InvalidArgument, NotFound, PermissionDenied, StoreError,
                         StoreUnavailable)
from s4fs.stores import open_store

MiB = 1 << 20
pytestmark = pytest.mark.s3


# --- URLs and options (no server needed) ---------------------------------------------

@pytest.mark.parametrize("url,bucket,prefix,store_url", [
    ("s3://bkt", "bkt", "", "s3://bkt"),
    ("s3://bkt/", "bkt", "", "s3://bkt"),
    ("s3://bkt/run7", "bkt", "run7", "s3://bkt/run7"),
    ("s3://bkt/team/run7/", "bkt", "team/run7", "s3://bkt/team/run7"),
    ("s3://bkt/with%20space", "bkt", "with space", "s3://bkt/with space"),
])
def test_url_forms(url, bucket, prefix, store_url):
    pytest.importorskip("botocore")
    store = open_store(url, region="us-east-1")
    assert (store.bucket, store.prefix, store.url) == (bucket, prefix, store_url)
    store.close()


def test_url_query_options_and_keyword_overrides():
    pytest.importorskip("botocore")
    from s4fs.stores.s3 import S3Store
    store = open_store("s3://bkt/p?endpoint_url=http://127.0.0.1:9&region=eu-west-3"
                       "&sse=aws:kms&kms_key_id=alias/ckpt&max_attempts=3&retry_seconds=2.5",
                       max_attempts=5)
    assert isinstance(store, S3Store)
    o = store.options
    assert (o.endpoint_url, o.region, o.sse, o.kms_key_id) == (
        "http://127.0.0.1:9", "eu-west-3", "aws:kms", "alias/ckpt")
    assert (o.max_attempts, o.retry_seconds) == (5, 2.5)
    assert o.put_args() == {"ServerSideEncryption": "aws:kms", "SSEKMSKeyId": "alias/ckpt"}
    store.close()


@pytest.mark.parametrize("url,options", [
    ("s3://", {}),
    ("s3:///prefix", {}),
    ("s3://bkt?colour=blue", {}),
    ("s3://bkt?max_attempts=many", {}),
    ("s3://bkt", {"sse": "rot13"}),
    ("s3://bkt", {"sse": "AES256", "kms_key_id": "k"}),
    ("s3://bkt", {"max_attempts": 0}),
    ("s3://bkt", {"colour": "blue"}),
    ("s3://bkt", {"profile": "s4fs-no-such-profile-in-any-config"}),
    ("s3://bkt/a//b", {}),
    ("s3://bkt/../up", {}),
])
def test_bad_urls_and_options(url, options):
    pytest.importorskip("botocore")
    with pytest.raises(InvalidArgument):
        open_store(url, **options)


def test_import_without_boto3(tmp_path):
    """``import s4fs`` and local stores work where boto3 is missing; an S3 store says
    what to install."""
    code = (
        "import sys\n"
        "sys.modules['boto3'] = sys.modules['botocore'] = None\n"
        "import s4fs, s4fs.stores, s4fs.stores.s3\n"
        "from s4fs.stores import open_store\n"
        f"open_store({str(tmp_path)!r}).put('k', b'v')\n"
        "from s4fs.errors import StoreError\n"
        "try:\n"
        "    open_store('s3://bkt/p')\n"
        "except StoreError as exc:\n"
        "    print('refused:', exc)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    assert "pip install" in out.stdout and "boto3" in out.stdout


# --- prefixes, encryption, listing -------------------------------------------------

def test_keys_live_under_the_prefix(make_s3_store, s3_client, s3_bucket):
    a = make_s3_store("team/run")
    b = make_s3_store("team/run2")
    root = make_s3_store("")
    a.put("ckpt/1", b"a1")
    b.put("ckpt/1", b"b1")
    assert [o.key for o in a.list()] == ["ckpt/1"]
    assert [o.key for o in b.list()] == ["ckpt/1"]
    assert a.get("ckpt/1") == b"a1" and b.get("ckpt/1") == b"b1"
    assert [o.key for o in root.list()] == ["team/run/ckpt/1", "team/run2/ckpt/1"]
    raw = s3_client.get_object(Bucket=s3_bucket, Key="team/run/ckpt/1")["Body"].read()
    assert raw == b"a1"
    a.delete("ckpt/1")
    assert b.get("ckpt/1") == b"b1"


def test_folder_marker_objects_are_not_listed(make_s3_store, s3_client, s3_bucket):
    s3_client.put_object(Bucket=s3_bucket, Key="run/", Body=b"")   # as a console makes
    store = make_s3_store("run")
    store.put("x", b"1")
    assert [o.key for o in store.list()] == ["x"]


def test_list_pages(make_s3_store):
    store = make_s3_store(list_page_size=3)
    names = [f"k{i:02d}" for i in range(11)]
    for n in names:
        store.put(n, n.encode())
    requests = store.stats()["requests"]
    assert [o.key for o in store.list()] == names
    assert store.stats()["requests"] - requests == 4            # 3 + 3 + 3 + 2
    assert [o.key for o in store.list("k1")] == ["k10"]


@pytest.mark.parametrize("options,expected", [
    ({"sse": "AES256"}, {"ServerSideEncryption": "AES256"}),
    ({"sse": "aws:kms"}, {"ServerSideEncryption": "aws:kms"}),
    ({"kms_key_id": "arn:aws:kms:us-east-1:123456789012:key/test-key"},
     {"ServerSideEncryption": "aws:kms",
      "SSEKMSKeyId": "arn:aws:kms:us-east-1:123456789012:key/test-key"}),
])
def test_server_side_encryption(make_s3_store, s3_client, s3_bucket, s3_server, options,
                                expected):
    if s3_server == "rgw":
        # RGW 16.2 encrypts only with a KMS it is set up for, and only over HTTPS: the
        # test below shows what a user of such a server sees instead
        pytest.skip("RGW here has no KMS and no HTTPS: SSE is refused (next test)")
    store = make_s3_store(**options)
    store.put("small", b"secret")
    store2 = make_s3_store(multipart_threshold=5 * MiB, part_size=5 * MiB, **options)
    store2.put("multi", os.urandom(11 * MiB))
    for key in ("small", "multi"):
        head = s3_client.head_object(Bucket=s3_bucket, Key=f"run/{key}")
        assert {k: head.get(k) for k in expected} == expected, key
    assert store.get("small") == b"secret"


def test_encryption_a_server_refuses_says_so(make_s3_store, s3_server):
    if s3_server != "rgw":
        pytest.skip("moto takes any encryption asked for")
    store = make_s3_store(sse="aws:kms")
    with pytest.raises(StoreError) as info:
        store.put("small", b"secret")
    assert "server-side encryption (ServerSideEncryption=aws:kms)" in str(info.value)
    assert "leave out sse/kms_key_id" in str(info.value)
    with pytest.raises(NotFound):
        store.get("small")                         # nothing half-written is left


def test_no_encryption_arguments_by_default(s3_store):
    assert s3_store.options.put_args() == {}


# --- multipart -------------------------------------------------------------------------

def _uploads(client, bucket) -> list[dict]:
    return client.list_multipart_uploads(Bucket=bucket).get("Uploads", [])


def test_a_pack_goes_up_in_parts_while_it_is_written(make_s3_store, s3_client, s3_bucket):
    store = make_s3_store()
    data = os.urandom(20 * MiB + 12345)
    pieces = [data[i:i + 3 * MiB] for i in range(0, len(data), 3 * MiB)]
    w = store.writer("packs/p1")
    for p in pieces[:-1]:
        w.write([p])
    ups = _uploads(s3_client, s3_bucket)
    assert [u["Key"] for u in ups] == ["run/packs/p1"]
    parts = s3_client.list_parts(Bucket=s3_bucket, Key="run/packs/p1",
                                 UploadId=ups[0]["UploadId"])["Parts"]
    assert sum(p["Size"] for p in parts) >= 16 * MiB          # sent ahead, 8 MiB or more
    assert not store.exists("packs/p1")                        # nothing under the key yet
    sent = store.stats()["bytes_sent"]
    w.write([pieces[-1]])
    w.commit()
    assert store.stats()["bytes_sent"] - sent < 8 * MiB        # the commit sent the rest
    assert store.get("packs/p1") == data
    assert _uploads(s3_client, s3_bucket) == []


def test_an_aborted_pack_leaves_no_object_and_no_upload(make_s3_store, s3_client, s3_bucket):
    store = make_s3_store()
    w = store.writer("packs/p2")
    w.write([os.urandom(9 * MiB)])
    assert len(_uploads(s3_client, s3_bucket)) == 1
    w.abort()
    assert _uploads(s3_client, s3_bucket) == [] and not store.exists("packs/p2")


def test_a_pack_under_one_part_is_one_put(make_s3_store):
    store = make_s3_store()
    data = os.urandom(3 * MiB)
    before = store.stats()["requests"]
    w = store.writer("packs/p3")
    w.write([data[:MiB], data[MiB:]])
    w.commit()
    assert store.stats()["requests"] - before == 1
    assert store.get("packs/p3") == data


def test_a_body_damaged_on_the_way_is_refused_and_sent_again(make_s3_store, s3_fault_proxy,
                                                             s3_server):
    # every put and part carries its MD5 (Content-MD5), which a real server checks
    if s3_server == "moto":
        pytest.skip("moto stores a body whose Content-MD5 does not match: on RGW only")
    store = make_s3_store(endpoint_url=s3_fault_proxy.url)
    data = os.urandom(MiB)
    s3_fault_proxy.inject("corrupt", times=1, when=lambda method, path: method == "PUT")
    store.put("one", data)
    pack = os.urandom(10 * MiB)
    s3_fault_proxy.inject("corrupt", times=1,
                          when=lambda method, path: method == "PUT" and "partNumber" in path)
    w = store.writer("packs/two")
    w.write([pack])
    w.commit()
    assert s3_fault_proxy.count("corrupt") == 2 and store.stats()["retries"] >= 2
    assert store.get("one") == data and store.get("packs/two") == pack

def test_multipart_put_round_trip(make_s3_store, s3_client, s3_bucket):
    store = make_s3_store(multipart_threshold=5 * MiB, part_size=5 * MiB)
    data = os.urandom(12 * MiB + 123)
    store.put("big", memoryview(data))
    before = store.stats()["requests"]
    assert store.get("big") == data
    for lo, hi in [(5 * MiB - 3, 5 * MiB + 3), (12 * MiB, 13 * MiB), (0, 1)]:
        assert store.get("big", lo, hi) == data[lo:hi]
    assert store.stats()["requests"] - before == 4
    assert store.head("big").size == len(data)
    assert s3_client.list_multipart_uploads(Bucket=s3_bucket).get("Uploads", []) == []
    # 3 parts + create + complete
    head = s3_client.head_object(Bucket=s3_bucket, Key="run/big")
    assert head["ETag"].endswith('-3"')


def test_failed_multipart_leaves_nothing(make_s3_store, s3_fault_proxy, s3_client, s3_bucket):
    """A part that keeps failing aborts the upload: no object, no lingering parts."""
    store = make_s3_store(endpoint_url=s3_fault_proxy.url, multipart_threshold=5 * MiB,
                          part_size=5 * MiB, max_attempts=3)
    s3_fault_proxy.inject("internal", when=lambda method, path: "partNumber=2" in path)
    with pytest.raises(StoreUnavailable, match="InternalError"):
        store.put("big", os.urandom(11 * MiB))
    assert s3_fault_proxy.count("internal") == 3
    s3_fault_proxy.clear()
    with pytest.raises(NotFound):
        store.get("big")
    assert s3_client.list_multipart_uploads(Bucket=s3_bucket).get("Uploads", []) == []


# --- errors that are not retried ---------------------------------------------------

def test_missing_key_is_not_found_with_request_id(s3_store):
    with pytest.raises(NotFound) as info:
        s3_store.get("missing/key")
    assert "request id" in str(info.value)
    assert s3_store.stats()["retries"] == 0


def test_missing_bucket_is_a_store_error(make_s3_store):
    store = make_s3_store(bucket="no-such-bucket-s4fs")
    with pytest.raises(StoreError, match="does not exist") as info:
        store.put("k", b"v")
    assert not isinstance(info.value, NotFound)
    with pytest.raises(StoreError, match="NoSuchBucket"):
        list(store.list())
    assert store.stats()["retries"] == 0


def test_access_denied_is_permission_denied_at_once(make_s3_store, s3_fault_proxy):
    store = make_s3_store(endpoint_url=s3_fault_proxy.url)
    s3_fault_proxy.inject("denied")
    for call in (lambda: store.put("k", b"v"), lambda: store.get("k"),
                 lambda: store.head("k"), lambda: list(store.list())):
        with pytest.raises(PermissionDenied) as info:
            call()
        assert isinstance(info.value, PermissionError)
    assert "request id s4fs-proxy-4" in str(info.value)
    assert s3_fault_proxy.count("denied") == 4                   # one request per call
    assert store.stats()["retries"] == 0


# --- retries ---------------------------------------------------------------------------

@pytest.mark.parametrize("action", ["slowdown", "internal", "unavailable", "drop"])
def test_transient_failures_are_retried(make_s3_store, s3_fault_proxy, action):
    store = make_s3_store(endpoint_url=s3_fault_proxy.url, max_attempts=5)
    data = os.urandom(300_000)
    s3_fault_proxy.inject(action, times=3)
    store.put("chunk", data)                                      # 3 failures, then OK
    assert s3_fault_proxy.count(action) == 3
    s3_fault_proxy.inject(action, times=3)
    assert store.get("chunk") == data                            # nothing lost
    s3_fault_proxy.inject(action, times=2)
    assert store.get("chunk", 1000, 2000) == data[1000:2000]
    s3_fault_proxy.inject(action, times=2)
    assert store.head("chunk").size == len(data)
    s3_fault_proxy.inject(action, times=2)
    assert [o.key for o in store.list()] == ["chunk"]
    s3_fault_proxy.inject(action, times=2)
    store.delete("chunk")
    assert not store.exists("chunk")
    assert store.stats()["retries"] == 14


def test_retries_under_concurrent_puts(make_s3_store, s3_fault_proxy):
    """Throttling while a thread pool uploads: every chunk still lands intact."""
    from concurrent.futures import ThreadPoolExecutor
    store = make_s3_store(endpoint_url=s3_fault_proxy.url, max_attempts=8)
    chunks = {f"chunks/{i:02d}": os.urandom(50_000 + i) for i in range(24)}
    s3_fault_proxy.inject("slowdown", times=20)
    with ThreadPoolExecutor(8) as pool:
        list(pool.map(lambda kv: store.put(*kv), chunks.items()))
    assert s3_fault_proxy.count("slowdown") == 20
    assert {o.key: o.size for o in store.list("chunks/")} == {
        k: len(v) for k, v in chunks.items()}
    for k, v in chunks.items():
        assert store.get(k) == v


@pytest.mark.parametrize("action,error,code", [
    ("slowdown", Busy, "SlowDown"),
    ("unavailable", Busy, "ServiceUnavailable"),
    ("internal", StoreUnavailable, "InternalError"),
])
def test_permanent_failure_surfaces_after_the_attempt_budget(make_s3_store, s3_fault_proxy,
                                                              action, error, code):
    store = make_s3_store(endpoint_url=s3_fault_proxy.url, max_attempts=4)
    s3_fault_proxy.inject(action)
    with pytest.raises(error) as info:
        store.put("k", b"v")
    message = str(info.value)
    assert code in message and "s4fs-proxy-4" in message        # the last request's id
    assert "gave up after 4 attempts" in message
    assert s3_fault_proxy.count(action) == 4
    with pytest.raises(error):                                   # HEAD: no error body
        store.head("k")
    assert s3_fault_proxy.count(action) == 8


def test_dropped_connections_surface_as_store_unavailable(make_s3_store, s3_fault_proxy):
    store = make_s3_store(endpoint_url=s3_fault_proxy.url, max_attempts=3)
    s3_fault_proxy.inject("drop")
    with pytest.raises(StoreUnavailable, match="gave up after 3 attempts"):
        store.get("k")
    assert isinstance(StoreUnavailable("x"), ConnectionError)


def test_unreachable_endpoint(make_s3_store):
    import socket
    with socket.socket() as s:                     # a port that nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    store = make_s3_store(endpoint_url=f"http://127.0.0.1:{port}", max_attempts=2)
    with pytest.raises(StoreUnavailable, match="reachable"):
        store.put("k", b"v")


def test_time_budget_bounds_retries(make_s3_store, s3_fault_proxy):
    store = make_s3_store(endpoint_url=s3_fault_proxy.url, max_attempts=10_000,
                          retry_seconds=0.4, backoff_base=0.01, backoff_max=0.05)
    s3_fault_proxy.inject("slowdown")
    started = time.monotonic()
    with pytest.raises(Busy):
        store.put("k", b"v")
    assert time.monotonic() - started < 3
    assert 2 <= s3_fault_proxy.count("slowdown") < 10_000


def test_botocore_does_not_retry_on_its_own(make_s3_store, s3_fault_proxy, monkeypatch):
    """Retries happen in one place: settings that would make botocore retry too do not
    multiply the requests."""
    monkeypatch.setenv("AWS_MAX_ATTEMPTS", "7")
    monkeypatch.setenv("AWS_RETRY_MODE", "adaptive")
    store = make_s3_store(endpoint_url=s3_fault_proxy.url, max_attempts=2)
    s3_fault_proxy.inject("slowdown")
    with pytest.raises(Busy):
        store.get("k")
    assert s3_fault_proxy.count() == 2


def test_stats_count_requests_and_bytes(s3_store):
    s3_store.put("a", b"x" * 1000)
    s3_store.get("a")
    s3_store.get("a", 0, 10)
    stats = s3_store.stats()
    assert stats["requests"] == 3 and stats["retries"] == 0
    assert stats["bytes_sent"] == 1000 and stats["bytes_received"] == 1010


def test_next_save_after_a_lifecycle_rule_deleted_the_previous_ones_packs(
        make_s3_store, tmp_path, monkeypatch, caplog):
    """The previous checkpoint's packs are gone from the bucket (a lifecycle rule) but
    still in the local pack cache: the next save must not be coded against them (its
    file would need packs the bucket lacks). It is stored whole, with a warning, and
    reads back exact from the bucket alone."""
    torch = pytest.importorskip("torch")
    import io
    from s4fs.coding import _bases as delta
    from s4fs.errors import S4Error
    from s4fs.fs import Filesystem, FsConfig
    monkeypatch.setattr(delta, "PACKS_SEEN_TTL", 0.0)     # the rule ran days later
    store = make_s3_store(prefix="lifecycle")
    fs = Filesystem(store, FsConfig(cache_dir=str(tmp_path / "cache")))
    assert fs.pack_cache is not None

    def save(path, sd):
        buf = io.BytesIO()
        torch.save(sd, buf)
        h = fs.open_write(path)
        h.write(0, buf.getvalue())
        h.flush()
        h.release()
        return buf.getvalue()

    w = torch.randn(1 << 20)
    save("ckpt_0.pt", {"w": w})
    for key in fs.manifest("ckpt_0.pt").own_packs:
        store.delete(key)
    w[:100] += 1
    with caplog.at_level("WARNING", logger="s4fs.ingest"):
        want = save("ckpt_1.pt", {"w": w})
    m1 = fs.manifest("ckpt_1.pt")
    assert m1.base is None and all(c.base is None for s in m1.streams for c in s.chunks)
    assert "is missing from the store" in caplog.text and "s4fs verify" in caplog.text
    fs.close()
    fresh = Filesystem(make_s3_store(prefix="lifecycle"), FsConfig(decoded_cache_bytes=0,
                                                                   pack_cache_bytes=0))
    r = fresh.open_read("ckpt_1.pt")
    assert r.read(0, len(want)) == want
    r.release()
    with pytest.raises(S4Error):
        r0 = fresh.open_read("ckpt_0.pt")
        r0.read(0, 1 << 20)
    fresh.close()


def test_a_store_sent_to_a_worker_process_reads_and_writes_with_a_client_of_its_own(
        s3_store):
    """The coding workers get the store by pickle. Their copy makes its botocore client
    at its first request, not when it arrives (about 0.3 s of a core each, which a
    worker decoding bytes fetched ahead never needs); then it reads and writes as the
    daemon's store does, with the same options."""
    import pickle
    s3_store.put("packs/a", b"written by the daemon")
    theirs = pickle.loads(pickle.dumps(s3_store))
    assert theirs._client_now is None               # nothing made yet
    assert (theirs.url, theirs.options) == (s3_store.url, s3_store.options)
    assert theirs.get("packs/a") == b"written by the daemon"
    theirs.put("packs/b", b"written by a worker")
    assert s3_store.get("packs/b") == b"written by a worker"
    theirs.close()
