"""The device-agnostic device API: which accelerator, how many devices, which is current.

Mirrors ``torch.accelerator`` (``is_available``, ``current_accelerator``, ``device_count``,
``current_device_index``, ``set_device_index``, ``device_index``, ``synchronize``) plus
``get_device_properties`` / ``get_device_name`` from ``torch.cuda``.
"""

from __future__ import annotations

from typing import TypedDict

from . import _runtime
from ._device import Device, DeviceLike, DeviceProperties
from .backends._base import Backend, DType

__all__ = [
    "current_accelerator",
    "current_device_index",
    "device_count",
    "device_index",
    "get_device_capability",
    "get_device_name",
    "get_device_properties",
    "is_available",
    "set_device_index",
    "synchronize",
]


def is_available() -> bool:
    """Return True if there is an accelerator with at least one device.

    Never raises and creates no driver context. Mirrors ``torch.accelerator.is_available``.
    """
    return _runtime.device_count() > 0


def device_count() -> int:
    """Return the number of devices of the accelerator; 0 if there is none.

    Never raises and creates no driver context. Mirrors ``torch.accelerator.device_count``.
    """
    return _runtime.device_count()


def current_accelerator(check_available: bool = False) -> Device | None:
    """Return the accelerator's type as a ``Device`` without index, or None if there is none.

    Parameters
    ----------
    check_available : bool
        Also require at least one device; return None otherwise.

    Returns
    -------
    Device or None
        e.g. ``Device(type='opencl', index=None)``.

    Notes
    -----
    Chooses the accelerator on first call (``ACCELRT_BACKEND``, else auto-detection). Mirrors
    ``torch.accelerator.current_accelerator``.
    """
    try:
        backend = _runtime.accelerator()
    except ValueError:
        return None
    if backend is None or (check_available and backend.device_count() == 0):
        return None
    return Device(backend.name)


def current_device_index() -> int:
    """Return this thread's current device index (0 until set).

    Raises ``RuntimeError`` if there is no accelerator. Mirrors
    ``torch.accelerator.current_device_index``.
    """
    return _runtime.current_index(_runtime.require_accelerator())


def set_device_index(device: DeviceLike) -> None:
    """Make ``device`` this thread's current device; ``-1`` does nothing.

    Raises
    ------
    RuntimeError
        If there is no accelerator.
    TypeError, ValueError
        For a bad device argument (out of range, another type, no index).

    Notes
    -----
    Mirrors ``torch.accelerator.set_device_index``.
    """
    if isinstance(device, int) and not isinstance(device, bool) and device == -1:
        return
    backend, index = _runtime.resolve_device(device, optional=False)
    _runtime.set_current_index(backend, index)


class device_index:
    """Context manager that makes ``device`` current and restores the previous device on exit.

    Parameters
    ----------
    device : int, str, Device or None
        The device; None makes the manager do nothing.

    Raises
    ------
    RuntimeError, TypeError, ValueError
        As ``set_device_index``, on entry.

    Notes
    -----
    Restores on exceptions too. Mirrors ``torch.accelerator.device_index``.
    """

    def __init__(self, device: DeviceLike) -> None:
        self._device = device
        self._previous: tuple[Backend, int] | None = None

    def __enter__(self) -> None:
        if self._device is None:
            return
        backend, index = _runtime.resolve_device(self._device, optional=False)
        self._previous = (backend, _runtime.current_index(backend))
        _runtime.set_current_index(backend, index)

    def __exit__(self, *exc_info: object) -> None:
        if self._previous is not None:
            _runtime.set_current_index(*self._previous)
            self._previous = None


def synchronize(device: DeviceLike = None) -> None:
    """Wait for all work on every stream of ``device`` (the current device if None).

    Does not change the current device. Raises as ``set_device_index``. Mirrors
    ``torch.accelerator.synchronize``.
    """
    backend, index = _runtime.resolve_device(device)
    backend.synchronize(index)


def get_device_properties(device: DeviceLike = None) -> DeviceProperties:
    """Return the properties of ``device`` (the current device if None).

    Reading properties does not initialise the accelerator (see ``accelrt`` notes on lazy
    initialisation). Raises as ``set_device_index``. Mirrors
    ``torch.cuda.get_device_properties``.
    """
    backend, index = _runtime.resolve_device(device, init=False)
    return backend.get_device_properties(index)


def get_device_name(device: DeviceLike = None) -> str:
    """Return the name of ``device`` (the current device if None).

    Raises as ``set_device_index``. Mirrors ``torch.cuda.get_device_name``.
    """
    return get_device_properties(device).name


def get_device_capability(device: DeviceLike = None) -> DeviceCapability:
    """Return what ``device`` (the current device if None) can do.

    Returns
    -------
    dict
        ``{"supported_dtypes": set of numpy.dtype}``: the dtypes whose arrays the device can
        hold and convert between, as far as the backend can tell (OpenCL: float64 only with
        double precision, float16 only with ``cl_khr_fp16``; the simulated device: every
        fixed-size numeric dtype and bool).

    Raises
    ------
    RuntimeError, TypeError, ValueError
        As ``set_device_index``.

    Notes
    -----
    Does not initialise the accelerator. Mirrors ``torch.accelerator.get_device_capability``,
    with numpy dtypes where PyTorch has ``torch.dtype``.
    """
    backend, index = _runtime.resolve_device(device, init=False)
    return {"supported_dtypes": set(backend.supported_dtypes(index))}


class DeviceCapability(TypedDict):
    """What :func:`get_device_capability` returns."""

    supported_dtypes: set[DType]
