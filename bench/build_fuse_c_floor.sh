#!/bin/bash
# Build the C floors of bench/train_loop.py: libfuse 3.17's own passthrough_hp example
# (C++, multi-threaded), run with and without FUSE passthrough (Linux >= 6.9: the kernel
# sends reads and writes straight to the backing file). They measure what a FUSE
# filesystem that is not written in Python costs an unchanged torch.save, beside the
# pyfuse3 floor (bench/_fuse_floor.py) and the mount. Nothing of it goes into s4fs.
#
#   bash bench/build_fuse_c_floor.sh DEST
#
# Fetches Debian's fuse3 3.17.2 source (checked against its SHA-256), builds it with
# meson (from PyPI, in a throw-away venv) and ninja, and leaves DEST/example/passthrough_hp
# with DEST/lib/libfuse3.so.4 (found through the binary's $ORIGIN/../lib). Needs a C and
# C++ compiler and ninja (Debian: build-essential ninja-build). bench/gpu.sh uses
# .offline-kit/fuse317 when it is there; pass S4FS_PASSTHROUGH_HP to train_loop.py
# otherwise.
set -euo pipefail
dest=${1:?usage: bash bench/build_fuse_c_floor.sh DEST}
version=3.17.2
sha=3d932431ad94e86179e5265cddde1d67aa3bb2fb09a5bd35c641f86f2b5ed06f
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
curl -fsS --max-time 300 -o "$work/src.tar.gz" \
    "https://deb.debian.org/debian/pool/main/f/fuse3/fuse3_${version}.orig.tar.gz"
echo "$sha  $work/src.tar.gz" | sha256sum -c --quiet
tar -xzf "$work/src.tar.gz" -C "$work"
python3 -m venv "$work/venv"
"$work/venv/bin/pip" install -q meson
cd "$work/fuse-$version"
"$work/venv/bin/meson" setup build -Dexamples=true -Dutils=false -Dtests=false \
    -Ddisable-mtab=true >/dev/null
ninja -C build example/passthrough_hp >/dev/null
mkdir -p "$dest/example" "$dest/lib"
cp build/example/passthrough_hp "$dest/example/"
cp -L build/lib/libfuse3.so.4 "$dest/lib/"          # the soname, as a plain file
strip "$dest/example/passthrough_hp" "$dest/lib/libfuse3.so.4"
echo "built $dest/example/passthrough_hp (libfuse $version)"
