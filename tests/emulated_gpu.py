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
    from s4fs.codec import _device
    from s4fs.codec.gpu import _emulate
    if _emulate.compiler() is None:
        pytest.skip("no C++ compiler to emulate the GPU kernels")
    log: dict = {"encode": [], "decode": []}
    monkeypatch.setattr(_device, "pipeline", lambda device: "cuda")
    for obj, name, value in _patches(log):
        monkeypatch.setattr(obj, name, value)
    return log


def install_in_worker() -> None:
    """The same emulation, for good, in a GPU worker process
    (``RuntimeConfig(gpu_worker_init="emulated_gpu:install_in_worker")``)."""
    for obj, name, value in _patches({"encode": [], "decode": []}):
        setattr(obj, name, value)


def install_broken_in_worker() -> None:
    """A GPU worker whose GPU fails every batch it is asked to code (out of memory)."""
    from s4fs.codec import gpu
    install_in_worker()

    def broken(items, **kw):
        raise MemoryError("out of memory allocating 64 MiB on the device")
    gpu.compress_many = broken


def _patches(log: dict) -> list:
    import numpy as np

    from s4fs.codec import gpu
    from s4fs.codec.gpu import _decode, _encode
    from s4fs.codec.gpu._backend import EmulatedBackend
    emu = EmulatedBackend()

    def compress_many(items, **kw):
        items = list(items)
        log["encode"].append(len(items))
        return _encode.compress_many(items, backend=emu, **kw)

    def decompress_many(blobs, bases=None, **kw):
        blobs = list(blobs)
        log["decode"].append(len(blobs))
        return _decode.decompress_many(blobs, bases, backend=emu, **kw)
    return [(gpu, "host_buffer", lambda n: np.empty(n, dtype=np.uint8)),
            (gpu, "to_device", lambda host: host),
            (gpu, "compress_many", compress_many),
            (gpu, "decompress_many", decompress_many)]
