"""Garbage collection: free packs that no manifest references.

A pack is live when any manifest under ``files/`` references it, directly or through a
delta base chain (manifests carry their whole chains inline, so deleting a base
checkpoint never frees what a newer delta needs). Unreferenced packs younger than the
grace period are kept: they may belong to a save still in flight on this or another
node (a manifest is written only after all its packs). Packs of a file that was deleted
while a mount still had it open stay live while its pin does (``pins/``, s4fs.keys).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from s4fs import keys
from s4fs.errors import CorruptManifest, NotFound
from s4fs.manifest import Manifest
from s4fs.stores import Store


@dataclass
class GcReport:
    manifests: int = 0
    kept: int = 0
    young: int = 0
    freed: list[tuple[str, int]] = field(default_factory=list)

    @property
    def freed_bytes(self) -> int:
        return sum(s for _, s in self.freed)


def live_packs(store: Store) -> tuple[set[str], int]:
    live: set[str] = set()
    n = 0
    for obj in store.list(keys.FILES):
        try:
            m = Manifest.from_bytes(store.get(obj.key), where=obj.key)
        except NotFound:
            continue            # deleted while we listed
        except CorruptManifest:
            raise               # never free anything while a manifest is unreadable
        live |= m.packs()
        n += 1
    live |= pinned_packs(store)
    return live, n


def pinned_packs(store: Store, now: float | None = None) -> set[str]:
    """Packs of files unlinked or renamed over while a mount had them open (``pins/``,
    s4fs.keys); a pin older than ``keys.PIN_DAYS`` is from a mount that died and keeps
    nothing."""
    now = time.time() if now is None else now
    live: set[str] = set()
    for obj in store.list(keys.PINS):
        if now - obj.mtime > keys.PIN_DAYS * 86400:
            continue
        try:
            m = Manifest.from_bytes(store.get(obj.key), where=obj.key)
        except NotFound:
            continue            # its reader closed while we listed
        live |= m.packs()
    return live


def collect(store: Store, *, grace: float = 6 * 3600, dry_run: bool = False,
            now: float | None = None, progress=None) -> GcReport:
    """``progress``: a tqdm-like factory for a bar over the packs (the CLI's)."""
    # list packs first: a pack written after this listing is not a candidate at all
    packs = list(store.list(keys.PACKS))
    live, n = live_packs(store)
    now = time.time() if now is None else now
    report = GcReport(manifests=n)
    for obj in (progress(packs, desc="gc", unit="pack", leave=False) if progress
                else packs):
        if obj.key in live:
            report.kept += 1
        elif now - obj.mtime < grace:
            report.young += 1
        else:
            report.freed.append((obj.key, obj.size))
            if not dry_run:
                store.delete(obj.key)
    return report


class BackgroundCollector:
    """Runs :func:`collect` every ``interval`` seconds in a daemon thread (the mount
    daemon starts one). Errors are logged and retried at the next interval."""

    def __init__(self, store: Store, *, interval: float = 3600.0,
                 grace: float = 6 * 3600) -> None:
        import threading
        self.store, self.interval, self.grace = store, interval, grace
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="s4fs-gc", daemon=True)
        self.last: GcReport | None = None

    def start(self) -> "BackgroundCollector":
        self._thread.start()
        return self

    def _loop(self) -> None:
        import logging
        log = logging.getLogger("s4fs.gc")
        while not self._stop.wait(self.interval):
            try:
                self.last = collect(self.store, grace=self.grace)
                log.info("gc: freed %d packs (%d bytes)", len(self.last.freed),
                         self.last.freed_bytes)
            except Exception as exc:  # keep the daemon alive; try again later
                log.warning("gc failed: %s", exc)

    def stop(self) -> None:
        self._stop.set()
