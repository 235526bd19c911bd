"""A sharded training job on every GPU of one host, checkpointed with DCP: what each way
of saving blocks per checkpoint and costs the run, and whether every tensor comes back
bit-exact with the same and with half the ranks (resharding).

One process per GPU (``torchrun``, NCCL; gloo and CPU tensors where there is no GPU)
trains a byte-level GPT sharded with FSDP2 (``fully_shard``: weights and AdamW moments
live sharded on the GPUs) and every ``--every`` steps saves its state with
``torch.distributed.checkpoint``. Modes (``--modes``):

* ``none``: no checkpoints (the run time to compare against);
* ``local``: ``dcp.save`` to local disk; ``local-async``: ``dcp.async_save`` there;
* ``mount``: ``dcp.save`` into one ``s4fs mount --device cuda`` of a local store (one mount
  for the node, all ranks write through it);
* ``s4fs``: ``dcp.save`` with ``s4fs.dcp.StorageWriter`` straight into a local store (no
  mount); ``s4fs-async``: ``dcp.async_save`` with that writer.

After the run each mode's last checkpoint is loaded back by a job of N ranks and one of
N/2 ranks (DCP reshards), every tensor compared bit for bit (SHA-256 of the full tensor)
with what the saving job held; each rank also checks, through ``nvidia-smi``, that its
process holds memory on its own GPU only (no stray CUDA contexts).

    python bench/multi_gpu.py --gib 2 --every 50 --checkpoints 3      # all GPUs of the host
    python bench/multi_gpu.py --nproc 2 --gib 0.02 --every 3 --checkpoints 2   # CPU box (gloo)

Keep NCCL's NVLink multicast off (``NCCL_NVLS_ENABLE=0``, set here): the GPU machines
this was written for do not lend it.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

MODES = ("none", "local", "local-async", "mount", "s4fs", "s4fs-async")


# --------------------------------------------------------------------------- the job

def _setup():
    import torch
    import torch.distributed as dist
    cuda = torch.cuda.is_available()
    if cuda:
        torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
    dist.init_process_group("nccl" if cuda else "gloo")
    return ("cuda" if cuda else "cpu"), dist.get_rank(), dist.get_world_size()


def _model(gib: float, device: str):
    """The GPT of bench/train_loop.py at ``gib`` of state, sharded with FSDP2."""
    import torch
    from torch.distributed.fsdp import fully_shard
    from delta_gpu import gpt_of_state
    torch.manual_seed(0)
    model = gpt_of_state(gib).to(device)
    for block in model.blocks:
        fully_shard(block)
    fully_shard(model)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4, weight_decay=0.1)
    return model, opt


_DATA: list = []


def _train(model, opt, steps: int, device: str, rank: int, step0: int) -> None:
    import torch
    import torch.nn.functional as F
    from delta_gpu import corpus
    if not _DATA:
        _DATA.append(torch.tensor(list(corpus()), dtype=torch.long))
    data = _DATA[0]
    g = torch.Generator().manual_seed(1000 * rank + step0)
    for _ in range(steps):
        ix = torch.randint(0, len(data) - 257, (8,), generator=g)
        x = torch.stack([data[i:i + 256] for i in ix]).to(device)
        y = torch.stack([data[i + 1:i + 257] for i in ix]).to(device)
        with torch.autocast(device_type=device, dtype=torch.bfloat16, enabled=device == "cuda"):
            loss = F.cross_entropy(model(x).float().view(-1, 256), y.view(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
    if device == "cuda":
        torch.cuda.synchronize()


def _state(model, opt) -> dict:
    from torch.distributed.checkpoint.state_dict import get_state_dict
    msd, osd = get_state_dict(model, opt)
    return {"model": msd, "optim": osd}


def _digests(state: dict) -> dict:
    """SHA-256 of every full tensor (gathered from its shards), by flat key."""
    import torch
    from torch.distributed.tensor import DTensor
    out = {}

    def walk(prefix, obj):
        if isinstance(obj, dict):
            for k, v in obj.items():
                walk(f"{prefix}.{k}" if prefix else str(k), v)
        elif isinstance(obj, (list, tuple)):
            for k, v in enumerate(obj):
                walk(f"{prefix}.{k}", v)
        elif isinstance(obj, torch.Tensor):
            full = obj.full_tensor() if isinstance(obj, DTensor) else obj
            raw = full.detach().contiguous().cpu().view(-1).view(torch.uint8)
            out[prefix] = hashlib.sha256(raw.numpy().tobytes()).hexdigest()
    walk("", state)
    return out


def _stray_contexts(device: str) -> list[str]:
    """GPUs other than this rank's on which this process holds memory."""
    if device != "cuda" or not shutil.which("nvidia-smi"):
        return []
    import torch
    mine = torch.cuda.get_device_properties(torch.cuda.current_device()).uuid
    res = subprocess.run(["nvidia-smi", "--query-compute-apps=pid,gpu_uuid,used_memory",
                          "--format=csv,noheader"], capture_output=True, text=True)
    out = []
    for line in res.stdout.splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) >= 3 and parts[0] == str(os.getpid()) and str(mine) not in parts[1]:
            out.append(f"pid {parts[0]} on {parts[1]} ({parts[2]})")
    return out


def _save(mode: str, state: dict, step: str, pending, group=None):
    """One checkpoint in ``mode``; returns the async save now pending, if any. An async
    save runs its collectives on ``group`` (gloo), apart from the training's."""
    import torch.distributed.checkpoint as dcp
    if mode in ("local", "mount"):
        dcp.save(state, checkpoint_id=step)
        return None
    if mode == "s4fs":
        from s4fs.dcp import StorageWriter
        dcp.save(state, storage_writer=StorageWriter(step))
        return None
    if pending is not None:                # an async save waits for the one before
        pending.result()
    if mode == "s4fs-async":
        from s4fs.dcp import StorageWriter
        return dcp.async_save(state, storage_writer=StorageWriter(step), process_group=group)
    return dcp.async_save(state, checkpoint_id=step, process_group=group)


def save_job(args) -> int:
    import torch.distributed as dist
    device, rank, world = _setup()
    model, opt = _model(args.gib, device)
    _train(model, opt, 2, device, rank, 0)                 # warm-up, optimizer state made
    # an async save's background thread must not share a group with the training loop's
    # collectives (they would interleave and hang): its own gloo group, as DCP advises
    group = dist.new_group(backend="gloo") if args.mode.endswith("-async") else None
    blocked, pending, digests = [], None, None
    dist.barrier()
    t0 = time.perf_counter()
    for i in range(args.checkpoints):
        _train(model, opt, args.every, device, rank, i + 1)
        dist.barrier()
        t = time.perf_counter()
        if args.mode != "none":
            state = _state(model, opt)
            pending = _save(args.mode, state, os.path.join(args.where, f"step_{i}"), pending,
                            group)
        blocked.append(time.perf_counter() - t)
        if args.mode != "none" and i == args.checkpoints - 1:
            t = time.perf_counter()
            digests = _digests(state)          # what the last checkpoint must give back
            t0 += time.perf_counter() - t      # (not the run's time)
    _train(model, opt, args.every, device, rank, 99)       # the run goes on after it
    wall = time.perf_counter() - t0
    if pending is not None:
        pending.result()
    gathered = [None] * world
    dist.all_gather_object(gathered, {"blocked": blocked, "wall": wall,
                                      "stray": _stray_contexts(device)})
    if rank == 0:
        with open(args.out, "w") as f:
            json.dump({"ranks": gathered, "digests": digests}, f)
    dist.barrier()
    return 0


def load_job(args) -> int:
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    device, rank, world = _setup()
    model, opt = _model(args.gib, device)
    _train(model, opt, 1, device, rank, 0)                 # optimizer state to load into
    state = _state(model, opt)
    step = os.path.join(args.where, f"step_{args.checkpoints - 1}")
    if args.mode.startswith("s4fs"):
        from s4fs.dcp import StorageReader
        dcp.load(state, storage_reader=StorageReader(step))
    else:
        dcp.load(state, checkpoint_id=step)
    digests = _digests(state)
    stray = _stray_contexts(device)
    gathered = [None] * world
    dist.all_gather_object(gathered, stray)
    if rank == 0:
        with open(args.out, "w") as f:
            json.dump({"digests": digests, "stray": sum(gathered, [])}, f)
    dist.barrier()
    return 0


# --------------------------------------------------------------------------- the driver

def _torchrun(nproc: int, *args: str, timeout: float) -> None:
    """Run this script's ``--job`` on ``nproc`` ranks; on a timeout every rank is killed
    (they run in a session of their own)."""
    import signal
    env = dict(os.environ, NCCL_NVLS_ENABLE="0", OMP_NUM_THREADS="1")
    env["PYTHONPATH"] = HERE + os.pathsep + env.get("PYTHONPATH", "")
    p = subprocess.Popen([sys.executable, "-m", "torch.distributed.run", "--standalone",
                          f"--nproc-per-node={nproc}", os.path.abspath(__file__), *args],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                         start_new_session=True)
    try:
        _, err = p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        p.communicate()
        raise RuntimeError(f"timed out after {timeout:.0f} s") from None
    if p.returncode:
        raise RuntimeError(f"torchrun exited {p.returncode}: {err.strip()[-2000:]}")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--job", choices=["save", "load"], help=argparse.SUPPRESS)
    ap.add_argument("--mode", help=argparse.SUPPRESS)
    ap.add_argument("--where", help=argparse.SUPPRESS)
    ap.add_argument("--out", help=argparse.SUPPRESS)
    ap.add_argument("--nproc", type=int, default=None,
                    help="ranks (default: the GPUs of the host; 2 without one)")
    ap.add_argument("--gib", type=float, default=2.0, help="state size (weights + AdamW)")
    ap.add_argument("--every", type=int, default=50, help="training steps per checkpoint")
    ap.add_argument("--checkpoints", type=int, default=3)
    ap.add_argument("--modes", default=",".join(MODES))
    ap.add_argument("--work", default=None, help="folder on the disk to measure")
    ap.add_argument("--timeout", type=float, default=600, help="seconds a torchrun may take")
    args = ap.parse_args(argv)
    if args.job == "save":
        return save_job(args)
    if args.job == "load":
        return load_job(args)

    import torch
    sys.path.insert(0, HERE)
    from _common import du, machine, s4fs_cli, table
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    nproc = args.nproc or gpus or 2
    if gpus and nproc > gpus:
        ap.error(f"--nproc {nproc}: this host has {gpus} GPUs")
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    unknown = set(modes) - set(MODES)
    if unknown:
        ap.error(f"unknown modes {sorted(unknown)}; known: {', '.join(MODES)}")
    work = tempfile.mkdtemp(prefix="s4fs-multigpu-", dir=args.work)
    print(f"# {machine()}; {nproc} ranks on "
          + (f"{gpus} x {torch.cuda.get_device_name()} (NCCL)" if gpus else "CPU (gloo)")
          + f"; torch {torch.__version__}; FSDP2 GPT, {args.gib} GiB of state, a checkpoint "
            f"every {args.every} steps, {args.checkpoints} checkpoints; work dir {work}",
          flush=True)
    common = ["--gib", str(args.gib), "--every", str(args.every),
              "--checkpoints", str(args.checkpoints)]
    rows, base = [], None
    try:
        for mode in modes:
            folder = os.path.join(work, mode)
            os.makedirs(folder)
            where = os.path.join(folder, "ckpt")
            mnt = None
            if mode == "mount":
                store, mnt = os.path.join(folder, "store"), os.path.join(folder, "mnt")
                os.makedirs(store)
                os.makedirs(mnt)
                s4fs_cli("mount", store, mnt, "--cache-dir", os.path.join(folder, "cache"),
                     "--device", "cuda" if gpus else "cpu")
                where = os.path.join(mnt, "ckpt")
            try:
                out = os.path.join(folder, "save.json")
                try:
                    _torchrun(nproc, "--job", "save", "--mode", mode, "--where", where,
                              "--out", out, *common, timeout=args.timeout)
                except RuntimeError as exc:
                    print(f"# {mode} failed: {exc}", flush=True)
                    continue
                with open(out) as f:
                    saved = json.load(f)
                ranks = saved["ranks"]
                per_ckpt = [max(r["blocked"][i] for r in ranks)
                            for i in range(args.checkpoints)]
                wall = max(r["wall"] for r in ranks)
                if mode == "none":
                    base = wall
                stray = sum((r["stray"] for r in ranks), [])
                exact = []
                for n in sorted({nproc, max(1, nproc // 2)}, reverse=True):
                    if mode == "none":
                        break
                    lout = os.path.join(folder, f"load{n}.json")
                    try:
                        _torchrun(n, "--job", "load", "--mode", mode, "--where", where,
                                  "--out", lout, *common, timeout=args.timeout)
                        with open(lout) as f:
                            loaded = json.load(f)
                        same = loaded["digests"] == saved["digests"]
                        stray += loaded["stray"]
                        exact.append(f"{n}: {'yes' if same else 'NO'} "
                                     f"({len(saved['digests'])} tensors)")
                    except RuntimeError as exc:
                        exact.append(f"{n}: failed")
                        print(f"# {mode} load with {n} ranks failed: {exc}", flush=True)
                logical = du(os.path.join(work, "local", "ckpt")) \
                    if os.path.isdir(os.path.join(work, "local", "ckpt")) else None
                stored = du(os.path.join(folder, "store")) if mode == "mount" else \
                    du(where) if mode.startswith("s4fs") else None
                rows.append([mode, f"{statistics.median(per_ckpt):.3f}", f"{per_ckpt[0]:.3f}",
                             f"{wall:.2f}",
                             f"{100 * (wall - base) / base:+.0f} %" if base and mode != "none"
                             else "-",
                             f"{100 * stored / logical:.1f} %" if stored and logical else "-",
                             "; ".join(exact) or "-",
                             "; ".join(stray) if stray else "none"])
                print(f"#   {mode}: {rows[-1]}", flush=True)
            finally:
                if mnt:
                    s4fs_cli("umount", mnt, timeout=300)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(table(["mode", "blocked s/ckpt (median, slowest rank)", "first", "run s",
                 "over no ckpt", "stored", "bit-exact by ranks loading",
                 "memory on another GPU"], rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
