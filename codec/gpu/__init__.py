"""GPU backend of s4fs.codec: fused split/merge kernels, nvCOMP ANS / GDeflate / Deflate,
batched over whole checkpoints. Imported lazily; importing it never imports CuPy or
nvCOMP (they load on first use).

    from s4fs.codec import gpu
    blobs = gpu.compress_many([(t, "bfloat16") for t in tensors])      # CUDA tensors
    out = gpu.decompress_many(blobs, out="device")                    # CuPy arrays

Blobs use the same chunk container as the CPU path: ``s4fs.codec.decompress`` reads
them (planes coded with nvCOMP ANS need a GPU; ``PORTABLE`` blobs decode anywhere), and
the GPU decodes CPU blobs. See docs/GPU.md.
"""

from __future__ import annotations

import contextlib
import functools

from s4fs.errors import CodecUnavailableError

from .._nvcomp_twins import installed_nvcomp_version
from ._profiles import DEFAULT, FLOAT, GDEFLATE_MANTISSA, PORTABLE, PROFILES, GpuProfile

__all__ = ["is_available", "require", "unavailable_reason", "compress", "compress_many",
           "decompress_many", "decompress_planes", "GpuProfile", "DEFAULT",
           "FLOAT", "PORTABLE", "GDEFLATE_MANTISSA", "PROFILES", "nvcomp_version",
           "crc32_many", "xxh3_128_pieces", "release_memory", "host_buffer", "to_device",
           "current_device", "on_device"]

@functools.lru_cache(maxsize=1)
def unavailable_reason() -> str | None:
    """Why the GPU codec cannot run here, or ``None`` when it can (probed once)."""
    try:
        import cupy
    except Exception as exc:  # ImportError, or a CUDA library that fails to load
        return f"cupy is not importable ({type(exc).__name__}: {exc})"
    try:
        from nvidia import nvcomp  # noqa: F401
    except Exception as exc:
        return f"nvidia-nvcomp is not importable ({type(exc).__name__}: {exc})"
    try:
        count = cupy.cuda.runtime.getDeviceCount()
    except Exception as exc:
        return f"no usable CUDA device ({type(exc).__name__}: {exc})"
    if count < 1:
        return "no CUDA device is visible"
    return None


def is_available() -> bool:
    """True when a CUDA device, CuPy and nvCOMP are all usable."""
    return unavailable_reason() is None


def require() -> None:
    """Raise :class:`CodecUnavailableError`, saying what is missing, unless usable."""
    why = unavailable_reason()
    if why is not None:
        raise CodecUnavailableError(
            f"device='cuda' needs a CUDA GPU with nvidia-nvcomp and cupy, but {why}; "
            f"install them with pip install 's4fs[gpu]' (CUDA 12) or 's4fs[gpu-cu13]' "
            f"(CUDA 13), or use device='cpu'")


def nvcomp_version() -> tuple[int, int, int] | None:
    return installed_nvcomp_version()


def compress(data, dt, *, base=None, profile=None) -> bytes:
    """One chunk on the GPU (``s4fs.codec.compress(device="cuda")`` lands here).
    ``profile`` is a :class:`GpuProfile`; anything else means the default."""
    from ._encode import compress_many as _many
    return _many([(data, dt, base)], profile=profile, out="bytes")[0]


def compress_many(items, *, profile: GpuProfile | None = None, out: str = "bytes",
                  timer=None) -> list:
    """Compress a whole batch (e.g. every chunk of a checkpoint) in a few launches.

    ``items``: ``(data, dtype)`` or ``(data, dtype, base)``; data and base are torch
    CUDA tensors, CuPy arrays or host buffers (staged through pinned memory). ``out``:
    ``"bytes"``, ``"host"`` (memoryviews into one pinned buffer, no extra copy) or
    ``"device"`` (CuPy views into one device buffer).
    """
    from ._encode import compress_many as _many
    return _many(items, profile=profile, out=out, timer=timer)


def decompress_many(blobs, bases=None, *, out: str = "bytes", verify: bool = True,
                    timer=None) -> list:
    """Decode a batch of blobs (host bytes-likes or device arrays) in a few launches.

    ``bases``: one delta base or ``None`` per blob. ``out`` as for
    :func:`compress_many`; ``"device"`` leaves the results on the GPU (CuPy arrays;
    ``torch.as_tensor(a, device="cuda")`` wraps one without a copy). Every result is
    checked against its recorded checksum on the device unless ``verify=False``.
    """
    from ._decode import decompress_many as _many
    return _many(blobs, bases, out=out, verify=verify, timer=timer)


def decompress_planes(blob, head, dt) -> bytes:
    """The merged planes of one blob (before a delta base is XOR-ed back in); used by
    ``s4fs.codec.decompress``, which XORs the base and checks the checksum itself."""
    from ._decode import decompress_many as _many
    return _many([blob], out="bytes", planes_only=True)[0]


def current_device() -> int | None:
    """The calling thread's current CUDA device (what ``torch.cuda.device(n)`` or
    ``cupy.cuda.Device(n)`` set; a new thread starts on device 0), or None where CuPy
    cannot be imported or sees no device."""
    try:
        import cupy
        return cupy.cuda.runtime.getDevice()
    except Exception:                      # noqa: BLE001 - no GPU stack (or device) here
        return None


def on_device(device: int | None):
    """A context in which ``device`` is the calling thread's current CUDA device; None:
    no change. Work handed to a helper thread must name its device: a new thread starts
    on device 0, so its buffers would land there, and a CUDA context be made there, in a
    process whose tensors live on another GPU (a rank's own GPU on an 8-GPU node)."""
    if device is None:
        return contextlib.nullcontext()
    import cupy
    return cupy.cuda.Device(device)


def crc32_many(ptrs: list[int], lens: list[int], *, device: int | None = None) -> list[int]:
    """The zip CRC-32 (``zlib.crc32``) of every buffer (device pointers and lengths on
    ``device``), computed on that GPU."""
    from ._backend import cuda_backend
    from ._wholefile import crc32_many as _many
    with on_device(device):
        return _many(cuda_backend(device), ptrs, lens) if ptrs else []


def xxh3_128_pieces(pieces: list, size: int, *, device: int | None = None) -> str:
    """``xxhash.xxh3_128(file).hexdigest()`` of a ``size``-byte file given as ``pieces``
    ``(offset, length, host bytes-like | device pointer)`` tiling it in order (its last
    64 bytes on the host), computed on the GPU (``device``, else the thread's current
    one) without assembling the file."""
    from ._backend import cuda_backend
    from ._wholefile import xxh3_128_pieces as _hash
    with on_device(device):
        return _hash(cuda_backend(device), pieces, size, [])


def host_buffer(nbytes: int):
    """A uint8 NumPy array in pinned (page-locked) host memory, from CuPy's pool: reads
    land there and go up to the device in one copy. Any thread may ask: no codec
    backend (a stream and the kernels' module, per thread) is made for it — the decode
    ahead asks from a new reader thread for every batch."""
    from ._backend import pinned_host
    return pinned_host(nbytes)[: max(int(nbytes), 0)]


def to_device(host):
    """A device (CuPy) copy of a host uint8 array, complete when this returns (on this
    thread's codec stream)."""
    from ._backend import cuda_backend
    b = cuda_backend()
    dev = b.empty(host.nbytes)
    if host.nbytes:
        b.upload(dev, 0, host)
    b.synchronize()
    return dev


def release_memory(pinned: bool = False, device: int | None = None) -> None:
    """Give the device memory the codec's pool caches back (torch's allocator, or any
    other, can then use it); with ``pinned``, also the pinned host memory its pool keeps
    unused. Safe to call when CuPy is not installed.

    ``s4fs.save``, ``async_save`` and the GPU load give device memory back after every
    call but keep the pinned blocks: pinning is slow, and freeing them after every save
    made the next save pin its batch again, about twice its time. What stays pinned
    is bounded: requests come in size classes (``_backend.pinned_size``) and batches
    are at most 1 GiB of input, so a process keeps a few blocks, not more with every
    save. CuPy keeps a pool per device: this frees ``device``'s (else the calling
    thread's current device's)."""
    try:
        import cupy
    except Exception:                      # noqa: BLE001 - nothing cached then
        return
    with on_device(device):
        cupy.get_default_memory_pool().free_all_blocks()
    if pinned:
        cupy.get_default_pinned_memory_pool().free_all_blocks()
