"""The top-level memory API: allocation, copies and statistics of the caching allocator.

Mirrors ``torch.accelerator``'s memory functions (``memory_stats``, ``memory_allocated``, ...,
``empty_cache``, ``get_memory_info``) and ``torch.cuda.set_per_process_memory_fraction``.
Before a device's allocator exists, the statistics functions return empty results and create
nothing.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

from .. import _runtime
from .._device import DeviceLike
from .._stream import Stream, _current, current_stream
from ._atomic import PENDING, deliver, register
from ._config import AllocatorConfig
from .buffers._buffer import Buffer
from .buffers._buffer import native as _fast
from .device import _registry
from .device._core import CachingAllocator
from .device._requests import _as_size
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


def empty(nbytes: int, *, device: DeviceLike = None, stream: Stream | None = None) -> Buffer:
    """Allocate uninitialised device memory from the caching allocator.

    Parameters
    ----------
    nbytes : int
        Size in bytes, 0 <= nbytes <= 2**60. Zero gives an empty buffer (``ptr == 0``) without
        touching the allocator, as PyTorch does.
    device : int, str, Device or None
        The device; None for ``stream``'s device, else the current device.
    stream : Stream, optional
        The stream the memory will be used on; default the device's current stream.

    Returns
    -------
    Buffer

    Raises
    ------
    TypeError
        If ``nbytes`` is not an integer, ``stream`` not a Stream, or ``device`` of a bad type.
    ValueError
        If ``nbytes`` is negative or over 2**60, the device is out of range or not the
        accelerator's, or ``device`` and ``stream`` disagree.
    RuntimeError
        If there is no accelerator.
    OutOfMemoryError
        If the device has no memory for the request (the message explains the state).

    Examples
    --------
    >>> import accelrt as acc
    >>> with acc.empty(1 << 20) as buf:
    ...     buf.nbytes
    1048576
    """
    if type(nbytes) is not int:
        nbytes = _as_size(nbytes)
    if nbytes < 0:
        raise ValueError(f"allocation size must be >= 0 bytes, got {nbytes}")
    if stream is None:
        backend, index = _runtime.resolve_device(device)
        stream = current_stream(index)
    else:
        if not isinstance(stream, Stream):
            raise TypeError(f"stream must be an accelrt.Stream, got {type(stream).__name__}")
        backend, index = stream._backend, stream._index
        if device is not None:
            d_backend, d_index = _runtime.resolve_device(device)
            if (d_backend.name, d_index) != (backend.name, index):
                raise ValueError(
                    f"device {device!r} and the stream's device {stream.device} differ; "
                    "pass one of them"
                )
    if nbytes == 0:
        return Buffer(None, None, 0, stream)
    allocator = _registry.get_allocator(backend, index)
    try:  # atomic: the block is never allocated without a Buffer that frees it
        return Buffer(allocator, allocator.malloc(nbytes, stream._handle), nbytes, stream)
    finally:
        if PENDING.flag:
            deliver()


register(empty)

if not TYPE_CHECKING and _fast is not None:
    # The compiled form takes the common call, empty(n), without a Python frame; it falls
    # back to the function above for every other call (memory/buffers/_native.pyx).
    _fast.install_empty(_runtime, empty)
    _fast.empty.__doc__ = empty.__doc__
    empty = _fast.empty


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


def _host_view(array: Any, *, writable: bool, pinned: bool) -> memoryview:
    """The bytes of a copy's host side: a HostBuffer's (``pinned``; ValueError if freed), or a
    host array's, checked for what a copy needs."""
    if pinned:
        return array._memoryview()  # type: ignore[no-any-return]
    try:
        view = memoryview(array)
    except TypeError:
        raise TypeError(
            f"expected a Buffer or a host array (numpy or buffer protocol), got "
            f"{type(array).__name__}"
        ) from None
    if not view.c_contiguous:
        raise ValueError("host array must be C-contiguous; use numpy.ascontiguousarray()")
    if writable and view.readonly:
        raise ValueError("destination host array is read-only")
    return view.cast("B") if view.ndim != 1 or view.format != "B" else view


def copy_(dst: Any, src: Any, *, stream: Stream | None = None) -> Any:
    """Copy bytes between host memory and device buffers, on a stream.

    Parameters
    ----------
    dst : Buffer, HostBuffer or host array
        Where to copy to; a host array must be C-contiguous and writable.
    src : Buffer, HostBuffer or host array
        What to copy; same size in bytes as ``dst``.
    stream : Stream, optional
        The stream the copy runs on; default the current stream of the buffer's device.

    Returns
    -------
    dst

    Raises
    ------
    TypeError
        If neither side is a Buffer, a side is neither a Buffer, a HostBuffer nor a host
        array, or ``stream`` is not a Stream.
    ValueError
        If sizes differ, a buffer or host buffer was freed, buffers are on different devices,
        the stream is on another device, or a HostBuffer belongs to another backend.

    Notes
    -----
    Device-to-device copies, and copies between a device ``Buffer`` and a ``HostBuffer``
    (pinned memory from ``accelrt.empty_host``), are asynchronous on the stream: ``copy_``
    returns once the copy is queued, and records the stream on the HostBuffer, so that its
    memory is not reused before the copy has run. Synchronize the stream (or wait for an event
    recorded after the copy) before reading a host destination or changing a host source.

    Pageable host memory (a numpy array, ``bytes``, any buffer-protocol object) cannot be
    copied asynchronously by the device: the copy stages it or blocks. On ``sim`` it blocks
    (it is done when ``copy_`` returns); on OpenCL the driver stages the bytes through memory
    of its own, or (PoCL's CPU device) copies them itself, when the queue reaches the copy, so
    accelrt keeps the array alive until then and the array must not change, nor a destination
    be read, before the stream is synchronized. Mirrors ``torch.Tensor.copy_(non_blocking=True)``:
    asynchronous from and to pinned memory, staged or blocking for pageable memory.
    """
    # A hot path: devices are compared by the buffers' streams' backend and index, and a
    # Device is built only for an error message.
    dst_buffer = isinstance(dst, Buffer)
    src_buffer = isinstance(src, Buffer)
    if not (dst_buffer or src_buffer):
        raise TypeError("copy_() needs at least one accelrt.Buffer; use numpy to copy host arrays")
    owner = dst._stream if dst_buffer else src._stream
    backend, index = owner._backend, owner._index
    if dst_buffer and src_buffer:
        other = src._stream
        if (other._backend is not backend or other._index != index) and dst.device != src.device:
            raise ValueError(
                f"copy_() between devices {dst.device} and {src.device} is not supported"
            )
    dst_pinned = not dst_buffer and isinstance(dst, HostBuffer)
    src_pinned = not src_buffer and isinstance(src, HostBuffer)
    # a Buffer's address: its block's (0 if it is empty), or ValueError from ``block`` if freed
    target: int | memoryview = (
        (dst.ptr if dst._block is not None or not dst.nbytes else dst.block.address)
        if dst_buffer
        else _host_view(dst, writable=True, pinned=dst_pinned)
    )
    source: int | memoryview = (
        (src.ptr if src._block is not None or not src.nbytes else src.block.address)
        if src_buffer
        else _host_view(src, writable=False, pinned=src_pinned)
    )
    dst_bytes = dst.nbytes if dst_buffer else len(target)  # type: ignore[arg-type]
    src_bytes = src.nbytes if src_buffer else len(source)  # type: ignore[arg-type]
    if dst_bytes != src_bytes:
        raise ValueError(f"copy_() sizes differ: dst has {dst_bytes} bytes, src {src_bytes}")
    if stream is None:
        stream = _current(backend, index)
    elif not isinstance(stream, Stream):
        raise TypeError(f"copy_() stream must be an accelrt.Stream, got {type(stream).__name__}")
    elif (stream._backend is not backend or stream._index != index) and (
        stream.device != owner.device
    ):
        raise ValueError(f"stream {stream!r} is not on the buffers' device {owner.device}")
    # before the copy: a HostBuffer is never reused while the copy may run
    if dst_pinned:
        dst.record_stream(stream)
    if src_pinned:
        src.record_stream(stream)
    if dst_bytes:
        stream._ops.memcpy_async(target, source, dst_bytes)
    return dst


_copy_reference = copy_  # the Python function, on either core (tests compare the two)

if not TYPE_CHECKING and _fast is not None:
    # The compiled form takes the common copies without a Python frame; it falls back to the
    # function above for every other call (memory/buffers/_native.pyx).
    _fast.install_copy(copy_, _current, Stream, HostBuffer)
    _fast.copy_.__doc__ = copy_.__doc__
    copy_ = _fast.copy_


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
