"""The POSIX test suite pjdfstest on s4fs, beside local disk: test files passed per folder.

    python bench/pjdfstest.py --pjdfstest DIR [--targets s4fs,s4fs-passthrough,local]
                              [--work DIR] [--file-timeout 120]

``DIR`` is a built pjdfstest checkout (https://github.com/pjd/pjdfstest: ``autoreconf
-ifs && ./configure && make pjdfstest``; needs autoconf, automake, gcc and perl's
``prove``). This script installs nothing and is not part of the test suite: pjdfstest
is the yardstick users and other filesystems are measured with, run here as they run it.

Each target is a fresh folder: ``local`` a folder on the disk under ``--work``; ``s4fs``
a fresh ``s4fs mount --allow-other`` of a new local store (FUSE requests,
``--no-passthrough``; pjdfstest acts as other users too);
``s4fs-passthrough`` the same with ``--passthrough`` (skipped, with why, where the
binding or the kernel lacks it). Every ``.t`` file of every folder of ``tests/`` runs
under ``prove`` with the target as its working directory, one at a time, each bounded
by ``--file-timeout`` seconds (a file past it counts as failed). A file passes when
prove says every test in it passed. The table gives, per folder, the files passed out
of the files there, for each target side by side. Needs root (pjdfstest changes owners;
FUSE mounts).
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time


def run_file(pjd: str, test: str, cwd: str, timeout: float) -> bool:
    """Whether every test of the pjdfstest file ``test`` passed in ``cwd``."""
    try:
        r = subprocess.run(["prove", "-Q", os.path.join(pjd, "tests", test)], cwd=cwd,
                           capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return False
    return r.returncode == 0


def files(pjd: str) -> dict[str, list[str]]:
    """The ``.t`` files of each folder of pjdfstest's ``tests/``, by folder."""
    out: dict[str, list[str]] = {}
    root = os.path.join(pjd, "tests")
    for folder in sorted(os.listdir(root)):
        p = os.path.join(root, folder)
        if os.path.isdir(p):
            ts = sorted(f for f in os.listdir(p) if f.endswith(".t"))
            if ts:
                out[folder] = [f"{folder}/{t}" for t in ts]
    return out


class Mount:
    """A fresh ``s4fs mount`` of a new local store under ``work``, unmounted on exit."""

    def __init__(self, work: str, name: str, flags: list[str]) -> None:
        self.path = os.path.join(work, name, "mnt")
        self.store = os.path.join(work, name, "store")
        os.makedirs(self.path)
        cmd = [sys.executable, "-m", "s4fs.cli", "mount", self.store, self.path,
               "--cache-dir", os.path.join(work, name, "cache"), "--allow-other", *flags]
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
        if r.returncode:
            raise RuntimeError((r.stderr or r.stdout).strip())

    def __enter__(self) -> str:
        return self.path

    def __exit__(self, *exc) -> None:
        r = subprocess.run([sys.executable, "-m", "s4fs.cli", "umount", self.path],
                           capture_output=True, timeout=300)
        if r.returncode:
            subprocess.run(["umount", "-l", self.path], capture_output=True)


def run_target(target: str, pjd: str, tests: dict, work: str,
               timeout: float) -> dict[str, int] | str:
    """Files passed per folder on ``target``, or why it could not run."""
    if target == "local":
        where = os.path.join(work, "local")
        os.makedirs(where)
        ctx = None
    else:
        flags = ["--passthrough"] if target == "s4fs-passthrough" else ["--no-passthrough"]
        try:
            ctx = Mount(work, target, flags)
        except (RuntimeError, subprocess.TimeoutExpired) as exc:
            return f"not mounted: {str(exc).splitlines()[-1] if str(exc) else exc}"
        where = ctx.path
    try:
        passed = {}
        for folder, ts in tests.items():
            passed[folder] = sum(run_file(pjd, t, where, timeout) for t in ts)
            print(f"  {target} {folder}: {passed[folder]}/{len(ts)}", flush=True)
        return passed
    finally:
        if ctx is not None:
            ctx.__exit__()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--pjdfstest", required=True, help="a built pjdfstest checkout")
    ap.add_argument("--targets", default="s4fs,s4fs-passthrough,local")
    ap.add_argument("--work", default=None, help="where the folders go (a temp dir)")
    ap.add_argument("--file-timeout", type=float, default=120.0)
    args = ap.parse_args(argv)
    pjd = os.path.abspath(args.pjdfstest)
    if not os.access(os.path.join(pjd, "pjdfstest"), os.X_OK):
        print(f"{pjd}/pjdfstest is not built: autoreconf -ifs && ./configure && "
              f"make pjdfstest there", file=sys.stderr)
        return 2
    if shutil.which("prove") is None:
        print("prove (perl) is missing: apt-get install perl", file=sys.stderr)
        return 2
    tests = files(pjd)
    targets = args.targets.split(",")
    work = tempfile.mkdtemp(prefix="s4fs-pjdfstest-", dir=args.work)
    results: dict[str, dict | str] = {}
    t0 = time.monotonic()
    try:
        for target in targets:
            results[target] = run_target(target, pjd, tests, work, args.file_timeout)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(f"\npjdfstest ({subprocess.run(['git', '-C', pjd, 'rev-parse', '--short', 'HEAD'], capture_output=True, text=True).stdout.strip() or 'unknown'}), "
          f"test files passed per folder ({time.monotonic() - t0:.0f} s)\n")
    print("| folder | files | " + " | ".join(targets) + " |")
    print("|---|---:|" + "---:|" * len(targets))
    total = {t: 0 for t in targets}
    for folder, ts in tests.items():
        cells = []
        for t in targets:
            r = results[t]
            if isinstance(r, str):
                cells.append("–")
            else:
                cells.append(str(r[folder]))
                total[t] += r[folder]
        print(f"| {folder} | {len(ts)} | " + " | ".join(cells) + " |")
    n = sum(len(ts) for ts in tests.values())
    print(f"| **all** | **{n}** | " + " | ".join(
        f"**{total[t]}**" if not isinstance(results[t], str) else "–" for t in targets) + " |")
    for t in targets:
        if isinstance(results[t], str):
            print(f"\n{t}: {results[t]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
