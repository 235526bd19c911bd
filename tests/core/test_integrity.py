"""Damaged metadata is an I/O error, never wrong bytes.

Every stored object that decides what a read returns — a file's manifest, a directory
marker, the store marker — carries a checksum checked on load (``s4fs.sealed``). These
tests flip every single bit of real stored objects, written through the core filesystem,
and check what the user sees: the exact original bytes, or an ``S4Error`` with errno EIO.
Damage is injected by wrapping the store (``DamagingStore``), not by patching internals.

``tests/fixtures/manifest-v1.bin`` is a golden version-1 manifest (a delta checkpoint),
written once by the s4fs that wrote version 1, before manifests were sealed, and never
regenerated: every later s4fs must still read it.
"""

from __future__ import annotations

import errno
import hashlib
import io
import json
import random
from pathlib import Path

import numpy as np
import pytest
import torch
import zstandard

from s4fs import keys, sealed
from s4fs.errors import CorruptManifest, NotFound, S4Error
from s4fs.fs import STORE_FORMAT, Filesystem, FsConfig
from s4fs.coding import IngestConfig
from s4fs.manifest import Manifest
from s4fs.stores import LocalStore, Store

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "manifest-v1.bin"
FIXTURE_SHA256 = "aa8fc5fa479c2aec39af9ca367dc687b50fbfb36682e122ff286ad771cd7800e"
PATH = "run/ckpt_1.pt"


class DamagingStore(Store):
    """Wrap ``inner``; ``get`` of a key in ``damaged`` returns those bytes instead."""

    def __init__(self, inner: Store) -> None:
        self.inner = inner
        self.url = inner.url
        self.damaged: dict[str, bytes] = {}

    def get(self, key, start=None, end=None) -> bytes:
        if key in self.damaged:
            return self.damaged[key][start or 0: end]
        return self.inner.get(key, start, end)

    def put(self, key, data) -> None:
        self.inner.put(key, data)

    def delete(self, key) -> None:
        self.inner.delete(key)

    def list(self, prefix: str = ""):
        return self.inner.list(prefix)

    def head(self, key):
        return self.inner.head(key)


def tbytes(obj) -> bytes:
    b = io.BytesIO()
    torch.save(obj, b)
    return b.getvalue()


def checkpoints(n: int = 2 << 20):
    """Two checkpoints (~10 MiB by default) of a drifting fp32 weight and a bf16 copy."""
    rng = np.random.default_rng(7)
    w = rng.standard_normal(n).astype(np.float32)
    out = []
    for step in range(2):
        t = torch.from_numpy(w.copy())
        out.append(tbytes({"w": t, "w16": t[: n // 2].to(torch.bfloat16), "step": step}))
        w = w + rng.standard_normal(w.size).astype(np.float32) * 1e-3 * (rng.random(w.size) < 0.2)
    return out


def make_fs(store: Store, chunk_size: int = 1 << 19, **kw) -> Filesystem:
    # metadata_ttl=0: every call loads the (possibly damaged) objects again;
    # no decoded-file cache: every read goes through the manifest to the store's chunks
    kw.setdefault("decoded_cache_bytes", 0)
    cfg = FsConfig(ingest=IngestConfig(chunk_size=chunk_size), metadata_ttl=0.0, **kw)
    return Filesystem(store, cfg)


def put(fs: Filesystem, path: str, data: bytes) -> None:
    h = fs.open_write(path)
    h.write(0, data)
    h.flush()
    h.release()


def read(fs: Filesystem, path: str, n: int) -> bytes:
    return bytes(fs.open_read(path).read(0, n + 1))


def write_store(root, n: int = 2 << 20, chunk_size: int = 1 << 19):
    """A store holding run/ckpt_0.pt and run/ckpt_1.pt (a delta of it); returns the
    bytes of run/ckpt_1.pt."""
    data = checkpoints(n)
    fs = make_fs(LocalStore(root), chunk_size, delta_direction="forward")
    fs.mkdir("run")
    for i, d in enumerate(data):
        put(fs, f"run/ckpt_{i}.pt", d)
    m = fs.manifest(PATH)
    assert m.base is not None and any(c.base is not None for s in m.streams for c in s.chunks)
    fs.close()
    return data[1]


@pytest.fixture(scope="module")
def written(tmp_path_factory):
    root = tmp_path_factory.mktemp("store")
    return root, write_store(root)


def flips(data: bytes):
    for bit in range(len(data) * 8):
        b = bytearray(data)
        b[bit >> 3] ^= 1 << (bit & 7)
        yield bit, bytes(b)


def outcome(action, want) -> str:
    """'same' if ``action()`` returns ``want``, 'eio' if it raises an EIO S4Error;
    anything else (wrong bytes, another error, a crash) fails the test."""
    try:
        got = action()
    except S4Error as exc:
        assert exc.errno == errno.EIO, f"{type(exc).__name__} with errno {exc.errno}: {exc}"
        return "eio"
    assert got == want, "a damaged object made the read return wrong bytes"
    return "same"


# --- bit flips of real stored objects ---------------------------------------------------

def test_every_bit_flip_of_a_stored_manifest_is_refused(written):
    root, original = written
    store = DamagingStore(LocalStore(root))
    fs = make_fs(store)
    key = keys.file_key(PATH)
    clean = store.get(key)
    assert 800 < len(clean) < 4000 and sealed.is_sealed(clean)
    assert read(fs, PATH, len(original)) == original
    seen = {"same": 0, "eio": 0}
    for bit, bad in flips(clean):
        store.damaged[key] = bad
        seen[outcome(lambda: read(fs, PATH, len(original)), original)] += 1
    # the checksum covers every byte, so every flip is caught when the manifest loads
    assert seen == {"same": 0, "eio": len(clean) * 8}
    store.damaged.clear()
    assert read(fs, PATH, len(original)) == original
    fs.close()


def test_a_damaged_manifest_names_the_object_and_the_remedy(written):
    root, _ = written
    store = DamagingStore(LocalStore(root))
    fs = make_fs(store)
    key = keys.file_key(PATH)
    bad = bytearray(store.get(key))
    bad[len(bad) // 2] ^= 0x10
    store.damaged[key] = bytes(bad)
    with pytest.raises(CorruptManifest) as info:
        fs.open_read(PATH)
    msg = str(info.value)
    assert PATH in msg and "checksum" in msg and "restore" in msg
    assert info.value.errno == errno.EIO
    fs.close()


def test_every_bit_flip_of_a_directory_marker_is_refused(written):
    root, original = written
    store = DamagingStore(LocalStore(root))
    fs = make_fs(store)
    key = keys.dir_key("run")
    clean = store.get(key)
    assert sealed.is_sealed(clean)

    def look():
        a = fs.stat("run")
        return a.is_dir, fs.listdir("run"), read(fs, PATH, len(original))

    want = (True, ["ckpt_0.pt", "ckpt_1.pt"], original)
    assert look() == want
    seen = {"same": 0, "eio": 0}
    for bit, bad in flips(clean):
        store.damaged[key] = bad
        seen[outcome(look, want)] += 1
    assert seen == {"same": 0, "eio": len(clean) * 8}
    fs.close()


def test_every_bit_flip_of_the_store_marker_is_refused(written, tmp_path):
    root, original = written
    store = DamagingStore(LocalStore(root))
    clean = store.get(keys.ROOT_MARKER)
    assert sealed.is_sealed(clean)

    def mount():
        fs = make_fs(store, cache_dir=str(tmp_path))
        try:
            return read(fs, PATH, len(original))
        finally:
            fs.close()

    seen = {"same": 0, "eio": 0}
    for bit, bad in flips(clean):
        store.damaged[keys.ROOT_MARKER] = bad
        seen[outcome(mount, original)] += 1
    assert seen == {"same": 0, "eio": len(clean) * 8}


def test_every_bit_flip_of_a_legacy_store_marker_is_refused(written, tmp_path):
    root, original = written
    store = DamagingStore(LocalStore(root))
    legacy = json.dumps({"format": "s4fs-store", "version": 1}).encode()   # what v1 wrote
    assert sealed.read_store_marker(legacy, "legacy marker") == {"format": "s4fs-store",
                                                                 "version": 1}

    def mount():
        fs = make_fs(store, cache_dir=str(tmp_path))
        try:
            return read(fs, PATH, len(original))
        finally:
            fs.close()

    seen = {"same": 0, "eio": 0}
    for bit, bad in flips(legacy):
        store.damaged[keys.ROOT_MARKER] = bad
        seen[outcome(mount, original)] += 1
    # plain JSON has no checksum, but the one document legacy s4fs wrote is accepted
    # exactly, and no single flip of it parses as that document
    assert seen == {"same": 0, "eio": len(legacy) * 8}


def test_checksummed_but_inconsistent_manifests_never_give_wrong_bytes(tmp_path):
    """A manifest damaged *before* it was sealed (a bug) passes the checksum; the
    consistency checks and the chunk checksums must still stop every wrong read. Each
    integer of the document is changed in turn, and the document is sealed again.
    (A smaller checkpoint: many of these manifests load, and each is then read whole.)"""
    original = write_store(tmp_path, n=1 << 17, chunk_size=1 << 15)
    store = DamagingStore(LocalStore(tmp_path))
    # no decoded-chunk cache: every read fetches, decodes and checks its chunks
    fs = make_fs(store, 1 << 15, cache_bytes=0)
    key = keys.file_key(PATH)
    doc = unseal_doc(store.get(key))

    def ints(node, path=()):
        if isinstance(node, dict):
            for k, v in node.items():
                yield from ints(v, path + (k,))
        elif isinstance(node, list):
            for i, v in enumerate(node):
                yield from ints(v, path + (i,))
        elif type(node) is int:
            yield path, node

    rng = random.Random(0)
    seen = {"same": 0, "eio": 0}
    for path, value in ints(doc):
        for new in {value + 1, value - 1, value ^ (1 << rng.randrange(8)), -1, 0}:
            if new == value:
                continue
            bad = json.loads(json.dumps(doc))
            node = bad
            for p in path[:-1]:
                node = node[p]
            node[path[-1]] = new
            store.damaged[key] = seal_doc(bad)
            seen[outcome(lambda: read(fs, PATH, len(original)), original)] += 1
    print(seen)
    assert seen["eio"] > 0 and seen["same"] > 0, seen   # e.g. a changed mode is harmless
    fs.close()


# --- compatibility: version 1 and stores written before sealing --------------------------

def test_golden_v1_manifest_still_loads():
    data = FIXTURE.read_bytes()
    assert hashlib.sha256(data).hexdigest() == FIXTURE_SHA256, \
        "the golden v1 manifest was changed: golden fixtures are never regenerated"
    m = Manifest.from_bytes(data, where=str(FIXTURE))
    assert (m.size, m.kind, m.xxh128) == (264161, "torch-zip",
                                          "215ebe6b25592d7037e42756e9409bf8")
    assert [(s.kind, s.dtype, s.name) for s in m.streams] == [
        ("raw", "bytes", None), ("tensor", "float32", "data/0"),
        ("tensor", "bfloat16", "data/1"), ("tensor", "float32", "data/2")]
    assert m.extents == [(0, 896, 0, 0), (896, 131072, 1, 0), (131968, 64, 0, 896),
                         (132032, 65536, 2, 0), (197568, 64, 0, 960),
                         (197632, 65536, 3, 0), (263168, 993, 0, 1024)]
    assert m.names == {"data/0": "w", "data/1": "w16", "data/2": "frozen"}
    assert m.base == {"path": "run/ckpt_0.pt", "id": "22a5ca2db794469887859468d30869a8"}
    assert m.own_packs == ["packs/828d69d962de44d89ecb367f5521bd8e"]
    c = m.streams[1].chunks[0]
    assert (c.pack, c.offset, c.stored, c.raw, c.checksum, c.depth) == (
        "packs/828d69d962de44d89ecb367f5521bd8e", 0, 7567, 32768, 10235535700209070402, 1)
    assert (c.base.pack, c.base.offset, c.base.checksum, c.base.depth) == (
        "packs/416aae1bdb1c4a22b047ca9d73a96f23", 0, 14636522176520896411, 0)
    frozen = m.streams[3].chunks
    assert all(r.base is None and r.pack != m.own_packs[0] for r in frozen)  # reused base
    # written again it is version 2, sealed, and reads back the same
    again = m.to_bytes()
    assert sealed.is_sealed(again)
    assert unseal_doc(again) == {**v1_doc(data), "version": 2}
    m2 = Manifest.from_bytes(again)
    assert (m2.extents, m2.streams, m2.own_packs, m2.base) == (m.extents, m.streams,
                                                               m.own_packs, m.base)


def test_v1_manifest_with_trailing_or_missing_bytes_is_refused():
    data = FIXTURE.read_bytes()
    for bad in (data + b"\0", data[:-1], data[:4]):
        with pytest.raises(CorruptManifest):
            Manifest.from_bytes(bad)


def test_a_store_written_before_sealing_still_reads(written, tmp_path):
    """Legacy forms of all three objects: v1 manifests, empty directory markers, plain
    JSON store marker."""
    import shutil
    root, original = written
    old = tmp_path / "old"
    shutil.copytree(root, old)
    store = LocalStore(old)
    for obj in list(store.list(keys.FILES)):
        doc = unseal_doc(store.get(obj.key))
        doc["version"] = 1
        store.put(obj.key, b"S4MF" + zstandard.ZstdCompressor(level=3).compress(
            json.dumps(doc, separators=(",", ":")).encode()))
    store.put(keys.dir_key("run"), b"")
    store.put(keys.ROOT_MARKER, json.dumps(STORE_FORMAT).encode())
    fs = make_fs(store)
    assert fs.stat("run").is_dir and fs.listdir("run") == ["ckpt_0.pt", "ckpt_1.pt"]
    assert read(fs, PATH, len(original)) == original
    fs.close()


# --- versions ---------------------------------------------------------------------------

def test_a_newer_manifest_version_is_refused_with_upgrade_advice():
    doc = v1_doc(FIXTURE.read_bytes())
    doc["version"] = 3
    for data in (seal_doc(doc), b"S4MF" + zstandard.ZstdCompressor().compress(
            json.dumps(doc).encode())):
        with pytest.raises(CorruptManifest, match="version 3.*upgrade s4fs") as info:
            Manifest.from_bytes(data, where="manifest of 'x'")
        assert info.value.errno == errno.EIO


def test_a_newer_envelope_is_refused_with_upgrade_advice():
    data = bytearray(Manifest.from_bytes(FIXTURE.read_bytes()).to_bytes())
    data[4] = sealed.MAJOR + 1
    with pytest.raises(CorruptManifest, match="newer s4fs.*upgrade s4fs"):
        Manifest.from_bytes(bytes(data))


def test_a_version_that_does_not_match_its_container_is_refused():
    doc = v1_doc(FIXTURE.read_bytes())
    doc["version"] = 2                          # version 2 is always sealed
    with pytest.raises(CorruptManifest, match="container"):
        Manifest.from_bytes(b"S4MF" + zstandard.ZstdCompressor().compress(
            json.dumps(doc).encode()))
    doc["version"] = 1
    with pytest.raises(CorruptManifest, match="container"):
        Manifest.from_bytes(seal_doc(doc))


def test_a_newer_store_is_refused_with_upgrade_advice(tmp_path):
    store = LocalStore(tmp_path)
    store.put(keys.ROOT_MARKER, sealed.store_marker({"format": "s4fs-store", "version": 9}))
    with pytest.raises(S4Error, match="upgrade s4fs") as info:
        Filesystem(store)
    assert info.value.errno == errno.EIO


# --- the envelope -----------------------------------------------------------------------

def test_seal_round_trip_and_refusals():
    blob = sealed.seal("manifest", b"payload")
    assert sealed.unseal(blob, kind="manifest", where="x") == b"payload"
    assert sealed.unseal(sealed.seal("dir", b""), kind="dir", where="x") == b""
    cases = {
        "wrong magic": b"XXXX" + blob[4:],
        "truncated": blob[:-1],
        "trailing": blob + b"\0",
        "header": blob[:20],
        "kind": sealed.seal("dir", b"payload"),
    }
    for why, bad in cases.items():
        with pytest.raises(CorruptManifest, match="manifest of 'f'") as info:
            sealed.unseal(bad, kind="manifest", where="manifest of 'f'")
        assert info.value.errno == errno.EIO, why


def test_dir_markers():
    sealed.check_dir_marker(sealed.dir_marker(), "d")
    sealed.check_dir_marker(b"", "d")                         # legacy: empty object
    for bad in (b"x", b"{}", sealed.seal("store", b""), sealed.dir_marker()[:-1]):
        with pytest.raises(CorruptManifest):
            sealed.check_dir_marker(bad, "d")


def test_store_markers():
    doc = {"format": "s4fs-store", "version": 1}
    assert sealed.read_store_marker(sealed.store_marker(doc), "m") == doc
    assert sealed.read_store_marker(b'{"version":1,"format":"s4fs-store"}', "m") == doc
    for bad in (b'{"format": "s4fs-store", "version": 2}',     # legacy only ever wrote 1
                b'{"format": "s4fs-store"}', b'{"format": "s4fs-store", "version": 1, "x": 0}',
                b'[1]', b'not json', b'', sealed.seal("store", b"[]"),
                sealed.seal("dir", json.dumps(doc).encode())):
        with pytest.raises(CorruptManifest):
            sealed.read_store_marker(bad, "m")


# --- consistency checks -----------------------------------------------------------------

def _edit(path, value):
    def apply(doc):
        node = doc
        for p in path[:-1]:
            node = node[p]
        node[path[-1]] = value
    return apply


@pytest.mark.parametrize("edit, why", [
    (_edit(("streams", 1, "chunks", 0, "p"), -1), "pack index"),     # Python would accept it
    (_edit(("streams", 1, "chunks", 0, "p"), 2), "pack index"),
    (_edit(("streams", 1, "chunks", 0, "b", "p"), 5), "pack index"),
    (_edit(("streams", 1, "chunks", 0, "r"), 0), "raw length"),
    (_edit(("streams", 1, "chunks", 0, "r"), 32769), "base of another length"),
    (_edit(("streams", 3, "chunks", 1, "r"), 32767), "runs past the end of stream 3"),
    (_edit(("streams", 1, "chunks", 0, "d"), 2), "depth"),
    (_edit(("streams", 1, "chunks", 0, "b", "p"), 0), "disagree"),     # its own base
    (_edit(("streams", 2, "chunks", 1, "o"), 0), "disagree"),          # two blobs at one key
    (_edit(("streams", 1, "chunks", 0, "h"), 1 << 64), "checksum"),
    (_edit(("streams", 1, "chunks", 0, "o"), True), "offset"),
    (_edit(("extents", 1, 2), 4), "stream index"),
    (_edit(("extents", 1, 2), -1), "stream index"),
    (_edit(("extents", 3, 2), 3), "maps stream 3"),
    (_edit(("extents", 1, 0), 895), "starts at"),
    (_edit(("extents", 2, 3), 0), "maps stream 0"),
    (_edit(("extents", 6, 1), 994), "runs past the end"),
    (_edit(("extents", 6), [263168, 993, 0]), "extent 6"),
    (_edit(("size",), 264162), "cover"),
    (_edit(("own",), 3), "own"),
    (_edit(("packs", 1), 7), "pack key"),
    (_edit(("streams", 0, "kind"), "zip"), "kind"),
    (lambda doc: doc["extents"].pop(), "cover"),
    (lambda doc: doc["streams"][2]["chunks"].pop(), "runs past the end of stream 2"),
    (lambda doc: doc["streams"][2]["chunks"].append(doc["streams"][2]["chunks"][0]),
     "stream 2 holds 98304 bytes of chunks but extents use 65536"),
    (lambda doc: doc.pop("streams"), "streams"),
])
def test_inconsistent_manifests_are_refused(edit, why):
    doc = v1_doc(FIXTURE.read_bytes())
    doc["version"] = 2
    edit(doc)
    with pytest.raises(CorruptManifest, match="inconsistent") as info:
        Manifest.from_bytes(seal_doc(doc), where="manifest of 'f'")
    assert why in str(info.value) and info.value.errno == errno.EIO


def test_an_inconsistent_manifest_is_never_written():
    m = Manifest.from_bytes(FIXTURE.read_bytes())
    m.extents[1] = (896, 131072, 2, 0)
    with pytest.raises(CorruptManifest, match="internal error"):
        m.to_bytes()


def test_missing_manifest_is_still_not_found(tmp_path):
    fs = make_fs(LocalStore(tmp_path))
    with pytest.raises(NotFound):
        fs.open_read("nope.pt")
    fs.close()


# --- helpers ----------------------------------------------------------------------------

def v1_doc(data: bytes) -> dict:
    assert data[:4] == b"S4MF"
    return json.loads(zstandard.ZstdDecompressor().decompress(data[4:]))


def unseal_doc(data: bytes) -> dict:
    body = sealed.unseal(data, kind="manifest", where="test")
    return json.loads(zstandard.ZstdDecompressor().decompress(body))


def seal_doc(doc: dict) -> bytes:
    raw = json.dumps(doc, separators=(",", ":")).encode()
    return sealed.seal("manifest", zstandard.ZstdCompressor(level=3).compress(raw))
