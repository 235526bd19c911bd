"""Timestamps behave like a local disk mounted ``noatime`` (docs/SEMANTICS.md, Namespace).

What a user sees through a real FUSE mount: times set with ``utime`` come back to the
nanosecond (mtime and atime, also after a remount), a saved file and a new folder show
the time they were made, and the mount root shows when the store was created — never
1970. The core tests check that what older s4fs wrote (no nanosecond keys in manifests,
empty directory markers, a store marker without its creation time) still reads.
"""

from __future__ import annotations

import json
import os
import time

import pytest
import torch
import zstandard

from s4fs import keys, sealed
from s4fs.errors import CorruptManifest
from s4fs.fs import STORE_FORMAT, Filesystem, FsConfig
from s4fs.write import Entry, Journal
from s4fs.manifest import Manifest
from s4fs.stores import LocalStore, ObjectInfo

Y2000 = 946684800                       # 2000-01-01, seconds since the epoch
MTIME_NS = 1_700_000_000_987_654_321    # nanoseconds a float of seconds cannot hold
ATIME_NS = 1_600_000_000_123_456_789


def make_fs(root) -> Filesystem:
    return Filesystem(LocalStore(root), FsConfig(metadata_ttl=0.0, decoded_cache_bytes=0))


def put(fs: Filesystem, path: str, data: bytes) -> None:
    h = fs.open_write(path)
    h.write(0, data)
    h.flush()
    h.release()


def manifest_doc(store, path: str) -> dict:
    body = sealed.unseal(store.get(keys.file_key(path)), kind="manifest", where=path)
    return json.loads(zstandard.ZstdDecompressor().decompress(body))


def seal_doc(doc: dict) -> bytes:
    raw = json.dumps(doc, separators=(",", ":")).encode()
    return sealed.seal("manifest", zstandard.ZstdCompressor(level=3).compress(raw))


def near_now(seconds: float, before: float, slack: float = 5.0) -> bool:
    return before - slack <= seconds <= time.time() + slack


# --- the core, no FUSE ---------------------------------------------------------------

def test_utime_keeps_nanoseconds_and_an_explicit_atime(tmp_path):
    fs = make_fs(tmp_path)
    before = time.time()
    put(fs, "a.bin", b"x" * 1000)
    atime, mtime, ctime = fs.stat("a.bin").times_ns()
    assert atime == mtime and near_now(mtime / 1e9, before) and ctime >= mtime
    fs.set_attrs("a.bin", mtime_ns=MTIME_NS, atime_ns=ATIME_NS)
    fs.close()
    fs = make_fs(tmp_path)
    a = fs.stat("a.bin")
    assert a.times_ns()[:2] == (ATIME_NS, MTIME_NS)
    assert near_now(a.times_ns()[2] / 1e9, before)       # ctime: when utime changed it
    assert a.mtime == MTIME_NS / 1e9                      # seconds, for the Python API
    doc = manifest_doc(fs.store, "a.bin")                 # older readers find "mtime"
    assert doc["mtime"] == pytest.approx(MTIME_NS / 1e9) and doc["mtime_ns"] == MTIME_NS
    # a new version keeps the explicit atime (noatime), and gets a new mtime
    put(fs, "a.bin", b"y" * 1000)
    atime, mtime, _ = fs.stat("a.bin").times_ns()
    assert atime == ATIME_NS and near_now(mtime / 1e9, before)
    fs.close()


def test_a_manifest_of_an_older_s4fs_still_reads(tmp_path):
    """No "mtime_ns", "atime_ns", "ctime_ns": every time is the float mtime."""
    fs = make_fs(tmp_path)
    put(fs, "old.bin", b"z" * 5000)
    doc = manifest_doc(fs.store, "old.bin")
    assert {"mtime_ns", "ctime_ns"} <= set(doc)
    for k in ("mtime_ns", "atime_ns", "ctime_ns"):
        doc.pop(k, None)
    doc["mtime"] = 1712345678.25
    fs.store.put(keys.file_key("old.bin"), seal_doc(doc))
    a = fs.stat("old.bin")
    assert a.times_ns() == (1712345678250000000,) * 3 and a.mtime == 1712345678.25
    assert bytes(fs.open_read("old.bin").read(0, 6000)) == b"z" * 5000
    # rewriting it (chmod) keeps what it had and adds only what it learnt
    fs.set_attrs("old.bin", mode=0o600)
    doc = manifest_doc(fs.store, "old.bin")
    assert doc["mtime"] == 1712345678.25 and "mtime_ns" not in doc and "ctime_ns" in doc
    fs.close()


def test_optional_time_keys_are_checked():
    base = {"format": "s4fs-manifest", "version": 2, "size": 0, "xxh128": "", "mtime": 1.5,
            "mode": 0o100644, "kind": "raw", "packs": [], "streams": [], "extents": []}
    m = Manifest.from_bytes(seal_doc(base))
    assert (m.mtime_ns, m.atime_ns, m.ctime_ns) == (None, None, None)
    assert m.times_ns() == (1_500_000_000,) * 3
    m = Manifest.from_bytes(seal_doc({**base, "mtime_ns": -5, "atime_ns": 7}))
    assert m.times_ns() == (7, -5, -5)                    # before 1970 is a valid time
    for bad in (1.5, "1", True, 1 << 63, None):
        with pytest.raises(CorruptManifest, match="mtime_ns"):
            Manifest.from_bytes(seal_doc({**base, "mtime_ns": bad}))


def test_dir_marker_payloads():
    assert sealed.read_dir_marker(sealed.dir_marker(mtime_ns=5), "d") == {"mtime_ns": 5}
    assert sealed.dir_marker() == sealed.seal("dir", b"")         # what older s4fs wrote
    for older in (b"", sealed.seal("dir", b""), sealed.seal("dir", b"not json"),
                  sealed.seal("dir", b"[1]"), sealed.seal("dir", b'{"mtime_ns": 1.5}')):
        sealed.check_dir_marker(older, "d")
        assert sealed.read_dir_marker(older, "d") == {}
    with pytest.raises(CorruptManifest):
        sealed.read_dir_marker(sealed.dir_marker(mtime_ns=5)[:-1], "d")


def test_folders_and_root_show_real_times(tmp_path):
    before = time.time()
    fs = make_fs(tmp_path)
    root_ns = fs.stat("").times_ns()[1]
    assert near_now(root_ns / 1e9, before)
    fs.mkdir("made")
    put(fs, "f.bin", b"q")
    # a save through the Python API commits straight to a path: its folders get markers
    fs.commit("implicit/deep/f.bin", fs.manifest("f.bin"))
    for d in ("made", "implicit", "implicit/deep"):
        assert near_now(fs.stat(d).mtime, before), d
    fs.set_attrs("made", mtime_ns=MTIME_NS, atime_ns=ATIME_NS)
    fs.store.put(keys.dir_key("implicit"), b"")          # as an older s4fs wrote it
    fs.close()
    fs = make_fs(tmp_path)
    assert fs.stat("").times_ns()[1] == root_ns
    assert fs.stat("made").times_ns()[:2] == (ATIME_NS, MTIME_NS)
    assert fs.stat("implicit").times_ns() == (root_ns,) * 3
    fs.close()


class MarkerPutLongAgo(LocalStore):
    """A LocalStore whose store marker was put at ``MTIME_NS`` (as ``head`` reports)."""

    def head(self, key):
        info = super().head(key)
        if key == keys.ROOT_MARKER:
            return ObjectInfo(info.key, info.size, MTIME_NS / 1e9)
        return info


def test_a_store_of_an_older_s4fs_opens_and_its_root_shows_the_marker_time(tmp_path):
    store = MarkerPutLongAgo(tmp_path)
    legacy = json.dumps(STORE_FORMAT).encode()                # plain JSON, no created_ns
    store.put(keys.ROOT_MARKER, legacy)
    fs = Filesystem(store, FsConfig(metadata_ttl=0.0))
    fs.mkdir("d")
    fs.store.put(keys.dir_key("d"), b"")                     # a legacy folder marker
    assert abs(fs.stat("").times_ns()[1] - MTIME_NS) < 1000
    assert fs.stat("d").times_ns() == fs.stat("").times_ns()
    fs.close()
    assert store.get(keys.ROOT_MARKER) == legacy             # left as it was


def test_journal_entries_keep_nanoseconds_and_older_ones_still_read(tmp_path):
    j = Journal(str(tmp_path))
    j.record(Entry("a", str(tmp_path / "s1"), 0o100644, MTIME_NS / 1e9, 3, 1.0,
                   MTIME_NS, ATIME_NS))
    with open(tmp_path / "s2.json", "w") as f:            # an entry of an older s4fs
        json.dump({"version": 1, "path": "b", "spool": str(tmp_path / "s2"),
                   "mode": 0o100644, "mtime": 1.5, "size": 3, "accepted": 2.0}, f)
    got = {e.path: (e.mtime, e.mtime_ns, e.atime_ns) for e in j.entries()}
    assert got == {"a": (MTIME_NS / 1e9, MTIME_NS, ATIME_NS), "b": (1.5, None, None)}


# --- through a real FUSE mount -------------------------------------------------------

def ns3(p) -> tuple[int, int, int]:
    s = os.stat(p)
    return s.st_atime_ns, s.st_mtime_ns, s.st_ctime_ns


@pytest.mark.fuse
def test_utime_round_trips_to_the_nanosecond(mounted):
    before = time.time()
    p = os.path.join(mounted.path, "f.bin")
    with open(p, "wb") as f:
        f.write(os.urandom(100_000))
    os.utime(p, ns=(ATIME_NS, MTIME_NS))
    atime, mtime, ctime = ns3(p)
    assert (atime, mtime) == (ATIME_NS, MTIME_NS)
    assert near_now(ctime / 1e9, before)
    # set on an open file, before the close that commits it
    q = os.path.join(mounted.path, "g.bin")
    with open(q, "wb") as f:
        f.write(b"g" * 1000)
        os.utime(f.fileno(), ns=(ATIME_NS + 1, MTIME_NS + 1))
    assert ns3(q)[:2] == (ATIME_NS + 1, MTIME_NS + 1)
    mounted.sync()
    mounted.restart()
    assert ns3(p)[:2] == (ATIME_NS, MTIME_NS)
    assert ns3(q)[:2] == (ATIME_NS + 1, MTIME_NS + 1)
    # reading does not move the atime (noatime); setting the mtime alone keeps it
    with open(p, "rb") as f:
        f.read()
    os.utime(p, ns=(ns3(p)[0], MTIME_NS + 2))
    assert ns3(p)[:2] == (ATIME_NS, MTIME_NS + 2)


@pytest.mark.fuse
def test_a_saved_file_shows_the_time_it_was_saved(mounted):
    before = time.time()
    p = os.path.join(mounted.path, "ckpt.pt")
    torch.save({"w": torch.randn(1 << 18), "step": 3}, p)
    atime, mtime, ctime = ns3(p)
    assert near_now(mtime / 1e9, before) and atime == mtime and ctime >= mtime
    mounted.sync()
    assert ns3(p)[1] == mtime                 # committing does not move it
    mounted.restart()
    assert ns3(p)[1] == mtime


@pytest.mark.fuse
def test_root_and_new_folders_show_real_times(mounted):
    root = os.stat(mounted.path).st_mtime
    assert Y2000 < root <= time.time() + 1
    before = time.time()
    d = os.path.join(mounted.path, "run7")
    os.mkdir(d)
    made = os.stat(d).st_mtime_ns
    assert near_now(made / 1e9, before)
    with open(os.path.join(d, "x.bin"), "wb") as f:
        f.write(b"x")
    e = os.path.join(mounted.path, "stamped")
    os.mkdir(e)
    os.utime(e, ns=(ATIME_NS, MTIME_NS))
    mounted.sync()
    mounted.restart()
    assert os.stat(mounted.path).st_mtime == root
    assert os.stat(d).st_mtime_ns == made
    assert ns3(e)[:2] == (ATIME_NS, MTIME_NS)
