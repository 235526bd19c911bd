"""s4fs.codec — lossless byte-plane codec for tensor bytes.

Pure functions over buffers; knows nothing about files, stores or FUSE.

    blob = compress(data, "bfloat16")             # data: bytes-like, ndarray or tensor
    assert decompress(blob) == bytes(data)
    blob = compress(new, "float32", base=old)     # byte-XOR delta against ``old``
    assert decompress(blob, base=old) == bytes(new)
    blob = compress(master, "float32", base=copy, transform="pair", base_dtype="bfloat16")
    assert decompress(blob, base=copy) == bytes(master)   # fp32 words on their bf16 copy
"""

from s4fs.errors import (BaseMismatchError, ChecksumError, CodecError,
                         CodecUnavailableError, FormatError, UnsupportedVersionError)

from . import _device, _nvcomp_twins, _plane_codecs
from ._core import BlobInfo, CpuProfile, as_bytes, checksum, compress, decompress, inspect, xor
from ._dtypes import DType, dtype_names, lookup
from ._planes import plane_roles
from ._pair import HALF as PAIR_COPIES
from ._pair import nearest as pair_rounding
from ._pair import rounds_to as pair_share
from ._container import unpack as read_header
from ._device import (AUTO_GPU_BELOW_CORES, DEVICES, gpu_available, has_gpu_planes,
                      on_gpu_thread, stop_gpu_thread)

# the nvCOMP plane codec ids are registered here, held by the GPU codecs' CPU twins: each
# decodes what s4fs.codec.gpu writes under its id (or refuses, saying what is needed), and
# the GPU decodes what the twin writes; importing s4fs.codec.gpu registers nothing
for _twin in _nvcomp_twins.ALL:
    _plane_codecs.register(_twin)
del _twin


def resolve_device(device: str) -> str:
    """``"cpu"`` or ``"cuda"``: where a whole pipeline (the mount's coding, decoding
    ahead) runs under the setting ``device`` (``"auto"``, ``"cpu"`` or ``"cuda"``;
    ``"cuda"`` without a usable GPU raises, saying what is missing)."""
    return _device.pipeline(device)


__all__ = [
    "compress", "decompress", "inspect", "BlobInfo", "CpuProfile", "DType", "dtype_names",
    "lookup", "checksum", "xor", "as_bytes", "gpu_available", "stop_gpu_thread",
    "DEVICES", "AUTO_GPU_BELOW_CORES", "resolve_device", "on_gpu_thread", "has_gpu_planes",
    "read_header", "plane_roles", "pair_share", "pair_rounding", "PAIR_COPIES",
    "CodecError", "FormatError", "ChecksumError", "BaseMismatchError",
    "UnsupportedVersionError", "CodecUnavailableError",
]
