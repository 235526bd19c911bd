"""Write a file so that readers see the old one or the whole new one, never a part."""

from __future__ import annotations

import os


def replace_from_temp(fd: int, tmp: str, dest: str, *parts) -> None:
    """Write ``parts`` to the open temporary file ``fd`` (named ``tmp``, in ``dest``'s
    folder), fsync it and rename it over ``dest``; on any error the temporary file is
    removed and the error raised."""
    try:
        with os.fdopen(fd, "wb") as f:
            for p in parts:
                if p:
                    f.write(p)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, dest)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
