"""Benchmark data built from real weights (all-MiniLM-L6-v2)."""

from __future__ import annotations

import torch


def mixed_state_dict(target_bytes: int = 1 << 30) -> dict[str, torch.Tensor]:
    """A state dict of about ``target_bytes``: the real MiniLM weights tiled, every other
    copy in bf16 (so about half the bytes are fp32, half bf16)."""
    import os
    if os.environ.get("S4FS_BENCH_WEIGHTS"):       # e.g. a subset carried to a GPU box
        from safetensors.torch import load_file
        weights = load_file(os.environ["S4FS_BENCH_WEIGHTS"])
    else:
        from _minilm import load_weights
        weights = load_weights()
    base = {k: v for k, v in weights.items() if v.is_floating_point()}
    out: dict[str, torch.Tensor] = {}
    total = 0
    copy = 0
    while total < target_bytes:
        dt = torch.float32 if copy % 2 == 0 else torch.bfloat16
        for k, v in base.items():
            t = v.to(dt).clone()
            out[f"copy{copy}.{k}"] = t
            total += t.numel() * t.element_size()
        copy += 1
    return out


def nbytes(obj) -> int:
    """Bytes of every tensor in a (nested) state dict."""
    if torch.is_tensor(obj):
        return obj.numel() * obj.element_size()
    if isinstance(obj, dict):
        return sum(nbytes(v) for v in obj.values())
    if isinstance(obj, (list, tuple)):
        return sum(nbytes(v) for v in obj)
    return 0
