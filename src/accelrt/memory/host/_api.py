"""The host allocator's public functions (``empty_host`` & friends) and the process's host
allocators, one per backend."""

from __future__ import annotations

import threading

from ... import _runtime
from ..._device import DeviceLike
from ...backends._base import Backend
from .._atomic import PENDING, deliver, register
from ..device._requests import _as_size
from ._allocator import HostCachingAllocator
from ._buffer import HostBuffer

__all__ = [
    "empty_host",
    "empty_host_cache",
    "get_host_allocator",
    "host_memory_stats",
    "reset_accumulated_host_memory_stats",
    "reset_peak_host_memory_stats",
]


# ---------------------------------------------------------------------- the process's allocators
_lock = threading.Lock()
_allocators: dict[str, HostCachingAllocator] = {}


def _allocator_of(backend: Backend) -> HostCachingAllocator:
    allocator = _allocators.get(backend.name)
    if allocator is not None and allocator.backend is backend:
        return allocator
    with _lock:
        allocator = _allocators.get(backend.name)
        if allocator is None or allocator.backend is not backend:
            allocator = _allocators[backend.name] = HostCachingAllocator(backend)
        return allocator


def _existing_allocator() -> HostCachingAllocator | None:
    """The accelerator's host allocator if it exists; creates nothing, initialises no driver."""
    backend = _runtime.accelerator()
    if backend is None:
        return None
    allocator = _allocators.get(backend.name)
    return allocator if allocator is not None and allocator.backend is backend else None


def _reset() -> None:
    with _lock:
        for allocator in _allocators.values():
            allocator.empty_cache()
        _allocators.clear()


_runtime.on_reset(_reset)


# ---------------------------------------------------------------------- the public API
def empty_host(nbytes: int, *, device: DeviceLike = None) -> HostBuffer:
    """Allocate uninitialised pinned host memory from the host caching allocator.

    Parameters
    ----------
    nbytes : int
        Size in bytes, 0 <= nbytes <= 2**60. The block is ``nbytes`` rounded up to a power of
        two. Zero gives an empty buffer (``ptr == 0``) without touching the allocator, as
        PyTorch does.
    device : int, str, Device or None
        The device the memory is for (whose driver pins it); None for the current device.

    Returns
    -------
    HostBuffer
        Host memory that ``accelrt.copy_`` copies to and from device buffers asynchronously.

    Raises
    ------
    TypeError
        If ``nbytes`` is not an integer, or ``device`` is of a bad type.
    ValueError
        If ``nbytes`` is negative or over 2**60, or the device is out of range or not the
        accelerator's.
    RuntimeError
        If there is no accelerator.
    OutOfMemoryError
        If the backend has no host memory for a new block.

    Notes
    -----
    Thread-safe. The memory is pinned where the backend can pin it
    (``HostBuffer.pinned``; on ``sim`` it is ordinary page-aligned memory). A freed buffer's
    block is reused once every stream that used it has finished that work. Mirrors
    ``torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)``.

    Examples
    --------
    >>> import accelrt as acc
    >>> with acc.empty_host(1000) as host:
    ...     host.nbytes
    1000
    >>> acc.host_memory_stats()["allocated_bytes.current"]
    1024
    """
    if type(nbytes) is not int:
        nbytes = _as_size(nbytes)
    if nbytes < 0:
        raise ValueError(f"allocation size must be >= 0 bytes, got {nbytes}")
    backend, index = _runtime.resolve_device(device)
    allocator = _allocator_of(backend)
    where, pinned = allocator.device_info(index)
    if nbytes == 0:
        return HostBuffer(None, None, 0, where, pinned)
    try:  # atomic: the block is never allocated without a HostBuffer that frees it
        return HostBuffer(allocator, allocator.malloc(nbytes, index), nbytes, where, pinned)
    finally:
        if PENDING.flag:
            deliver()


register(empty_host)


def get_host_allocator() -> HostCachingAllocator:
    """Return the accelerator's host caching allocator, creating it on first use.

    Returns
    -------
    HostCachingAllocator
        The one host allocator of the accelerator backend; for tools and benchmarks that work
        below ``empty_host``.

    Raises
    ------
    RuntimeError
        If there is no accelerator.
    """
    return _allocator_of(_runtime.require_accelerator())


def host_memory_stats() -> dict[str, int]:
    """Return the host caching allocator's statistics.

    Returns
    -------
    dict of str to int
        Sorted flat keys, as ``torch.cuda.host_memory_stats()``: ``allocations``,
        ``allocated_bytes`` (blocks and bytes held from the backend, in use or cached),
        ``active_requests``, ``active_bytes`` (blocks and bytes handed out and not yet
        reusable), each ``.current``, ``.peak``, ``.allocated`` and ``.freed``;
        ``num_host_alloc`` and ``num_host_free`` (backend allocations and releases);
        ``host_alloc_time`` and ``host_free_time`` (microseconds in the backend's host
        allocations and releases), each ``.total``, ``.max``, ``.min``, ``.count`` and ``.avg``.
        Sizes are the rounded block sizes, in bytes. Empty before the first ``empty_host``.

    Raises
    ------
    ValueError
        If ``ACCELRT_BACKEND`` names an unregistered backend.

    Notes
    -----
    The ``active_*`` peaks are the sums of each block size's own peak, as PyTorch reports them
    (an upper bound of the true peak). A block freed after use on a stream stays active until
    an allocation or ``empty_host_cache`` sees its event completed. Creates nothing and
    initialises no driver. Mirrors ``torch.cuda.host_memory_stats``.
    """
    allocator = _existing_allocator()
    return allocator.memory_stats() if allocator is not None else {}


def empty_host_cache() -> None:
    """Return every cached, unused host block to the backend; no-op before first use.

    Blocks still in use, and freed blocks whose streams have not finished with them, stay
    (it does not wait for streams).

    Raises
    ------
    ValueError
        If ``ACCELRT_BACKEND`` names an unregistered backend.
    AcceleratorError
        For a driver error; what was not released stays cached.

    Notes
    -----
    Thread-safe. Mirrors ``torch.accelerator.empty_host_cache``.
    """
    allocator = _existing_allocator()
    if allocator is not None:
        allocator.empty_cache()


def reset_peak_host_memory_stats() -> None:
    """Set every peak host statistic to its current value; no-op before first use.

    Also clears the ``min`` and ``max`` of ``host_alloc_time`` and ``host_free_time``. Raises
    as ``host_memory_stats``. Mirrors ``torch.cuda.reset_peak_host_memory_stats``.
    """
    allocator = _existing_allocator()
    if allocator is not None:
        allocator.reset_peak_memory_stats()


def reset_accumulated_host_memory_stats() -> None:
    """Zero the accumulated host statistics; no-op before first use.

    The ``.allocated`` and ``.freed`` sums, hence ``num_host_alloc`` and ``num_host_free``,
    and the ``total`` and ``count`` of the times. Raises as ``host_memory_stats``. Mirrors
    ``torch.cuda.reset_accumulated_host_memory_stats``.
    """
    allocator = _existing_allocator()
    if allocator is not None:
        allocator.reset_accumulated_memory_stats()
