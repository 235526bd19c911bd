#!/bin/bash
# Build pyfuse3 with FUSE passthrough: the binding a passthrough s4fs mount needs
# (`s4fs build-passthrough` and `make passthrough` run this and install it; a mount uses
# it where it is installed: docs/OPERATING.md), and the Python floor of
# bench/train_loop.py's fuse-floor-pt modes (bench/_fuse_floor.py --passthrough).
#
#   bash mount/binding/build_pyfuse3.sh DEST
#
# pyfuse3 3.5 cannot hand the kernel a backing file: it builds against libfuse 3.14
# (Debian 12), whose fuse_file_info has no backing_id, and never asks for
# FUSE_CAP_PASSTHROUGH at INIT. So this fetches Debian's fuse3 3.17.2 source and
# pyfuse3 3.5.0's sdist from PyPI (both checked against their SHA-256), builds libfuse
# into DEST/libfuse (meson and ninja from PyPI, in a throw-away venv), applies
# pyfuse3-passthrough.patch, beside this script (FileInfo.backing_id, Operations.enable_passthrough,
# pyfuse3.get_session_fd() for the FUSE_DEV_IOC_BACKING_OPEN/CLOSE ioctls) and installs
# the result for $PYTHON (default python3; the one that runs s4fs) as a wheel in
# DEST/wheel (linked to DEST/libfuse; `make passthrough` installs it into the venv) and
# installed in DEST/site (PYTHONPATH=DEST/site: what the tests and the bench use). It also
# leaves the patched source as DEST/pyfuse3-3.5.0-passthrough.tar.gz, for a machine
# without internet (bench/gpu.sh builds it there with the offline kit's Cython).
# Needs curl, patch, a C compiler, pkg-config and Python's
# headers (Debian: curl patch gcc pkg-config python3-dev).
set -euo pipefail
dest=$(mkdir -p "${1:?usage: bash mount/binding/build_pyfuse3.sh DEST}" && cd "$1" && pwd)
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
python=${PYTHON:-python3}
pyfuse3_sha=88399a9494b88603230bba300f4ba9ad63fece5ed514ca3633d555a0c6a42b24
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# shellcheck source=mount/binding/libfuse_source.sh disable=SC1091  # sets libfuse_version
source "$here/libfuse_source.sh"
libfuse_source "$work"
# shellcheck disable=SC2154   # libfuse_version: set by libfuse_source.sh
(cd "$work/fuse-$libfuse_version" &&
 "$work/venv/bin/meson" setup build --prefix="$dest/libfuse" --libdir=lib -Dexamples=false \
     -Dutils=false -Dtests=false -Ddisable-mtab=true >/dev/null &&
 PATH="$work/venv/bin:$PATH" ninja -C build install >/dev/null)

"$work/venv/bin/pip" download -q --no-deps --no-binary :all: -d "$work" pyfuse3==3.5.0
echo "$pyfuse3_sha  $work/pyfuse3-3.5.0.tar.gz" | sha256sum -c --quiet
tar -xzf "$work/pyfuse3-3.5.0.tar.gz" -C "$work"
(cd "$work/pyfuse3-3.5.0" && patch -p1 --quiet < "$here/pyfuse3-passthrough.patch" &&
 rm -f src/pyfuse3/__init__.c)                    # Cython makes it anew from the patch
tar -czf "$dest/pyfuse3-3.5.0-passthrough.tar.gz" -C "$work" pyfuse3-3.5.0

rm -rf "$dest/wheel" "$dest/site"
PKG_CONFIG_PATH="$dest/libfuse/lib/pkgconfig" LDFLAGS="-Wl,-rpath,$dest/libfuse/lib" \
SETUPTOOLS_SCM_PRETEND_VERSION=3.5.0 \
    "$python" -m pip wheel -q --no-deps -w "$dest/wheel" "$work/pyfuse3-3.5.0"
"$python" -m pip install -q --no-deps --target "$dest/site" "$dest"/wheel/pyfuse3-*.whl
PYTHONPATH="$dest/site" "$python" -c \
    "import pyfuse3; assert hasattr(pyfuse3, 'get_session_fd'); print('built', pyfuse3.__file__)"
