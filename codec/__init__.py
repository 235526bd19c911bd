"""s4fs.codec — lossless byte-plane codec for tensor bytes.

Pure functions over buffers; knows nothing about files, stores or FUSE.

    blob = compress(data, "bfloat16")             # data: bytes-like, ndarray or tensor
    assert decompress(blob) == bytes(data)
    blob = compress(new, "float32", base=old)     # byte-XOR delta against ``old``
    assert decompress(blob, base=old) == bytes(new)
"""

from s4fs.errors import (BaseMismatchError, ChecksumError, CodecError,
                         CodecUnavailableError, FormatError, UnsupportedVersionError)

from ._core import BlobInfo, CpuProfile, as_bytes, checksum, compress, decompress, inspect, xor
from ._dtypes import DType, dtype_names, lookup
from ._device import gpu_available

__all__ = [
    "compress", "decompress", "inspect", "BlobInfo", "CpuProfile", "DType", "dtype_names",
    "lookup", "checksum", "xor", "as_bytes", "gpu_available", "CodecError", "FormatError",
    "ChecksumError", "BaseMismatchError", "UnsupportedVersionError", "CodecUnavailableError",
]
