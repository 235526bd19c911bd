#!/bin/bash
# Build the C floors of bench/train_loop.py: libfuse's own passthrough_hp example
# (C++, multi-threaded), run with and without FUSE passthrough (Linux >= 6.9: the kernel
# sends reads and writes straight to the backing file). They measure what a FUSE
# filesystem that is not written in Python costs an unchanged torch.save, beside the
# pyfuse3 floor (bench/_fuse_floor.py) and the mount. Nothing of it goes into s4fs.
#
#   bash bench/build_fuse_c_floor.sh DEST
#
# Fetches Debian's fuse3 source (the version the binding builds, 3.18.3: checked against
# its SHA-256, S4FS_LIBFUSE_TARBALL=PATH offline), builds it with meson and ninja (from
# PyPI, in a throw-away venv: mount/binding/libfuse_source.sh, whose meson options it
# shares), and leaves DEST/example/passthrough_hp with DEST/lib/libfuse3.so.4 (found
# through the binary's $ORIGIN/../lib). Needs a C and C++ compiler (Debian:
# build-essential). bench/gpu.sh uses .offline-kit/fuse317 when it is there (the numbers
# in docs/BENCHMARKS-HISTORY.md §10 ran libfuse 3.17.2's); pass S4FS_PASSTHROUGH_HP to
# train_loop.py otherwise.
set -euo pipefail
dest=${1:?usage: bash bench/build_fuse_c_floor.sh DEST}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
# shellcheck source=mount/binding/libfuse_source.sh disable=SC1091  # sets libfuse_*
source "$(dirname "${BASH_SOURCE[0]}")/../mount/binding/libfuse_source.sh"
libfuse_source "$work"
# shellcheck disable=SC2154   # libfuse_version, libfuse_meson: set by libfuse_source.sh
cd "$work/fuse-$libfuse_version"
# shellcheck disable=SC2154
"$work/venv/bin/meson" setup build -Dexamples=true "${libfuse_meson[@]}" >/dev/null
PATH="$work/venv/bin:$PATH" ninja -C build example/passthrough_hp >/dev/null
mkdir -p "$dest/example" "$dest/lib"
cp build/example/passthrough_hp "$dest/example/"
cp -L build/lib/libfuse3.so.4 "$dest/lib/"          # the soname, as a plain file
strip "$dest/example/passthrough_hp" "$dest/lib/libfuse3.so.4"
echo "built $dest/example/passthrough_hp (libfuse $libfuse_version)"
