"""The decoded copy a decode ahead fills (s4fs.coding's ``Copy``, ``mapped_copy``): in
memory (tmpfs) the workers write it through a shared mapping, its pages reserved first;
on a disk file system with ``pwrite``. Either way a fresh node reads exactly the file's
bytes, and a tmpfs without room for the copy costs the decode ahead, never a byte."""

from __future__ import annotations

import errno
import os
import random
import subprocess
import tempfile
import time

import numpy as np
import pytest
import torch

from s4fs.coding import Copy, IngestConfig, mapped_copy
from s4fs.fs import Filesystem, FsConfig
from s4fs.runtime import current
from s4fs.stores import LocalStore

from test_workers import (adversarial_state, make_fs, read_cold_then_wait_for_the_copy,
                          save, torch_bytes, torch_load_pattern)

SHM = "/dev/shm"


@pytest.fixture(scope="module", autouse=True)
def _pool():
    yield
    current().pools.close()


def in_memory_dir():
    if not os.path.isdir(SHM) or not os.access(SHM, os.W_OK):
        pytest.skip(f"no writable tmpfs at {SHM}")
    return tempfile.TemporaryDirectory(dir=SHM, prefix="s4fs-test-")


def cold_fs_at(tmp_path, cache_dir: str) -> Filesystem:
    return Filesystem(LocalStore(str(tmp_path / "store")),
                      FsConfig(ingest=IngestConfig(processes=True, workers=2,
                                                   batch_bytes=4 << 20),
                               cache_dir=cache_dir))


@pytest.mark.parametrize("where", ["tmpfs", "disk"])
def test_copy_places_every_piece_at_its_offset(tmp_path, where):
    """Pieces of bytes, bytearrays and NumPy arrays of any dtype land where they are
    placed, and nothing else of the file changes; mapped only in tmpfs."""
    ctx = in_memory_dir() if where == "tmpfs" else tempfile.TemporaryDirectory(dir=tmp_path)
    with ctx as d:
        path = os.path.join(d, "copy")
        size = (3 << 20) + 4097
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
        os.ftruncate(fd, size)
        mapped = mapped_copy(fd, size)
        os.close(fd)
        assert mapped == (where == "tmpfs")
        rng = random.Random(7)
        want = bytearray(size)
        with Copy(path, mapped) as c:
            for _ in range(200):
                kind = rng.choice(["bytes", "bytearray", "u8", "f32"])
                n = rng.randrange(4, 70_000) // 4 * 4
                off = rng.randrange(0, size - n + 1)
                raw = rng.randbytes(n)
                piece = {"bytes": lambda: raw, "bytearray": lambda: bytearray(raw),
                         "u8": lambda: np.frombuffer(raw, np.uint8),
                         "f32": lambda: np.frombuffer(raw, np.float32)}[kind]()
                c.place(piece, off)
                want[off: off + len(raw)] = raw
        with open(path, "rb") as f:
            assert f.read() == bytes(want)


def test_a_piece_past_the_copy_is_an_error_not_a_crash():
    from s4fs.errors import CodecError
    with in_memory_dir() as d:
        path = os.path.join(d, "copy")
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
        os.ftruncate(fd, 1 << 20)
        assert mapped_copy(fd, 1 << 20)
        os.close(fd)
        with Copy(path, True) as c, pytest.raises(CodecError, match="past the copy"):
            c.place(b"x" * 10, (1 << 20) - 5)


def test_a_cold_file_decoded_ahead_into_memory_is_exact(tmp_path):
    """A fresh node whose cache dir is in memory: the delta chain of a series decoded
    ahead through the mapping, read as torch.load reads, kept whole, and the same bytes
    read again from the kept copy."""
    from s4fs.read.fill import Fill
    fs = make_fs(tmp_path)
    sd = adversarial_state(6)
    series = []
    try:
        for _ in range(3):
            series.append(torch_bytes(sd))
            save(fs, "ckpt.pt", series[-1])
            sd["f32"][::5] += 1
    finally:
        fs.close()
    seen = []
    init = Fill.__init__

    def record(self, *a, **k):
        init(self, *a, **k)
        seen.append(self.mapped)
    with in_memory_dir() as d:
        other = cold_fs_at(tmp_path, d)
        try:
            Fill.__init__ = record
            m = other.manifest("ckpt.pt")
            read_cold_then_wait_for_the_copy(other, m, series[-1])
            assert seen == [True], "the copy in tmpfs should be written through a mapping"
            with open(other.decoded.path_of(m.id), "rb") as f:
                assert f.read() == series[-1]
        finally:
            Fill.__init__ = init
            other.close()


def _small_tmpfs(path: str, size: str) -> None:
    os.makedirs(path, exist_ok=True)
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", path],
                       capture_output=True, text=True)
    if r.returncode:
        pytest.skip(f"cannot mount a tmpfs here ({r.stderr.strip()}): needs root")


def test_a_tmpfs_without_room_for_the_copy_reads_exact_bytes_in_the_daemon(tmp_path):
    """A cache dir in a tmpfs too small for the copy: reserving the copy's pages fails
    at the start (a write through a mapping that met a full tmpfs would be a SIGBUS in
    a worker), nothing is decoded ahead, and the reader decodes in this process: every
    byte exact, no partial copy left."""
    fs = make_fs(tmp_path)
    try:
        data = torch_bytes(adversarial_state(8))
        assert len(data) > 9 << 20
        save(fs, "ckpt.pt", data)
    finally:
        fs.close()
    mnt = str(tmp_path / "small")
    _small_tmpfs(mnt, "4m")
    try:
        fd = os.open(os.path.join(mnt, "probe"), os.O_RDWR | os.O_CREAT, 0o600)
        try:
            os.ftruncate(fd, len(data))
            with pytest.raises(OSError) as e:
                mapped_copy(fd, len(data))
            assert e.value.errno == errno.ENOSPC
        finally:
            os.close(fd)
            os.unlink(os.path.join(mnt, "probe"))
        other = cold_fs_at(tmp_path, mnt)
        try:
            r = other.open_read("ckpt.pt")
            try:
                assert torch_load_pattern(r, r.size) == data
                assert r._fill is None, "no copy fits: nothing should be decoded ahead"
            finally:
                r.release()
            assert not [n for n in os.listdir(other.decoded.folder) if n.startswith(".fill")]
        finally:
            other.close()
    finally:
        for _ in range(50):
            if subprocess.run(["umount", mnt], capture_output=True).returncode == 0:
                break
            time.sleep(0.1)


def test_torch_loads_what_a_fresh_node_decoded_into_memory(tmp_path):
    """The user's view: torch.load of the bytes a fresh node read equals the state."""
    import io
    fs = make_fs(tmp_path)
    sd = {"w": torch.randn(3_000_000), "b": torch.randn(1_000_000).bfloat16()}
    try:
        data = torch_bytes(sd)
        save(fs, "ckpt.pt", data)
    finally:
        fs.close()
    with in_memory_dir() as d:
        other = cold_fs_at(tmp_path, d)
        try:
            r = other.open_read("ckpt.pt")
            try:
                got = torch.load(io.BytesIO(torch_load_pattern(r, r.size)))
            finally:
                r.release()
        finally:
            other.close()
    for k in sd:
        assert torch.equal(got[k].view(torch.uint8), sd[k].view(torch.uint8))
