"""What the repository holds: source, docs and test fixtures, never built binaries
(wheels, tarballs, libraries). A script builds those; a clone stays small."""

from __future__ import annotations

import os
import shutil
import subprocess

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
LIMIT = 1 << 20                       # bytes: larger tracked files are binaries, or data
FIXTURES = "tests/fixtures/"          # golden fixtures: written once, kept as they are
BUILT = (".whl", ".tar.gz", ".tgz", ".zip", ".so", ".a", ".deb", ".egg")


def _tracked() -> list[str]:
    if shutil.which("git") is None or not os.path.isdir(os.path.join(ROOT, ".git")):
        pytest.skip("not a git checkout")
    out = subprocess.run(["git", "-C", ROOT, "ls-files", "-z"], capture_output=True,
                         check=True, timeout=60).stdout
    return [p for p in out.decode().split("\0") if p]


def test_no_tracked_file_over_1_mb_but_fixtures():
    big = []
    for p in _tracked():
        path = os.path.join(ROOT, p)
        if p.startswith(FIXTURES) or not os.path.isfile(path):
            continue
        if os.path.getsize(path) > LIMIT:
            big.append(f"{p} ({os.path.getsize(path) / 2**20:.1f} MiB)")
    assert not big, ("tracked files over 1 MiB (build them with a script, and ignore "
                     "what it makes): " + ", ".join(big))


def test_no_built_artefact_is_tracked():
    built = [p for p in _tracked() if p.endswith(BUILT) or "/.offline-kit/" in f"/{p}"]
    assert not built, "built files in git (a script makes them): " + ", ".join(built)
