"""The mount's control socket: ``s4fs status`` and ``s4fs sync`` talk to a running mount.

The daemon serves one Unix stream socket per mountpoint (only root and the daemon's user
can connect: mode 0600), at :func:`socket_path`. A request is one JSON line, the answer one
JSON line::

    {"op": "status"}                 -> {"mountpoint", "store", "writeback", "transport",
                                         "pending": [...]}
    {"op": "sync", "timeout": 600}   -> {"failed": [{"path", "bytes", "attempts", "error"}]}

``transport`` says how the mount moves bytes (FUSE passthrough, or FUSE requests and why);
``pending`` lists files accepted but not yet committed (``--writeback``), with how often
their commit failed and the last error.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import socket
import socketserver
import tempfile
import threading

from s4fs.errors import NotFound

log = logging.getLogger("s4fs.control")


def socket_path(mountpoint: str) -> str:
    mp = os.path.realpath(mountpoint)
    name = "ctl-" + hashlib.sha256(mp.encode()).hexdigest()[:16] + ".sock"
    for folder in ("/run/s4fs", os.path.join(tempfile.gettempdir(), f"s4fs-{os.getuid()}")):
        try:
            os.makedirs(folder, mode=0o700, exist_ok=True)
            if os.access(folder, os.W_OK):
                return os.path.join(folder, name)
        except OSError:
            continue
    raise OSError(f"no folder for the control socket of {mp}")


class ControlServer:
    def __init__(self, fs, mountpoint: str, info: dict | None = None) -> None:
        self.fs = fs
        self.info = info if info is not None else {}   # the mount's own, kept up to date
        self.mountpoint = os.path.realpath(mountpoint)
        self.path = socket_path(mountpoint)
        try:
            os.unlink(self.path)
        except FileNotFoundError:
            pass
        server = self

        class Handler(socketserver.StreamRequestHandler):
            def handle(self):
                try:
                    req = json.loads(self.rfile.readline() or b"{}")
                    answer = server.answer(req)
                except Exception as exc:          # a bad request never kills the mount
                    log.exception("control request failed")
                    answer = {"error": str(exc)}
                self.wfile.write(json.dumps(answer).encode() + b"\n")

        old = os.umask(0o177)
        try:
            self._server = socketserver.ThreadingUnixStreamServer(self.path, Handler)
        finally:
            os.umask(old)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever,
                                        name="s4fs-control", daemon=True)
        self._thread.start()

    def answer(self, req: dict) -> dict:
        op = req.get("op")
        if op == "status":
            return {"mountpoint": self.mountpoint, "store": self.fs.store.url,
                    "writeback": self.fs.cfg.writeback, **self.info,
                    "pending": self.fs.pending()}
        if op == "sync":
            t = req.get("timeout")
            return {"failed": self.fs.sync(None if t is None else float(t))}
        return {"error": f"unknown request {op!r}"}

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        try:
            os.unlink(self.path)
        except FileNotFoundError:
            pass


def request(mountpoint: str, op: str, *, wait: float | None = None, **fields) -> dict:
    """Ask the mount at ``mountpoint`` (waiting at most ``wait`` seconds for the answer;
    None: as long as it takes); NotFound when no s4fs mount answers there."""
    path = socket_path(mountpoint)
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(wait)
    try:
        s.connect(path)
    except (FileNotFoundError, ConnectionRefusedError):
        s.close()
        raise NotFound(f"no s4fs mount answers at {mountpoint} (is it mounted, and by this "
                       f"machine's s4fs?)") from None
    with s:
        s.sendall(json.dumps({"op": op, **fields}).encode() + b"\n")
        buf = b""
        while not buf.endswith(b"\n"):
            more = s.recv(65536)
            if not more:
                break
            buf += more
    answer = json.loads(buf or b"{}")
    if "error" in answer:
        raise RuntimeError(f"the mount at {mountpoint} answered: {answer['error']}")
    return answer
