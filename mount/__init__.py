"""s4fs.mount — the pyfuse3 + trio adapter.

Translates FUSE operations into calls on :class:`s4fs.fs.Filesystem` and maps errors to
errno in exactly one place (:func:`_fuse_errors`). Imports pyfuse3 and trio, so it is
imported only by the mount daemon.
"""

from ._binding import build_passthrough
from ._daemon import (mount_foreground, prepare_mountpoint, require_passthrough, run_daemon,
                      unmount)

__all__ = ["build_passthrough", "mount_foreground", "prepare_mountpoint",
           "require_passthrough", "run_daemon", "unmount"]
