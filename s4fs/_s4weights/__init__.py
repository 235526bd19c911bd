"""``import s4weights`` — the s4fs Python API under the name older code uses."""

from s4fs import api as _api
from s4fs import checkpoints as _checkpoints

save = _api.save
load = _api.load
open = _api.open  # noqa: A001
save_checkpoint = _checkpoints.save_checkpoint
load_checkpoint = _checkpoints.load_checkpoint
list_checkpoints = _checkpoints.list_checkpoints


def __getattr__(name):
    for module in (_api, _checkpoints):
        if hasattr(module, name) and not name.startswith("_"):
            return getattr(module, name)
    raise AttributeError(f"module 's4weights' has no attribute {name!r}")
