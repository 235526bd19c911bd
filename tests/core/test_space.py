"""A full cache disk under saves whose writes the daemon does not see (FUSE passthrough:
the kernel writes the spool itself), and under writeback's journal: the save fails with
ENOSPC at close(), the previous version stays — as on the request path — and the caches
give space back before a passthrough save finds the disk full.

The cache disk is a small tmpfs mounted for each test (root; skipped otherwise); the
store lies on the ordinary disk. As in test_follow_spool.py, the test writes the spool
through a descriptor of its own, as the kernel does."""

from __future__ import annotations

import errno
import os
import time

import pytest

from disk_helpers import small_disk as small_real_disk, small_tmpfs, stored_file as store_holds
from s4fs.coding import IngestConfig
from s4fs.errors import NoSpace
from s4fs.fs import Filesystem, FsConfig
from s4fs.runtime import current
from s4fs.stores import LocalStore
from s4fs.write import disk_full

MiB = 1 << 20
DISK = 32 * MiB


@pytest.fixture(scope="module", autouse=True)
def _pool():
    yield
    current().pools.close()


@pytest.fixture
def small_disk(tmp_path, monkeypatch):
    """A tmpfs of DISK bytes, standing in for a small cache disk: it runs out of room
    exactly where its size says. s4fs refuses --writeback with its cache in memory, so
    here it is taken for the disk it stands in for."""
    monkeypatch.setattr("s4fs.cachedir.memory_filesystem", lambda path: None)
    with small_tmpfs(tmp_path / "small", DISK) as path:
        yield path


def open_fs(tmp_path, cache: str, **cfg) -> Filesystem:
    return Filesystem(LocalStore(str(tmp_path / "store")),
                      FsConfig(ingest=IngestConfig(processes=False, workers=1),
                               cache_dir=cache, **cfg))


def stored_file(tmp_path, path: str) -> bytes:
    return store_holds(tmp_path / "store", path)


def read(fs: Filesystem, path: str) -> bytes:
    r = fs.open_read(path)
    try:
        return r.read(0, r.size + 1)
    finally:
        r.release()


def save(fs: Filesystem, path: str, data: bytes) -> None:
    """A save through write requests, committed (and, writeback, synced)."""
    h = fs.open_write(path)
    h.write(0, data)
    h.flush()
    h.release()
    assert fs.sync(timeout=60) == []


def release_and_see_the_old_version(fs: Filesystem, h, old: bytes) -> None:
    """The failed save's last descriptor goes; nothing is left to commit and reads give
    the version before it."""
    h.release()
    assert fs.sync(timeout=60) == []
    assert read(fs, "f.bin") == old


def write_behind(h, data: bytes) -> int:
    """Write ``data`` into ``h``'s spool as the kernel does under passthrough, 1 MiB at
    a time, until done or the disk refuses; the bytes written."""
    h.written_behind()
    fd = os.open(h.spool.name, os.O_WRONLY)
    done = 0
    try:
        while done < len(data):
            try:
                done += os.pwrite(fd, data[done:done + MiB], done)
            except OSError as exc:
                assert exc.errno == errno.ENOSPC
                break
    finally:
        os.close(fd)
    return done


def fill(folder: str) -> str:
    """A file that takes every free byte of ``folder``'s disk; its path."""
    name = os.path.join(folder, "filler")
    with open(name, "wb", buffering=0) as f:
        while True:
            try:
                f.write(b"\xa5" * MiB)
            except OSError as exc:
                assert exc.errno == errno.ENOSPC
                break
    return name


def test_disk_full_says_whether_a_margin_still_fits(small_disk):
    assert not disk_full(small_disk)
    filler = fill(small_disk)
    assert disk_full(small_disk)
    os.unlink(filler)
    assert not disk_full(small_disk)
    assert os.listdir(small_disk) == []          # the probe leaves nothing behind


def test_disk_full_after_a_refused_write_on_ext4(tmp_path):
    """A real ext4 disk refuses a 1 MiB write while its free count still shows hundreds
    of KiB (its metadata reserve) and one more block still fits: the probe must call
    that full, or a save whose write failed there would be committed short."""
    with small_real_disk(tmp_path / "ext4", 16 * MiB) as disk:
        name = fill(disk)
        st = os.statvfs(disk)
        assert st.f_bavail * st.f_frsize > 0         # what the kernel still counts free
        assert disk_full(disk)
        os.unlink(name)
        assert not disk_full(disk)
        assert os.listdir(disk) == ["lost+found"]


@pytest.mark.parametrize("writeback", [False, True], ids=["default", "writeback"])
def test_a_write_behind_the_daemon_that_finds_the_disk_full_fails_the_save(
        tmp_path, small_disk, writeback):
    """The kernel's write into the spool failed with ENOSPC (the daemon saw no request):
    close() raises ENOSPC and the previous version stays, in the store and on reads."""
    fs = open_fs(tmp_path, small_disk, writeback=writeback, decoded_cache_bytes=0)
    try:
        old = os.urandom(4 * MiB)
        save(fs, "f.bin", old)
        h = fs.open_write("f.bin")
        new = os.urandom(2 * DISK)
        assert write_behind(h, new) < len(new)           # the disk refused the rest
        with pytest.raises(NoSpace) as raised:
            h.flush()
        assert raised.value.errno == errno.ENOSPC
        assert "FUSE passthrough" in str(raised.value) and "previous one stays" in str(raised.value)
        release_and_see_the_old_version(fs, h, old)
    finally:
        fs.close()
    assert stored_file(tmp_path, "f.bin") == old


def test_a_write_behind_the_daemon_gets_room_from_the_caches(tmp_path, small_disk):
    """A file kept whole for reads takes most of the disk; once a save is written behind
    the daemon, the caches give that space back before the kernel needs it, and the
    save, which fits only then, is stored whole."""
    fs = open_fs(tmp_path, small_disk, decoded_cache_bytes=DISK)
    try:
        kept = os.urandom(20 * MiB)
        save(fs, "kept.bin", kept)
        assert read(fs, "kept.bin") == kept
        assert fs.decoded.path_of(fs.manifest("kept.bin").id) is not None, \
            "the committed file is not kept whole in the cache: nothing to give back"
        h = fs.open_write("new.bin")
        h.written_behind()
        deadline = time.monotonic() + 10
        while fs.decoded.path_of(fs.manifest("kept.bin").id) is not None:
            assert time.monotonic() < deadline, "the cache kept its copy with the disk nearly full"
            time.sleep(0.01)
        new = os.urandom(20 * MiB)
        assert write_behind(h, new) == len(new)
        h.flush()
        h.release()
        assert read(fs, "new.bin") == new
    finally:
        fs.close()
    assert stored_file(tmp_path, "new.bin") == new
    assert stored_file(tmp_path, "kept.bin") == kept


def test_writeback_that_cannot_journal_the_file_fails_the_save(tmp_path, small_disk):
    """--writeback through requests: every byte reached the spool, but the disk filled
    before close() could journal the file. close() raises ENOSPC and the save is over —
    it does not land later once space comes back (the caller was told it failed)."""
    fs = open_fs(tmp_path, small_disk, writeback=True, decoded_cache_bytes=0)
    try:
        old = os.urandom(MiB)
        save(fs, "f.bin", old)
        h = fs.open_write("f.bin")
        h.write(0, os.urandom(4 * MiB))
        filler = fill(small_disk)
        with pytest.raises(OSError) as raised:
            h.flush()
        assert raised.value.errno == errno.ENOSPC
        os.unlink(filler)
        release_and_see_the_old_version(fs, h, old)
    finally:
        fs.close()
    assert stored_file(tmp_path, "f.bin") == old
