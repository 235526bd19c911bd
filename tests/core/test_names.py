"""Names at the edges: every name a local disk accepts works, on LocalStore and through a
real FUSE mount, and a name past NAME_MAX (255 bytes) fails with ENAMETOOLONG.

LocalStore keeps its own files (temp files, the layout marker, hashed long names) in a
namespace no user name reaches, so names that look like them (``.tmp-x``, ``x.s4o``,
``%2E``, ``.L<hex>.s4o``) are ordinary names. Stores written before that layout (the
identity mapping ``<key>.s4o``, no ``.s4fs-layout``) keep reading.
"""

from __future__ import annotations

import errno
import json
import os
import subprocess

import pytest

from s4fs.errors import InvalidArgument, NotFound, StoreError
from s4fs.stores import LocalStore
from s4fs.stores.base import NameTooLong

# --- names -------------------------------------------------------------------------

LONGEST = {                                  # exactly 255 bytes each
    "ascii": "a" * 255,
    "utf8": "é" * 127 + "a",
    "emoji": "😀" * 63 + "abc",
    "dot": "." + "d" * 254,                  # a leading '.' is escaped: 257 bytes escaped
    "pct": "%" * 255,                        # '%' is escaped: 765 bytes escaped
    "suffix": "s" * 251 + ".s4o",            # ends in the object suffix
}

LOOKALIKES = [                               # names that look like LocalStore's own
    ".tmp-x", ".tmp-", ".tmp-abc.part", "x.s4o", ".s4o", "model.s4o", "x.s4o.s4o",
    ".s4fs-layout", ".L" + "0" * 64 + ".s4o", ".D" + "0" * 64, ".L", ".D",
    "%", "%%", "%25", "%2525", "%2E", "%2e", "%2Es4o", "x%2Es4o", "%2Etmp-x", "a%2",
    ".hidden", "..x", "...", "-", " lead space", "trail space ",
]

UNDECODABLE = os.fsdecode(b"raw-\xff\xfe-bytes")   # what FUSE hands over for non-UTF-8

NAMES = sorted(set(LONGEST.values()) | set(LOOKALIKES) | {UNDECODABLE, "plain.pt"})


def escapes_of(name: str) -> list[str]:
    """``name`` and names a naive escaping would confuse it with."""
    return [name, name.replace("%", "%25"), name.replace(".", "%2E"),
            name.replace("%", "%2525"), "%2E" + name.lstrip(".")]


@pytest.fixture
def store(tmp_path):
    s = LocalStore(tmp_path / "store")
    yield s
    s.close()


def keys(store, prefix=""):
    return [o.key for o in store.list(prefix)]


def prefixes(key: str):
    """Every prefix of ``key`` that cuts at or inside a component (bounded)."""
    out = {""}
    parts = key.split("/")
    for i in range(len(parts)):
        head = "/".join(parts[:i])
        head = head + "/" if head else ""
        c = parts[i]
        out.update(head + c[:cut] for cut in {0, 1, 2, len(c) // 2, len(c) - 1, len(c)})
        if i < len(parts) - 1:
            out.add(head + c + "/")
    return out


# --- LocalStore ----------------------------------------------------------------------

def test_every_name_round_trips_as_object(store):
    written = {}
    for n, name in enumerate(NAMES):
        for key in (f"files/{name}", f"dirs/{name}", f"files/sub/{name}"):
            data = key.encode("utf-8", "surrogateescape") + bytes([n])
            store.put(key, data)
            written[key] = data
    assert keys(store) == sorted(written)
    for key, data in written.items():
        assert store.get(key) == data, key
        assert store.get(key, 3, 9) == data[3:9], key
        assert store.head(key).size == len(data), key
    assert {o.key: o.size for o in store.list()} == {k: len(v) for k, v in written.items()}
    for key in written:
        store.delete(key)
    assert keys(store) == []


def test_every_name_works_as_folder_next_to_the_same_name(store):
    """``a``, ``a/x``, ``a.s4o`` and ``a.s4o/x`` are four keys, for every name a."""
    written = set()
    for name in NAMES:
        for key in (f"f/{name}", f"f/{name}/inner", f"f/{name}.s4o",
                    f"f/{name}.s4o/inner"):
            if len(key.split("/")[1].encode("utf-8", "surrogateescape")) > 255:
                continue                      # name + ".s4o" would pass NAME_MAX
            store.put(key, key.encode("utf-8", "surrogateescape"))
            written.add(key)
    assert len(written) > 3 * len(NAMES)
    assert keys(store) == sorted(written)
    for key in written:
        assert store.get(key) == key.encode("utf-8", "surrogateescape")
    for key in written:
        store.delete(key)
    assert keys(store) == []
    # every folder pruned: left are the layout marker and the lock puts take
    assert sorted(os.listdir(store.root)) == [".s4fs-layout", ".s4fs-lock"]


def test_model_file_and_model_s4o_folder(store):
    store.put("files/model", b"file")
    store.put("files/model.s4o/inner", b"folder")
    store.put("dirs/model.s4o", b"")
    assert store.get("files/model") == b"file"
    assert store.get("files/model.s4o/inner") == b"folder"
    assert keys(store, "files/model") == ["files/model", "files/model.s4o/inner"]
    assert keys(store, "files/model.s4o/") == ["files/model.s4o/inner"]
    with pytest.raises(NotFound):
        store.get("files/model.s4o")


def test_escapes_of_names_stay_distinct(store):
    written = {}
    for name in ("%", ".x", "..x", "x.s4o", "%2E", "a.b%c", ".s4o"):
        for i, variant in enumerate(escapes_of(name)):
            for key in (f"k/{variant}", f"k/{variant}/in"):
                written[key] = f"{name}:{i}:{key}".encode()
    for key, data in written.items():
        store.put(key, data)
    assert keys(store) == sorted(written)
    assert {k: store.get(k) for k in written} == written


def test_listing_any_prefix_gives_back_exactly_the_keys(store):
    written = [f"files/{n}" for n in NAMES]
    written += [f"files/{n}/{m}" for n in LONGEST.values() for m in LONGEST.values()]
    written += [f"files/{n}/deeper/leaf" for n in (".tmp-x", "x.s4o", "%" * 255)]
    for key in written:
        store.put(key, key.encode("utf-8", "surrogateescape"))
    wrong = {}
    for prefix in sorted(set().union(*(prefixes(k) for k in written))):
        expected = sorted(k for k in written if k.startswith(prefix))
        got = keys(store, prefix)
        if got != expected:
            wrong[prefix] = (got, expected)
    assert wrong == {}


def test_name_max_is_the_limit(store):
    fits = [f"files/{n}" for n in LONGEST.values()]
    for key in fits:
        store.put(key, b"ok")
    for name in ("a" * 256, "é" * 128, "😀" * 64, "a" * 1000):
        for key in (f"files/{name}", f"files/{name}/x", f"{name}/y"):
            for call, args in ((store.put, (key, b"x")), (store.get, (key,)),
                               (store.head, (key,)), (store.delete, (key,))):
                with pytest.raises(NameTooLong, match="at most 255 bytes") as info:
                    call(*args)
                assert info.value.errno == errno.ENAMETOOLONG
                assert isinstance(info.value, OSError)
        assert keys(store, f"files/{name}/") == []
    assert keys(store) == sorted(fits)


def test_invalid_unicode_is_refused(store):
    with pytest.raises(InvalidArgument):
        store.put("files/lone-\ud800-surrogate", b"x")


def test_crash_leftovers_are_not_listed_but_dot_tmp_names_are(store):
    store.put("files/.tmp-x", b"user file")
    store.put("files/keep", b"k")
    folder = store.root / "files"
    (folder / ".tmp-abc123.part").write_bytes(b"a put that never finished")
    (folder / ".tmp-old.s4o").write_bytes(b"leftover")
    assert keys(store) == ["files/.tmp-x", "files/keep"]
    assert store.get("files/.tmp-x") == b"user file"


def test_a_new_store_records_its_layout(tmp_path):
    root = tmp_path / "new"
    LocalStore(root).put("files/a%b", b"1")
    doc = json.loads((root / ".s4fs-layout").read_bytes())
    assert doc["version"] == 1
    again = LocalStore(root)                       # a second mount of the same folder
    assert keys(again) == ["files/a%b"] and again.get("files/a%b") == b"1"


def test_a_store_from_a_newer_s4fs_is_refused_with_advice(tmp_path):
    root = tmp_path / "newer"
    root.mkdir()
    (root / ".s4fs-layout").write_text('{"version": 2}')
    with pytest.raises(StoreError, match="upgrade s4fs"):
        LocalStore(root).get("files/a%b")


def test_probing_a_folder_writes_nothing(tmp_path):
    d = tmp_path / "somewhere"
    d.mkdir()
    (d / "notes.txt").write_text("mine")
    s = LocalStore(d)
    assert not s.exists("s4fs-store.json")
    assert keys(s) == []
    assert os.listdir(d) == ["notes.txt"]


def legacy_root(tmp_path):
    """A store folder as LocalStore wrote it before layout 1: ``<root>/<key>.s4o``."""
    root = tmp_path / "legacy"
    objects = {
        "s4fs-store.json": b'{"format": 1}',
        "files/run/ckpt%25.pt": b"pct",
        "files/.hidden": b"hidden",
        "files/model": b"model",
        "files/x.s4o/in": b"in",
        "dirs/run": b"",
        "packs/" + "ab" * 16: b"pack",
    }
    for key, data in objects.items():
        path = root / (key + ".s4o")
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
    (root / "files" / ".tmp-x1.part").write_bytes(b"in flight")
    return root, objects


def test_a_legacy_store_still_reads(tmp_path):
    root, objects = legacy_root(tmp_path)
    s = LocalStore(root)
    assert keys(s) == sorted(objects)
    for key, data in objects.items():
        assert s.get(key) == data and s.head(key).size == len(data)
    assert keys(s, "files/run/") == ["files/run/ckpt%25.pt"]
    # it keeps its layout: new objects go where the old layout puts them
    s.put("files/new%", b"n")
    assert (root / "files" / "new%.s4o").read_bytes() == b"n"
    assert not (root / ".s4fs-layout").exists()
    assert LocalStore(root).get("files/new%") == b"n"
    s.delete("files/run/ckpt%25.pt")
    assert not (root / "files" / "run").exists()
    with pytest.raises(NameTooLong):
        s.put("files/" + "a" * 256, b"x")


def test_ordinary_keys_are_the_same_file_in_both_layouts(tmp_path):
    """Most keys map to ``<key>.s4o`` in layout 1 too, so an old store is read right."""
    s = LocalStore(tmp_path / "s")
    for key in ("s4fs-store.json", "files/run/ckpt_100.pt", "dirs/run", "packs/00ff"):
        s.put(key, b"x")
        assert (tmp_path / "s" / (key + ".s4o")).read_bytes() == b"x"


# --- through the mount ---------------------------------------------------------------

def fuse_test(fn):
    return pytest.mark.fuse(pytest.mark.timeout(180)(fn))


def tree(root) -> dict:
    """{relative path: bytes, or None for a folder} of everything under ``root``."""
    out = {}
    root = os.fsencode(root)
    for dirpath, dirnames, filenames in os.walk(root):
        rel = os.path.relpath(dirpath, root)
        for d in dirnames:
            out[os.path.normpath(os.path.join(rel, d))] = None
        for f in filenames:
            with open(os.path.join(dirpath, f), "rb") as fh:
                out[os.path.normpath(os.path.join(rel, f))] = fh.read()
    return out


def same_ops(roots, op):
    """Run ``op(root)`` on each root; the errno each raised (None if none) must agree."""
    seen = []
    for r in roots:
        try:
            op(r)
            seen.append(None)
        except OSError as exc:
            seen.append(exc.errno)
    assert len(set(seen)) == 1, f"local vs mount: {seen}"
    return seen[0]


def write(path, data: bytes):
    with open(path, "wb") as f:
        f.write(data)


def read(*parts) -> bytes:
    with open(os.path.join(*parts), "rb") as f:
        return f.read()


def j(root, *names) -> bytes:
    return os.path.join(os.fsencode(root), *(os.fsencode(n) for n in names))


@fuse_test
def test_mount_names_match_a_local_folder(mount_factory, tmp_path):
    m = mount_factory()
    local = tmp_path / "local"
    local.mkdir()
    roots = (str(local), m.path)
    for n, name in enumerate(NAMES):
        data = f"{n}:{name!r}".encode()
        same_ops(roots, lambda r, name=name, data=data: write(j(r, name), data))
    assert sorted(os.listdir(os.fsencode(m.path))) == sorted(os.listdir(os.fsencode(local)))
    assert tree(m.path) == tree(local)
    same_ops(roots, lambda r: os.mkdir(j(r, "moved")))
    for name in NAMES:                                   # rename each to another odd name
        new = (name[:-1] if len(name.encode("utf-8", "surrogateescape")) >= 250
               else name + ".s4o")
        same_ops(roots, lambda r, a=name, b=new: os.rename(j(r, a), j(r, "moved", b)))
    assert tree(m.path) == tree(local)
    m.restart()                                          # it was all in the store
    assert tree(m.path) == tree(local)
    for name in os.listdir(j(local, "moved")):
        same_ops(roots, lambda r, name=name: os.remove(j(r, "moved", name)))
    same_ops(roots, lambda r: os.rmdir(j(r, "moved")))
    assert os.listdir(m.path) == [] == os.listdir(local)


@fuse_test
def test_mount_folders_with_every_name(mount_factory, tmp_path):
    m = mount_factory()
    local = tmp_path / "local"
    local.mkdir()
    roots = (str(local), m.path)
    emoji = LONGEST["emoji"]
    for name in NAMES:
        data = name.encode("utf-8", "surrogateescape")
        same_ops(roots, lambda r, name=name: os.mkdir(j(r, name)))
        same_ops(roots, lambda r, name=name, data=data: write(j(r, name, emoji), data))
        same_ops(roots, lambda r, name=name: write(j(r, name, ".tmp-x"), b"t"))
    assert tree(m.path) == tree(local)
    m.restart()
    assert tree(m.path) == tree(local)
    for name in NAMES:
        same_ops(roots, lambda r, name=name: os.remove(j(r, name, ".tmp-x")))
        same_ops(roots, lambda r, name=name: os.rename(j(r, name, emoji), j(r, name, "e")))
    assert tree(m.path) == tree(local)


@fuse_test
def test_mount_name_past_name_max_is_enametoolong(mount_factory, tmp_path):
    m = mount_factory()
    local = tmp_path / "local"
    local.mkdir()
    roots = (str(local), m.path)
    same_ops(roots, lambda r: write(j(r, "ok"), b"ok"))
    for name in ("a" * 256, "é" * 128, "😀" * 64, "b" * 300):
        for op in (lambda r, name=name: write(j(r, name), b"x"),
                   lambda r, name=name: os.mkdir(j(r, name)),
                   lambda r, name=name: os.stat(j(r, name)),
                   lambda r, name=name: os.rename(j(r, "ok"), j(r, name))):
            assert same_ops(roots, op) == errno.ENAMETOOLONG
    assert tree(m.path) == tree(local) == {b"ok": b"ok"}


@fuse_test
def test_mount_ls_shows_dot_tmp_files(mount_factory):
    m = mount_factory()
    for name in (".tmp-x", ".tmp-abc.part", "visible"):
        write(os.path.join(m.path, name), name.encode())
    ls = subprocess.run(["ls", "-A", m.path], capture_output=True, text=True,
                        check=True, timeout=60).stdout.split()
    assert sorted(ls) == [".tmp-abc.part", ".tmp-x", "visible"]
    assert read(m.path, ".tmp-x") == b".tmp-x"


@fuse_test
def test_mount_model_file_and_model_s4o_folder(mount_factory):
    m = mount_factory()
    p = m.path
    write(os.path.join(p, "model"), b"the file")
    os.makedirs(os.path.join(p, "model.s4o", "inner"))
    write(os.path.join(p, "model.s4o", "inner", "w.bin"), b"in the folder")
    os.mkdir(os.path.join(p, "x.s4o"))                   # the other order
    write(os.path.join(p, "x"), b"x file")
    m.restart()
    assert sorted(os.listdir(p)) == ["model", "model.s4o", "x", "x.s4o"]
    assert read(p, "model") == b"the file"
    assert read(p, "model.s4o", "inner", "w.bin") == b"in the folder"
    assert read(p, "x") == b"x file"
    assert os.path.isdir(os.path.join(p, "x.s4o"))
    assert os.listdir(os.path.join(p, "x.s4o")) == []


@pytest.mark.s3
def test_s3_key_past_1024_bytes_is_enametoolong(make_s3_store):
    import errno as _errno
    store = make_s3_store("p")
    ok = "files/" + "/".join(["a" * 200] * 4)                 # under the limit: works
    store.put(ok, b"x")
    assert store.get(ok) == b"x"
    with pytest.raises(OSError) as err:
        store.put("files/" + "/".join(["b" * 250] * 5), b"x")
    assert err.value.errno == _errno.ENAMETOOLONG


def test_a_listing_shows_a_file_another_mount_just_created(tmp_path):
    """Two filesystems on one store (two nodes): the second looked the name up before
    the first created it (it remembers "no such file" for a second), then lists the
    folder: every name the listing holds can be looked up at once, with its bytes."""
    from s4fs.fs import Filesystem
    store = str(tmp_path / "st")
    a, b = Filesystem(LocalStore(store)), Filesystem(LocalStore(store))
    data = b"written on node a"
    try:
        assert not b.exists(".metadata")
        h = a.open_write(".metadata")
        h.write(0, data)
        h.flush()
        h.release()
        assert ".metadata" in b.listdir("")
        assert b.stat(".metadata").size == len(data)
        r = b.open_read(".metadata")
        try:
            assert r.read(0, len(data)) == data
        finally:
            r.release()
    finally:
        a.close()
        b.close()

