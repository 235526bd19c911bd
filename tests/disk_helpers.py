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
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(folder)],
                          check=False, capture_output=True, text=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a {size >> 20} MiB tmpfs (needs root): "
                    f"{done.stderr.strip()}")
    try:
        yield str(folder)
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
