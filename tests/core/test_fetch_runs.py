"""A batch of chunks about to be decoded (a fresh node's decode ahead) is fetched in runs:
one store read per run of adjacent blobs in a pack, not one per blob — and every blob is
still checked, so a damaged byte in a run is an error, never wrong data."""

from __future__ import annotations

import pytest
import torch

from s4fs.errors import ChecksumError, S4Error
from s4fs.fs import Filesystem, FsConfig
from s4fs.chunks import ChunkSource
from s4fs.stores import LocalStore

from test_workers import torch_bytes


class CountingStore(LocalStore):
    """A local store that counts its reads (whole and ranged)."""

    def __init__(self, root: str) -> None:
        super().__init__(root)
        self.reads = 0

    def get(self, key, start=None, end=None):
        if key.startswith("packs/"):
            self.reads += 1
        return super().get(key, start, end)

    def get_into(self, key, start, end, out):
        if key.startswith("packs/"):
            self.reads += 1
        return super().get_into(key, start, end, out)


def put(fs: Filesystem, path: str, data: bytes) -> None:
    h = fs.open_write(path)
    h.write(0, data)
    h.flush()
    h.release()


def stored_file(tmp_path):
    """A torch file of several chunks, stored; its bytes and its tensor chunk refs."""
    g = torch.Generator().manual_seed(7)
    data = torch_bytes({f"w{i}": torch.randn(1 << 20, generator=g) for i in range(6)})
    fs = Filesystem(LocalStore(str(tmp_path / "store")), FsConfig(decoded_cache_bytes=0))
    try:
        put(fs, "ckpt.pt", data)
        m = fs.manifest("ckpt.pt")
    finally:
        fs.close()
    refs = [c for s in m.streams if s.kind == "tensor" for c in s.chunks]
    assert len(refs) >= 6 and len({r.pack for r in refs}) < len(refs)
    return data, m, refs


def test_a_batch_is_read_in_one_read_per_pack_run_and_decodes_exactly(tmp_path):
    data, m, refs = stored_file(tmp_path)
    store = CountingStore(str(tmp_path / "store"))
    src = ChunkSource(store, cache_bytes=0)
    try:
        with src.preloaded(refs):
            got = [src.get(r) for r in refs]
        runs = len({r.pack for r in refs})
        assert store.reads == runs, f"{store.reads} reads for {len(refs)} blobs in {runs} packs"
        # every chunk exactly the file's bytes at its place
        for r, chunk in zip(refs, got):
            assert len(chunk) == r.raw
        from s4fs.read.reader import FileReader
        assert FileReader(m, src).read(0, m.size) == data
    finally:
        src.close()


def test_a_damaged_byte_in_a_run_is_an_error(tmp_path):
    _, _, refs = stored_file(tmp_path)
    store = LocalStore(str(tmp_path / "store"))
    victim = refs[len(refs) // 2]
    pack = bytearray(store.get(victim.pack))
    pack[victim.offset + victim.stored // 2] ^= 0x10
    store.put(victim.pack, bytes(pack))
    src = ChunkSource(store, cache_bytes=0)
    try:
        with src.preloaded(refs), pytest.raises((ChecksumError, S4Error)):
            for r in refs:
                src.get(r)
    finally:
        src.close()


def test_the_delta_bases_of_a_batch_come_in_the_same_runs(tmp_path):
    g = torch.Generator().manual_seed(3)
    sd = {f"w{i}": torch.randn(1 << 20, generator=g) for i in range(6)}
    fs = Filesystem(LocalStore(str(tmp_path / "store")),        # forward: chains to fetch
                    FsConfig(decoded_cache_bytes=0, delta_direction="forward"))
    try:
        for step in range(2):
            if step:
                for t in sd.values():
                    t.view(torch.int32)[::97] ^= 1          # a training step's few bits
            data = torch_bytes(sd)
            put(fs, "ckpt.pt", data)
        m = fs.manifest("ckpt.pt")
    finally:
        fs.close()
    refs = [c for s in m.streams for c in s.chunks]     # the whole file, as a fill's
    chain = {}
    for r in refs:
        while r is not None:
            chain[r.key()] = r
            r = r.base
    assert len(chain) > len(refs), "the second save should be stored as deltas"
    store = CountingStore(str(tmp_path / "store"))
    src = ChunkSource(store, cache_bytes=0)
    try:
        with src.preloaded(refs):
            from s4fs.read.reader import FileReader
            assert FileReader(m, src).read(0, m.size) == data
        assert store.reads == len({r.pack for r in chain.values()})
    finally:
        src.close()
