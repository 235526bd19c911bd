"""Can a fresh node's torch.load overlap the decode? The floor of three ways to hand a
file that is still being decoded to the kernel, with no codec at all.

    python bench/push_floor.py [--gib 1.7] [--rates 1.5,3,0] [--pushers 2]
                               [--modes whole,push,stream] [--repeat 3] [--work DIR]

A bare pyfuse3 daemon serves one checkpoint whose bytes *land* in file order at a set
rate (``--rates`` GB/s; 0: all there at the open), as a decode ahead fills its copy
(s4fs/read/fill.py: the tail's batch first, then the rest in order). The bytes are a
real torch.save of bf16 weights and fp32 AdamW moments, kept in ``/dev/shm`` (decoded
bytes in memory). The ways:

* ``whole``  the open waits until every byte has landed, then the kernel reads the copy
             through FUSE passthrough (what s4fs does under passthrough today);
* ``push``   the open returns at once; the daemon pushes each landed range into the
             kernel's page cache (FUSE ``notify_store``, ``--pushers`` threads, 4 MiB
             pieces, in file order) and a read of a range not landed yet waits for it
             in the daemon (a request); reads of pushed pages never reach the daemon;
* ``stream`` the open returns at once; every read is a request that waits for its
             range, then is answered from the copy (``--stream-cold-reads`` today).

Printed: torch.load through the mount per way and rate (median of ``--repeat``, page
cache of the mount dropped before each), beside the time the bytes take to land alone
(the decode's floor), torch.load of the same file from the page cache, and the local
disk's cold torch.load. Each load is checked against the file's bytes. Needs root
(FUSE, drop_caches) and, for ``whole``, pyfuse3 built with passthrough
(S4FS_PYFUSE3_PASSTHROUGH).
"""

from __future__ import annotations

import argparse
import errno
import fcntl
import os
import shutil
import signal
import stat
import statistics
import struct
import subprocess
import sys
import tempfile
import threading
import time

BACKING_OPEN = 0x4010E501
NAME = b"ckpt.pt"
INODE = 2
STEP = 16 << 20            # bytes landing at once (a decode-ahead batch)
PIECE = 4 << 20            # bytes per notify_store


# --- the daemon ------------------------------------------------------------------------

class Landing:
    """The copy's landed prefix, advancing at ``rate`` bytes/s from the open on: the
    tail's step first (torch.load reads the zip directory there), then from 0 on."""

    def __init__(self, size: int, rate: float) -> None:
        self.size, self.rate = size, rate
        self.cond = threading.Condition()
        self.front = 0              # [0, front) landed
        self.tail = max(0, size - STEP)
        self.tail_in = False
        self.started = None

    def start(self) -> None:
        with self.cond:
            if self.started is not None:
                return
            self.started = time.monotonic()
        threading.Thread(target=self._run, daemon=True).start()

    def _run(self) -> None:
        t0 = self.started
        done = 0
        order = [(self.tail, self.size)] + [(lo, min(lo + STEP, self.size))
                                           for lo in range(0, self.tail, STEP)]
        for lo, hi in order:
            done += hi - lo
            if self.rate > 0:
                wait = t0 + done / self.rate - time.monotonic()
                if wait > 0:
                    time.sleep(wait)
            with self.cond:
                if lo == self.tail:
                    self.tail_in = True
                else:
                    self.front = hi
                self.cond.notify_all()
        with self.cond:
            self.front = self.size
            self.cond.notify_all()

    def landed(self, lo: int, hi: int) -> bool:
        return (self.tail_in and self.front >= self.tail) or hi <= self.front or \
            (self.tail_in and lo >= self.tail)

    def wait(self, lo: int, hi: int) -> None:
        with self.cond:
            while not self.landed(lo, hi):
                self.cond.wait()


def serve(src: str, mnt: str, mode: str, rate: float, pushers: int) -> None:
    import pyfuse3
    import trio
    size = os.path.getsize(src)
    fd = os.open(src, os.O_RDONLY)

    class Ops(pyfuse3.Operations):
        def __init__(self):
            super().__init__()
            self.enable_passthrough = mode == "whole"
            self.land = None
            self.bid = 0

        def _attr(self, inode):
            a = pyfuse3.EntryAttributes()
            a.st_ino = inode
            a.st_mode = (stat.S_IFDIR | 0o755) if inode == pyfuse3.ROOT_INODE else \
                (stat.S_IFREG | 0o644)
            a.st_size = 0 if inode == pyfuse3.ROOT_INODE else size
            a.st_nlink = 1
            a.st_blksize = 1 << 20
            a.attr_timeout = a.entry_timeout = 300
            return a

        async def getattr(self, inode, ctx=None):
            return self._attr(inode)

        async def lookup(self, parent, name, ctx=None):
            if parent != pyfuse3.ROOT_INODE or name != NAME:
                raise pyfuse3.FUSEError(errno.ENOENT)
            return self._attr(INODE)

        async def opendir(self, inode, ctx):
            return inode

        async def readdir(self, fh, start, token):
            if start == 0:
                pyfuse3.readdir_reply(token, NAME, self._attr(INODE), 1)

        async def open(self, inode, flags, ctx):
            land = self.land = Landing(size, rate)
            land.start()
            if mode == "whole":
                await trio.to_thread.run_sync(land.wait, 0, size)
                if not self.bid:
                    self.bid = fcntl.ioctl(pyfuse3.get_session_fd(), BACKING_OPEN,
                                           bytearray(struct.pack("=iIQ", fd, 0, 0)), True)
                return pyfuse3.FileInfo(fh=1, keep_cache=False, backing_id=self.bid)
            if mode == "push":
                for k in range(pushers):
                    threading.Thread(target=self._push, args=(land, k), daemon=True).start()
            return pyfuse3.FileInfo(fh=1, keep_cache=mode == "push")

        def _push(self, land: Landing, k: int) -> None:
            """Pieces k, k + pushers, ... in file order, each once it has landed."""
            buf = bytearray(PIECE)
            order = [(lo, min(lo + PIECE, size)) for lo in range(land.tail, size, PIECE)] + \
                [(lo, min(lo + PIECE, land.tail)) for lo in range(0, land.tail, PIECE)]
            for i, (lo, hi) in enumerate(order):
                if i % pushers != k:
                    continue
                land.wait(lo, hi)
                n = os.preadv(fd, [memoryview(buf)[: hi - lo]], lo)
                pyfuse3.notify_store(INODE, lo, memoryview(buf)[:n])

        async def read(self, fh, off, n):
            end = min(off + n, size)
            if not self.land.landed(off, end):
                await trio.to_thread.run_sync(self.land.wait, off, end)
            return os.pread(fd, end - off, off)

        async def release(self, fh):
            pass

    opts = set(pyfuse3.default_options)
    opts |= {"fsname=pushfloor"}
    pyfuse3.init(Ops(), mnt, opts)
    signal.signal(signal.SIGTERM, lambda *a: pyfuse3.terminate())
    try:
        trio.run(pyfuse3.main)
    finally:
        pyfuse3.close(unmount=True)


# --- the client ----------------------------------------------------------------------

def checkpoint(gib: float) -> bytes:
    import io
    import torch
    n = int(gib * (1 << 30) / 10)
    g = torch.Generator().manual_seed(0)
    sd, i = {}, 0
    while n > 0:
        k = min(n, 8 << 20)
        w = torch.randn(k, generator=g) * 0.02
        sd[f"l{i}.w"] = w.bfloat16()
        sd[f"l{i}.exp_avg"] = torch.randn(k, generator=g) * 1e-4
        sd[f"l{i}.exp_avg_sq"] = (torch.randn(k, generator=g) * 1e-4) ** 2
        n -= k
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


def timed_load(path: str, want: dict) -> float:
    import torch
    t0 = time.perf_counter()
    got = torch.load(path, weights_only=True)
    dt = time.perf_counter() - t0
    for k, v in want.items():
        if not torch.equal(got[k].view(torch.uint8), v.view(torch.uint8)):
            raise SystemExit(f"{path}: tensor {k} differs")
    return dt


def through_mount(src: str, work: str, mode: str, rate: float, pushers: int,
                  want: dict) -> float:
    mnt = tempfile.mkdtemp(dir=work, prefix="mnt-")
    env = dict(os.environ)
    pt = os.environ.get("S4FS_PYFUSE3_PASSTHROUGH")
    if pt:
        env["PYTHONPATH"] = pt + os.pathsep + env.get("PYTHONPATH", "")
    p = subprocess.Popen([sys.executable, __file__, "--serve", src, mnt, mode,
                          str(rate), str(pushers)], env=env)
    try:
        deadline = time.monotonic() + 30
        while not os.path.ismount(mnt):
            if p.poll() is not None or time.monotonic() > deadline:
                raise SystemExit(f"the {mode} daemon did not mount")
            time.sleep(0.05)
        return timed_load(os.path.join(mnt, NAME.decode()), want)
    finally:
        for cmd in (["fusermount3", "-u", "-z", mnt], ["umount", "-l", mnt]):
            try:
                if subprocess.run(cmd, capture_output=True).returncode == 0:
                    break
            except FileNotFoundError:
                continue
        p.send_signal(signal.SIGTERM)
        try:
            p.wait(20)
        except subprocess.TimeoutExpired:
            p.kill()
        os.rmdir(mnt)


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--serve":
        src, mnt, mode, rate, pushers = sys.argv[2:7]
        serve(src, mnt, mode, float(rate) * 1e9, int(pushers))
        return
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--gib", type=float, default=1.7)
    ap.add_argument("--rates", default="1.5,3,0",
                    help="GB/s at which the bytes land (0: all there at the open)")
    ap.add_argument("--pushers", type=int, default=2)
    ap.add_argument("--modes", default="whole,push,stream")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--work", help="folder of the disk file and the mount points")
    a = ap.parse_args()
    import io
    import torch
    data = checkpoint(a.gib)
    want = torch.load(io.BytesIO(data), weights_only=True)
    shm = tempfile.mkdtemp(dir="/dev/shm", prefix="s4fs-push-")
    work = tempfile.mkdtemp(dir=a.work, prefix="s4fs-push-")
    try:
        src = os.path.join(shm, "ckpt.pt")
        with open(src, "wb") as f:
            f.write(data)
        disk = os.path.join(work, "ckpt.pt")
        with open(disk, "wb") as f:
            f.write(data)
        rows = []
        cold = []
        for _ in range(a.repeat):
            drop_caches()
            cold.append(timed_load(disk, want))
        warm = [timed_load(disk, want) for _ in range(a.repeat)]
        rows.append(("local disk, cold", "-", cold))
        rows.append(("local disk, page cache", "-", warm))
        for rate in [float(r) for r in a.rates.split(",")]:
            if rate:
                rows.append((f"bytes landing alone at {rate:g} GB/s", f"{rate:g}",
                             [len(data) / (rate * 1e9)]))
            for mode in a.modes.split(","):
                times = []
                for _ in range(a.repeat):
                    drop_caches()
                    times.append(through_mount(src, work, mode, rate, a.pushers, want))
                rows.append((f"{mode}" + (f", {a.pushers} pushers" if mode == "push"
                                          else ""), f"{rate:g}" if rate else "at once",
                             times))
    finally:
        shutil.rmtree(shm, ignore_errors=True)
        shutil.rmtree(work, ignore_errors=True)
    disk_med = statistics.median(cold)
    print(f"# bench/push_floor.py — {os.cpu_count()} cores; {len(data) / 2**30:.2f} GiB "
          f"torch.save (bf16 weights + fp32 AdamW), bytes from /dev/shm; torch.load "
          f"through a bare pyfuse3 mount, median of {a.repeat}; every load checked")
    print("| way | bytes land (GB/s) | torch.load s | ÷ local disk cold | runs |")
    print("|---|---|---:|---:|---|")
    for name, rate, times in rows:
        med = statistics.median(times)
        print(f"| {name} | {rate} | {med:.2f} | {med / disk_med:.2f}x | "
              f"{', '.join(f'{t:.2f}' for t in times)} |")


if __name__ == "__main__":
    main()
