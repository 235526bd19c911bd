"""Decode ahead, alone: how fast a node that never saw a file gets it back.

    python bench/fill.py [--gib 0.5] [--repeat 3] [--saves 1] [--devices cpu[,cuda]]
                         [--whole-too] [--source synthetic|minilm|gpt] [--every N]
                         [--max-chain-read X[,Y...]]
                         [--gpu-fill-batch MiB] [--gpu-threads N] [--work DIR]
    bash bench/gpu.sh fill         # --gib 0.6 --repeat 3 --saves 3, cpu and cuda

A mount's first read of a cold file starts a fill (s4fs/read/fill.py): the version's chunks
are fetched, decoded and written into the decoded cache ahead of the reader, by the CPU
worker processes or by the GPU worker process. This bench takes the FUSE layer and
torch out of the way: per device it saves one checkpoint as the mount does (spool, then
worker processes; with ``--saves N`` a series, the last version a delta chain as a
training run's is), then, ``--repeat`` times, opens it as a fresh node would (an empty
cache dir, the page cache dropped when run as root) and reads it as ``torch.load``
does (the tail, then the whole file in 1 MiB reads into buffers allocated once, as its
storages are), timing until the last byte. Per device a *decode alone* row gives the
floor of that read on this machine: the same batches decoded by the same pool into a
file, all submitted at once, with no reader.
The state is synthetic by default, shaped like a mixed-precision checkpoint: bf16
weights and fp32 AdamW moments (10 bytes a parameter), a tenth of the weights moved
between versions; ``--source minilm`` (all-MiniLM-L6-v2 fine-tuned here, fp32 weights
and AdamW state, replicas up to ``--gib``) or ``--source gpt`` (a byte-level GPT
trained here, bf16 weights + fp32 AdamW) give real consecutive checkpoints instead,
``--every`` optimizer steps apart, as bench/mount.py makes them. The peer is the local
disk: the same bytes as a plain file under ``--work``, read the same way after dropping
the page cache.
With ``--whole-too`` each device also stores the last version alone and whole, so a
delta chain's read compares with the same bytes without one; ``--max-chain-read``
(``IngestConfig.max_chain_read``, several values: one row each) bounds the chains.
"chain read %" is what a fresh node fetches for the last version (every blob of every
chunk's chain) against its logical size. Timings are printed, never asserted; the
bytes read back are checked.
"""

from __future__ import annotations

import argparse
import io
import mmap
import os
import shutil
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


def series_bytes(gib: float, saves: int) -> list[bytes]:
    """``saves`` consecutive checkpoints: each step moves a tenth of the weights a
    little (so later versions are stored as deltas of earlier ones, as in a training
    run) and redraws the moments (which deltas do not help)."""
    import torch
    n = int(gib * (1 << 30) / 10)
    g = torch.Generator().manual_seed(0)
    weights, i, left = {}, 0, n
    while left > 0:
        k = min(left, 8 << 20)
        weights[f"layer{i}.weight"] = torch.randn(k, generator=g) * 0.02
        left -= k
        i += 1
    out = []
    for _ in range(saves):
        sd = {}
        for name, w in weights.items():
            sd[name] = w.bfloat16()
            sd[name.replace("weight", "exp_avg")] = torch.randn(w.numel(), generator=g) * 1e-4
            sd[name.replace("weight", "exp_avg_sq")] = \
                (torch.randn(w.numel(), generator=g) * 1e-4) ** 2
        buf = io.BytesIO()
        torch.save(sd, buf)
        out.append(buf.getvalue())
        for w in weights.values():
            w[:: 10] += torch.randn(w[:: 10].numel(), generator=g) * 1e-3
    return out


def series_real(source: str, gib: float, saves: int, every: int) -> list[bytes]:
    """``saves`` consecutive checkpoints of a real training run, as torch.save writes
    them (bench/mount.py's series)."""
    import torch
    import mount
    states = (mount.series_gpt if source == "gpt" else mount.series)(gib, saves, every)
    out = []
    for sd in states:
        buf = io.BytesIO()
        torch.save(sd, buf)
        out.append(buf.getvalue())
    return out


def drop_caches() -> None:
    os.sync()
    try:
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("3\n")
    except OSError:
        pass


def save(fs, path: str, data: bytes) -> None:
    """As the mount saves: the file's write handle (spool, the worker processes coding
    its prefix, delta against the previous version), committed at release."""
    h = fs.open_write(path)
    h.write(0, data)
    h.flush()
    h.release()


def read_as_torch_load(fs, path: str) -> tuple[bytes, bool, float, float]:
    """The file's bytes, read as torch.load reads (the tail, then from the start into
    buffers allocated once: its storages), whether a fill served them, and the seconds
    until the open returned and until the tail (the zip directory) was read."""
    t0 = time.perf_counter()
    r = fs.open_read(path)
    opened = time.perf_counter() - t0
    try:
        size = r.size
        r.read(size - 22, 22)
        tail = time.perf_counter() - t0
        out = mmap.mmap(-1, size)          # pages come as they are first written
        mv = memoryview(out)
        pos = 0
        while pos < size:
            n = r.readinto(pos, mv[pos: pos + (1 << 20)])
            if n <= 0:
                raise SystemExit(f"short read at {pos} of {size}")
            pos += n
        return out, r._fill is not None, opened, tail
    finally:
        r.release()


def read_whole_then_copy(fs, path: str) -> tuple[bytes, float, float]:
    """What a fresh node's open waits for under FUSE passthrough (s4fs.vfs: the open of
    a cold file waits for its whole decoded copy, checked, in the decoded cache), then
    the kernel's read of that copy from the page cache (1 MiB reads into buffers
    allocated once): the bytes, the seconds of each."""
    t0 = time.perf_counter()
    r = fs.open_read(path)
    try:
        if not r.decode_whole():
            raise SystemExit("the copy was not decoded whole ahead")
        waited = time.perf_counter() - t0
        m = r.manifest
    finally:
        r.release()
    t1 = time.perf_counter()
    with open(fs.decoded.path_of(m.id), "rb", buffering=0) as f:
        out = mmap.mmap(-1, m.size)
        mv = memoryview(out)
        pos = 0
        while pos < m.size:
            pos += f.readinto(mv[pos: pos + (1 << 20)])
    return out, waited, time.perf_counter() - t1


def local_disk(data: bytes, work: str, repeat: int) -> dict:
    """The peer: the same bytes in a local file, read cold as torch.load reads them."""
    path = os.path.join(work, "local.pt")
    t0 = time.perf_counter()
    with open(path, "wb") as f:
        f.write(data)
    os.sync()
    saved = time.perf_counter() - t0
    times = []
    for _ in range(repeat):
        drop_caches()
        t0 = time.perf_counter()
        with open(path, "rb", buffering=0) as f:
            f.seek(len(data) - 22)
            f.read(22)
            f.seek(0)
            out = mmap.mmap(-1, len(data))
            mv = memoryview(out)
            pos = 0
            while pos < len(data):
                pos += f.readinto(mv[pos: pos + (1 << 20)])
        times.append(time.perf_counter() - t0)
        if out[:] != data:
            raise SystemExit("local disk: the bytes read back differ")
    os.unlink(path)
    return {"device": "local disk (file + os.sync)", "stored": len(data),
            "fetched": len(data), "save": saved,
            "fresh": times, "filled": None, "depth": None, "open": None, "tail": None}


def decode_alone(fs, m, repeat: int) -> list[float]:
    """The floor of a fresh node's read on this machine: the file's batches decoded by
    the fill's pool into a file, every batch submitted at once, no reader (the stored
    bytes read from a cold page cache)."""
    import pickle
    from s4fs.coding import DecodeJob
    from s4fs.read.fill import plan
    cfg = fs.cfg.ingest
    pool = fs.pools.for_ingest(cfg)
    target = os.path.join(fs.cfg.cache_dir, "decode-alone")
    from s4fs.coding import mapped_copy
    spec = pickle.dumps(fs.store)
    batches = plan(m, cfg.batch_bytes)
    times = []
    try:
        for _ in range(repeat):
            # written as a fill writes its copy (a mapping in tmpfs, pwrite elsewhere)
            fd = os.open(target, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o600)
            os.ftruncate(fd, m.size)
            mapped = mapped_copy(fd, m.size)
            os.close(fd)
            drop_caches()
            t0 = time.perf_counter()
            futs = [pool.submit_decode(DecodeJob(spec, target, tuple(b), None, mapped))
                    for b in batches]
            for f in futs:
                f.result()
            times.append(time.perf_counter() - t0)
    finally:
        os.unlink(target)
    return times


def run(device: str, series: list[bytes], work: str, repeat: int, rt_cfg,
        whole: bool = False, chain: float | None = None, stages: bool = False) -> dict:
    """Save ``series`` on ``device`` and read its last version as fresh nodes do;
    ``whole``: only the last version, stored whole (no delta base), in its own store;
    ``chain``: the ingest's max_chain_read (None: its default)."""
    from s4fs.fs import Filesystem, FsConfig
    from s4fs.coding import IngestConfig
    from s4fs.manifest import stored_split
    from s4fs.runtime import Runtime
    from s4fs.stores import LocalStore
    ingest = IngestConfig(processes=True, device=device,
                          **({} if chain is None else {"max_chain_read": chain}))
    label = device + ("" if chain is None or whole else f", max_chain_read {chain:g}")
    store = os.path.join(work, f"store-{label}" + ("-whole" if whole else ""))
    rt = Runtime(rt_cfg)
    if whole:
        series = series[-1:]

    def node(name: str):
        return Filesystem(LocalStore(store), FsConfig(ingest=ingest, delta=not whole,
                                                      cache_dir=os.path.join(work, name)),
                          runtime=rt)
    fs = node("writer")
    data = series[-1]
    try:
        for version in series:
            t0 = time.perf_counter()
            save(fs, "ckpt.pt", version)
            saved = time.perf_counter() - t0
        m = fs.manifest("ckpt.pt")
        stored = m.stored_bytes()
        fetched = stored_split(m)["read_cold"]     # every blob of every chain, once
        depth = max((c.depth for st in m.streams for c in st.chunks), default=0)
    finally:
        fs.close()
    times, filled, opens, tails = [], True, [], []
    for k in range(repeat):
        cold = node(f"fresh{k}")
        try:
            drop_caches()
            t0 = time.perf_counter()
            got, ahead, opened, tail = read_as_torch_load(cold, "ckpt.pt")
            times.append(time.perf_counter() - t0)
            opens.append(opened)
            tails.append(tail)
            filled = filled and ahead
            if got[:] != data:
                raise SystemExit(f"{device}: the bytes read back differ")
        finally:
            cold.close()
    wholes, pages = [], []
    for k in range(repeat):
        cold = node(f"whole{k}")
        try:
            drop_caches()
            got, waited, paged = read_whole_then_copy(cold, "ckpt.pt")
            wholes.append(waited)
            pages.append(paged)
            if got[:] != data:
                raise SystemExit(f"{device}: the whole copy's bytes differ")
        finally:
            cold.close()
    cold = node("floor")
    try:
        floor = decode_alone(cold, m, repeat)
        if stages:
            import _fill_stages
            stages = _fill_stages.run(cold, m, repeat, drop_caches)
    finally:
        cold.close()
    rt.close()
    return {"stages": stages or None, "size": m.size, "floor": floor, "whole": wholes,
            "paged": pages, "device": label + (", stored whole" if whole else ""), "stored": stored,
            "fetched": fetched, "save": saved, "fresh": times, "filled": filled,
            "depth": depth,
            "open": statistics.median(opens), "tail": statistics.median(tails)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--gib", type=float, default=0.5, help="GiB of one checkpoint")
    ap.add_argument("--repeat", type=int, default=3, help="fresh-node reads (median)")
    ap.add_argument("--saves", type=int, default=1,
                    help="consecutive versions saved; the last (a delta chain) is read")
    ap.add_argument("--devices", help="default: cpu, and cuda where a GPU is usable")
    ap.add_argument("--whole-too", action="store_true",
                    help="per device, the same last version stored whole too (no delta "
                         "chain): what a chain's read compares with")
    ap.add_argument("--gpu-fill-batch", type=int, help="MiB per GPU decode-ahead batch")
    ap.add_argument("--gpu-threads", type=int, help="threads of the GPU worker process")
    ap.add_argument("--work", help="scratch folder (default: a temp dir)")
    ap.add_argument("--source", default="synthetic", choices=["synthetic", "minilm", "gpt"],
                    help="what the checkpoints hold (see above)")
    ap.add_argument("--max-chain-read", help="IngestConfig.max_chain_read, comma-separated "
                    "values: a row each (default: the config's default)")
    ap.add_argument("--every", type=int, default=5,
                    help="optimizer steps between two checkpoints of a real source")
    ap.add_argument("--stages", action="store_true",
                    help="per device, the decode ahead stage by stage on the CPU worker "
                         "processes (bench/_fill_stages.py): read the stored bytes, decode, "
                         "write the copy by pwrite or through a mapping")
    ap.add_argument("--verbose", action="store_true",
                    help="log each decode ahead (batches, seconds, the first batch's)")
    a = ap.parse_args()
    if a.verbose:
        import logging
        logging.basicConfig(level=logging.INFO, format="# %(name)s: %(message)s")
        logging.getLogger("s4fs.read.fill").setLevel(logging.INFO)
    from s4fs.coding import _gpu_pool as gpu_pool
    from s4fs.codec import gpu_available
    from s4fs.runtime import RuntimeConfig
    devices = a.devices or ("cpu,cuda" if gpu_available() else "cpu")
    rt_cfg = (RuntimeConfig(gpu_fill_batch=a.gpu_fill_batch << 20) if a.gpu_fill_batch
              else RuntimeConfig())
    if a.gpu_threads:
        gpu_pool.THREADS = a.gpu_threads
    series = (series_bytes(a.gib, a.saves) if a.source == "synthetic" else
              series_real(a.source, a.gib, a.saves, a.every))
    data = series[-1]
    work = tempfile.mkdtemp(prefix="s4fs-fill-", dir=a.work)
    try:
        rows = []
        chains = [float(x) for x in a.max_chain_read.split(",")] if a.max_chain_read \
            else [None]
        for d in devices.split(","):
            for chain in chains:
                rows.append(run(d, series, work, a.repeat, rt_cfg, chain=chain,
                                stages=a.stages and d == "cpu"))
            if a.whole_too:
                rows.append(run(d, series, work, a.repeat, rt_cfg, whole=True))
        rows.append(local_disk(data, work, a.repeat))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(f"# bench/fill.py — {os.cpu_count()} cores; {len(data) / (1 << 30):.2f} GiB "
          + ("synthetic bf16 weights + fp32 AdamW moments" if a.source == "synthetic" else
             f"{a.source} training checkpoints {a.every} steps apart")
          + f", version {a.saves} of a series; GPU fill batches "
          f"{rt_cfg.gpu_fill_batch >> 20} MiB, GPU worker threads {gpu_pool.THREADS}; "
          f"fresh node = empty cache dir, page cache dropped; median of {a.repeat}")
    print("| device | stored % (last version) | chain read % | delta depth | "
          "last save s (no FUSE) | "
          "fresh-node read s | ÷ local disk | ÷ its floor | GB/s | runs | open s | tail read s "
          "| decoded ahead |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---|---:|---:|---|")
    for r in list(rows):
        if r.get("floor"):
            rows.insert(rows.index(r) + 1, {
                "device": f"{r['device']}: decode alone, no reader (the floor)",
                "stored": r["stored"], "fetched": r["fetched"], "save": r["save"],
                "fresh": r["floor"], "filled": None, "depth": r["depth"], "open": None,
                "tail": None})
    disk = statistics.median(rows[-1]["fresh"])
    for r in rows:
        med = statistics.median(r["fresh"])
        depth = "-" if r["depth"] is None else r["depth"]
        print(f"| {r['device']} | {100 * r['stored'] / len(data):.1f} | "
              f"{100 * r['fetched'] / len(data):.1f} | {depth} | "
              f"{r['save']:.2f} | "
              f"{med:.2f} | {med / disk:.2f}x | "
              + (f"{med / statistics.median(r['floor']):.2f}x | " if r.get("floor") else "- | ")
              + f"{len(data) / med / 1e9:.2f} | "
              f"{', '.join(f'{t:.2f}' for t in r['fresh'])} | "
              + ("- | - | " if r["open"] is None else f"{r['open']:.3f} | {r['tail']:.3f} | ")
              + f"{'-' if r['filled'] is None else 'yes' if r['filled'] else 'no'} |")
    print("\n# under FUSE passthrough a fresh node's open waits for the whole copy "
          "(decoded, checked, kept), then the kernel reads it from the page cache; "
          f"median of {a.repeat}")
    print("| device | whole copy s (the open waits) | ÷ decode alone | then page-cache "
          "read s | sum | ÷ local disk | runs (whole) |")
    print("|---|---:|---:|---:|---:|---:|---|")
    for r in rows:
        if r.get("whole"):
            w, p = statistics.median(r["whole"]), statistics.median(r["paged"])
            print(f"| {r['device']} | {w:.2f} | {w / statistics.median(r['floor']):.2f}x | "
                  f"{p:.2f} | {w + p:.2f} | {(w + p) / disk:.2f}x | "
                  f"{', '.join(f'{t:.2f}' for t in r['whole'])} |")
    for r in rows:
        if r.get("stages"):
            print_stages(r, disk, a.work or tempfile.gettempdir())


def print_stages(r: dict, disk: float, work: str) -> None:
    """The stage table of one device's row (bench/_fill_stages.py)."""
    st = r["stages"]
    print(f"\n# decode ahead stage by stage, {st[0]['workers']} CPU worker processes, all "
          f"batches at once, page cache dropped; store and copy under {work}; "
          f"median of {len(st[0]['times'])}; 'busy' = seconds summed over the workers")
    print("| stage | s | GB/s (logical) | ÷ read (the floor) | ÷ local disk read | busy s | runs |")
    print("|---|---:|---:|---:|---:|---:|---|")
    floor = statistics.median(st[0]["times"])
    for s in st:
        med = statistics.median(s["times"])
        print(f"| {s['stage']} | {med:.3f} | {r['size'] / med / 1e9:.2f} | "
              f"{med / floor:.2f}x | {med / disk:.2f}x | "
              f"{statistics.median(s['busy']):.2f} | "
              f"{', '.join(f'{t:.3f}' for t in s['times'])} |")


if __name__ == "__main__":
    main()
