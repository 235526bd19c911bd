"""The GPU paths of the data pipeline on a machine without a GPU.

``emulated_gpu(monkeypatch)`` tells s4fs a GPU is there (``_device.pipeline`` answers
"cuda") and runs ``s4fs.codec.gpu.compress_many`` / ``decompress_many`` as the real GPU
pipeline on its CPU emulation: the kernels compiled as C++, zlib standing in for nvCOMP.
Everything around them (batching, deltas, futures, decode ahead, fallbacks) is the code
users run. With the ``portable`` GPU profile the blobs are nvCOMP-Deflate planes, which
any CPU decodes, so files read back through the normal CPU path too.
"""

from __future__ import annotations

import pytest


def emulated_gpu(monkeypatch) -> dict:
    """Patch in the emulated GPU; returns a log: {"encode": [batch sizes], "decode": [...]}."""
    from s4fs.codec import _device, gpu
    from s4fs.codec.gpu import _decode, _emulate, _encode
    from s4fs.codec.gpu._backend import EmulatedBackend
    if _emulate.compiler() is None:
        pytest.skip("no C++ compiler to emulate the GPU kernels")
    emu = EmulatedBackend()
    log: dict = {"encode": [], "decode": []}

    def compress_many(items, **kw):
        items = list(items)
        log["encode"].append(len(items))
        return _encode.compress_many(items, backend=emu, **kw)

    def decompress_many(blobs, bases=None, **kw):
        blobs = list(blobs)
        log["decode"].append(len(blobs))
        return _decode.decompress_many(blobs, bases, backend=emu, **kw)
    import numpy as np
    monkeypatch.setattr(_device, "pipeline", lambda device: "cuda")
    monkeypatch.setattr(gpu, "host_buffer", lambda n: np.empty(n, dtype=np.uint8))
    monkeypatch.setattr(gpu, "to_device", lambda host: host)
    monkeypatch.setattr(gpu, "compress_many", compress_many)
    monkeypatch.setattr(gpu, "decompress_many", decompress_many)
    return log
