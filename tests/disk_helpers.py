"""Helpers for core tests that need a small real disk or the bytes a store holds."""

from __future__ import annotations

import contextlib
import subprocess

import pytest


@contextlib.contextmanager
def small_tmpfs(folder, size: int):
    """A tmpfs of ``size`` bytes mounted at ``folder`` (created) for the block; skips the
    test where it cannot be mounted (needs root). Always unmounted afterwards."""
    folder.mkdir()
    with _mounted(folder, ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs",
                           str(folder)], f"mount a {size >> 20} MiB tmpfs (needs root)"):
        yield str(folder)


@contextlib.contextmanager
def small_disk(folder, size: int):
    """A real small disk at ``folder`` (created) for the block: an ext4 filesystem of
    ``size`` bytes in a file, loop-mounted (no journal, no reserved blocks). For a mount
    daemon's cache, where a tmpfs cannot stand in — s4fs refuses ``--writeback`` with its
    cache in memory — and for ext4's own ways of running out of room. Skips the test
    where it cannot be made (needs root, loop devices and mkfs.ext4). Always unmounted
    afterwards."""
    folder.mkdir()
    image = f"{folder}.img"
    with open(image, "wb") as f:
        f.truncate(size)
    subprocess.run(["mkfs.ext4", "-q", "-F", "-m", "0", "-O", "^has_journal", image],
                   check=False, capture_output=True)
    with _mounted(folder, ["mount", "-o", "loop", image, str(folder)],
                  f"make a {size >> 20} MiB loop-mounted ext4 disk (needs root, loop "
                  f"devices and mkfs.ext4)"):
        yield str(folder)


@contextlib.contextmanager
def _mounted(folder, mount: list[str], what: str):
    done = subprocess.run(mount, check=False, capture_output=True, text=True)
    if done.returncode != 0:
        pytest.skip(f"cannot {what}: {done.stderr.strip()}")
    try:
        yield
    finally:
        if subprocess.run(["umount", str(folder)], check=False,
                          capture_output=True).returncode:
            subprocess.run(["umount", "-l", str(folder)], check=False, capture_output=True)


def stored_file(store_dir, path: str) -> bytes:
    """``path`` as a fresh filesystem on the local store at ``store_dir`` reads it (no
    caches): what the store holds."""
    from s4fs.fs import Filesystem, FsConfig
    from s4fs.stores import LocalStore
    fresh = Filesystem(LocalStore(str(store_dir)), FsConfig(decoded_cache_bytes=0))
    try:
        r = fresh.open_read(path)
        try:
            return r.read(0, r.size + 1)
        finally:
            r.release()
    finally:
        fresh.close()
