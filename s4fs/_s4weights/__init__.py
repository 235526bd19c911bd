"""``import s4weights`` — the s4fs Python API under the name older code uses."""

from s4fs import __getattr__ as _get

save = _get("save")
load = _get("load")
open = _get("open")  # noqa: A001
save_checkpoint = _get("save_checkpoint")
load_checkpoint = _get("load_checkpoint")
list_checkpoints = _get("list_checkpoints")


def __getattr__(name):
    return _get(name)
