"""Packs written ahead (``Store.writer``): a save lands its packs in pieces while it is
coded, and the bytes stored are exactly those of a pack written at once; a piece or a
commit that fails makes the save fail, shows no file, and leaves no temporary file in
the store; the next save works."""

from __future__ import annotations

import io

import numpy as np
import pytest
import torch

from s4fs import keys
from s4fs.coding import IngestConfig
from s4fs.errors import NotFound, StoreUnavailable
from s4fs.fs import Filesystem, FsConfig
from s4fs.stores import LocalStore
from s4fs.stores.faulty import FailingStore
from s4fs.stores.local import TMP_PREFIX


def checkpoint(seed: int = 0) -> bytes:
    rng = np.random.default_rng(seed)
    sd = {f"w{k}": torch.from_numpy(rng.standard_normal(1 << 17).astype(np.float32))
          for k in range(16)}
    buf = io.BytesIO()
    torch.save(sd, buf)
    return buf.getvalue()


def make_fs(store) -> Filesystem:
    # packs of 1 MiB, written ahead in pieces of 256 KiB: several pieces a pack
    ingest = IngestConfig(chunk_size=1 << 16, pack_size=1 << 20)
    return Filesystem(store, FsConfig(ingest=ingest, delta=False, decoded_cache_bytes=0))


def save(fs, path: str, data: bytes) -> None:
    h = fs.open_write(path)
    try:
        h.write(0, data)
        h.flush()
    finally:
        h.release()


def read(fs, path: str) -> bytes:
    r = fs.open_read(path)
    try:
        return bytes(r.read(0, fs.stat(path).size))
    finally:
        r.release()


def temp_files(root) -> list:
    return [p for p in root.rglob("*") if p.is_file() and p.name.startswith(TMP_PREFIX)]


def test_packs_written_ahead_hold_every_byte(tmp_path):
    data = checkpoint()
    inner = LocalStore(tmp_path / "store")
    # a wrapper that counts the pieces and lets them through to the LocalStore's writer
    counting = FailingStore(inner, fail_on={"write"}, times=0)
    fs = make_fs(counting)
    save(fs, "ckpt.pt", data)
    packs = [o for o in inner.list(keys.PACKS)]
    assert len(packs) >= 3 and counting._seen["write"] > 2 * len(packs), \
        "the packs were not written in pieces"
    assert read(fs, "ckpt.pt") == data
    fs.close()
    fresh = make_fs(LocalStore(tmp_path / "store"))
    assert read(fresh, "ckpt.pt") == data
    assert temp_files(tmp_path / "store") == []
    fresh.close()


@pytest.mark.parametrize("after", [0, 3, 6])
@pytest.mark.parametrize("op", ["write", "put"])
def test_a_failed_piece_or_commit_fails_the_save_and_leaves_nothing(tmp_path, op, after):
    data = checkpoint(1)
    store = FailingStore(LocalStore(tmp_path / "store"), fail_on={op},
                         key_prefix=keys.PACKS, after=after, times=1)
    fs = make_fs(store)
    with pytest.raises(StoreUnavailable):
        save(fs, "ckpt.pt", data)
    assert store.failures[op] == 1
    with pytest.raises(NotFound):
        fs.stat("ckpt.pt")
    fs.settle_deltas()
    fs.close()
    assert temp_files(tmp_path / "store") == []
    fs = make_fs(store)
    save(fs, "ckpt.pt", data)                        # the store works again
    assert read(fs, "ckpt.pt") == data
    fs.close()
    assert temp_files(tmp_path / "store") == []
