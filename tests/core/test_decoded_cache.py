"""The decoded cache hands a version's local copy over to a save (FUSE passthrough: the
kernel already holds that very file for readers) only if the entry is still that file."""

from __future__ import annotations

import os

from s4fs.read.decoded import DecodedCache


def ino(path: str) -> tuple[int, int]:
    st = os.stat(path)
    return st.st_dev, st.st_ino


def keep(cache: DecodedCache, tmp_path, vid: str, data: bytes) -> None:
    src = tmp_path / f"spool-{vid}"
    src.write_bytes(data)
    assert cache.adopt_file(vid, str(src), len(data))


def test_take_moves_the_very_file_out_of_the_cache(tmp_path):
    cache = DecodedCache(str(tmp_path / "decoded"), max_bytes=1 << 20)
    keep(cache, tmp_path, "v1", b"version one")
    held = ino(cache.path_of("v1"))
    dest = str(tmp_path / "spool-new")
    assert cache.take("v1", os.stat(cache.path_of("v1")), dest) == dest
    assert ino(dest) == held and open(dest, "rb").read() == b"version one"
    assert cache.path_of("v1") is None and cache.open("v1") is None
    assert cache.nbytes == 0


def test_take_refuses_another_file_under_the_same_version(tmp_path):
    """The entry was evicted and decoded again meanwhile: a new file, not the one the
    kernel holds — it stays in the cache, and nothing moves."""
    cache = DecodedCache(str(tmp_path / "decoded"), max_bytes=1 << 20)
    keep(cache, tmp_path, "v1", b"first copy")
    fd = os.open(cache.path_of("v1"), os.O_RDONLY)      # held, as the daemon holds it
    try:
        held = os.fstat(fd).st_dev, os.fstat(fd).st_ino
        held_st = os.fstat(fd)
        cache.discard("v1")
        keep(cache, tmp_path, "v1", b"first copy")      # the same version, decoded again
        assert ino(cache.path_of("v1")) != held
        dest = str(tmp_path / "spool-new")
        assert cache.take("v1", held_st, dest) is None
        assert not os.path.exists(dest)
        assert open(cache.path_of("v1"), "rb").read() == b"first copy"
        assert cache.take("v2", held_st, dest) is None    # never kept
    finally:
        os.close(fd)
