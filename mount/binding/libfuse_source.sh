# shellcheck shell=bash
# Sourced by mount/binding/build_pyfuse3.sh and bench/build_fuse_c_floor.sh: fetch
# Debian's fuse3 3.17.2 source (checked against its SHA-256) into $1, unpacked as
# $1/fuse-3.17.2, and a throw-away venv $1/venv with meson and ninja from PyPI.
libfuse_version=3.17.2
libfuse_source() {
    local work=$1 sha=3d932431ad94e86179e5265cddde1d67aa3bb2fb09a5bd35c641f86f2b5ed06f
    curl -fsS --max-time 300 -o "$work/fuse.tar.gz" \
        "https://deb.debian.org/debian/pool/main/f/fuse3/fuse3_${libfuse_version}.orig.tar.gz"
    echo "$sha  $work/fuse.tar.gz" | sha256sum -c --quiet
    tar -xzf "$work/fuse.tar.gz" -C "$work"
    python3 -m venv "$work/venv"
    "$work/venv/bin/pip" install -q meson ninja
}
