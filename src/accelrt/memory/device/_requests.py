"""The size of a request, and the errors of bad requests: the checks every allocator (device,
host, compiled) makes with the same messages."""

from __future__ import annotations

import operator
from typing import Any

from .._policy import MAX_REQUEST_BYTES

__all__ = ["_as_size", "_not_allocated", "_request_size"]


def _request_size(value: Any, memory: str) -> int:
    """A malloc request's bytes, an int in [1, 2**60]: the one check of every allocator
    (device, host, compiled). ``memory`` names what no one has that much of.

    Raises
    ------
    TypeError
        If ``value`` is not an integer (``bool`` included).
    ValueError
        If it is out of range.
    """
    nbytes = value if type(value) is int else _as_size(value)
    if nbytes < 1 or nbytes > MAX_REQUEST_BYTES:
        raise ValueError(
            f"allocation size must be between 1 and 2**60 bytes, got {nbytes}"
            + (f": no {memory} has that much memory" if nbytes > MAX_REQUEST_BYTES else "")
        )
    return nbytes


def _not_allocated(device_name: str, address: int) -> ValueError:
    """The error of a free (or record_stream) of a block this allocator has not handed out."""
    return ValueError(
        f"{device_name}: block at {address:#x} is not allocated by this allocator (freed "
        "twice, or from another device)"
    )


def _as_size(value: Any) -> int:
    if isinstance(value, bool):
        raise TypeError(f"allocation size must be an int number of bytes, got {value!r}")
    try:
        return operator.index(value)
    except TypeError:
        raise TypeError(
            f"allocation size must be an int number of bytes, got {type(value).__name__} {value!r}"
        ) from None
