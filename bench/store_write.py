"""How fast a local store takes a save's packs, by write pattern (the disk under it).

A save through the Python API ends by writing its packs: each pack a temporary file,
written, fsync'ed and renamed (``LocalStore.put_parts``), several at a time. This writes
``--gib`` GiB of random bytes (incompressible, as coded blobs are) through that same
store under ``--dir`` for several pack sizes and numbers of writers, and, for
comparison, the way ``torch.save`` + ``os.sync()`` does it: one file, no fsync, one sync
of everything at the end; and two patterns s4fs does not use, to see what the disk has
left: one sync at the end instead of an fsync per pack, and O_DIRECT writes.

    python bench/store_write.py [--dir /tmp] [--gib 1.4] [--packs 32,128] [--writers 1,4,8,16]

This is the disk-alone floor under every save to a local store; bench/gpu_save.py
measures it beside each save with ``_packs`` from here.
"""

from __future__ import annotations

import argparse
import mmap
import os
import shutil
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor

MiB = 1 << 20


def _packs(folder: str, buf: memoryview, pack: int, writers: int, fsync: bool) -> float:
    """Packs as s4fs's local store writes them (``LocalStore.put_parts``: a temporary
    file, written, fsync'ed, renamed), or, ``fsync=False``, plain files and one sync."""
    from s4fs import keys
    from s4fs.stores.local import LocalStore
    store = LocalStore(folder)

    def put(k: int) -> None:
        data = buf[k * pack: (k + 1) * pack]
        if fsync:
            store.put_parts(keys.new_pack_key(), [data])
        else:
            with open(os.path.join(folder, f"pack-{k}"), "wb") as f:
                f.write(data)

    t0 = time.perf_counter()
    with ThreadPoolExecutor(writers) as pool:
        list(pool.map(put, range(-(-len(buf) // pack))))
    if not fsync:
        os.sync()
    return time.perf_counter() - t0


def _direct(folder: str, buf: memoryview, pack: int, writers: int) -> float:
    """Packs written with O_DIRECT (no page cache; ``buf`` is page-aligned, packs are
    whole pages but the last), each fsync'ed: how far the disk goes past the page cache."""
    def put(k: int) -> None:
        data = buf[k * pack: (k + 1) * pack]
        whole = len(data) // 4096 * 4096
        path = os.path.join(folder, f"pack-{k}")
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_DIRECT, 0o644)
        try:
            done = 0
            while done < whole:
                done += os.write(fd, data[done: whole])
        finally:
            os.close(fd)
        with open(path, "r+b") as f:          # the tail (under a page) through the cache
            f.seek(whole)
            f.write(data[whole:])
            f.flush()
            os.fsync(f.fileno())

    t0 = time.perf_counter()
    with ThreadPoolExecutor(writers) as pool:
        list(pool.map(put, range(-(-len(buf) // pack))))
    return time.perf_counter() - t0


def _one_file(folder: str, buf: memoryview) -> float:
    t0 = time.perf_counter()
    with open(os.path.join(folder, "one"), "wb") as f:
        f.write(buf)
    os.sync()
    return time.perf_counter() - t0


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--dir", default=tempfile.gettempdir(),
                   help="folder on the disk to measure")
    p.add_argument("--gib", type=float, default=1.4, help="GiB written per pattern")
    p.add_argument("--packs", default="32,128", help="MiB per pack, comma-separated")
    p.add_argument("--writers", default="1,4,8,16",
                   help="packs written at once, comma-separated")
    p.add_argument("--repeat", type=int, default=3, help="runs per pattern (median)")
    args = p.parse_args(argv)
    n = int(args.gib * (1 << 30))
    area = mmap.mmap(-1, n)                  # page-aligned, for the O_DIRECT rows
    area[:] = os.urandom(n)
    buf = memoryview(area)
    rows = []

    def timed(label, fn):
        times = []
        for _ in range(args.repeat):
            folder = tempfile.mkdtemp(dir=args.dir, prefix="s4fs-store-write-")
            try:
                os.sync()
                times.append(fn(folder))
            finally:
                shutil.rmtree(folder, ignore_errors=True)
        times.sort()
        t = times[len(times) // 2]
        rows.append((label, t, n / t / 1e9))
        print(f"| {label} | {t:.3f} | {n / t / 1e9:.2f} |", flush=True)

    print(f"# {n / MiB:.0f} MiB of random bytes under {args.dir}; medians of {args.repeat}")
    print("| pattern | s | GB/s |\n|---|---:|---:|")
    timed("one file, then os.sync() (torch.save's way)", lambda d: _one_file(d, buf))
    for pack in (int(x) * MiB for x in args.packs.split(",")):
        for w in (int(x) for x in args.writers.split(",")):
            timed(f"{pack // MiB} MiB packs, {w} writers, fsync each",
                  lambda d, pack=pack, w=w: _packs(d, buf, pack, w, True))
        for w in sorted({4, max(int(x) for x in args.writers.split(","))}):
            timed(f"{pack // MiB} MiB packs, {w} writers, one os.sync() at the end",
                  lambda d, pack=pack, w=w: _packs(d, buf, pack, w, False))
            if hasattr(os, "O_DIRECT"):
                timed(f"{pack // MiB} MiB packs, {w} writers, O_DIRECT, fsync each",
                      lambda d, pack=pack, w=w: _direct(d, buf, pack, w))


if __name__ == "__main__":
    main()
