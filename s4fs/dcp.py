"""torch.distributed.checkpoint (DCP) straight into an s4fs store, no mount needed.

    import torch.distributed.checkpoint as dcp
    from s4fs.dcp import StorageWriter, StorageReader

    dcp.save(state, storage_writer=StorageWriter("s3://bucket/run7/step_100"))
    dcp.async_save(state, storage_writer=StorageWriter("s3://bucket/run7/step_200"))
    dcp.load(state, storage_reader=StorageReader("s3://bucket/run7/step_200"))

Every rank writes its own shard file (``__<rank>_0.distcp``) and rank 0 the
``.metadata``, exactly DCP's file layout (a mount of the same store shows the same
files). A checkpoint folder's parent is the store root (created on the first save when
there is none); each shard is coded with the s4fs codec as a delta against the same
rank's shard of the previous step folder (``step_100/__3_0.distcp`` → ``step_200/
__3_0.distcp``: the delta-base rules of docs/FORMAT.md), and committed — durable in the
store — when its stream closes, so DCP's own ``fsync`` step is not needed
(``sync_files`` defaults to False). Loading works with any world size: DCP reshards.

The writer and reader are DCP's file-system ones with the file operations pointed at
the store (:class:`S4FileSystem`): everything DCP does with files — staging for
``async_save``, one file per rank, the metadata written last and renamed into place —
is DCP's own code.
"""

from __future__ import annotations

import os
from contextlib import contextmanager

from torch.distributed.checkpoint.filesystem import (FileSystemBase, FileSystemReader,
                                                     FileSystemWriter)

from s4fs import api
from s4fs.errors import AlreadyExists, InvalidArgument, NotFound


def _url(path) -> str:
    return os.fspath(path).rstrip("/") if isinstance(path, (str, os.PathLike)) else path


class S4FileSystem(FileSystemBase):
    """DCP's file operations on an s4fs store; paths are store paths or ``s3://`` URLs."""

    @contextmanager
    def create_stream(self, path, mode: str):
        path = _url(path)
        if "r" in mode and "+" not in mode:
            with api.open(path) as f:
                yield f
            return
        if mode not in ("wb", "w"):
            raise InvalidArgument(f"s4fs.dcp: mode {mode!r} is not supported (wb or rb)")
        with api.writing(path) as w:      # committed: in the store when this returns
            yield w

    def concat_path(self, path, suffix: str) -> str:
        return f"{_url(path)}/{suffix}"

    def init_path(self, path) -> str:
        return _url(path)

    def rename(self, path, new_path) -> None:
        fs, old = api.resolve(_url(path))
        fs2, new = api.resolve(_url(new_path), create=True)
        if fs2 is not fs:
            raise InvalidArgument(f"s4fs.dcp: cannot rename {path} to {new_path}: they are "
                                  f"in different stores")
        fs.rename(old, new)

    def mkdir(self, path) -> None:
        # a checkpoint folder's parent is the store root when there is no store above
        fs, rel = api.resolve(_url(path), create=True)
        parts = [p for p in rel.split("/") if p]
        for i in range(len(parts)):
            d = "/".join(parts[: i + 1])
            try:
                if not fs.exists(d):
                    fs.mkdir(d)
            except AlreadyExists:
                pass                      # another rank made it first

    @classmethod
    def validate_checkpoint_id(cls, checkpoint_id) -> bool:
        path = _url(checkpoint_id)
        if path.startswith("s3://"):
            return True
        try:
            api.resolve(path)
            return True
        except (InvalidArgument, NotFound):
            return False

    def exists(self, path) -> bool:
        try:
            fs, rel = api.resolve(_url(path))
        except InvalidArgument:
            return False
        return fs.exists(rel)

    def rm_file(self, path) -> None:
        fs, rel = api.resolve(_url(path))
        fs.unlink(rel)

    def ls(self, path) -> list[str]:
        fs, rel = api.resolve(_url(path))
        return [f"{_url(path)}/{n}" for n in fs.listdir(rel)]


class StorageWriter(FileSystemWriter):
    """DCP's ``FileSystemWriter`` writing into an s4fs store (module docstring)."""

    def __init__(self, path, *, single_file_per_rank: bool = True, sync_files: bool = False,
                 thread_count: int = 1, per_thread_copy_ahead: int = 10_000_000,
                 overwrite: bool = True, **kwargs) -> None:
        super().__init__(path, single_file_per_rank=single_file_per_rank,
                         sync_files=sync_files, thread_count=thread_count,
                         per_thread_copy_ahead=per_thread_copy_ahead, overwrite=overwrite,
                         **kwargs)
        self.fs = S4FileSystem()
        self.path = self.fs.init_path(path)

    @classmethod
    def validate_checkpoint_id(cls, checkpoint_id) -> bool:
        return S4FileSystem.validate_checkpoint_id(checkpoint_id)


class StorageReader(FileSystemReader):
    """DCP's ``FileSystemReader`` reading from an s4fs store (module docstring)."""

    def __init__(self, path, **kwargs) -> None:
        super().__init__(path, **kwargs)
        self.fs = S4FileSystem()
        self.path = self.fs.init_path(path)

    @classmethod
    def validate_checkpoint_id(cls, checkpoint_id) -> bool:
        return S4FileSystem.validate_checkpoint_id(checkpoint_id)
