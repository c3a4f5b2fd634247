"""The ``Backend`` Protocol every device backend implements, and the backend registry.

A backend is small and dumb: raw device memory, streams, events, copies and discovery. The
caching allocator, the current-device and current-stream state and every check of user input
live above it and are shared by all backends (the XPU-upstreaming design of PyTorch's
allocator: one generic allocator over per-backend primitives).

Handles: a stream is an ``int`` that is unique within its backend, and ``0`` is each device's
default stream (as CUDA's legacy stream is). An event is an opaque object the backend creates.
Host memory in copies is a ``memoryview`` (writable for device-to-host copies).

A backend may also hand out one ``StreamOps`` object per stream (``stream_ops``): the per-call
stream operations bound to that stream, so that ``Stream`` calls them without looking the
handle up; :func:`bind_stream` gives every other backend an adapter over its methods.
"""

from __future__ import annotations

import functools
import importlib
import os
import threading
import warnings
from collections.abc import Callable, Iterable, Sequence
from importlib.metadata import EntryPoint, entry_points
from typing import TYPE_CHECKING, Any, ParamSpec, Protocol, TypeAlias, TypeVar, runtime_checkable

from .._device import DeviceProperties
from .._errors import InputError
from .._stream_ops import QueueStreamOps  # the build where there is one (_compiled.py)

if TYPE_CHECKING:
    import numpy as np

__all__ = [
    "Backend",
    "DType",
    "EventHandle",
    "GraphHandle",
    "BackendOutOfMemory",
    "GraphCapture",
    "QueueStreamOps",
    "STORAGE_DTYPE_NAMES",
    "StreamOps",
    "available_backends",
    "bind_stream",
    "choose_visible",
    "dtypes",
    "get_backend",
    "registered_backends",
    "visible_devices",
]

ENTRY_POINT_GROUP = "accelrt.backends"
ENV_VISIBLE_DEVICES = "ACCELRT_VISIBLE_DEVICES"

STORAGE_DTYPE_NAMES = (
    "bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64",
    "float16", "float32", "float64", "complex64", "complex128",
)  # fmt: skip
"""The numpy dtypes a device that stores bytes of any kind supports (the simulated device)."""


DType: TypeAlias = "np.dtype[np.generic]"
"""A numpy dtype, as ``Backend.supported_dtypes`` gives them."""

EventHandle: TypeAlias = Any
"""An event from ``Backend.event_create``: opaque to the runtime, which only hands it back to
the backend that made it. Each backend takes its own event class (``SimEvent``,
``OpenCLEvent``...), which one Protocol type cannot name: the one unchecked type of the Protocol."""

GraphHandle: TypeAlias = Any
"""A graph or executable graph from ``GraphCapture``: opaque, handed back to the backend that
made it (the ``cuda`` backend's ``CUgraph`` and ``CUgraphExec``); unchecked, as ``EventHandle``."""

_P = ParamSpec("_P")
_R = TypeVar("_R")
_T = TypeVar("_T")


def dtypes(names: Iterable[str]) -> frozenset[DType]:
    """Return the numpy dtypes of ``names`` (numpy is imported only when this is called)."""
    import numpy

    return frozenset(numpy.dtype(name) for name in names)


_BUILTIN: dict[str, str] = {
    "cuda": "accelrt.backends.cuda:CUDABackend",
    "opencl": "accelrt.backends.opencl:OpenCLBackend",
    "sim": "accelrt.backends.sim:SimBackend",
    "xpu": "accelrt.backends.xpu:XPUBackend",
}


class BackendOutOfMemory(Exception):
    """Raised by ``Backend.malloc`` when the device has no memory for the request.

    The caching allocator catches it and runs the rest of its malloc ladder; any other
    exception from ``malloc`` is a driver failure and propagates.
    """


@runtime_checkable
class Backend(Protocol):
    """The primitives a device backend gives the runtime and the caching allocator.

    Every method takes a device index that the caller has already range-checked. Methods must
    not create driver contexts in ``is_available`` and ``device_count`` where the API allows.
    """

    name: str
    """The device type, e.g. ``"opencl"``; used in device strings (``"opencl:0"``)."""

    def is_available(self) -> bool:
        """Return True if the library imports and there is >= 1 device; never raises."""

    def device_count(self) -> int:
        """Return the number of usable devices; 0 when unavailable; never raises."""

    def get_device_properties(self, index: int) -> DeviceProperties:
        """Return the properties of device ``index``."""

    def supported_dtypes(self, index: int) -> frozenset[DType]:
        """Return the numpy dtypes device ``index`` can hold and convert between."""

    def supports_virtual_memory(self) -> bool:
        """Return True if the backend can reserve address space and map pages (VMM).

        When True, the ``vm_*`` methods work; when False they raise ``NotImplementedError``
        and the allocator uses ordinary segments only.
        """

    def vm_granularity(self, index: int) -> int:
        """Return the page size in bytes that ``vm_map`` addresses and sizes are multiples of."""

    def vm_reserve(self, index: int, nbytes: int) -> int:
        """Reserve ``nbytes`` of address space (no memory behind it) and return its address."""

    def vm_release(self, index: int, address: int) -> None:
        """Give back a range from ``vm_reserve``; none of its pages may be mapped."""

    def vm_map(self, index: int, address: int, nbytes: int) -> None:
        """Back ``[address, address + nbytes)`` of a reserved range with device memory.

        Raises ``BackendOutOfMemory`` when the device has not that much memory free (then
        nothing is mapped); the bytes count as held until ``vm_unmap``.
        """

    def vm_unmap(self, index: int, address: int, nbytes: int) -> None:
        """Return the memory behind ``[address, address + nbytes)``; the range stays reserved."""

    def malloc(self, index: int, nbytes: int) -> int:
        """Allocate ``nbytes`` of device memory and return its address.

        Raises ``BackendOutOfMemory`` when the device is full; anything else is a driver error.
        """

    def free(self, index: int, ptr: int) -> None:
        """Release memory returned by ``malloc``. Waits for the device's queued work first."""

    def mem_get_info(self, index: int) -> tuple[int, int]:
        """Return ``(free_bytes, total_bytes)`` of the device."""

    def stream_create(self, index: int, priority: int) -> int:
        """Create a stream on the device and return its handle."""

    def stream_destroy(self, index: int, stream: int) -> None:
        """Destroy a stream created by ``stream_create`` (never the default stream)."""

    def stream_query(self, index: int, stream: int) -> bool:
        """Return True if all work submitted to the stream has completed."""

    def stream_synchronize(self, index: int, stream: int) -> None:
        """Block until all work submitted to the stream has completed."""

    def stream_wait_event(self, index: int, stream: int, event: EventHandle) -> None:
        """Make future work on ``stream`` wait for ``event`` (no host blocking)."""

    def event_create(self, index: int, timing: bool) -> EventHandle:
        """Create an event on the device; ``timing`` enables ``event_elapsed_ms``."""

    def event_record(self, event: EventHandle, index: int, stream: int) -> None:
        """Record ``event`` at the current end of ``stream``."""

    def event_destroy(self, event: EventHandle) -> None:
        """Release an event from ``event_create``; it is not used again."""

    def event_query(self, event: EventHandle) -> bool:
        """Return True if the work captured by the event has completed (True if unrecorded)."""

    def event_synchronize(self, event: EventHandle) -> None:
        """Block until the work captured by the event has completed."""

    def event_elapsed_ms(self, start: EventHandle, end: EventHandle) -> float:
        """Return the milliseconds between two recorded, completed timing events."""

    def memcpy_async(
        self, index: int, dst: int | memoryview, src: int | memoryview, nbytes: int, stream: int
    ) -> None:
        """Copy ``nbytes`` on ``stream``: host to device, device to host or device to device.

        Device memory is an ``int`` address; host memory a ``memoryview`` (C-contiguous bytes)
        that the backend keeps alive until the copy completes.
        """

    def memset_async(self, index: int, ptr: int, value: int, nbytes: int, stream: int) -> None:
        """Set ``nbytes`` bytes at ``ptr`` to the byte ``value`` on ``stream``."""

    def host_view(self, index: int, ptr: int, nbytes: int) -> memoryview | None:
        """Return a writable host view of device memory, or None if it is not host-accessible."""

    def host_memory_pinned(self, index: int) -> bool:
        """Return True if ``host_alloc`` memory is the driver's own host memory for the device
        (page-locked or device-mapped, as ``cudaHostAlloc`` gives), False if it is ordinary
        pageable host memory (a backend without pinning falls back to that)."""

    def host_alloc(self, index: int, nbytes: int) -> int:
        """Allocate ``nbytes`` (>= 1) of host memory for copies with device ``index``.

        Returns its host address, readable and writable by the process until ``host_free``.
        Raises ``BackendOutOfMemory`` when the host (or the driver) has no memory for it.
        """

    def host_free(self, index: int, ptr: int) -> None:
        """Release memory from ``host_alloc``; no queued work may still use it."""

    def synchronize(self, index: int) -> None:
        """Block until all work on every stream of the device has completed."""


def map_driver_errors(
    cls: type, names: Iterable[str], translate: Callable[[str, Exception], None]
) -> None:
    """Wrap each method ``names`` of backend class ``cls`` so that an exception it raises goes
    through ``translate(name, exc)`` first: ``translate`` raises the ``AcceleratorError`` for
    an error of the backend's library and returns for anything else, which then propagates as
    it is. (Hot paths call ``translate`` inline instead: a wrapper costs a call per call.)"""

    def wrapped(method: Callable[_P, _R]) -> Callable[_P, _R]:
        @functools.wraps(method)
        def call(*args: _P.args, **kwargs: _P.kwargs) -> _R:
            try:
                return method(*args, **kwargs)
            except Exception as exc:
                translate(method.__name__, exc)
                raise

        return call

    for name in names:
        setattr(cls, name, wrapped(getattr(cls, name)))


class NoVirtualMemory:
    """The ``vm_*`` half of :class:`Backend` for a backend without virtual memory.

    ``supports_virtual_memory`` is False and every ``vm_*`` method raises
    ``NotImplementedError`` with :attr:`no_vmm_reason`, which the backend sets to say why
    (the allocator then uses ordinary segments, with a warning where expandable segments were
    asked for).
    """

    no_vmm_reason = "this backend has no virtual-memory API"

    def supports_virtual_memory(self) -> bool:
        """False: see :attr:`no_vmm_reason`."""
        return False

    def vm_granularity(self, index: int) -> int:
        """Not available; raises ``NotImplementedError`` naming :attr:`no_vmm_reason`."""
        raise NotImplementedError(self.no_vmm_reason)

    def vm_reserve(self, index: int, nbytes: int) -> int:
        """Not available; raises ``NotImplementedError`` naming :attr:`no_vmm_reason`."""
        raise NotImplementedError(self.no_vmm_reason)

    def vm_release(self, index: int, address: int) -> None:
        """Not available; raises ``NotImplementedError`` naming :attr:`no_vmm_reason`."""
        raise NotImplementedError(self.no_vmm_reason)

    def vm_map(self, index: int, address: int, nbytes: int) -> None:
        """Not available; raises ``NotImplementedError`` naming :attr:`no_vmm_reason`."""
        raise NotImplementedError(self.no_vmm_reason)

    def vm_unmap(self, index: int, address: int, nbytes: int) -> None:
        """Not available; raises ``NotImplementedError`` naming :attr:`no_vmm_reason`."""
        raise NotImplementedError(self.no_vmm_reason)


@runtime_checkable
class GraphCapture(Protocol):
    """The optional graph-capture capability (``accelrt.Graph``); the ``cuda`` backend has it.

    A backend without these methods cannot capture: ``accelrt.Graph`` raises a
    ``RuntimeError`` naming it. Graphs and executable graphs are opaque objects.

    The methods follow CUDA's stream capture and graph calls (``cuStreamBeginCapture`` ...
    ``cuGraphLaunch``, ``cuGraphDebugDotPrint``); ``index`` is a device index the caller has
    range-checked, ``stream`` a stream handle from ``stream_create``. A third-party backend
    implements them to make ``accelrt.Graph`` work on its devices;
    ``isinstance(backend, GraphCapture)`` checks that the methods exist (not their
    signatures). A method raises ``ValueError`` for a bad argument (a ``mode`` other than
    ``"global"``, ``"thread_local"`` or ``"relaxed"``) and ``accelrt.AcceleratorError`` (the
    ``cuda`` backend's ``CUDAError``) when the driver refuses; ``accelrt.Graph`` lets both
    through.
    """

    def graph_capture_begin(self, index: int, stream: int, mode: str) -> None:
        """Start capturing the work submitted to ``stream`` instead of running it.

        ``mode`` is ``"global"``, ``"thread_local"`` or ``"relaxed"`` (CUDA's
        ``cudaStreamCaptureMode``).
        """

    def graph_capture_end(self, index: int, stream: int) -> GraphHandle:
        """Stop capturing on ``stream`` and return the captured graph."""

    def graph_instantiate(self, index: int, graph: GraphHandle) -> GraphHandle:
        """Return an executable graph made from ``graph``."""

    def graph_launch(self, index: int, executable: GraphHandle, stream: int) -> None:
        """Submit an executable graph's work to ``stream``."""

    def graph_destroy(self, index: int, graph: GraphHandle) -> None:
        """Release a graph from ``graph_capture_end``."""

    def graph_exec_destroy(self, index: int, executable: GraphHandle) -> None:
        """Release an executable graph from ``graph_instantiate``."""

    def graph_debug_dump(self, index: int, graph: GraphHandle, path: str) -> None:
        """Write a graph from ``graph_capture_end`` to the file ``path`` in the driver's
        debug format."""


@runtime_checkable
class StreamOps(Protocol):
    """One stream's per-call operations, bound to it: what ``Stream`` and ``copy_`` call.

    A backend may implement ``stream_ops(index: int, stream: int) -> StreamOps | None``
    (optional, not part of ``Backend``): the object of a live stream handle, or None for a
    handle it does not know (never a stream, destroyed, or of another device). It must
    return the same object for a handle every time, since every ``Stream`` wrapping the handle
    keeps it; after ``stream_destroy`` its methods behave as the ``Backend`` methods do for an
    unknown handle. The methods mean what ``stream_query``, ``stream_synchronize``,
    ``event_record`` and ``memcpy_async`` mean for the bound stream.
    """

    def query(self) -> bool:
        """Return True if all work submitted to the stream has completed."""

    def synchronize(self) -> None:
        """Block until all work submitted to the stream has completed."""

    def record(self, event: EventHandle) -> None:
        """Record ``event`` (from ``event_create``) at the current end of the stream."""

    def memcpy_async(self, dst: int | memoryview, src: int | memoryview, nbytes: int) -> None:
        """Copy ``nbytes`` on the stream, as ``Backend.memcpy_async``."""


class _BackendStreamOps:
    """``StreamOps`` through a backend's per-handle methods (see :func:`bind_stream`)."""

    __slots__ = ("_backend", "_handle", "_index")

    def __init__(self, backend: Backend, index: int, stream: int) -> None:
        self._backend = backend
        self._index = index
        self._handle = stream

    def query(self) -> bool:
        return self._backend.stream_query(self._index, self._handle)

    def synchronize(self) -> None:
        self._backend.stream_synchronize(self._index, self._handle)

    def record(self, event: EventHandle) -> None:
        self._backend.event_record(event, self._index, self._handle)

    def memcpy_async(self, dst: int | memoryview, src: int | memoryview, nbytes: int) -> None:
        self._backend.memcpy_async(self._index, dst, src, nbytes, self._handle)


def bind_stream(backend: Backend, index: int, stream: int) -> StreamOps:
    """Return the ``StreamOps`` of stream handle ``stream`` of device ``index``.

    The backend's own object where it implements ``stream_ops`` and knows the handle; otherwise
    an adapter that calls the backend's ``stream_query``, ``stream_synchronize``,
    ``event_record`` and ``memcpy_async`` with the handle (so a third-party backend needs
    nothing more than the ``Backend`` Protocol, and a handle unknown now is looked up again on
    every call).
    """
    factory = getattr(backend, "stream_ops", None)
    ops: StreamOps | None = factory(index, stream) if factory is not None else None
    return ops if ops is not None else _BackendStreamOps(backend, index, stream)


def visible_devices(physical_count: int) -> list[int]:
    """Return the physical device indices a backend exposes, in order, as logical 0, 1, ...

    Parameters
    ----------
    physical_count : int
        How many devices the backend found.

    Returns
    -------
    list of int
        ``range(physical_count)`` when ``ACCELRT_VISIBLE_DEVICES`` is unset; otherwise the
        comma-separated indices it lists, up to the first entry that is not an integer, is out of
        range or repeats (that entry and the rest are dropped with a ``RuntimeWarning`` naming
        it). An empty value hides every device.

    Notes
    -----
    Mirrors ``CUDA_VISIBLE_DEVICES``: schedulers such as Ray, Dask or torchrun give each worker
    its own devices by setting it before the worker starts. Every backend applies it when it
    first enumerates its devices.
    """
    value = os.environ.get(ENV_VISIBLE_DEVICES)
    if value is None:
        return list(range(physical_count))
    chosen: list[int] = []
    for entry in (e.strip() for e in value.split(",") if e.strip()):
        problem = None
        try:
            index = int(entry)
        except ValueError:
            problem = "is not an integer"
        else:
            if not 0 <= index < physical_count:
                problem = f"is out of range [0, {physical_count})"
            elif index in chosen:
                problem = "is listed twice"
        if problem is not None:
            warnings.warn(
                f"{ENV_VISIBLE_DEVICES}={value!r}: entry {entry!r} {problem}; it and the "
                f"entries after it are ignored, so {len(chosen)} device(s) are visible. "
                f"List comma-separated device indices, e.g. {ENV_VISIBLE_DEVICES}=0,1",
                RuntimeWarning,
                stacklevel=2,
            )
            break
        chosen.append(index)
    return chosen


def choose_visible(
    found: Sequence[_T], reason: str | None, kind: str
) -> tuple[list[_T], str | None]:
    """Return the devices of ``found`` that ``ACCELRT_VISIBLE_DEVICES`` exposes (in its order;
    see :func:`visible_devices`) and why there are none: the probe's ``reason`` (None when it
    found some), or that the variable hides all of them (``kind`` names the devices, e.g.
    ``"CUDA"``, in that message). Warns as :func:`visible_devices` does."""
    chosen = [found[i] for i in visible_devices(len(found))]
    if found and not chosen:
        reason = f"{ENV_VISIBLE_DEVICES} hides all {len(found)} {kind} device(s)"
    return chosen, reason


_lock = threading.Lock()
_instances: dict[str, Backend] = {}


def _entry_point_targets() -> dict[str, str | EntryPoint]:
    targets: dict[str, str | EntryPoint] = dict(_BUILTIN)
    for ep in entry_points(group=ENTRY_POINT_GROUP):
        targets.setdefault(ep.name, ep)
    return targets


def registered_backends() -> list[str]:
    """Return the names of all registered backends, built-in and from entry points, sorted.

    Returns
    -------
    list of str
        Backend names; registering does not mean available (see :func:`available_backends`).

    Notes
    -----
    Reads installed package metadata; imports no backend and initialises no driver.
    """
    return sorted(_entry_point_targets())


def get_backend(name: str) -> Backend:
    """Return the process-wide instance of the backend called ``name``.

    Parameters
    ----------
    name : str
        A registered backend name, e.g. ``"opencl"`` or ``"sim"``.

    Returns
    -------
    Backend
        The backend instance (created on first use; creating it initialises no driver).

    Raises
    ------
    TypeError
        If ``name`` is not a string.
    InputError
        (a ``ValueError``) If no backend of that name is registered; the message lists the
        registered ones.
    """
    if not isinstance(name, str):
        raise TypeError(f"backend name must be a str, got {name!r}")
    with _lock:
        backend = _instances.get(name)
        if backend is not None:
            return backend
        targets = _entry_point_targets()
        target = targets.get(name)
        if target is None:
            raise InputError(
                f"unknown backend {name!r}; registered backends: {', '.join(sorted(targets))}. "
                f"Third-party backends register through the entry-point group "
                f"'{ENTRY_POINT_GROUP}'."
            )
        if isinstance(target, str):
            module_name, _, attr = target.partition(":")
            factory = getattr(importlib.import_module(module_name), attr)
        else:
            factory = target.load()
        backend = factory()
        if not isinstance(backend, Backend):
            raise TypeError(f"entry point {name!r} did not produce a Backend: got {backend!r}")
        _instances[name] = backend
        return backend


def available_backends() -> list[str]:
    """Return the registered backends that have at least one usable device, sorted.

    Returns
    -------
    list of str
        Names whose ``is_available()`` is True. A backend whose import fails counts as
        unavailable.

    Notes
    -----
    Imports each backend module but creates no driver context where the backend allows.
    """
    names = []
    for name in registered_backends():
        try:
            if get_backend(name).is_available():
                names.append(name)
        except (ImportError, TypeError, ValueError):
            continue
    return names
