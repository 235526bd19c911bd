"""Delta bases: which chunk of the base version a new chunk is coded against, and where
its raw bytes come from (the base version's decoded copy on local disk when it holds them
intact, else the store through a ``ChunkSource``)."""

from __future__ import annotations

import os

from s4fs import codec
from s4fs.manifest import ChunkRef, Manifest, Stream


def base_streams(base: Manifest | None) -> dict:
    """The base version's tensor streams by (record name, dtype, length): a new
    tensor's chunks are coded against those of the stream with its key."""
    if base is None:
        return {}
    return {(s.name, s.dtype, s.length): s for s in base.streams
            if s.kind == "tensor" and s.name is not None}


def base_chunk(base: Stream | None, idx: int) -> ChunkRef | None:
    """Chunk ``idx`` of a base stream (one of :func:`base_streams`), if it has one."""
    if base is not None and idx < len(base.chunks):
        return base.chunks[idx]
    return None


class BaseFile:
    """Where the chunks of the base version lie in its decoded copy on local disk (the
    file a delta's base bytes are read from, instead of decoding them again)."""

    def __init__(self, base: Manifest | None, path: str | None) -> None:
        self.path = path if base is not None else None
        self._ext: dict[int, list[tuple[int, int, int]]] = {}
        self._idx: dict[int, int] = {}
        if self.path is not None:
            for foff, n, sidx, soff in base.extents:
                self._ext.setdefault(sidx, []).append((soff, foff, n))
            self._idx = {id(st): i for i, st in enumerate(base.streams)}

    def range_of(self, stream: Stream | None, idx: int) -> tuple[int, int] | None:
        """(file offset, length) of chunk ``idx`` of base ``stream``, if in one extent."""
        if not self._ext or stream is None:
            return None
        sidx = self._idx.get(id(stream))
        soff = stream.starts()[idx]
        n = stream.chunks[idx].raw
        for es, fo, en in self._ext.get(sidx, ()):
            if es <= soff and soff + n <= es + en:
                return (fo + soff - es, n)
        return None


def base_bytes(fd: int | None, where: tuple[int, int] | None, base: ChunkRef,
               source) -> bytes:
    """The verified raw bytes of chunk ``base``: from the base version's decoded copy
    (:func:`base_from_file`) when it holds them intact, else from ``source`` (a
    ChunkSource: the store, decoded and checked)."""
    data = base_from_file(fd, where, base)
    return data if data is not None else source.get(base)


def base_from_file(fd: int | None, where: tuple[int, int] | None,
                   base: ChunkRef) -> bytes | None:
    """The raw bytes of chunk ``base`` read at ``where`` (offset, length) in the base
    version's decoded copy open at ``fd``, or None when that copy cannot give them intact
    (no copy, short read, an error, or bytes that fail the manifest's checksum)."""
    if fd is None or where is None:
        return None
    off, n = where
    parts, got = [], 0
    try:
        while got < n:
            more = os.pread(fd, n - got, off + got)
            if not more:
                return None
            parts.append(more)
            got += len(more)
    except OSError:
        return None
    data = parts[0] if len(parts) == 1 else b"".join(parts)
    if len(data) != base.raw or codec.checksum(data) != base.checksum:
        return None
    return data
