#!/bin/bash
# Build pyfuse3 with FUSE passthrough: the binding a passthrough s4fs mount needs
# (`s4fs build-passthrough` and `make passthrough` run this and install it; a mount uses
# it where it is installed: docs/OPERATING.md), and the Python floor of
# bench/train_loop.py's fuse-floor-pt modes (bench/_fuse_floor.py --passthrough).
#
#   bash mount/binding/build_pyfuse3.sh DEST
#   bash mount/binding/build_pyfuse3.sh --which-libfuse   # the libfuse a build here uses
#
# pyfuse3 3.5 cannot hand the kernel a backing file: against libfuse 3.14 (Debian 12)
# fuse_file_info has no backing_id, and it never asks for FUSE_CAP_PASSTHROUGH at INIT.
# This fetches pyfuse3 3.5.0's sdist from PyPI (checked against its SHA-256), applies
# pyfuse3-passthrough.patch, beside this script (FileInfo.backing_id,
# Operations.enable_passthrough, pyfuse3.get_session_fd() for the
# FUSE_DEV_IOC_BACKING_OPEN/CLOSE ioctls), and builds it for $PYTHON (default python3;
# the one that runs s4fs) against one libfuse, decided here only (`--which-libfuse`
# prints "system VERSION LIBDIR" or "source VERSION"; mount/_binding.py records it):
#
# * the system's, where pkg-config finds fuse3 >= 3.17.3 with its headers: only pyfuse3
#   is built, and the wheel links to that libfuse3.so (RUNPATH its libdir), so it
#   installs where the same libfuse is. Not 3.17.0-3.17.2: their INIT fails where the
#   patch's fuse_set_feature_flag and pyfuse3's own conn.want changes meet.
# * else libfuse 3.18.3 from Debian's source (libfuse_source.sh: SHA-256-checked; meson
#   and ninja from PyPI in a throw-away venv), built into DEST/libfuse; its
#   libfuse3.so.4 goes into the wheel (pyfuse3.libs/, found through the extension's
#   RUNPATH $ORIGIN/../pyfuse3.libs), so the wheel installs on any machine of the same
#   kind (`pip install --no-index --no-deps WHEEL`: no compiler, no network, no DEST).
#   Its fuse3.pc is relocatable: DEST may move, and PKG_CONFIG_PATH=DEST/libfuse/lib/
#   pkgconfig builds against it as a "system" libfuse.
#
# The wheel goes to DEST/wheel (`make passthrough` installs it into the venv) and is
# installed in DEST/site (PYTHONPATH=DEST/site: what the tests and the bench use). It
# also leaves the patched source as DEST/pyfuse3-3.5.0-passthrough.tar.gz (bench/gpu.sh
# builds it on a machine without internet with the offline kit's Cython).
# Needs curl, patch, a C compiler, pkg-config and Python's headers (Debian: curl patch
# gcc pkg-config python3-dev).
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=mount/binding/libfuse_source.sh disable=SC1091  # sets libfuse_*
source "$here/libfuse_source.sh"
libfuse_system_min=3.17.3

which_libfuse() {
    if pkg-config --atleast-version="$libfuse_system_min" fuse3 2>/dev/null; then
        echo "system $(pkg-config --modversion fuse3)" \
             "$(realpath -m "$(pkg-config --variable=libdir fuse3)")"
    else
        # shellcheck disable=SC2154   # libfuse_version: set by libfuse_source.sh
        echo "source $libfuse_version"
    fi
}
if [ "${1:-}" = --which-libfuse ]; then
    which_libfuse
    exit 0
fi

dest=$(mkdir -p "${1:?usage: bash mount/binding/build_pyfuse3.sh DEST}" && cd "$1" && pwd)
python=${PYTHON:-python3}
pyfuse3_sha=88399a9494b88603230bba300f4ba9ad63fece5ed514ca3633d555a0c6a42b24
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

read -r kind version libdir <<<"$(which_libfuse)"
if [ "$kind" = system ]; then
    echo "libfuse: the system's $version ($libdir; >= $libfuse_system_min): building" \
         "pyfuse3 only, the wheel links to that libfuse"
    ldflags="-Wl,-rpath,$libdir"
else
    have=$(pkg-config --modversion fuse3 2>/dev/null || echo none)
    echo "libfuse: the system's is $have (< $libfuse_system_min): building libfuse" \
         "$version from Debian's source into $dest/libfuse, bundled into the wheel"
    libfuse_source "$work" wheel
    rm -rf "$dest/libfuse"
    # shellcheck disable=SC2154   # libfuse_meson: set by libfuse_source.sh
    (cd "$work/fuse-$version" &&
     "$work/venv/bin/meson" setup build --prefix="$dest/libfuse" --libdir=lib \
         -Dexamples=false -Dpkgconfig.relocatable=true "${libfuse_meson[@]}" >/dev/null &&
     PATH="$work/venv/bin:$PATH" ninja -C build install >/dev/null)
    export PKG_CONFIG_PATH="$dest/libfuse/lib/pkgconfig${PKG_CONFIG_PATH:+:$PKG_CONFIG_PATH}"
    # shellcheck disable=SC2016   # $ORIGIN is the dynamic loader's, not the shell's
    ldflags='-Wl,-rpath,$ORIGIN/../pyfuse3.libs'
fi

"$python" -m pip download -q --no-deps --no-binary pyfuse3 -d "$work" pyfuse3==3.5.0
echo "$pyfuse3_sha  $work/pyfuse3-3.5.0.tar.gz" | sha256sum -c --quiet
tar -xzf "$work/pyfuse3-3.5.0.tar.gz" -C "$work"
(cd "$work/pyfuse3-3.5.0" && patch -p1 --quiet < "$here/pyfuse3-passthrough.patch" &&
 rm -f src/pyfuse3/__init__.c)                    # Cython makes it anew from the patch
tar -czf "$dest/pyfuse3-3.5.0-passthrough.tar.gz" -C "$work" pyfuse3-3.5.0

rm -rf "$dest/wheel" "$dest/site"
mkdir -p "$dest/wheel"
LDFLAGS="$ldflags" SETUPTOOLS_SCM_PRETEND_VERSION=3.5.0 \
    "$python" -m pip wheel -q --no-deps -w "$work/wheel" "$work/pyfuse3-3.5.0"
if [ "$kind" = system ]; then
    mv "$work"/wheel/pyfuse3-*.whl "$dest/wheel/"
else                           # the wheel again, with libfuse3.so.N in pyfuse3.libs/
    "$work/venv/bin/python" -m wheel unpack -d "$work/unpacked" "$work"/wheel/pyfuse3-*.whl \
        >/dev/null
    libs=$work/unpacked/pyfuse3-3.5.0/pyfuse3.libs
    mkdir "$libs"
    cp -L "$dest"/libfuse/lib/libfuse3.so.[0-9] "$libs/"    # the soname, as a plain file
    strip "$libs"/libfuse3.so.*
    cp "$work/fuse-$version/LGPL2.txt" "$libs/libfuse3.LGPL2.txt"   # its licence, with it
    "$work/venv/bin/python" -m wheel pack -d "$dest/wheel" "$work/unpacked/pyfuse3-3.5.0" \
        >/dev/null
fi
"$python" -m pip install -q --no-deps --target "$dest/site" "$dest"/wheel/pyfuse3-*.whl
PYTHONPATH="$dest/site${PYTHONPATH:+:$PYTHONPATH}" "$python" -c "
import pyfuse3
assert hasattr(pyfuse3, 'get_session_fd')
lib = [line.split()[-1] for line in open('/proc/self/maps') if '/libfuse3.so' in line][0]
print('built', pyfuse3.__file__, 'with', lib)"
