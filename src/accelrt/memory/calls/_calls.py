"""``empty`` and ``copy_`` in Python: every call on the Python core, and the calls the
compiled ones (calls/_native.pyx) do not take.

Compiled twin: calls/_native.pyx takes the common calls (``empty(n)``; a copy between live
buffers of one device, or a live buffer and pageable host memory) and falls back to these
functions for every other call; change both (docs/design.md, "Pairs").
"""

from __future__ import annotations

from typing import Any

from ... import _runtime
from ..._device import DeviceLike
from ..._stream import Stream, _current, current_stream
from .._atomic import PENDING, deliver, register
from ..buffers._buffer import Buffer
from ..device import _registry
from ..device._requests import _as_size
from ..host._buffer import HostBuffer

__all__ = ["copy_", "empty"]


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
