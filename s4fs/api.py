"""The Python API: save / load / open files kept in an s4fs store.

A path names a file in a store: a local path or ``file://`` URL inside a store root
(a folder holding ``s4fs-store.json``; a new store is created in the file's folder when
none is found above it), or ``s3://bucket/prefix/...`` the same way (``s4fs.paths``
finds it: ``filesystem``, ``resolve``, ``mount_of`` and ``open`` are its).
"""

from __future__ import annotations

import contextlib
import io

from s4fs.paths import (close_all, filesystem, mount_of, open,  # noqa: F401, A004
                        resolve)


class _WriteStream(io.RawIOBase):
    def __init__(self, handle) -> None:
        self._h = handle
        self._pos = 0

    def writable(self) -> bool:
        return True

    def write(self, b) -> int:
        n = self._h.write(self._pos, b)
        self._pos += n
        return n

    def tell(self) -> int:
        return self._pos


def save(obj, path, *, profile=None, config=None, **torch_save_kwargs) -> None:
    """``torch.save(obj, path)`` into the store: the stored file has exactly the bytes
    ``torch.save`` writes to a local file of that name; compressed (CUDA tensors on the
    GPU, straight from device memory), atomic. ``config``: a
    :class:`s4fs.torch.save.SaveConfig` (how a GPU save batches its work). See
    :mod:`s4fs.torch.save`."""
    from s4fs.torch import Unsupported
    from s4fs.torch.save import SaveConfig, save as direct_save
    try:
        direct_save(obj, path, profile=profile, config=config or SaveConfig(),
                    **torch_save_kwargs)
    except Unsupported as why:
        _stream_save(obj, path, why, **torch_save_kwargs)


def async_save(obj, path, *, profile=None, config=None, **torch_save_kwargs):
    """Like :func:`save`, but returns a ``concurrent.futures.Future`` as soon as ``obj``
    is snapshotted (its pickle, and a copy of every storage: on the GPU for CUDA
    tensors, in host memory for CPU ones); the tensors may change right away. The
    Future's ``result()`` is ``None`` once the file is committed, or raises what went
    wrong (nothing is committed then)."""
    from s4fs.torch import Unsupported
    from s4fs.torch.save import SaveConfig, async_save as direct_async_save
    try:
        return direct_async_save(obj, path, profile=profile, config=config or SaveConfig(),
                                 **torch_save_kwargs)
    except Unsupported as why:
        import concurrent.futures as cf
        fut = cf.Future()
        try:
            _stream_save(obj, path, why, **torch_save_kwargs)
        except BaseException as exc:               # noqa: BLE001 - reported in the Future
            fut.set_exception(exc)
        else:
            fut.set_result(None)
        return fut


def _stream_save(obj, path, why, **torch_save_kwargs) -> None:
    """torch.save into a stream (the archive folder is then torch's "archive/")."""
    import logging
    import torch
    logging.getLogger("s4fs.save").info("s4fs.save of %s streams the file (%s)", path, why)
    with writing(path) as w:
        torch.save(obj, w, **torch_save_kwargs)


@contextlib.contextmanager
def writing(path):
    """A buffered binary stream that becomes the file at ``path``: committed (in the
    store) when the block ends, nothing of it visible if the block raises. The stream may
    be closed inside the block (it is flushed then)."""
    fs, rel = resolve(path, create=True)
    h = fs.open_write(rel, truncate=True)
    w = io.BufferedWriter(_WriteStream(h), 4 << 20)
    try:
        yield w
        if not w.closed:
            w.flush()
        h.fsync()
    except BaseException:
        h.abort()
        raise
    h.release()


def write_bytes(path, data) -> None:
    """Store raw bytes (any file) at ``path``."""
    with writing(path) as w:
        w.write(data)


def read_bytes(path) -> bytes:
    with open(path) as f:
        return f.read()


def load(path, map_location=None, **torch_load_kwargs):
    """``torch.load`` of a stored file; the bytes torch sees are the exact bytes saved.
    With ``map_location="cuda"`` (or ``"cuda:N"``) and the GPU codec installed, the
    tensors are decoded on that GPU, not copied up from host memory."""
    from s4fs.torch.load import load as direct_load
    return direct_load(path, map_location, **torch_load_kwargs)
