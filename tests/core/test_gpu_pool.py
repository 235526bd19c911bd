"""The GPU worker process (s4fs.coding._gpu_pool): a mount that codes on the GPU sends its spool
batches and its decode-ahead batches to one process that owns the GPU, not to threads
of the daemon. Here that process runs the emulated GPU (the real kernels compiled for
the CPU, zlib for nvCOMP, the ``portable`` profile so any CPU reads the blobs back);
on the H200 the same tests run with the real one (tests/gpu/test_gpu_save.py)."""

from __future__ import annotations

import os
import sys

import pytest
import torch

from emulated_gpu import emulated_gpu
from s4fs.coding import _gpu_pool as gpu_pool
from s4fs.codec import inspect
from s4fs.fs import Filesystem, FsConfig
from s4fs.coding import IngestConfig
from s4fs.runtime import Runtime, RuntimeConfig
from s4fs.stores import LocalStore
from test_workers import (adversarial_state, change_the_spool_during_a_save,
                          kill_workers_during_a_save, read,
                          read_cold_then_wait_for_the_copy, read_fresh, save, torch_bytes,
                          torch_load_pattern)

GPU = dict(processes=True, workers=2, device="cuda", gpu_profile="portable",
           gpu_batch_bytes=2 << 20)


RT = Runtime()       # the test's runtime (each test's own: _emulated)


def use_runtime(monkeypatch, init: str) -> None:
    """Close the test's runtime; the next filesystems use a new one whose GPU worker
    runs ``init`` first."""
    RT.close()
    monkeypatch.setattr(sys.modules[__name__], "RT",
                        Runtime(RuntimeConfig(gpu_worker_init=init)))


@pytest.fixture(autouse=True)
def _emulated(monkeypatch):
    emulated_gpu(monkeypatch)
    use_runtime(monkeypatch, "emulated_gpu:install_in_worker")
    yield
    RT.close()


def make_fs(tmp_path, name="cache", **over) -> Filesystem:
    return Filesystem(LocalStore(str(tmp_path / "store")),
                      FsConfig(ingest=IngestConfig(**{**GPU, **over}),
                               cache_dir=str(tmp_path / name)), runtime=RT)


def plane_codecs(fs, m) -> set[str]:
    return {p["codec"] for st in m.streams if st.kind == "tensor" for c in st.chunks
            for p in inspect(fs.source.fetch_blob(c)).planes}


def flip_in_largest_chunk(tmp_path, m, where, bit: int) -> None:
    """Flip ``bit`` of one stored byte (``where(ref)`` into the blob) of the file's
    largest tensor chunk, in the store."""
    ref = max((c for s in m.streams if s.kind == "tensor" for c in s.chunks),
              key=lambda c: c.stored)
    store = LocalStore(str(tmp_path / "store"))
    pack = bytearray(store.get(ref.pack))
    pack[ref.offset + where(ref)] ^= bit
    store.put(ref.pack, bytes(pack))


def test_coded_in_the_gpu_process_exact_with_deltas(tmp_path):
    """Every dtype, a delta series: the chunks are coded by the GPU worker process (its
    nvCOMP-Deflate planes, which the CPU path never writes; no CPU worker started), and
    every version reads back exactly, here and on a node with no GPU."""
    fs = make_fs(tmp_path)
    sd = adversarial_state(1)
    series, ms = [], []
    try:
        for step in range(3):
            series.append(torch_bytes(sd))
            ms.append(save(fs, "ckpt.pt", series[-1], keep=step == 1))
            sd["f32"][: 1000 * (step + 1)] += 0.001
            sd["bf16"][::97] = 1.0
        assert "nvcomp-deflate" in plane_codecs(fs, ms[0])
        pids = RT.pools.gpu().pids()
        assert pids and os.getpid() not in pids
        assert not RT.pools.cpu_started(), "the CPU workers should not have been started"
        assert len(ms[0].own_packs) >= 2                       # batches of 2 MiB
        for m in ms[1:]:
            assert m.base is not None and m.stored_bytes() < len(series[0]) // 2
        assert read(fs, "ckpt.pt") == series[-1]
    finally:
        fs.close()
    assert read_fresh(tmp_path, "ckpt.pt") == series[-1]


@pytest.mark.parametrize("order", ["copy-first", "master-first"])
def test_pairs_in_the_gpu_process(tmp_path, order):
    """A mixed-precision checkpoint coded by the GPU worker process: the chunks coded on
    their pair are coded there on the CPU (the rest on the GPU), the pair stored within
    2 % of the masters alone, every byte back on a node with no GPU."""
    from test_pairs import masters_first, mixed, weights
    master = weights(n=4, shape=(512, 1024))
    layout = mixed if order == "copy-first" else masters_first
    data = torch_bytes(layout(master))
    alone = torch_bytes({"optimizer": mixed(master)["optimizer"]})
    fs = make_fs(tmp_path)
    try:
        m = save(fs, "ckpt.pt", data)
        lone = save(fs, "alone.pt", alone)
        assert "nvcomp-deflate" in plane_codecs(fs, m)          # the rest: on the GPU
        assert sum(c.paired for s in m.streams for c in s.chunks) >= 4
        assert m.stored_bytes() <= 1.02 * lone.stored_bytes()
    finally:
        fs.close()
    assert read_fresh(tmp_path, "ckpt.pt") == data


@pytest.mark.parametrize("size", [0, 1, (2 << 20) + 3, (9 << 20) + 5])
def test_raw_bytes_round_trip(tmp_path, size):
    fs = make_fs(tmp_path)
    try:
        data = os.urandom(size)
        save(fs, "blob.bin", data)
        assert read(fs, "blob.bin") == data
    finally:
        fs.close()
    assert read_fresh(tmp_path, "blob.bin") == data


def test_spool_changed_under_the_gpu_worker_fails_not_stored(tmp_path):
    """The device's checksum of what it coded is compared with the daemon's: a spool
    that changed behind the session's back fails the save; the old version stays. (One
    batch for the whole file, sent at finish(): the change always comes before it.)"""
    fs = make_fs(tmp_path, gpu_batch_bytes=256 << 20)
    try:
        change_the_spool_during_a_save(fs, delta=False)
    finally:
        fs.close()


def test_a_killed_gpu_worker_fails_that_save_and_the_next_one_works(tmp_path):
    fs = make_fs(tmp_path, gpu_batch_bytes=64 << 20)
    try:
        kill_workers_during_a_save(fs, tmp_path, lambda: RT.pools.gpu().pids(),
                                   "GPU worker process died while coding")
    finally:
        fs.close()


def test_a_gpu_that_fails_every_batch_codes_on_the_cpu(tmp_path, monkeypatch, capfd):
    """Out of device memory in the worker: each batch is coded on the CPU there instead,
    with a warning in the daemon's log (the worker's standard error); the save succeeds
    and reads back exactly."""
    use_runtime(monkeypatch, "emulated_gpu:install_broken_in_worker")
    fs = make_fs(tmp_path)
    try:
        data = torch_bytes(adversarial_state(2))
        m = save(fs, "ckpt.pt", data)
        assert "nvcomp-deflate" not in plane_codecs(fs, m)
        assert read(fs, "ckpt.pt") == data
    finally:
        fs.close()
    assert read_fresh(tmp_path, "ckpt.pt") == data
    RT.pools.close()
    err = capfd.readouterr().err
    assert "WARNING s4fs.ingest (GPU worker): the GPU could not code a batch" in err, err
    assert "out of memory" in err and "coding it on the CPU" in err


def test_cold_file_decoded_ahead_in_the_gpu_process(tmp_path):
    """A node whose mount codes on the GPU decodes a cold file ahead in the GPU worker
    (through a delta chain): exact bytes, then kept as the decoded-cache entry."""
    fs = make_fs(tmp_path)
    sd = adversarial_state(2)
    series = []
    try:
        for step in range(3):
            series.append(torch_bytes(sd))
            save(fs, "ckpt.pt", series[-1])
            sd["f32"][::7] += 1
    finally:
        fs.close()
    RT.pools.close()
    other = make_fs(tmp_path, "cold")
    try:
        m = other.manifest("ckpt.pt")
        assert m.base is not None
        read_cold_then_wait_for_the_copy(other, m, series[-1])
        assert RT.pools.gpu().pids(), "the GPU worker did not decode ahead"
        assert not RT.pools.cpu_started()
        with open(other.decoded.path_of(m.id), "rb") as f:
            assert f.read() == series[-1]
    finally:
        other.close()


def test_gpu_decode_ahead_of_a_corrupt_pack_is_an_error_not_wrong_bytes(tmp_path, caplog):
    from s4fs.errors import ChecksumError
    fs = make_fs(tmp_path)
    try:
        m = save(fs, "ckpt.pt", torch_bytes(adversarial_state(5)))
    finally:
        fs.close()
    flip_in_largest_chunk(tmp_path, m, lambda ref: ref.stored // 2, 0x40)
    other = make_fs(tmp_path, "cold")
    try:
        r = other.open_read("ckpt.pt")
        try:
            with caplog.at_level("WARNING", logger="s4fs.read.fill"), \
                    pytest.raises(ChecksumError):
                torch_load_pattern(r, r.size)
        finally:
            r.release()
        assert other.decoded.path_of(m.id) is None
    finally:
        other.close()


def test_a_cold_read_at_the_head_starts_the_decode_ahead_at_once(tmp_path):
    """torch.load reads 4 bytes at 0 before the tail: on a GPU mount that first read
    already starts the decode ahead (the daemon decodes nothing itself)."""
    fs = make_fs(tmp_path)
    try:
        data = torch_bytes(adversarial_state(6))
        save(fs, "ckpt.pt", data)
    finally:
        fs.close()
    other = make_fs(tmp_path, "cold")
    try:
        r = other.open_read("ckpt.pt")
        try:
            assert r.read(0, 4) == data[:4]
            assert r._fill is not None, "the first read should start the decode ahead"
            assert torch_load_pattern(r, r.size) == data
        finally:
            r.release()
    finally:
        other.close()


def test_the_daemons_own_reads_of_gpu_chunks_decode_in_the_worker(tmp_path, monkeypatch):
    """A small file (no decode ahead) saved through the GPU worker is read back by a
    fresh node: its GPU-coded chunks are decoded by the GPU worker, not in this process,
    and come back exact; a corrupt one is an error, never wrong bytes."""
    from s4fs.errors import ChecksumError
    asked = []
    real = gpu_pool.GpuPool.decode_blob

    def counting(self, blob, base):
        asked.append(len(blob))
        return real(self, blob, base)
    monkeypatch.setattr(gpu_pool.GpuPool, "decode_blob", counting)
    fs = make_fs(tmp_path)
    try:
        g = torch.Generator().manual_seed(4)
        data = torch_bytes({"w": torch.randn(600_000, generator=g)})     # ~2.4 MB
        m = save(fs, "small.pt", data)
    finally:
        fs.close()
    assert "nvcomp-deflate" in plane_codecs(fs, m)
    other = make_fs(tmp_path, "cold")
    try:
        assert read(other, "small.pt") == data
        assert asked, "the chunks were decoded in the daemon, not in the GPU worker"
    finally:
        other.close()
    flip_in_largest_chunk(tmp_path, m, lambda ref: ref.stored - 5, 0x01)
    third = make_fs(tmp_path, "third")
    try:
        with pytest.raises(ChecksumError):
            read(third, "small.pt")
    finally:
        third.close()


def test_a_spool_written_behind_is_coded_on_the_gpu_as_it_grows(tmp_path):
    """FUSE passthrough on a GPU mount: the kernel writes the spool, the handle follows
    it and the GPU worker codes it as it grows; a patch of bytes already coded is
    stored as patched."""
    from test_follow_spool import MiB, checkpoint, save_patched_after_coding
    fs = make_fs(tmp_path)
    try:
        want = save_patched_after_coding(fs, "ckpt.pt", checkpoint(7), 2 * MiB, 4096)
        assert "nvcomp-deflate" in plane_codecs(fs, fs.manifest("ckpt.pt"))
        assert not RT.pools.cpu_started(), "the CPU workers should not have been started"
        assert read(fs, "ckpt.pt") == want
    finally:
        fs.close()
    assert read_fresh(tmp_path, "ckpt.pt") == want
