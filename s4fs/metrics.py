"""Prometheus metrics: recorded by the core, served by the runner on ``GET /metrics``.

The core calls the five ``observe_*``/``uploads_*`` functions below. Each is cheap and
never raises: when ``prometheus_client`` is not installed (or cannot be set up) they do
nothing, so ``import s4fs`` and every save still work on a machine without it.

How the runner sees the mount daemon's numbers
----------------------------------------------
The mount daemon (``s4fs mount``) and the runner are separate processes: the runner
starts the daemon as its child. They share numbers through prometheus_client's
*multiprocess mode*: the runner creates a metrics directory (``$RUNTIME_DIRECTORY/metrics``
under systemd, i.e. ``/run/s4fs/metrics``), calls :func:`serve_directory` on it and passes
``PROMETHEUS_MULTIPROC_DIR`` to the daemon. Every process then keeps its values in small
memory-mapped files in that directory, and the runner's :func:`registry` sums them at
scrape time. Counters and histograms of a daemon that died stay in the sum (totals never
go backwards while the runner lives); the in-flight gauge counts live processes only (the
runner calls :func:`mark_process_dead` when its child exits). Without the environment
variable everything stays in-process (the Python API, tests).

Metrics (all prefixed ``s4fs_``): ``logical_bytes_total`` and ``stored_bytes_total`` of
saved files (with ``stored_delta_bytes_total`` and ``unchanged_bytes_total``, split as
``s4fs stat`` and ``s4fs report`` split them: :func:`s4fs.manifest.stored_split`), ``compression_ratio`` (stored / logical, computed at scrape time from the
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

# Process-wide, as Prometheus counts are: one set of series per process (multiprocess
# mode: one file set per pid), whichever runtime records into them.
_lock = threading.Lock()
_state: "_Metrics | None | bool" = None   # None: not set up yet; False: unavailable


def is_available() -> bool:
    """True when prometheus_client is installed and the metrics could be set up."""
    return _get() is not None


# --- what the core calls ---------------------------------------------------------------

def observe_save(path: str, logical: int, stored: int, seconds: float, *,
                 stored_delta: int = 0, unchanged: int = 0) -> None:
    """A file was saved durably: ``logical`` bytes written by the user, ``stored`` bytes
    it takes in the store (``stored_delta`` of them as deltas; ``unchanged`` logical
    bytes reused as they were), ``seconds`` from open to the end of close."""
    m = _get()
    if m is None:
        return
    try:
        m.logical.inc(max(0, logical))
        m.stored.inc(max(0, stored))
        m.stored_delta.inc(max(0, stored_delta))
        m.unchanged.inc(max(0, unchanged))
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


def set_pending(files: int, nbytes: int, failing: int) -> None:
    """Writeback: files accepted by close() but not committed yet, their bytes, and how
    many of them have failed to commit at least once."""
    m = _get()
    if m is None:
        return
    try:
        m.pending_files.set(files)
        m.pending_bytes.set(nbytes)
        m.failing_commits.set(failing)
    except Exception:
        log.debug("set_pending failed", exc_info=True)


def set_passthrough(on: bool) -> None:
    """How the mount moves bytes now: FUSE passthrough (True) or FUSE requests."""
    m = _get()
    if m is None:
        return
    try:
        m.passthrough.set(1 if on else 0)
    except Exception:
        log.debug("set_passthrough failed", exc_info=True)


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

def serve_directory(path: str) -> None:
    """Make :func:`registry` serve the metrics that other processes (the mount daemon,
    started with ``PROMETHEUS_MULTIPROC_DIR=path``) write into ``path``. The calling
    process only reads there, so it needs no write access; its own ``observe_*`` calls
    become no-ops. Call it before anything else touches the metrics."""
    global _state
    with _lock:
        if _state:
            raise RuntimeError("s4fs.metrics was set up already; call serve_directory first")
        try:
            _state = _Metrics(path, record=False)
        except ImportError:
            _state = False


def registry():
    """The ``CollectorRegistry`` to expose on ``/metrics``, or None without
    prometheus_client. In multiprocess mode it sums every process's files."""
    m = _get()
    return None if m is None else m.registry


def mark_process_dead(pid: int) -> None:
    """Forget the live gauges of a process that exited (multiprocess mode only)."""
    m = _get()
    path = m.multiprocess_dir if m is not None else None
    if not path:
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
                except ImportError:
                    _state = False
                except Exception as exc:
                    log.warning("metrics disabled: could not set up prometheus_client: %s", exc)
                    _state = False
            state = _state
    return state or None


#: (attribute, kind, name without the s4fs_ prefix, help, extra arguments)
_SPEC = [
    ("logical", "counter", "logical_bytes",
     "Bytes users wrote into saved files (before compression)", {}),
    ("stored", "counter", "stored_bytes",
     "Bytes the saved files take in the store (after compression and delta)", {}),
    ("stored_delta", "counter", "stored_delta_bytes",
     "Of stored_bytes, those stored as deltas against an earlier checkpoint", {}),
    ("unchanged", "counter", "unchanged_bytes",
     "Logical bytes of saved files reused unchanged from an earlier checkpoint", {}),
    ("loaded", "counter", "loaded_bytes", "Bytes read back from files", {}),
    ("save_seconds", "histogram", "save_seconds",
     "Time from open to durable close of a saved file", {"buckets": LATENCY_BUCKETS}),
    ("load_seconds", "histogram", "load_seconds",
     "Time from open to release of a file read back", {"buckets": LATENCY_BUCKETS}),
    ("last_save", "gauge", "last_save_timestamp_seconds",
     "Unix time of the last durable save", {"multiprocess_mode": "max"}),
    ("uploads", "gauge", "uploads_in_flight",
     "Chunk uploads started and not yet finished", {"multiprocess_mode": "livesum"}),
    ("errors", "counter", "errors", "Errors by kind", {"labelnames": ["kind"]}),
    ("pending_files", "gauge", "pending_commit_files",
     "Files accepted by close() (writeback) and not yet committed",
     {"multiprocess_mode": "livesum"}),
    ("pending_bytes", "gauge", "pending_commit_bytes",
     "Bytes of the files accepted and not yet committed", {"multiprocess_mode": "livesum"}),
    ("failing_commits", "gauge", "failing_commits",
     "Pending files whose commit failed at least once (retried)",
     {"multiprocess_mode": "livesum"}),
    ("passthrough", "gauge", "mount_passthrough",
     "1 while the mount moves bytes by FUSE passthrough, 0 through FUSE requests",
     {"multiprocess_mode": "livemax"}),
]


class _Metrics:
    """This process's metric objects and the registry ``/metrics`` serves.

    * in-process (no directory): values live in memory, the registry holds them;
    * recording into a directory (the mount daemon): values go to files there;
    * reading a directory (the runner, ``record=False``): the registry sums every
      process's files; families nobody has written yet are served as zeros."""

    def __init__(self, multiprocess_dir: str | None, record: bool = True) -> None:
        import prometheus_client as prom
        from prometheus_client.core import CollectorRegistry

        self.multiprocess_dir = multiprocess_dir
        self._kinds: set[str] = set()
        self.registry = CollectorRegistry()
        if multiprocess_dir is None:
            self._define(prom, self.registry)
            source = _OwnCollector(self)
        else:
            if record:
                os.makedirs(multiprocess_dir, exist_ok=True)
                self._define(prom, None)          # values go to files in the directory
            else:
                for attr, *_ in _SPEC:            # a reader records nothing itself
                    setattr(self, attr, _NULL)
            source = _DirCollector(multiprocess_dir)
            self.registry.register(source)
        self.registry.register(_DerivedCollector(lambda: _totals(source.collect())))

    def _define(self, prom, registry) -> None:
        classes = {"counter": prom.Counter, "gauge": prom.Gauge, "histogram": prom.Histogram}
        for attr, kind, name, doc, extra in _SPEC:
            setattr(self, attr, classes[kind](name, doc, namespace="s4fs", registry=registry,
                                              **extra))

    def kind_label(self, kind: str) -> str:
        label = re.sub(r"[^a-z0-9_]+", "_", str(kind).lower()).strip("_")[:40] or "unknown"
        if label not in self._kinds:
            if len(self._kinds) >= MAX_ERROR_KINDS:
                return "other"
            self._kinds.add(label)
        return label


class _OwnCollector:
    """The in-process metrics (used for the ratio; the registry holds them itself)."""

    def __init__(self, m: _Metrics) -> None:
        self._m = m

    def collect(self):
        return list(self._m.logical.collect()) + list(self._m.stored.collect())


class _DirCollector:
    """Every process's values in a multiprocess directory, summed, plus zero-valued
    families for metrics no process has written yet (the daemon writes a metric's file
    the first time it records it)."""

    def __init__(self, path: str) -> None:
        self.path = path

    def describe(self):
        return []

    def collect(self):
        families = []
        if os.path.isdir(self.path):
            from prometheus_client import multiprocess
            families = list(multiprocess.MultiProcessCollector(None, path=self.path).collect())
        seen = {f.name for f in families}
        return families + [f for f in _zero_families() if f.name not in seen]


def _zero_families():
    from prometheus_client.core import (CounterMetricFamily, GaugeMetricFamily,
                                        HistogramMetricFamily)
    out = []
    for _attr, kind, name, doc, extra in _SPEC:
        full = "s4fs_" + name
        if "labelnames" in extra:
            fam = (CounterMetricFamily if kind == "counter" else GaugeMetricFamily)(
                full, doc, labels=extra["labelnames"])
        elif kind == "counter":
            fam = CounterMetricFamily(full, doc, value=0)
        elif kind == "gauge":
            fam = GaugeMetricFamily(full, doc, value=0)
        else:
            buckets = [(repr(float(b)), 0) for b in extra["buckets"]] + [("+Inf", 0)]
            fam = HistogramMetricFamily(full, doc, buckets=buckets, sum_value=0)
        out.append(fam)
    return out


class _Null:
    """Accepts every metric call and does nothing."""

    def __getattr__(self, name):
        return self._ignore

    def _ignore(self, *args, **kwargs):
        return self


_NULL = _Null()


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

        from s4fs._version import __version__
        logical, stored = self._totals()
        yield GaugeMetricFamily("s4fs_compression_ratio", "Stored bytes / logical bytes of "
                                "everything saved (0.66: stored at 66 % of the original size; "
                                "1 before the first save)",
                                value=stored / logical if logical else 1.0)
        info = InfoMetricFamily("s4fs_build", "s4fs version")
        info.add_metric([], {"version": __version__})
        yield info
