"""A read the kernel sent before it applied a truncation of the file (issue 58's bytes of
neither version).

Under FUSE an ``O_TRUNC`` open (or a ``truncate``) reaches the mount before the kernel
shrinks its own idea of the file: a reader's request sent just before may arrive after
the mount emptied the file. Answered short, the kernel fills the rest of that request's
pages with zeros and — as it already holds them — copies them out to the reader: a read
of zeros where the file never held any (found by the overwrite test under load, about
one run in a hundred). The mount answers such a read with the bytes the file had there,
as a local disk's read racing a truncate returns them; a read inside the new size gets
the new bytes. These tests drive the core as the kernel would, with no FUSE in between.
"""

from __future__ import annotations

import os
import random

import pytest

from s4fs.fs import Filesystem, FsConfig
from s4fs.stores import LocalStore

MiB = 1 << 20


def data(seed: str, n: int = 2 * MiB) -> bytes:
    return random.Random(seed).randbytes(n)


@pytest.fixture(params=["default", "writeback"])
def fs(request, tmp_path):
    f = Filesystem(LocalStore(str(tmp_path / "store")),
                   FsConfig(cache_dir=str(tmp_path / "cache"),
                            writeback=request.param == "writeback"))
    yield f
    f.close()


def write(fs, path: str, body: bytes, *, keep_open: bool = False):
    h = fs.open_write(path, truncate=True)
    for i in range(0, len(body), 100003):
        h.write(i, body[i:i + 100003])
    if keep_open:
        return h
    h.flush()
    h.release()
    return None


@pytest.mark.parametrize("committed", [True, False], ids=["committed", "still-open"])
def test_a_read_sent_before_an_o_trunc_gets_the_old_bytes_not_zeros(fs, committed):
    old, new = data("old"), data("new")
    held = write(fs, "f.bin", old, keep_open=not committed)
    r = fs.open_read("f.bin")
    try:
        assert bytes(r.read(0, len(old))) == old
        # the O_TRUNC open: the mount empties the file (a new spool file where the
        # handle was still open: its readers' old bytes stay readable)
        w = fs.open_write("f.bin", truncate=True)
        # a request the kernel sent before it shrank the file: the old bytes
        got = bytes(r.read(MiB, MiB))
        assert got == old[MiB:], "a read past the new end must not come back short"
        assert bytes(r.read(0, 3 * 4096)) == old[:3 * 4096]
        # the writer's bytes land; reads inside the new size are the new bytes
        w.write(0, new[:300000])
        assert bytes(r.read(0, 300000)) == new[:300000]
        assert bytes(r.read(8192, 4096)) == new[8192:12288]
        w.write(300000, new[300000:])
        assert bytes(r.read(0, len(new))) == new
        w.flush()
        w.release()
    finally:
        r.release()
        if held is not None:
            held.flush()
            held.release()
    assert bytes(fs.open_read("f.bin").read(0, len(new) + 1)) == new


def test_the_page_of_the_new_end_is_not_filled_with_old_bytes(fs):
    """A read the kernel sends after the truncation asks at most for the page that holds
    the new end: past that end it gets zeros, never old bytes the kernel would keep."""
    old, new = data("old"), data("new")
    write(fs, "f.bin", old)
    r = fs.open_read("f.bin")
    try:
        r.read(0, 4096)
        w = fs.open_write("f.bin", truncate=True)
        w.write(0, new[:5000])                      # the new end inside page 1
        assert bytes(r.read(4096, 4096)) == new[4096:5000]      # short: zeros after
        got = bytes(r.read(0, 3 * 4096))            # past page 1: the old bytes there
        assert got == new[:5000] + bytes(8192 - 5000) + old[8192:3 * 4096]
        w.flush()
        w.release()
    finally:
        r.release()


def test_a_spool_emptied_by_o_trunc_keeps_its_name_for_the_journal(tmp_path):
    f = Filesystem(LocalStore(str(tmp_path / "store")),
                   FsConfig(cache_dir=str(tmp_path / "cache"), writeback=True))
    try:
        h = write(f, "f.bin", data("old"), keep_open=True)
        name = h.spool.name
        again = f.open_write("f.bin", truncate=True)
        assert again is h and h.spool.name == name and os.path.getsize(name) == 0
        again.write(0, b"new bytes")
        again.flush()
        again.release()
        h.flush()
        h.release()
        f.sync()
        assert bytes(f.open_read("f.bin").read(0, 100)) == b"new bytes"
    finally:
        f.close()


def test_a_held_descriptor_keeps_its_file_when_the_unlink_races_the_committer(tmp_path,
                                                                               monkeypatch):
    """Under ``--writeback`` a file closed but not yet committed is unlinked while a
    reader holds it (checkpoint rotation): the unlinked writer is closed by the committer
    at once. Where that came before the unlink marked the file as gone, the reader's
    ``fstat`` found no file (ENOENT, CI under load); a local disk's held descriptor
    still has one, with its bytes. Here the committer is let in at that very moment."""
    import threading
    import time
    from s4fs.write.handle import WriteHandle
    gate = threading.Event()                        # the commit waits for the unlink
    commit = WriteHandle.background_commit
    monkeypatch.setattr(WriteHandle, "background_commit",
                        lambda self: (gate.wait(10), commit(self))[1])
    fs = Filesystem(LocalStore(str(tmp_path / "store")),
                    FsConfig(cache_dir=str(tmp_path / "cache"), writeback=True))
    body = data("rotated", 3 * MiB)
    try:
        write(fs, "ckpt.bin", body)                 # accepted; its commit pending
        r = fs.open_read("ckpt.bin")
        w = r.node.writer
        assert w is not None and r.node.version is None     # read from the spool
        detach = fs.files._detach

        def late_detach(node):                      # the committer goes first
            gate.set()
            deadline = time.monotonic() + 10
            while w.live() and time.monotonic() < deadline:
                time.sleep(0.01)
            assert not w.live(), "the committer never closed the unlinked writer"
            detach(node)
        monkeypatch.setattr(fs.files, "_detach", late_detach)
        fs.unlink("ckpt.bin")
        assert fs.node_attr(r.node).size == len(body)      # fstat of the held descriptor
        assert bytes(r.read(0, len(body) + 1)) == body
        r.release()
        assert not fs.exists("ckpt.bin")
    finally:
        fs.close()
