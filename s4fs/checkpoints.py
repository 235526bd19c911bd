"""The checkpoint store: numbered checkpoints under one root, stored as delta chains.

    s4fs.save_checkpoint("s3://bucket/run7", 1000, {"model": ..., "optimizer": ...})
    state = s4fs.load_checkpoint("s3://bucket/run7")          # the newest
    s4fs.list_checkpoints("s3://bucket/run7")                  # [100, 200, ..., 1000]

Checkpoint ``step`` lives at ``ROOT/step-<step>.pt``: an ordinary file, visible through
the mount too, coded against the previous checkpoint (see s4fs.write.bases).
"""

from __future__ import annotations

import os
import re

from s4fs.errors import InvalidArgument, NotFound

_NAME = re.compile(r"^step-(\d+)\.pt$")


def _path(root, step: int) -> str:
    if not isinstance(step, int) or step < 0:
        raise InvalidArgument(f"step must be a non-negative int, not {step!r}")
    root = os.fspath(root)
    return f"{root.rstrip('/')}/step-{step}.pt"


def save_checkpoint(root, step: int, obj, **torch_save_kwargs) -> str:
    """Save ``obj`` as checkpoint ``step`` under ``root``; returns its path."""
    from s4fs.api import save
    path = _path(root, step)
    save(obj, path, **torch_save_kwargs)
    return path


def list_checkpoints(root) -> list[int]:
    """Steps of every checkpoint under ``root``, ascending."""
    from s4fs.api import resolve
    fs, rel = resolve(_path(root, 0))
    folder = rel.rsplit("/", 1)[0] if "/" in rel else ""
    try:
        names = fs.listdir(folder)
    except NotFound:
        return []
    return sorted(int(m.group(1)) for n in names if (m := _NAME.match(n)))


def load_checkpoint(root, step: int | None = None, **torch_load_kwargs):
    """Load checkpoint ``step`` (the newest when None)."""
    from s4fs.api import load
    if step is None:
        steps = list_checkpoints(root)
        if not steps:
            raise NotFound(f"no checkpoints under {os.fspath(root)}")
        step = steps[-1]
    return load(_path(root, step), **torch_load_kwargs)
