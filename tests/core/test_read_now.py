"""A read the mount answers on its event loop (``NodeReader.read_now``) must give exactly
the bytes ``read`` gives, and must decline — never block, never serve another version —
when the bytes are not all in the page cache, when the file is not a whole local copy,
or when the file changed since the reader's last read."""

from __future__ import annotations

import os

import pytest

from s4fs.fs import Filesystem, FsConfig
from s4fs.runtime import current
from s4fs.stores import LocalStore

MiB = 1 << 20


@pytest.fixture(scope="module", autouse=True)
def _pool():
    yield
    current().pools.close()


@pytest.fixture
def fs(tmp_path):
    f = Filesystem(LocalStore(str(tmp_path / "store")), FsConfig(cache_dir=str(tmp_path / "c")))
    yield f
    f.close()


def write(fs: Filesystem, path: str, data: bytes) -> None:
    h = fs.open_write(path)
    try:
        h.write(0, data)
        h.flush()                 # committed; the release keeps the spool as a local copy
    finally:
        h.release()


def test_a_file_just_written_reads_the_same_bytes_without_blocking(fs):
    data = os.urandom(3 * MiB + 123)
    write(fs, "a.bin", data)
    r = fs.open_read("a.bin")
    try:
        got = [r.read_now(off, MiB) for off in range(0, len(data), MiB)]
        assert all(g is not None for g in got), "a file just written is in the page cache"
        assert b"".join(got) == data
        assert r.read_now(len(data), MiB) == b""             # at the end, as read gives
        assert r.read_now(len(data) - 5, MiB) == data[-5:]
    finally:
        r.release()


def test_it_declines_when_the_bytes_are_not_cached(fs):
    data = os.urandom(2 * MiB)
    write(fs, "a.bin", data)
    path = fs.decoded.path_of(fs.manifest("a.bin").id)
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)   # the kernel drops its pages
    finally:
        os.close(fd)
    r = fs.open_read("a.bin")
    try:
        if r.read_now(0, MiB) is not None:
            pytest.skip("the page cache kept the file (a filesystem ignoring DONTNEED)")
        assert r.read(0, MiB) == data[:MiB]                   # the blocking path reads it
    finally:
        r.release()


def test_it_declines_a_file_read_from_the_store(tmp_path, fs):
    data = os.urandom(MiB)
    write(fs, "a.bin", data)
    fresh = Filesystem(LocalStore(str(tmp_path / "store")), FsConfig(decoded_cache_bytes=0))
    try:
        r = fresh.open_read("a.bin")
        try:
            assert r.read_now(0, MiB) is None
            assert r.read(0, MiB) == data
        finally:
            r.release()
    finally:
        fresh.close()


def test_it_declines_once_the_file_changed_and_read_moves_to_the_new_version(fs):
    old, new = os.urandom(MiB), os.urandom(MiB)
    write(fs, "a.bin", old)
    r = fs.open_read("a.bin")
    try:
        assert r.read_now(0, 4096) == old[:4096]
        write(fs, "a.bin", new)                               # overwritten meanwhile
        assert r.read_now(0, 4096) is None
        assert r.read(0, MiB) == new
        assert r.read_now(4096, 4096) == new[4096:8192]       # and from then on, the new
    finally:
        r.release()


def test_the_whole_file_check_holds_when_threads_read_the_same_bytes_at_once():
    """The kernel may read one range twice, from two threads (or a thread and the event
    loop): the whole-file hash must count those bytes once, not report the copy
    corrupt."""
    import threading

    import xxhash

    from s4fs.manifest import Manifest
    from s4fs.chunks import WholeFileHash
    data = os.urandom(32 * MiB)
    m = Manifest(size=len(data), xxh128=xxhash.xxh3_128_hexdigest(data))
    for _ in range(3):
        whole = WholeFileHash(m)
        said: list[bool] = []

        def reader():
            for off in range(0, len(data), MiB):
                said.append(whole.see(off, memoryview(data)[off:off + MiB]))
        threads = [threading.Thread(target=reader) for _ in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert all(said)
