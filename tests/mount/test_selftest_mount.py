"""``s4fs selftest --mount``: a real mount of a temporary store, every byte written
through it read back at once and, after a remount with an empty cache, decoded from the
store; it says how the kernel moved the bytes, and fails where a byte differs or where
``--require-passthrough`` is not met (the image build's gate runs it so)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from s4fs import selftest
from s4fs.keys import PACKS

from mount_helpers import TRANSPORT, fuse_usable, transport_env, transport_flags

pytestmark = pytest.mark.fuse

FILES = ("tensors.safetensors", "random.bin", "state.pt")


@pytest.fixture(autouse=True)
def _fuse():
    ok, why = fuse_usable()
    if not ok:
        pytest.skip(why)


def _selftest(tmp_path, *args, env=None):
    return subprocess.run(
        [sys.executable, "-m", "s4fs.cli", "selftest", "--random-size", "1000", "--mount",
         "--mount-mib", "2", "--dir", str(tmp_path), *args],
        capture_output=True, text=True, timeout=600, env=env)


def test_every_byte_comes_back_and_the_transport_is_named(tmp_path):
    flags = transport_flags(())
    r = _selftest(tmp_path, *[f"--mount-arg={f}" for f in flags], env=transport_env(flags))
    assert r.returncode == 0, r.stdout + r.stderr
    rows = [line for line in r.stdout.splitlines() if line.startswith("| ")
            and line.split("|")[1].strip() in FILES]
    # two versions written of each file, a third of one over a reader holding it (and
    # read again once that reader is gone), then each read from the store
    assert len(rows) == 3 * len(FILES) + 2
    assert all(row.rstrip(" |").endswith("ok") for row in rows), rows
    assert sum("from the store" in row for row in rows) == len(FILES)
    assert sum("over a held reader" in row or "the reader gone" in row for row in rows) == 2
    want = ("FUSE passthrough" if TRANSPORT == "passthrough"
            else "FUSE requests (--no-passthrough)")
    assert f"how the bytes went: {want}" in r.stdout
    assert "every byte came back exactly: PASS" in r.stdout
    assert os.listdir(tmp_path) == []            # nothing left behind, nothing mounted


def test_require_passthrough_fails_where_the_mount_used_requests(tmp_path):
    r = _selftest(tmp_path, "--require-passthrough", "--mount-arg=--no-passthrough")
    assert r.returncode == 3, r.stdout + r.stderr
    assert "how the bytes went: FUSE requests (--no-passthrough)" in r.stdout
    assert "not through FUSE passthrough (--require-passthrough)" in r.stdout


def test_require_passthrough_needs_the_mount(capsys):
    with pytest.raises(SystemExit) as exc:
        selftest.main(["--require-passthrough"])
    assert exc.value.code == 2
    assert "add --mount" in capsys.readouterr().err


def test_a_mount_that_cannot_be_had_is_reported(tmp_path, capsys):
    assert selftest.run_mount(1, workdir=str(tmp_path),
                              mount_args=["--max-chain-read", "0.5"]) == 2
    assert "the mount failed" in capsys.readouterr().out


def test_a_damaged_store_fails_the_check(tmp_path, monkeypatch, capsys):
    """Bytes the store no longer holds as written must be a failure the user sees (a
    read error from the checksum), never a pass: the packs are damaged between the
    unmount and the remount that reads them back."""
    real_run = subprocess.run
    damaged = []

    def run(cmd, *args, **kwargs):
        if cmd[3:4] == ["mount"] and any(a.endswith("-fresh") for a in cmd):
            packs = os.path.join(cmd[4], PACKS)
            for here, _, names in os.walk(packs):
                for name in names:
                    path = os.path.join(here, name)
                    size = os.path.getsize(path)
                    with open(path, "r+b") as f:
                        for at in range(size // 4, size, max(1, size // 4)):
                            f.seek(at)
                            b = f.read(1)
                            f.seek(at)
                            f.write(bytes([b[0] ^ 0xFF]))
                    damaged.append(path)
        return real_run(cmd, *args, **kwargs)

    monkeypatch.setattr(subprocess, "run", run)
    flags = transport_flags(())
    env = transport_env(flags)
    if env is not None:
        monkeypatch.setenv("PYTHONPATH", env["PYTHONPATH"])
    status = selftest.run_mount(2, workdir=str(tmp_path),
                                mount_args=flags)
    out = capsys.readouterr().out
    assert damaged, "the test damaged nothing"
    assert status == 1, out
    assert "from the store): " in out and "mount selftest: FAIL" in out
    assert "PASS" not in out
    assert os.listdir(tmp_path) == []
