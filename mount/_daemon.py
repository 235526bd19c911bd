"""Running the mount: foreground loop, background start with readiness, unmount.

Before mounting, the mountpoint is checked in :func:`prepare_mountpoint`: a FUSE mount
already there is found in ``/proc/self/mountinfo`` (reading it never calls into a
filesystem) and probed with ``statvfs``, which the kernel always sends to the daemon —
``stat`` does not: for up to the attribute timeout after a daemon dies, the kernel still
answers it from its cache. A dead mount (``ENOTCONN``) is detached lazily, every one of
them when crashed daemons left several stacked; a mount that answers is refused, so two
mounts never stack on one mountpoint.
"""

from __future__ import annotations

import errno
import logging
import os
import shutil
import signal
import subprocess
import sys
import threading
import time

from s4fs.errors import Busy, InvalidArgument
from s4fs.mtab import SUBTYPE, fsname_option, mounts_at

log = logging.getLogger("s4fs.mount")

#: how long a FUSE mount found at the mountpoint has to answer statvfs
PROBE_TIMEOUT_S = 5.0


READAHEAD_KB = 16384
MAX_BACKGROUND = 64          # read-ahead requests the kernel keeps in flight (its own: 12)
FUSECTL = "/sys/fs/fuse/connections"
CPU_WARM_SECONDS = 10.0      # at most this long for the CPU workers to start
GPU_WARM_SECONDS = 120.0     # at most this long for the GPU worker to load its codec
INIT_WAIT_SECONDS = 10.0     # at most this long for the kernel's INIT before reporting ready


def _raise_readahead(mountpoint: str, kb: int = READAHEAD_KB) -> None:
    """Let the kernel read ahead far (and so send READs of up to 1 MiB, not 128 KiB):
    torch.load reads storages whole, and every request costs a trip through Python.
    The FUSE connection's backing device is named in mountinfo (no stat of ourselves)."""
    top = mounts_at(mountpoint)
    if not top:
        return
    path = f"/sys/class/bdi/{top[-1].device}/read_ahead_kb"
    try:
        with open(path, "w") as f:
            f.write(str(kb))
    except OSError as exc:                     # not root, or no sysfs: keep the default
        log.info("could not raise read-ahead (%s): %s", path, exc)


def _raise_background(mountpoint: str, n: int = MAX_BACKGROUND) -> None:
    """Let the kernel keep ``n`` read-ahead requests in flight to the daemon, not 12: a
    file read through FUSE requests (no passthrough) from a cold local copy waits on a
    disk read per request, and 12 never fill the 16 MiB read-ahead window
    (docs/BENCHMARKS.md §13).
    The knob is in the fusectl filesystem, which systemd mounts at boot; a container
    often has it unmounted, and root mounts it (once, for every FUSE mount after)."""
    top = mounts_at(mountpoint)
    if not top:
        return
    conn = os.path.join(FUSECTL, top[-1].device.partition(":")[2])
    try:
        if not os.path.isdir(conn) and os.path.isdir(FUSECTL) and \
                not os.path.ismount(FUSECTL) and os.geteuid() == 0:
            subprocess.run(["mount", "-t", "fusectl", "fusectl", FUSECTL], check=True,
                           capture_output=True, timeout=10)
            log.info("mounted fusectl on %s (FUSE connection limits)", FUSECTL)
        # the threshold above which the kernel reports the connection congested
        # (read-ahead then stops queueing): three quarters, as the kernel's defaults
        for name, value in (("max_background", n), ("congestion_threshold", n * 3 // 4)):
            with open(os.path.join(conn, name), "w") as f:
                f.write(str(value))
    except (OSError, subprocess.SubprocessError) as exc:   # not root, no fusectl: as is
        log.info("could not raise the FUSE connection's background requests (%s): %s",
                 conn, exc)


def raise_kernel_limits(mountpoint: str) -> None:
    """The FUSE connection's limits a checkpoint needs (read-ahead, reads in flight),
    raised where this process may: the mount calls it once INIT is answered, and
    bench/mount.py on its FUSE floor, so that the floor is the same transport."""
    _raise_readahead(mountpoint)
    _raise_background(mountpoint)


def _probe(mountpoint: str, timeout: float) -> OSError | None:
    """statvfs ``mountpoint`` in a thread: None when it answers, the error it raised,
    or TimeoutError when it does not answer within ``timeout`` (a hung daemon)."""
    box: list = []

    def probe():
        try:
            os.statvfs(mountpoint)
            box.append(None)
        except OSError as exc:
            box.append(exc)
    t = threading.Thread(target=probe, daemon=True, name="s4fs-mount-probe")
    t.start()
    t.join(timeout)
    return box[0] if box else TimeoutError(errno.ETIMEDOUT, f"no answer in {timeout:g} s")


def prepare_mountpoint(mountpoint: str, *, probe_timeout: float = PROBE_TIMEOUT_S) -> None:
    """Make ``mountpoint`` ready to mount on: detach every dead FUSE mount stacked there;
    raise :class:`Busy` when a FUSE mount there is alive (or hangs). Other kinds of
    mount (a tmpfs or a container volume at the mountpoint) are left alone."""
    detached: set[int] = set()
    while True:
        entries = mounts_at(mountpoint)
        if not entries or not entries[-1].is_fuse:
            return
        top = entries[-1]
        what = f"{top.fstype} from {top.source or '?'}"
        exc = _probe(mountpoint, probe_timeout)
        if exc is None or exc.errno not in (errno.ENOTCONN, errno.ETIMEDOUT):
            raise Busy(f"{mountpoint} is already mounted ({what}); unmount it first "
                       f"(s4fs umount {mountpoint}), or choose another mountpoint")
        if exc.errno == errno.ETIMEDOUT:
            raise Busy(f"{mountpoint} is already mounted ({what}) but its daemon did not "
                       f"answer in {probe_timeout:g} s; if it is stuck, detach it with "
                       f"s4fs umount --lazy {mountpoint}, then mount again")
        if top.mount_id in detached:
            raise Busy(f"the dead mount at {mountpoint} ({what}) is still there after a "
                       f"lazy unmount; detach it by hand: umount -l {mountpoint}")
        log.warning("%s is a dead FUSE mount (%s; its daemon exited); detaching it",
                    mountpoint, what)
        detached.add(top.mount_id)
        unmount(mountpoint, lazy=True)


def unmount(mountpoint: str, *, lazy: bool = False) -> None:
    tool = shutil.which("fusermount3") or shutil.which("fusermount")
    cmd = [tool, "-u"] + (["-z"] if lazy else []) + [mountpoint] if tool else \
        ["umount"] + (["-l"] if lazy else []) + [mountpoint]
    try:
        res = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    except subprocess.TimeoutExpired:
        raise OSError(errno.ETIMEDOUT, f"could not unmount {mountpoint}: {cmd[0]} did not "
                      "finish in 60 s") from None
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


def passthrough_problem() -> str | None:
    """What FUSE passthrough needs that this machine lacks ("needs ...", for the user), or
    None. The kernel's own answer (Linux >= 6.9, ``CAP_SYS_ADMIN``) comes at the first
    open."""
    import pyfuse3
    if not hasattr(pyfuse3, "get_session_fd"):
        return ("needs pyfuse3 built with FUSE passthrough (`s4fs build-passthrough`, "
                "docs/OPERATING.md); this pyfuse3 cannot hand the kernel a backing file")
    if not has_sys_admin():
        return ("needs CAP_SYS_ADMIN (the kernel registers backing files only for it): run "
                "the mount as root, or grant the service the capability (docs/OPERATING.md)")
    return None


CAP_SYS_ADMIN = 21           # linux/capability.h


def has_sys_admin(status: str = "/proc/self/status") -> bool:
    """Whether this process holds CAP_SYS_ADMIN now (root does; so does a service user
    given it as an ambient capability, the way s4fs-runner's passthrough drop-in does)."""
    try:
        with open(status) as f:
            for line in f:
                if line.startswith("CapEff:"):
                    return bool(int(line.split()[1], 16) >> CAP_SYS_ADMIN & 1)
    except (OSError, ValueError, IndexError):
        pass
    return os.geteuid() == 0


def require_passthrough() -> None:
    """``--passthrough``: refuse the mount, saying why, where passthrough cannot be had."""
    problem = passthrough_problem()
    if problem:
        raise InvalidArgument(f"--passthrough {problem} — mount without --passthrough")


def mount_foreground(fs, mountpoint: str, *, allow_other: bool = False,
                     ready_fd: int | None = None, extra_options=(), workers: int = 16,
                     uid: int | None = None, gid: int | None = None,
                     source: str | None = None, passthrough: str = "auto",
                     info: dict | None = None) -> None:
    """Mount ``fs`` at ``mountpoint`` and serve until SIGTERM/SIGINT or unmount (then
    ``fs`` is closed; its runtime is the caller's to close). ``passthrough``: "on"
    (refused where it cannot be had), "off", or "auto" (on where it can be had; off for
    the whole mount at the kernel's first refusal). ``info``: a dict kept up to date
    with how the mount moves bytes (``transport``: for ``s4fs status``)."""
    import pyfuse3

    from ._ops import S4Operations

    prepare_mountpoint(mountpoint)
    ops = S4Operations(fs, workers=workers, uid=uid, gid=gid, info=info)
    _choose_transport(ops, passthrough)
    _warm_coders(fs)
    opts = set(pyfuse3.default_options)
    # the store URL as the mount's source lets `s4fs stat /mnt/s4/x` find the store
    opts.add(fsname_option(source or fs.store.url))
    opts.add("subtype=" + SUBTYPE)
    if allow_other:
        opts.add("allow_other")
    opts.update(extra_options)
    # FUSE requests are short; background coding threads are not: let a waiting request
    # handler get the interpreter sooner than the default 5 ms
    sys.setswitchinterval(0.001)
    pyfuse3.init(ops, mountpoint, opts)
    log.info("mounted %s at %s", fs.store.url, mountpoint)
    clean = False
    try:
        _serve(mountpoint, ready_fd)
        clean = True
    finally:
        _notify("STOPPING=1")
        pyfuse3.close(unmount=True)
        fs.close()
        log.info("unmounted %s (%s)", mountpoint, "clean" if clean else "after an error")


def _choose_transport(ops, passthrough: str) -> None:
    """Turn FUSE passthrough on (``"on"``, or ``"auto"`` where it can be had) or leave
    the mount on FUSE requests, and say which for ``s4fs status``."""
    if passthrough == "on":
        require_passthrough()
    problem = passthrough_problem() if passthrough == "auto" else None
    if problem:
        log.info("FUSE passthrough off: it %s", problem)
        ops.set_transport(f"FUSE requests (FUSE passthrough off: it {problem})")
    elif passthrough != "off":
        ops.enable_passthrough = True
        ops.passthrough_optional = passthrough == "auto"
        ops.set_transport("FUSE passthrough (the kernel writes files being saved into "
                          "the local spool and reads local copies itself)")
    else:
        ops.set_transport("FUSE requests (--no-passthrough)")


def _warm_coders(fs) -> None:
    """Start the coding worker processes before the mount is ready: the first save
    should not wait for interpreters to start, and a checkpoint loaded right after
    mounting (a job resuming) should not compete with a dozen of them starting (workers
    starting beside a load after a remount slow it down markedly). The GPU worker:
    loading CuPy, nvCOMP and a CUDA context takes seconds, which the first save or cold
    load would otherwise wait for. Either wait is bounded; a worker not up by then goes
    on starting in the background."""
    from s4fs.coding import placement
    ingest = fs.cfg.ingest
    if not ingest.processes:
        return
    coders = fs.runtime.pools.for_ingest(ingest)
    if placement(ingest).gpu:
        coders.warm(timeout=GPU_WARM_SECONDS)
    else:
        starting = threading.Thread(target=coders.warm, daemon=True,
                                    name="s4fs-workers-start")
        starting.start()
        starting.join(CPU_WARM_SECONDS)


def _serve(mountpoint: str, ready_fd: int | None) -> None:
    """Answer FUSE requests until a signal or an unmount; report the mount ready (on
    ``ready_fd`` and to systemd) once the kernel's limits are raised."""
    import pyfuse3
    import trio

    async def stop_on_signal():
        with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as sigs:
            async for sig in sigs:
                log.info("signal %s: unmounting", sig)
                pyfuse3.terminate()
                return

    async def ready_after_init():
        # The kernel caps the connection's read-ahead at 128 KiB when it gets our INIT
        # reply (from inside pyfuse3.main), and a file takes its read-ahead when it is
        # opened. So: wait until INIT is answered (a statfs of the mount returns only
        # then), raise the read-ahead and the reads in flight, and only then report the
        # mount ready. A file opened earlier (a fresh node's first torch.load) would be
        # read in 128 KiB requests all along.
        await trio.to_thread.run_sync(_probe, mountpoint, INIT_WAIT_SECONDS)
        await trio.to_thread.run_sync(raise_kernel_limits, mountpoint)
        if ready_fd is not None:
            os.write(ready_fd, b"1")
            os.close(ready_fd)
        _notify("READY=1")

    async def main():
        async with trio.open_nursery() as nursery:
            nursery.start_soon(stop_on_signal)
            nursery.start_soon(ready_after_init)
            await pyfuse3.main(min_tasks=8, max_tasks=64)
            nursery.cancel_scope.cancel()

    trio.run(main)


def run_daemon(argv: list[str], mountpoint: str, timeout: float = 60.0,
               log_file: str | None = None) -> int:
    """Start ``s4fs mount ... --foreground`` in the background; return once it is mounted
    (0), or with the child's error (non-zero) if it fails first. The daemon's log goes to
    ``log_file`` (its tail is printed when the start fails)."""
    import tempfile
    prepare_mountpoint(mountpoint)          # here too: a refusal is said plainly, at once
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
        code = None
        while time.monotonic() < deadline:
            ready, _, _ = select.select([r], [], [], 0.2)
            if ready:
                if os.read(r, 1) == b"1":
                    return 0
                # the pipe closed unready: the child is exiting (not yet reaped)
                try:
                    code = child.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    pass
                break
            if child.poll() is not None:
                break
        code = child.poll() if code is None else code
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
