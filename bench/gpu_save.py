"""Saving and loading GPU-resident training state: torch.save to local disk, DCP async_save,
s4fs.save, s4fs.async_save (blocked time and total), and the loads back onto the GPU.

The state is a byte-level GPT trained on the GPU here (real text: the repository's docs),
saved as mixed-precision trainers keep it on the device: bf16 weights + fp32 AdamW
moments, about ``--gib`` GiB. Every timing includes ``os.sync()`` where the file is
written, so each side pays for durable bytes; loads read files just written (page cache
warm on both sides). Medians of ``--repeat`` runs. Those repeated saves of one state go
to a store with deltas off: each stands for a run's first checkpoint. ``--series N``
then saves N checkpoints of the run going on, ``--between`` steps apart, with deltas on
the previous one (s4fs's default) and without, and loads each back onto the GPU.

    python bench/gpu_save.py [--gib 1.7] [--repeat 3] [--series 3] [--between 10]
                             [--timeline] [--work DIR]
    bash bench/gpu.sh save         # --repeat 2 --series 3, on the GPU machine

Beside each save it prints the disk's own time for the bytes that save stored (random
bytes written as the local store writes packs: bench/store_write.py's fastest pattern),
the floor no save to that disk can beat, and the same save into /dev/shm (no disk).
Needs a CUDA GPU; the store is a local directory under ``--work`` on the disk measured.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


class Trainer:
    """A byte-level GPT trained on the GPU (real text), its state as mixed-precision
    trainers save it: bf16 weights + fp32 AdamW moments."""

    def __init__(self, gib: float) -> None:
        import torch
        from delta_gpu import corpus, gpt
        width = 1024
        layers = max(1, round(gib * (1 << 30) / 10 / (12 * width * width)))
        torch.manual_seed(0)
        self.ctx, self.batch, self.steps, self.loss = 256, 16, 0, float("nan")
        self.data = torch.tensor(list(corpus()), dtype=torch.long, device="cuda")
        self.model = gpt(ctx=self.ctx, width=width, layers=layers).cuda()
        self.opt = torch.optim.AdamW(self.model.parameters(), lr=3e-4, weight_decay=0.1)
        self.g = torch.Generator(device="cpu").manual_seed(0)

    def train(self, steps: int) -> None:
        import torch
        import torch.nn.functional as F
        ctx, data = self.ctx, self.data
        for _ in range(steps):
            ix = torch.randint(0, len(data) - ctx - 1, (self.batch,), generator=self.g).cuda()
            x = torch.stack([data[i:i + ctx] for i in ix])
            y = torch.stack([data[i + 1:i + ctx + 1] for i in ix])
            with torch.autocast(device_type="cuda", dtype=torch.bfloat16):
                loss = F.cross_entropy(self.model(x).float().view(-1, 256), y.view(-1))
            self.opt.zero_grad(set_to_none=True)
            loss.backward()
            self.opt.step()
        self.steps += steps
        self.loss = float(loss.detach()) if steps else self.loss

    def state(self) -> dict:
        import torch
        sd = {"model": {k: v.detach().to(torch.bfloat16)
                        for k, v in self.model.state_dict().items()},
              "optimizer": self.opt.state_dict(), "step": self.steps}
        torch.cuda.synchronize()
        return sd


def timed(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--gib", type=float, default=1.7, help="GiB of training state")
    ap.add_argument("--steps", type=int, default=20, help="training steps before the saves")
    ap.add_argument("--repeat", type=int, default=3, help="timed runs per row (median)")
    ap.add_argument("--work", default=None, help="scratch folder (default: a temp dir)")
    ap.add_argument("--pack-mib", type=int, default=0,
                    help="the store's pack size in MiB (default: s4fs's)")
    ap.add_argument("--uploads", type=int, default=0,
                    help="packs written at once (default: s4fs's)")
    ap.add_argument("--first-batches", default=None,
                    help="MiB of a device save's first GPU batches, comma-separated "
                         "('' for none: every batch 1 GiB); default: s4fs's")
    ap.add_argument("--series", type=int, default=3,
                    help="then this many checkpoints of a run going on (--between steps "
                         "apart), saved with deltas on the previous one and without")
    ap.add_argument("--between", type=int, default=10,
                    help="training steps between the series' checkpoints")
    ap.add_argument("--timeline", action="store_true",
                    help="then one more s4fs.save, traced: its GPU batches, its pack writes "
                         "(how busy the disk was kept) and the main thread's profile; with "
                         "--series, one more delta save too (its base decoding traced)")
    args = ap.parse_args()
    import torch
    import torch.distributed.checkpoint as dcp
    import s4fs
    from _data import nbytes
    from s4fs.codec import gpu
    if not torch.cuda.is_available():
        sys.exit("needs a CUDA GPU")
    trainer = Trainer(args.gib)
    trainer.train(args.steps)
    sd, loss = trainer.state(), trainer.loss
    size = nbytes(sd)
    work = tempfile.mkdtemp(prefix="s4fs-gpusave-", dir=args.work)
    local, store, dcpdir = (os.path.join(work, d) for d in ("local", "store", "dcp"))
    for d in (local, store, dcpdir):
        os.makedirs(d)
    shm = None
    if os.path.isdir("/dev/shm") and shutil.disk_usage("/dev/shm").free > 8 * size:
        shm = tempfile.mkdtemp(prefix="s4fs-gpusave-", dir="/dev/shm")
        os.makedirs(os.path.join(shm, "store"))
    print(f"# GPU save/load: {torch.cuda.get_device_name()}, torch {torch.__version__}, "
          f"nvCOMP {gpu.nvcomp_version()}, {os.cpu_count()} CPU cores")
    print(f"# state: GPT trained {args.steps} steps on the GPU (loss {loss:.3f}), bf16 weights + "
          f"fp32 AdamW, {size / 2**30:.2f} GiB on the device; medians of {args.repeat}; "
          f"every save timing includes os.sync()")
    # the repeated saves of one state go to a store without deltas (each is a run's first
    # checkpoint: nothing to code against; with deltas the second copy would cost
    # nothing); the series below measures deltas on a run going on
    from s4fs.api import filesystem
    from s4fs.fs import FsConfig
    filesystem(store, FsConfig(decoded_cache_bytes=0, delta=False))
    if shm:
        filesystem(os.path.join(shm, "store"), FsConfig(decoded_cache_bytes=0, delta=False))
    if args.pack_mib or args.uploads:      # the store's write pattern, for this run
        import dataclasses
        from s4fs.api import close_all
        from s4fs.coding import IngestConfig
        ing = IngestConfig()
        ing = dataclasses.replace(ing, pack_size=(args.pack_mib << 20) or ing.pack_size,
                                  max_uploads=args.uploads or ing.max_uploads)
        close_all()
        for root in (store, os.path.join(shm, "store") if shm else None):
            if root:
                filesystem(root, FsConfig(decoded_cache_bytes=0, ingest=ing, delta=False))
        print(f"# packs of {ing.pack_size >> 20} MiB, {ing.max_uploads} written at once")
    from s4fs.torch.save import SaveConfig
    config = SaveConfig()
    if args.first_batches is not None:
        config = SaveConfig(gpu_first_batches=tuple(
            int(x) << 20 for x in args.first_batches.split(",") if x.strip()))
        print(f"# first GPU batches: {args.first_batches or 'none'} MiB")
    rows: dict[str, list[float]] = {}

    def add(name, t):
        rows.setdefault(name, []).append(t)

    # warm-up (CUDA context, kernels compiled, first pinned allocations): not timed
    s4fs.save(sd, os.path.join(store, "warm.pt"), config=config)
    s4fs.load(os.path.join(store, "warm.pt"), map_location="cuda")
    torch.save(sd, os.path.join(local, "warm.pt"))
    for r in range(args.repeat):
        name = f"ckpt_{r}.pt"
        lp, sp = os.path.join(local, name), os.path.join(store, name)
        add("torch.save (local disk)", timed(lambda: (torch.save(sd, lp), os.sync())))
        add("s4fs.save", timed(lambda: (s4fs.save(sd, sp, config=config), os.sync())))
        fs_, rel_ = s4fs.resolve(sp)
        add(FLOOR, disk_alone(work, fs_.manifest(rel_).stored_bytes()))
        if shm:
            add("torch.save to /dev/shm (no disk)",
                timed(lambda: torch.save(sd, os.path.join(shm, "t.pt"))))
            add("s4fs.save to a store in /dev/shm (no disk)",
                timed(lambda: s4fs.save(sd, os.path.join(shm, "store", name), config=config)))
        ap_ = os.path.join(store, f"async_{r}.pt")
        t0 = time.perf_counter()
        fut = s4fs.async_save(sd, ap_, config=config)
        add("s4fs.async_save: blocked", time.perf_counter() - t0)
        fut.result()
        os.sync()
        add("s4fs.async_save: total", time.perf_counter() - t0)
        dp = os.path.join(dcpdir, f"step_{r}")
        try:
            t0 = time.perf_counter()
            f2 = dcp.async_save(sd, checkpoint_id=dp)
            add("DCP async_save (local disk): blocked", time.perf_counter() - t0)
            f2.result()
            os.sync()
            add("DCP async_save (local disk): total", time.perf_counter() - t0)
        except Exception as exc:                    # noqa: BLE001 - reported, not fatal
            if r == 0:
                print(f"# DCP async_save failed: {type(exc).__name__}: {exc}")

        def tload():
            out = torch.load(lp, map_location="cpu")
            moved = _to_cuda(out)
            torch.cuda.synchronize()
            return moved
        add("torch.load + .cuda() (local disk)", timed(tload))
        add("torch.load(map_location='cuda') (local disk)",
            timed(lambda: (torch.load(lp, map_location="cuda"), torch.cuda.synchronize())))
        add("s4fs.load(map_location='cuda')",
            timed(lambda: (s4fs.load(sp, map_location="cuda"), torch.cuda.synchronize())))
    same = s4fs.read_bytes(os.path.join(store, "ckpt_0.pt")) == open(os.path.join(local, "ckpt_0.pt"), "rb").read()
    fs, rel = s4fs.resolve(os.path.join(store, "ckpt_0.pt"))
    m = fs.manifest(rel)
    back = s4fs.load(os.path.join(store, "ckpt_0.pt"), map_location="cuda")
    exact = all(torch.equal(back["model"][k].view(torch.uint8), v.view(torch.uint8))
                for k, v in sd["model"].items())
    ref_save = statistics.median(rows["torch.save (local disk)"])
    ref_load = statistics.median(rows["torch.load + .cuda() (local disk)"])
    print()
    print("| what | median s | × torch.save+sync | × torch.load+.cuda() |")
    print("|---|---:|---:|---:|")
    for k, v in rows.items():
        med = statistics.median(v)
        print(f"| {k} | {med:.3f} | {med / ref_save:.3f} | {med / ref_load:.3f} |")
    print()
    from s4fs.torch import save as torch_save
    for what, st in torch_save.last_stages.items():
        print(f"where the last s4fs.{what} went (s): " +
              ", ".join(f"{k} {v:.3f}" for k, v in st.items()))
    print(f"stored {m.stored_bytes() / 2**20:.1f} MiB of {m.size / 2**20:.1f} MiB "
          f"({100 * m.stored_bytes() / m.size:.1f} %); stored file == torch.save's file: {same}; "
          f"s4fs.load to cuda bit-exact: {exact}")
    floor = statistics.median(rows[FLOOR]) / ref_save
    print(f"the disk alone takes s4fs.save's stored bytes in {floor:.3f}x the time of "
          f"torch.save + sync: no save that stores them can take less (goal <= 0.3x)")
    if args.series:
        series(trainer, work, local, args.series, args.between, config, args.timeline)
    if args.timeline:
        traced_save(sd, os.path.join(store, "traced.pt"), config)
    shutil.rmtree(work, ignore_errors=True)
    if shm:
        shutil.rmtree(shm, ignore_errors=True)


FLOOR = "the disk alone: s4fs.save's stored bytes written as its packs, no coding"
_RANDOM = None              # random bytes disk_alone writes, made once per run


def disk_alone(work: str, n: int) -> float:
    """Seconds for this disk to take ``n`` random bytes the fastest way a local store
    writes a save's packs (32 MiB packs, ``SaveConfig.uploads`` at once, each fsync'ed,
    then ``os.sync()``), under ``work``: the floor of any save that stores ``n`` bytes."""
    import mmap
    from store_write import _packs
    from s4fs.torch.save import SaveConfig
    global _RANDOM
    if _RANDOM is None or len(_RANDOM) < n:
        _RANDOM = mmap.mmap(-1, n + (64 << 20))
        _RANDOM[:] = os.urandom(len(_RANDOM))
    folder = tempfile.mkdtemp(dir=work, prefix="disk-alone-")
    try:
        os.sync()
        t0 = time.perf_counter()
        _packs(folder, memoryview(_RANDOM)[:n], 32 << 20, SaveConfig().uploads, True)
        os.sync()
        return time.perf_counter() - t0
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def series(trainer: Trainer, work: str, local: str, n: int, between: int, config,
           timeline: bool = False) -> None:
    """Checkpoints of a run going on, ``between`` steps apart: torch.save, s4fs.save with
    deltas on the previous checkpoint (the default), and s4fs.save without; each
    checkpoint loaded back onto the GPU, and the disk's time for each one's new bytes
    alone. ``timeline``: then one more delta save, traced."""
    import torch
    import s4fs
    from s4fs.torch import save as torch_save
    from s4fs.api import filesystem
    from s4fs.fs import FsConfig
    roots = {"delta": os.path.join(work, "series-delta"), "full": os.path.join(work, "series-full")}
    for k, root in roots.items():
        os.makedirs(root)
        filesystem(root, FsConfig(decoded_cache_bytes=0, delta=(k == "delta")))
    local = os.path.join(local, "series")        # torch.save's file names the archive
    os.makedirs(local)                           # after itself: same names as the store's
    t: dict[str, list[float]] = {}
    pct: dict[str, list[float]] = {}
    stages = {}
    for r in range(n):
        trainer.train(between if r else 0)
        sd = trainer.state()
        name = f"ckpt_{trainer.steps}.pt"
        lp = os.path.join(local, name)
        t.setdefault("torch.save (local disk)", []).append(
            timed(lambda: (torch.save(sd, lp), os.sync())))
        t.setdefault("torch.load + .cuda() (local disk)", []).append(
            timed(lambda: (_to_cuda(torch.load(lp, map_location="cpu")), torch.cuda.synchronize())))
        for k, root in roots.items():
            p = os.path.join(root, name)
            t.setdefault(f"s4fs.save, {k}", []).append(timed(lambda: (s4fs.save(sd, p, config=config), os.sync())))
            if k == "delta":
                stages = dict(torch_save.last_stages.get("save", {}))
            t.setdefault(f"s4fs.load(map_location='cuda'), {k}", []).append(
                timed(lambda: (s4fs.load(p, map_location="cuda"), torch.cuda.synchronize())))
            fs, rel = s4fs.resolve(p)
            m = fs.manifest(rel)
            pct.setdefault(k, []).append(100 * m.stored_bytes() / m.size)
            t.setdefault(f"the disk alone: the new bytes of s4fs.save, {k}", []).append(
                disk_alone(work, m.stored_bytes()))
        os.remove(lp)
        if r == n - 1:
            same = s4fs.read_bytes(os.path.join(roots["delta"], name)) == _torch_bytes(sd, lp)
            back = s4fs.load(os.path.join(roots["delta"], name), map_location="cuda")
            exact = all(torch.equal(back["model"][k].view(torch.uint8), v.view(torch.uint8))
                        for k, v in sd["model"].items())
    print(f"\n# a run going on: {n} checkpoints {between} steps apart (loss {trainer.loss:.3f}); "
          f"the first has no base; medians over the rest")
    def med(k):
        return statistics.median(t[k][1:] or t[k])
    print("| what | median s | × torch.save+sync | × torch.load+.cuda() | new bytes stored, % of the file |")
    print("|---|---:|---:|---:|---:|")
    for k in t:
        which = k.rsplit(", ", 1)[-1]
        saving = "save" in k
        p = f"{statistics.median(pct[which][1:] or pct[which]):.1f}" if saving and which in pct else ""
        ratio = med(k) / med("torch.save (local disk)" if saving else "torch.load + .cuda() (local disk)")
        print(f"| {k} | {med(k):.3f} | {f'{ratio:.3f}' if saving else ''} | "
              f"{'' if saving else f'{ratio:.3f}'} | {p} |")
    print("where the last delta save went (s): " +
          ", ".join(f"{k} {v:.3f}" for k, v in stages.items()))
    print(f"last checkpoint with deltas: stored file == torch.save's file: {same}; "
          f"s4fs.load to cuda bit-exact: {exact}")
    if timeline:
        trainer.train(between)
        traced_save(trainer.state(), os.path.join(roots["delta"], f"ckpt_{trainer.steps}.pt"),
                    config, "a delta save (base: the series' last checkpoint)")


def _torch_bytes(sd, path: str) -> bytes:
    import torch
    torch.save(sd, path)
    with open(path, "rb") as f:
        data = f.read()
    os.remove(path)
    return data


def traced_save(sd, path: str, config, what: str = "a first checkpoint") -> None:
    """One s4fs.save (+ os.sync) with its GPU batches, delta base decodings and pack
    writes timed and its main thread profiled: where the save leaves the disk idle or
    under-fed."""
    import cProfile
    import pstats
    import threading
    import s4fs
    from s4fs import chunks as reader
    from s4fs.codec import gpu
    from s4fs.stores.local import LocalStore
    ev: list = []
    lock = threading.Lock()
    t0 = time.perf_counter()
    put, code = LocalStore.put_parts, gpu.compress_many

    def traced_put(self, key, parts):
        a = time.perf_counter()
        try:
            return put(self, key, parts)
        finally:
            with lock:
                ev.append(("write", a - t0, time.perf_counter() - t0,
                           sum(memoryview(x).nbytes for x in parts)))

    def traced_code(items, **kw):
        a = time.perf_counter()
        try:
            return code(items, **kw)
        finally:
            ev.append(("code", a - t0, time.perf_counter() - t0,
                       sum(it[0].numel() * it[0].element_size() for it in items)))

    decode = reader.decode_on_gpu

    def traced_decode(source, refs, **kw):
        a = time.perf_counter()
        try:
            return decode(source, refs, **kw)
        finally:
            ev.append(("base", a - t0, time.perf_counter() - t0, sum(r.stored for r in refs)))

    LocalStore.put_parts, gpu.compress_many = traced_put, traced_code
    reader.decode_on_gpu = traced_decode
    prof = cProfile.Profile()
    try:
        t0 = time.perf_counter()
        prof.enable()
        s4fs.save(sd, path, config=config)
        prof.disable()
        t_save = time.perf_counter() - t0
        os.sync()
        t_all = time.perf_counter() - t0
    finally:
        LocalStore.put_parts, gpu.compress_many = put, code
        reader.decode_on_gpu = decode
    writes = sorted(e[1:] for e in ev if e[0] == "write")
    print(f"\n# traced s4fs.save, {what}: {t_save:.3f} s, {t_all:.3f} s with os.sync()")
    for kind, a, b, n in sorted((e for e in ev if e[0] != "write"), key=lambda e: e[1]):
        print(f"#   {'GPU batch of' if kind == 'code' else 'delta bases decoded,'} "
              f"{n / 2**20:.0f} MiB{'' if kind == 'code' else ' stored'}: {a:.3f} -> {b:.3f} s")
    if writes:
        edges = sorted([(a, 1) for a, _, _ in writes] + [(b, -1) for _, b, _ in writes])
        busy, depth, last, weighted = 0.0, 0, edges[0][0], 0.0
        for t, d in edges:
            if depth:
                busy += t - last
                weighted += depth * (t - last)
            depth, last = depth + d, t
        total = sum(n for _, _, n in writes)
        print(f"#   {len(writes)} pack writes, {total / 2**20:.0f} MiB: first starts at "
              f"{writes[0][0]:.3f} s, last ends at {max(b for _, b, _ in writes):.3f} s; "
              f"some write in flight {busy:.3f} s, {weighted / max(busy, 1e-9):.1f} on average")
        for lo in range(0, int(t_save * 10) + 1):    # writes in flight per 100 ms
            a, b = lo / 10, lo / 10 + 0.1
            inflight = sum(max(0.0, min(b, y) - max(a, x)) for x, y, _ in writes) / 0.1
            print(f"#   {a:.1f}-{b:.1f} s: {inflight:4.1f} writes in flight")
    st = pstats.Stats(prof)
    st.sort_stats("tottime").print_stats(20)


def _to_cuda(obj):
    import torch
    if torch.is_tensor(obj):
        return obj.cuda(non_blocking=False)
    if isinstance(obj, dict):
        return {k: _to_cuda(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_to_cuda(v) for v in obj]
    return obj


if __name__ == "__main__":
    main()
