"""``s4fs selftest [--device cuda|cpu|auto]``: compress and restore every adversarial data
set (``s4fs.testing.adversarial``) on the chosen device, and across devices where the
formats allow, print a table, and exit non-zero unless every result is bit-exact.

Paths checked (a dash where the device does not apply):

* ``cpu``           CPU encode → CPU decode
* ``gpu``           GPU encode → GPU decode, one chunk at a time (``s4fs.codec`` API)
* ``gpu-batch``     every set in one ``compress_many`` → one ``decompress_many``
* ``cpu→gpu``       CPU encode → GPU decode
* ``portable→cpu``  GPU encode with the portable profile → CPU decode

With ``--mount`` it then checks a real mount (``run_mount``): files of every float
dtype's adversarial sets (as safetensors), their next versions (saved as deltas), random
bytes and, where torch is installed, a ``torch.save`` of a state dict, written through a
mount of a temporary local store (the random bytes once more while a reader holds the
file), read back at once and, after a remount with an empty cache, from the store, every
byte compared; it prints how the mount moved them (FUSE
passthrough, or FUSE requests and why). ``--require-passthrough`` fails where
passthrough was not used.

This is the image build gate of the deployment: it must pass on the GPU image.
"""

from __future__ import annotations

import argparse
import sys
import time

from s4fs.errors import S4Error


def _cases(n_random: int):
    from s4fs.testing import adversarial as A
    rows = [(name, dt, data, None) for name, dt, data in A.all_cases(n_random=n_random)]
    return rows + list(A.delta_cases())


def _check(fn, data: bytes) -> tuple[bool, str]:
    try:
        blob, out = fn()
    except S4Error as exc:
        return False, f"{type(exc).__name__}: {exc}"
    if bytes(out) != data:
        return False, "bytes differ"
    if not data:
        return True, f"{len(blob)} B"
    return True, f"{100 * len(blob) / len(data):.1f}%"


def run(device: str, n_random: int = 1_000_000, out=sys.stdout) -> int:
    from s4fs.codec import compress, decompress, lookup, resolve_device

    try:
        device = resolve_device(device)
    except S4Error as exc:
        print(f"selftest: {exc}", file=out)
        return 2
    cases = _cases(n_random)
    paths = ["cpu"] + (["gpu", "gpu-batch", "cpu→gpu", "portable→cpu"] if device == "cuda" else [])
    results: dict[str, list[tuple[bool, str]]] = {p: [] for p in paths}
    started = time.perf_counter()

    for name, dt, data, base in cases:
        results["cpu"].append(_check(lambda: _rt(compress(data, dt, base=base, device="cpu"),
                                                 base, "cpu", decompress), data))
    if device == "cuda":
        from s4fs.codec import gpu
        for name, dt, data, base in cases:
            results["gpu"].append(_check(lambda: _rt(compress(data, dt, base=base, device="cuda"),
                                                     base, "cuda", decompress), data))
            results["cpu→gpu"].append(_check(lambda: _rt(compress(data, dt, base=base, device="cpu"),
                                                         base, "cuda", decompress), data))
            results["portable→cpu"].append(_check(lambda: _rt(
                gpu.compress(data, lookup(dt), base=base, profile=gpu.PORTABLE),
                base, "cpu", decompress), data))
        try:
            blobs = gpu.compress_many([(d, t, b) for _, t, d, b in cases])
            outs = gpu.decompress_many(blobs, [b for *_, b in cases])
            for (_, _, data, _), blob, res in zip(cases, blobs, outs):
                results["gpu-batch"].append(_check(lambda: (blob, res), data))
        except S4Error as exc:
            results["gpu-batch"] = [(False, f"{type(exc).__name__}: {exc}")] * len(cases)

    _table(cases, paths, results, out)
    ok = all(r[0] for rs in results.values() for r in rs)
    total = sum(len(rs) for rs in results.values())
    bad = sum(not r[0] for rs in results.values() for r in rs)
    print(f"\n{total - bad}/{total} round trips bit-exact on device={device} "
          f"in {time.perf_counter() - started:.1f} s: {'PASS' if ok else 'FAIL'}", file=out)
    return 0 if ok else 1


def _rt(blob, base, device, decompress):
    return blob, decompress(blob, base=base, device=device)


def _table(cases, paths, results, out) -> None:
    head = ["data set", "dtype", "bytes"] + paths
    rows = []
    for i, (name, dt, data, base) in enumerate(cases):
        label = name + (" (delta)" if base is not None else "")
        cells = []
        for p in paths:
            ok, note = results[p][i]
            cells.append(("ok " + note) if ok else ("FAIL " + note[:60]))
        rows.append([label, dt, str(len(data))] + cells)
    _print_table(head, rows, out)
    for p in paths:
        for i, (ok, note) in enumerate(results[p]):
            if not ok:
                print(f"FAIL {p} {cases[i][0]}: {note}", file=out)


def _print_table(head: list[str], rows: list[list[str]], out) -> None:
    """A Markdown table, its columns as wide as their widest cell."""
    widths = [max(len(r[k]) for r in rows + [head]) for k in range(len(head))]
    line = lambda r: "| " + " | ".join(c.ljust(w) for c, w in zip(r, widths)) + " |"
    print(line(head), file=out)
    print("|" + "|".join("-" * (w + 2) for w in widths) + "|", file=out)
    for r in rows:
        print(line(r), file=out)


# --- a real mount: s4fs selftest --mount ------------------------------------------------

#: the float dtypes the mount check writes, by their safetensors names
_SAFETENSORS_DTYPES = {"float32": "F32", "float64": "F64", "float16": "F16",
                       "bfloat16": "BF16"}


def _safetensors(cases) -> bytes:
    """A safetensors file of the float data sets (whole elements each), one tensor each
    (its header in order)."""
    import json

    from s4fs.codec import lookup
    header, at = {}, 0
    for i, (name, dt, data) in enumerate(cases):
        n = len(data) // lookup(dt).itemsize
        header[f"t{i:02d}"] = {"dtype": _SAFETENSORS_DTYPES[dt], "shape": [n],
                               "data_offsets": [at, at + len(data)]}
        at += len(data)
    head = json.dumps(header, separators=(",", ":")).encode()
    head += b" " * (-len(head) % 8)
    return len(head).to_bytes(8, "little") + head + b"".join(d for *_, d in cases)


def _mount_files(mib: int) -> list[tuple[str, list[bytes]]]:
    """What the mount check writes: each file's versions, in order. The float sets as
    safetensors, then again with every tensor nudged (saved as a delta against the
    first), random bytes (stored as they are) rewritten in the middle, and, where torch
    is installed, a torch.save'd state dict of two versions."""
    import io

    import numpy as np

    from s4fs.codec import lookup
    from s4fs.testing import adversarial as A
    n = max(1, mib) << 20
    floats = []                                    # whole elements of each float set
    for name, dt, data in A.all_cases(n_random=n // 16):
        if dt in _SAFETENSORS_DTYPES:
            size = lookup(dt).itemsize
            floats.append((name, dt, data[:len(data) // size * size]))
    first = _safetensors(floats)
    rng = np.random.default_rng(1)
    nudged = []
    for name, dt, data in floats:
        words = np.frombuffer(data, dtype=f"u{lookup(dt).itemsize}").copy()
        flip = rng.random(len(words)) < 0.3           # a training step's sparse changes
        words[flip] ^= 1
        nudged.append((name, dt, words.tobytes()))
    noise = rng.bytes(n // 4)
    files = [("tensors.safetensors", [first, _safetensors(nudged)]),
             ("random.bin", [noise, noise[:len(noise) // 3] + rng.bytes(4096) +
                             noise[len(noise) // 3 + 4096:]])]
    try:
        import torch
    except ImportError:
        return files
    g = torch.Generator().manual_seed(2)
    sd = {f"layer{i}.weight": torch.randn(256, 256, generator=g) * 0.02 for i in range(8)}
    sd["step"] = 1
    versions = []
    for step in (1, 2):
        sd = {k: (v + torch.randn(v.shape, generator=g) * 1e-4 if torch.is_tensor(v) else
                  step) for k, v in sd.items()}
        sd["half"] = sd["layer0.weight"].to(torch.bfloat16)
        buf = io.BytesIO()
        torch.save(sd, buf)
        versions.append(buf.getvalue())
    return files + [("state.pt", versions)]


def _digest(path: str) -> tuple[str, float]:
    import hashlib
    t0 = time.perf_counter()
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest(), time.perf_counter() - t0


def run_mount(mib: int = 16, require_passthrough: bool = False, workdir: str | None = None,
              mount_args=(), out=None) -> int:
    """Mount a local store in a temporary folder (``s4fs mount`` with ``mount_args``),
    write every file of :func:`_mount_files` through it version after version,
    read each back at once (the bytes just written; one file also overwritten while a
    reader holds it), then after a remount with an empty cache (every byte decoded from
    the store), and compare every byte; print how the mount
    moved the bytes. 0: all came back exactly (and through FUSE passthrough, where
    ``require_passthrough``); 1: a byte differed, or a read failed; 2: the mount could
    not be had; 3: passthrough was required and not used (the reason printed)."""
    import shutil
    import tempfile

    out = out or sys.stdout
    work = tempfile.mkdtemp(prefix="s4fs-selftest-", dir=workdir)
    check = _MountCheck(work, mount_args, _mount_files(mib))
    problem = check.run(check.mount)
    if problem:
        shutil.rmtree(work, ignore_errors=True)
        print(f"selftest --mount: the mount failed: {problem}", file=out)
        return 2
    try:
        check.write_and_read()
        check.remount_and_read()
    finally:
        if check.mounted:
            check.run(check.cli + ["umount", check.mnt], timeout=300)
        shutil.rmtree(work, ignore_errors=True)
    return check.report(out, require_passthrough)


class _MountCheck:
    """One run of the mount selftest in ``work``: the commands, what each file read
    back, what failed, and what the mount said of itself."""

    def __init__(self, work: str, mount_args, files) -> None:
        import os
        self.store, self.mnt, cache = (os.path.join(work, d)
                                       for d in ("store", "mnt", "cache"))
        os.makedirs(self.mnt)
        self.cli = [sys.executable, "-m", "s4fs.cli"]
        self.mount = self.cli + ["mount", self.store, self.mnt, "--cache-dir", cache,
                                 *mount_args]
        # the second mount starts with an empty cache: every byte it reads is decoded
        # from the store
        self.remount = [a if a != cache else cache + "-fresh" for a in self.mount]
        self.files = files
        self.rows: list[list[str]] = []
        self.failures: list[str] = []
        self.stored: dict[str, int] = {}
        self.status: dict = {}
        self.mounted = True

    @staticmethod
    def run(cmd, timeout=180) -> str | None:
        """``cmd`` (the CLI); None, or what it said when it failed."""
        import subprocess
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
        return None if r.returncode == 0 else (r.stderr or r.stdout).strip()

    def check(self, name, label, data, write) -> None:
        """Write ``data`` to ``name`` (where ``write``), read it back, keep a row."""
        import hashlib
        import os
        path = os.path.join(self.mnt, name)
        wrote = "–"
        try:
            if write:
                t0 = time.perf_counter()
                with open(path, "wb") as f:
                    f.write(data)
                wrote = f"{time.perf_counter() - t0:.3f}"
            got, took = _digest(path)
            ok, read = got == hashlib.sha256(data).hexdigest(), f"{took:.3f}"
            why = "the bytes read back differ"
        except OSError as exc:
            ok, read, why = False, "–", f"{type(exc).__name__}: {exc}"
        if not ok:
            self.failures.append(f"{name} ({label}): {why}")
        self.rows.append([name, label, str(len(data)), wrote, read,
                          "ok" if ok else "FAIL"])

    def write_and_read(self) -> None:
        """Every version of every file, then an overwrite under a held reader; the
        mount's status and what each file stored."""
        import json
        import os
        import subprocess

        from s4fs.control import request
        for name, versions in self.files:
            for v, data in enumerate(versions, 1):
                self.check(name, f"{v}", data, write=True)
        # a reader holds the file while it is overwritten: every later open must read
        # the new bytes, never the pages of the version the reader held
        held, versions = self.files[1]
        newer = os.urandom(len(versions[-1]))
        try:
            with open(os.path.join(self.mnt, held), "rb") as reader:
                reader.read()                      # its pages in the kernel's cache
                self.check(held, f"{len(versions) + 1}, over a held reader", newer,
                           write=True)
        except OSError as exc:
            self.failures.append(f"{held} (a held reader): {type(exc).__name__}: {exc}")
        versions.append(newer)
        self.check(held, f"{len(versions)}, the reader gone", newer, write=False)
        try:
            self.status = request(self.mnt, "status", wait=30)
        except (S4Error, OSError, RuntimeError) as exc:    # no answer: say so, go on
            self.failures.append(f"the mount's status: {exc}")
        for name, _ in self.files:
            st = subprocess.run(self.cli + ["stat", "--json", os.path.join(self.mnt, name)],
                                capture_output=True, text=True, timeout=60)
            if st.returncode == 0:
                self.stored[name] = json.loads(st.stdout)["stored"]

    def remount_and_read(self) -> None:
        """Unmount, mount again with an empty cache, read every file's last version."""
        problem = self.run(self.cli + ["umount", self.mnt], timeout=300)
        self.mounted = problem is not None
        if problem is None:
            problem = self.run(self.remount)
            self.mounted = problem is None
        if problem is not None:
            self.failures.append(f"unmounting and mounting again: {problem}")
            return
        for name, versions in self.files:
            self.check(name, f"{len(versions)}, from the store", versions[-1],
                       write=False)

    def report(self, out, require_passthrough: bool) -> int:
        """Print the table and the verdict; the exit status of :func:`run_mount`."""
        _print_table(["file", "version", "bytes", "write s", "read s", "bytes back"],
                     self.rows, out)
        for name, versions in self.files:
            if self.stored.get(name) is not None:
                n, stored = len(versions[-1]), self.stored[name]
                print(f"{name}: {n} bytes, {stored} stored "
                      f"({100 * stored / max(1, n):.1f} %)", file=out)
        print(f"how the bytes went: {self.status.get('transport', 'FUSE requests')}",
              file=out)
        for f in self.failures:
            print(f"FAIL {f}", file=out)
        if self.failures:
            print("mount selftest: FAIL", file=out)
            return 1
        if require_passthrough and not self.status.get("passthrough"):
            print("mount selftest: every byte came back, but not through FUSE "
                  "passthrough (--require-passthrough): see why above", file=out)
            return 3
        print("mount selftest: every byte came back exactly: PASS", file=out)
        return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="s4fs selftest",
        description="bit-exact compress/restore of every adversarial data set; "
                    "exits 1 unless all pass, 2 when the device (or with --mount, the "
                    "mount) is unavailable, 3 when --require-passthrough is not met")
    from s4fs.codec import DEVICES
    parser.add_argument("--device", choices=DEVICES, default="auto")
    parser.add_argument("--random-size", type=int, default=1_000_000,
                        help="elements in the random data sets (default 1000000)")
    parser.add_argument("--mount", action="store_true",
                        help="then mount a local store in a temporary folder (as root, or "
                             "with fusermount3) and check every byte written through it, "
                             "read back at once and from the store after a remount; says "
                             "whether the kernel moved them by FUSE passthrough")
    parser.add_argument("--require-passthrough", action="store_true",
                        help="with --mount: fail (exit 3) unless the mount used FUSE "
                             "passthrough (an image build's check)")
    parser.add_argument("--mount-mib", type=int, default=16, metavar="MIB",
                        help="with --mount: MiB of random values in the float sets "
                             "(a quarter of it as random bytes; default 16)")
    parser.add_argument("--mount-arg", action="append", default=[], metavar="ARG",
                        help="with --mount: an option for its `s4fs mount`, e.g. "
                             "--mount-arg=--writeback (repeat for more)")
    parser.add_argument("--dir", default=None,
                        help="with --mount: where the temporary store and mountpoint go "
                             "(default: the system's temporary folder)")
    args = parser.parse_args(argv)
    if args.require_passthrough and not args.mount:
        parser.error("--require-passthrough checks the mount: add --mount")
    status = run(args.device, args.random_size)
    if args.mount and status != 2:
        print(file=sys.stdout)
        status = run_mount(args.mount_mib, args.require_passthrough, args.dir,
                           args.mount_arg) or status
    return status


if __name__ == "__main__":
    sys.exit(main())
