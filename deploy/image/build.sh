#!/usr/bin/env bash
# Provision the s4fs image on Ubuntu 22.04 (run as root by deploy/image/s4fs.pkr.hcl,
# or by hand on a fresh g6/g6e instance). Expects in $S4FS_SRC: the s4fs wheel,
# deploy/install.sh, deploy/config.example.toml and systemd/*.
set -euo pipefail
export DEBIAN_FRONTEND=noninteractive

src="${S4FS_SRC:?set S4FS_SRC to the folder with the wheel, deploy/ and systemd/}"
driver="${NVIDIA_DRIVER:-550}"
torch_index="${TORCH_INDEX_URL:-https://download.pytorch.org/whl/cu124}"
venv=/opt/s4fs

# shellcheck source=/dev/null
. /etc/os-release
[ "${VERSION_ID:-}" = "22.04" ] || echo "build.sh: warning: written for Ubuntu 22.04, this is ${PRETTY_NAME:-unknown}" >&2

wheel="$(find "$src" -maxdepth 1 -name 's4fs-*.whl' | head -n 1)"
[ -n "$wheel" ] || { echo "build.sh: no s4fs-*.whl in $src" >&2; exit 1; }

echo "== packages"
apt-get update -q
apt-get upgrade -y -q
# fuse3: fusermount3 (setuid) for the non-root mount; libfuse3-dev, pkg-config and a
# compiler build pyfuse3; python3.11 because the config reader uses tomllib
apt-get install -y -q --no-install-recommends \
    fuse3 libfuse3-dev pkg-config build-essential ca-certificates curl \
    ubuntu-drivers-common software-properties-common
if apt-get install -y -q --no-install-recommends python3.11 python3.11-venv python3.11-dev; then
    python=python3.11
else
    apt-get install -y -q --no-install-recommends python3 python3-venv python3-dev
    python=python3
fi

echo "== NVIDIA driver ${driver} (server branch, prebuilt kernel modules)"
if ! command -v nvidia-smi >/dev/null; then
    ubuntu-drivers install --gpgpu "nvidia:${driver}-server"
    apt-get install -y -q --no-install-recommends "nvidia-utils-${driver}-server"
fi

echo "== s4fs into ${venv}"
"$python" -m venv "$venv"
"$venv/bin/pip" install -q --upgrade pip wheel
"$venv/bin/pip" install -q --index-url "$torch_index" --extra-index-url https://pypi.org/simple torch
"$venv/bin/pip" install -q "${wheel}[gpu,service,s3,fuse]"
# Python 3.10 has no tomllib
"$venv/bin/python" -c 'import tomllib' 2>/dev/null || "$venv/bin/pip" install -q tomli
"$venv/bin/s4fs" --help >/dev/null

echo "== user, units, config"
bash "$src/deploy/install.sh" --s4fs-bin "$venv/bin/s4fs"
"$venv/bin/s4fs" runner --config /etc/s4fs/config.toml --check-config

apt-get clean
rm -rf /var/lib/apt/lists/* /root/.cache/pip
echo "== build.sh done; reboot, then run gate.sh"
