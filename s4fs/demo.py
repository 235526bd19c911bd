"""`make demo`: the main job on the embedded default (a local-directory store).

Mounts s4fs on a local store in a temporary directory, saves the real all-MiniLM-L6-v2
state dict and real AdamW state through the mount with unchanged ``torch.save`` code,
loads them back, checks they are equal and byte-identical to copies saved on local disk,
prints logical vs stored size and the save time beside local disk + ``os.sync`` (the
mount's close() returns once the file is in the store: durable, as a synced local file
is), and unmounts.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import tempfile
import time


def _sha(path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _equal(a, b) -> bool:
    import torch
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_equal(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(_equal(x, y) for x, y in zip(a, b))
    if isinstance(a, torch.Tensor):
        return a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b)
    return a == b


def _transport(status: dict) -> str:
    """How the mount's writes and reads went, from its ``s4fs status --json`` answer
    (the mount keeps ``transport`` current: "FUSE passthrough (...)" or "FUSE requests
    (why)"), as "FUSE passthrough: ..." or "FUSE requests: why"."""
    how = status.get("transport") or "FUSE requests (the mount did not say why)"
    head, _, why = how.partition(" (")
    return f"{head}: {why[:-1]}" if why else head


def main() -> int:
    import torch

    from s4fs.testing.minilm import finetune, load_weights

    work = tempfile.mkdtemp(prefix="s4fs-demo-")
    store, mnt, local = (os.path.join(work, d) for d in ("store", "mnt", "local"))
    for d in (store, mnt, local):
        os.makedirs(d)
    print(f"s4fs demo: store {store}, mount {mnt}")
    subprocess.run([sys.executable, "-m", "s4fs.cli", "mount", store, mnt,
                    "--cache-dir", os.path.join(work, "cache")], check=True)
    ok = True
    try:
        print("fine-tuning all-MiniLM-L6-v2 for 30 real AdamW steps on CPU ...")
        *_, (step, model_sd, opt_sd) = finetune(30, every=30)
        jobs = {
            "model.pt": load_weights(),
            "ckpt_30.pt": {"model": model_sd, "optimizer": opt_sd, "step": step},
        }
        rows = []
        for name, obj in jobs.items():
            t0 = time.perf_counter()
            torch.save(obj, os.path.join(mnt, name))          # unchanged user code
            t_mount = time.perf_counter() - t0
            t0 = time.perf_counter()
            torch.save(obj, os.path.join(local, name))
            os.sync()            # the mount's close() returns once the file is stored
            t_local = time.perf_counter() - t0
            back = torch.load(os.path.join(mnt, name))
            same_bytes = _sha(os.path.join(mnt, name)) == _sha(os.path.join(local, name))
            same_values = _equal(back, obj)
            ok &= same_bytes and same_values
            st = subprocess.run([sys.executable, "-m", "s4fs.cli", "stat", "--json",
                                 os.path.join(mnt, name)], capture_output=True, text=True,
                                check=True).stdout
            r = json.loads(st)
            rows.append((name, r["logical"], r["stored"], t_mount, t_local,
                         same_bytes, same_values))
        print()
        print(f"{'file':<12} {'logical MB':>11} {'stored MB':>10} {'stored %':>9} "
              f"{'save s (s4fs)':>14} {'save s (disk+sync)':>19} {'bytes equal':>12} "
              f"{'tensors equal':>14}")
        for name, lg, sto, tm, tl, sb, sv in rows:
            print(f"{name:<12} {lg / 1e6:>11.2f} {sto / 1e6:>10.2f} {100 * sto / lg:>8.1f}% "
                  f"{tm:>14.2f} {tl:>19.2f} {str(sb):>12} {str(sv):>14}")
        print()
        status = subprocess.run([sys.executable, "-m", "s4fs.cli", "status", "--json", mnt],
                                capture_output=True, text=True, check=True).stdout
        print("how the bytes went:", _transport(json.loads(status)))
        print()
        subprocess.run(["ls", "-la", mnt], check=True)
    finally:
        subprocess.run([sys.executable, "-m", "s4fs.cli", "umount", mnt], check=False)
        import shutil
        shutil.rmtree(work, ignore_errors=True)
    print("unmounted and cleaned up;", "every byte came back exactly" if ok else "MISMATCH")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
