"""Decode ahead, alone: how fast a node that never saw a file gets it back.

    python bench/fill.py [--gib 0.5] [--repeat 3] [--devices cpu[,cuda]]
                         [--gpu-fill-batch MiB] [--gpu-threads N]

A mount's first read of a cold file starts a fill (s4fs/fill.py): the version's chunks
are fetched, decoded and written into the decoded cache ahead of the reader, by the CPU
worker processes or by the GPU worker process. This bench takes the FUSE layer and
torch out of the way: per device it saves one checkpoint as the mount does (spool, then
worker processes), then, ``--repeat`` times, opens it as a fresh node would (an empty
cache dir, the page cache dropped when run as root) and reads it as ``torch.load``
does (the tail, then the whole file in 1 MiB reads), timing until the last byte.
The state is synthetic, shaped like a mixed-precision checkpoint: bf16 weights and
fp32 AdamW moments (10 bytes a parameter). Timings are printed, never asserted; the
bytes read back are checked.
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


def state_bytes(gib: float) -> bytes:
    import torch
    n = int(gib * (1 << 30) / 10)
    g = torch.Generator().manual_seed(0)
    sd, left, i = {}, n, 0
    while left > 0:
        k = min(left, 8 << 20)
        w = torch.randn(k, generator=g) * 0.02
        sd[f"layer{i}.weight"] = w.bfloat16()
        sd[f"layer{i}.exp_avg"] = torch.randn(k, generator=g) * 1e-4
        sd[f"layer{i}.exp_avg_sq"] = (torch.randn(k, generator=g) * 1e-4) ** 2
        left -= k
        i += 1
    buf = io.BytesIO()
    torch.save(sd, buf)
    return buf.getvalue()


def drop_caches() -> None:
    os.sync()
    try:
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("3\n")
    except OSError:
        pass


def save(fs, path: str, data: bytes) -> None:
    from s4fs.spool import Spool
    sp = Spool(fs.spool_dir, path)
    sp.write(0, data)
    s = fs.new_session(path, None, sp.name)
    pos = 0
    while pos < len(data):
        piece = sp.read(pos, 1 << 20)
        s.write(piece, stable=True)
        pos += len(piece)
    fs.commit(path, s.finish())
    sp.close()


def read_as_torch_load(fs, path: str) -> tuple[bytes, bool]:
    """The file's bytes, read as torch.load reads, and whether a fill served them."""
    r = fs.open_read(path)
    try:
        size = r.size
        r.read(size - 22, 22)
        out = bytearray()
        while len(out) < size:
            out += r.read(len(out), 1 << 20)
        return bytes(out), r._fill is not None
    finally:
        r.release()


def run(device: str, data: bytes, work: str, repeat: int) -> dict:
    from s4fs import gpu_pool, workers
    from s4fs.fs import Filesystem, FsConfig
    from s4fs.ingest import IngestConfig
    from s4fs.stores import LocalStore
    ingest = IngestConfig(processes=True, device=device)
    store = os.path.join(work, f"store-{device}")

    def node(name: str):
        return Filesystem(LocalStore(store), FsConfig(ingest=ingest,
                                                      cache_dir=os.path.join(work, name)))
    fs = node("writer")
    try:
        t0 = time.perf_counter()
        save(fs, "ckpt.pt", data)
        saved = time.perf_counter() - t0
        stored = fs.manifest("ckpt.pt").stored_bytes()
    finally:
        fs.close()
    times, filled = [], True
    for k in range(repeat):
        cold = node(f"fresh{k}")
        try:
            drop_caches()
            t0 = time.perf_counter()
            got, ahead = read_as_torch_load(cold, "ckpt.pt")
            times.append(time.perf_counter() - t0)
            filled = filled and ahead
            if got != data:
                raise SystemExit(f"{device}: the bytes read back differ")
        finally:
            cold.close()
    gpu_pool.shutdown()
    workers.shutdown()
    return {"device": device, "stored": stored, "save": saved, "fresh": times,
            "filled": filled}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--gib", type=float, default=0.5)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--devices", help="default: cpu, and cuda where a GPU is usable")
    ap.add_argument("--gpu-fill-batch", type=int, help="MiB per GPU decode-ahead batch")
    ap.add_argument("--gpu-threads", type=int, help="threads of the GPU worker process")
    ap.add_argument("--work", help="scratch folder (default: a temp dir)")
    a = ap.parse_args()
    from s4fs import fill, gpu_pool
    from s4fs.codec import gpu_available
    devices = a.devices or ("cpu,cuda" if gpu_available() else "cpu")
    if a.gpu_fill_batch:
        fill.GPU_FILL_BATCH = a.gpu_fill_batch << 20
    if a.gpu_threads:
        gpu_pool.THREADS = a.gpu_threads
    data = state_bytes(a.gib)
    work = tempfile.mkdtemp(prefix="s4fs-fill-", dir=a.work)
    try:
        rows = [run(d, data, work, a.repeat) for d in devices.split(",")]
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(f"# bench/fill.py — {os.cpu_count()} cores; {len(data) / (1 << 30):.2f} GiB "
          f"synthetic bf16 weights + fp32 AdamW moments; GPU fill batches "
          f"{fill.GPU_FILL_BATCH >> 20} MiB, GPU worker threads {gpu_pool.THREADS}; "
          f"fresh node = empty cache dir, page cache dropped; median of {a.repeat}")
    print("| device | stored % | save s (no FUSE) | fresh-node read s | GB/s | runs | "
          "decoded ahead |")
    print("|---|---:|---:|---:|---:|---|---|")
    for r in rows:
        med = statistics.median(r["fresh"])
        print(f"| {r['device']} | {100 * r['stored'] / len(data):.1f} | {r['save']:.2f} | "
              f"{med:.2f} | {len(data) / med / 1e9:.2f} | "
              f"{', '.join(f'{t:.2f}' for t in r['fresh'])} | "
              f"{'yes' if r['filled'] else 'no'} |")


if __name__ == "__main__":
    main()
