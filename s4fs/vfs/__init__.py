"""The filesystem core as the kernel sees it, with no FUSE in it.

:class:`Vfs` owns what a mount keeps between requests — inode numbers, file handles,
open counts, the namespace lock, the passthrough policy — and answers each operation
in plain data. ``s4fs.mount`` translates pyfuse3 requests into calls on it; the
:class:`KernelPort` is all it needs of the kernel (register and drop a backing file,
drop an inode's pages or attributes, drop a name), so tests drive it with a recording
fake and no root.
"""

from s4fs.vfs.core import Entry, Opened, Vfs
from s4fs.vfs.passthrough import NO_PASSTHROUGH, Backing, Passthrough
from s4fs.vfs.port import KernelPort
from s4fs.vfs.tables import ROOT_INODE, NamespaceLock, Tables

__all__ = ["Vfs", "Entry", "Opened", "KernelPort", "Passthrough", "Backing",
           "NO_PASSTHROUGH", "Tables", "NamespaceLock", "ROOT_INODE"]
