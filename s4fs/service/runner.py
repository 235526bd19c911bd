"""``s4fs runner``: the service that owns the mount on a training machine.

    s4fs runner [--config FILE] [--check-config] [--log-level LEVEL]

In order, and stopping at the first failure with a non-zero status:

1. read the config (``/etc/s4fs/config.toml``, ``$S4FS_CONFIG`` or ``--config``);
2. when ``[marketplace] enabled``: call AWS Marketplace ``RegisterUsage`` — fail-closed,
   nothing else starts unless it succeeds;
3. the codec self-check: a lossless round trip of an adversarial set on the configured
   device;
4. serve ``GET /healthz`` and ``GET /metrics`` (default ``0.0.0.0:8080``);
5. start the mount (``s4fs mount ... --foreground`` as a child) and wait until it answers —
   or, with ``[runner] manage_mount = false``, wait for a mount made by ``mnt-s4.mount``;
6. tell systemd ``READY=1`` (``Type=notify``), then watch the mount daemon: if it exits,
   the runner exits with status 69 and systemd restarts the whole service.

SIGTERM (``systemctl stop``) unmounts cleanly with ``fusermount3 -u`` — waiting while
files are open, then detaching lazily — waits for the daemon to exit and returns 0.

Exit statuses (``RestartPreventExitStatus=`` in the unit lists the permanent ones):
0 stopped cleanly; 69 a transient failure (network, throttling, mount died) — restart;
70 the codec self-check failed; 77 not entitled (Marketplace said no); 78 bad config.
"""

from __future__ import annotations

import argparse
import glob
import logging
import os
import shutil
import signal
import sys
import tempfile
import threading

from s4fs.config import Config, ConfigError, load_config

log = logging.getLogger("s4fs.runner")

EX_OK = 0
EX_UNAVAILABLE = 69     # transient: systemd restarts the service
EX_SOFTWARE = 70        # codec self-check failed
EX_NOPERM = 77          # not entitled
EX_CONFIG = 78          # bad configuration

#: where the daemon of systemd/mnt-s4.mount writes its metrics (Environment= there)
EXTERNAL_METRICS_DIR = "/run/s4fs-mount/metrics"


def main(argv: list[str] | None = None, *, metering_client=None) -> int:
    """Run the service until SIGTERM; returns the exit status (see the module docstring).
    ``metering_client`` replaces the boto3 Marketplace client (tests stub it)."""
    args = _parser().parse_args(argv)
    _setup_logging(args.log_level)
    try:
        cfg = load_config(args.config)
    except ConfigError as exc:
        log.error("refusing to start: %s", exc)
        return EX_CONFIG
    if args.check_config:
        print(describe(cfg))
        return EX_OK
    log.info("s4fs runner starting: %s", describe(cfg))
    return _Runner(cfg, metering_client).run()


def describe(cfg: Config) -> str:
    mp = cfg.marketplace
    market = (f"marketplace product {mp.product_code} (key v{mp.public_key_version}, region "
              f"{mp.region or 'from IMDSv2'})" if mp.enabled else "marketplace off")
    return (f"config {cfg.source or '(built-in defaults)'}: store {cfg.store} on "
            f"{cfg.mountpoint} (cache {cfg.cache_dir}, device {cfg.device}, allow_other "
            f"{str(cfg.allow_other).lower()}, mount "
            f"{'managed by the runner' if cfg.runner.manage_mount else 'made elsewhere'}); "
            f"health on {cfg.health.address}:{cfg.health.port}; {market}")


class _Runner:
    def __init__(self, cfg: Config, metering_client=None) -> None:
        self.cfg = cfg
        self.metering_client = metering_client
        self.stop = threading.Event()
        self.server = None
        self.mount = None
        self._tmp_metrics: str | None = None

    # the steps ---------------------------------------------------------------------

    def run(self) -> int:
        from .health import StateCheck
        from .supervisor import sd_notify

        cfg = self.cfg
        entitlement = StateCheck("entitlement")
        code = self._entitlement(entitlement)
        if code:
            return code
        codec = StateCheck("codec")
        sd_notify("STATUS=codec self-check")
        from . import selfcheck
        result = selfcheck.run(cfg.device)
        if not result.ok:
            log.error("refusing to start: %s", result.detail)
            sd_notify(f"STATUS=codec self-check failed: {result.detail}")
            return EX_SOFTWARE
        log.info("codec self-check: %s", result.detail)
        codec.set(True, result.detail)

        previous = self._install_signal_handlers()
        try:
            return self._serve(codec, entitlement)
        finally:
            self._shutdown()
            for sig, handler in previous.items():
                signal.signal(sig, handler)

    def _entitlement(self, check) -> int:
        from .supervisor import sd_notify
        mp = self.cfg.marketplace
        if not mp.enabled:
            check.set(True, "not required ([marketplace] enabled = false)")
            return 0
        from .entitlement import EntitlementError, register_usage
        sd_notify("STATUS=checking the AWS Marketplace entitlement")
        try:
            reg = register_usage(mp, client=self.metering_client)
        except EntitlementError as exc:
            log.error("refusing to start: %s", exc)
            sd_notify(f"STATUS=not entitled: {exc.code}")
            return EX_UNAVAILABLE if exc.transient else EX_NOPERM
        except Exception as exc:                 # fail closed on anything unforeseen
            log.exception("refusing to start: the Marketplace check failed unexpectedly: %s", exc)
            return EX_UNAVAILABLE
        log.info("entitlement: %s", reg.describe())
        check.set(True, reg.describe())
        return 0

    def _serve(self, codec, entitlement) -> int:
        from s4fs import metrics

        from .health import (Health, HealthServer, ProbeCheck, commits_probe, mount_probe,
                             store_probe)
        from .supervisor import MountError, MountProcess, mount_argv, sd_notify

        cfg = self.cfg
        metrics_dir = self._metrics_dir()
        metrics.serve_directory(metrics_dir)
        health = Health([ProbeCheck("mount", mount_probe(cfg.mountpoint)),
                         ProbeCheck("store", store_probe(cfg.store)),
                         ProbeCheck("commits", commits_probe(cfg.mountpoint)),
                         codec, entitlement])
        try:
            self.server = HealthServer(health, cfg.health.address, cfg.health.port).start()
        except OSError as exc:
            log.error("cannot serve health on %s:%s: %s; free the port or change [health] "
                      "port", cfg.health.address, cfg.health.port, exc)
            return EX_UNAVAILABLE
        log.info("serving /healthz and /metrics on %s:%d", cfg.health.address, self.server.port)

        sd_notify("STATUS=mounting " + cfg.mountpoint)
        try:
            if cfg.runner.manage_mount:
                env = {k: v for k, v in os.environ.items()
                       if k not in ("NOTIFY_SOCKET", "WATCHDOG_USEC", "WATCHDOG_PID")}
                env[metrics.ENV_DIR] = metrics_dir
                self.mount = MountProcess(mount_argv(cfg), cfg.mountpoint, env)
                self.mount.start()
                detail = self.mount.wait_up(cfg.runner.mount_timeout_s, self.stop)
            else:
                detail = self._wait_external()
        except MountError as exc:
            if self.stop.is_set():
                log.info("stopped before the mount came up")
                return EX_OK
            log.error("the mount did not come up: %s", exc)
            return EX_UNAVAILABLE
        log.info("mount is up: %s", detail)
        sd_notify("READY=1", f"STATUS=serving {cfg.store} on {cfg.mountpoint}; health on "
                  f"{cfg.health.address}:{self.server.port}")

        while not self.stop.wait(1.0):
            if self.mount is not None and self.mount.exited() is not None:
                log.error("the mount daemon exited with status %s; exiting so systemd "
                          "restarts the service", self.mount.exited())
                sd_notify("STATUS=the mount daemon exited")
                return EX_UNAVAILABLE
        log.info("stop requested: unmounting %s", cfg.mountpoint)
        return EX_OK

    def _wait_external(self) -> str:
        from .supervisor import MountError, mount_state
        cfg = self.cfg
        log.info("waiting for %s to be mounted by mnt-s4.mount (manage_mount = false)",
                 cfg.mountpoint)
        deadline = cfg.runner.mount_timeout_s
        waited = 0.0
        while True:
            up, why = mount_state(cfg.mountpoint)
            if up:
                return why
            if waited >= deadline:
                raise MountError(f"{cfg.mountpoint} was not mounted within {deadline:.0f} s: "
                                 f"{why}")
            if self.stop.wait(0.5):
                raise MountError("stop requested")
            waited += 0.5

    def _shutdown(self) -> None:
        from s4fs import metrics

        from .supervisor import is_stale, sd_notify, unmount
        sd_notify("STOPPING=1")
        if self.mount is not None and self.mount.pid is not None:
            if self.mount.exited() is None:
                clean = self.mount.stop(self.cfg.runner.stop_timeout_s)
                log.info("mount stopped %s", "cleanly" if clean else "with problems (see above)")
            elif is_stale(self.cfg.mountpoint):
                log.warning("detaching the dead mount at %s", self.cfg.mountpoint)
                unmount(self.cfg.mountpoint, lazy=True)
            metrics.mark_process_dead(self.mount.pid)
        if self.server is not None:
            self.server.stop()
        if self._tmp_metrics:
            shutil.rmtree(self._tmp_metrics, ignore_errors=True)

    # helpers -----------------------------------------------------------------------

    def _metrics_dir(self) -> str:
        """Where the mount daemon writes its metrics (see s4fs.metrics). A runner-managed
        mount uses /run/s4fs/metrics under systemd (RuntimeDirectory=s4fs, emptied at each
        start); a mount made by mnt-s4.mount writes to /run/s4fs-mount/metrics."""
        path = self.cfg.runner.metrics_dir
        if not self.cfg.runner.manage_mount:
            return path or EXTERNAL_METRICS_DIR     # theirs: read it, never write or clean
        if not path and os.environ.get("RUNTIME_DIRECTORY"):
            path = os.path.join(os.environ["RUNTIME_DIRECTORY"].split(":")[0], "metrics")
        if not path:
            path = self._tmp_metrics = tempfile.mkdtemp(prefix="s4fs-metrics-")
        os.makedirs(path, mode=0o755, exist_ok=True)
        # ours alone: values left by an earlier run's processes would be summed in
        for old in glob.glob(os.path.join(path, "*.db")):
            os.unlink(old)
        return path

    def _install_signal_handlers(self) -> dict:
        previous = {}
        if threading.current_thread() is not threading.main_thread():
            return previous
        for sig in (signal.SIGTERM, signal.SIGINT):
            previous[sig] = signal.signal(sig, lambda *_: self.stop.set())
        return previous


# --- command line and logging ---------------------------------------------------------

def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="s4fs runner", description=(
        "Check the entitlement and the codec, serve /healthz and /metrics, mount the store "
        "and supervise the mount until SIGTERM."))
    p.add_argument("--config", help="config file (default: $S4FS_CONFIG or "
                   "/etc/s4fs/config.toml)")
    p.add_argument("--check-config", action="store_true",
                   help="validate the config, print what it means and exit")
    p.add_argument("--log-level", default="info",
                   choices=["debug", "info", "warning", "error"])
    return p


class _JournalFormatter(logging.Formatter):
    """Prefixes each line with its syslog priority (``<3>``), which journald reads."""

    _PRIO = {logging.DEBUG: 7, logging.INFO: 6, logging.WARNING: 4, logging.ERROR: 3,
             logging.CRITICAL: 2}

    def format(self, record: logging.LogRecord) -> str:
        prio = self._PRIO.get(record.levelno, 6)
        return "\n".join(f"<{prio}>{line}" for line in super().format(record).splitlines())


def _setup_logging(level: str) -> None:
    root = logging.getLogger()
    logging.getLogger("s4fs").setLevel(level.upper())
    if root.handlers:                       # embedded (tests, another app): leave it be
        return
    handler = logging.StreamHandler(sys.stderr)
    if os.environ.get("JOURNAL_STREAM"):    # journald adds its own timestamps
        handler.setFormatter(_JournalFormatter("%(name)s: %(message)s"))
    else:
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root.addHandler(handler)
    root.setLevel(logging.WARNING)
    logging.getLogger("s4fs").setLevel(level.upper())


if __name__ == "__main__":
    sys.exit(main())
