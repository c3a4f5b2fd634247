"""``Device`` (a backend type and an optional index) and ``DeviceProperties``.

Mirrors ``torch.device``: ``Device("opencl:0")``, ``Device("sim", 1)``, ``Device("opencl")``
(no index: "the current device of that type").
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import TypeAlias

from ._readonly import read_only

__all__ = ["Device", "DeviceLike", "DeviceProperties"]

_DEVICE_RE = re.compile(r"^([a-z_][a-z0-9_]*)(?::([0-9]{1,9}))?$", re.ASCII)


class Device:
    """A device: a backend type such as ``"opencl"`` and an optional index.

    Parameters
    ----------
    type : str or Device
        ``"opencl"``, ``"opencl:1"``, ``"sim:0"``, ... or a ``Device`` to copy.
    index : int, optional
        The device index, when ``type`` carries none.

    Raises
    ------
    TypeError
        If ``type`` is not a ``str`` or ``Device`` or ``index`` is not an ``int``.
    ValueError
        If the string is malformed, the index is negative, or an index is given twice.

    Notes
    -----
    Creating a ``Device`` checks syntax only; whether the device exists is checked where it is
    used ("device index N is out of range"). Devices are immutable and hashable; equal when type
    and index are equal. Mirrors ``torch.device``.

    Examples
    --------
    >>> Device("opencl:0")
    Device(type='opencl', index=0)
    >>> str(Device("sim", 1))
    'sim:1'
    """

    __slots__ = ("_index", "_type")

    _type: str
    _index: int | None

    def __init__(self, type: str | Device, index: int | None = None) -> None:
        if isinstance(type, Device):
            if index is not None:
                raise ValueError(f"Device {type!s} already has an index; got index={index!r} too")
            self._type, self._index = type._type, type._index
            return
        if not isinstance(type, str):
            raise TypeError(
                f"Device() takes a string like 'opencl:0' or a Device, got {type!r} "
                f"({builtins_type_name(type)})"
            )
        match = _DEVICE_RE.match(type.strip())
        if match is None:
            raise ValueError(
                f"invalid device string {type[:60]!r}: expected 'TYPE' or 'TYPE:INDEX' in ASCII "
                "(an index of at most 9 digits), e.g. 'opencl:0' or 'sim'"
            )
        parsed_index = int(match.group(2)) if match.group(2) is not None else None
        if index is not None:
            if isinstance(index, bool) or not isinstance(index, int):
                raise TypeError(f"device index must be an int, got {index!r}")
            if parsed_index is not None:
                raise ValueError(f"device string {type!r} already has an index; got {index} too")
            if index < 0:
                raise ValueError(f"device index must be >= 0, got {index}")
            parsed_index = index
        self._type = match.group(1)
        self._index = parsed_index

    type: read_only[str] = read_only("_type", 'The backend type, e.g. ``"opencl"``.')
    index: read_only[int | None] = read_only(
        "_index", "The device index, or None when the device names a type only."
    )

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Device):
            return NotImplemented
        return self._type == other._type and self._index == other._index

    def __hash__(self) -> int:
        return hash((self._type, self._index))

    def __repr__(self) -> str:
        return f"Device(type={self._type!r}, index={self._index!r})"

    def __str__(self) -> str:
        return self._type if self._index is None else f"{self._type}:{self._index}"

    def __reduce__(self) -> tuple[Callable[[str], Device], tuple[str]]:
        return (Device, (str(self),))


def builtins_type_name(value: object) -> str:
    """Return the type name of ``value`` for error messages."""
    return type(value).__name__


@dataclass(frozen=True)
class DeviceProperties:
    """What a backend reports about one device; one schema for every backend.

    Attributes
    ----------
    name : str
        The device's name as the driver reports it.
    vendor : str
        The vendor, e.g. ``"The pocl project"``.
    backend : str
        The backend type, e.g. ``"opencl"``.
    index : int
        The device index within its backend.
    total_memory : int
        Device memory in bytes.
    multi_processor_count : int
        Compute units (CUDA's streaming multiprocessors, OpenCL's compute units).
    max_allocation_bytes : int
        The largest single allocation the device accepts, in bytes.
    driver_version : str
        The driver's version string.
    host_accessible : bool
        Whether device pointers are host addresses (``Buffer.numpy()`` works).
    raw : Mapping
        The backend's own attributes, unconverted (a read-only view).
    pinned_host_memory : bool
        Whether ``accelrt.empty_host`` gives the driver's pinned (page-locked or
        device-mapped) host memory for this device; False where the backend has no pinning
        and falls back to ordinary host memory.

    Notes
    -----
    Mirrors ``torch.cuda.get_device_properties`` (``total_memory``, ``multi_processor_count``).
    """

    name: str
    vendor: str
    backend: str
    index: int
    total_memory: int
    multi_processor_count: int
    max_allocation_bytes: int
    driver_version: str
    host_accessible: bool
    raw: Mapping[str, object] = field(default_factory=dict, compare=False, repr=False)
    pinned_host_memory: bool = False

    def __post_init__(self) -> None:
        object.__setattr__(self, "raw", MappingProxyType(dict(self.raw)))


DeviceLike: TypeAlias = "int | str | Device | None"
"""A device argument: an index, a string such as ``"opencl:0"``, a ``Device``, or None."""
