"""The writeback journal: files whose ``close()`` was accepted but not yet committed.

A ``--writeback`` mount answers ``close()`` once the spool holds every byte; from then on
the file must reach the store even if the daemon is killed or restarted. Each accepted
file gets one small JSON entry here, written atomically (temp file, fsync, rename) before
``close()`` returns, and removed once its manifest is in the store::

    <cache_dir>/journal/<spool name>.json
        {"version": 1, "path": "run7/ckpt_100.pt", "spool": "<cache_dir>/spool/spool-…",
         "mode": 33188, "mtime": 1764576000.0, "size": 123, "accepted": 1764576001.2,
         "mtime_ns": 1764576000000000000, "atime_ns": null}     # (the last two: optional)

At start a mount replays every entry whose spool is still there: the file is shown (and
readable) again at once and committed in the background. What it guarantees: nothing
``close()`` accepted is lost when the *daemon* dies. The spool lives in the page cache
until the kernel writes it back, so power loss before the commit can lose it; ``fsync``
waits for the commit and is the durable point, as on any filesystem.
"""

from __future__ import annotations

import json
import logging
import os
import tempfile
from dataclasses import dataclass

from s4fs.atomic import replace_from_temp

log = logging.getLogger(__name__)

VERSION = 1


@dataclass
class Entry:
    path: str
    spool: str
    mode: int
    mtime: float
    size: int
    accepted: float
    mtime_ns: int | None = None     # exact; absent in entries of older s4fs
    atime_ns: int | None = None


class Journal:
    def __init__(self, folder: str) -> None:
        self.folder = folder
        os.makedirs(folder, exist_ok=True)

    def _file(self, spool: str) -> str:
        return os.path.join(self.folder, os.path.basename(spool) + ".json")

    def record(self, e: Entry) -> None:
        doc = {"version": VERSION, "path": e.path, "spool": e.spool, "mode": e.mode,
               "mtime": e.mtime, "size": e.size, "accepted": e.accepted,
               "mtime_ns": e.mtime_ns, "atime_ns": e.atime_ns}
        fd, tmp = tempfile.mkstemp(dir=self.folder, prefix=".entry-")
        replace_from_temp(fd, tmp, self._file(e.spool), json.dumps(doc).encode())

    def drop(self, spool: str) -> None:
        try:
            os.unlink(self._file(spool))
        except FileNotFoundError:
            pass

    def entries(self) -> list[Entry]:
        """Entries left by an earlier run, oldest first; unreadable ones are logged and
        kept (never deleted: a person decides)."""
        out = []
        for name in sorted(os.listdir(self.folder)):
            if not name.endswith(".json") or name.startswith("."):
                continue
            full = os.path.join(self.folder, name)
            try:
                with open(full) as f:
                    doc = json.load(f)
                if doc.get("version") != VERSION:
                    raise ValueError(f"journal version {doc.get('version')}")
                out.append(Entry(doc["path"], doc["spool"], int(doc["mode"]),
                                 float(doc["mtime"]), int(doc["size"]),
                                 float(doc["accepted"]), _ns(doc.get("mtime_ns")),
                                 _ns(doc.get("atime_ns"))))
            except (OSError, ValueError, KeyError, TypeError) as exc:
                log.error("journal entry %s cannot be replayed (%s); it is kept — its spool "
                          "holds the file's bytes", full, exc)
        out.sort(key=lambda e: e.accepted)
        return out

    def spools(self) -> set[str]:
        return {e.spool for e in self.entries()}


def _ns(v) -> int | None:
    """An optional nanosecond time of an entry (entries of older s4fs have none)."""
    return None if v is None else int(v)
