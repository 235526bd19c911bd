"""``s4fs build-passthrough``: pyfuse3 able to ask the kernel for FUSE passthrough,
built and installed for the Python that runs s4fs.

Stock pyfuse3 (3.5) cannot hand the kernel a backing file. ``binding/build_pyfuse3.sh``
(shipped with the package, the same script ``make passthrough`` runs) applies
``binding/pyfuse3-passthrough.patch`` to pyfuse3 3.5.0 and builds it against the
system's libfuse where that is new enough, else against the libfuse
``binding/libfuse_source.sh`` pins, built from Debian's source and bundled into the
wheel; the script alone decides which (:func:`libfuse_choice`). This module checks for
the tools first, reuses a build of the same inputs for the same Python and the same
libfuse (``DEST/built-for``, written once the script succeeded), and installs the wheel
with that Python's pip. Nothing here imports pyfuse3.
"""

from __future__ import annotations

import contextlib
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


def _python(python: str) -> tuple[str, str]:
    """``(sys.prefix, "python X.Y")`` of the interpreter ``python``."""
    out = subprocess.run([python, "-c", "import sys; print(sys.prefix); "
                          "print('python %d.%d' % sys.version_info[:2])"],
                         capture_output=True, text=True, check=True).stdout.splitlines()
    return out[0], out[1]


def libfuse_choice() -> str:
    """The libfuse a build here uses, as ``build_pyfuse3.sh --which-libfuse`` decides:
    ``"system VERSION LIBDIR"`` (pkg-config's fuse3, new enough) or ``"source VERSION"``
    (built from Debian's source and bundled into the wheel)."""
    return subprocess.run(["bash", os.path.join(BINDING, "build_pyfuse3.sh"),
                           "--which-libfuse"], capture_output=True, text=True,
                          check=True).stdout.strip()


def describe(choice: str) -> str:
    """What a build with ``choice`` (:func:`libfuse_choice`) builds, for the log."""
    kind, version, *libdir = choice.split(maxsplit=2)
    if kind == "system":
        return (f"pyfuse3 3.5.0 with FUSE passthrough against the system's libfuse "
                f"{version} ({libdir[0]})")
    return (f"libfuse {version} from Debian's source and pyfuse3 3.5.0 with FUSE "
            f"passthrough, the libfuse bundled into the wheel")


def built_for(version: str, choice: str | None = None) -> str:
    """What ``DEST/built-for`` holds once a build of these inputs for ``version`` (a
    Python's "python X.Y": its wheel's tag) against ``choice`` (default: the libfuse a
    build here would use now) is whole."""
    lines = [version, f"libfuse: {choice or libfuse_choice()}"]
    for name in INPUTS:
        with open(os.path.join(BINDING, name), "rb") as f:
            lines.append(f"{hashlib.sha256(f.read()).hexdigest()}  {name}")
    return "\n".join(lines) + "\n"


def reusable(dest: str, python: str) -> str | None:
    """The wheel of a whole build in ``dest`` of these inputs for ``python``, or None."""
    return _wheel_if(dest, built_for(_python(python)[1]))


def _wheel_if(dest: str, stamp: str) -> str | None:
    """The wheel of a whole build in ``dest`` whose ``built-for`` is ``stamp``, or None."""
    try:
        with open(os.path.join(dest, "built-for")) as f:
            if f.read() != stamp:
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
    """The build's tools not on PATH; curl only where the script would fetch libfuse's
    source itself (S4FS_LIBFUSE_TARBALL hands an offline machine the tarball)."""
    tools = [t for t in TOOLS if t != "curl" or not os.environ.get("S4FS_LIBFUSE_TARBALL")]
    return [t for t in tools if shutil.which(t) is None]


def build_passthrough(dest: str | None = None, *, python: str = sys.executable,
                      install: bool = True, log=print) -> str:
    """Build (or reuse) the wheel for ``python`` in ``dest`` and, with ``install``,
    install it into ``python``'s environment; returns the wheel's path."""
    prefix, version = _python(python)
    # by default beside that Python's environment, removed with it
    dest = os.path.abspath(dest or os.path.join(prefix, "share", "s4fs",
                                                "pyfuse3-passthrough"))
    missing = missing_tools()
    choice = libfuse_choice() if "bash" not in missing else "unknown"
    stamp = built_for(version, choice)
    wheel = _wheel_if(dest, stamp)
    if wheel is not None:
        log(f"s4fs: reusing the build in {dest} (same inputs, same Python, same libfuse: "
            f"{describe(choice)})")
    else:
        if missing:
            raise InvalidArgument(
                f"building pyfuse3 with FUSE passthrough needs {', '.join(missing)} on PATH "
                f"(Debian: apt-get install curl patch gcc pkg-config python3-dev); nothing "
                f"was changed")
        slow = ("a minute; needs PyPI" if choice.startswith("system ") else
                "a few minutes; needs the network: Debian's fuse3 source, PyPI")
        log(f"s4fs: building {describe(choice)}, in {dest} ({slow})")
        with contextlib.suppress(FileNotFoundError):     # a build not whole is not reused
            os.unlink(os.path.join(dest, "built-for"))
        env = dict(os.environ, PYTHON=python)
        res = subprocess.run(["bash", os.path.join(BINDING, "build_pyfuse3.sh"), dest],
                             env=env)
        wheels = glob.glob(os.path.join(dest, "wheel", "pyfuse3-*.whl"))
        if res.returncode or len(wheels) != 1:
            raise S4Error(f"the build in {dest} failed (its output is above); the "
                          f"installed pyfuse3 is unchanged")
        with open(os.path.join(dest, "built-for"), "w") as f:   # the build is whole
            f.write(stamp)
        wheel = wheels[0]
    links = (f"it links to the system's libfuse in {choice.split(maxsplit=2)[2]}"
             if choice.startswith("system ") else "it carries its own libfuse")
    if install:
        res = subprocess.run([python, "-m", "pip", "install", "-q", "--no-deps",
                              "--force-reinstall", wheel])
        if res.returncode:
            raise S4Error(f"pip could not install {wheel} for {python} (its output is "
                          f"above); the installed pyfuse3 is unchanged")
        log(f"s4fs: installed pyfuse3 with FUSE passthrough for {python}; `s4fs mount` "
            f"uses it where the kernel has it (Linux >= 6.9, run as root)")
        if kernel_lacks_passthrough():
            log(f"s4fs: note: this kernel ({os.uname().release}) is older than 6.9 and has "
                f"no FUSE passthrough: mounts here keep using FUSE requests until it is "
                f"upgraded")
    log(f"s4fs: the wheel installs on other machines of this kind with `pip install "
        f"--no-index --no-deps {wheel}` (no compiler, no network; {links})")
    return wheel
