"""The files open on one filesystem: the writer of each path being written on this mount
(:class:`s4fs.write.WriteHandle`) and the node of each file (:class:`s4fs.read.FileNode`:
what every descriptor of it reads, and what the kernel may keep cached of it).

:class:`OpenFiles` keeps both tables and moves them with the namespace (unlink, rename),
opens readers on nodes and gives them their views (the writer's spool, a local whole
copy, or the store), and pins the packs of a version that detached readers still read.
The namespace itself — which paths exist, their manifests — is :mod:`s4fs.fs`'s.

Locking: ``lock`` guards the two tables and every node's fields; it is held only for
short, local work, never while calling into a handle or the store.
"""

from __future__ import annotations

import logging
import threading
from typing import TYPE_CHECKING, Callable

from s4fs import keys
from s4fs.attr import Attr, version_attr
from s4fs.errors import NotFound, S4Error
from s4fs.manifest import Manifest
from s4fs.chunks import ChunkSource
from s4fs.read import DecodedCache, FileNode, FileReader, Fills, NodeReader, ReadHandle
from s4fs.stores import Store

if TYPE_CHECKING:
    from s4fs.write import WriteHandle

__all__ = ["OpenFiles"]

log = logging.getLogger("s4fs.fs")


class OpenFiles:
    """``invalidate(node, gone)``: tell the kernel to drop its pages of ``node`` (and its
    name, ``gone``, when the file no longer exists); from any thread, never blocking on
    the kernel. ``store`` keeps the pins; ``decoded``, ``source`` and ``fills`` are where
    readers' views read from."""

    def __init__(self, store: Store, decoded: DecodedCache | None, source: ChunkSource,
                 fills: Fills, invalidate: Callable[[FileNode, bool], None]) -> None:
        self.store, self.decoded, self.source, self.fills = store, decoded, source, fills
        self._invalidate = invalidate
        self.lock = threading.RLock()
        self._writers: dict[str, WriteHandle] = {}
        self._truncated: dict[str, Manifest] = {}   # last version before a truncate to 0
        # a long-running mount that has opened thousands of files holds their nodes
        # (without their manifests: _forget_idle_version)
        self._nodes: dict[str, FileNode] = {}
        self._pinned: set[FileNode] = set()          # detached, still read, packs pinned

    # --- the writer table -------------------------------------------------------------

    def writer(self, path: str) -> WriteHandle | None:
        with self.lock:
            return self._writers.get(path)

    def writers(self) -> list[WriteHandle]:
        with self.lock:
            return list(self._writers.values())

    def open_under(self, folder: str) -> bool:
        """Whether a file is being written directly in ``folder``."""
        with self.lock:
            return any(keys.parent(p) == folder for p in self._writers)

    def names_under(self, folder: str) -> set[str]:
        """The names of the files being written directly in ``folder``."""
        with self.lock:
            return {keys.basename(p) for p in self._writers if keys.parent(p) == folder}

    def add_writer(self, path: str, w: WriteHandle, *, replace: bool = False) -> bool:
        """``w`` writes ``path``'s file in place from now on; False (and nothing done)
        where another writer has it, unless ``replace``."""
        with self.lock:
            if not replace and path in self._writers:
                return False
            self._writers[path] = w
            node = self._node(path)
            node.writer = w
            node.read_while_written = False
            node.changed()
            w.node = node
            return True

    def writer_gone(self, w: WriteHandle, path: str) -> None:
        """``w`` closed (or failed): its file is its last committed version again. If
        the bytes it took are no committed version (a failed save), the kernel's pages
        of them are dropped."""
        cid = w.committed_id()
        with self.lock:
            if self._writers.get(path) is w:
                del self._writers[path]
            node = w.node
            if node is None or node.writer is not w:
                return
            if node.detached:
                # unlinked or renamed over: its readers keep reading the spool they
                # hold, and the writer stays its attributes (fstat)
                return
            node.writer = None
            node.changed()
            drop = cid is None
            if drop:
                node.kernel_id = None
            gone = drop and w.previous is None        # its first save failed
            _forget_idle_version(node)
        if drop:
            # a failed first save leaves no file at all: the kernel forgets its name too
            self._invalidate(node, gone)

    def spool_renewed(self, w: WriteHandle) -> None:
        """``w``'s spool is a new file: the readers of its node read from it next."""
        with self.lock:
            node = w.node
            if node is not None and node.writer is w:
                node.changed()

    def truncated(self, path: str, m: Manifest) -> None:
        """``path`` was truncated to zero from version ``m``."""
        with self.lock:
            self._truncated[path] = m

    def pop_truncated(self, path: str) -> Manifest | None:
        """The version ``path`` had before a truncate to zero, if it was the last change."""
        with self.lock:
            return self._truncated.pop(path, None)

    # --- the namespace moves ----------------------------------------------------------

    def unlink(self, path: str) -> None:
        """``path`` is unlinked: its writer writes to nowhere from now on, its readers
        keep the version they read."""
        with self.lock:
            w = self._writers.pop(path, None)
            node = self._nodes.pop(path, None)
            if node is not None:
                # before the writer is orphaned: an orphaned writeback writer is closed
                # by the committer at once, and a node not yet detached would then drop
                # it (writer_gone) — its readers' fstat would find no file (ENOENT) where
                # a local disk's held descriptor still has one
                node.detached = True
        if w is not None:
            w.orphan()
        if node is not None:
            self._detach(node)           # its readers' packs are pinned

    def rename_file(self, old: str, new: str) -> WriteHandle | None:
        """The tables' side of a file rename; returns the writer of ``old``, now of
        ``new``, if one is open."""
        with self.lock:
            w = self._writers.pop(old, None)
            displaced = self._writers.pop(new, None)
            if w is not None:
                self._writers[new] = w
            node = self._nodes.pop(old, None)
            gone = self._nodes.pop(new, None)
            if node is not None:
                node.path = new
                self._nodes[new] = node
        if gone is not None and gone is not node:
            self._detach(gone)           # the replaced file's readers keep reading it
        if displaced is not None and displaced is not w:
            # the file being replaced may still be open (or closing): as on a local
            # disk, what is written to it later goes nowhere
            displaced.orphan()
        return w

    def rename_folder(self, old: str, new: str) -> list[tuple[WriteHandle, str]]:
        """The tables' side of a folder rename; returns the writers moved, with their
        new paths."""
        moved = []
        with self.lock:
            for p in list(self._writers):
                if p.startswith(old + "/"):
                    w = self._writers.pop(p)
                    self._writers[new + p[len(old):]] = w
                    moved.append((w, new + p[len(old):]))
            for p in [p for p in self._nodes if p.startswith(old + "/")]:
                node = self._nodes.pop(p)
                node.path = new + p[len(old):]
                self._nodes[node.path] = node
        return moved

    # --- versions ---------------------------------------------------------------------

    def committed(self, path: str, m: Manifest) -> None:
        """``m`` is now ``path``'s version: the file's open descriptors read it."""
        with self.lock:
            node = self._nodes.get(path)
            if node is not None and (node.readers > 0 or node.writer is not None):
                node.version = m
                node.changed()

    def rewritten(self, path: str, m: Manifest) -> None:
        """``path``'s version was stored anew as ``m`` (same id, same bytes)."""
        with self.lock:
            node = self._nodes.get(path)
            if node is not None and node.version is not None and node.version.id == m.id:
                node.version = m

    def saw_commit(self, w: WriteHandle, m: Manifest) -> None:
        """``w`` committed ``m``, exactly the bytes written through it (so through the
        kernel, whose pages are then ``m``) — unless another descriptor read the file
        while it was being written: then the kernel is told to drop its pages."""
        with self.lock:
            node = w.node
            if node is None or node.writer is not w or node.detached:
                return
            # through FUSE passthrough the kernel wrote the spool, not its own pages of
            # this file: whatever pages it holds are of an older version
            drop = node.read_while_written or w.passthrough
            node.read_while_written = False
            node.kernel_id = None if drop else m.id
        if drop:
            self._invalidate(node, False)

    # --- readers ----------------------------------------------------------------------

    def open_read(self, path: str, m: Manifest | None) -> NodeReader:
        """A descriptor on ``path``'s file, whose committed version is ``m`` (None: a
        file being written on this mount)."""
        with self.lock:
            node = self._node(path)
            if node.writer is None and m is not None and \
                    (node.version is None or node.version.id != m.id):
                node.version = m          # first open, or another mount committed anew
                node.changed()
            node.readers += 1
        try:
            view, gen = self._view_of(node)
            if view is None:
                raise NotFound(f"no file {path!r}")
        except BaseException:
            self._reader_gone(node)
            raise
        with self.lock:
            keep = node.open_verdict(view.version)
        return NodeReader(node, view, gen, keep, self._view_of, _note_read,
                          self._reader_gone)

    def node_attr(self, node: FileNode) -> Attr:
        """The attributes of ``node``'s file, also once its path is gone (``fstat`` of a
        descriptor whose file was unlinked or renamed over)."""
        with self.lock:
            w, m, path = node.writer, node.version, node.path
        if w is not None:
            return w.attr(path)
        if m is not None:
            return version_attr(path, m)
        raise NotFound(f"no file {path!r}")

    def _node(self, path: str) -> FileNode:
        """(Under ``lock``.) The node of ``path``, made on first use."""
        node = self._nodes.get(path)
        if node is None:
            node = self._nodes[path] = FileNode(path)
        return node

    def _view_of(self, node: FileNode) -> tuple[ReadHandle | None, int]:
        """What ``node`` is now, as a view to read it through, with the generation it
        is of; None when it has no content (the caller keeps what it had)."""
        while True:
            with self.lock:
                gen, w, m, path = node.gen, node.writer, node.version, node.path
            if w is None:
                break
            fd = w.spool_fd()         # waits for a commit in progress
            if fd is not None:
                # being written on this mount: what is written so far, from its spool
                # (which may already be exactly the committed version: the release of a
                # closed file comes after close() returns)
                return ReadHandle(staged_fd=fd, size_fn=lambda: w.size, path=path,
                                  version=w.committed_id()), gen
            with self.lock:
                if node.writer is w:      # closed, and not yet let go of: its version
                    gen, m = node.gen, node.version
                    break
        if m is None:
            return None, gen
        return self._version_view(m, path), gen

    def _version_view(self, m: Manifest, path: str) -> ReadHandle:
        """A committed version: its local whole copy where this machine has one (written
        or read whole here: the exact bytes, on local disk), else from the store."""
        if self.decoded is not None:
            fd = self.decoded.open(m.id)
            if fd is not None:
                return ReadHandle(staged_fd=fd, size_fn=lambda: m.size, path=path,
                                  manifest=m, on_bad=lambda: self.decoded.discard(m.id))
        return ReadHandle(FileReader(m, self.source, path=path), path=path, manifest=m,
                          fill_fn=lambda first: self.fills.start(m, first))

    def _reader_gone(self, node: FileNode) -> None:
        with self.lock:
            node.readers -= 1
            pin = None
            if node.readers <= 0 and node.pin is not None:
                pin, node.pin = node.pin, None
                self._pinned.discard(node)
            _forget_idle_version(node)
        if pin is not None:
            self._unpin(pin)

    # --- pins -------------------------------------------------------------------------

    def _detach(self, node: FileNode) -> None:
        """``node``'s path was unlinked or renamed over: its readers keep the version
        they read, so its packs are pinned (a manifest under ``pins/``, which garbage
        collection counts as live) until the last of them closes."""
        with self.lock:
            node.detached = True
            m = node.version if node.readers > 0 and node.pin is None else None
        if m is None:
            return
        key = keys.new_pin_key()
        try:
            self.store.put(key, m.to_bytes())
        except S4Error as exc:
            log.warning("%s: could not pin the packs of the version its open readers "
                        "read (%s); a garbage collection meanwhile may free them", node.path,
                        exc)
            return
        with self.lock:
            if node.readers > 0:
                node.pin = key
                self._pinned.add(node)
                key = None
        if key is not None:
            self._unpin(key)

    def _unpin(self, key: str) -> None:
        try:
            self.store.delete(key)
        except S4Error as exc:
            log.warning("could not remove the pin %s (%s); garbage collection ignores it "
                        "once it is older than %d days", key, exc, keys.PIN_DAYS)

    def close(self) -> None:
        """The filesystem closes: every writer lets go of it, every pin is removed."""
        for w in self.writers():
            w.detach()
        with self.lock:
            pinned, self._pinned = list(self._pinned), set()
        for node in pinned:
            self._unpin(node.pin)


def _forget_idle_version(node: FileNode) -> None:
    """(Under ``OpenFiles.lock``.) A node nobody reads or writes keeps only what the
    kernel holds of it (``kernel_id``), not its manifest: a long-running mount that has
    opened thousands of checkpoints holds thousands of nodes. The next open sets it."""
    if node.readers <= 0 and node.writer is None:
        node.version = None


def _note_read(node: FileNode) -> None:
    """A read reached the filesystem: if the file is being written meanwhile, the
    kernel's pages are not only the writer's (s4fs.read.node)."""
    if node.writer is not None:
        node.read_while_written = True
