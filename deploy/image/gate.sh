#!/usr/bin/env bash
# The image build gate (run as root after build.sh and a reboot): the GPU must be usable
# and every GPU compress -> decompress round trip of the adversarial set must be
# bit-exact. Any failure exits non-zero, which fails the Packer build: no image is made.
set -euo pipefail

prefix="${S4FS_PREFIX:-/opt/s4fs}"     # where build.sh installed s4fs

echo "== GPU"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv

echo "== s4fs selftest --device cuda"
if ! "$prefix/bin/s4fs" selftest --device cuda; then
    echo "gate.sh: s4fs selftest --device cuda failed: the GPU round trip is not bit-exact" \
         "or the GPU codec is unusable; no image will be made" >&2
    exit 1
fi

echo "== the runner's own boot check"
"$prefix/bin/python" - <<'PY'
import sys
from s4fs.service import selfcheck
r = selfcheck.run("cuda")
print(r.detail)
sys.exit(0 if r.ok else 1)
PY
echo "gate.sh: passed"
