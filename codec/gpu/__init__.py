"""GPU backend of s4fs.codec (nvCOMP ANS / GDeflate through CuPy). Imported lazily."""

from __future__ import annotations

from s4fs.errors import CodecUnavailableError


def is_available() -> bool:
    return False


def require() -> None:
    raise CodecUnavailableError(
        "device='cuda' needs a CUDA GPU with nvidia-nvcomp and cupy "
        "(pip install 's4fs[gpu]' or 's4fs[gpu-cu13]')")
