"""A file whose bytes reach its spool behind the handle's back (FUSE passthrough: the
kernel writes the spool itself, no write request) in the default mode: the handle's
ingest thread follows the spool as it grows and codes it meanwhile, and the commit
stores exactly the spool's final bytes — also when bytes already coded were rewritten
or a hole read as zeros was filled later, which the handle cannot see happen.

Here the test writes the spool through a descriptor of its own, as the kernel does."""

from __future__ import annotations

import io
import os
import time

import pytest
import torch

from disk_helpers import stored_file as store_holds
from s4fs.coding import IngestConfig
from s4fs.fs import Filesystem, FsConfig
from s4fs.runtime import current
from s4fs.stores import LocalStore

MiB = 1 << 20


@pytest.fixture(scope="module", autouse=True)
def _pool():
    yield
    current().pools.close()


@pytest.fixture(params=["threads", "processes"])
def fs(request, tmp_path):
    cfg = IngestConfig(processes=request.param == "processes", workers=2)
    f = Filesystem(LocalStore(str(tmp_path / "store")),
                   FsConfig(ingest=cfg, cache_dir=str(tmp_path / "cache")))
    yield f
    f.close()


def stored_file(tmp_path, path: str) -> bytes:
    return store_holds(tmp_path / "store", path)


def checkpoint(seed: int) -> bytes:
    g = torch.Generator().manual_seed(seed)
    model = {f"layer{i}.weight": torch.randn(1024, 1024, generator=g) for i in range(6)}
    optim = {f"exp_avg{i}": torch.randn(1024, 1024, generator=g) * 1e-3 for i in range(2)}
    buf = io.BytesIO()
    torch.save({"model": model, "optim": optim, "step": seed}, buf)
    return buf.getvalue()


class Kernel:
    """Writes a handle's spool directly, as the kernel does under passthrough."""

    def __init__(self, handle) -> None:
        self.h = handle
        handle.written_behind()
        self.fd = os.open(handle.spool.name, os.O_WRONLY)

    def write(self, offset: int, data: bytes, piece: int = MiB) -> None:
        for k in range(0, len(data), piece):
            os.pwrite(self.fd, data[k:k + piece], offset + k)

    def close(self) -> None:
        os.close(self.fd)
        self.h.flush()            # close(): commits before it returns (default mode)
        self.h.release()


def save_patched_after_coding(fs, name: str, first: bytes, at: int, n: int) -> bytes:
    """Write ``first`` behind a new handle of ``name``, wait until the ingest thread has
    coded it, patch ``n`` random bytes at ``at``, close; the bytes the file must hold."""
    h = fs.open_write(name)
    k = Kernel(h)
    k.write(0, first)
    coded_up_to(h, len(first))
    patch = os.urandom(n)
    k.write(at, patch)
    k.close()
    return first[:at] + patch + first[at + n:]


def coded_up_to(h, n: int, timeout: float = 30.0) -> None:
    """Wait until the handle's ingest thread has taken the first ``n`` bytes."""
    deadline = time.monotonic() + timeout
    while h.stream.ingested < n:
        assert time.monotonic() < deadline, \
            f"the ingest thread took {h.stream.ingested} of {n} bytes written behind it"
        time.sleep(0.01)


def test_a_spool_written_behind_the_handle_is_coded_as_it_grows(fs, tmp_path):
    """The ingest thread takes the bytes while they are written, before any close(), and
    the commit stores them exactly."""
    want = checkpoint(1)
    h = fs.open_write("ckpt.pt")
    k = Kernel(h)
    k.write(0, want)
    coded_up_to(h, len(want))            # no flush, no write request: it followed
    k.close()
    assert stored_file(tmp_path, "ckpt.pt") == want
    assert fs.manifest("ckpt.pt").kind == "torch-zip"


def test_bytes_rewritten_after_they_were_coded_are_stored_as_rewritten(fs, tmp_path):
    """A patch of bytes the ingest thread already coded (same size: nothing the handle
    sees but the spool's mtime) is in the stored file, not the first bytes."""
    want = save_patched_after_coding(fs, "ckpt.pt", checkpoint(2), 3 * MiB + 17, 5000)
    assert stored_file(tmp_path, "ckpt.pt") == want


def test_a_hole_coded_as_zeros_then_filled_is_stored_filled(fs, tmp_path):
    """The end written first: the thread codes the hole before it as zeros; the bytes
    written into it later are what is stored."""
    body = checkpoint(3)
    h = fs.open_write("ckpt.pt")
    k = Kernel(h)
    k.write(len(body), b"trailer")
    coded_up_to(h, len(body))
    k.write(0, body)
    k.close()
    assert stored_file(tmp_path, "ckpt.pt") == body + b"trailer"


def test_a_truncate_below_what_was_coded_is_stored_short(fs, tmp_path):
    """A shrink by truncate (a SETATTR the daemon does get) after the thread took the
    bytes, then a different tail: stored as written."""
    first = checkpoint(4)
    h = fs.open_write("ckpt.pt")
    k = Kernel(h)
    k.write(0, first)
    coded_up_to(h, len(first))
    h.truncate(5 * MiB)
    k.write(5 * MiB, b"other tail")
    k.close()
    assert stored_file(tmp_path, "ckpt.pt") == first[:5 * MiB] + b"other tail"


def test_the_next_version_written_behind_after_a_commit_is_coded_again(fs, tmp_path):
    """fsync commits the first bytes; more bytes written behind the handle afterwards
    make a new version, followed and committed in turn."""
    first, more = checkpoint(5), os.urandom(3 * MiB)
    h = fs.open_write("log.bin")
    k = Kernel(h)
    k.write(0, first)
    h.fsync()
    assert stored_file(tmp_path, "log.bin") == first
    k.write(len(first), more)
    coded_up_to(h, len(first) + len(more))
    k.close()
    assert stored_file(tmp_path, "log.bin") == first + more


def test_writeback_codes_a_checkpoint_against_the_one_still_committing(tmp_path):
    """``--writeback --passthrough``: a checkpoint written while the one before it is
    still being committed (its manifest put takes a second: a slow store) waits for
    that commit before it starts coding, and is stored as a delta of it — not whole for
    want of a committed base. Both read back exact."""
    import threading
    from s4fs.report import file_report

    class SlowManifests(LocalStore):
        def __init__(self, root):
            super().__init__(root)
            self.slow = threading.Event()

        def put(self, key, data):
            if key == "files/ckpt_1.pt":
                self.slow.set()
                time.sleep(1.0)
            super().put(key, data)

    store = SlowManifests(str(tmp_path / "store"))
    fs = Filesystem(store, FsConfig(ingest=IngestConfig(workers=2), writeback=True,
                                    cache_dir=str(tmp_path / "cache")))
    g = torch.Generator().manual_seed(3)
    w = {f"layer{i}.weight": torch.randn(1024, 1024, generator=g) for i in range(4)}
    saves = []
    for step in (1, 2):
        w["layer0.weight"][step] += 1.0          # one row moves: the rest is the same
        buf = io.BytesIO()
        torch.save({"model": w, "step": step}, buf)
        saves.append(buf.getvalue())
    try:
        for k, raw in enumerate(saves, 1):
            kernel = Kernel(fs.open_write(f"ckpt_{k}.pt"))
            kernel.write(0, raw)
            kernel.close()                    # writeback: accepted, committed later
            if k == 1:
                assert store.slow.wait(30)    # ckpt_1's commit is under way
        assert fs.sync(timeout=60) == []
        assert file_report(fs, "ckpt_2.pt")["base"] == "ckpt_1.pt"
    finally:
        fs.close()
    for k, raw in enumerate(saves, 1):
        assert stored_file(tmp_path, f"ckpt_{k}.pt") == raw


@pytest.mark.parametrize("while_written", [True, False])
def test_writeback_codes_while_written_or_only_after_close(tmp_path, while_written):
    """``--writeback --passthrough`` leaves the save alone and codes the file once
    close() accepted it; ``--code-while-written`` follows the spool while the kernel
    writes it. Either way the store holds the bytes exactly."""
    fs = Filesystem(LocalStore(str(tmp_path / "store")),
                    FsConfig(ingest=IngestConfig(workers=2), writeback=True,
                             code_while_written=while_written,
                             cache_dir=str(tmp_path / "cache")))
    want = checkpoint(6)
    try:
        h = fs.open_write("ckpt.pt")
        kernel = Kernel(h)
        kernel.write(0, want)
        if while_written:
            coded_up_to(h, len(want))
        else:
            time.sleep(0.5)                   # several looks of a following thread
            with h._cond:
                h.behind()
            assert h.stream.ingested == 0 and not h.stream.running
        kernel.close()                        # accepted; the commit runs behind it
        assert fs.sync(timeout=60) == []
    finally:
        fs.close()
    assert stored_file(tmp_path, "ckpt.pt") == want


def test_the_mount_option_sets_when_writeback_codes():
    """``s4fs mount --writeback`` codes after close by default; ``--code-while-written``
    (fstab: ``code_while_written``) asks for coding while the kernel writes."""
    from s4fs.cli import _fs_config, build_parser
    parse = build_parser().parse_args
    assert not _fs_config(parse(["mount", "st", "mp", "--writeback"])).code_while_written
    cfg = _fs_config(parse(["mount", "st", "mp", "--writeback", "--code-while-written"]))
    assert cfg.writeback and cfg.code_while_written
