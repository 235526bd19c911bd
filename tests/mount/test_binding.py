"""``s4fs build-passthrough``: pyfuse3 with FUSE passthrough for a ``pip install s4fs``
user — the shipped build script, a clear refusal where its tools are missing, a finished
build reused (same inputs, same Python, same libfuse) and installed into the Python asked
for, a system libfuse new enough used instead of a source build, the wheel installed
offline with the libfuse it carries, and the patched binding unchanged where a mount does
not ask for passthrough."""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
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


def test_an_offline_build_handed_the_libfuse_tarball_does_not_ask_for_curl(tmp_path,
                                                                         monkeypatch):
    """With S4FS_LIBFUSE_TARBALL the script fetches nothing with curl (pip finds
    pyfuse3's sdist through its own settings, e.g. PIP_FIND_LINKS): a machine without
    curl is not refused for it; without the tarball it is."""
    bare = tmp_path / "bin"
    bare.mkdir()
    for tool in _binding.TOOLS:
        if tool != "curl" and shutil.which(tool):
            os.symlink(shutil.which(tool), bare / tool)
    monkeypatch.setenv("PATH", str(bare))
    monkeypatch.delenv("S4FS_LIBFUSE_TARBALL", raising=False)
    assert "curl" in _binding.missing_tools()
    monkeypatch.setenv("S4FS_LIBFUSE_TARBALL", str(tmp_path / "fuse3_3.18.3.orig.tar.gz"))
    assert "curl" not in _binding.missing_tools()


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
    (copy / "built-for").write_text(stamp.replace("libfuse: ", "libfuse: other ", 1))
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


def _script_value(script: str, name: str) -> str:
    with open(os.path.join(_binding.BINDING, script)) as f:
        return re.search(rf"^{name}=(\S+)$", f.read(), re.M)[1]


def test_the_help_says_which_libfuse_is_built():
    res = subprocess.run(CLI + ["build-passthrough", "--help"], capture_output=True,
                         text=True, timeout=60)
    text = " ".join(res.stdout.split())
    version = _script_value("libfuse_source.sh", "libfuse_version")
    minimum = _script_value("build_pyfuse3.sh", "libfuse_system_min")
    assert f"system's libfuse where it is >= {minimum}" in text
    assert f"libfuse {version} built from Debian's source and bundled into the wheel" in text


def _maps_libfuse(py: str, env: dict | None = None, wrap=()) -> tuple[str, str]:
    """``(pyfuse3's file, the libfuse3 it loaded)`` as ``py`` imports the patched
    pyfuse3 (with this process's trio lent to it), failing unless it has the passthrough
    calls."""
    import trio
    lend = os.path.dirname(os.path.dirname(trio.__file__))
    code = (f"import sys; sys.path.append({lend!r}); import pyfuse3; "
            "assert hasattr(pyfuse3, 'get_session_fd'); "
            "assert pyfuse3.FileInfo(backing_id=7).backing_id == 7; "
            "print(pyfuse3.__file__); "
            "print([m.split()[-1] for m in open('/proc/self/maps') "
            "       if '/libfuse3.so' in m][0])")
    res = subprocess.run([*wrap, py, "-c", code], capture_output=True, text=True,
                         timeout=120, env=env)
    assert res.returncode == 0, res.stderr
    where, lib = res.stdout.split()
    return where, lib


@pytest.mark.slow
def test_a_system_libfuse_new_enough_is_used_and_not_built(tmp_path):
    """Where pkg-config finds a libfuse >= 3.17.3 (here the one the make test build made
    from source, named by PKG_CONFIG_PATH), the build makes pyfuse3 only: nothing is
    downloaded for libfuse or built, the stamp names that libfuse, and the binding links
    to it. The build runs with no index (pip's PIP_NO_INDEX, a folder of pyfuse3's
    source and its build wheels): it once asked for every build requirement as source
    and failed offline."""
    dest = _make_test_build()
    pc = os.path.join(dest, "libfuse", "lib", "pkgconfig")
    if not os.path.isdir(pc):
        pytest.skip(f"the build in {dest} used the system's libfuse: no libfuse of its own")
    version = _script_value("libfuse_source.sh", "libfuse_version")
    libdir = os.path.join(dest, "libfuse", "lib")
    other = tmp_path / "other"
    # offline, as a machine without an index builds it (docs/OPERATING.md): pyfuse3's
    # source and the wheels of its build requirements in a folder, pip told to use only
    # that folder
    wheels = tmp_path / "wheels"
    for args in (["--no-deps", "--no-binary", "pyfuse3", "pyfuse3==3.5.0"],
                 ["--only-binary", ":all:", "setuptools>=78.1.1", "setuptools_scm>=8.0",
                  "Cython", "wheel"]):
        got = subprocess.run([sys.executable, "-m", "pip", "download", "-q", "-d",
                              str(wheels), *args], capture_output=True, text=True,
                             timeout=300)
        if got.returncode:
            pytest.skip(f"cannot download what the offline build is given: {got.stderr}")
    # CFLAGS=-O0: this build is only inspected (what it links to, what its stamp says),
    # and unoptimized it compiles in half the time
    env = dict(os.environ, PKG_CONFIG_PATH=pc, PIP_NO_INDEX="1",
               PIP_FIND_LINKS=str(wheels), CFLAGS="-O0")
    res = subprocess.run(CLI + ["build-passthrough", "--dest", str(other), "--no-install"],
                         env=env, capture_output=True, text=True, timeout=800)
    assert res.returncode == 0, res.stdout + res.stderr
    assert (f"building pyfuse3 3.5.0 with FUSE passthrough against the system's libfuse "
            f"{version} ({libdir})") in res.stdout
    assert "building pyfuse3 only" in res.stdout
    assert "Debian's source" not in res.stdout and not (other / "libfuse").exists()
    assert f"libfuse: system {version} {libdir}\n" in (other / "built-for").read_text()
    assert "links to the system's libfuse" in res.stdout
    where, lib = _maps_libfuse(sys.executable,
                               env=dict(os.environ, PYTHONPATH=str(other / "site")))
    assert where.startswith(str(other / "site")) and lib.startswith(libdir + "/")


@pytest.mark.slow
def test_the_wheel_installs_offline_with_the_libfuse_it_carries(tmp_path):
    """Build once, install many: the wheel goes into a fresh venv with pip --no-index
    --no-deps, and its pyfuse3 has the passthrough calls; built against libfuse from
    source it loads the libfuse3 inside the wheel, also where the build's DEST/libfuse is
    gone (hidden, as root, in a mount namespace of the probe's own)."""
    dest = _make_test_build()
    wheel = _binding.reusable(dest, sys.executable)
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=300)
    py = str(venv / "bin" / "python")
    res = subprocess.run([py, "-m", "pip", "install", "-q", "--no-index", "--no-deps",
                          wheel], capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr
    libfuse = os.path.join(dest, "libfuse")
    with open(os.path.join(dest, "built-for")) as f:
        system = "libfuse: system " in f.read()
    wrap: tuple = ()
    if not system and os.geteuid() == 0 and shutil.which("unshare"):
        wrap = ("unshare", "--mount", "sh", "-c",
                f"mount -t tmpfs none {libfuse} && exec \"$@\"", "sh")
    where, lib = _maps_libfuse(py, wrap=wrap)
    assert where.startswith(str(venv))
    if system:
        assert not lib.startswith(str(venv))       # the system's, as the build said
    else:
        assert lib.startswith(str(venv)) and lib.endswith("/pyfuse3.libs/libfuse3.so.4")


@pytest.mark.fuse
def test_the_patched_binding_without_passthrough_answers_through_requests(pt_site,
                                                                          mount_factory):
    """Where passthrough is not asked for (--no-passthrough: enable_passthrough False),
    the patched binding behaves as stock pyfuse3: the mount's daemon runs it, every write
    and read is a FUSE request, and the bytes come back, also from a fresh mount."""
    raw = b"".join(hashlib.sha256(b"%d" % k).digest() for k in range(3 << 15))   # 3 MiB
    m = mount_factory(extra=["--no-passthrough", "-v"])
    maps = ""
    for pid in m.daemon_pids():
        with contextlib.suppress(OSError):
            maps += open(f"/proc/{pid}/maps").read()
    assert os.path.join(pt_site, "pyfuse3") in maps      # the patched one, not the venv's
    with open(os.path.join(m.path, "a.bin"), "wb") as f:
        f.write(raw)
    with open(os.path.join(m.path, "a.bin"), "rb") as f:
        assert f.read() == raw
    with open(os.path.join(m.cache, "s4fs-mount.log"), errors="replace") as f:
        assert "written through FUSE passthrough" not in f.read()
    m.stop()
    again = mount_factory(store=m.store, name="again", extra=["--no-passthrough"])
    with open(os.path.join(again.path, "a.bin"), "rb") as f:
        assert f.read() == raw
