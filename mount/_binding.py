"""``s4fs build-passthrough``: pyfuse3 able to ask the kernel for FUSE passthrough,
built and installed for the Python that runs s4fs.

Stock pyfuse3 (3.5) cannot hand the kernel a backing file. ``binding/build_pyfuse3.sh``
(shipped with the package, the same script ``make passthrough`` runs) builds libfuse
3.17.2 into a folder that must stay (the binding links to it), applies
``binding/pyfuse3-passthrough.patch`` to pyfuse3 3.5.0 and leaves a wheel there; this
module checks for the tools first, reuses a build of the same inputs for the same Python,
and installs the wheel with that Python's pip. Nothing here imports pyfuse3.
"""

from __future__ import annotations

import glob
import hashlib
import os
import shutil
import subprocess
import sys

from s4fs.errors import InvalidArgument, S4Error

BINDING = os.path.join(os.path.dirname(os.path.abspath(__file__)), "binding")
INPUTS = ("build_pyfuse3.sh", "libfuse_source.sh", "pyfuse3-passthrough.patch")
TOOLS = ("bash", "curl", "patch", "pkg-config", "cc", "tar", "sha256sum")


def default_dest(python: str = sys.executable) -> str:
    """Where a build for ``python`` goes by default: beside its environment
    (``PREFIX/share/s4fs/pyfuse3-passthrough``), removed with it."""
    prefix = subprocess.run([python, "-c", "import sys; print(sys.prefix)"],
                            capture_output=True, text=True, check=True).stdout.strip()
    return os.path.join(prefix, "share", "s4fs", "pyfuse3-passthrough")


def built_for(python: str) -> str:
    """What ``DEST/built-for`` holds after a build of these inputs for ``python``."""
    ver = subprocess.run([python, "-c",
                          "import sys; print('python %d.%d' % sys.version_info[:2])"],
                         capture_output=True, text=True, check=True).stdout
    lines = [ver.strip()]
    for name in INPUTS:
        with open(os.path.join(BINDING, name), "rb") as f:
            lines.append(f"{hashlib.sha256(f.read()).hexdigest()}  {name}")
    return "\n".join(lines) + "\n"


def reusable(dest: str, python: str) -> str | None:
    """The wheel of a whole build in ``dest`` of these inputs for ``python``, or None."""
    try:
        with open(os.path.join(dest, "built-for")) as f:
            if f.read() != built_for(python):
                return None
    except OSError:
        return None
    wheels = glob.glob(os.path.join(dest, "wheel", "pyfuse3-*.whl"))
    return wheels[0] if len(wheels) == 1 else None


def kernel_lacks_passthrough(release: str | None = None) -> bool:
    """Whether this kernel (``uname -r``) is older than Linux 6.9, the first with FUSE
    passthrough (the build still works: the binding waits for a newer kernel)."""
    release = release or os.uname().release
    try:
        major, minor = (int(x) for x in release.split("-")[0].split(".")[:2])
    except ValueError:
        return False                   # a release string we cannot read: let the mount say
    return (major, minor) < (6, 9)


def missing_tools() -> list[str]:
    return [t for t in TOOLS if shutil.which(t) is None]


def build_passthrough(dest: str | None = None, *, python: str = sys.executable,
                      install: bool = True, log=print) -> str:
    """Build (or reuse) the wheel for ``python`` in ``dest`` and, with ``install``,
    install it into ``python``'s environment; returns the wheel's path."""
    dest = os.path.abspath(dest or default_dest(python))
    wheel = reusable(dest, python)
    if wheel is not None:
        log(f"s4fs: reusing the build in {dest} (same inputs, same Python)")
    else:
        missing = missing_tools()
        if missing:
            raise InvalidArgument(
                f"building pyfuse3 with FUSE passthrough needs {', '.join(missing)} on PATH "
                f"(Debian: apt-get install curl patch gcc pkg-config python3-dev); nothing "
                f"was changed")
        log(f"s4fs: building libfuse 3.17.2 and pyfuse3 3.5.0 with FUSE passthrough in "
            f"{dest} (a few minutes; needs the network: Debian's fuse3 source, PyPI)")
        env = dict(os.environ, PYTHON=python)
        res = subprocess.run(["bash", os.path.join(BINDING, "build_pyfuse3.sh"), dest],
                             env=env)
        wheel = reusable(dest, python) if res.returncode == 0 else None
        if wheel is None:
            raise S4Error(f"the build in {dest} failed (its output is above); the "
                          f"installed pyfuse3 is unchanged")
    if install:
        res = subprocess.run([python, "-m", "pip", "install", "-q", "--no-deps",
                              "--force-reinstall", wheel])
        if res.returncode:
            raise S4Error(f"pip could not install {wheel} for {python} (its output is "
                          f"above); the installed pyfuse3 is unchanged")
        log(f"s4fs: installed pyfuse3 with FUSE passthrough for {python}; `s4fs mount` "
            f"uses it where the kernel has it (Linux >= 6.9, run as root). Keep {dest}: "
            f"the binding links to the libfuse there")
        if kernel_lacks_passthrough():
            log(f"s4fs: note: this kernel ({os.uname().release}) is older than 6.9 and has "
                f"no FUSE passthrough: mounts here keep using FUSE requests until it is "
                f"upgraded")
    return wheel
