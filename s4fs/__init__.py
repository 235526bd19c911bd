"""s4fs — lossless, GPU-accelerated, transparent checkpoint filesystem for PyTorch.

``import s4fs`` needs neither a GPU, nor pyfuse3, nor boto3, nor torch: the parts that
use them import lazily.
"""

from s4fs._version import __version__
from s4fs.errors import S4Error


def __getattr__(name):
    if name in _API:
        from s4fs import api
        return getattr(api, name)
    if name in _CKPT:
        from s4fs import checkpoints
        return getattr(checkpoints, name)
    raise AttributeError(f"module 's4fs' has no attribute {name!r}")


_API = ("save", "async_save", "load", "open", "write_bytes", "read_bytes", "resolve", "filesystem")
_CKPT = ("save_checkpoint", "load_checkpoint", "list_checkpoints")
__all__ = ["S4Error", "__version__", *_API, *_CKPT]
