"""A fresh node's read of a file it never saw, through a real FUSE mount: the decoded
bytes are pushed into the kernel's page cache as the decode ahead lands them
(s4fs.vfs.push). torch.load reads every byte exactly; a file overwritten on the mount
while its old version is being pushed reads back as the new version only; a reader that
stops early (head) leaves a file that loads whole later. Runs through FUSE requests and
through passthrough (the real-kernel suite)."""

from __future__ import annotations

import io
import os
import random
import subprocess
import threading
import time

import pytest
import torch

from test_passthrough import log_of

MiB = 1 << 20


def state(seed: int, n: int = 3_000_000) -> dict:
    g = torch.Generator().manual_seed(seed)
    return {"w": torch.randn(n, generator=g),
            "b": (torch.randn(n // 2, generator=g)).bfloat16(),
            "bits": torch.randint(-2**31, 2**31 - 1, (n // 4,), generator=g,
                                  dtype=torch.int32).view(torch.float32)}


def raw(sd: dict) -> bytes:
    buf = io.BytesIO()
    torch.save(sd, buf)
    return buf.getvalue()


def same(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(
        torch.equal(a[k].view(torch.uint8), b[k].view(torch.uint8)) for k in a)


def saved_then_fresh(mount_factory, files: dict[str, bytes]):
    """``files`` saved through one mount, then a fresh node: a mount of the same store
    with an empty cache dir."""
    w = mount_factory()
    for name, data in files.items():
        with open(os.path.join(w.path, name), "wb") as f:
            f.write(data)
    w.sync()
    w.stop()
    return mount_factory(store=w.store, name="fresh", extra=["-v", "--push-cold-reads"])


def test_a_fresh_node_torch_loads_a_cold_checkpoint_exactly(mount_factory):
    sd = state(1)
    fresh = saved_then_fresh(mount_factory, {"ckpt.pt": raw(sd)})
    p = os.path.join(fresh.path, "ckpt.pt")
    assert same(torch.load(p, weights_only=True), sd)
    assert same(torch.load(p, weights_only=True), sd)      # again: the kept copy
    with open(p, "rb") as f:
        assert f.read() == raw(sd)
    fresh.stop()                     # the daemon's log is whole
    assert "ckpt.pt: " in log_of(fresh) and "pushed into the page cache" in log_of(fresh)


def test_a_fresh_node_reads_a_cold_file_in_random_order_exactly(mount_factory):
    """Reads all over the file while it is decoded and pushed: each is the file's."""
    data = random.Random(3).randbytes(24 * MiB + 123)
    fresh = saved_then_fresh(mount_factory, {"blob.bin": data})
    rng = random.Random(4)
    with open(os.path.join(fresh.path, "blob.bin"), "rb", buffering=0) as f:
        for _ in range(200):
            off = rng.randrange(len(data))
            n = rng.randrange(1, 2 * MiB)
            f.seek(off)
            assert f.read(n) == data[off: off + n]
        f.seek(0)
        assert f.read() == data


def test_an_overwrite_while_the_old_version_is_pushed_reads_the_new_one(mount_factory):
    """A reader starts on a cold file (its old version being decoded and pushed); the
    file is overwritten through the same mount at once; every open after the
    overwrite's close() reads the new bytes only — never a pushed page of the old."""
    old, new = raw(state(5)), raw(state(6, 2_500_000))
    fresh = saved_then_fresh(mount_factory, {"ckpt.pt": old})
    p = os.path.join(fresh.path, "ckpt.pt")
    got = {}

    def read_old():
        with open(p, "rb") as f:
            got["first"] = f.read(MiB)
    t = threading.Thread(target=read_old)
    t.start()
    time.sleep(0.05)
    with open(p, "wb") as f:
        f.write(new)
    t.join(60)
    # a read racing the overwrite: as on a local disk, some of the old bytes, or of the
    # new (nothing, if the truncate came first) — each byte one of the two versions'
    first = got["first"]
    assert len(first) <= MiB and all(b in (old[i], new[i] if i < len(new) else None)
                                     for i, b in enumerate(first))
    for _ in range(3):
        with open(p, "rb") as f:
            assert f.read() == new
        time.sleep(0.2)                  # pushes that would have gone on, did
    assert same(torch.load(p, weights_only=True), torch.load(io.BytesIO(new)))


def test_a_reader_that_stops_early_leaves_a_file_that_loads_whole(mount_factory):
    """`head -c` of a cold checkpoint, then torch.load of it: exact."""
    sd = state(7)
    fresh = saved_then_fresh(mount_factory, {"ckpt.pt": raw(sd)})
    p = os.path.join(fresh.path, "ckpt.pt")
    out = subprocess.run(["head", "-c", "100", p], capture_output=True, timeout=60)
    assert out.returncode == 0 and out.stdout == raw(sd)[:100]
    assert same(torch.load(p, weights_only=True), sd)


def test_a_damaged_pack_read_while_pushed_is_an_io_error_never_other_bytes(mount_factory):
    """A fresh node's pushed read of a file one of whose packs was damaged in the store:
    torch.load fails, and a plain read of the file returns, piece by piece, either the
    file's bytes or EIO — never other bytes, never zeros of a batch that failed."""
    import errno
    data = raw(state(8))
    fresh = saved_then_fresh(mount_factory, {"ckpt.pt": data})
    packs = sorted((os.path.join(d, n) for d, _, ns in os.walk(fresh.store) for n in ns
                    if "pack" in d), key=os.path.getsize)
    assert packs, "the store keeps its chunks in packs"
    with open(packs[-1], "r+b") as f:            # the largest: tensor chunks
        f.seek(os.path.getsize(packs[-1]) // 2)
        f.write(b"\xa5" * 4096)
    p = os.path.join(fresh.path, "ckpt.pt")
    with pytest.raises(Exception):
        torch.load(p, weights_only=True)
    failed = 0
    with open(p, "rb", buffering=0) as f:
        for off in range(0, len(data), MiB):
            f.seek(off)
            try:
                got = f.read(MiB)
            except OSError as exc:
                assert exc.errno == errno.EIO
                failed += 1
                continue
            assert got == data[off: off + MiB], f"other bytes at {off}"
    assert failed, "the damaged chunk's bytes must not read"


def test_a_cold_file_renamed_and_unlinked_while_pushed_reads_whole(mount_factory):
    """A fresh node reads a cold checkpoint while it is decoded and pushed; meanwhile
    the file is renamed, then unlinked (a rotation deleting old checkpoints): the
    descriptor held reads every byte of it, and torch.load of the renamed file before
    the unlink is exact."""
    data = raw(state(9))
    fresh = saved_then_fresh(mount_factory, {"ckpt.pt": data, "other.pt": raw(state(10))})
    p, q = os.path.join(fresh.path, "ckpt.pt"), os.path.join(fresh.path, "moved.pt")
    with open(p, "rb", buffering=0) as f:
        head = f.read(MiB)
        os.rename(p, q)
        assert same(torch.load(q, weights_only=True), torch.load(io.BytesIO(data)))
        os.unlink(q)
        os.unlink(os.path.join(fresh.path, "other.pt"))
        rest = f.read()
    assert head + rest == data
    assert not os.path.exists(q)
