"""A stress reproducer (pytest does not collect it; ``test_coherence`` runs it bounded):
mmap readers of a file that is unlinked and written anew, over and over.

    python tests/mount/stress_mmap_recreate.py [--seconds 150] [--writeback] [--load 2]
        [--kinds recreate,rename] [--after-close] [--local DIR]

Three reader processes keep opening ``c.bin``, mapping it whole, closing the descriptor
and reading the mapping at random places; the writer unlinks ``c.bin`` and writes it
anew (random sizes and write sizes), or writes a temp file and renames it over
(``--kinds recreate,rename``). ``--load N`` runs N busy loops beside it. A reader that
dies of SIGBUS is reported with the inode, the mapping's size, the offset it read and
the writer's op at that moment. ``--local DIR`` runs it on any folder (a local disk, or
another FUSE filesystem mounted there).

What it showed (2026-12-03, Linux 6.18, this 2-core box under two busy loops): a reader
that maps the file *while its writer is still writing it* can die of SIGBUS reading
inside the size it mapped — on s4fs (after 14 to 2227 writer ops), and as well on
libfuse 3.17's own C example ``passthrough_hp --nopassthrough --nocache`` over a tmpfs
(after 449 ops; 14 ops over a disk folder, where it also reuses inode numbers). A local
disk never does (0 in 1703 ops). It is the kernel's FUSE without its writeback cache (the
size the kernel keeps for the inode drops below what it had while the writer extends
the file; s4fs's replies never said a smaller size, traced); ``passthrough_hp`` with its
default options turns the writeback cache on, which is why it looked immune at first.
With ``--after-close`` readers map only a file whose writer has closed it (what
``torch.load(mmap=True)`` of a finished checkpoint does): no SIGBUS on s4fs (2996 ops;
``--writeback --kinds recreate,rename``: 2634 ops) nor on ``passthrough_hp`` (3780 ops).
With ``--writeback --passthrough`` (the kernel maps the spool itself): no SIGBUS in 1534
+ 1126 ops, readers mapping at any time (2026-12-03, recreate and rename).
docs/SEMANTICS.md says what users get.
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


def reader(path, seed, stop, info, opno, keep_open, closed):
    rng = random.Random(seed)
    while not stop.is_set():
        try:
            f = open(path, "rb")
        except FileNotFoundError:
            continue
        except OSError as exc:       # reported, not fatal: the SIGBUS is what we hunt
            print(f"reader {seed}: open failed: {exc!r}", file=sys.stderr, flush=True)
            continue
        with f:
            st = os.fstat(f.fileno())
            if not st.st_size:
                continue
            if closed is not None and [st.st_ino, st.st_size] != closed[:]:
                continue             # only files whose writer has closed them
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


def run(folder, seconds, kinds, keep_open=False, after_close=False):
    path = os.path.join(folder, "c.bin")
    ctx = mp.get_context("spawn")
    stop, opno = ctx.Event(), ctx.Value("q", 0)
    infos = [ctx.Array("q", [0] * 4) for _ in range(3)]
    closed = ctx.Array("q", [0, 0]) if after_close else None
    write_pieces(path, os.urandom(300_000), 65537)
    if closed is not None:
        closed[:] = [os.stat(path).st_ino, 300_000]
    readers = [ctx.Process(target=reader, args=(path, k, stop, infos[k], opno, keep_open,
                                                closed))
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
        ino = os.stat(path).st_ino
        if closed is not None:
            closed[:] = [ino, len(data)]
        log.append((opno.value, kind, len(data), piece, ino))
        time.sleep(0.05)
    stop.set()
    for r in readers:
        r.join(30)
        if r.is_alive():
            r.kill()
    died = 0
    ops = opno.value
    print(f"{ops} ops, reader exit codes {[r.exitcode for r in readers]}")
    for k, r in enumerate(readers):
        if r.exitcode == -7:
            died += 1
            ino, mlen, off, op = infos[k][:]
            print(f"reader {k}: SIGBUS on inode {ino}, mapped {mlen} bytes, read at {off}, "
                  f"writer at op {op}; ops: {[x for x in log if op - 2 <= x[0] <= op + 1]}")
    return ops, died


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seconds", type=float, default=150)
    ap.add_argument("--kinds", default="recreate")
    ap.add_argument("--writeback", action="store_true")
    ap.add_argument("--passthrough", action="store_true",
                    help="with --writeback: mount --passthrough (PYTHONPATH must name a "
                         "pyfuse3 built with it, e.g. .venv/pyfuse3-passthrough/site)")
    ap.add_argument("--load", type=int, default=2, help="busy loops beside it")
    ap.add_argument("--local", help="run on this local folder instead of a mount")
    ap.add_argument("--keep-open", action="store_true",
                    help="readers read the mapping before closing the descriptor")
    ap.add_argument("--after-close", action="store_true",
                    help="readers map only a file whose writer has closed it")
    args = ap.parse_args()
    busy = [subprocess.Popen([sys.executable, "-c", "while True: pass"])
            for _ in range(args.load)]
    try:
        if args.local:
            return 1 if run(args.local, args.seconds, args.kinds.split(","),
                            args.keep_open, args.after_close)[1] else 0
        sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        from mount_helpers import Mount          # the mount tests' own start and stop
        with tempfile.TemporaryDirectory() as work:
            dirs = [os.path.join(work, n) for n in ("store", "mnt", "cache")]
            for d in dirs:
                os.mkdir(d)
            extra = ("--writeback",) if args.writeback else ()
            extra += ("--passthrough",) if args.passthrough else ()
            m = Mount(*dirs, extra=extra)
            m.start()
            try:
                return 1 if run(m.path, args.seconds, args.kinds.split(","),
                                args.keep_open, args.after_close)[1] else 0
            finally:
                m.stop()
    finally:
        for b in busy:
            b.kill()


if __name__ == "__main__":
    sys.exit(main())
