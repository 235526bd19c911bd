"""Running the mount: foreground loop, background start with readiness, unmount."""

from __future__ import annotations

import errno
import logging
import os
import shutil
import signal
import subprocess
import sys
import time

log = logging.getLogger("s4fs.mount")


def is_stale(mountpoint: str) -> bool:
    """True when ``mountpoint`` is a dead FUSE mount (its daemon crashed)."""
    try:
        os.stat(mountpoint)
        return False
    except OSError as exc:
        return exc.errno == errno.ENOTCONN


def unmount(mountpoint: str, *, lazy: bool = False) -> None:
    tool = shutil.which("fusermount3") or shutil.which("fusermount")
    cmd = [tool, "-u"] + (["-z"] if lazy else []) + [mountpoint] if tool else \
        ["umount"] + (["-l"] if lazy else []) + [mountpoint]
    res = subprocess.run(cmd, capture_output=True, text=True)
    if res.returncode != 0:
        raise OSError(errno.EINVAL, f"could not unmount {mountpoint}: "
                      f"{res.stderr.strip() or res.stdout.strip()}")


def _notify(msg: str) -> None:
    """sd_notify without a dependency."""
    addr = os.environ.get("NOTIFY_SOCKET")
    if not addr:
        return
    import socket
    if addr.startswith("@"):
        addr = "\0" + addr[1:]
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as s:
        try:
            s.sendto(msg.encode(), addr)
        except OSError:
            pass


def mount_foreground(fs, mountpoint: str, *, allow_other: bool = False,
                     ready_fd: int | None = None, extra_options=(), workers: int = 16,
                     uid: int | None = None, gid: int | None = None,
                     source: str | None = None) -> None:
    """Mount ``fs`` at ``mountpoint`` and serve until SIGTERM/SIGINT or unmount."""
    import pyfuse3
    import trio

    from ._ops import S4Operations

    if is_stale(mountpoint):
        log.warning("%s is a stale mount (crashed daemon?); cleaning it up", mountpoint)
        unmount(mountpoint, lazy=True)
    ops = S4Operations(fs, workers=workers, uid=uid, gid=gid)
    opts = set(pyfuse3.default_options)
    # the store URL as the mount's source lets `s4fs stat /mnt/s4/x` find the store
    opts.add("fsname=" + (source or fs.store.url).replace(",", "%2C"))
    opts.add("subtype=s4fs")
    if allow_other:
        opts.add("allow_other")
    opts.update(extra_options)
    pyfuse3.init(ops, mountpoint, opts)
    log.info("mounted %s at %s", fs.store.url, mountpoint)

    async def main():
        async with trio.open_nursery() as nursery:
            async def stop_on_signal():
                with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as sigs:
                    async for sig in sigs:
                        log.info("signal %s: unmounting", sig)
                        pyfuse3.terminate()
                        return
            nursery.start_soon(stop_on_signal)
            if ready_fd is not None:
                os.write(ready_fd, b"1")
                os.close(ready_fd)
            _notify("READY=1")
            await pyfuse3.main(min_tasks=8, max_tasks=64)
            nursery.cancel_scope.cancel()

    clean = False
    try:
        trio.run(main)
        clean = True
    finally:
        _notify("STOPPING=1")
        pyfuse3.close(unmount=True)
        fs.close()
        log.info("unmounted %s (%s)", mountpoint, "clean" if clean else "after an error")


def run_daemon(argv: list[str], mountpoint: str, timeout: float = 60.0,
               log_file: str | None = None) -> int:
    """Start ``s4fs mount ... --foreground`` in the background; return once it is mounted
    (0), or with the child's error (non-zero) if it fails first. The daemon's log goes to
    ``log_file`` (its tail is printed when the start fails)."""
    import tempfile
    r, w = os.pipe()
    cmd = [sys.executable, "-m", "s4fs.cli", *argv, "--foreground", "--ready-fd", str(w)]
    if log_file is None:
        fd, log_file = tempfile.mkstemp(prefix="s4fs-mount-", suffix=".log")
        os.close(fd)
    log = open(log_file, "ab")
    child = subprocess.Popen(cmd, pass_fds=(w,), start_new_session=True,
                             stdin=subprocess.DEVNULL, stdout=log, stderr=log)
    log.close()
    os.close(w)
    deadline = time.monotonic() + timeout
    import select
    try:
        while time.monotonic() < deadline:
            ready, _, _ = select.select([r], [], [], 0.2)
            if ready:
                if os.read(r, 1) == b"1":
                    return 0
                break
            if child.poll() is not None:
                break
        code = child.poll()
        if code is None:
            child.terminate()
            print(f"s4fs: mount at {mountpoint} did not become ready in {timeout:.0f}s",
                  file=sys.stderr)
        try:
            with open(log_file, "rb") as f:
                tail = f.read()[-4000:].decode(errors="replace")
        except OSError:
            tail = ""
        print(f"s4fs: mounting {mountpoint} failed; daemon log {log_file}:\n{tail}",
              file=sys.stderr)
        return code or 1
    finally:
        os.close(r)
