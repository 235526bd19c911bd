"""Delta benchmark on a GPU training series: a GPT trained on real text.

    python bench/delta_gpu.py [--steps 1000] [--every 200] [--gib 1.7]
    bash bench/gpu.sh delta        # the same, on the GPU machine

Byte-level GPT trained on the GPU on real English text (the prose s4fs's tests fine-tune
on, plus this repository's own documentation): with ``--gib`` the GPT of
``bench/train_loop.py`` (fp32 weights + fp32 AdamW, about that many GiB a checkpoint),
without it a 6 x 512 one saved as mixed-precision trainers save it (bf16 weights + fp32
AdamW). Every ``--every`` steps the checkpoint goes into the stores of
``bench/delta.py`` side by side — backward deltas (the default), forward deltas with no
chain bound (what XOR alone gives), deltas off — and the same table is printed: the
bucket after gc, upload per save, blocked time, a fresh node's read of the newest and
the oldest version. ZipNN is not installable on the GPU machine (its column shows "-").
Runs on the CPU too (slowly) when there is no GPU.
"""

from __future__ import annotations

import argparse
import glob
import io
import os
import shutil
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


def corpus() -> bytes:
    from _minilm import PROSE
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
          layers=6, gib: float | None = None):
    """Yields (step, loss, checkpoint bytes) every ``every`` steps: with ``gib`` the
    train-loop GPT's fp32 state, else bf16 weights and fp32 AdamW."""
    import torch
    import torch.nn.functional as F
    torch.manual_seed(seed)
    data = torch.tensor(list(corpus()), dtype=torch.long, device=device)
    model = (gpt_of_state(gib, ctx=ctx) if gib else
             gpt(ctx=ctx, width=width, layers=layers)).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4, weight_decay=0.1)
    g = torch.Generator(device="cpu").manual_seed(seed)
    weights = torch.float32 if gib else torch.bfloat16
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
            obj = {"model": {k: v.detach().to(weights).cpu()
                             for k, v in model.state_dict().items()},
                   "optimizer": {"state": {k: {n: t.cpu() if torch.is_tensor(t) else t
                                               for n, t in st.items()}
                                           for k, st in opt.state_dict()["state"].items()},
                                 "param_groups": opt.state_dict()["param_groups"]},
                   "step": step, "loss": loss.item()}
            b = io.BytesIO()
            torch.save(obj, b)
            yield step, loss.item(), b.getvalue()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=1000, help="training steps")
    ap.add_argument("--every", type=int, default=200, help="steps between saves")
    ap.add_argument("--gib", type=float, default=1.7,
                    help="the train-loop GPT of this state size (0: 6 x 512, bf16 weights)")
    ap.add_argument("--width", type=int, default=512, help="model width (--gib 0)")
    ap.add_argument("--layers", type=int, default=6, help="transformer layers (--gib 0)")
    ap.add_argument("--ctx", type=int, default=256, help="context length in bytes")
    args = ap.parse_args(argv)
    import torch

    from _common import machine, table
    from delta import FAMILY_HEADER, HEADER, run_series, summarize
    device = "cuda" if torch.cuda.is_available() else "cpu"
    gpu = torch.cuda.get_device_name() if device == "cuda" else "no GPU"
    work = tempfile.mkdtemp(prefix="s4fs-bench-dgpu-")

    def checkpoints():
        for step, loss, data in train(args.steps, args.every, device, ctx=args.ctx,
                                      width=args.width, layers=args.layers,
                                      gib=args.gib or None):
            print(f"  step {step} loss {loss:.3f}: {len(data) / 2**20:.0f} MiB", flush=True)
            yield step, data, None
    try:
        rows, totals = run_series(checkpoints(), work)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    label = f"GPT every {args.every}"
    row, fams = summarize(label, rows, totals)
    what = (f"the train-loop GPT ({args.gib} GiB: fp32 weights + AdamW)" if args.gib else
            f"GPT {args.layers}x{args.width}, bf16 weights + fp32 AdamW")
    print(f"# bench/delta_gpu.py — {gpu}; {machine()}; {what}, byte-level, {args.steps} "
          f"steps, AdamW lr 3e-4; {rows[0]['logical'] / 2**20:.0f} MiB a checkpoint")
    print("  per checkpoint stored % (backward / off): " + ", ".join(
        f"{r['step']}: {100 * r['backward'] / r['logical']:.1f}/"
        f"{100 * r['off'] / r['logical']:.1f}" for r in rows))
    print(table(HEADER, [row]))
    print(table(FAMILY_HEADER, fams))
    return 0


if __name__ == "__main__":
    sys.exit(main())
