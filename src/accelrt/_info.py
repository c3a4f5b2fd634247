"""What ``accelrt info`` shows: the accelerator, the backends (and why some have no device),
the allocator core in use, and every available device's properties and free memory."""

from __future__ import annotations

from typing import TypedDict

from . import _runtime
from ._errors import InputError
from .backends import available_backends, get_backend, registered_backends
from .memory.device import _core


class DeviceInfo(TypedDict):
    """One device in :func:`info_data`."""

    device: str
    name: str
    vendor: str
    total_memory_bytes: int
    free_memory_bytes: int
    max_allocation_bytes: int
    compute_units: int
    driver_version: str
    host_accessible: bool


class CoreInfo(TypedDict):
    """Which allocator core runs (``"compiled"`` or ``"python"``), and why."""

    core: str
    reason: str | None


class InfoData(TypedDict):
    """What :func:`info_data` returns."""

    accelerator: str | None
    registered_backends: list[str]
    available_backends: list[str]
    unavailable_backends: dict[str, str]
    allocator_core: CoreInfo
    devices: list[DeviceInfo]


def info_data() -> InfoData:
    """Return what ``accelrt info`` shows, as JSON-serialisable data.

    Returns
    -------
    dict
        ``accelerator`` (the accelerator's backend name, None without one, or ``"error: ..."``
        where ``ACCELRT_BACKEND`` names no backend), ``registered_backends``,
        ``available_backends``, ``unavailable_backends`` (name -> why it has no device, where
        the backend says), ``allocator_core`` (``{"core", "reason"}``) and ``devices``: per
        device of every available backend (the simulated ones too), its properties and free
        memory.

    Notes
    -----
    Asks every available backend for its devices, so it initialises their drivers.
    """
    accelerator = None
    try:
        backend = _runtime.accelerator()
        accelerator = backend.name if backend is not None else None
    except InputError as exc:  # ACCELRT_BACKEND names no backend
        accelerator = f"error: {exc}"
    data: InfoData = {
        "accelerator": accelerator,
        "registered_backends": registered_backends(),
        "available_backends": available_backends(),
        "unavailable_backends": {},  # name -> why it has no device, where the backend says
        "allocator_core": {"core": _core.CORE, "reason": _core.CORE_REASON},
        "devices": [],
    }
    for name in data["registered_backends"]:
        if name not in data["available_backends"]:
            try:
                reason = getattr(get_backend(name), "unavailable_reason", lambda: None)()
            except (ImportError, TypeError, ValueError) as exc:
                reason = f"cannot be loaded: {exc}"
            if reason:
                data["unavailable_backends"][name] = str(reason)
    for name in data["available_backends"]:  # the simulated devices too: replays use them
        backend = get_backend(name)
        for index in range(backend.device_count()):
            props = backend.get_device_properties(index)
            free = backend.mem_get_info(index)[0]
            data["devices"].append(
                {
                    "device": f"{name}:{index}",
                    "name": props.name,
                    "vendor": props.vendor,
                    "total_memory_bytes": props.total_memory,
                    "free_memory_bytes": free,
                    "max_allocation_bytes": props.max_allocation_bytes,
                    "compute_units": props.multi_processor_count,
                    "driver_version": props.driver_version,
                    "host_accessible": props.host_accessible,
                }
            )
    return data
