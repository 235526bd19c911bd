"""A stress reproducer, not a test (pytest does not collect it): mmap readers of a file
that is unlinked and written anew, over and over, through an s4fs mount.

    python tests/mount/stress_mmap_recreate.py [--seconds 150] [--writeback] [--load 2]

Three reader processes keep opening ``c.bin``, mapping it whole, closing the descriptor
and reading the mapping at random places; the writer unlinks ``c.bin`` and writes it
anew (random sizes and write sizes), or writes a temp file and renames it over
(``--kinds recreate,rename``). ``--load N`` runs N busy loops beside it. A reader that
dies of SIGBUS is reported with the inode, the mapping's size, the offset it read and
the writer's op at that moment. On a local folder (``--local DIR``) no reader ever dies.

On the 2-core box under two busy loops this reproduced a SIGBUS within 14 to 1631
writer ops (2026-12-03, recreate only, default mode), never on a local folder (1703 ops):
always readers of the file just written (mapped during or after its write), faulting
well inside the mapping — once all three readers at once on one inode, so the kernel's
size of that inode dropped. A trace of the daemon showed every reply for that inode
consistent (sizes only grew, reads never failed). Not forgetting the kernel's attributes
at opens (``_forget_attributes`` in mount/_ops.py) gave 2033 clean ops once; forgetting
them only where the open sees a version this mount did not give the kernel still failed
after 1631 ops; without any of the core's page invalidations it failed after 426 ops
(a 5-byte file mapped whole, SIGBUS reading byte 1: the kernel's size had gone to 0);
keep_cache on every open, or the kernel's default read-ahead, or reading the mapping
before closing the descriptor (``--keep-open``): still SIGBUS.
See the closing note of that session.
"""

from __future__ import annotations

import argparse
import mmap
import multiprocessing as mp
import os
import random
import subprocess
import sys
import tempfile
import time


def reader(path, seed, stop, info, opno, keep_open):
    rng = random.Random(seed)
    while not stop.is_set():
        try:
            f = open(path, "rb")
        except FileNotFoundError:
            continue
        with f:
            st = os.fstat(f.fileno())
            if not st.st_size:
                continue
            mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
            if keep_open:            # read while the descriptor is still open
                read_mapping(mm, st, rng, info, opno)
        if not keep_open:            # torch.load(mmap=True): the mapping outlives it
            read_mapping(mm, st, rng, info, opno)


def read_mapping(mm, st, rng, info, opno):
    with mm:
        for _ in range(rng.randint(3, 12)):
            off = rng.randrange(st.st_size)
            n = rng.choice([rng.randint(1, 4096), st.st_size])
            info[:] = [st.st_ino, len(mm), off, opno.value]
            _ = mm[off:off + n]
            time.sleep(rng.random() * 0.02)


def write_pieces(path, data, piece):
    with open(path, "wb") as f:
        for i in range(0, len(data), piece):
            f.write(data[i:i + piece])


def run(folder, seconds, kinds, keep_open=False):
    path = os.path.join(folder, "c.bin")
    ctx = mp.get_context("spawn")
    stop, opno = ctx.Event(), ctx.Value("q", 0)
    infos = [ctx.Array("q", [0] * 4) for _ in range(3)]
    write_pieces(path, os.urandom(300_000), 65537)
    readers = [ctx.Process(target=reader, args=(path, k, stop, infos[k], opno, keep_open))
               for k in range(3)]
    for r in readers:
        r.start()
    rng, t0, log = random.Random(0), time.monotonic(), []
    while time.monotonic() - t0 < seconds and all(r.is_alive() for r in readers):
        data = os.urandom(rng.choice([5, rng.randint(1, 1 << 16), rng.randint(1 << 16, 3 << 19)]))
        piece, kind = rng.choice([4097, 65537, 1 << 20]), rng.choice(kinds)
        opno.value += 1
        if kind == "rename":
            tmp = os.path.join(folder, ".tmp-c.bin")
            write_pieces(tmp, data, piece)
            os.rename(tmp, path)
            os.chmod(path, 0o640)
        else:
            os.unlink(path)
            write_pieces(path, data, piece)
        log.append((opno.value, kind, len(data), piece, os.stat(path).st_ino))
        time.sleep(0.05)
    stop.set()
    for r in readers:
        r.join(30)
        if r.is_alive():
            r.kill()
    died = 0
    print(f"{opno.value} ops, reader exit codes {[r.exitcode for r in readers]}")
    for k, r in enumerate(readers):
        if r.exitcode == -7:
            died += 1
            ino, mlen, off, op = infos[k][:]
            print(f"reader {k}: SIGBUS on inode {ino}, mapped {mlen} bytes, read at {off}, "
                  f"writer at op {op}; ops: {[x for x in log if op - 2 <= x[0] <= op + 1]}")
    return died


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seconds", type=float, default=150)
    ap.add_argument("--kinds", default="recreate")
    ap.add_argument("--writeback", action="store_true")
    ap.add_argument("--load", type=int, default=2, help="busy loops beside it")
    ap.add_argument("--local", help="run on this local folder instead of a mount")
    ap.add_argument("--keep-open", action="store_true",
                    help="readers read the mapping before closing the descriptor")
    args = ap.parse_args()
    busy = [subprocess.Popen([sys.executable, "-c", "while True: pass"])
            for _ in range(args.load)]
    try:
        if args.local:
            return 1 if run(args.local, args.seconds, args.kinds.split(","),
                            args.keep_open) else 0
        sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        from mount_helpers import Mount          # the mount tests' own start and stop
        with tempfile.TemporaryDirectory() as work:
            dirs = [os.path.join(work, n) for n in ("store", "mnt", "cache")]
            for d in dirs:
                os.mkdir(d)
            m = Mount(*dirs, extra=("--writeback",) if args.writeback else ())
            m.start()
            try:
                return 1 if run(m.path, args.seconds, args.kinds.split(","),
                                args.keep_open) else 0
            finally:
                m.stop()
    finally:
        for b in busy:
            b.kill()


if __name__ == "__main__":
    sys.exit(main())
