"""The top-level memory API: allocation, copies and statistics of the caching allocator.

Mirrors ``torch.accelerator``'s memory functions (``memory_stats``, ``memory_allocated``, ...,
``empty_cache``, ``get_memory_info``) and ``torch.cuda.set_per_process_memory_fraction``.
Before a device's allocator exists, the statistics functions return empty results and create
nothing. ``empty`` and ``copy_`` are memory/calls' (compiled where the compiled core runs),
re-exported here.
"""

from __future__ import annotations

from typing import Protocol

from .. import _runtime
from .._device import DeviceLike
from .._stream import Stream
from ._config import AllocatorConfig
from .buffers._buffer import Buffer
from .calls import copy_, empty
from .device import _registry
from .device._core import CachingAllocator
from .host._buffer import HostBuffer

__all__ = [
    "copy_",
    "empty",
    "empty_cache",
    "get_allocator",
    "get_memory_info",
    "max_memory_allocated",
    "max_memory_reserved",
    "memory_allocated",
    "memory_reserved",
    "memory_stats",
    "record_stream",
    "reset_accumulated_memory_stats",
    "reset_peak_memory_stats",
    "set_allocator_settings",
    "set_per_process_memory_fraction",
]


def record_stream(buffer: Buffer | HostBuffer, stream: Stream) -> None:
    """Mark ``buffer`` as used on ``stream``: its memory is not reused before that work ends.

    Parameters
    ----------
    buffer : Buffer or HostBuffer
        Memory from ``accelrt.empty``, or host memory from ``accelrt.empty_host``.
    stream : Stream
        Another stream of the same device that uses the device memory; for host memory, any
        stream of the accelerator that reads or writes it.

    Raises
    ------
    TypeError
        If the arguments are not a Buffer (or HostBuffer) and a Stream.
    ValueError
        If the buffer was freed, or the stream is on another device (another backend, for
        host memory).

    Notes
    -----
    When the buffer is freed, an event is recorded on every such stream and the block returns
    to the pool only once they have all completed. ``copy_`` records its stream on a
    HostBuffer by itself. Mirrors ``torch.Tensor.record_stream`` (and, for host memory,
    ``CachingHostAllocator_recordEvent``).
    """
    if isinstance(buffer, HostBuffer):
        buffer.record_stream(stream)
        return
    if not isinstance(buffer, Buffer):
        raise TypeError(
            f"record_stream() takes a Buffer or a HostBuffer, got {type(buffer).__name__}"
        )
    if not isinstance(stream, Stream):
        raise TypeError(f"record_stream() takes a Stream, got {type(stream).__name__}")
    if buffer.nbytes == 0:
        return
    if stream.device != buffer.device:
        raise ValueError(f"stream {stream!r} is not on the buffer's device {buffer.device}")
    buffer.allocator.record_stream(buffer.block, stream.handle)


def get_allocator(device: DeviceLike = None) -> CachingAllocator:
    """Return the one ``CachingAllocator`` of ``device``, creating it on first use.

    ``device`` is an int, a str, a ``Device``, or None for the current device. The allocator's
    ``malloc``/``free`` take backend stream handles: it is for tools, replays and benchmarks
    that work below ``empty``.

    Raises
    ------
    RuntimeError
        If there is no accelerator.
    TypeError, ValueError
        For a bad device argument, or an invalid ``ACCELRT_ALLOC_CONF``.
    """
    backend, index = _runtime.resolve_device(device)
    return _registry.get_allocator(backend, index)


def _existing_allocator(device: DeviceLike) -> CachingAllocator | None:
    """The device's allocator if it exists; never creates one (nor initialises a driver)."""
    backend, index = _runtime.resolve_device(device, init=False)
    return _registry.peek_allocator(backend, index)


def _stats_of(device: DeviceLike) -> dict[str, int]:
    allocator = _existing_allocator(device)
    return allocator.memory_stats() if allocator is not None else {}


def memory_stats(device: DeviceLike = None) -> dict[str, int]:
    """Return the caching allocator's statistics for a device.

    Parameters
    ----------
    device : int, str, Device or None
        The device; None for the current device.

    Returns
    -------
    dict of str to int
        Flat keys ``<stat>.<pool>.<metric>`` sorted (``allocated_bytes.all.current``, ...; see
        docs/allocator.md section 8). Empty before the device's allocator exists.

    Raises
    ------
    RuntimeError
        If there is no accelerator.
    TypeError, ValueError
        For a bad device argument.

    Notes
    -----
    Mirrors ``torch.accelerator.memory_stats``.
    """
    return _stats_of(device)


class _StatReader(Protocol):
    def __call__(self, device: DeviceLike = None) -> int: ...


def _stat_reader(name: str, key: str, what: str) -> _StatReader:
    """A public function ``name(device=None)`` that returns statistic ``key`` of ``memory_stats``
    (0 before the device's allocator exists); ``what`` opens its docstring."""

    def read(device: DeviceLike = None) -> int:
        return _stats_of(device).get(key, 0)

    read.__name__ = read.__qualname__ = name
    read.__doc__ = (
        f"Return {what} (``{key}``) as an int; 0 before use.\n\n"
        f"Mirrors ``torch.accelerator.{name}``. Raises as ``memory_stats``."
    )
    return read


memory_allocated = _stat_reader(
    "memory_allocated", "allocated_bytes.all.current", "the bytes currently allocated"
)
max_memory_allocated = _stat_reader(
    "max_memory_allocated",
    "allocated_bytes.all.peak",
    "the peak of allocated bytes since start or the last peak reset",
)
memory_reserved = _stat_reader(
    "memory_reserved", "reserved_bytes.all.current", "the bytes held from the device"
)
max_memory_reserved = _stat_reader(
    "max_memory_reserved",
    "reserved_bytes.all.peak",
    "the peak of reserved bytes since start or the last peak reset",
)


def reset_peak_memory_stats(device: DeviceLike = None) -> None:
    """Set every peak statistic of the device to its current value; no-op before use.

    Mirrors ``torch.accelerator.reset_peak_memory_stats``. Raises as ``memory_stats``.
    """
    allocator = _existing_allocator(device)
    if allocator is not None:
        allocator.reset_peak_memory_stats()


def reset_accumulated_memory_stats(device: DeviceLike = None) -> None:
    """Zero the accumulated (allocated/freed) statistics and num_* counters; no-op before use.

    Mirrors ``torch.accelerator.reset_accumulated_memory_stats``. Raises as ``memory_stats``.
    """
    allocator = _existing_allocator(device)
    if allocator is not None:
        allocator.reset_accumulated_memory_stats()


def empty_cache(device: DeviceLike = None) -> None:
    """Return every cached, unused segment of the device to the driver; no-op before use.

    Waits for pending cross-stream frees first. Memory still allocated, and free pieces of
    partly used segments, stay. Mirrors ``torch.accelerator.empty_cache``. Raises as
    ``memory_stats``.
    """
    allocator = _existing_allocator(device)
    if allocator is not None:
        allocator.empty_cache()


def set_per_process_memory_fraction(fraction: float, device: DeviceLike = None) -> None:
    """Cap the memory the allocator may reserve on a device at ``fraction`` of its total.

    Parameters
    ----------
    fraction : float
        0 < fraction <= 1.
    device : int, str, Device or None
        The device; None for the current device.

    Raises
    ------
    TypeError
        If ``fraction`` is not a number.
    ValueError
        If ``fraction`` is outside (0, 1], or for a bad device argument.
    RuntimeError
        If there is no accelerator.

    Notes
    -----
    Creates the device's allocator. Allocations past the cap raise ``OutOfMemoryError``
    without asking the device. Mirrors ``torch.cuda.set_per_process_memory_fraction``.
    """
    backend, index = _runtime.resolve_device(device)
    _registry.get_allocator(backend, index).set_memory_fraction(fraction)


def get_memory_info(device: DeviceLike = None) -> tuple[int, int]:
    """Return ``(free_bytes, total_bytes)`` of a device as the backend reports it.

    Raises as ``memory_stats``. Initialises the backend's device if needed. On OpenCL, free is
    the total minus what this process holds (OpenCL cannot query free memory). Mirrors
    ``torch.accelerator.get_memory_info``.
    """
    backend, index = _runtime.resolve_device(device)
    return backend.mem_get_info(index)


def set_allocator_settings(settings: str) -> None:
    """Change allocator settings at run time, in ``ACCELRT_ALLOC_CONF`` syntax.

    Parameters
    ----------
    settings : str
        E.g. ``"max_split_size_mb:128,garbage_collection_threshold:0.8"``; keys not named keep
        their value.

    Raises
    ------
    TypeError
        If ``settings`` is not a string.
    ValueError
        For unknown keys or bad values; nothing changes then.

    Notes
    -----
    Applies to every existing allocator and to later ones. Mirrors
    ``torch._C._accelerator_setAllocatorSettings``.
    """
    config = AllocatorConfig.parse(settings, base=_registry.allocator_config())
    _registry.set_allocator_config(config)
