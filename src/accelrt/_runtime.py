"""Runtime state: which backend is the accelerator, and the current device.

The accelerator is chosen once per process, lazily: ``ACCELRT_BACKEND`` if set, else
auto-detection (a CUDA GPU through the driver, else OpenCL: a GPU, else the CPU device);
``accelrt.backends.use(name)`` switches it explicitly (the simulated backend is only ever
chosen that way). The current device is per thread. The allocators live in
``accelrt.memory`` (one per device).

Every device argument of the top-level API goes through :func:`resolve_device`, the one
normaliser (mirrors ``torch.accelerator._utils._get_device_index``).

Lazy initialisation and fork safety (mirrors ``torch.cuda``'s): choosing the accelerator and
counting devices initialise nothing; the first call that uses a device (a stream, an
allocation, a synchronisation) marks the accelerator initialised. A child forked after that
cannot use the accelerator (its driver state is not valid in the child, whatever the backend)
and gets a ``RuntimeError`` that tells it to use the 'spawn' start method.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable

from ._device import Device, DeviceLike
from ._errors import InputError
from ._stream_ops import Epoch  # the build where there is one (accelrt/_compiled.py)
from .backends import _install_use
from .backends._base import Backend, get_backend, registered_backends

__all__ = [
    "accelerator",
    "device_count",
    "check_not_forked",
    "is_initialized",
    "resolve_device",
    "on_reset",
    "use",
]

ENV_BACKEND = "ACCELRT_BACKEND"
AUTO_ORDER = ("cuda", "opencl", "xpu")
NO_ACCELERATOR = "Cannot access accelerator device when none is available."

_lock = threading.RLock()
_chosen: list[Backend | None] = []  # empty until chosen; [None] when there is no accelerator
_reset_hooks: list[Callable[[], None]] = []


class _ThreadState(threading.local):
    """This thread's current device of each backend. The class default stands for "none set",
    so reading it never raises and swallows an AttributeError (as ``getattr`` with a default
    does on a ``threading.local``)."""

    indices: dict[str, int] | None = None


_local = _ThreadState()


#: bumped by every change of what is current; the compiled ``accelrt.empty`` caches by it
STATE_EPOCH = Epoch()
_initialised: dict[str, int] = {}  # backend name -> pid of the process that initialised it
_inherited: dict[str, int] = {}  # in a forked child: what the parent had initialised


def _after_fork_in_child() -> None:
    _inherited.update(_initialised)
    _initialised.clear()
    STATE_EPOCH.bump()


os.register_at_fork(after_in_child=_after_fork_in_child)


def check_not_forked(backend: Backend) -> None:
    """Refuse to use ``backend`` in a child forked after the parent initialised it.

    Raises
    ------
    RuntimeError
        Telling the user to start workers with the 'spawn' start method.
    """
    if backend.name in _inherited:
        raise RuntimeError(
            f"Cannot use accelrt's {backend.name!r} accelerator in a forked subprocess: the "
            f"parent process (pid {_inherited[backend.name]}) initialised it before forking. "
            "To use accelrt with multiprocessing, use the 'spawn' start method "
            "(multiprocessing.get_context('spawn') or multiprocessing.set_start_method('spawn'))."
        )


def is_initialized(backend: Backend) -> bool:
    """Whether this process has used a device of ``backend`` (see the module notes)."""
    return backend.name in _initialised


def use(name: str) -> Backend:
    """Make the backend called ``name`` the accelerator of this process.

    Parameters
    ----------
    name : str
        A registered backend, e.g. ``"opencl"`` or ``"sim"``.

    Returns
    -------
    Backend
        The backend now in use.

    Raises
    ------
    ValueError
        If no backend of that name is registered.

    Notes
    -----
    Allocators and streams of the previous accelerator stay alive and keep their memory; the
    current device of each thread is tracked per backend, so switching back restores it.
    """
    backend = get_backend(name)
    with _lock:
        _chosen[:] = [backend]
        STATE_EPOCH.bump()
    return backend


_install_use(use)  # accelrt.backends.use calls it (backends/ imports nothing above it)


def accelerator() -> Backend | None:
    """Return the accelerator backend, choosing it on first call; None if there is none.

    Raises
    ------
    ValueError
        If ``ACCELRT_BACKEND`` names an unregistered backend.
    """
    if _chosen:
        return _chosen[0]
    with _lock:
        if not _chosen:
            _chosen.append(_detect())
            STATE_EPOCH.bump()
        return _chosen[0]


def _detect() -> Backend | None:
    name = os.environ.get(ENV_BACKEND, "").strip()
    if name:
        if name not in registered_backends():
            try:
                get_backend(name)  # raises: the message lists the registered backends
            except ValueError as exc:
                raise InputError(f"{ENV_BACKEND}={name!r}: {exc}") from None
        return get_backend(name)  # the backend's own errors name their own settings
    for candidate in AUTO_ORDER:
        try:
            backend = get_backend(candidate)
        except (ImportError, ValueError):
            continue
        if backend.is_available():
            return backend
    return None


def require_accelerator() -> Backend:
    """Return the accelerator backend.

    Raises
    ------
    RuntimeError
        ``"Cannot access accelerator device when none is available."`` if there is none or it
        has no device.
    """
    backend = accelerator()
    if backend is None or backend.device_count() == 0:
        raise no_accelerator(backend)
    return backend


def no_accelerator(backend: Backend | None) -> RuntimeError:
    """The error for a program that needs a device where there is none: PyTorch's sentence,
    then, where a backend was chosen (``ACCELRT_BACKEND``, or found) but has no device, its
    name and the reason its driver gives (as ``accelrt info`` shows it)."""
    if backend is None:
        return RuntimeError(NO_ACCELERATOR)
    reason = getattr(backend, "unavailable_reason", lambda: None)()
    chosen = f" ({ENV_BACKEND}={backend.name})" if os.environ.get(ENV_BACKEND, "").strip() else ""
    reason = str(reason or "its driver reports none").rstrip(". ")
    return RuntimeError(
        f"{NO_ACCELERATOR} The {backend.name!r} backend{chosen} has no device: {reason}. "
        "`accelrt info` lists the devices here."
    )


def device_count() -> int:
    """Return the number of accelerator devices; 0 without an accelerator. Never raises."""
    try:
        backend = accelerator()
    except ValueError:
        return 0
    return 0 if backend is None else backend.device_count()


def current_index(backend: Backend) -> int:
    """Return this thread's current device index for ``backend`` (0 until set)."""
    indices = _local.indices
    if indices is None:
        return 0
    return indices.get(backend.name, 0)


def set_current_index(backend: Backend, index: int) -> None:
    """Set this thread's current device of ``backend`` (index already range-checked)."""
    indices = _local.indices
    if indices is None:
        indices = _local.indices = {}
    indices[backend.name] = index
    STATE_EPOCH.bump()


def check_index(backend: Backend, index: int) -> int:
    """Return ``index`` if it is a device of ``backend``.

    Raises
    ------
    ValueError
        ``"device index N is out of range [0, count)"``.
    """
    count = backend.device_count()
    if not 0 <= index < count:
        raise ValueError(f"device index {index} is out of range [0, {count})")
    return index


def resolve_device(
    device: DeviceLike, *, optional: bool = True, init: bool = True
) -> tuple[Backend, int]:
    """Normalise a device argument into (accelerator backend, checked device index).

    Parameters
    ----------
    device : int, str, Device or None
        An index of an accelerator device, a string such as ``"opencl:0"``, a ``Device``, or
        None for the current device.
    optional : bool
        Whether None (and a ``Device`` without an index) may stand for the current device.
    init : bool
        Whether the caller is about to use the device, which marks the accelerator initialised
        (False for queries such as ``memory_stats`` and ``get_device_properties``).

    Returns
    -------
    (Backend, int)

    Raises
    ------
    RuntimeError
        If there is no accelerator, or this is a child forked after the parent initialised it.
    TypeError
        If ``device`` is of another type.
    ValueError
        If the string is malformed, the type is not the current accelerator's, an index is
        required but missing, or the index is out of range.
    """
    if (device is None and optional) or type(device) is int:
        # The common cases (every stream, event and copy call), by the rules of the general
        # path below with fewer calls: the device is counted once.
        backend = _chosen[0] if _chosen else accelerator()
        if backend is None or (count := backend.device_count()) == 0:
            raise no_accelerator(backend)
        if backend.name not in _initialised:
            check_not_forked(backend)
            if init:
                _initialised[backend.name] = os.getpid()
        if device is None:
            indices = _local.indices
            return backend, 0 if indices is None else indices.get(backend.name, 0)
        if not 0 <= device < count:
            raise ValueError(f"device index {device} is out of range [0, {count})")
        return backend, device
    if isinstance(device, bool) or not isinstance(device, (int, str, Device, type(None))):
        raise TypeError(
            f"device must be an int index, a string like 'opencl:0', a Device or None; "
            f"got {type(device).__name__} {device!r}"
        )
    backend = require_accelerator()
    if backend.name not in _initialised:
        check_not_forked(backend)
        if init:
            _initialised[backend.name] = os.getpid()
    if isinstance(device, int):
        return backend, check_index(backend, device)
    if isinstance(device, str):
        device = Device(device)
    if device is not None and device.type != backend.name:
        raise ValueError(
            f"device type {device.type!r} doesn't match the current accelerator "
            f"{backend.name!r}; pass an index, a {backend.name!r} device, or switch with "
            f"accelrt.backends.use({device.type!r})"
        )
    index = None if device is None else device.index
    if index is None:
        if not optional:
            raise ValueError(
                f"expected a device with an index or an int, got {device!r}; "
                f"e.g. '{backend.name}:0'"
            )
        return backend, current_index(backend)
    return backend, check_index(backend, index)


def on_reset(hook: Callable[[], None]) -> None:
    """Have :func:`reset_state` call ``hook`` first (the memory registry forgets its allocators)."""
    _reset_hooks.append(hook)


def reset_state() -> None:
    """Forget the chosen accelerator, the allocators, the settings and this thread's devices.

    The reset hooks run first (allocators are emptied; memory still allocated stays with its
    buffers). For tests and for programs that switch backends; not part of the public API.
    """
    with _lock:
        for hook in _reset_hooks:
            hook()
        _chosen.clear()
        _initialised.clear()
        _local.__dict__.clear()
        STATE_EPOCH.bump()
