"""Shared pytest setup: markers are declared in pyproject.toml (strict).

Fixture modules owned by each area are imported here so every test sees them.
"""

from __future__ import annotations

import importlib
import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(__file__))
# the real-model payload the benchmarks share with the tests (bench/_minilm.py; not in
# the package)
sys.path.append(os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                             "bench"))

for _mod in ("s3_server", "mount_helpers"):
    try:
        _m = importlib.import_module(_mod)
    except ModuleNotFoundError as _exc:
        if _exc.name != _mod:
            raise
        continue
    globals().update({k: v for k, v in vars(_m).items() if not k.startswith("_")})


def _cuda_ready() -> tuple[bool, str]:
    try:
        from s4fs.codec import gpu_available
    except Exception as exc:  # pragma: no cover
        return False, f"s4fs.codec import failed: {exc}"
    if gpu_available():
        return True, ""
    return False, "no CUDA GPU with CuPy and nvCOMP on this machine"


def pytest_collection_modifyitems(config, items):
    # by marker, not keyword: every test under tests/gpu/ has the keyword "gpu" (its
    # folder), and the emulated-GPU tests there run on any machine
    gpu_items = [i for i in items if i.get_closest_marker("gpu") is not None]
    if gpu_items:
        ok, why = _cuda_ready()
        if not ok:
            for item in gpu_items:
                item.add_marker(pytest.mark.skip(reason=why))
