"""A weight kept twice: stored bytes of mixed-precision checkpoints with pairs on and off.

Real data: all-MiniLM-L6-v2 fine-tuned ``--steps`` real AdamW steps (bench/_minilm.py);
its fp32 weights are the masters, their bf16 (or fp16) rounding the copy a
mixed-precision model computes with. Layouts, each one torch file:

* ``copy + masters + AdamW``: Megatron's legacy layout — ``{"model": copy,
  "optimizer": {"state": AdamW, "fp32_from_fp16_params": masters}}``;
* ``masters + AdamW``: the same without the copy (what the pair should cost);
* ``masters first``: the optimizer (masters and AdamW) saved before the copy: each copy
  is coded on its master;
* ``DCP shard``: the first two as torch DCP writes them (``dcp.save``, one process):
  the items as torch files back to back in one ``.distcp`` file.

Per layout: s4fs stored MiB with pairs on and off, through the mount's coding path
(worker processes fed from a spool; no FUSE) and the API's (threads); ZipNN 0.5 per
tensor and zstd -3 on the file beside them; save seconds and a fresh node's read seconds
through the mount's path (median of ``--repeat`` rounds, pairs on and off interleaved). Every file is read back and compared byte for byte.

    python bench/mixed.py [--steps 20] [--repeat 3] [--work DIR]
"""

from __future__ import annotations

import argparse
import io
import os
import shutil
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from _common import machine, table  # noqa: E402

MiB = 1 << 20


def layouts(steps: int) -> dict[str, bytes]:
    import torch
    from _minilm import finetune
    *_, (_, model, opt) = finetune(steps)
    masters = [v for v in model.values() if v.dtype == torch.float32]
    optim = {"state": opt["state"], "param_groups": opt["param_groups"],
             "fp32_from_fp16_params": masters}

    def save(obj) -> bytes:
        b = io.BytesIO()
        torch.save(obj, b)
        return b.getvalue()
    bf16 = {k: v.to(torch.bfloat16) for k, v in model.items()}
    fp16 = {k: v.to(torch.float16) for k, v in model.items()}
    def shard(obj) -> bytes:
        """The one ``.distcp`` shard torch DCP writes of ``obj`` (one process)."""
        import warnings
        import torch.distributed.checkpoint as dcp
        with tempfile.TemporaryDirectory() as d, warnings.catch_warnings():
            warnings.simplefilter("ignore")
            dcp.save(obj, checkpoint_id=d)
            with open(os.path.join(d, "__0_0.distcp"), "rb") as f:
                return f.read()
    return {
        "bf16 copy + masters + AdamW": save({"model": bf16, "optimizer": optim}),
        "fp16 copy + masters + AdamW": save({"model": fp16, "optimizer": optim}),
        "masters + AdamW (no copy)": save({"optimizer": optim}),
        "masters first, then bf16 copy": save({"optimizer": optim, "model": bf16}),
        "DCP shard: bf16 copy + masters + AdamW": shard({"model": bf16, "optimizer": optim}),
        "DCP shard: masters + AdamW (no copy)": shard({"optimizer": optim}),
    }


def s4fs_row(data: bytes, work: str, repeat: int, *, processes: bool,
             pairs: bool) -> tuple[int, float, float]:
    """(stored bytes, median save s, median fresh-node read s)."""
    from s4fs.coding import IngestConfig
    from s4fs.fs import Filesystem, FsConfig
    from s4fs.stores import LocalStore
    saves, reads, stored = [], [], 0
    for k in range(repeat):
        root = tempfile.mkdtemp(dir=work)
        cfg = IngestConfig(processes=processes, pairs=pairs)
        fs = Filesystem(LocalStore(os.path.join(root, "store")),
                        FsConfig(ingest=cfg, cache_dir=os.path.join(root, "cache")))
        try:
            t0 = time.perf_counter()
            h = fs.open_write("ckpt.pt")
            for i in range(0, len(data), MiB):
                h.write(i, data[i:i + MiB])
            h.flush()
            h.release()
            saves.append(time.perf_counter() - t0)
            stored = fs.manifest("ckpt.pt").stored_bytes()
        finally:
            fs.close()
        cold = Filesystem(LocalStore(os.path.join(root, "store")),
                          FsConfig(ingest=cfg, cache_dir=os.path.join(root, "fresh")))
        try:
            t0 = time.perf_counter()
            r = cold.open_read("ckpt.pt")
            got = r.read(0, len(data) + 1)
            r.release()
            reads.append(time.perf_counter() - t0)
        finally:
            cold.close()
        shutil.rmtree(root, ignore_errors=True)
        if bytes(got) != data:
            raise SystemExit("s4fs: the bytes read back differ")
    return stored, statistics.median(saves), statistics.median(reads)


def archives(data: bytes) -> list[bytes]:
    """The torch files of ``data``: itself, or a DCP shard's items (torch files back to
    back, each ending with a zip end record: 22 bytes and its comment)."""
    import torch
    out, start, pos = [], 0, 0
    while (pos := data.find(b"PK\x05\x06", pos)) >= 0:
        end = pos + 22 + int.from_bytes(data[pos + 20: pos + 22], "little")
        try:                            # a tensor's bytes may hold the marker too
            torch.load(io.BytesIO(data[start:end]), weights_only=False)
        except Exception:               # noqa: BLE001 - not an archive's end
            pos += 4
            continue
        out.append(data[start:end])
        start = pos = end
    return out


def zipnn_per_tensor(data: bytes) -> int | None:
    """ZipNN on every storage of the file with its dtype, the rest with zstd -3."""
    try:
        from zipnn import ZipNN
    except ImportError:
        return None
    import torch
    import zstandard
    sd = [torch.load(io.BytesIO(a), weights_only=False) for a in archives(data)]
    total, seen = 0, set()
    coders: dict = {}

    def walk(o):
        nonlocal total
        if isinstance(o, torch.Tensor):
            st = o.untyped_storage()
            if st.data_ptr() in seen:
                return
            seen.add(st.data_ptr())
            name = str(o.dtype).replace("torch.", "")
            # the storage's bytes (ZipNN overwrites its input: a copy of its own)
            raw = bytearray(torch.empty(0, dtype=torch.uint8).set_(st).numpy().tobytes())
            if name in ("float32", "bfloat16", "float16"):
                z = coders.get(name) or coders.setdefault(
                    name, ZipNN(input_format="byte", bytearray_dtype=name))
                total += len(z.compress(raw))
            else:
                total += len(zstandard.compress(bytes(raw), 3))
        elif isinstance(o, dict):
            for v in o.values():
                walk(v)
        elif isinstance(o, (list, tuple)):
            for v in o:
                walk(v)
    walk(sd)
    return total


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=20, help="real AdamW steps of MiniLM")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--work", help="scratch folder (default: a temp dir)")
    a = ap.parse_args()
    work = tempfile.mkdtemp(prefix="s4fs-mixed-", dir=a.work)
    try:
        rows = _rows(a, work)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(f"# bench/mixed.py --steps {a.steps} --repeat {a.repeat}; {machine()}")
    print(table(["file (MiniLM + AdamW)", "MiB", "stored MiB, pairs on (processes)",
                 "pairs off (processes)", "pairs on (threads)", "pairs off (threads)",
                 "ZipNN per tensor MiB", "zstd -3 MiB", "save s on / off (processes)",
                 "fresh read s on / off (processes)"], rows))


def _rows(a, work: str) -> list[list[str]]:
    import zstandard
    files = layouts(a.steps)
    rows = []
    for name, data in files.items():
        cells = [name, f"{len(data) / MiB:.1f}"]
        timing = []
        for processes in (True, False):
            # rounds interleaved, on then off: the machine's drift hits both alike
            runs = {True: [], False: []}
            for _ in range(a.repeat if processes else 1):
                for pairs in (True, False):
                    runs[pairs].append(s4fs_row(data, work, 1, processes=processes,
                                                pairs=pairs))
            on, off = ((r[0][0], statistics.median(x[1] for x in r),
                        statistics.median(x[2] for x in r)) for r in runs.values())
            cells += [f"{on[0] / MiB:.1f}", f"{off[0] / MiB:.1f}"]
            timing.append((on, off))
        z = zipnn_per_tensor(data)
        cells += [f"{z / MiB:.1f}" if z else "-",
                  f"{len(zstandard.compress(data, 3)) / MiB:.1f}"]
        (pon, poff), _ = timing
        cells += [f"{pon[1]:.2f} / {poff[1]:.2f}", f"{pon[2]:.2f} / {poff[2]:.2f}"]
        rows.append(cells)
    return rows


if __name__ == "__main__":
    main()
