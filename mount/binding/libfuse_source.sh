# shellcheck shell=bash
# Sourced by mount/binding/build_pyfuse3.sh and bench/build_fuse_c_floor.sh: fetch
# Debian's fuse3 3.18.3 source into WORK, unpacked as WORK/fuse-3.18.3, and a throw-away
# venv WORK/venv with meson and ninja (and any PACKAGE given) from PyPI:
#
#   libfuse_source WORK [PACKAGE...]
#
# The SHA-256 is what makes a copy acceptable, not where it came from: the Debian pool
# drops a version once sid moves on, so after it comes snapshot.debian.org (the same
# file, by its SHA-1), and S4FS_LIBFUSE_TARBALL=PATH hands an offline machine the
# tarball (fuse3_3.18.3.orig.tar.gz).
libfuse_version=3.18.3
libfuse_sha256=bcd19582c5e30f7fe45dd86a5540e998590aa01903afc7ebcbeea6c8ac5421ee
# meson options of both builds: no fuse-over-io-uring, so libfuse3.so.4 needs no
# liburing or libnuma on a machine that installs a wheel bundling it
# shellcheck disable=SC2034   # used by the scripts that source this
libfuse_meson=(--buildtype=release -Dutils=false -Dtests=false -Ddisable-mtab=true
               -Denable-io-uring=false)
libfuse_source() {
    local work=$1 url ok=''
    local pool=https://deb.debian.org/debian/pool/main/f/fuse3
    shift                                       # the rest: more PyPI packages for the venv
    if [ -n "${S4FS_LIBFUSE_TARBALL:-}" ]; then
        cp "$S4FS_LIBFUSE_TARBALL" "$work/fuse.tar.gz"
        ok=1
    else
        for url in \
            "$pool/fuse3_${libfuse_version}.orig.tar.gz" \
            "https://snapshot.debian.org/file/c12352890442eafc751e892021f950d1f3726f62"; do
            curl -fsSL --max-time 300 -o "$work/fuse.tar.gz" "$url" && ok=1 && break
            echo "libfuse $libfuse_version: not at $url" >&2
        done
    fi
    [ -n "$ok" ] || { echo "libfuse $libfuse_version: no source reached; pass" \
        "S4FS_LIBFUSE_TARBALL=fuse3_${libfuse_version}.orig.tar.gz" >&2; return 1; }
    echo "$libfuse_sha256  $work/fuse.tar.gz" | sha256sum -c --quiet
    tar -xzf "$work/fuse.tar.gz" -C "$work"
    python3 -m venv "$work/venv"
    "$work/venv/bin/pip" install -q meson ninja "$@"
}
