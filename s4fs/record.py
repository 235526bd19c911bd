"""The namespace's record of a save: a new version's manifest written into the store
(the one atomic step of a save), remembered, and told to the files open on this mount.

A :class:`Recorder` is built once by the filesystem (:class:`s4fs.fs.Filesystem`) from
its parts and handed down to every save as its ``Record``
(:class:`s4fs.write.services.Record`), so a save's commit goes down into it and never
back up into the filesystem. The filesystem commits through it too (a rename, a chmod
of a closed file).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable

from s4fs import keys

if TYPE_CHECKING:
    from s4fs.folders import Folders
    from s4fs.manifest import Manifest
    from s4fs.manifest_cache import ManifestCache
    from s4fs.openfiles import OpenFiles
    from s4fs.stores import Store
    from s4fs.write import WriteHandle

__all__ = ["Recorder"]


class Recorder:
    """``saved(path, m)``: told of each new version (not a rename or a change of
    attributes), so that with backward deltas the version it was compared with is
    re-expressed against it (``s4fs.writeback``)."""

    def __init__(self, store: "Store", folders: "Folders", manifests: "ManifestCache",
                 files: "OpenFiles", saved: Callable[[str, "Manifest"], None]) -> None:
        self._store, self._folders, self._manifests = store, folders, manifests
        self._files, self._saved = files, saved

    def commit(self, path: str, m: "Manifest", *, saved: bool = True) -> None:
        """Write ``m`` as the manifest of ``path``; ``saved``: a new version."""
        self._folders.ensure_parents(path)
        data = m.to_bytes()
        self._store.put(keys.file_key(path), data)
        self._manifests.remember(path, m, data)
        self._files.committed(path, m)
        if saved:
            self._saved(path, m)

    # --- the write room's Record --------------------------------------------------

    def committed(self, w: "WriteHandle", m: "Manifest") -> None:
        """``w`` committed ``m``: the manifest written, then whether the kernel's pages
        of its file are ``m`` (s4fs.openfiles)."""
        self.commit(w.path, m)
        self._files.saw_commit(w, m)

    def released(self, w: "WriteHandle") -> None:
        self._files.writer_gone(w, w.path)

    def renewed(self, w: "WriteHandle") -> None:
        self._files.spool_renewed(w)
