"""Probe optional GPU support once, lazily; never at import time of s4fs."""

from __future__ import annotations

import functools


@functools.lru_cache(maxsize=1)
def gpu_available() -> bool:
    """True when a CUDA device, CuPy and nvCOMP are all importable and usable."""
    try:
        from . import gpu
    except ImportError:
        return False
    try:
        return gpu.is_available()
    except Exception:  # a broken driver must not break the CPU path
        return False
