"""The filesystem core (s4fs.vfs) driven as the kernel drives it, without a kernel.

Each test runs the core on trio with a recording fake of the kernel port: the fake hands
out backing ids and keeps a descriptor of each backing file, as the kernel does, and
records every invalidation the core asks for. Where the kernel would write or read a
file passed through to a backing file, the test does it on the fake's descriptor. What
only a real kernel shows (page cache, mmap, EBUSY reaching the caller) stays in
tests/mount.
"""

from __future__ import annotations

import errno
import os
import random
import stat
import threading
import time

import pytest
import trio

from disk_helpers import stored_file
from s4fs.coding import IngestConfig
from s4fs.errors import Busy, InvalidArgument, NotFound, S4Error, StoreUnavailable
from s4fs.fs import Filesystem, FsConfig
from s4fs.stores.faulty import FailingStore
from s4fs.stores.local import LocalStore
from s4fs.vfs import ROOT_INODE, KernelPort, Vfs

# a thread of the core that dies (a pusher, a committer) is a failure of the test that
# started it, not a warning after the run
pytestmark = pytest.mark.filterwarnings("error::pytest.PytestUnhandledThreadExceptionWarning")

MiB = 1 << 20
PAGE = 4096
PIECE = 100003                  # unaligned, as torch.save's writes are
AHEAD = IngestConfig(processes=True, workers=1)   # a mount's: cold files decoded ahead


def data(seed: str, n: int) -> bytes:
    return random.Random(seed).randbytes(n)


class RecordingPort(KernelPort):
    """The kernel, as far as the core can tell: backing ids for files (the kernel keeps
    its own reference to each), and the invalidations asked for, in order. ``refuse``:
    the errno every backing open fails with (the kernel cannot pass through here)."""

    def __init__(self, refuse: int | None = None, refuse_pushes: int | None = None) -> None:
        self.refuse = refuse
        self.refuse_pushes = refuse_pushes
        self.calls: list[tuple] = []
        self.files: dict[int, int] = {}         # backing id -> the kernel's descriptor
        self._next = 1
        # the page cache, as far as pushes fill it: inode -> (bytes, pages whole in it)
        self.pages: dict[int, tuple[bytearray, set[int]]] = {}
        self.pushed: list[tuple[int, int, int]] = []     # (inode, offset, length)
        self.heads: list[bytes] = []            # each push's first bytes
        self.lock = threading.Lock()
        self.on_push = None                     # called before each push (tests' hook)

    def open_backing(self, fd: int) -> int:
        if self.refuse is not None:
            self.calls.append(("refused", self.refuse))
            raise OSError(self.refuse, os.strerror(self.refuse))
        bid, self._next = self._next, self._next + 1
        # the kernel opens the backing file anew for each passthrough open, with that
        # open's flags (a save passes through to a copy the daemon holds read-only)
        self.files[bid] = os.open(f"/proc/self/fd/{fd}", os.O_RDWR)
        self.calls.append(("open_backing", bid))
        return bid

    def close_backing(self, backing_id: int) -> None:
        os.close(self.files.pop(backing_id))
        self.calls.append(("close_backing", backing_id))

    def invalidate_inode(self, inode: int, *, attr_only: bool) -> None:
        if not attr_only:
            time.sleep(0.05)      # the kernel waits for the pages reads in flight hold
            self.drop_pages(inode)
        self.calls.append(("invalidate_inode", inode, attr_only))

    def store_pages(self, inode: int, offset: int, data) -> None:
        if self.on_push is not None:
            self.on_push(inode, offset, len(data))
        if self.refuse_pushes is not None:
            raise OSError(self.refuse_pushes, os.strerror(self.refuse_pushes))
        with self.lock:
            buf, whole = self.pages.setdefault(inode, (bytearray(), set()))
            end = offset + len(data)
            if len(buf) < end:
                buf.extend(bytes(end - len(buf)))
            buf[offset:end] = data
            # as the kernel: a page is cached only where the push covers it whole
            whole.update(range(-(-offset // PAGE), end // PAGE))
            self.pushed.append((inode, offset, len(data)))
            self.heads.append(bytes(data[:64]))

    def drop_pages(self, inode: int) -> None:
        with self.lock:
            self.pages.pop(inode, None)

    def cached(self, inode: int, off: int, size: int) -> bytes | None:
        """The bytes [off, off + size) from the pages pushed, if all are there."""
        with self.lock:
            got = self.pages.get(inode)
            if got is None or size <= 0:
                return None
            buf, whole = got
            if all(p in whole for p in range(off // PAGE, -(-(off + size) // PAGE))):
                return bytes(buf[off: off + size])
        return None

    def invalidate_entry(self, parent: int, name: bytes) -> None:
        self.calls.append(("invalidate_entry", parent, name))

    def named(self, what: str) -> list[tuple]:
        return [c for c in self.calls if c[0] == what]


class Kernel:
    """Requests as the kernel sends them for the system calls a test makes. A file
    opened with a backing id is read and written on the backing file itself."""

    def __init__(self, vfs: Vfs, port: RecordingPort) -> None:
        self.vfs, self.port = vfs, port
        self.inode_of: dict[int, int] = {}       # fh -> inode
        self.from_pages = 0                      # bytes reads found in pushed pages

    async def create(self, name: str, parent: int = ROOT_INODE):
        opened, entry = await self.vfs.create(parent, name, 0o644, os.O_WRONLY)
        self.inode_of[opened.fh] = entry.inode
        self.port.drop_pages(entry.inode)        # a new file's pages are its writes'
        return opened, entry.inode

    async def open(self, name: str, flags: int, parent: int = ROOT_INODE):
        inode = (await self.vfs.lookup(parent, name)).inode
        opened = await self.vfs.open(inode, flags)
        self.inode_of[opened.fh] = inode
        if not opened.backing_id and not opened.keep_cache:
            self.port.drop_pages(inode)          # the kernel drops them at this open
        return opened, inode

    async def write(self, opened, data: bytes, off: int = 0) -> None:
        if opened.fh in self.inode_of:           # written pages are the writes' bytes
            self.port.drop_pages(self.inode_of[opened.fh])
        for i in range(0, len(data), PIECE):
            piece = data[i:i + PIECE]
            if opened.backing_id:
                os.pwrite(self.port.files[opened.backing_id], piece, off + i)
            else:
                assert await self.vfs.write(opened.fh, off + i, piece) == len(piece)

    async def read(self, opened, size: int, off: int = 0) -> bytes:
        if opened.backing_id:
            return os.pread(self.port.files[opened.backing_id], size, off)
        out = bytearray()
        inode = self.inode_of.get(opened.fh)
        # as the kernel: cached pages are read up to the file's size, no further
        end = off + size if inode is None else \
            min(off + size, (await self.vfs.getattr(inode)).size)
        while len(out) < size:
            want = min(MiB, size - len(out))
            cut = min(want, end - off - len(out))
            got = self.port.cached(inode, off + len(out), cut) if inode else None
            if got is not None:                  # the page cache: no request
                self.from_pages += len(got)
            else:
                got = await self.vfs.read(opened.fh, off + len(out), want)
            if not got:
                break
            out += got
        return bytes(out)

    async def close(self, opened) -> None:
        """close(): the kernel's flush, then (the last reference gone) its release."""
        try:
            await self.vfs.flush(opened.fh)
        finally:
            await self.vfs.release(opened.fh)

    async def save(self, name: str, payload: bytes) -> int:
        opened, inode = await self.create(name)
        await self.write(opened, payload)
        await self.close(opened)
        return inode

    async def read_file(self, name: str) -> bytes:
        opened, inode = await self.open(name, os.O_RDONLY)
        try:
            size = (await self.vfs.getattr(inode)).size
            return await self.read(opened, size)
        finally:
            await self.vfs.release(opened.fh)


@pytest.fixture
def site(tmp_path):
    """``make(passthrough=..., store=..., **cfg)``: a core over a local store with a
    recording port; ``stored(name)``: a file's bytes as a fresh node reads them."""
    made = []
    root = str(tmp_path / "store")

    def make(*, passthrough=False, optional=False, refuse=None, store=None,
             refuse_pushes=None, **cfg):
        cfg.setdefault("metadata_ttl", 0.0)
        cfg.setdefault("cache_dir", str(tmp_path / f"cache{len(made)}"))
        fs = Filesystem(store or LocalStore(root), FsConfig(**cfg))
        port = RecordingPort(refuse, refuse_pushes)
        vfs = Vfs(fs, port, uid=1234, gid=5678)
        vfs.passthrough.enabled, vfs.passthrough.optional = passthrough, optional
        made.append(fs)
        return Kernel(vfs, port)

    make.stored = lambda name: stored_file(root, name)
    yield make
    for fs in made:
        fs.close()


# --- namespace and inode tables -----------------------------------------------------

def test_a_file_saved_through_the_core_reads_back_and_is_stored_exact(site):
    k = site()
    payload = data("a", 3 * MiB + 17)

    async def main():
        inode = await k.save("ckpt.pt", payload)
        entry = await k.vfs.lookup(ROOT_INODE, "ckpt.pt")
        assert (entry.inode, entry.size, entry.nlink) == (inode, len(payload), 1)
        assert (entry.uid, entry.gid) == (1234, 5678)
        assert await k.read_file("ckpt.pt") == payload
    trio.run(main)
    assert site.stored("ckpt.pt") == payload
    assert k.port.named("open_backing") == []         # passthrough off: requests only


def test_inodes_follow_renames_and_a_removed_name_is_not_found(site):
    k = site()

    async def main():
        await k.vfs.mkdir(ROOT_INODE, "run", 0o755)
        run = (await k.vfs.lookup(ROOT_INODE, "run")).inode
        a = await k.save("a.pt", b"first")
        await k.vfs.rename(ROOT_INODE, "a.pt", run, "b.pt")
        assert (await k.vfs.lookup(run, "b.pt")).inode == a
        with pytest.raises(NotFound):
            await k.vfs.lookup(ROOT_INODE, "a.pt")
        # a folder renamed: what is under it keeps its inode
        await k.vfs.rename(ROOT_INODE, "run", ROOT_INODE, "run2")
        assert (await k.vfs.lookup(ROOT_INODE, "run2")).inode == run
        assert (await k.vfs.getattr(a)).size == 5
        # renamed over: the name keeps the moved file's inode, the old one names nothing
        c = await k.save("c.pt", b"third!")
        await k.vfs.rename(ROOT_INODE, "c.pt", run, "b.pt")
        assert (await k.vfs.lookup(run, "b.pt")).inode == c
        with pytest.raises(NotFound):
            await k.vfs.getattr(a)
        await k.vfs.unlink(run, "b.pt")
        with pytest.raises(NotFound):
            await k.vfs.getattr(c)
        with pytest.raises(NotFound):
            await k.vfs.open(a, os.O_RDONLY)
    trio.run(main)


def test_a_file_unlinked_while_open_reads_whole_and_shows_no_links(site):
    k = site()
    payload = data("u", 2 * MiB)

    async def main():
        await k.save("x.pt", payload)
        opened, inode = await k.open("x.pt", os.O_RDONLY)
        await k.vfs.unlink(ROOT_INODE, "x.pt")
        e = await k.vfs.getattr(inode)
        assert (e.nlink, e.size) == (0, len(payload))
        assert await k.read(opened, len(payload)) == payload
        await k.vfs.release(opened.fh)
        with pytest.raises(NotFound):
            await k.vfs.getattr(inode)
    trio.run(main)


def test_rename_exchange_is_refused_and_changes_nothing(site):
    k = site()

    async def main():
        await k.save("a", b"A")
        await k.save("b", b"B")
        with pytest.raises(InvalidArgument, match="RENAME_EXCHANGE"):
            await k.vfs.rename(ROOT_INODE, "a", ROOT_INODE, "b", exchange=True)
        assert (await k.read_file("a"), await k.read_file("b")) == (b"A", b"B")
        with pytest.raises(S4Error):
            await k.vfs.rename(ROOT_INODE, "a", ROOT_INODE, "b", noreplace=True)
        assert await k.read_file("b") == b"B"
    trio.run(main)


def test_readdir_lists_every_entry_once_from_any_offset(site):
    k = site()

    async def main():
        for n in ("a", "b", "c"):
            await k.save(n, n.encode())
        fh = await k.vfs.opendir(ROOT_INODE)
        got = [(name, e.size, nxt) async for name, e, nxt in k.vfs.readdir(fh, 0)]
        assert [g[0] for g in got] == [".", "..", "a", "b", "c"]
        rest = [name async for name, _, _ in k.vfs.readdir(fh, got[2][2])]
        assert rest == ["b", "c"]
        await k.vfs.releasedir(fh)
    trio.run(main)


def test_setattr_truncates_by_path_and_keeps_the_mode(site):
    k = site()
    payload = data("t", MiB + 5)

    async def main():
        inode = await k.save("t.pt", payload)
        e = await k.vfs.setattr(inode, {"size": 1000, "mode": 0o600}, None)
        assert (e.size, e.mode & 0o777) == (1000, 0o600)
        assert await k.read_file("t.pt") == payload[:1000]
    trio.run(main)
    assert site.stored("t.pt") == payload[:1000]


# --- coherence: what the kernel is told to drop ---------------------------------------

def test_a_save_nobody_read_lets_the_kernel_keep_its_pages(site):
    k = site()

    async def main():
        inode = await k.save("w.pt", data("w", 2 * MiB))
        opened, _ = await k.open("w.pt", os.O_RDONLY)
        assert opened.keep_cache          # the kernel's pages are the committed bytes
        await k.vfs.release(opened.fh)
        return inode
    inode = trio.run(main)
    assert ("invalidate_inode", inode, False) not in k.port.calls


def test_a_read_during_a_save_has_the_kernels_pages_dropped_before_close_returns(site):
    k = site()
    payload = data("r", 3 * MiB)

    async def main():
        w, inode = await k.create("r.pt")
        await k.write(w, payload[:MiB])
        r, _ = await k.open("r.pt", os.O_RDONLY)
        assert await k.read(r, MiB) == payload[:MiB]
        await k.write(w, payload[MiB:], MiB)
        await k.close(w)
        # dropped by the time close() returned: a read after it sees no stale page
        assert ("invalidate_inode", inode, False) in k.port.calls
        await k.vfs.release(r.fh)
        assert await k.read_file("r.pt") == payload
    trio.run(main)


def test_a_failed_first_save_drops_the_pages_and_the_name(site, tmp_path):
    store = FailingStore(LocalStore(str(tmp_path / "store")), fail_on={"put"},
                         key_prefix="packs/", error=StoreUnavailable)
    k = site(store=store)

    async def main():
        w, inode = await k.create("lost.pt")
        await k.write(w, data("l", MiB))
        with pytest.raises(S4Error):
            await k.close(w)
        assert ("invalidate_inode", inode, False) in k.port.calls
        assert ("invalidate_entry", ROOT_INODE, b"lost.pt") in k.port.calls
        with pytest.raises(NotFound):
            await k.vfs.lookup(ROOT_INODE, "lost.pt")
    trio.run(main)


def test_another_mounts_commit_is_read_whole_with_attributes_asked_again(site):
    k, other = site(), site()
    old, new = data("old", 2 * MiB), data("new", MiB + 3)

    async def main():
        await k.save("shared.pt", old)
        assert await k.read_file("shared.pt") == old
        await other.save("shared.pt", new)
        opened, inode = await k.open("shared.pt", os.O_RDONLY)
        assert not opened.keep_cache       # the kernel's pages are the old version's
        assert ("invalidate_inode", inode, True) in k.port.calls
        assert await k.read(opened, len(new) + 10) == new
        await k.vfs.release(opened.fh)
    trio.run(main)


def test_a_passthrough_open_of_another_mounts_commit_drops_the_old_pages_first(site):
    """The kernel holds pages of the old version (saved through requests), and a
    descriptor holds the old version's local copy through passthrough; another mount
    commits a new version; the next open here brings the held copy to it in place. The
    kernel drops an inode's pages at an open through requests without keep_cache, not at
    a passthrough open: the core drops them (and the attributes) before that open
    returns — a later open through requests is told to keep the cache, and would
    otherwise read the old version's pages beside the new ones."""
    k, other = site(passthrough=True), site()
    old, new = data("old", 2 * MiB), data("new", MiB + 3)

    async def main():
        k.vfs.passthrough.enabled = False           # pages of the old version
        await k.save("shared.pt", old)
        k.vfs.passthrough.enabled = True
        held, inode = await k.open("shared.pt", os.O_RDONLY)
        assert held.backing_id and await k.read(held, len(old)) == old
        await other.save("shared.pt", new)
        k.port.calls.clear()
        opened, _ = await k.open("shared.pt", os.O_RDONLY)
        assert opened.backing_id == held.backing_id     # the kernel's one file for it
        assert k.port.named("invalidate_inode") == [("invalidate_inode", inode, False)]
        assert await k.read(opened, len(new) + 10) == new
        assert await k.read(held, len(new) + 10) == new
        await k.vfs.release(opened.fh)
        await k.vfs.release(held.fh)
        k.vfs.passthrough.enabled = False
        again, _ = await k.open("shared.pt", os.O_RDONLY)
        assert again.keep_cache and await k.read(again, len(new) + 10) == new
        await k.vfs.release(again.fh)
    trio.run(main)


# --- the passthrough policy ------------------------------------------------------------

def test_a_save_through_passthrough_is_the_spool_the_kernel_writes(site):
    k = site(passthrough=True)
    payload = data("p", 4 * MiB + 1)

    async def main():
        w, inode = await k.create("pt.pt")
        assert w.backing_id
        await k.write(w, payload)         # on the backing file: no write request
        await k.close(w)
        return inode
    inode = trio.run(main)
    assert k.port.named("open_backing") == [("open_backing", 1)]
    assert k.port.named("close_backing") == [("close_backing", 1)]
    # the kernel wrote the spool, not its own pages: whatever pages it has are older
    assert ("invalidate_inode", inode, False) in k.port.calls
    assert site.stored("pt.pt") == payload


def test_readers_of_a_local_copy_share_one_backing_file_until_the_last_close(site):
    k = site(passthrough=True)
    payload = data("s", 2 * MiB)

    async def main():
        await k.save("s.pt", payload)
        k.port.calls.clear()
        r1, _ = await k.open("s.pt", os.O_RDONLY)
        r2, _ = await k.open("s.pt", os.O_RDONLY)
        assert r1.backing_id and r1.backing_id == r2.backing_id
        assert await k.read(r2, len(payload)) == payload
        await k.vfs.release(r1.fh)
        assert k.port.named("close_backing") == []
        await k.vfs.release(r2.fh)
        backing = [c for c in k.port.calls if c[0] != "invalidate_inode"]
        assert backing == [("open_backing", r1.backing_id),
                           ("close_backing", r1.backing_id)]
        # the kernel's pages of the inode are dropped once, at the first open (the save
        # went through passthrough: which pages the kernel holds is not known)
        assert len(k.port.named("invalidate_inode")) == 1
    trio.run(main)


def test_a_fresh_nodes_open_of_a_cold_file_passes_its_decoded_copy_through(site):
    """A fresh node (empty cache) opens a file another mount saved: the open waits for
    the file to be decoded whole onto local disk, then hands the kernel that copy, so
    no read goes through the daemon; every byte the kernel reads there is the file's,
    and the kernel is told to drop whatever pages it had of the inode."""
    k, fresh = site(), site(passthrough=True, ingest=AHEAD)
    payload = data("cold", 12 * MiB + 5)           # decoded ahead: 8 MiB or more

    async def main():
        await k.save("cold.pt", payload)
        opened, inode = await fresh.open("cold.pt", os.O_RDONLY)
        assert opened.backing_id and not opened.keep_cache
        assert ("invalidate_inode", inode, False) in fresh.port.calls
        assert await fresh.read(opened, len(payload) + 10) == payload
        await fresh.vfs.release(opened.fh)
        # the copy is the decoded cache's now: the next open reads it at once
        again, _ = await fresh.open("cold.pt", os.O_RDONLY)
        assert again.backing_id and await fresh.read(again, 64, len(payload) - 64) == \
            payload[-64:]
        await fresh.vfs.release(again.fh)
    trio.run(main)


def test_a_cold_copy_that_fails_its_check_is_not_passed_through(site, monkeypatch):
    """The copy the open waited for holds a wrong byte (every chunk passed its own
    check; the whole-file hash did not): the kernel is not handed it, and the reads
    through the daemon decode the right bytes from the store."""
    from s4fs.read.fill import Fill
    landed = Fill._landed

    def one_byte_off(fill, fut, k):
        if k == 0:
            lo = fill.ranges(k)[0][0] + 3
            os.pwrite(fill.fd, bytes([os.pread(fill.fd, 1, lo)[0] ^ 1]), lo)
        return landed(fill, fut, k)
    monkeypatch.setattr(Fill, "_landed", one_byte_off)
    k, fresh = site(), site(passthrough=True, ingest=AHEAD)
    payload = data("cold", 9 * MiB)

    async def main():
        await k.save("cold.pt", payload)
        opened, _ = await fresh.open("cold.pt", os.O_RDONLY)
        assert not opened.backing_id
        assert await fresh.read(opened, len(payload) + 1) == payload
        await fresh.vfs.release(opened.fh)
    trio.run(main)


def test_a_cold_open_waits_for_its_copy_without_holding_the_namespace(site, monkeypatch):
    """While a cold open waits for its file's decode, renames on the mount go through
    at once — of another file, and of that very file; the open then reads the file
    under its new name, through passthrough, every byte exact."""
    from s4fs.read.fill import Fill
    k, fresh = site(), site(passthrough=True, ingest=AHEAD)
    payload = data("cold", 9 * MiB)
    renamed = []
    wait_whole = Fill.wait_whole

    def renaming_first(fill):
        async def rename():
            with trio.fail_after(20):          # held up behind the open: it never ends
                await fresh.vfs.rename(ROOT_INODE, "other.pt", ROOT_INODE, "other2.pt")
                await fresh.vfs.rename(ROOT_INODE, "cold.pt", ROOT_INODE, "moved.pt")
        trio.from_thread.run(rename)
        renamed.append(True)
        return wait_whole(fill)
    monkeypatch.setattr(Fill, "wait_whole", renaming_first)

    async def main():
        await k.save("cold.pt", payload)
        await k.save("other.pt", b"other")
        opened, inode = await fresh.open("cold.pt", os.O_RDONLY)
        assert renamed and opened.backing_id
        assert await fresh.read(opened, len(payload) + 1) == payload
        assert (await fresh.vfs.lookup(ROOT_INODE, "moved.pt")).inode == inode
        await fresh.vfs.release(opened.fh)
    trio.run(main)


def test_a_cold_file_unlinked_while_its_open_waits_reads_whole(site, monkeypatch):
    """The file is unlinked while a cold open waits for its copy (another process's
    `rm`): the open still returns, and reads the version it opened, every byte, as a
    descriptor of an unlinked file does on a local disk."""
    from s4fs.read.fill import Fill
    k, fresh = site(), site(passthrough=True, ingest=AHEAD)
    payload = data("gone", 9 * MiB)
    wait_whole = Fill.wait_whole

    def unlinking_first(fill):
        async def unlink():
            with trio.fail_after(20):
                await fresh.vfs.unlink(ROOT_INODE, "gone.pt")
        trio.from_thread.run(unlink)
        return wait_whole(fill)
    monkeypatch.setattr(Fill, "wait_whole", unlinking_first)

    async def main():
        await k.save("gone.pt", payload)
        opened, _ = await fresh.open("gone.pt", os.O_RDONLY)
        assert await fresh.read(opened, len(payload) + 1) == payload
        await fresh.vfs.release(opened.fh)
        with pytest.raises(NotFound):
            await fresh.vfs.lookup(ROOT_INODE, "gone.pt")
    trio.run(main)


def test_a_cold_open_that_cannot_be_passed_through_does_not_wait(site):
    """Where the open would not be passed through anyway (the inode held open through
    the page cache; passthrough's whole-copy wait turned off) or the file is not
    decoded ahead (under 8 MiB), a cold open returns at once and reads through the
    daemon, every byte exact. ``s4fs mount --stream-cold-reads`` turns the wait off."""
    from s4fs.cli import _fs_config, build_parser
    args = build_parser().parse_args(["mount", "st", "mp", "--stream-cold-reads"])
    assert _fs_config(args).cold_reads == "stream"
    args = build_parser().parse_args(["mount", "st", "mp", "--push-cold-reads"])
    assert _fs_config(args).cold_reads == "push"
    args = build_parser().parse_args(["mount", "st", "mp", "--whole-cold-reads"])
    assert _fs_config(args).cold_reads == "whole"
    # unsaid: pushed where the machine has cores to spare beside the decode, else whole
    args = build_parser().parse_args(["mount", "st", "mp"])
    want = "push" if (os.cpu_count() or 1) >= 4 else "whole"
    assert _fs_config(args).cold_reads == want
    streams = site(passthrough=True, ingest=AHEAD, cold_reads="stream")
    assert not streams.vfs.passthrough.whole_cold
    k, fresh = site(), site(passthrough=True, ingest=AHEAD)
    big, small = data("big", 9 * MiB), data("small", MiB)

    async def main():
        await k.save("big.pt", big)
        await k.save("small.pt", small)
        opened, _ = await fresh.open("small.pt", os.O_RDONLY)
        assert not opened.backing_id and await fresh.read(opened, len(small)) == small
        await fresh.vfs.release(opened.fh)
        fresh.vfs.passthrough.whole_cold = False
        held, _ = await fresh.open("big.pt", os.O_RDONLY)      # through requests
        assert not held.backing_id
        fresh.vfs.passthrough.whole_cold = True
        opened, _ = await fresh.open("big.pt", os.O_RDONLY)
        assert not opened.backing_id                 # the page cache holds the inode
        assert await fresh.read(opened, len(big)) == big
        assert await fresh.read(held, len(big)) == big
        await fresh.vfs.release(opened.fh)
        await fresh.vfs.release(held.fh)
    trio.run(main)


def test_a_save_over_a_file_readers_hold_takes_their_copy_over(site):
    k = site(passthrough=True)
    old, new = data("old", 2 * MiB), data("new", 3 * MiB + 1)

    async def main():
        await k.save("shared.pt", old)
        r, _ = await k.open("shared.pt", os.O_RDONLY)
        assert await k.read(r, 4096) == old[:4096]
        w, _ = await k.open("shared.pt", os.O_WRONLY | os.O_TRUNC)
        assert w.backing_id == r.backing_id    # one backing file per inode
        await k.write(w, new)
        await k.close(w)
        assert await k.read(r, len(new) + 10) == new   # as on a local disk
        await k.vfs.release(r.fh)
        assert len(k.port.named("open_backing")) == 2  # the save's, then the readers'
    trio.run(main)
    assert site.stored("shared.pt") == new


def test_a_save_beside_a_reader_on_the_page_cache_stays_on_requests(site):
    k = site(passthrough=True, decoded_cache_bytes=0)   # no local copy to pass through
    old, new = data("old", MiB), data("new", 2 * MiB)

    async def main():
        await k.save("c.pt", old)
        k.port.calls.clear()
        r, _ = await k.open("c.pt", os.O_RDONLY)
        assert r.backing_id == 0
        w, _ = await k.open("c.pt", os.O_WRONLY | os.O_TRUNC)
        assert w.backing_id == 0          # the kernel allows none beside cached opens
        await k.write(w, new)
        await k.close(w)
        await k.vfs.release(r.fh)
    trio.run(main)
    assert k.port.named("open_backing") == []
    assert site.stored("c.pt") == new


def test_a_save_over_a_copy_no_cache_keeps_is_busy_and_changes_nothing(site):
    k = site(passthrough=True, decoded_cache_bytes=MiB)
    first, second = data("first", 3 * MiB + 1), data("second", 2 * MiB)

    async def main():
        w, _ = await k.create("latest.pt")
        await k.write(w, first[:MiB])
        r, _ = await k.open("latest.pt", os.O_RDONLY)  # during the save: its spool
        assert r.backing_id == w.backing_id
        await k.write(w, first[MiB:], MiB)
        await k.close(w)
        with pytest.raises(Busy) as exc:
            await k.open("latest.pt", os.O_WRONLY | os.O_TRUNC)
        assert exc.value.errno == errno.EBUSY
        assert "close them, or mount without --passthrough" in str(exc.value)
        assert await k.read(r, len(first) + 1) == first
        await k.vfs.release(r.fh)
        assert k.port.named("close_backing") == [("close_backing", r.backing_id)]
        assert await k.save("latest.pt", second)
    trio.run(main)
    assert site.stored("latest.pt") == second


@pytest.mark.parametrize("refuse", [errno.ENOTTY, errno.EPERM, errno.EOPNOTSUPP])
def test_a_kernel_without_passthrough_turns_it_off_once_when_not_asked_for(site, refuse):
    k = site(passthrough=True, optional=True, refuse=refuse)
    payload = data("n", MiB + 1)

    async def main():
        for name in ("a.pt", "b.pt"):
            w, _ = await k.create(name)
            assert w.backing_id == 0
            await k.write(w, payload)
            await k.close(w)
    trio.run(main)
    assert k.port.named("refused") == [("refused", refuse)]      # asked once
    assert not k.vfs.passthrough.enabled
    assert k.vfs.info["transport"].startswith("FUSE requests (FUSE passthrough refused")
    assert "CONFIG_FUSE_PASSTHROUGH" in k.vfs.info["transport"]
    assert site.stored("a.pt") == site.stored("b.pt") == payload


def test_passthrough_asked_for_stays_on_when_one_file_is_refused(site):
    k = site(passthrough=True, optional=False, refuse=errno.EPERM)

    async def main():
        for name in ("a.pt", "b.pt"):
            w, _ = await k.create(name)
            assert w.backing_id == 0
            await k.write(w, name.encode())
            await k.close(w)
    trio.run(main)
    assert len(k.port.named("refused")) == 2
    assert k.vfs.passthrough.enabled
    assert site.stored("b.pt") == b"b.pt"


# --- symbolic links and owners ---------------------------------------------------------

def test_a_symbolic_link_is_stored_read_and_seen_by_another_mount(site):
    k, other = site(), site()

    async def main():
        await k.save("ckpt_1000.pt", b"weights")
        e = await k.vfs.symlink(ROOT_INODE, "latest", b"ckpt_1000.pt", (1000, 1001))
        assert stat.S_ISLNK(e.mode) and e.size == len(b"ckpt_1000.pt")
        assert (e.uid, e.gid) == (1000, 1001)
        assert await k.vfs.readlink(e.inode) == b"ckpt_1000.pt"
        seen = await other.vfs.lookup(ROOT_INODE, "latest")
        assert stat.S_ISLNK(seen.mode) and (seen.uid, seen.gid) == (1000, 1001)
        assert await other.vfs.readlink(seen.inode) == b"ckpt_1000.pt"
        fh = await other.vfs.opendir(ROOT_INODE)
        names = [n async for n, _, _ in other.vfs.readdir(fh, 2)]
        assert names == ["ckpt_1000.pt", "latest"]
        with pytest.raises(S4Error):                  # a name taken by a link
            await k.vfs.symlink(ROOT_INODE, "latest", b"other", (0, 0))
        with pytest.raises(InvalidArgument):          # readlink of no link
            await k.vfs.readlink((await k.vfs.lookup(ROOT_INODE, "ckpt_1000.pt")).inode)
    trio.run(main)


def test_a_link_renamed_over_a_file_and_unlinked_leaves_the_files_it_named(site):
    k = site()

    async def main():
        await k.save("a.pt", b"A")
        await k.save("b.pt", b"B")
        await k.vfs.symlink(ROOT_INODE, "tmp-link", b"a.pt", (0, 0))
        await k.vfs.rename(ROOT_INODE, "tmp-link", ROOT_INODE, "b.pt")   # atomic flip
        assert await k.vfs.readlink((await k.vfs.lookup(ROOT_INODE, "b.pt")).inode) \
            == b"a.pt"
        await k.vfs.unlink(ROOT_INODE, "b.pt")
        with pytest.raises(NotFound):
            await k.vfs.lookup(ROOT_INODE, "b.pt")
        assert await k.read_file("a.pt") == b"A"
        # a file renamed over a link replaces it
        await k.vfs.symlink(ROOT_INODE, "l", b"a.pt", (0, 0))
        await k.save("c.pt", b"C")
        await k.vfs.rename(ROOT_INODE, "c.pt", ROOT_INODE, "l")
        assert await k.read_file("l") == b"C"
    trio.run(main)
    assert site.stored("l") == b"C"


def test_links_move_with_their_folder(site):
    k, other = site(), site()

    async def main():
        await k.vfs.mkdir(ROOT_INODE, "run", 0o755, (0, 0))
        run = (await k.vfs.lookup(ROOT_INODE, "run")).inode
        await k.vfs.symlink(run, "latest", b"ckpt_5.pt", (0, 0))
        with pytest.raises(S4Error):          # the link is in it: not empty
            await k.vfs.rmdir(ROOT_INODE, "run")
        await k.vfs.rename(ROOT_INODE, "run", ROOT_INODE, "run2")
        run2 = (await other.vfs.lookup(ROOT_INODE, "run2")).inode
        assert await other.vfs.readlink(
            (await other.vfs.lookup(run2, "latest")).inode) == b"ckpt_5.pt"
    trio.run(main)


def test_owners_and_modes_are_kept_per_file_and_folder(site):
    k, other = site(), site()

    async def main():
        await k.vfs.mkdir(ROOT_INODE, "shared", 0o2770, (1000, 2000))
        d = await k.vfs.lookup(ROOT_INODE, "shared")
        assert (d.mode & 0o7777, d.uid, d.gid) == (0o2770, 1000, 2000)
        # the folder's set-group-ID bit: new files take its group, new folders the bit
        opened, e = await k.vfs.create(d.inode, "ckpt.pt", 0o640, os.O_WRONLY, (1001, 1001))
        await k.write(opened, b"x" * 1000)
        await k.close(opened)
        sub = await k.vfs.mkdir(d.inode, "sub", 0o750, (1001, 1001))
        assert (sub.mode & 0o7777, sub.gid) == (0o2750, 2000)
        theirs = (await other.vfs.lookup(ROOT_INODE, "shared")).inode
        f = await other.vfs.lookup(theirs, "ckpt.pt")
        assert (f.mode & 0o7777, f.uid, f.gid) == (0o640, 1001, 2000)
        # chown and chmod by path, on a file and on a folder, seen by the other mount
        await k.vfs.setattr(e.inode, {"uid": 7, "gid": 8, "mode": 0o600}, None)
        await k.vfs.setattr(d.inode, {"mode": 0o755, "uid": 9}, None)
        shared = await other.vfs.lookup(ROOT_INODE, "shared")
        f = await other.vfs.lookup(shared.inode, "ckpt.pt")
        assert (f.mode & 0o7777, f.uid, f.gid) == (0o600, 7, 8)
        assert (shared.mode & 0o7777, shared.uid, shared.gid) == (0o755, 9, 2000)
        # a new version keeps the owner
        w, _ = await k.open("ckpt.pt", os.O_WRONLY | os.O_TRUNC, parent=d.inode)
        await k.write(w, b"y" * 10)
        await k.close(w)
        f = await other.vfs.lookup(shared.inode, "ckpt.pt")
        assert (f.size, f.uid, f.gid) == (10, 7, 8)
    trio.run(main)


def test_files_that_record_no_owner_show_the_mounts(site):
    k = site()

    async def main():
        opened, e = await k.vfs.create(ROOT_INODE, "old.pt", 0o644, os.O_WRONLY)
        await k.close(opened)
        e = await k.vfs.lookup(ROOT_INODE, "old.pt")
        assert (e.uid, e.gid) == (1234, 5678)        # the mount's (--uid/--gid)
    trio.run(main)


# --- a cold file read while it is decoded: its bytes pushed into the kernel's pages ----

def _until(cond, seconds: float = 30.0) -> None:
    deadline = time.monotonic() + seconds
    while not cond():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


@pytest.mark.parametrize("passthrough", [True, False], ids=["passthrough", "requests"])
def test_a_fresh_nodes_cold_open_returns_at_once_and_its_bytes_are_pushed(site,
                                                                         passthrough):
    """A fresh node opens a file another mount saved: the open returns at once through
    the page cache (no backing file), the kernel's pages of the inode dropped first and
    kept from then on; the decoded bytes are pushed into them as they land, so reads
    find them there; every byte read is the file's, whether a read found pushed pages
    or went to the daemon. Later opens read the kept copy."""
    k, fresh = site(), site(passthrough=passthrough, ingest=AHEAD, cold_reads="push")
    payload = data("cold", 12 * MiB + 5)

    async def main():
        await k.save("cold.pt", payload)
        opened, inode = await fresh.open("cold.pt", os.O_RDONLY)
        assert not opened.backing_id and opened.keep_cache
        assert ("invalidate_inode", inode, False) in fresh.port.calls
        head = await fresh.read(opened, 4096)           # torch.load's first read
        assert head == payload[:4096]
        m = fresh.vfs.fs.manifest("cold.pt")
        await trio.to_thread.run_sync(
            _until, lambda: sum(n for i, _, n in fresh.port.pushed if i == inode)
            >= len(payload) - 2 * PAGE)
        assert await fresh.read(opened, len(payload) + 10) == payload
        assert fresh.from_pages >= len(payload) - 2 * MiB   # found in the pushed pages
        # the copy becomes the decoded cache's once its whole-file hash is checked,
        # which may be just after the last batch (and so the last read) landed
        await trio.to_thread.run_sync(_until, lambda: fresh.vfs.fs.decoded.path_of(m.id))
        await fresh.vfs.release(opened.fh)
        again, _ = await fresh.open("cold.pt", os.O_RDONLY)
        assert bool(again.backing_id) == passthrough
        assert await fresh.read(again, 64, len(payload) - 64) == payload[-64:]
        await fresh.vfs.release(again.fh)
    trio.run(main)
    pushed = sorted((o, n) for _, o, n in fresh.port.pushed)
    assert all(0 <= o and o + n <= len(payload) for o, n in pushed)


def test_a_read_ahead_of_the_decode_waits_for_its_batch_and_is_exact(site):
    """The reader runs ahead of the pushes (each push held up): its reads go to the
    daemon, wait for their batches, and return the file's bytes."""
    k, fresh = site(), site(ingest=AHEAD, cold_reads="push")
    fresh.port.on_push = lambda inode, off, n: time.sleep(0.02)
    payload = data("ahead", 10 * MiB + 7)

    async def main():
        await k.save("ahead.pt", payload)
        opened, _ = await fresh.open("ahead.pt", os.O_RDONLY)
        assert opened.keep_cache
        assert await fresh.read(opened, len(payload) + 1) == payload
        await fresh.vfs.release(opened.fh)
    trio.run(main)


@pytest.mark.parametrize("how", ["overwrite", "truncate", "other-mount"])
def test_no_push_of_the_version_before_lands_after_the_file_changes(site, how):
    """Pushes are slow (each held up); meanwhile the file changes — overwritten through
    this mount, truncated by path, or committed anew by another mount and opened here —
    and from the moment that change's request returns no push of the old version
    reaches the kernel's pages: every read after it returns the new bytes only."""
    k, fresh = site(), site(ingest=AHEAD, cold_reads="push")
    holding = threading.Event()

    def slow(inode, off, n):
        holding.set()
        time.sleep(0.03)
    fresh.port.on_push = slow
    old, new = data("old", 10 * MiB + 3), data("new", 9 * MiB + 11)

    async def main():
        await k.save("f.pt", old)
        reader, inode = await fresh.open("f.pt", os.O_RDONLY)
        assert reader.keep_cache
        await trio.to_thread.run_sync(holding.wait, 30)
        if how == "overwrite":
            w, _ = await fresh.open("f.pt", os.O_WRONLY | os.O_TRUNC)
            mark = len(fresh.port.pushed)
            await fresh.write(w, new)
            await fresh.close(w)
            want = new
        elif how == "truncate":
            await fresh.vfs.setattr(inode, {"size": 5 * MiB}, None)
            mark = len(fresh.port.pushed)
            want = old[: 5 * MiB]
        else:
            await k.save("f.pt", new)
            again, _ = await fresh.open("f.pt", os.O_RDONLY)
            mark = len(fresh.port.pushed)
            assert await fresh.read(again, len(new) + 1) == new
            await fresh.vfs.release(again.fh)
            want = new
        await trio.sleep(0.3)                        # pushers that would go on, did
        # pushes after the change are the new version's (a fresh node's open of it is
        # cold too), never the old one's
        late = [(o, h) for (i, o, _), h in zip(fresh.port.pushed[mark:],
                                              fresh.port.heads[mark:]) if i == inode]
        stale = [o for o, h in late if h != want[o: o + len(h)]]
        assert not stale, f"pushes of the old version after the change at {stale}"
        got, _ = await fresh.open("f.pt", os.O_RDONLY)
        assert await fresh.read(got, len(want) + 1) == want
        await fresh.vfs.release(got.fh)
        await fresh.vfs.release(reader.fh)
    trio.run(main)


def test_a_kernel_that_refuses_pushes_turns_them_off_and_reads_stay_exact(site):
    """The kernel refuses the first push (ENOSYS): pushing is off for the mount (said
    once), the reads of that open go to the daemon and are exact, and the next cold
    open is not pushed."""
    k, fresh = site(), site(ingest=AHEAD, cold_reads="push", refuse_pushes=errno.ENOSYS)
    a, b = data("a", 9 * MiB), data("b", 9 * MiB + 1)

    async def main():
        await k.save("a.pt", a)
        await k.save("b.pt", b)
        opened, _ = await fresh.open("a.pt", os.O_RDONLY)
        assert await fresh.read(opened, len(a) + 1) == a
        await fresh.vfs.release(opened.fh)
        await trio.to_thread.run_sync(_until, lambda: not fresh.vfs.pushes.enabled)
        second, _ = await fresh.open("b.pt", os.O_RDONLY)
        assert not second.keep_cache
        assert await fresh.read(second, len(b) + 1) == b
        await fresh.vfs.release(second.fh)
    trio.run(main)
    assert fresh.port.pushed == []
