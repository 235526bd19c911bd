"""A cache dir on tmpfs: the default mode (durable in the store at close()) may keep its
spools and local copies in memory — no disk writes for them, nothing left dirty for the
kernel to write back while training goes on — but ``--writeback``, whose promise is the
bytes on local disk until the store takes them, is refused there with a clear error."""

from __future__ import annotations

import os

import pytest

from s4fs.cachedir import memory_filesystem
from s4fs.errors import InvalidArgument
from s4fs.fs import Filesystem, FsConfig
from s4fs.stores import LocalStore

from disk_helpers import small_tmpfs, stored_file


def test_memory_filesystems_are_told_from_disks(tmp_path):
    with small_tmpfs(tmp_path / "ram", 8 << 20) as ram:
        assert memory_filesystem(ram) == "tmpfs"
        # a folder not made yet: its nearest existing parent decides
        assert memory_filesystem(os.path.join(ram, "not", "yet")) == "tmpfs"
    assert memory_filesystem("/proc") is None                        # procfs: not memory
    # the root, as the kernel's mount table names its type
    with open("/proc/self/mountinfo") as f:
        root = [line.split(" - ")[1].split()[0] for line in f if line.split()[4] == "/"]
    assert memory_filesystem("/") == (root[-1] if root[-1] in ("tmpfs", "ramfs") else None)


def test_writeback_is_refused_on_a_memory_cache_and_leaves_it_usable(tmp_path):
    store = LocalStore(str(tmp_path / "store"))
    with small_tmpfs(tmp_path / "ram", 64 << 20) as ram:
        cache = os.path.join(ram, "cache")
        with pytest.raises(InvalidArgument) as exc:
            Filesystem(store, FsConfig(cache_dir=cache, writeback=True))
        said = str(exc.value)
        assert "--writeback" in said and "tmpfs" in said and cache in said
        assert "--cache-dir" in said                              # what to do instead
        # nothing held: the default mode takes the same cache dir at once
        fs = Filesystem(store, FsConfig(cache_dir=cache))
        try:
            data = os.urandom(3 << 20) + bytes(3 << 20)
            h = fs.open_write("/ckpt.bin", truncate=True, create=True)
            h.write(0, data)
            h.release()                                      # durable in the store here
            r = fs.open_read("/ckpt.bin")
            try:
                assert r.read(0, len(data) + 1) == data
            finally:
                r.release()
        finally:
            fs.close()
    assert stored_file(tmp_path / "store", "/ckpt.bin") == data


def test_the_default_temporary_cache_on_a_memory_tmp_refuses_writeback(tmp_path,
                                                                       monkeypatch):
    """Where /tmp is tmpfs (Debian 13's default) a writeback Filesystem without a cache
    dir would put its spools there: refused, and its temporary folder not left behind."""
    store = LocalStore(str(tmp_path / "store"))
    with small_tmpfs(tmp_path / "ram", 8 << 20) as ram:
        monkeypatch.setattr("tempfile.tempdir", ram)
        with pytest.raises(InvalidArgument, match="--writeback"):
            Filesystem(store, FsConfig(writeback=True))
        assert os.listdir(ram) == []
