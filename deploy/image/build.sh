#!/usr/bin/env bash
# Provision the s4fs image on Ubuntu 24.04 (run as root by deploy/image/s4fs.pkr.hcl,
# or by hand on a fresh g6/g6e instance). Expects in $S4FS_SRC: the s4fs wheel,
# deploy/install.sh, deploy/config.example.toml and systemd/*.
#
# The image boots Ubuntu's HWE kernel (24.04's own 6.8 lacks FUSE passthrough, which
# came in 6.9): with it and pyfuse3 built with passthrough (`s4fs build-passthrough`),
# the kernel writes checkpoints being saved straight into s4fs's spool and reads local
# copies itself, as fast as a local disk; without them every byte goes through the
# daemon as a FUSE request (docs/OPERATING.md). gate.sh checks it after the reboot.
set -euo pipefail
export DEBIAN_FRONTEND=noninteractive

src="${S4FS_SRC:?set S4FS_SRC to the folder with the wheel, deploy/ and systemd/}"
driver="${NVIDIA_DRIVER:-580}"
torch_index="${TORCH_INDEX_URL:-https://download.pytorch.org/whl/cu124}"
venv=/opt/s4fs

# shellcheck source=/dev/null
. /etc/os-release
[ "${VERSION_ID:-}" = "24.04" ] || echo "build.sh: warning: written for Ubuntu 24.04, this is ${PRETTY_NAME:-unknown}" >&2

wheel="$(find "$src" -maxdepth 1 -name 's4fs-*.whl' | head -n 1)"
[ -n "$wheel" ] || { echo "build.sh: no s4fs-*.whl in $src" >&2; exit 1; }

echo "== packages"
apt-get update -q
apt-get upgrade -y -q
# fuse3: fusermount3 (setuid) for the non-root mount; libfuse3-dev, pkg-config and a
# compiler build pyfuse3; curl and patch: `s4fs build-passthrough` (the system's libfuse
# where it is >= 3.17.3, else 3.18.3 from Debian's source; pyfuse3 with the passthrough
# patch); python3 is 3.12 (tomllib)
apt-get install -y -q --no-install-recommends \
    fuse3 libfuse3-dev pkg-config build-essential ca-certificates curl patch \
    python3 python3-venv python3-dev
python=python3

echo "== the HWE kernel and NVIDIA driver ${driver} (server branch, Canonical's prebuilt modules for it)"
apt-get install -y -q --no-install-recommends linux-generic-hwe-24.04 \
    "linux-modules-nvidia-${driver}-server-generic-hwe-24.04" \
    "nvidia-headless-no-dkms-${driver}-server" "nvidia-utils-${driver}-server"

echo "== s4fs into ${venv}"
"$python" -m venv "$venv"
"$venv/bin/pip" install -q --upgrade pip wheel
"$venv/bin/pip" install -q --index-url "$torch_index" --extra-index-url https://pypi.org/simple torch
"$venv/bin/pip" install -q "${wheel}[gpu,service,s3,fuse]"
"$venv/bin/s4fs" --help >/dev/null
echo "== pyfuse3 with FUSE passthrough into ${venv}"
# builds the patched pyfuse3 (and libfuse, where the system's is older than 3.17.3) for
# this venv's Python and installs them;
# the kernel it notes as too old is the build's own (the HWE kernel runs after the reboot)
"$venv/bin/s4fs" build-passthrough

echo "== user, units, config"
# --passthrough: the runner's mount may register backing files (CAP_SYS_ADMIN)
bash "$src/deploy/install.sh" --s4fs-bin "$venv/bin/s4fs" --passthrough
"$venv/bin/s4fs" runner --config /etc/s4fs/config.toml --check-config

apt-get clean
rm -rf /var/lib/apt/lists/* /root/.cache/pip
echo "== build.sh done; reboot (into the HWE kernel), then run gate.sh"
