"""``s4fs build-passthrough``: pyfuse3 with FUSE passthrough for a ``pip install s4fs``
user — the shipped build script, a clear refusal where its tools are missing, a finished
build reused (same inputs, same Python) and installed into the Python asked for."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest

from s4fs.mount import _binding

CLI = [sys.executable, "-m", "s4fs.cli"]


def test_the_build_script_ships_with_the_package():
    """The script, the libfuse fetch it sources and the patch are package data of
    s4fs.mount (pyproject.toml), where the command looks for them."""
    for name in _binding.INPUTS:
        assert os.path.isfile(os.path.join(_binding.BINDING, name)), name


def test_without_its_tools_the_build_says_what_to_install_and_changes_nothing(tmp_path):
    bare = tmp_path / "bin"
    bare.mkdir()
    dest = tmp_path / "dest"
    res = subprocess.run(CLI + ["build-passthrough", "--dest", str(dest)],
                         env=dict(os.environ, PATH=str(bare)), capture_output=True,
                         text=True, timeout=120)
    assert res.returncode == 1
    assert "needs bash, curl, patch, pkg-config, cc" in res.stderr
    assert "apt-get install" in res.stderr and "nothing was changed" in res.stderr
    assert not dest.exists() or not any(dest.iterdir())


def _make_test_build() -> str:
    """The build `make test` made (S4FS_PYFUSE3_PASSTHROUGH is its site folder)."""
    site = os.environ.get("S4FS_PYFUSE3_PASSTHROUGH")
    dest = os.path.dirname(site) if site else ""
    if not dest or _binding.reusable(dest, sys.executable) is None:
        pytest.skip("no finished passthrough build (make test makes one: "
                    "S4FS_PYFUSE3_PASSTHROUGH=.venv/pyfuse3-passthrough/site)")
    return dest


def test_a_build_for_other_inputs_or_another_python_is_not_reused(tmp_path):
    dest = _make_test_build()
    copy = tmp_path / "copy"
    shutil.copytree(os.path.join(dest, "wheel"), copy / "wheel")
    stamp = open(os.path.join(dest, "built-for")).read()
    (copy / "built-for").write_text(stamp)
    assert _binding.reusable(str(copy), sys.executable) is not None
    (copy / "built-for").write_text(stamp.replace("python 3.", "python 2."))
    assert _binding.reusable(str(copy), sys.executable) is None
    first, rest = stamp.split("\n", 1)
    (copy / "built-for").write_text(first + "\n" + rest.replace("a", "b", 1))
    assert _binding.reusable(str(copy), sys.executable) is None


def test_a_finished_build_is_reused_and_installed_for_the_python_asked(tmp_path):
    """The command on a finished build: no rebuild, the wheel installed into another
    environment's Python (a fresh venv), whose pyfuse3 then has the passthrough calls."""
    dest = _make_test_build()
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=300)
    py = str(venv / "bin" / "python")
    res = subprocess.run(CLI + ["build-passthrough", "--dest", dest, "--python", py],
                         capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr
    assert "reusing the build" in res.stdout and "installed pyfuse3" in res.stdout
    import trio                      # pyfuse3 imports it: lend the venv ours
    lend = os.path.dirname(os.path.dirname(trio.__file__))
    probe = subprocess.run(
        [py, "-c", f"import sys; sys.path.append({lend!r}); import pyfuse3; "
                   "print(pyfuse3.__file__, hasattr(pyfuse3, 'get_session_fd'))"],
        capture_output=True, text=True, timeout=120)
    assert probe.returncode == 0, probe.stderr
    where, has = probe.stdout.split()
    assert where.startswith(str(venv)) and has == "True"


def test_the_kernel_check_knows_which_releases_have_passthrough():
    lacks = _binding.kernel_lacks_passthrough
    assert lacks("5.15.0-1051-aws") and lacks("6.8.0-45-generic") and lacks("6.1.0-18-amd64")
    assert not lacks("6.9.0") and not lacks("6.18.3-arch1") and not lacks("7.0.1")
    assert not lacks("weird")          # unreadable: the mount says what it finds
