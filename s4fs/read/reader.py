"""Reading files back: byte ranges of a committed version, and one descriptor's view.

``FileReader`` maps ``read(offset, size)`` onto the manifest's extents and streams (the
chunks from a :class:`~s4fs.chunks.ChunkSource`), and reads ahead when access is
sequential (``torch.load`` reads record by record). ``ReadHandle`` is one view of a
version: a spool, a decoded copy or a ``FileReader``.
"""

from __future__ import annotations

import logging
import os
import threading
import time

from s4fs import metrics
from s4fs.chunks import ChunkSource, WholeFileHash
from s4fs.errors import ChecksumError, MissingData
from s4fs.manifest import ChunkRef, Manifest

log = logging.getLogger(__name__)
# preadv flag: fail with EAGAIN instead of waiting for the disk (Linux >= 4.14)
_NOWAIT = getattr(os, "RWF_NOWAIT", None)


class FileReader:
    """Random-access reads over one manifest."""

    def __init__(self, manifest: Manifest, source: ChunkSource, *,
                 readahead: int = 16 << 20, path: str = "") -> None:
        self.m = manifest
        self.source = source
        self.readahead = readahead
        self.path = path
        self._last_end = -1
        self._whole = WholeFileHash(manifest)

    @property
    def size(self) -> int:
        return self.m.size

    def read(self, offset: int, size: int) -> bytes:
        end = min(offset + size, self.m.size)
        if offset >= end:
            return b""
        buf = bytearray(end - offset)
        self.readinto(offset, memoryview(buf))
        return bytes(buf) if len(buf) < 65536 else buf

    def readinto(self, offset: int, dest: memoryview) -> int:
        """Copy file bytes at ``offset`` into ``dest``; returns the count (short at EOF)."""
        m = self.m
        end = min(offset + len(dest), m.size)
        if offset >= end:
            return 0
        sequential = offset == self._last_end
        if end - offset > self.source.chunk_hint:
            # a large read (torch.load reads a whole storage at once): decode its chunks
            # in parallel on the pool; the loop below then picks them up in order
            self.source.prefetch(self.refs_for(offset, end - offset)[1:])
        pos = offset
        i = m.locate(pos)
        try:
            while pos < end:
                foff, flen, sidx, soff = m.extents[i]
                take = min(end, foff + flen) - pos
                self._stream_into(sidx, soff + pos - foff,
                                  dest[pos - offset: pos - offset + take])
                pos += take
                i += 1
        except MissingData as exc:
            raise MissingData(f"{self.path or 'a file'}: {exc}") from None
        self._last_end = end
        if not self._whole.see(offset, dest[: end - offset]):
            raise ChecksumError(
                f"{self.path or 'a file'}: the bytes read back do not match the file's "
                f"recorded hash (every chunk passed its own check, so the manifest "
                f"itself is wrong); do not trust this file — report it, with the store")
        if sequential and self.readahead and end < m.size:
            self.source.prefetch(self.refs_for(end, self.readahead))
        return end - offset

    def _stream_into(self, sidx: int, soff: int, dest: memoryview) -> None:
        stream = self.m.streams[sidx]
        starts = stream.starts()
        k = stream.locate(soff)
        done, n = 0, len(dest)
        while done < n:
            data = self.source.get(stream.chunks[k])
            lo = soff + done - starts[k]
            take = min(n - done, len(data) - lo)
            dest[done: done + take] = memoryview(data)[lo: lo + take]
            done += take
            k += 1

    def refs_for(self, offset: int, length: int) -> list[ChunkRef]:
        """Chunk refs covering [offset, offset+length), in file order, without repeats."""
        m = self.m
        end = min(offset + length, m.size)
        refs, seen = [], set()
        i = m.locate(offset) if offset < m.size else len(m.extents)
        pos = offset
        while pos < end and i < len(m.extents):
            foff, flen, sidx, soff = m.extents[i]
            stream = m.streams[sidx]
            s_lo = soff + pos - foff
            s_hi = soff + min(end, foff + flen) - foff
            k = stream.locate(s_lo)
            starts = stream.starts()
            while k < len(stream.chunks) and starts[k] < s_hi:
                ref = stream.chunks[k]
                if ref.key() not in seen:
                    seen.add(ref.key())
                    refs.append(ref)
                k += 1
            pos = min(end, foff + flen)
            i += 1
        return refs


class ReadHandle:
    """A read-only view of one file: a committed version read through the store, a
    committed version kept whole on local disk (``staged_fd`` with its ``manifest``), or
    — on the mount that writes it — the spool of a file being written."""

    def __init__(self, reader: FileReader | None = None, staged_fd: int | None = None,
                 size_fn=None, path: str = "", manifest: Manifest | None = None,
                 on_bad=None, fill_fn=None, version: str | None = None):
        self._reader = reader
        self._fd = staged_fd
        self._size_fn = size_fn
        self._m = manifest if manifest is not None else (reader.m if reader else None)
        # the committed version these bytes are (a spool holding exactly it has no
        # manifest to check against: later writes through its handle may change it)
        self._version = version if version is not None else (self._m.id if self._m else None)
        self._on_bad = on_bad
        # local copies of a committed version are checked like the store's bytes: the
        # whole-file hash, when the file is read from start to end in order
        self._whole = WholeFileHash(self._m) if self._m is not None else None
        # a cold file: decoded ahead by the coding pool from its first read on
        # (s4fs.read.fill; ``fill_fn(offset of the first read)``), read from that copy
        # as its batches land
        self._fill_fn = fill_fn
        self._fill = None
        self._fill_lock = threading.Lock()      # FUSE may read one handle from threads
        self._dead_fds: list[int] = []
        self.path = path
        self.opened = time.monotonic()
        self.nbytes = 0
        self.nreads = 0

    @property
    def manifest(self) -> Manifest | None:
        return self._m

    @property
    def version(self) -> str | None:
        """The id of the committed version this handle reads, or None (a spool that is
        not exactly one)."""
        return self._version

    @property
    def size(self) -> int:
        return self._reader.size if self._reader is not None else self._size_fn()

    @property
    def is_spool(self) -> bool:
        """Whether this view reads a writer's spool on this mount (no manifest)."""
        return self._reader is None and self._m is None

    @property
    def held_size(self) -> int:
        """The bytes this view can still give: its file's own size where it reads a
        local file (a spool emptied into a new file since keeps its old inode's), else
        the version's."""
        if self._fd is not None:
            return os.fstat(self._fd).st_size
        return self.size

    def read_held(self, offset: int, size: int) -> bytes:
        """Bytes at ``offset`` of what this view held (``held_size``): a read past the
        end of the file it now reads (s4fs.read.node)."""
        if self._fd is not None:
            return os.pread(self._fd, max(0, size), offset)
        return self.read(offset, size)

    def local_file(self) -> int | None:
        """The descriptor of a whole local copy of the committed version this handle
        reads (the decoded cache), or None (a spool, or the store)."""
        if self._reader is None and self._m is not None and self._fd is not None:
            return self._fd
        return None

    def read(self, offset: int, size: int) -> bytes:
        self._count_read(offset, size)
        fd = self._copy_fd(offset, size)
        if fd is None:                  # decoded here, through the store
            buf = bytearray(max(0, min(size, self._reader.size - offset)))
            n = self._reader.readinto(offset, memoryview(buf))
            self.nbytes += n
            return bytes(buf[:n]) if n < 65536 else buf[:n]
        data = os.pread(fd, max(0, min(size, self._size_fn() - offset)), offset)
        self._check(offset, data)
        self.nbytes += len(data)
        return data

    def read_now(self, offset: int, size: int) -> bytearray | None:
        """``read`` of bytes of a local copy (the whole file on local disk, or the part of
        a copy being decoded ahead that has landed) that are in the page cache: there is
        nothing to wait for (the caller may be an event loop). Else None, and the caller
        reads with ``read``. A file just written and read back, or decoded ahead of
        its reader, skips a trip through a thread per read."""
        fd = self._fd
        if fd is None or _NOWAIT is None or self._fill_fn is not None or \
                (self._reader is None and self._m is None):
            return None
        end = min(offset + size, self._m.size)
        fill = self._fill
        if offset < end and fill is not None and not fill.has(offset, end):
            return None
        buf = bytearray(max(0, end - offset))
        try:
            n = os.preadv(fd, [buf], offset, _NOWAIT) if buf else 0
        except OSError:            # EAGAIN: not all cached; any other error: ``read`` says
            return None
        if n < len(buf):           # cached in part: the rest would wait for the disk
            return None
        self._count_read(offset, size)
        self._check(offset, buf)
        self.nbytes += n
        return buf

    def decode_whole(self) -> bool:
        """A cold file decoded ahead whole now, and waited for: True when its copy is
        then whole in the decoded cache (an open from now on reads it on local disk);
        False where it is not decoded ahead (too small, larger than the cache, no
        pool) or the decode failed — this handle then reads as it would have."""
        if self._reader is None:
            return False
        self._start_fill(0)
        fill = self._fill
        if self._fd is None:
            return False
        if fill is None or fill.wait_whole():         # None: the copy was whole already
            return True
        with self._fill_lock:       # failed (a batch, or the whole-file check): nothing
            if self._fill is fill:  # of that copy is read, it decodes here instead
                self._dead_fds.append(self._fd)
                self._fd, self._fill = None, None
        return False

    def decoding(self):
        """The decode ahead of this cold file, started now where it is not yet (as a
        first read at 0 would start it): ``(fill, fd)`` — the s4fs.read.fill.Fill and a
        descriptor of its copy of the caller's own (to close) — or None where it is not
        decoded ahead (too small, no pool, a local copy whole already) or failed."""
        if self._reader is None:
            return None
        self._start_fill(0)
        with self._fill_lock:
            fill, fd = self._fill, self._fd
            if fill is None or fd is None or fill.failed is not None:
                return None
            return fill, os.dup(fd)

    def _start_fill(self, offset: int) -> None:
        """The first read of a cold file: decode it ahead, from that read's batch on. A
        checkpoint is read whole, and waiting for torch.load's pattern (the zip
        directory at the tail) first cost a chunk fetched and decoded here in between."""
        size = self._reader.size
        with self._fill_lock:
            if self._fill_fn is None:
                return                        # another thread started it
            got, self._fill_fn = self._fill_fn(offset), None
            if got is not None:
                self._size_fn = lambda: size
                self._fill, self._fd = got

    def _copy_fd(self, offset: int, size: int) -> int | None:
        """The descriptor to read [offset, offset + size) from — a spool, a whole local
        copy, or a copy being decoded ahead once those bytes are in it — or None: decode
        them here through the store (a cold file not decoded ahead, or whose fill
        failed)."""
        if self._reader is None:
            return self._fd
        if self._fill_fn is not None:
            self._start_fill(offset)
        fd, fill = self._fd, self._fill
        if fd is None:
            return None
        end = min(offset + size, self._reader.size)
        if fill is None or offset >= end or fill.wait(offset, end):
            return fd
        with self._fill_lock:             # the fill failed: decode here from now on
            if self._fd == fd:
                self._fd, self._fill = None, None
                self._dead_fds.append(fd)     # closed at release: others may use it
        return None

    def _count_read(self, offset: int, size: int) -> None:
        """One read request (for the release's log line); the first one is logged."""
        self.nreads += 1
        if not self.nbytes and self._m is not None:
            log.info("%s: first read, %d bytes at %d, %.3f s after the open (%s)",
                     self.path, size, offset, time.monotonic() - self.opened,
                     "decoding" if self._reader is not None else "a local copy")

    def readinto(self, offset: int, dest) -> int:
        self._count_read(offset, len(dest))
        mv = memoryview(dest).cast("B")
        fd = self._copy_fd(offset, len(mv))
        if fd is None:
            n = self._reader.readinto(offset, mv)
        else:
            want = max(0, min(len(mv), self._size_fn() - offset))
            n = os.preadv(fd, [mv[:want]], offset) if want else 0
            self._check(offset, mv[:n])
        self.nbytes += n
        return n

    def _check(self, offset: int, data) -> None:
        if self._whole is not None and not self._whole.see(offset, data):
            if self._on_bad is not None:
                self._on_bad()
            raise ChecksumError(
                f"{self.path}: the local copy of this file does not match its recorded "
                f"hash (the cache disk corrupted it); it was dropped from the cache — "
                f"open the file again to read it from the store")

    def release(self) -> None:
        if self.nbytes:
            if self._m is not None:
                log.info("%s: released after %d bytes read in %d reads, %.3f s after the "
                         "open", self.path, self.nbytes, self.nreads,
                         time.monotonic() - self.opened)
            metrics.observe_load(self.path, self.nbytes, time.monotonic() - self.opened)
            self.nbytes = 0
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
        for fd in self._dead_fds:
            os.close(fd)
        self._dead_fds.clear()
