"""Mount benchmark: torch.save / torch.load through the s4fs mount vs local disk.

    python bench/mount.py [--gib 1.0] [--repeat 5] [--store DIR_OR_URL]

A ~1 GiB mixed bf16/fp32 state dict (real MiniLM weights tiled), saved and loaded with
unchanged torch code, alternating mount and local disk, median of ``--repeat``. Also the
stored % and the daemon's peak RSS for a small and a large file (it must not grow with
file size). Timings are printed, never asserted.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


DEVICE = "cpu"


def daemon_hwm(mountpoint: str) -> int:
    out = subprocess.run(["pgrep", "-f", f"s4fs.cli mount .* {mountpoint}"],
                         capture_output=True, text=True).stdout.split()
    best = 0
    for pid in out:
        try:
            with open(f"/proc/{pid}/status") as f:
                for line in f:
                    if line.startswith("VmHWM:"):
                        best = max(best, int(line.split()[1]) * 1024)
        except OSError:
            pass
    return best


def run(sd, store: str, work: str, repeat: int, tag: str) -> dict:
    import torch
    mnt = os.path.join(work, f"mnt-{tag}")
    local = os.path.join(work, f"local-{tag}")
    os.makedirs(mnt)
    os.makedirs(local)
    cache = os.path.join(work, f"cache-{tag}")
    subprocess.run([sys.executable, "-m", "s4fs.cli", "mount", store, mnt, "--cache-dir",
                    cache, "--device", DEVICE], check=True)
    try:
        ms, ls_, ml, ll = [], [], [], []
        stored = logical = 0
        for i in range(repeat):
            name = f"ckpt_{i}.pt"
            t0 = time.perf_counter()
            torch.save(sd, os.path.join(mnt, name))
            ms.append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            torch.save(sd, os.path.join(local, name))
            os.sync()
            ls_.append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            x = torch.load(os.path.join(mnt, name))
            ml.append(time.perf_counter() - t0)
            del x
            t0 = time.perf_counter()
            x = torch.load(os.path.join(local, name))
            ll.append(time.perf_counter() - t0)
            del x
            import json
            r = json.loads(subprocess.run(
                [sys.executable, "-m", "s4fs.cli", "stat", "--json", os.path.join(mnt, name)],
                capture_output=True, text=True, check=True).stdout)
            stored, logical = r["stored"], r["logical"]
            if i < repeat - 1:
                os.remove(os.path.join(mnt, name))   # no delta chain: every save is full
            os.remove(os.path.join(local, name))
        hwm = daemon_hwm(mnt)
    except BaseException:
        try:
            with open(os.path.join(cache, "s4fs-mount.log")) as f:
                print("daemon log:\n" + f.read()[-6000:], file=sys.stderr)
        except OSError:
            pass
        raise
    finally:
        subprocess.run([sys.executable, "-m", "s4fs.cli", "umount", mnt], check=False)
    med = statistics.median
    return {"logical": logical, "stored": stored, "ms": med(ms), "ls": med(ls_),
            "ml": med(ml), "ll": med(ll), "hwm": hwm}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--gib", type=float, default=1.0)
    ap.add_argument("--small-gib", type=float, default=0.25)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--store", help="store URL or directory (default: a temp directory)")
    ap.add_argument("--device", default="cpu", choices=["auto", "cpu", "cuda"])
    args = ap.parse_args(argv)
    global DEVICE
    DEVICE = args.device
    from _common import machine, table
    from _data import mixed_state_dict
    work = tempfile.mkdtemp(prefix="s4fs-bench-mount-")
    rows = []
    try:
        for gib in (args.small_gib, args.gib):
            sd = mixed_state_dict(int(gib * (1 << 30)))
            store = args.store or os.path.join(work, f"store-{gib}")
            r = run(sd, store, work, args.repeat if gib == args.gib else 2, f"{gib}")
            mb = r["logical"] / 1e6
            rows.append([f"{r['logical'] / 2**30:.2f} GiB", f"{100 * r['stored'] / r['logical']:.1f}",
                         f"{r['ms']:.2f}", f"{r['ls']:.2f}", f"{r['ms'] / r['ls']:.2f}x",
                         f"{r['ml']:.2f}", f"{r['ll']:.2f}", f"{r['ml'] / r['ll']:.2f}x",
                         f"{mb / r['ms']:.0f}", f"{r['hwm'] / 2**20:.0f}"])
            del sd
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(f"# bench/mount.py — {machine()}; codec device {args.device}; median of "
          f"{args.repeat} (small file: 2)")
    print("# torch.save/torch.load unchanged; local = same calls on a local ext4 file "
          "(+ os.sync after save)")
    print(table(["file", "stored %", "save s (mount)", "save s (local)", "save ratio",
                 "load s (mount)", "load s (local)", "load ratio", "save MB/s (mount)",
                 "daemon peak RSS MiB"], rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
