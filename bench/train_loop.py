"""What checkpointing costs a training run: seconds the training loop is blocked per
checkpoint, and the run's time over a run with no checkpoints, for every way s4fs can
take a checkpoint beside the peers, in one run on one trainer.

A byte-level GPT (``--gib`` of state: fp32 weights and AdamW moments, bf16 autocast on a
GPU) trains on real text (the repository's docs); every ``--every`` steps the loop saves
its whole state (model + optimizer) the way a training script does, with its code
unchanged, and goes on training. Modes (``--modes``, all by default):

* ``none``: no checkpoints (the baseline run time);
* ``local+sync``: ``torch.save`` to local disk, then ``os.sync()`` (durable: the floor of
  a durable save, the reference of the mount's default mode);
* ``local``: ``torch.save`` to local disk, no sync (the page cache: the floor of a save
  that returns before the bytes are durable, the reference of ``--writeback``);
* ``dcp-async``: ``torch.distributed.checkpoint.async_save`` to local disk;
* ``s4fs.save``, ``s4fs.async_save``: the Python API into a local store;
* ``mount``, ``mount-wb``: unchanged ``torch.save`` through an s4fs FUSE mount on a
  local store, default mode (durable at ``close()``) and ``--writeback``; ``-cuda``
  variants code on the GPU (``--device cuda``), the others on CPU workers;
* ``fuse-floor``, ``fuse-floor+sync``: unchanged ``torch.save`` through a pyfuse3 mount
  that only passes each request to a local file (``bench/_fuse_floor.py``; ``+sync``
  fsyncs it at ``close()``): the floor of any Python FUSE mount, the transport's own
  cost, measured in the same run as the mount's modes; ``fuse-floor-kc``,
  ``fuse-floor-kc+sync``: the same with the kernel's FUSE writeback cache on (writes land
  in the page cache and reach the daemon in the background, before ``close()`` returns);
  ``fuse-floor-pt``, ``fuse-floor-pt+sync``: the same pyfuse3 daemon with the kernel's FUSE
  passthrough (pyfuse3 patched for it: ``bash mount/binding/build_pyfuse3.sh DEST``,
  then ``S4FS_PYFUSE3_PASSTHROUGH=DEST/site``; the modes are left out without it);
  ``mount-pt``, ``mount-wb-pt`` (and their ``-cuda`` variants): the mount with
  ``--passthrough``, default mode and ``--writeback`` (the same pyfuse3);
  ``mount-wb-pt-follow`` (``-cuda-follow``): ``--writeback --passthrough
  --code-while-written``, coding while the kernel writes the file (the default codes
  once ``close()`` accepted it);
  ``mount-pt-full`` (``-cuda-full``): ``--passthrough --no-delta``, every checkpoint
  stored whole — what the delta saves of ``mount-pt`` compare with, save by save
  (``mount-full``, ``mount-cuda-full``: the same on the FUSE request path);
  ``mount-pt-ram`` (``-cuda-ram``): ``mount-pt`` with its cache dir on tmpfs
  (``/dev/shm``): the spool a save leaves as the file's local copy is not written back
  to disk during the training that follows. The
  modes without ``-pt`` mount with ``--no-passthrough``: the FUSE request path.
* ``fuse-c``, ``fuse-c+sync``: the same through libfuse's own C++ passthrough example (3.18.3, bench/build_fuse_c_floor.sh)
  (``passthrough_hp``, multi-threaded, no FUSE passthrough): the floor of a FUSE mount
  whose daemon is not Python; ``fuse-passthrough``, ``fuse-passthrough+sync``: that
  daemon with the kernel's FUSE passthrough (Linux >= 6.9; writes go from the kernel
  straight into the backing file): the floor of a mount that hands its spool to the
  kernel. ``+sync`` here: ``os.sync()`` after the save, as ``local+sync``. The binary:
  ``$S4FS_PASSTHROUGH_HP`` (``bash bench/build_fuse_c_floor.sh DEST`` builds it); the
  modes are left out without it.

An async mode waits for its previous save before the next one (counted as blocked), as
a training script must. Background work left at the end (an async save, a writeback
mount's commits) is drained after the run and reported as "drain"; stored bytes are what
the store holds, once the collector ran (``s4fs gc --grace 0``), over what ``torch.save``
wrote. Every mode trains the same steps from the
same state (each starts from a copy), so run times compare. "Training slowed" is the
run's time outside its saves minus the same for ``none``: what the saves left behind
cost the training after them (a local save without sync leaves gigabytes of dirty pages
for the kernel to write back; a writeback mount codes its commits).

    python bench/train_loop.py --gib 1.7 --every 200 --checkpoints 4      # the H200 box
    python bench/train_loop.py --gib 0.05 --every 20 --checkpoints 3 --device cpu   # a CPU box

With ``--rounds N`` the modes run N times, every other round in reverse order, and each
figure is the median over all rounds (the ratio of delta saves to whole saves is also
printed round by round): a lease's drift then falls on both sides of a comparison. With
``--budget SECONDS`` no mode starts that would likely end past that time (bench/gpu.sh
passes what is left of its 560 s), and the table covers the modes that ran.
"""

from __future__ import annotations

import argparse
import copy
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from _common import (du, machine, passthrough_pyfuse3_env, s4fs_cli,  # noqa: E402
                     start_fuse_daemon, stop_fuse_daemon, table)

MODES = ("none", "local+sync", "local", "fuse-floor+sync", "fuse-floor", "fuse-floor-kc+sync",
         "fuse-floor-kc", "fuse-floor-pt+sync", "fuse-floor-pt", "fuse-c+sync", "fuse-c",
         "fuse-passthrough+sync", "fuse-passthrough",
         "dcp-async",
         "s4fs.save", "s4fs.async_save", "mount", "mount-wb", "mount-pt", "mount-wb-pt",
         "mount-cuda", "mount-wb-cuda", "mount-pt-cuda", "mount-wb-pt-cuda",
         "mount-full", "mount-cuda-full", "mount-pt-full", "mount-pt-cuda-full",
         "mount-wb-pt-follow", "mount-wb-pt-cuda-follow",
         "mount-pt-ram", "mount-pt-cuda-ram")
C_FLOORS = ("fuse-c", "fuse-passthrough")      # the modes of libfuse's passthrough_hp


class Trainer:
    """A byte-level GPT and its AdamW, trained on the repository's docs."""

    def __init__(self, gib: float, device: str) -> None:
        import torch
        from delta_gpu import corpus, gpt_of_state
        torch.manual_seed(0)
        self.device = device
        self.ctx, self.batch = 256, 16 if device == "cuda" else 4
        self.data = torch.tensor(list(corpus()), dtype=torch.long, device=device)
        self.model = gpt_of_state(gib, ctx=self.ctx).to(device)
        self.opt = torch.optim.AdamW(self.model.parameters(), lr=3e-4, weight_decay=0.1)
        self.g = torch.Generator(device="cpu").manual_seed(0)

    def train(self, steps: int) -> None:
        import torch
        import torch.nn.functional as F
        ctx, data = self.ctx, self.data
        for _ in range(steps):
            ix = torch.randint(0, len(data) - ctx - 1, (self.batch,), generator=self.g)
            ix = ix.to(self.device)
            x = torch.stack([data[i:i + ctx] for i in ix])
            y = torch.stack([data[i + 1:i + ctx + 1] for i in ix])
            with torch.autocast(device_type=self.device, dtype=torch.bfloat16,
                                enabled=self.device == "cuda"):
                loss = F.cross_entropy(self.model(x).float().view(-1, 256), y.view(-1))
            self.opt.zero_grad(set_to_none=True)
            loss.backward()
            self.opt.step()
        self.sync()

    def sync(self) -> None:
        import torch
        if self.device == "cuda":
            torch.cuda.synchronize()

    def state(self) -> dict:
        return {"model": self.model.state_dict(), "optim": self.opt.state_dict()}


class Mode:
    """One way of taking checkpoints: ``save(state, i)`` (blocking part), ``drain()``."""

    def __init__(self, name: str, work: str, device: str, verbose: bool = False) -> None:
        self.name, self.work = name, os.path.join(work, name)
        os.makedirs(self.work)
        self.pending = None
        self.mountpoint = None
        self.store = os.path.join(self.work, "store")
        self.logical = 0
        self.floor = None
        self.ram = None
        self.cache = os.path.join(self.work, "cache")
        if name.startswith("fuse-floor"):
            here = os.path.dirname(os.path.abspath(__file__))
            env = passthrough_pyfuse3_env() if "-pt" in name else None
            self._start_floor([sys.executable, os.path.join(here, "_fuse_floor.py")],
                              (["--fsync"] if name.endswith("+sync") else [])
                              + (["--kernel-cache"] if "-kc" in name else [])
                              + (["--passthrough"] if "-pt" in name else []), env)
        elif name.startswith(C_FLOORS):
            self._start_floor([os.environ["S4FS_PASSTHROUGH_HP"], "--foreground"],
                              [] if "passthrough" in name else ["--nopassthrough"])
        elif name.startswith("mount"):
            os.makedirs(self.store)
            self.mountpoint = os.path.join(self.work, "mnt")
            os.makedirs(self.mountpoint)
            extra = ["--writeback"] if "-wb" in name else []
            extra += ["--device", "cuda" if "-cuda" in name else "cpu"]
            env = None
            if "-pt" in name:           # mount --passthrough: the patched pyfuse3
                extra.append("--passthrough")
                env = passthrough_pyfuse3_env()
            else:
                extra.append("--no-passthrough")
            if name.endswith("-full"):  # every checkpoint stored whole: no delta base
                extra.append("--no-delta")
            if name.endswith("-follow"):  # writeback codes while the kernel writes
                extra.append("--code-while-written")
            if name.endswith("-ram"):     # the cache dir (spools, local copies) on tmpfs
                self.ram = tempfile.mkdtemp(prefix="s4fs-trainloop-", dir="/dev/shm")
                self.cache = os.path.join(self.ram, "cache")
            s4fs_cli("mount", self.store, self.mountpoint, "--cache-dir", self.cache,
                     *extra, *(["-v"] if verbose else []), env=env)
        elif name == "dcp-async":
            import torch.distributed as dist
            if not dist.is_initialized():
                import socket
                with socket.socket() as s:
                    s.bind(("127.0.0.1", 0))
                    port = s.getsockname()[1]
                dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}",
                                        rank=0, world_size=1)

    def _start_floor(self, daemon: list, options: list, env: dict | None = None) -> None:
        """A floor's FUSE daemon over ``self.store`` at ``self.mountpoint``; returns once
        it is mounted."""
        os.makedirs(self.store)
        self.mountpoint = os.path.join(self.work, "mnt")
        os.makedirs(self.mountpoint)
        self.floor = start_fuse_daemon(daemon + [self.store, self.mountpoint] + options,
                                       self.mountpoint, env)

    def save(self, state: dict, i: int) -> None:
        import torch
        name = f"ckpt_{i}.pt"
        if self.name == "none":
            return
        if self.name in ("local", "local+sync"):
            torch.save(state, os.path.join(self.work, name))
            if self.name == "local+sync":
                os.sync()
        elif self.name.startswith(C_FLOORS):
            torch.save(state, os.path.join(self.mountpoint, name))
            if self.name.endswith("+sync"):
                os.sync()
        elif self.name == "dcp-async":
            import torch.distributed.checkpoint as dcp
            self._wait()
            self.pending = dcp.async_save(state, checkpoint_id=os.path.join(self.work, f"step_{i}"))
        elif self.name == "s4fs.save":
            import s4fs
            s4fs.save(state, os.path.join(self.store, name))
        elif self.name == "s4fs.async_save":
            import s4fs
            self._wait()
            self.pending = s4fs.async_save(state, os.path.join(self.store, name))
        else:
            torch.save(state, os.path.join(self.mountpoint, name))

    def _wait(self) -> None:
        if self.pending is not None:
            self.pending.result()
            self.pending = None

    def drain(self) -> None:
        self._wait()
        if self.mountpoint and self.name.startswith("mount"):
            # writeback: the commits; every mount: the re-expressions of the versions
            # before as deltas (backward deltas), so that the stored bytes are final
            s4fs_cli("sync", self.mountpoint)

    def stored(self) -> int | None:
        """What the store holds once the collector ran (after :meth:`drain`, nothing in
        flight): backward deltas leave the packs they free to the collector."""
        if self.name.startswith(("s4fs", "mount")) and os.path.isdir(self.store):
            s4fs_cli("gc", "--grace", "0", "-q", self.store)
            return du(self.store)
        return None

    def close(self) -> None:
        if self.floor is not None:
            stop_fuse_daemon(self.floor, self.mountpoint)
        elif self.mountpoint:
            s4fs_cli("umount", self.mountpoint, timeout=300)

    def discard(self) -> None:
        """After close(): what the mode kept outside its work dir (a tmpfs cache)."""
        if self.ram:
            shutil.rmtree(self.ram, ignore_errors=True)


def _profiler(mode: Mode, folder: str | None):
    """py-spy recording the mount's daemon (and its worker processes) while the mode
    runs, or None (also with TRAIN_PYSPY=0: the daemon logs alone, nothing slowed)."""
    if not folder or not mode.mountpoint or not shutil.which("py-spy") \
            or os.environ.get("TRAIN_PYSPY") == "0":
        return None
    pid = next((int(p) for p in os.listdir("/proc") if p.isdigit()
                and " mount " in _cmdline(p) and mode.mountpoint in _cmdline(p)
                and int(p) != os.getpid()), None)
    if pid is None:
        return None
    os.makedirs(folder, exist_ok=True)
    return subprocess.Popen(["py-spy", "record", "--pid", str(pid), "--subprocesses",
                             "--rate", "200", "--format", "raw", "--nonblocking", "--threads",
                             "--output", os.path.join(folder, f"{mode.name}.pyspy.txt")],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def _cmdline(pid: str) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return ""


def run(trainer: Trainer, start: dict, name: str, work: str, every: int, n: int,
        device: str, profile: str | None = None) -> dict:
    trainer.model.load_state_dict(start["model"])
    trainer.opt.load_state_dict(start["optim"])
    trainer.g.manual_seed(1)
    mode = Mode(name, work, device, verbose=bool(profile))
    spy = _profiler(mode, profile)
    blocked: list[float] = []
    try:
        t0 = time.perf_counter()
        for i in range(n):
            trainer.train(every)
            t = time.perf_counter()
            mode.save(trainer.state(), i)
            blocked.append(time.perf_counter() - t)
        trainer.train(every)              # the run goes on after its last checkpoint
        wall = time.perf_counter() - t0
        t = time.perf_counter()
        mode.drain()
        drain = time.perf_counter() - t
        stored = mode.stored()
    finally:
        if spy is not None:
            spy.send_signal(2)
            try:
                spy.wait(30)
            except subprocess.TimeoutExpired:
                spy.kill()
        mode.close()
        if profile and os.path.exists(os.path.join(mode.cache, "s4fs-mount.log")):
            os.makedirs(profile, exist_ok=True)
            shutil.copy(os.path.join(mode.cache, "s4fs-mount.log"),
                        os.path.join(profile, f"{name}.daemon.log"))
        mode.discard()
    return summary(name, [{"blocked": blocked, "wall": wall, "drain": drain,
                           "stored": stored}])


def summary(name: str, rounds: list[dict]) -> dict:
    """One mode's figures over its rounds: medians of its saves (all, first, later), of
    its run times and drains; ``rounds`` keeps each round's own."""
    saves = [b for r in rounds for b in r["blocked"]] if name != "none" else []
    later = [b for r in rounds for b in r["blocked"][1:]] if name != "none" else []
    return {"blocked": statistics.median(saves) if saves else 0.0,
            "first": statistics.median(r["blocked"][0] for r in rounds) if saves else 0.0,
            "later": statistics.median(later) if later else 0.0,
            "wall": statistics.median(r["wall"] for r in rounds),
            # the run's time outside the saves: above none's, the training itself ran
            # slower (work left behind by the saves: dirty pages written back, commits)
            "train": statistics.median(r["wall"] - sum(r["blocked"]) for r in rounds),
            "drain": statistics.median(r["drain"] for r in rounds),
            "stored": rounds[-1]["stored"], "rounds": rounds}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--gib", type=float, default=1.7, help="state size (weights + AdamW)")
    ap.add_argument("--every", type=int, default=200, help="training steps per checkpoint")
    ap.add_argument("--checkpoints", type=int, default=4)
    ap.add_argument("--modes", default=",".join(MODES))
    ap.add_argument("--rounds", type=int, default=1,
                    help="run the modes this many times, each round in the reverse order "
                         "of the last (medians over all rounds; per-round ratios printed)")
    ap.add_argument("--device", default=None, help="cuda (default where there is one) or cpu")
    ap.add_argument("--work", default=None, help="folder on the disk to measure (a temp dir)")
    ap.add_argument("--profile", default=None, metavar="DIR",
                    help="keep each mount's daemon log in DIR, and where py-spy is on PATH, "
                         "a profile of the daemon and its workers while the mode runs")
    ap.add_argument("--budget", type=float, default=None, metavar="SECONDS",
                    help="start no mode that would likely end after this many seconds "
                         "from the start (the longest mode so far is the guess), and print "
                         "the table of what ran: a device lease's limit then costs the "
                         "last modes, not the whole table")
    args = ap.parse_args(argv)
    t_start = time.monotonic()
    import torch
    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    unknown = set(modes) - set(MODES)
    if unknown:
        ap.error(f"unknown modes {sorted(unknown)}; known: {', '.join(MODES)}")
    if not os.environ.get("S4FS_PASSTHROUGH_HP"):
        skipped = [m for m in modes if m.startswith(C_FLOORS)]
        modes = [m for m in modes if m not in skipped]
        if skipped:
            print(f"# no S4FS_PASSTHROUGH_HP (bench/build_fuse_c_floor.sh): "
                  f"{', '.join(skipped)} left out")
    if not os.environ.get("S4FS_PYFUSE3_PASSTHROUGH"):
        skipped = [m for m in modes if m.startswith("fuse-floor-pt") or "-pt" in m]
        modes = [m for m in modes if m not in skipped]
        if skipped:
            print(f"# no S4FS_PYFUSE3_PASSTHROUGH (mount/binding/build_pyfuse3.sh): "
                  f"{', '.join(skipped)} left out")
    if device != "cuda":
        skipped = [m for m in modes if m.endswith("-cuda")]
        modes = [m for m in modes if m not in skipped]
        if skipped:
            print(f"# no CUDA device: {', '.join(skipped)} left out")
    trainer = Trainer(args.gib, device)
    trainer.train(5)                       # warm-up: kernels, allocator, optimizer state
    start = copy.deepcopy(trainer.state())
    size = sum(t.numel() * t.element_size() for t in _tensors(start))
    work = tempfile.mkdtemp(prefix="s4fs-trainloop-", dir=args.work)
    print(f"# training loop: {machine()}; device {device}"
          + (f" ({torch.cuda.get_device_name()})" if device == "cuda" else "")
          + f"; torch {torch.__version__}")
    print(f"# state {size / 2**30:.2f} GiB (fp32 weights + AdamW), a checkpoint every "
          f"{args.every} steps, {args.checkpoints} checkpoints; work dir {work}")
    rounds: dict[str, list[dict]] = {}
    longest = 0.0
    try:
        for k in range(args.rounds):
            for name in (modes if k % 2 == 0 else modes[::-1]):
                now = time.monotonic() - t_start
                if args.budget and now + 1.2 * longest > args.budget:
                    print(f"# --budget {args.budget:.0f} s: {now:.0f} s gone, a mode takes "
                          f"up to {longest:.0f} s; stopping before {name} (round {k + 1})")
                    break
                t_mode = time.monotonic()
                try:
                    r = run(trainer, start, name, work, args.every, args.checkpoints,
                            device, args.profile)
                    rounds.setdefault(name, []).extend(r["rounds"])
                    print(f"#   {name}" + (f" (round {k + 1})" if args.rounds > 1 else "")
                          + f": blocked {r['blocked']:.3f} s per checkpoint ("
                          + " ".join(f"{b:.2f}" for b in r["rounds"][0]["blocked"])
                          + f"), run {r['wall']:.2f} s", flush=True)
                except Exception as exc:         # noqa: BLE001 - reported, the rest runs
                    print(f"# {name} failed: {type(exc).__name__}: {exc}")
                shutil.rmtree(os.path.join(work, name), ignore_errors=True)
                longest = max(longest, time.monotonic() - t_mode)
            else:
                continue
            break                                # out of time: no further rounds
    finally:
        shutil.rmtree(work, ignore_errors=True)
    results = {name: summary(name, rounds[name]) for name in modes if name in rounds}
    if args.rounds > 1:
        for name, r in results.items():
            whole = results.get(name + "-full") if "-pt" in name else None
            if whole and len(whole["rounds"]) == len(r["rounds"]):
                each = [statistics.median(a["blocked"][1:]) / statistics.median(b["blocked"][1:])
                        for a, b in zip(r["rounds"], whole["rounds"])
                        if len(a["blocked"]) > 1 and len(b["blocked"]) > 1]
                print(f"# {name} later x {name}-full, round by round: "
                      + ", ".join(f"{x:.2f}x" for x in each))
    base = results.get("none", {}).get("wall")
    base_train = results.get("none", {}).get("train")
    ref_sync = results.get("local+sync", {}).get("blocked")
    ref_page = results.get("local", {}).get("blocked")
    logical = size * args.checkpoints
    rows = []
    for name, r in results.items():
        # a delta-saving mount's later saves beside the same saves stored whole
        whole = results.get(name + "-full", {}).get("later") if "-pt" in name else None
        rows.append([
            name, f"{r['blocked']:.3f}", f"{r['first']:.3f}",
            f"{r['later']:.3f}" if r["later"] else "-",
            f"{r['later'] / whole:.2f}x" if whole and r["later"] else "-",
            f"{r['blocked'] / ref_sync:.2f}x" if ref_sync and name != "none" else "-",
            f"{r['blocked'] / ref_page:.2f}x" if ref_page and name != "none" else "-",
            f"{r['wall']:.2f}",
            f"{100 * (r['wall'] - base) / base:+.0f} %" if base and name != "none" else "-",
            f"{r['train'] - base_train:+.2f}" if base_train and name != "none" else "-",
            f"{r['drain']:.2f}" if r["drain"] > 0.005 else "-",
            f"{100 * r['stored'] / logical:.1f} %" if r["stored"] else "-"])
    print(table(["mode", "blocked s/ckpt (median)", "first", "later", "later x -full",
                 "x local+sync", "x local", "run s", "over no ckpt", "training slowed s",
                 "drain s", "stored"], rows))
    return 0


def _tensors(obj):
    import torch
    if isinstance(obj, torch.Tensor):
        yield obj
    elif isinstance(obj, dict):
        for v in obj.values():
            yield from _tensors(v)
    elif isinstance(obj, (list, tuple)):
        for v in obj:
            yield from _tensors(v)


if __name__ == "__main__":
    sys.exit(main())
