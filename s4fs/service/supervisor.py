"""Starting, watching and stopping the mount daemon; telling systemd about it.

The runner starts ``s4fs mount STORE MOUNTPOINT --foreground ...`` as a child process
(same user, same cgroup) and considers it up once an s4fs FUSE mount sits on the
mountpoint and answers ``statvfs``. Stopping unmounts with ``fusermount3 -u``; while files
are still open that fails with EBUSY, so it retries for a few seconds, then detaches the
mount lazily (``-u -z``: open files keep working until closed, new opens fail) and waits
for the daemon to finish writing and exit.
"""

from __future__ import annotations

import errno
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time

from s4fs.errors import S4Error

from .health import mount_entry, mount_probe

log = logging.getLogger(__name__)


class MountError(S4Error):
    """The mount did not come up, or went away."""


def sd_notify(*lines: str) -> bool:
    """Send ``lines`` to systemd's notification socket (``$NOTIFY_SOCKET``), if any."""
    addr = os.environ.get("NOTIFY_SOCKET")
    if not addr:
        return False
    if addr.startswith("@"):                 # abstract namespace
        addr = "\0" + addr[1:]
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as s:
            s.sendto("\n".join(lines).encode(), addr)
        return True
    except OSError as exc:
        log.warning("could not notify systemd via %s: %s", addr, exc)
        return False


def _fusermount() -> list[str]:
    tool = shutil.which("fusermount3") or shutil.which("fusermount")
    return [tool] if tool else []


def unmount(mountpoint: str, *, lazy: bool = False) -> tuple[bool, str]:
    """``fusermount3 -u [-z] MOUNTPOINT``; returns (ok, what it said)."""
    tool = _fusermount()
    cmd = (tool + ["-u"] + (["-z"] if lazy else []) if tool
           else ["umount"] + (["-l"] if lazy else [])) + [mountpoint]
    try:
        res = subprocess.run(cmd, capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return False, str(exc)
    return res.returncode == 0, (res.stderr or res.stdout).strip()


def mount_state(mountpoint: str, timeout_s: float = 5.0) -> tuple[bool, str]:
    """(up, why): up when an s4fs FUSE mount is at ``mountpoint`` and answers statvfs
    within ``timeout_s`` (the probe runs in a thread, so a hung daemon cannot block)."""
    box: list = []

    def probe():
        try:
            box.append((True, mount_probe(mountpoint)()))
        except Exception as exc:
            box.append((False, str(exc)))
    t = threading.Thread(target=probe, daemon=True, name="s4fs-mount-probe")
    t.start()
    t.join(timeout_s)
    return box[0] if box else (False, f"{mountpoint} did not answer statvfs in {timeout_s:.0f} s")


def is_stale(mountpoint: str) -> bool:
    """A FUSE mount whose daemon is gone: listed in mountinfo, ENOTCONN on stat."""
    if mount_entry(mountpoint) is None:
        return False
    try:
        os.statvfs(mountpoint)
        return False
    except OSError as exc:
        return exc.errno == errno.ENOTCONN


class MountProcess:
    """One ``s4fs mount`` child and the mountpoint it serves."""

    def __init__(self, argv: list[str], mountpoint: str, env: dict[str, str]) -> None:
        self.argv = list(argv)
        self.mountpoint = mountpoint
        self.env = env
        self.proc: subprocess.Popen | None = None

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc else None

    def exited(self) -> int | None:
        """The child's exit status once it has exited, else None."""
        return None if self.proc is None else self.proc.poll()

    def start(self) -> None:
        for _ in range(8):                 # dead mounts may be stacked: clear them all
            if not is_stale(self.mountpoint):
                break
            log.warning("%s is a dead FUSE mount left by a crashed daemon; detaching it",
                        self.mountpoint)
            ok, said = unmount(self.mountpoint, lazy=True)
            if not ok:
                raise MountError(f"cannot clear the dead mount at {self.mountpoint}: {said}")
        if mount_entry(self.mountpoint) is not None:
            raise MountError(f"{self.mountpoint} is already mounted by something else; unmount "
                             "it, or set [runner] manage_mount = false to use that mount")
        if not os.path.isdir(self.mountpoint):
            raise MountError(f"mountpoint {self.mountpoint} is not a directory; create it "
                             "(deploy/install.sh does, owned by the s4fs user)")
        log.info("starting the mount: %s", " ".join(self.argv))
        # its own session: a terminal's Ctrl-C reaches the runner only, which unmounts
        self.proc = subprocess.Popen(self.argv, env=self.env, stdin=subprocess.DEVNULL,
                                     start_new_session=True)

    def wait_up(self, timeout_s: float, stop: threading.Event) -> str:
        """Block until the mount answers; MountError if the child exits, time runs out or
        ``stop`` is set first."""
        deadline = time.monotonic() + timeout_s
        why = "not started"
        while True:
            code = self.exited()
            if code is not None:
                raise MountError(f"the mount daemon exited with status {code} before "
                                 f"{self.mountpoint} was mounted (its log is above)")
            if mount_entry(self.mountpoint) is not None:
                up, why = mount_state(self.mountpoint, timeout_s=max(0.5, deadline - time.monotonic()))
                if up:
                    return why
            if time.monotonic() >= deadline:
                raise MountError(f"{self.mountpoint} was not mounted within {timeout_s:.0f} s "
                                 f"({why}); raise [runner] mount_timeout_s if the store is slow")
            if stop.wait(0.1):
                raise MountError("stop requested while waiting for the mount")

    def stop(self, timeout_s: float) -> bool:
        """Unmount and wait for the daemon to exit; True when both happened cleanly.
        Does nothing unless this object started a daemon: a mount someone else made at
        the mountpoint is never touched."""
        if self.proc is None:
            return True
        clean = True
        if mount_entry(self.mountpoint) is not None:
            deadline = time.monotonic() + min(5.0, timeout_s)
            while True:
                ok, said = unmount(self.mountpoint)
                if ok or mount_entry(self.mountpoint) is None:
                    log.info("unmounted %s", self.mountpoint)
                    break
                if time.monotonic() >= deadline:
                    log.warning("%s is busy (%s); detaching it lazily: open files stay "
                                "usable until closed", self.mountpoint, said)
                    ok, said = unmount(self.mountpoint, lazy=True)
                    if not ok:
                        log.error("could not unmount %s: %s", self.mountpoint, said)
                        clean = False
                    break
                time.sleep(0.25)
        try:
            code = self.proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            log.error("the mount daemon (pid %d) did not exit %.0f s after the unmount; "
                      "sending SIGTERM", self.proc.pid, timeout_s)
            self._signal(signal.SIGTERM)
            try:
                code = self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                log.error("killing the mount daemon (pid %d)", self.proc.pid)
                self._signal(signal.SIGKILL)
                code = self.proc.wait()
            clean = False
        if code != 0:
            log.warning("the mount daemon exited with status %s", code)
        return clean and code == 0

    def _signal(self, sig: int) -> None:
        try:
            self.proc.send_signal(sig)
        except ProcessLookupError:
            pass


def mount_argv(cfg) -> list[str]:
    """The command that mounts ``cfg.store`` on ``cfg.mountpoint`` (see ``s4fs mount``)."""
    if cfg.runner.mount_command:
        return list(cfg.runner.mount_command)
    return [sys.executable, "-m", "s4fs.cli", "mount", cfg.store, cfg.mountpoint,
            "--foreground", *cfg.mount_flags()]
