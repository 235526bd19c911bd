"""What checkpoints cost: one file (``s4fs stat``) or a run's folder (``s4fs report``).

:func:`file_report` reads one manifest: logical and stored bytes, how much was stored as
deltas, as full chunks, or reused unchanged from the base, the chain depth, and the same
per tensor. A chunk counts as stored by a file only if it lives in that file's own packs:
bytes a delta chain shares with an earlier checkpoint were paid for there.

:func:`run_report` does that for every file under a folder (a run directory, HF
``checkpoint-N/`` folders, DCP step folders), orders them by the step number in their
path, sums them by tensor family (model weights, ``exp_avg``, ``exp_avg_sq``, other) and
by dtype, and, for the largest tensors, reads their chunk headers (a few ranged reads,
no decoding) to show how the stored bytes split between the byte planes — exponent,
mantissa, sign. :func:`render_html` and :func:`render_png` draw it with matplotlib into
one self-contained HTML file (inline SVG, no network) and PNG files.
"""

from __future__ import annotations

import html
import io
import re
from collections import defaultdict

from s4fs.manifest import stored_split  # also imported from here: s4fs.report.stored_split

FAMILIES = ("weights", "exp_avg", "exp_avg_sq", "other")
_FLOAT = ("float", "bfloat", "half", "double", "complex")


def file_report(fs, rel: str) -> dict:
    """Sizes, ratio, delta base and chain, per tensor, of one committed file."""
    m = fs.manifest(rel, fresh=True)
    own = set(m.own_packs)
    # the tensor each pair's tensor is coded on (s4fs.write.pairs: an fp32 master on its
    # low-precision copy, or the copy on its master), by chunk
    copy_of = {c.key(): s.name for s in m.streams for c in s.chunks}
    tensors = []
    for s in m.streams:
        if s.kind != "tensor":
            continue
        row = {"name": m.names.get(s.name, s.name), "record": s.name, "dtype": s.dtype,
               "logical": s.length,
               "stored": sum(c.stored for c in s.chunks if c.pack in own)}
        on = {copy_of.get(_root_copy(c).key()) for c in s.chunks if c.paired}
        if on:
            rec = sorted(x for x in on if x)
            row["paired_on"] = ", ".join(m.names.get(r, r) for r in rec) or "a copy"
        tensors.append(row)
    split = stored_split(m)
    stored = m.stored_bytes()
    newer = (m.base or {}).get("newer")
    # backward: its chunks are deltas on a newer version (re-expressed after that one
    # was saved); forward: deltas on the one it was saved after; whole: neither
    direction = "backward" if newer else ("forward" if split["chain_depth"] else "whole")
    return {"path": rel, "logical": m.size, "stored": stored,
            "ratio": stored / m.size if m.size else 0.0, "kind": m.kind,
            "base": (m.base or {}).get("path"), "direction": direction,
            "newer": newer.get("path") if newer else None,
            "chain_depth": split["chain_depth"],
            "stored_delta": split["stored_delta"], "stored_full": split["stored_full"],
            "unchanged_bytes": split["unchanged"], "read_cold": split["read_cold"],
            "tensors": tensors, "xxh128": m.xxh128,
            "mtime": m.mtime}


def _root_copy(c):
    """The tensor a pair's chunk is coded on: its base (itself maybe a delta now, whose
    key that tensor's stream still holds)."""
    return c.base


def family(name: str | None, dtype: str) -> str:
    """Which part of a training state a tensor is, from its name in the state dict."""
    n = (name or "").lower()
    if "exp_avg_sq" in n:
        return "exp_avg_sq"
    if "exp_avg" in n:
        return "exp_avg"
    if any(k in n for k in ("optim", "state.", "momentum", "scheduler", "rng")):
        return "other"
    if dtype.startswith(_FLOAT) or dtype in ("bf16", "fp16", "fp32", "fp64"):
        return "weights"
    return "other"


def step_of(path: str) -> int | None:
    """The step number a checkpoint's path carries (``checkpoint-500/``, ``step_20``,
    ``ckpt_100.pt``): the last number in the path; None if there is none."""
    found = re.findall(r"(\d+)", path)
    return int(found[-1]) if found else None


def walk(fs, rel: str) -> list[str]:
    """Every file under ``rel`` (``rel`` itself if it is a file), in name order; symbolic
    links are not followed (the files they name are counted where they lie)."""
    if not fs.stat(rel).is_dir:
        return [rel]
    out = []
    for n in sorted(fs.listdir(rel)):
        p = f"{rel}/{n}" if rel else n
        a = fs.stat(p)
        if a.is_dir:
            out += walk(fs, p)
        elif not a.is_link:
            out.append(p)
    return out


def _checkpoint_of(path: str, root: str) -> str:
    """The checkpoint a file belongs to: its first folder under the root when that
    folder names a step (HF ``checkpoint-N/``, DCP ``step_N/``), else the file itself."""
    inner = path[len(root):].lstrip("/") if root and path.startswith(root) else path
    head = inner.split("/", 1)[0]
    if "/" in inner and step_of(head) is not None:
        return (f"{root}/{head}" if root else head)
    return path


def run_report(fs, rel: str, *, top: int = 12, progress=None) -> dict:
    """The whole report of a folder of checkpoints (see the module docstring)."""
    files = walk(fs, rel)
    groups: dict[str, list[dict]] = defaultdict(list)
    for f in (progress(files, desc="reading manifests", unit="file") if progress
              else files):
        groups[_checkpoint_of(f, rel)].append(file_report(fs, f))
    checkpoints = []
    for name, reps in groups.items():
        fam = {k: {"logical": 0, "stored": 0} for k in FAMILIES}
        dt: dict[str, dict] = defaultdict(lambda: {"logical": 0, "stored": 0})
        tensors_logical = 0
        for r in reps:
            for t in r["tensors"]:
                k = family(t["name"], t["dtype"])
                fam[k]["logical"] += t["logical"]
                fam[k]["stored"] += t["stored"]
                dt[t["dtype"]]["logical"] += t["logical"]
                dt[t["dtype"]]["stored"] += t["stored"]
                tensors_logical += t["logical"]
        logical = sum(r["logical"] for r in reps)
        stored = sum(r["stored"] for r in reps)
        tensor_stored = sum(v["stored"] for v in fam.values())
        fam["other"]["logical"] += logical - tensors_logical     # headers, pickles, ...
        fam["other"]["stored"] += stored - tensor_stored
        checkpoints.append({
            "name": name, "step": step_of(name), "files": len(reps),
            "logical": logical, "stored": stored,
            "stored_delta": sum(r["stored_delta"] for r in reps),
            "stored_full": sum(r["stored_full"] for r in reps),
            "unchanged": sum(r["unchanged_bytes"] for r in reps),
            "chain_depth": max((r["chain_depth"] for r in reps), default=0),
            "families": fam, "dtypes": dict(dt),
            "mtime": max((r["mtime"] for r in reps), default=0.0)})
    checkpoints.sort(key=lambda c: (c["step"] is None, c["step"] or 0, c["mtime"],
                                    c["name"]))
    cum_l = cum_s = 0
    for c in checkpoints:
        cum_l += c["logical"]
        cum_s += c["stored"]
        c["cumulative_logical"], c["cumulative_stored"] = cum_l, cum_s
    largest = _largest_tensors(fs, files, top)
    return {"root": rel or "/", "store": fs.store.url, "checkpoints": checkpoints,
            "logical": cum_l, "stored": cum_s,
            "saving": 1 - cum_s / cum_l if cum_l else 0.0, "largest_tensors": largest}


def _largest_tensors(fs, files: list[str], top: int) -> list[dict]:
    """The ``top`` largest tensors of the newest checkpoint with their planes' share of
    what they stored (chunk headers only: a ranged read of each chunk's first bytes)."""
    from s4fs.codec import plane_roles, read_header
    if not files or top <= 0:
        return []
    newest = max(files, key=lambda f: (step_of(f) or 0, fs.manifest(f).mtime))
    m = fs.manifest(newest)
    own = set(m.own_packs)
    streams = sorted((s for s in m.streams if s.kind == "tensor"),
                     key=lambda s: -s.length)[:top]
    out = []
    for s in streams:
        planes: dict[str, int] = defaultdict(int)
        for c in s.chunks:
            if c.pack not in own:
                continue
            head = fs.store.get(c.pack, c.offset, c.offset + min(c.stored, 256))
            try:
                h = read_header(head, whole=False)
            except Exception:                         # noqa: BLE001 - header only
                planes["unknown"] += c.stored
                continue
            roles = plane_roles(h)
            for role, p in zip(roles, h.planes):
                planes[role] += p.enc_len
            planes["header"] += h.payload_offset
        stored = sum(c.stored for c in s.chunks if c.pack in own)
        out.append({"file": newest, "name": m.names.get(s.name, s.name), "dtype": s.dtype,
                    "family": family(m.names.get(s.name, s.name), s.dtype),
                    "logical": s.length, "stored": stored, "planes": dict(planes)})
    return out


# --- drawing -----------------------------------------------------------------------------

_COLORS = {"weights": "#4C72B0", "exp_avg": "#DD8452", "exp_avg_sq": "#55A868",
           "other": "#8C8C8C"}


def _figures(rep: dict):
    """The report's matplotlib figures: (title, figure) pairs."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    cks = rep["checkpoints"]
    labels = [str(c["step"]) if c["step"] is not None else c["name"] for c in cks]
    x = list(range(len(cks)))
    big = max((c["logical"] for c in cks), default=0) >= 1 << 30
    gib, unit = (float(1 << 30), "GiB") if big else (float(1 << 20), "MiB")
    figs = []

    fig, ax = plt.subplots(figsize=(9, 4.2))
    bottom = [0.0] * len(cks)
    for k in FAMILIES:
        vals = [c["families"][k]["stored"] / gib for c in cks]
        ax.bar(x, vals, bottom=bottom, color=_COLORS[k], label=f"{k} (stored)")
        bottom = [b + v for b, v in zip(bottom, vals)]
    ax.plot(x, [c["logical"] / gib for c in cks], "k.-", label="logical size")
    ax.set_xticks(x, labels, rotation=45 if len(cks) > 12 else 0)
    ax.set_xlabel("checkpoint (step)")
    ax.set_ylabel(unit)
    ax.set_title("Stored bytes per checkpoint, by tensor family")
    ax.legend(fontsize=8)
    fig.tight_layout()
    figs.append(("stored per checkpoint", fig))

    fig, ax = plt.subplots(figsize=(9, 3.6))
    ax.plot(x, [c["cumulative_logical"] / gib for c in cks], "k.-", label="logical")
    ax.plot(x, [c["cumulative_stored"] / gib for c in cks], ".-", color="#C44E52",
            label="stored")
    ax.fill_between(x, [c["cumulative_stored"] / gib for c in cks],
                    [c["cumulative_logical"] / gib for c in cks], color="#C44E52",
                    alpha=0.12, label="saved")
    ax.set_xticks(x, labels, rotation=45 if len(cks) > 12 else 0)
    ax.set_ylabel(f"{unit}, cumulative")
    ax.set_title(f"The run so far: {100 * rep['saving']:.1f}% saved")
    ax.legend(fontsize=8)
    fig.tight_layout()
    figs.append(("cumulative", fig))

    fig, ax = plt.subplots(figsize=(9, 3.2))
    delta = [c["stored_delta"] / max(1, c["stored"]) * 100 for c in cks]
    ax.bar(x, delta, color="#8172B3")
    ax2 = ax.twinx()
    ax2.plot(x, [c["chain_depth"] for c in cks], "k.--")
    ax2.set_ylabel("delta chain depth")
    ax.set_xticks(x, labels, rotation=45 if len(cks) > 12 else 0)
    ax.set_ylabel("% of stored bytes that are deltas")
    ax.set_ylim(0, 100)
    ax.set_title("Where deltas pay")
    fig.tight_layout()
    figs.append(("deltas", fig))
    return figs


def render_png(rep: dict, folder: str) -> list[str]:
    import os

    import matplotlib.pyplot as plt
    os.makedirs(folder, exist_ok=True)
    out = []
    for i, (title, fig) in enumerate(_figures(rep)):
        path = os.path.join(folder, f"{i + 1}-{title.replace(' ', '-')}.png")
        fig.savefig(path, dpi=110)
        plt.close(fig)
        out.append(path)
    return out


def _gib(n: int) -> str:
    return f"{n / (1 << 30):.2f} GiB" if n >= 1 << 28 else f"{n / (1 << 20):.1f} MiB"


def render_html(rep: dict) -> str:
    """One self-contained page: the figures as inline SVG, then the tables."""
    import matplotlib.pyplot as plt
    svgs = []
    for title, fig in _figures(rep):
        buf = io.StringIO()
        fig.savefig(buf, format="svg")
        plt.close(fig)
        svg = buf.getvalue()
        svgs.append(f'<figure aria-label="{html.escape(title)}">'
                    f'{svg[svg.index("<svg"):]}</figure>')
    e = html.escape
    rows = "".join(
        f"<tr><td>{e(c['name'])}</td><td>{c['files']}</td><td>{_gib(c['logical'])}</td>"
        f"<td>{_gib(c['stored'])}</td><td>{100 * c['stored'] / max(1, c['logical']):.1f}%"
        f"</td><td>{100 * c['stored_delta'] / max(1, c['stored']):.0f}%</td>"
        f"<td>{c['chain_depth']}</td></tr>" for c in rep["checkpoints"])
    trows = ""
    for t in rep["largest_tensors"]:
        total = sum(v for k, v in t["planes"].items()) or 1
        share = ", ".join(f"{k} {100 * v / total:.0f}%" for k, v in
                          sorted(t["planes"].items(), key=lambda kv: -kv[1]))
        trows += (f"<tr><td>{e(str(t['name']))}</td><td>{e(t['dtype'])}</td>"
                  f"<td>{e(t['family'])}</td><td>{_gib(t['logical'])}</td>"
                  f"<td>{_gib(t['stored'])}</td><td>{e(share) or '-'}</td></tr>")
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>s4fs report: {e(rep['root'])}</title>
<style>
body {{ font: 14px/1.4 system-ui, sans-serif; margin: 2em auto; max-width: 980px; color: #222 }}
table {{ border-collapse: collapse; margin: 1em 0 }}
td, th {{ border-bottom: 1px solid #ddd; padding: 3px 10px; text-align: right }}
td:first-child, th:first-child {{ text-align: left }}
figure {{ margin: 1em 0 }} figure svg {{ width: 100%; height: auto }}
.big {{ font-size: 1.3em }}
</style></head><body>
<h1>What these checkpoints cost</h1>
<p>{e(rep['store'])} &mdash; {e(rep['root'])}: {len(rep['checkpoints'])} checkpoints</p>
<p class="big">{_gib(rep['logical'])} logical, {_gib(rep['stored'])} stored:
<b>{100 * rep['saving']:.1f}% saved</b></p>
{''.join(svgs)}
<h2>Per checkpoint</h2>
<table><tr><th>checkpoint</th><th>files</th><th>logical</th><th>stored</th><th>stored %</th>
<th>as deltas</th><th>chain depth</th></tr>{rows}</table>
<h2>Largest tensors of the newest checkpoint</h2>
<table><tr><th>tensor</th><th>dtype</th><th>family</th><th>logical</th><th>stored</th>
<th>stored bytes by plane</th></tr>{trows}</table>
</body></html>
"""
