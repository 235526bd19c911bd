"""Fetch ahead (s4fs.read.fetch): a cold file of a remote store has its stored bytes
fetched into a local staging file, many ranged GETs in flight, before the workers decode
it. What comes back is still exactly the file; staged bytes are checked like the
store's (a damaged staging file is an error or a read from the store, never wrong
bytes); a fetch that fails ends the fill and the reader sees the store's error; nothing
is left behind."""

from __future__ import annotations

import os
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch

from s4fs.coding import IngestConfig
from s4fs.errors import ChecksumError, MissingData, S4Error
from s4fs.fs import Filesystem, FsConfig
from s4fs.read.fetch import Fetch, PREFIX
from s4fs.read.fill import order, plan
from s4fs.chunks import ChunkSource
from s4fs.runtime import current
from s4fs.stores import LocalStore
from s4fs.stores.faulty import FailingStore

from test_fetch_runs import CountingStore
from test_workers import (adversarial_state, load_fails_with, save, torch_bytes,
                          torch_load_pattern)


@pytest.fixture(scope="module", autouse=True)
def _pool():
    yield
    current().pools.close()


@pytest.fixture
def s3(make_s3_store):
    """``make_s3_store``, with the worker processes started afresh: after the S3 test
    server's credentials are in the environment they inherit."""
    current().pools.close()
    return make_s3_store


def ingest() -> IngestConfig:
    return IngestConfig(processes=True, workers=2, batch_bytes=2 << 20)


def series_state(sd: dict, steps: int):
    """``steps`` consecutive checkpoints of ``sd`` (a training step's few changed bits
    between them: stored as deltas), as bytes."""
    out = []
    for _ in range(steps):
        out.append(torch_bytes(sd))
        sd["f32"].view(torch.int32)[::97] ^= 1
    return out


# --- the fetch on its own -------------------------------------------------------------

def stored(tmp_path, steps: int = 2):
    """A delta series saved to a local store; the last version's bytes and manifest."""
    fs = Filesystem(LocalStore(str(tmp_path / "store")),
                    FsConfig(ingest=ingest(), cache_dir=str(tmp_path / "cache"),
                             delta_direction="forward"))    # chains in the newest
    try:
        for data in series_state(adversarial_state(5), steps):
            m = save(fs, "ckpt.pt", data)
    finally:
        fs.close()
    return data, m


def fetch_all(store, batches, path, part: int):
    """Run a Fetch to its end: the staged tuple of every batch, or the error."""
    import threading
    done = threading.Event()
    staged, failed = {}, {}

    def ready(k, s):
        staged[k] = s
        if len(staged) + len(failed) == len(batches):
            done.set()

    def fail(k, exc):
        failed[k] = exc
        if len(staged) + len(failed) == len(batches):
            done.set()
    f = Fetch(store, batches, path, ready, fail, part=part)
    with ThreadPoolExecutor(4) as ex:
        f.start(ex)
        assert done.wait(60), "the fetch never reported every batch"
    return f, staged, failed


def decode_staged(src: ChunkSource, batch, staged) -> dict:
    """A batch decoded as a worker does (s4fs.coding._cpu_pool.decode_batch): file
    offset -> bytes."""
    out = {}
    with src.staged(staged), src.preloaded([ref for ref, _ in batch]):
        for ref, pieces in batch:
            data = memoryview(src.get(ref))
            for coff, foff, n in pieces:
                out[foff] = bytes(data[coff: coff + n])
    return out


def test_every_batch_decodes_exactly_from_the_staged_bytes_alone(tmp_path):
    data, m = stored(tmp_path, steps=3)
    batches = plan(m, 2 << 20)
    assert len(batches) > 2 and any(ref.base is not None for b in batches for ref, _ in b)
    counting = CountingStore(str(tmp_path / "store"))
    # small parts: one run is fetched in many GETs, each written at its place
    f, staged, failed = fetch_all(counting, batches, str(tmp_path / (PREFIX + "x")),
                                  part=64 << 10)
    assert not failed and sorted(staged) == list(range(len(batches)))
    assert counting.reads > len(batches)
    # the decode may not touch the store at all: every pack read fails
    refuse = FailingStore(LocalStore(str(tmp_path / "store")), fail_on={"get"},
                          key_prefix="packs/")
    src = ChunkSource(refuse, cache_bytes=0)
    got = bytearray(m.size)
    try:
        for k, batch in enumerate(batches):
            for off, piece in decode_staged(src, batch, staged[k]).items():
                got[off: off + len(piece)] = piece
    finally:
        src.close()
    assert refuse.failures["get"] == 0
    assert bytes(got) == data
    f.close()
    assert not os.path.exists(f.path)


@pytest.mark.parametrize("damage", ["flipped", "truncated"])
def test_a_damaged_staging_file_is_an_error_or_a_store_read_never_wrong_bytes(
        tmp_path, damage):
    data, m = stored(tmp_path)
    batches = plan(m, 2 << 20)
    f, staged, _ = fetch_all(LocalStore(str(tmp_path / "store")), batches,
                             str(tmp_path / (PREFIX + "x")), part=1 << 20)
    size = os.path.getsize(f.path)
    with open(f.path, "r+b") as fh:
        if damage == "flipped":
            for at in range(0, size, 4096):        # every page of it
                fh.seek(at)
                b = fh.read(1)
                fh.seek(at)
                fh.write(bytes([b[0] ^ 0x40]))
        else:
            fh.truncate(size // 3)
    src = ChunkSource(LocalStore(str(tmp_path / "store")), cache_bytes=0)
    try:
        for k, batch in enumerate(batches):
            if damage == "flipped":
                with pytest.raises((ChecksumError, S4Error)):
                    decode_staged(src, batch, staged[k])
            else:      # what the staging file lacks is read from the store: exact bytes
                for off, piece in decode_staged(src, batch, staged[k]).items():
                    assert piece == data[off: off + len(piece)]
    finally:
        src.close()
        f.close()


def test_a_failed_part_reports_every_batch_not_yet_ready(tmp_path):
    _, m = stored(tmp_path)
    batches = plan(m, 2 << 20)
    store = FailingStore(LocalStore(str(tmp_path / "store")), fail_on={"get"},
                         key_prefix="packs/", after=2)
    f, staged, failed = fetch_all(store, batches, str(tmp_path / (PREFIX + "x")),
                                  part=256 << 10)
    assert failed, "a failing GET must fail the batches that needed it"
    assert set(staged) | set(failed) == set(range(len(batches)))
    assert not set(staged) & set(failed)
    f.close()
    assert not os.path.exists(f.path)


def test_the_first_read_batch_goes_first_then_the_tail():
    def batch(lo, hi):
        return [(None, ((0, lo, hi - lo),))]
    bs = [batch(0, 10), batch(10, 20), batch(20, 30), batch(30, 40)]
    assert order(bs, 15, lead=1) == [bs[1], bs[3], bs[0], bs[2]]
    assert order(bs, 35, lead=1) == [bs[3], bs[0], bs[1], bs[2]]
    assert order(bs, 0, lead=1) == [bs[0], bs[3], bs[1], bs[2]]
    # the kernel's read ahead of the first read: the batch after it too
    assert order(bs, 5, lead=8) == [bs[0], bs[1], bs[3], bs[2]]
    # a torch file: the zip directory at the end lies in the batch of the other
    # records (batch 0, with the file's start), and the page before it holds the end
    # of the last storage, whose chunk lies in the last batch: both come first, or the
    # read of the directory waits for the whole decode
    meta = [(None, ((0, 0, 2), (2, 38, 2)))]
    torch_like = [meta + batch(2, 10), batch(10, 20), batch(20, 30), batch(30, 38)]
    assert order(torch_like, 0, lead=4) == [torch_like[0], torch_like[3], torch_like[1],
                                            torch_like[2]]


# --- a fresh node on S3 ---------------------------------------------------------------

def cold_s3_fs(store, tmp_path, name: str) -> Filesystem:
    return Filesystem(store, FsConfig(ingest=ingest(), cache_dir=str(tmp_path / name)))


def leftovers(fs: Filesystem) -> list[str]:
    return [n for n in os.listdir(fs.decoded.folder) if n.startswith((".fill", PREFIX))]


def wait_for_entry(fs: Filesystem, m) -> None:
    deadline = time.monotonic() + 60
    while fs.decoded.path_of(m.id) is None and time.monotonic() < deadline:
        time.sleep(0.05)


@pytest.mark.s3
def test_a_fresh_node_reads_an_s3_delta_series_exactly_fetched_ahead(s3, tmp_path):
    fs = cold_s3_fs(s3(), tmp_path, "writer")
    try:
        for data in series_state(adversarial_state(6), 3):
            m = save(fs, "ckpt.pt", data)
    finally:
        fs.close()
    other = cold_s3_fs(s3(), tmp_path, "fresh")
    try:
        r = other.open_read("ckpt.pt")
        try:
            assert r.read(0, 4096) == data[:4096]        # the first read starts it
            fill = r._fill
            assert fill is not None and fill.fetch is not None, "no fetch ahead started"
            assert fill.fetch.nbytes >= sum(ref.stored for b in fill.batches
                                            for ref, _ in b)
            assert torch_load_pattern(r, r.size) == data
        finally:
            r.release()
        wait_for_entry(other, m)
        assert other.decoded.path_of(m.id), "the filled copy should become a cache entry"
        with open(other.decoded.path_of(m.id), "rb") as fh:
            assert fh.read() == data
        assert not leftovers(other)
    finally:
        other.close()


@pytest.mark.s3
def test_a_pack_missing_from_s3_is_the_readers_error_and_nothing_is_left(s3, tmp_path):
    fs = cold_s3_fs(s3(), tmp_path, "writer")
    try:
        m = save(fs, "ckpt.pt", torch_bytes(adversarial_state(7)))
    finally:
        fs.close()
    store = s3()
    store.delete(m.own_packs[len(m.own_packs) // 2])
    other = cold_s3_fs(store, tmp_path, "fresh")
    try:
        load_fails_with(other, MissingData)
        deadline = time.monotonic() + 30
        while leftovers(other) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert other.decoded.path_of(m.id) is None
        assert not leftovers(other)
    finally:
        other.close()
