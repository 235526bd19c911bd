#!/usr/bin/env bash
# Build .offline-kit/ (ignored by git, never committed): what bench/gpu.sh needs on a
# GPU machine that has Python 3.12 and no network. Run from the repo root, on a machine
# that reaches PyPI and Debian's archive:
#
#   bash bench/offline_kit.sh [PYPI-REQUIREMENT...]     # extra cp312 wheels to carry
#
# It holds:
#   root/       libfuse3 3.14 and its headers from Debian's packages (pyfuse3 is built
#               against them there), with the libfuse3.so link the linker needs
#   whl/        cp312 manylinux wheels: trio and its needs, zstandard, xxhash, Cython,
#               setuptools(_scm), nvCOMP for CUDA 13; and pyfuse3 3.5.0's source
#   setup.sh    `source .offline-kit/setup.sh`: installs whl/ into .offline-kit/site,
#               builds pyfuse3 there, and sets PYTHONPATH, PKG_CONFIG_PATH and
#               LD_LIBRARY_PATH for the shell that sources it
#   build-whl/  libfuse 3.18.3's source tarball and the meson/ninja/packaging/wheel
#               wheels: `s4fs build-passthrough` offline (bench/gpu.sh binding)
#   fuse317/    libfuse 3.18.3 built here and pyfuse3 patched for FUSE passthrough, as a
#               source tarball that bench/gpu.sh builds there (mount/binding/build_pyfuse3.sh)
# About 55 MB: under the 64 MiB a device call carries.
set -euo pipefail
cd "$(dirname "$0")/.."
KIT=.offline-kit
PY=${PYV:-3.12}
rm -rf "$KIT"
mkdir -p "$KIT/whl" "$KIT/root" "$KIT/build-whl" "$KIT/debs"

# libfuse3 from Debian, unpacked (not installed)
(cd "$KIT/debs" && { apt-get download libfuse3-3 libfuse3-dev >/dev/null 2>&1 ||
    { apt-get update -qq && apt-get download libfuse3-3 libfuse3-dev >/dev/null; }; })
for deb in "$KIT"/debs/*.deb; do dpkg-deb -x "$deb" "$KIT/root"; done
rm -rf "$KIT/debs" "$KIT/root/usr/share" "$KIT/root/usr/lib/x86_64-linux-gnu/libfuse3.so"
ln -sf libfuse3.so.3 "$KIT/root/lib/x86_64-linux-gnu/libfuse3.so"

wheels() {   # wheels DEST REQ...: binary wheels for CPython $PY on x86-64 Linux
    local dest=$1; shift
    python3 -m pip download -q --no-deps --only-binary=:all: --implementation cp \
        --python-version "$PY" --platform manylinux_2_28_x86_64 \
        --platform manylinux_2_27_x86_64 --platform manylinux_2_24_x86_64 \
        --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 -d "$dest" "$@"
}
wheels "$KIT/whl" 'setuptools>=78.1.1' setuptools_scm vcs-versioning packaging Cython \
    trio attrs sortedcontainers idna outcome sniffio zstandard xxhash \
    nvidia-nvcomp-cu13==6.0.0.12 nvidia-libnvcomp-cu13==6.0.0.12 "$@"
python3 -m pip download -q --no-deps --no-binary pyfuse3 -d "$KIT/whl" pyfuse3==3.5.0
wheels "$KIT/build-whl" meson ninja packaging wheel

# libfuse's source, checked as the build checks it
# shellcheck source=mount/binding/libfuse_source.sh disable=SC1091  # sets libfuse_*
source mount/binding/libfuse_source.sh
# shellcheck disable=SC2154   # libfuse_version, libfuse_sha256: set by libfuse_source.sh
curl -fsSL --max-time 300 -o "$KIT/build-whl/fuse3_${libfuse_version}.orig.tar.gz" \
    "https://deb.debian.org/debian/pool/main/f/fuse3/fuse3_${libfuse_version}.orig.tar.gz" ||
    curl -fsSL --max-time 300 -o "$KIT/build-whl/fuse3_${libfuse_version}.orig.tar.gz" \
        "https://snapshot.debian.org/file/c12352890442eafc751e892021f950d1f3726f62"
# shellcheck disable=SC2154
echo "$libfuse_sha256  $KIT/build-whl/fuse3_${libfuse_version}.orig.tar.gz" | sha256sum -c --quiet

# libfuse 3.18.3 and the patched pyfuse3 source; the Python build of this machine is
# dropped (the GPU machine builds its own from the tarball)
S4FS_LIBFUSE_TARBALL="$KIT/build-whl/fuse3_${libfuse_version}.orig.tar.gz" \
    bash mount/binding/build_pyfuse3.sh "$KIT/fuse317" >/dev/null
rm -rf "$KIT/fuse317/site" "$KIT/fuse317/wheel" "$KIT/fuse317/built-for"
ln -sf libfuse3.so.4 "$KIT/fuse317/libfuse/lib/libfuse3.so"

cat > "$KIT/setup.sh" <<'EOF'
# source me (bash): the kit installed into .offline-kit/site, pyfuse3 built against the
# kit's libfuse3, and this shell's paths set to use them
K=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
python3 -m pip install -q --no-index --no-deps --upgrade --target "$K/site" "$K"/whl/*.whl
sed -i "s#^prefix=.*#prefix=$K/root/usr#; s#^libdir=.*#libdir=$K/root/lib/x86_64-linux-gnu#" \
    "$K/root/usr/lib/x86_64-linux-gnu/pkgconfig/fuse3.pc"
export PKG_CONFIG_PATH=$K/root/usr/lib/x86_64-linux-gnu/pkgconfig
export LD_LIBRARY_PATH=$K/root/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
export PYTHONPATH=$K/site:$PWD${PYTHONPATH:+:$PYTHONPATH}
SETUPTOOLS_SCM_PRETEND_VERSION=3.5.0 python3 -m pip install -q --no-index --no-deps \
    --no-build-isolation --upgrade --target "$K/site" "$K"/whl/pyfuse3-*.tar.gz
python3 -c "import pyfuse3, trio; from nvidia import nvcomp; print('offline kit ready: pyfuse3', pyfuse3.__version__, 'trio', trio.__version__, 'nvcomp', nvcomp.__version__)"
EOF
du -sh "$KIT"
