"""One ``pread`` the kernel splits into several requests, spanning a change of version.

The kernel sends a large read as several requests in offset order; the mount answers
them on threads, which may start in another order. Had each request read whatever
version the file had when its thread started, a read spanning a change could come back
as old, new, old, new pages (seen once in CI: another mount's new version arriving in
the middle of a 4 MiB read). A request now reads the version the file had when it came
— or, where a request that came after it already read an older version, that one — so
such a read is the old version up to a byte and the new one after it, as on a local
disk. Driven as the mount drives the core: a ticket as each request comes, the read on
a thread later.
"""

from __future__ import annotations

import random

import pytest

from s4fs.fs import Filesystem, FsConfig
from s4fs.stores import LocalStore

MiB = 1 << 20


@pytest.fixture
def fs(tmp_path):
    f = Filesystem(LocalStore(str(tmp_path / "store")),
                   FsConfig(cache_dir=str(tmp_path / "cache")))
    yield f
    f.close()


def save(fs, body: bytes) -> None:
    h = fs.open_write("f.bin", truncate=True)
    h.write(0, body)
    h.flush()
    h.release()


def test_requests_of_one_read_answered_out_of_order_never_go_back_a_version(fs):
    old, new = random.randbytes(4 * MiB), random.randbytes(4 * MiB)
    save(fs, old)
    r = fs.open_read("f.bin")
    try:
        first, second, third, fourth = (r.ticket() for _ in range(4))   # one read's
        assert bytes(r.read(0, MiB, first)) == old[:MiB]
        assert bytes(r.read(2 * MiB, MiB, third)) == old[2 * MiB:3 * MiB]   # ahead
        save(fs, new)                                    # the file changes meanwhile
        # the second request's thread starts only now: a later one already read the
        # old version, so it does too
        assert bytes(r.read(MiB, MiB, second)) == old[MiB:2 * MiB]
        assert bytes(r.read(3 * MiB, MiB, fourth)) == new[3 * MiB:]
        # a read sent after the change reads the new version whole
        later = r.ticket()
        assert bytes(r.read(0, 4 * MiB, later)) == new
    finally:
        r.release()


def test_requests_answered_in_order_switch_once(fs):
    old, new = random.randbytes(2 * MiB), random.randbytes(2 * MiB)
    save(fs, old)
    r = fs.open_read("f.bin")
    try:
        a, b = r.ticket(), r.ticket()
        assert bytes(r.read(0, MiB, a)) == old[:MiB]
        save(fs, new)
        assert bytes(r.read(MiB, MiB, b)) == new[MiB:]   # old up to a byte, new after
    finally:
        r.release()
