"""Prometheus metrics: recorded by the core, served by the runner on ``GET /metrics``.

The core calls the five ``observe_*``/``uploads_*`` functions below. Each is cheap and
never raises: when ``prometheus_client`` is not installed (or cannot be set up) they do
nothing, so ``import s4fs`` and every save still work on a machine without it.

How the runner sees the mount daemon's numbers
----------------------------------------------
The mount daemon (``s4fs mount``) and the runner are separate processes: the runner
starts the daemon as its child. They share numbers through prometheus_client's
*multiprocess mode*: the runner creates a metrics directory (``$RUNTIME_DIRECTORY/metrics``
under systemd, i.e. ``/run/s4fs/metrics``), calls :func:`use_multiprocess` on it and passes
``PROMETHEUS_MULTIPROC_DIR`` to the daemon. Every process then keeps its values in small
memory-mapped files in that directory, and the runner's :func:`registry` sums them at
scrape time. Counters and histograms of a daemon that died stay in the sum (totals never
go backwards while the runner lives); the in-flight gauge counts live processes only (the
runner calls :func:`mark_process_dead` when its child exits). Without the environment
variable everything stays in-process (the Python API, tests).

Metrics (all prefixed ``s4fs_``): ``logical_bytes_total`` and ``stored_bytes_total`` of
saved files, ``compression_ratio`` (stored / logical, computed at scrape time from the
two totals), ``loaded_bytes_total``, ``save_seconds`` and ``load_seconds`` histograms,
``last_save_timestamp_seconds``, ``uploads_in_flight`` and ``errors_total{kind}``. File
paths are deliberately not labels: one series per checkpoint would grow without bound.
"""

from __future__ import annotations

import logging
import os
import re
import threading
import time

log = logging.getLogger(__name__)

ENV_DIR = "PROMETHEUS_MULTIPROC_DIR"

#: seconds; checkpoints take from milliseconds (small files) to many minutes
LATENCY_BUCKETS = (0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
                   120.0, 300.0, 600.0, 1800.0)

MAX_ERROR_KINDS = 32            # distinct `kind` labels before the rest count as "other"

_lock = threading.Lock()
_state: "_Metrics | None | bool" = None   # None: not set up yet; False: unavailable


def is_available() -> bool:
    """True when prometheus_client is installed and the metrics could be set up."""
    return _get() is not None


# --- what the core calls ---------------------------------------------------------------

def observe_save(path: str, logical: int, stored: int, seconds: float) -> None:
    """A file was saved durably: ``logical`` bytes written by the user, ``stored`` bytes
    it takes in the store, ``seconds`` from open to the end of close."""
    m = _get()
    if m is None:
        return
    try:
        m.logical.inc(max(0, logical))
        m.stored.inc(max(0, stored))
        m.save_seconds.observe(max(0.0, seconds))
        m.last_save.set(time.time())
    except Exception:                         # metrics must never break a save
        log.debug("observe_save failed", exc_info=True)


def observe_load(path: str, nbytes: int, seconds: float) -> None:
    """``nbytes`` were read back from a file in ``seconds`` (open to release)."""
    m = _get()
    if m is None:
        return
    try:
        m.loaded.inc(max(0, nbytes))
        m.load_seconds.observe(max(0.0, seconds))
    except Exception:
        log.debug("observe_load failed", exc_info=True)


def uploads_started(n: int = 1) -> None:
    m = _get()
    if m is not None:
        try:
            m.uploads.inc(n)
        except Exception:
            log.debug("uploads_started failed", exc_info=True)


def uploads_finished(n: int = 1) -> None:
    m = _get()
    if m is not None:
        try:
            m.uploads.dec(n)
        except Exception:
            log.debug("uploads_finished failed", exc_info=True)


def observe_error(kind: str) -> None:
    """Count one error of ``kind`` (a short word such as ``"upload"``, ``"checksum"``)."""
    m = _get()
    if m is None:
        return
    try:
        m.errors.labels(kind=m.kind_label(kind)).inc()
    except Exception:
        log.debug("observe_error failed", exc_info=True)


# --- what the runner calls ---------------------------------------------------------

def use_multiprocess(path: str) -> bool:
    """Record this process's metrics in the multiprocess directory ``path`` and have
    :func:`registry` read every process's files from there. Call it before the first
    metric is recorded; children inherit ``PROMETHEUS_MULTIPROC_DIR`` from the
    environment. Returns False (and changes nothing) once metrics were already set up
    in-process."""
    global _state
    with _lock:
        if _state not in (None, False):
            return os.environ.get(ENV_DIR) == path
        os.makedirs(path, exist_ok=True)
        os.environ[ENV_DIR] = path
        import sys
        values = sys.modules.get("prometheus_client.values")
        if values is not None:           # imported already: re-pick its value class
            values.ValueClass = values.get_value_class()
        _state = None
        return True


def registry():
    """The ``CollectorRegistry`` to expose on ``/metrics``, or None without
    prometheus_client. In multiprocess mode it sums every process's files."""
    m = _get()
    return None if m is None else m.registry


def mark_process_dead(pid: int) -> None:
    """Forget the live gauges of a process that exited (multiprocess mode only)."""
    path = os.environ.get(ENV_DIR)
    if not path or _get() is None:
        return
    try:
        from prometheus_client import multiprocess
        multiprocess.mark_process_dead(pid, path)
    except Exception:
        log.debug("mark_process_dead failed", exc_info=True)


def text() -> bytes:
    """The Prometheus text exposition of :func:`registry` (empty without the library)."""
    reg = registry()
    if reg is None:
        return b""
    from prometheus_client import generate_latest
    return generate_latest(reg)


# --- implementation ------------------------------------------------------------------

def _get() -> "_Metrics | None":
    global _state
    state = _state
    if state is None:
        with _lock:
            if _state is None:
                try:
                    _state = _Metrics(os.environ.get(ENV_DIR) or None)
                except ModuleNotFoundError:
                    _state = False
                except Exception as exc:
                    log.warning("metrics disabled: could not set up prometheus_client: %s", exc)
                    _state = False
            state = _state
    return state or None


class _Metrics:
    def __init__(self, multiprocess_dir: str | None) -> None:
        import prometheus_client as prom
        from prometheus_client.core import CollectorRegistry

        self.multiprocess_dir = multiprocess_dir
        if multiprocess_dir:
            os.makedirs(multiprocess_dir, exist_ok=True)
            from prometheus_client import multiprocess
            own = None                        # values go to files, the registry reads them
            self.registry = CollectorRegistry()
            multiprocess.MultiProcessCollector(self.registry, path=multiprocess_dir)
            reader = multiprocess.MultiProcessCollector(None, path=multiprocess_dir)
            totals = lambda: _totals(reader.collect())  # noqa: E731
        else:
            own = self.registry = CollectorRegistry()
            totals = lambda: _totals(list(self.logical.collect()) + list(self.stored.collect()))  # noqa: E731
        kw = {"registry": own, "namespace": "s4fs"}
        self.logical = prom.Counter("logical_bytes", "Bytes users wrote into saved files "
                                    "(before compression)", **kw)
        self.stored = prom.Counter("stored_bytes", "Bytes the saved files take in the store "
                                   "(after compression and delta)", **kw)
        self.loaded = prom.Counter("loaded_bytes", "Bytes read back from files", **kw)
        self.save_seconds = prom.Histogram("save_seconds", "Time from open to durable close "
                                           "of a saved file", buckets=LATENCY_BUCKETS, **kw)
        self.load_seconds = prom.Histogram("load_seconds", "Time from open to release of a "
                                           "file read back", buckets=LATENCY_BUCKETS, **kw)
        self.last_save = prom.Gauge("last_save_timestamp_seconds", "Unix time of the last "
                                    "durable save", multiprocess_mode="max", **kw)
        self.uploads = prom.Gauge("uploads_in_flight", "Chunk uploads started and not yet "
                                  "finished", multiprocess_mode="livesum", **kw)
        self.errors = prom.Counter("errors", "Errors by kind", ["kind"], **kw)
        self.registry.register(_DerivedCollector(totals))
        self._kinds: set[str] = set()

    def kind_label(self, kind: str) -> str:
        label = re.sub(r"[^a-z0-9_]+", "_", str(kind).lower()).strip("_")[:40] or "unknown"
        if label not in self._kinds:
            if len(self._kinds) >= MAX_ERROR_KINDS:
                return "other"
            self._kinds.add(label)
        return label


def _totals(families) -> tuple[float, float]:
    logical = stored = 0.0
    for fam in families:
        for sample in fam.samples:
            if sample.name == "s4fs_logical_bytes_total":
                logical += sample.value
            elif sample.name == "s4fs_stored_bytes_total":
                stored += sample.value
    return logical, stored


class _DerivedCollector:
    """Metrics computed at scrape time: the compression ratio and build info."""

    def __init__(self, totals) -> None:
        self._totals = totals

    def describe(self):
        return []

    def collect(self):
        from prometheus_client.core import GaugeMetricFamily, InfoMetricFamily

        from s4fs import __version__
        logical, stored = self._totals()
        yield GaugeMetricFamily("s4fs_compression_ratio", "Stored bytes / logical bytes of "
                                "everything saved (0.66: stored at 66 % of the original size; "
                                "1 before the first save)",
                                value=stored / logical if logical else 1.0)
        info = InfoMetricFamily("s4fs_build", "s4fs version")
        info.add_metric([], {"version": __version__})
        yield info
