"""Where a decode ahead's time goes, stage by stage (bench/fill.py --stages).

Each stage runs the version's batches (s4fs.read.fill.plan) on worker processes, all
submitted at once, from a cold page cache, and adds one step to the one before:

* ``read``         the stored bytes of each batch read from the store (the floor: what
                   the disk, or tmpfs, gives);
* ``+ decode``     and every chunk decoded and checked (to memory, thrown away);
* ``+ copy pwrite``and written at its file offsets with ``pwrite`` into a sparse
                   copy (what a fill does on a disk file system);
* ``, reserved``   the copy's blocks allocated first (``fallocate``: s4fs.coding's
                   ``_reserve``, which a copy in tmpfs gets), written by ``pwrite`` or
                   through a shared mapping (``Copy``);
* ``write only``   16 MiB of constant bytes per batch written into the copy, the same
                   three ways: what writing one file from many processes costs alone.

The functions below run in the workers; they reach the product's own pieces
(``ChunkSource``, ``Copy``) so that each stage is the code a fill runs, less the rest.
"""

from __future__ import annotations

import os
import time

_BUF: dict[int, bytes] = {}


def _source(spec: bytes):
    from s4fs.coding._worker import source_for
    return source_for(spec, "cpu")


def stage(kind: str, spec: bytes, target: str, items: tuple) -> float:
    """Run one batch through ``kind``; seconds spent in the worker."""
    from s4fs.coding._worker import Copy
    t0 = time.perf_counter()
    refs = [ref for ref, _ in items]
    mapped = "mapped" in kind
    if kind.startswith("write only"):
        n = max(ref.raw for ref in refs)
        buf = _BUF.get(n) or _BUF.setdefault(n, b"\x5a" * n)
        with Copy(target, mapped) as c:
            for ref, pieces in items:
                for coff, foff, n in pieces:
                    c.place(memoryview(buf)[coff: coff + n], foff)
        return time.perf_counter() - t0
    src = _source(spec)
    with src.preloaded(refs):
        if kind == "read":
            return time.perf_counter() - t0
        datas = [(src.get(ref), pieces) for ref, pieces in items]
        if kind == "+ decode":
            return time.perf_counter() - t0
        with Copy(target, mapped) as c:
            for data, pieces in datas:
                for coff, foff, n in pieces:
                    c.place(memoryview(data)[coff: coff + n], foff)
    return time.perf_counter() - t0


def _started(_) -> int:
    import s4fs.chunks  # noqa: F401 - what a stage needs, loaded before the clock
    time.sleep(0.01)
    return os.getpid()


STAGES = ("read", "+ decode", "+ copy pwrite", "+ copy pwrite, reserved",
          "+ copy mapped, reserved", "write only pwrite", "write only pwrite, reserved",
          "write only mapped, reserved")


def run(fs, m, repeat: int, drop_caches, workers: int | None = None) -> list[dict]:
    """Each stage over version ``m`` of filesystem ``fs``'s store, ``repeat`` times;
    rows of (stage, seconds per run)."""
    import pickle
    from concurrent.futures import ProcessPoolExecutor
    import multiprocessing
    from s4fs.coding._worker import _reserve
    from s4fs.read.fill import plan
    cfg = fs.cfg.ingest
    spec = pickle.dumps(fs.store)
    batches = plan(m, cfg.batch_bytes)
    target = os.path.join(fs.cfg.cache_dir, "stages-copy")
    n = workers or cfg.workers
    rows = []
    with ProcessPoolExecutor(n, mp_context=multiprocessing.get_context("spawn")) as ex:
        list(ex.map(_started, range(4 * n)))               # every worker started
        for kind in STAGES:
            times, busy = [], []
            for _ in range(repeat):
                if os.path.exists(target):
                    os.unlink(target)
                fd = os.open(target, os.O_RDWR | os.O_CREAT, 0o600)
                os.ftruncate(fd, m.size)
                if "reserved" in kind and not _reserve(fd, m.size):
                    raise SystemExit(f"{target}: fallocate is not supported there")
                os.close(fd)
                drop_caches()
                t0 = time.perf_counter()
                futs = [ex.submit(stage, kind, spec, target, tuple(b)) for b in batches]
                busy.append(sum(f.result() for f in futs))
                times.append(time.perf_counter() - t0)
            rows.append({"stage": kind, "times": times, "busy": busy, "workers": n})
    if os.path.exists(target):
        os.unlink(target)
    return rows
