"""s4fs.mount — the pyfuse3 + trio adapter.

Translates pyfuse3's requests into calls on the FUSE-free core (:class:`s4fs.vfs.Vfs`,
``_ops``), carries out what only the kernel can do for it (:class:`s4fs.vfs.KernelPort`
over pyfuse3, ``_port``) and maps errors to errno in exactly one place
(``_ops._fuse_errors``). Imports pyfuse3 and trio, so it is imported only by the mount
daemon.
"""

from ._binding import build_passthrough
from ._daemon import (mount_foreground, prepare_mountpoint, require_passthrough, run_daemon,
                      unmount)

__all__ = ["build_passthrough", "mount_foreground", "prepare_mountpoint",
           "require_passthrough", "run_daemon", "unmount"]
