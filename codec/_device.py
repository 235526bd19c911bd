"""Where coding runs, decided in one place: the CPU or the GPU.

* **probe** — whether the GPU codec can run here (a CUDA device, CuPy and nvCOMP), asked
  once, lazily, never at import time, and never raising (a broken driver must not break
  the CPU path): :func:`gpu_reason`, :func:`gpu_available`.
* **preference** — what ``device="auto"`` means for one call (:func:`use_gpu`,
  :func:`decode_on_gpu`: device-resident data always goes to the GPU, host buffers from
  ``AUTO_MIN_HOST_BYTES`` up when a GPU is usable) and for a whole pipeline
  (:func:`pipeline`: the mount's and the ingest's coding, the API's loads).
* **the GPU thread** — every piece of GPU codec work in a process runs on one
  long-lived thread (:func:`on_gpu_thread`, :func:`submit_gpu`): CUDA, CuPy and nvCOMP
  keep per-thread state, and the callers (ingest and read pools) are many threads.

Configuration (``device = "auto" | "cpu" | "cuda"`` in s4fs.toml, ``--device`` on the
command line, ``device=`` in the API) is checked by :func:`check` and mapped by these
functions; nothing else in s4fs chooses a device. Which executor runs a pipeline (worker
processes or threads, and which pool) is ``s4fs.coding.placement``'s choice, built on
:func:`pipeline`.
"""

from __future__ import annotations

import functools
import os
import threading
from concurrent.futures import Future, ThreadPoolExecutor

from s4fs.errors import CodecError

DEVICES = ("auto", "cpu", "cuda")

# host buffers smaller than this stay on the CPU under device="auto" (the copies and
# launches cost more than the CPU codec)
AUTO_MIN_HOST_BYTES = 1 << 20

# a pipeline under "auto" codes on the GPU only on machines with fewer cores than this:
# with 16 cores the GPU worker process saves faster than the CPU coding workers, but a
# fresh node's cold load (everything decoded ahead) is slower (docs/BENCHMARKS.md §4);
# a few cores code at well under 1 GB/s and the GPU at tens of GB/s
AUTO_GPU_BELOW_CORES = 16


def check(device: str) -> str:
    """``device`` itself when it is one of :data:`DEVICES`, else a clear error."""
    if device not in DEVICES:
        raise CodecError(f"device must be 'auto', 'cpu' or 'cuda', not {device!r}")
    return device


@functools.lru_cache(maxsize=1)
def gpu_reason() -> str | None:
    """Why the GPU codec cannot run here, or ``None`` when it can (probed once)."""
    try:
        from . import gpu
        return gpu.unavailable_reason()
    except Exception as exc:        # ImportError, or a CUDA library that fails to load
        return f"the GPU codec does not load ({type(exc).__name__}: {exc})"


def gpu_available() -> bool:
    """True when a CUDA device, CuPy and nvCOMP are all importable and usable."""
    return gpu_reason() is None


def require_gpu() -> None:
    """Raise :class:`~s4fs.errors.CodecUnavailableError`, saying what is missing and how
    to install it, unless the GPU codec can run here."""
    from . import gpu
    gpu.require()


def pipeline(device: str) -> str:
    """``"cpu"`` or ``"cuda"``: where a whole pipeline (the mount's coding and decoding
    ahead) runs under this setting. ``"auto"`` is the GPU when one is usable and the
    machine has fewer than ``AUTO_GPU_BELOW_CORES`` cores (where it is the faster of the
    two); ``"cuda"`` without a usable GPU raises."""
    check(device)
    if device == "cuda":
        require_gpu()
        return "cuda"
    if device == "auto" and (os.cpu_count() or 1) < AUTO_GPU_BELOW_CORES and gpu_available():
        return "cuda"
    return "cpu"


def prefers_gpu(data) -> bool:
    """Whether ``device="auto"`` codes ``data`` on the GPU (when one is usable)."""
    mod = type(data).__module__
    if mod.startswith("torch"):
        if getattr(data, "is_cuda", False):
            return True
        return data.numel() * data.element_size() >= AUTO_MIN_HOST_BYTES
    if mod.startswith("cupy") or hasattr(data, "__cuda_array_interface__"):
        return True
    try:
        return memoryview(data).nbytes >= AUTO_MIN_HOST_BYTES
    except TypeError:
        return False


def use_gpu(device: str, data=None) -> bool:
    """Whether one ``compress`` call (of ``data``) runs on the GPU."""
    check(device)
    if device == "cpu":
        return False
    if device == "cuda":
        require_gpu()
        return True
    return gpu_available() and (data is None or prefers_gpu(data))


def has_gpu_planes(head) -> bool:
    """Whether a blob (its parsed container header) has planes coded by nvCOMP, which
    a GPU decodes (ANS only there)."""
    return any(p.codec_id >= 16 for p in head.planes)       # the nvCOMP ids: 16, 17, 18


def decode_on_gpu(device: str, head) -> bool:
    """Whether one ``decompress`` call runs on the GPU: under ``"auto"``, only blobs
    with planes coded by nvCOMP (every other plane decodes faster on the CPU here)."""
    check(device)
    if device == "cpu" or not has_gpu_planes(head) and device == "auto":
        return False
    return use_gpu(device)


# Process-wide: CUDA, CuPy and nvCOMP state (streams, codecs, pinned pools) is per thread
# and per process, and the codec's callers (s4fs.codec.compress, the pools) have no
# owner to hand a thread down; a runtime stops it at its close (stop_gpu_thread).
_GPU_LOCK = threading.Lock()
_GPU_THREAD: ThreadPoolExecutor | None = None
_THREAD_NAME = "s4fs-gpu"


def _gpu_thread() -> ThreadPoolExecutor:
    global _GPU_THREAD
    if _GPU_THREAD is None:
        with _GPU_LOCK:
            if _GPU_THREAD is None:
                _GPU_THREAD = ThreadPoolExecutor(1, thread_name_prefix=_THREAD_NAME)
    return _GPU_THREAD


def stop_gpu_thread() -> None:
    """Stop the GPU thread once its queued calls are done (its owner's close; the next
    GPU call starts a new one)."""
    global _GPU_THREAD
    with _GPU_LOCK:
        t, _GPU_THREAD = _GPU_THREAD, None
    if t is not None:
        t.shutdown(wait=True)


def on_gpu_thread(fn, *args, **kwargs):
    """``fn(*args, **kwargs)`` on the process's GPU thread; its result (or exception)."""
    if threading.current_thread().name.startswith(_THREAD_NAME):
        return fn(*args, **kwargs)
    return _gpu_thread().submit(fn, *args, **kwargs).result()


def submit_gpu(fn, *args, **kwargs) -> Future:
    """Queue ``fn`` on the GPU thread without waiting (batches of the mount's GPU
    worker); the Future holds its result or exception."""
    return _gpu_thread().submit(fn, *args, **kwargs)
