"""One store conformance suite, run against every Store: LocalStore on a temporary
directory, S3Store against a real S3 HTTP server on loopback (moto, then Ceph RGW), and a
FailingStore with nothing armed (a wrapper must be transparent).

The contract is the docstring of ``s4fs/stores/base.py``.
"""

from __future__ import annotations

import threading
import time

import pytest

from s4fs.errors import InvalidArgument, NotFound, S4Error, StoreUnavailable
from s4fs.stores import LocalStore, Store
from s4fs.stores.faulty import FailingStore
from s4fs.stores.local import TMP_PREFIX


@pytest.fixture(params=["local", pytest.param("s3", marks=pytest.mark.s3), "faulty-local"])
def store(request, tmp_path) -> Store:
    if request.param == "local":
        s = LocalStore(tmp_path / "store")
    elif request.param == "faulty-local":
        s = FailingStore(LocalStore(tmp_path / "store"), fail_on=())
    else:
        yield request.getfixturevalue("s3_store")     # closed by its own fixture
        return
    yield s
    s.close()


def keys(store, prefix=""):
    return [o.key for o in store.list(prefix)]


DATA = bytes(range(256)) * 40                 # every byte value, 10240 bytes


# --- put / get -------------------------------------------------------------------

def test_put_get_round_trip(store):
    store.put("obj", DATA)
    assert store.get("obj") == DATA
    assert store.head("obj").size == len(DATA)


@pytest.mark.parametrize("wrap", [bytearray, memoryview, lambda b: memoryview(bytearray(b))])
def test_put_accepts_bytes_like(store, wrap):
    store.put("obj", wrap(DATA))
    assert store.get("obj") == DATA


RANGES = [
    (None, None), (0, None), (None, 100), (0, 100), (100, 200), (1000, None),
    (0, len(DATA)), (len(DATA) - 1, len(DATA)),                  # whole, last byte
    (0, len(DATA) + 5000), (len(DATA) - 10, 10 ** 9),             # end past the size
    (500, 500), (0, 0), (len(DATA), len(DATA)),                   # start == end
    (len(DATA), len(DATA) + 10), (len(DATA) + 1, len(DATA) + 9),  # start at/past the end
    (len(DATA) + 50, None), (300, 200),                           # end before start
]


def test_ranged_get(store):
    store.put("obj", DATA)
    wrong = {}
    for start, end in RANGES:
        lo = start or 0
        expected = DATA[lo:end] if end is None or end > lo else b""
        got = store.get("obj", start, end)
        if got != expected:
            wrong[(start, end)] = (len(got), len(expected))
    assert wrong == {}, "ranges that came back wrong: {(start, end): (got, expected) length}"


def test_ranges_of_one_object(store):
    """Many ranges of one object, the way the reader fetches chunk slices."""
    store.put("obj", DATA)
    for start in (0, 1, 63, 64, 4095, 4096, 10239):
        for length in (1, 7, 4096):
            assert store.get("obj", start, start + length) == DATA[start:start + length]


def test_get_into_reads_ranges_in_place(store):
    """``get_into`` (what GPU loads read packs with) gives the bytes ``get`` gives, into
    the caller's buffer, and says how many there were at the object's end."""
    store.put("obj", DATA)
    for start in (0, 1, 4095, 10239, len(DATA) - 3):
        for length in (1, 4096, 1 << 20):
            buf = bytearray(length + 8)
            n = store.get_into("obj", start, start + length, memoryview(buf))
            want = DATA[start:start + length]
            assert n == len(want) and bytes(buf[:n]) == want, (start, length)
            assert buf[n:] == bytearray(len(buf) - n)           # nothing written past it
    with pytest.raises(NotFound):
        store.get_into("absent", 0, 10, bytearray(10))


def test_empty_object(store):
    store.put("empty", b"")
    assert store.get("empty") == b""
    assert store.get("empty", 0, 10) == b""
    assert store.get("empty", 0, 0) == b""
    assert store.get("empty", 5, None) == b""
    assert store.head("empty").size == 0
    assert [(o.key, o.size) for o in store.list()] == [("empty", 0)]


# --- an object written piece by piece (a pack as it fills) -------------------------

def test_writer_stores_nothing_until_commit_then_every_piece(store):
    pieces = [DATA[:1], DATA[1:4096], b"", bytearray(DATA[4096:9000]),
              memoryview(DATA)[9000:]]
    w = store.writer("packs/p1")
    for k in range(0, len(pieces), 2):
        w.write(pieces[k:k + 2])
        assert keys(store, "packs") == [], "a piece is visible before the commit"
        with pytest.raises(NotFound):
            store.get("packs/p1")
    w.commit()
    assert store.get("packs/p1") == DATA and store.head("packs/p1").size == len(DATA)
    assert keys(store) == ["packs/p1"]


def test_writer_of_nothing_and_writer_over_an_object(store):
    w = store.writer("empty")
    w.commit()
    assert store.get("empty") == b""
    store.put("obj", b"old bytes")
    w = store.writer("obj")
    w.write([DATA[:100]])
    assert store.get("obj") == b"old bytes"        # the old object until the commit
    w.write([DATA[100:]])
    w.commit()
    assert store.get("obj") == DATA


def test_an_aborted_writer_leaves_nothing(store, tmp_path):
    store.put("kept", b"x")
    w = store.writer("deep/folder/gone")
    w.write([DATA])
    w.abort()
    w.abort()                                      # twice: no error
    assert keys(store) == ["kept"]
    with pytest.raises(NotFound):
        store.get("deep/folder/gone")
    # nothing left on disk either (no temporary file of a LocalStore)
    left = [p for p in (tmp_path / "store").rglob("*") if p.is_file() and
            p.name.startswith(TMP_PREFIX)]
    assert left == []


def test_writers_side_by_side(store):
    ws = {f"p{k}": store.writer(f"packs/p{k}") for k in range(4)}
    for k, w in enumerate(ws.values()):
        w.write([bytes([k]) * 1000])
    for k, w in enumerate(ws.values()):
        w.write([DATA])
        w.commit()
    for k, key in enumerate(ws):
        assert store.get(f"packs/{key}") == bytes([k]) * 1000 + DATA


def test_overwrite_replaces(store):
    store.put("obj", b"first version, longer than the second")
    store.put("obj", b"second")
    assert store.get("obj") == b"second"
    assert store.head("obj").size == 6
    assert keys(store) == ["obj"]


def test_overwrite_is_atomic(store):
    """A reader racing a writer sees the old bytes or the new ones, never a mix."""
    versions = [b"A" * 300_000, b"B" * 200_000, b"C" * 250_001]
    store.put("obj", versions[0])
    done = threading.Event()
    seen, bad = set(), []

    def reader():
        while not done.is_set():
            data = store.get("obj")
            if data not in versions:
                bad.append((len(data), data[:1], data[-1:]))
            seen.add(data[:1])
            head = store.get("obj", 0, 1000)
            if head not in (v[:1000] for v in versions):
                bad.append(("range", head[:1], head[-1:]))

    threads = [threading.Thread(target=reader) for _ in range(2)]
    for t in threads:
        t.start()
    try:
        for i in range(24):
            store.put("obj", versions[i % 3])
    finally:
        done.set()
        for t in threads:
            t.join(timeout=60)
    assert not bad
    assert store.get("obj") == versions[23 % 3]


# --- missing keys and delete -------------------------------------------------------

def test_missing_key(store):
    with pytest.raises(NotFound):
        store.get("nope")
    with pytest.raises(FileNotFoundError):          # NotFound is the builtin too
        store.get("nope", 0, 10)
    with pytest.raises(NotFound):
        store.get("nope", 5, 5)                     # an empty range still needs the key
    with pytest.raises(NotFound):
        store.head("nope")
    with pytest.raises(NotFound):
        store.get("dir/nope")
    assert not store.exists("nope")
    assert keys(store, "nope") == []


def test_missing_key_next_to_existing(store):
    store.put("a/b", b"x")
    for missing in ("a", "a/b/c", "a/bb", "a/c"):
        with pytest.raises(NotFound):
            store.get(missing)


def test_delete_is_idempotent(store):
    store.put("obj", b"data")
    store.put("keep", b"k")
    store.delete("obj")
    store.delete("obj")
    store.delete("never-was")
    store.delete("no/such/folder")
    with pytest.raises(NotFound):
        store.get("obj")
    assert not store.exists("obj")
    assert keys(store) == ["keep"]
    store.put("obj", b"again")                      # a deleted key can be written again
    assert store.get("obj") == b"again"


def test_delete_nested_keeps_siblings(store):
    for k in ("d/x/1", "d/x/2", "d/y"):
        store.put(k, k.encode())
    store.delete("d/x/1")
    store.delete("d/x/2")
    assert keys(store) == ["d/y"]
    store.put("d/x/3", b"3")
    assert store.get("d/x/3") == b"3"


# --- list ----------------------------------------------------------------------------

LIST_KEYS = ["a", "a/b", "a/c/d", "a/c/e", "aa", "ab", "ab/c", "b/x", "b/y/z", "c"]


LIST_CASES = [
    ("", LIST_KEYS),
    ("a", ["a", "a/b", "a/c/d", "a/c/e", "aa", "ab", "ab/c"]),
    ("a/", ["a/b", "a/c/d", "a/c/e"]),
    ("ab", ["ab", "ab/c"]),
    ("ab/", ["ab/c"]),
    ("a/c", ["a/c/d", "a/c/e"]),
    ("a/c/", ["a/c/d", "a/c/e"]),
    ("a/c/d", ["a/c/d"]),
    ("a/b", ["a/b"]),
    ("a/b/", []),                                    # a/b is an object, not a folder
    ("b/", ["b/x", "b/y/z"]),
    ("b/y/", ["b/y/z"]),
    ("zz", []),
    ("zz/", []),
    ("a/zz", []),
]


def test_list_prefix(store):
    for k in reversed(LIST_KEYS):                  # written out of order on purpose
        store.put(k, k.encode())
    got = {}
    for prefix, expected in LIST_CASES:
        listed = list(store.list(prefix))
        got[prefix] = [o.key for o in listed]
        assert all(o.size == len(o.key) for o in listed)
    assert got == dict(LIST_CASES)


def test_list_order_and_sizes(store):
    names = [f"chunks/{i:03d}" for i in (5, 1, 300, 42, 0, 99)]
    for n, k in enumerate(names):
        store.put(k, b"x" * n)
    listed = list(store.list("chunks/"))
    assert [o.key for o in listed] == sorted(names)
    sizes = {k: n for n, k in enumerate(names)}
    assert {o.key: o.size for o in listed} == sizes


def test_list_empty_store(store):
    assert keys(store) == []
    assert keys(store, "a/") == []


# --- head ----------------------------------------------------------------------------

def test_head_size_and_mtime(store):
    before = time.time()
    store.put("obj", DATA)
    after = time.time()
    info = store.head("obj")
    assert info.key == "obj" and info.size == len(DATA)
    # S3 keeps whole seconds; allow for that and for a little clock skew
    assert before - 2 <= info.mtime <= after + 2
    listed = next(iter(store.list("obj")))
    assert listed.size == info.size
    assert abs(listed.mtime - info.mtime) < 2


# --- keys ----------------------------------------------------------------------------

ODD_KEYS = [
    "with space/and more spaces.bin",
    "unicode/ƒïlé ü 日本語 😀",
    "punct/plus+and&amp=eq?q#hash%25pct",
    "punct/quote'\"back\\slash",
    "tab\tand~tilde,comma;semi:colon",
    "deep/" + "/".join(f"d{i}" for i in range(20)) + "/leaf",
    "dot.start/.hidden",
    "long/" + "k" * 200,
]


def test_odd_keys(store):
    for n, k in enumerate(ODD_KEYS):
        store.put(k, k.encode() + bytes([n]))
    for n, k in enumerate(ODD_KEYS):
        assert store.get(k) == k.encode() + bytes([n])
        assert store.head(k).size == len(k.encode()) + 1
    assert keys(store) == sorted(ODD_KEYS)
    assert keys(store, "unicode/ƒ") == ["unicode/ƒïlé ü 日本語 😀"]
    for k in ODD_KEYS:
        store.delete(k)
    assert keys(store) == []


BAD_KEYS = ["", "/abs", "a//b", "../up", "a/../b", "./a", "a/./b", "nul\x00byte"]


def test_invalid_keys_refused(store):
    for bad in BAD_KEYS:
        for call in (lambda: store.put(bad, b"x"), lambda: store.get(bad),
                     lambda: store.head(bad), lambda: store.delete(bad)):
            with pytest.raises(InvalidArgument):
                call()
    assert keys(store) == []


# --- threads -------------------------------------------------------------------------

def in_threads(fn, n: int) -> list[BaseException]:
    """Run ``fn(0)`` .. ``fn(n - 1)`` at once, one thread each; the errors they raised."""
    errors = []

    def run(t):
        try:
            fn(t)
        except Exception as exc:                      # pragma: no cover - reported
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(t,)) for t in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    return errors


def test_concurrent_puts(store):
    """The ingest pipeline puts chunks from a thread pool into one store."""
    def writer(t):
        for i in range(6):
            store.put(f"chunks/{t:02d}/{i}", bytes([t]) * (1000 * t + i))

    assert not in_threads(writer, 8)
    listed = list(store.list("chunks/"))
    assert len(listed) == 48
    for o in listed:
        t, i = (int(p) for p in o.key.split("/")[1:])
        assert o.size == 1000 * t + i
        assert store.get(o.key) == bytes([t]) * (1000 * t + i)


def test_puts_and_deletes_racing_in_one_folder(store):
    """Pins: readers' pins are put and deleted under ``pins/`` from many threads, and a
    delete that leaves a folder empty removes it. A put racing that must still land
    (it once failed with "File exists: .../pins" on a local store)."""
    def churn(t):
        for i in range(400):
            store.put(f"pins/{t}-{i}", b"x")
            store.delete(f"pins/{t}-{i}")

    errors = in_threads(churn, 3)
    assert not errors, errors[:3]
    assert list(store.list("pins/")) == []


def test_concurrent_puts_same_key(store):
    values = [bytes([v]) * 50_000 for v in range(6)]
    threads = [threading.Thread(target=store.put, args=("same", v)) for v in values]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert store.get("same") in values
    assert keys(store) == ["same"]


# --- replace (a manifest rewritten only while unchanged) ---------------------------

def test_replace_writes_only_over_the_expected_bytes(store):
    store.put("m", b"old")
    assert store.replace("m", b"new", expected=b"old") is True
    assert store.get("m") == b"new"
    # the object changed since it was read: refused, and the newer bytes stay
    assert store.replace("m", b"stale rewrite", expected=b"old") is False
    assert store.get("m") == b"new"


def test_replace_never_brings_back_a_deleted_object(store):
    store.put("m", b"old")
    store.delete("m")
    assert store.replace("m", b"new", expected=b"old") is False
    assert keys(store) == []


def test_replace_racing_puts_never_undoes_a_put(store):
    """Rewrites (same content, other coding) race with commits of new versions: every
    commit that returned is never overwritten by a rewrite of the version before it."""
    store.put("m", b"v0")
    stop = threading.Event()

    def rewrite():
        while not stop.is_set():
            cur = store.get("m")
            store.replace("m", cur + b"'", expected=cur)

    t = threading.Thread(target=rewrite)
    t.start()
    try:
        for i in range(1, 30):
            store.put("m", b"v%d" % i)
            got = store.get("m")
            # only a rewrite of this very version may have landed since
            assert got.rstrip(b"'") == b"v%d" % i
    finally:
        stop.set()
        t.join(timeout=60)


# --- FailingStore ------------------------------------------------------------------

def test_failing_store_fails_chosen_calls(tmp_path):
    inner = LocalStore(tmp_path)
    store = FailingStore(inner, fail_on={"put"}, times=2)
    with pytest.raises(StoreUnavailable, match="injected failure: put 'a'"):
        store.put("a", b"1")
    with pytest.raises(StoreUnavailable):
        store.put("b", b"2")
    store.put("c", b"3")                             # the third put works
    assert keys(inner) == ["c"]
    assert store.get("c") == b"3"
    assert store.failures["put"] == 2


def test_failing_store_prefix_after_and_error_kinds(tmp_path):
    inner = LocalStore(tmp_path)
    store = FailingStore(inner, fail_on={"put": PermissionError("no"), "get": None},
                         key_prefix="chunks/", after=1, error=NotFound)
    store.put("chunks/0", b"0")                      # the first matching put succeeds
    store.put("manifest", b"m")                      # other keys never fail
    for _ in range(3):                               # None: every later one fails
        with pytest.raises(PermissionError, match="no"):
            store.put("chunks/1", b"1")
    assert store.get("chunks/0") == b"0"             # after=1 counts gets separately
    with pytest.raises(NotFound, match="injected"):
        store.get("chunks/0")
    assert store.get("manifest") == b"m"
    assert keys(inner) == ["chunks/0", "manifest"]
    store.disarm()
    store.put("chunks/1", b"1")
    assert keys(store, "chunks/") == ["chunks/0", "chunks/1"]


def test_failing_store_applied_and_callable(tmp_path):
    inner = LocalStore(tmp_path)
    store = FailingStore(inner, fail_on={"put", "delete", "list", "head"}, applied=True,
                         error=lambda op, key: TimeoutError(f"{op}:{key}"))
    with pytest.raises(TimeoutError, match="put:k"):
        store.put("k", b"v")
    assert inner.get("k") == b"v"                    # the write happened anyway
    with pytest.raises(TimeoutError, match="head:k"):
        store.head("k")
    with pytest.raises(TimeoutError, match="list:"):
        store.list()
    with pytest.raises(TimeoutError, match="delete:k"):
        store.delete("k")
    assert not inner.exists("k")


def test_failing_store_threads_count_exactly(tmp_path):
    store = FailingStore(LocalStore(tmp_path), fail_on={"put"}, times=5,
                         error=S4Error("boom"))
    failed = []

    def writer(t):
        for i in range(10):
            try:
                store.put(f"{t}/{i}", b"x")
            except S4Error:
                failed.append((t, i))

    threads = [threading.Thread(target=writer, args=(t,)) for t in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(failed) == 5
    assert len(keys(store)) == 35


def test_failing_store_refuses_unknown_operations(tmp_path):
    with pytest.raises(InvalidArgument):
        FailingStore(LocalStore(tmp_path), fail_on={"rename"})
