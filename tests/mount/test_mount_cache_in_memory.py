"""A mount whose --cache-dir is on tmpfs: the default mode works there (spools and local
copies in memory; every byte back, from the mount and from the store), ``--writeback``
is refused at once with what to do instead."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

from disk_helpers import small_tmpfs, stored_file
from mount_helpers import TRANSPORT, transport_env, transport_flags

pytestmark = pytest.mark.fuse


def test_the_default_mode_keeps_its_cache_in_memory(mount_factory, tmp_path):
    with small_tmpfs(tmp_path / "cache-ram", 512 << 20):
        m = mount_factory(name="ram")
        try:
            sd = {"w": torch.randn(2_000_000), "b": torch.zeros(1_000_000),
                  "h": torch.randn(500_000).to(torch.bfloat16)}
            path = os.path.join(m.path, "ckpt.pt")
            torch.save(sd, path)
            sd["w"][::7] += 1e-3
            torch.save(sd, path)                                 # a delta, on tmpfs too
            with open(path, "rb") as f:
                got = f.read()
            back = torch.load(path)
            assert all(torch.equal(back[k], sd[k]) for k in sd)
            status = subprocess.run([sys.executable, "-m", "s4fs.cli", "status", m.path],
                                    capture_output=True, text=True, timeout=60).stdout
            want = "FUSE passthrough" if TRANSPORT == "passthrough" else "FUSE requests"
            assert want in status, status
        finally:
            m.stop()
    assert stored_file(m.store, "/ckpt.pt") == got


def test_writeback_on_a_memory_cache_is_refused_at_once(tmp_path):
    store, mnt = tmp_path / "store", tmp_path / "mnt"
    store.mkdir()
    mnt.mkdir()
    with small_tmpfs(tmp_path / "ram", 64 << 20) as ram:
        flags = transport_flags(())
        r = subprocess.run([sys.executable, "-m", "s4fs.cli", "mount", str(store), str(mnt),
                            "--cache-dir", os.path.join(ram, "c"), "--writeback", *flags],
                           capture_output=True, text=True, timeout=120,
                           env=transport_env(flags))
        assert r.returncode != 0
        assert "--writeback keeps every file" in r.stderr and "tmpfs" in r.stderr
        assert "did not become ready" not in r.stderr        # it said why, at once
    assert not os.path.ismount(mnt)
