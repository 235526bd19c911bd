"""A real run for `s4fs report`: fine-tune all-MiniLM-L6-v2 with AdamW on the CPU, save
HF Trainer-style ``checkpoint-N/{model.pt, optimizer.pt}`` folders through the s4fs API
into a local store, then print the report and draw it.

    python bench/report_demo.py --saves 8 --every 5 --png docs/img/report --out report.html
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--saves", type=int, default=8)
    ap.add_argument("--every", type=int, default=5, help="training steps between saves")
    ap.add_argument("--store", help="store folder (default: a temp dir)")
    ap.add_argument("--out", help="HTML report path")
    ap.add_argument("--png", help="folder for the PNG plots")
    args = ap.parse_args(argv)
    import s4fs
    import _minilm as minilm
    root = args.store or tempfile.mkdtemp(prefix="s4fs-report-")
    fs = s4fs.filesystem(root)
    for d in ("run",):
        if not fs.exists(d):
            fs.mkdir(d)
    for step, model, optim in minilm.finetune(args.saves * args.every, every=args.every):
        d = f"run/checkpoint-{step}"
        if not fs.exists(d):
            fs.mkdir(d)
        s4fs.save(model, os.path.join(root, d, "model.pt"))
        s4fs.save(optim, os.path.join(root, d, "optimizer.pt"))
        print(f"saved {d}", file=sys.stderr)
    cmd = [sys.executable, "-m", "s4fs.cli", "report", os.path.join(root, "run")]
    if args.out:
        cmd += ["--out", args.out]
    if args.png:
        cmd += ["--png", args.png]
    return subprocess.run(cmd).returncode


if __name__ == "__main__":
    sys.exit(main())
