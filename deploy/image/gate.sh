#!/usr/bin/env bash
# The image build gate (run as root after build.sh and a reboot): the GPU must be usable,
# every GPU compress -> decompress round trip of the adversarial set must be bit-exact,
# and every byte written through a real s4fs mount must come back exactly, moved by FUSE
# passthrough (the HWE kernel and the pyfuse3 build.sh built with it). Any failure exits
# non-zero, which fails the Packer build: no image is made.
set -euo pipefail

prefix="${S4FS_PREFIX:-/opt/s4fs}"     # where build.sh installed s4fs

echo "== GPU"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv

echo "== kernel $(uname -r)"
echo "== s4fs selftest --device cuda --mount --require-passthrough"
"$prefix/bin/s4fs" selftest --device cuda --mount --require-passthrough || status=$?
case "${status:-0}" in
    0) ;;
    3) echo "gate.sh: every byte came back, but the mount did not use FUSE passthrough" \
            "(the reason is above: the kernel must be >= 6.9, pyfuse3 built by" \
            "\`s4fs build-passthrough\`); no image will be made" >&2
       exit 1 ;;
    *) echo "gate.sh: s4fs selftest failed (${status}): the GPU round trip or a byte read" \
            "back through the mount is not bit-exact, or the GPU codec or the mount is" \
            "unusable; no image will be made" >&2
       exit 1 ;;
esac

echo "== the runner's own boot check"
"$prefix/bin/python" - <<'PY'
import sys
from s4fs.service import selfcheck
r = selfcheck.run("cuda")
print(r.detail)
sys.exit(0 if r.ok else 1)
PY
echo "gate.sh: passed"
