"""Helpers shared by the benchmarks: timing with medians, and plain-text tables."""

from __future__ import annotations

import os
import platform
import statistics
import subprocess
import sys
import time
from typing import Callable, Sequence


def median_seconds(fn: Callable[[], object], repeat: int, warmup: int = 1) -> tuple[float, object]:
    """Median wall time of ``fn()`` over ``repeat`` runs (after ``warmup`` runs), and the
    last result. Medians, not minima: the benchmark machines are shared and noisy."""
    out = None
    for _ in range(warmup):
        out = fn()
    times = []
    for _ in range(max(1, repeat)):
        t0 = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times), out


def rate(nbytes: int, seconds: float) -> str:
    """Throughput in MB/s (10^6 bytes per second) as a short string."""
    if seconds <= 0:
        return "-"
    mbs = nbytes / seconds / 1e6
    return f"{mbs:,.0f}" if mbs >= 10 else f"{mbs:.1f}"


def pct(part: float, whole: float) -> str:
    return f"{100.0 * part / whole:.2f}" if whole else "-"


def table(header: Sequence[str], rows: Sequence[Sequence[object]], *,
          align: str | None = None) -> str:
    """A Markdown table (also readable as plain text). ``align`` has one letter per
    column: ``l`` or ``r`` (default: first column left, the rest right)."""
    cells = [[str(c) for c in header]] + [[("" if c is None else str(c)) for c in r]
                                          for r in rows]
    ncol = len(header)
    align = align or "l" + "r" * (ncol - 1)
    width = [max(len(r[i]) for r in cells) for i in range(ncol)]

    def line(r):
        parts = [c.ljust(w) if a == "l" else c.rjust(w) for c, w, a in zip(r, width, align)]
        return "| " + " | ".join(parts) + " |"

    sep = "|" + "|".join(("-" * (w + 1) + ":") if a == "r" else ("-" * (w + 2))
                         for w, a in zip(width, align)) + "|"
    return "\n".join([line(cells[0]), sep] + [line(r) for r in cells[1:]])


def machine() -> str:
    """One line describing the machine the numbers were taken on."""
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo", encoding="ascii", errors="replace") as f:
            for ln in f:
                if ln.startswith("model name"):
                    cpu = ln.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    try:
        load = "load %.1f" % os.getloadavg()[0]
    except OSError:
        load = ""
    return f"{os.cpu_count()} cores ({cpu}), Python {platform.python_version()}, {load}"


def machine_cpu() -> float:
    """CPU seconds every process of this machine has used since boot (an S3 server on
    loopback included): /proc/stat's user, nice, system, irq and softirq. Over a span,
    divided by the cores, it is the span's *CPU floor*: the least it could take had its
    work been spread over every core."""
    with open("/proc/stat") as f:
        parts = f.readline().split()
    return sum(int(x) for x in parts[1:4] + parts[6:8]) / os.sysconf("SC_CLK_TCK")


def passthrough_pyfuse3_env() -> dict:
    """The environment of a FUSE daemon that imports the pyfuse3 built with passthrough
    (``S4FS_PYFUSE3_PASSTHROUGH``: its site folder, first on PYTHONPATH)."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([os.environ["S4FS_PYFUSE3_PASSTHROUGH"]]
                                        + ([env["PYTHONPATH"]] if env.get("PYTHONPATH")
                                           else []))
    return env


def start_fuse_daemon(cmd: list, mountpoint: str, env: dict | None = None,
                      timeout: float = 60) -> subprocess.Popen:
    """Start a FUSE daemon that mounts itself at ``mountpoint`` (a floor's: bench's
    _fuse_floor.py or libfuse's passthrough_hp) and return once it is mounted."""
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, env=env)
    deadline = time.monotonic() + timeout
    while not os.path.ismount(mountpoint):
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            raise RuntimeError(f"{' '.join(map(str, cmd))} did not mount {mountpoint}")
        time.sleep(0.05)
    return proc


def stop_fuse_daemon(proc: subprocess.Popen, mountpoint: str, timeout: float = 60) -> None:
    """SIGTERM: the daemon unmounts itself as it exits; ``umount -l`` where it did not
    (``fusermount3`` is not on every machine)."""
    proc.terminate()
    try:
        proc.wait(timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
    if os.path.ismount(mountpoint):
        subprocess.run(["umount", "-l", mountpoint], check=False)


def s4fs_cli(*args: str, timeout: float = 600, env: dict | None = None) -> None:
    """Run ``s4fs ARGS...`` (this interpreter's s4fs); raise with its stderr if it fails."""
    res = subprocess.run([sys.executable, "-m", "s4fs.cli", *args], capture_output=True,
                         text=True, timeout=timeout, env=env)
    if res.returncode:
        raise RuntimeError(f"s4fs {' '.join(args)} failed: {res.stderr.strip()}")


def du(folder: str) -> int:
    """Bytes in the files under ``folder``."""
    return sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(folder)
               for f in fs)
