"""Delta benchmark on a GPU training series: a small GPT trained on real text.

    python bench/delta_gpu.py [--steps 300] [--every 30] [--spaced 150]
    bash bench/gpu.sh delta        # the same, on the GPU machine

ZipNN, where installed, is the peer for stored size (bench/delta.py prints it; it was
not installable on the H200 box).

Byte-level GPT (6 layers, width 512, context 256) trained on the GPU on real English
text (the prose s4fs's tests fine-tune on, plus this repository's own documentation),
fp32 master weights and fp32 AdamW state, checkpoints saved as mixed-precision trainers
save them: ``{"model": bf16 weights, "optimizer": fp32 AdamW state}``. Each checkpoint is
stored with deltas (default) and full-only; the table gives stored % per tensor family
(weights, exp_avg, exp_avg_sq) for frequent saves (``--every``) and widely spaced ones
(``--spaced``). Runs on the CPU too (slowly) when there is no GPU.
"""

from __future__ import annotations

import argparse
import glob
import io
import os
import shutil
import statistics
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


def corpus() -> bytes:
    from s4fs.testing.minilm import PROSE
    root = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
    parts = [PROSE]
    for p in sorted(glob.glob(os.path.join(root, "docs", "*.md"))) + [os.path.join(root, "README.md")]:
        with open(p, encoding="utf-8") as f:
            parts.append(f.read())
    return "\n".join(parts).encode()


def gpt(vocab=256, width=512, layers=6, heads=8, ctx=256):
    import torch
    from torch import nn

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.ln1 = nn.LayerNorm(width)
            self.attn = nn.MultiheadAttention(width, heads, batch_first=True)
            self.ln2 = nn.LayerNorm(width)
            self.mlp = nn.Sequential(nn.Linear(width, 4 * width), nn.GELU(),
                                     nn.Linear(4 * width, width))

        def forward(self, x, mask):
            h = self.ln1(x)
            x = x + self.attn(h, h, h, attn_mask=mask, need_weights=False)[0]
            return x + self.mlp(self.ln2(x))

    class GPT(nn.Module):
        def __init__(self):
            super().__init__()
            self.tok = nn.Embedding(vocab, width)
            self.pos = nn.Embedding(ctx, width)
            self.blocks = nn.ModuleList(Block() for _ in range(layers))
            self.ln = nn.LayerNorm(width)
            self.head = nn.Linear(width, vocab, bias=False)

        def forward(self, idx):
            n = idx.shape[1]
            mask = torch.triu(torch.full((n, n), float("-inf"), device=idx.device), 1)
            x = self.tok(idx) + self.pos(torch.arange(n, device=idx.device))
            for b in self.blocks:
                x = b(x, mask)
            return self.head(self.ln(x))

    return GPT()


def gpt_of_state(gib: float, ctx: int = 256):
    """The GPT whose fp32 weights and two fp32 AdamW moments (12 bytes a parameter,
    ~12 w^2 parameters a layer) come to about ``gib`` GiB."""
    width = 1024 if gib >= 0.5 else 256
    layers = max(1, round(gib * (1 << 30) / 12 / (12 * width * width)))
    return gpt(ctx=ctx, width=width, layers=layers)


def train(steps: int, every: int, device: str, ctx=256, batch=32, seed=0, width=512,
          layers=6):
    """Yields (step, checkpoint bytes) every ``every`` steps."""
    import torch
    import torch.nn.functional as F
    torch.manual_seed(seed)
    data = torch.tensor(list(corpus()), dtype=torch.long, device=device)
    model = gpt(ctx=ctx, width=width, layers=layers).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4, weight_decay=0.1)
    g = torch.Generator(device="cpu").manual_seed(seed)
    for step in range(1, steps + 1):
        ix = torch.randint(0, len(data) - ctx - 1, (batch,), generator=g).to(device)
        x = torch.stack([data[i:i + ctx] for i in ix])
        y = torch.stack([data[i + 1:i + ctx + 1] for i in ix])
        with torch.autocast(device_type="cuda" if device == "cuda" else "cpu",
                            dtype=torch.bfloat16):
            loss = F.cross_entropy(model(x).float().view(-1, 256), y.view(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        if step % every == 0:
            obj = {"model": {k: v.detach().to(torch.bfloat16).cpu()
                             for k, v in model.state_dict().items()},
                   "optimizer": {"state": {k: {n: t.cpu() if torch.is_tensor(t) else t
                                               for n, t in st.items()}
                                           for k, st in opt.state_dict()["state"].items()},
                                 "param_groups": opt.state_dict()["param_groups"]},
                   "step": step, "loss": float(loss)}
            b = io.BytesIO()
            torch.save(obj, b)
            yield step, float(loss), b.getvalue()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=300, help="training steps")
    ap.add_argument("--every", type=int, default=30, help="steps between frequent saves")
    ap.add_argument("--spaced", type=int, default=150, help="steps between spaced saves")
    ap.add_argument("--width", type=int, default=512, help="model width")
    ap.add_argument("--layers", type=int, default=6, help="transformer layers")
    ap.add_argument("--ctx", type=int, default=256, help="context length in bytes")
    args = ap.parse_args(argv)
    import torch

    from _common import machine, table
    from delta import FAMILIES, per_family
    from s4fs.fs import Filesystem, FsConfig
    from s4fs.stores import LocalStore
    device = "cuda" if torch.cuda.is_available() else "cpu"
    gpu = torch.cuda.get_device_name() if device == "cuda" else "no GPU"
    work = tempfile.mkdtemp(prefix="s4fs-bench-dgpu-")
    fss = {"delta": Filesystem(LocalStore(os.path.join(work, "d")), FsConfig()),
           "full": Filesystem(LocalStore(os.path.join(work, "f")), FsConfig(delta=False)),
           "spaced": Filesystem(LocalStore(os.path.join(work, "s")), FsConfig())}
    rows = {"delta": [], "full": [], "spaced": []}
    try:
        for step, loss, data in train(args.steps, args.every, device, ctx=args.ctx,
                                      width=args.width, layers=args.layers):
            targets = ["delta", "full"] + (["spaced"] if step % args.spaced == 0 else [])
            for tag in targets:
                fs = fss[tag]
                h = fs.open_write(f"ckpt_{step}.pt")
                h.write(0, data)
                h.flush()
                h.release()
                m = fs.manifest(f"ckpt_{step}.pt")
                rows[tag].append((step, len(data), m.stored_bytes(), per_family(m)))
            print(f"  step {step} loss {loss:.3f}: full {100 * rows['full'][-1][2] / len(data):.1f} %"
                  f", delta {100 * rows['delta'][-1][2] / len(data):.1f} %", flush=True)
    finally:
        for fs in fss.values():
            fs.close()
        shutil.rmtree(work, ignore_errors=True)
    med = statistics.median
    out = []
    for tag, label in (("full", f"full-only, every {args.every}"),
                       ("delta", f"delta, every {args.every}"),
                       ("spaced", f"delta, every {args.spaced}")):
        later = rows[tag][1:] or rows[tag]
        cells = [label, str(len(rows[tag])),
                 f"{100 * med([r[2] / r[1] for r in later]):.1f}"]
        for f in FAMILIES:
            vals = [r[3][1][f] / r[3][0][f] for r in later if r[3][0][f]]
            cells.append(f"{100 * med(vals):.1f}" if vals else "-")
        out.append(cells)
    print(f"# bench/delta_gpu.py — {gpu}; {machine()}; GPT {args.layers}x{args.width} byte-level, {args.steps} "
          f"steps, AdamW lr 3e-4; bf16 weights + fp32 AdamW state per checkpoint "
          f"({rows['full'][0][1] / 2**20:.0f} MiB)")
    print(table(["series", "ckpts", "stored % (median after the first)", "weights %",
                 "exp_avg %", "exp_avg_sq %"], out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
