"""The caching allocator's out-of-memory error: what the device has, what accelrt holds, and
what setting might help (PyTorch's message, in accelrt's words)."""

from __future__ import annotations

from ..._errors import OutOfMemoryError
from ..._units import format_bytes

__all__ = ["FractionRejection", "oom_error", "out_of_memory_error"]


class FractionRejection(Exception):
    """Raised inside the allocator when ``throw_on_cudamalloc_oom`` is set and a map or segment
    would take reserved memory past the memory fraction; ``malloc`` turns it into an
    ``OutOfMemoryError`` at once, without the ladder's retries (PyTorch 2.14's preemptive
    rejection, counted in ``num_oom_rejections``)."""


def out_of_memory_error(
    device_name: str,
    backend_name: str,
    nbytes: int,
    alloc_size: int,
    free: int,
    total: int,
    allocated: int,
    reserved: int,
    allowed_max: int | None,
    expandable: bool,
    supports_expandable: bool,
    arenas: bool = False,
) -> OutOfMemoryError:
    """The error of a request of ``nbytes`` (``alloc_size`` after rounding) that found no
    memory: ``free`` and ``total`` are the device's, ``allocated`` and ``reserved`` the
    allocator's bytes, ``allowed_max`` its memory-fraction limit (None: none); ``expandable``
    whether expandable segments are on, ``supports_expandable`` whether the backend has them,
    ``arenas`` whether policy:accelrt is.
    """
    allowed = ""
    if allowed_max is not None:
        allowed = f" accelrt may use {format_bytes(allowed_max)} of it (memory fraction)."
    if arenas:
        hint = (
            "policy:accelrt already maps idle cached pages where they are needed; free memory "
            "or lower the batch size"
        )
    elif expandable:
        hint = (
            "expandable segments are already on; free memory or lower the batch size, or "
            "try ACCELRT_ALLOC_CONF=max_split_size_mb:<MiB>"
        )
    elif supports_expandable:
        hint = "try ACCELRT_ALLOC_CONF=expandable_segments:True to avoid fragmentation"
    else:
        hint = (
            "try ACCELRT_ALLOC_CONF=max_split_size_mb:<MiB> to avoid fragmentation "
            f"(expandable segments need virtual memory, which {backend_name!r} lacks)"
        )
    message = (
        f"Out of memory on {device_name}. Tried to allocate {format_bytes(alloc_size)} "
        f"(a {format_bytes(nbytes)} request). The device has a total capacity of "
        f"{format_bytes(total)} of which {format_bytes(free)} is free.{allowed} Of the "
        f"allocated memory {format_bytes(allocated)} is allocated by accelrt, and "
        f"{format_bytes(reserved - allocated)} is reserved by accelrt but unallocated. If "
        f"reserved but unallocated memory is large, {hint}."
    )
    return oom_error(message, device_name, nbytes, alloc_size, allocated, reserved, free, total)


def oom_error(
    message: str,
    device: str,
    requested: int,
    allocation: int,
    allocated: int,
    reserved: int,
    free: int,
    total: int,
) -> OutOfMemoryError:
    """The ``OutOfMemoryError`` of the device and the host allocators: ``message`` for ``device``
    (e.g. ``"sim:0"``), and its figures in bytes, in the order of the error's fields (the request,
    what the allocator tried to obtain, what it has allocated and reserved, the memory's free
    and total)."""
    return OutOfMemoryError(
        message,
        device=device,
        requested_bytes=requested,
        allocation_bytes=allocation,
        allocated_bytes=allocated,
        reserved_bytes=reserved,
        free_bytes=free,
        total_bytes=total,
    )
