"""The CUDA backend on NVIDIA's ``cuda-bindings`` (driver API): ``pip install 'accelrt[cuda]'``.

Mapping of the runtime's concepts onto CUDA:

- each device is used through its **primary context** (``cuDevicePrimaryCtxRetain``), the
  context the CUDA runtime, PyTorch, CuPy and Numba share, so pointers and streams pass freely
  between them; it is retained on the device's first use, never by discovery;
- device memory is ``cuMemAlloc`` / ``cuMemFree``; out of memory is reported to the caching
  allocator as ``BackendOutOfMemory``, which turns it into ``OutOfMemoryError`` after its
  malloc ladder, as PyTorch's ``CUDACachingAllocator`` does;
- a stream is a native ``CUstream`` created with ``cuStreamCreateWithPriority`` and the
  ``CU_STREAM_NON_BLOCKING`` flag (as PyTorch's stream pools are); its handle **is** the
  ``CUstream`` value as an ``int``, and handle 0 is the legacy default stream, so a handle from
  PyTorch (``torch.cuda.Stream.cuda_stream``), CuPy (``Stream.ptr``) or ``cuda.core`` works
  with ``accelrt.Stream.from_handle``;
- an event is a ``CUevent`` (``CU_EVENT_DISABLE_TIMING`` unless timing is asked for);
- copies are ``cuMemcpyHtoDAsync`` / ``cuMemcpyDtoHAsync`` / ``cuMemcpyDtoDAsync``; host
  memory is kept alive by an event recorded after the copy until that event completes;
- virtual memory (expandable segments) is ``cuMemAddressReserve`` for the range and, for each
  page of the device's allocation granularity (``cuMemGetAllocationGranularity``, 2 MiB on
  current GPUs), one physical handle from ``cuMemCreate`` mapped with ``cuMemMap`` and made
  accessible with ``cuMemSetAccess``; unmapping waits for the device, then ``cuMemUnmap`` and
  ``cuMemRelease`` (PyTorch's ``ExpandableSegment``);
- graph capture (``accelrt.Graph``) is ``cuStreamBeginCapture`` / ``cuStreamEndCapture`` on
  the capturing stream, ``cuGraphInstantiate`` and ``cuGraphLaunch``.

Every driver call runs with the device's primary context current on the calling thread. A
thread with no current context keeps the primary context afterwards (as the CUDA runtime binds
one lazily); a thread on which another context was current gets it back after the call, so
accelrt does not change the device that PyTorch or CuPy see as current.

Importing this module and counting devices never fail: without ``cuda-bindings``, without an
NVIDIA driver or without a GPU there are zero devices and :meth:`CUDABackend.unavailable_reason`
says why (``accelrt info`` shows it). Counting devices reads NVML (``libnvidia-ml``) where
it can, so it does not initialise CUDA and a process that only counted can still ``fork``
workers that use the GPU (``torch.cuda.device_count`` does the same); without NVML, and for
properties, discovery calls ``cuInit``, ``cuDeviceGetCount`` and device attribute queries,
which create no context.

Driver errors raise :class:`CUDAError` (an ``AcceleratorError``) carrying the driver's error
name (``CUDA_ERROR_ILLEGAL_ADDRESS``) and code. ``CUDA_VISIBLE_DEVICES`` is applied by the
driver, ``ACCELRT_VISIBLE_DEVICES`` on top of it.

The driver layer is a parameter: ``CUDABackend(driver=...)`` takes any object with the
functions and types of ``cuda.bindings.driver`` that this module uses, so the call sequences
are tested without a GPU (``tests/backends/test_cuda_nogpu.py``).

The package, by capability: ``_driver`` (loading the driver, result codes, :class:`CUDAError`,
checked calls), ``_devices`` (discovery, properties, per-device state and primary contexts),
``_memory`` (device memory, virtual memory), ``_host`` (pinned host memory), ``_streams``
(streams, events, copies, memsets, synchronisation) and ``_graphs`` (graph capture).
:class:`CUDABackend` composes them here and runs each call with its device's primary context
current.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Concatenate, ParamSpec, TypeVar

from ._driver import CUDA_ERROR_INSUFFICIENT_DRIVER as CUDA_ERROR_INSUFFICIENT_DRIVER
from ._driver import CUDA_ERROR_NO_DEVICE as CUDA_ERROR_NO_DEVICE
from ._driver import CUDA_ERROR_NOT_READY as CUDA_ERROR_NOT_READY
from ._driver import CUDA_ERROR_OUT_OF_MEMORY as CUDA_ERROR_OUT_OF_MEMORY
from ._driver import CUDA_SUCCESS as CUDA_SUCCESS
from ._driver import INSTALL_HINT as INSTALL_HINT
from ._driver import CUDAError as CUDAError
from ._graphs import _Graphs
from ._host import _HostMemory
from ._memory import _DeviceMemory
from ._streams import MAX_DEFAULT_STREAM, _StreamsEvents
from ._streams import MAX_IDLE_EVENTS as MAX_IDLE_EVENTS
from ._streams import CUDAEvent as CUDAEvent

__all__ = ["CUDABackend", "CUDAError", "CUDAEvent"]


class CUDABackend(_DeviceMemory, _HostMemory, _StreamsEvents, _Graphs):
    """The ``cuda`` backend: NVIDIA GPUs through the CUDA driver API (``cuda-bindings``).

    Parameters
    ----------
    driver : module or object, optional
        The driver layer: ``cuda.bindings.driver`` (the default, imported on first use) or an
        object with the same functions and types, e.g. a fake for tests.
    nvml : callable () -> int or None, optional
        Counts the GPUs without initialising CUDA (None: it cannot tell, and ``cuInit`` and
        ``cuDeviceGetCount`` count them). Default: NVML through ctypes when ``driver`` is not
        given, nothing when it is.

    Notes
    -----
    Selected first by auto-detection when a driver and a GPU are present. ``is_available``,
    ``device_count`` and ``get_device_properties`` create no context; the first call that
    uses a device retains its primary context. Thread-safe: one lock guards the lazy
    per-device state, address reservations and the host-copy keep-alive.
    """

    name = "cuda"


_P = ParamSpec("_P")
_R = TypeVar("_R")


def _in_context(
    method: Callable[Concatenate[CUDABackend, int, _P], _R],
) -> Callable[Concatenate[CUDABackend, int, _P], _R]:
    """Run ``method(self, index, ...)`` with device ``index``'s primary context current."""

    @functools.wraps(method)
    def call(self: CUDABackend, index: int, /, *args: _P.args, **kwargs: _P.kwargs) -> _R:
        _, previous = self._enter(index)
        try:
            return method(self, index, *args, **kwargs)
        finally:
            if previous is not None:
                self._leave(index, previous)

    return call


def _in_context_for_default_streams(
    method: Callable[Concatenate[CUDABackend, int, int, _P], _R],
) -> Callable[Concatenate[CUDABackend, int, int, _P], _R]:
    """Run ``method(self, index, stream, ...)`` with device ``index``'s primary context current
    when ``stream`` is 0, 1 or 2 (the legacy and per-thread default streams: the current
    context's); a created stream's handle carries its context, and the driver takes it on any
    thread (seen on an H200: stream and event calls succeed with no context current), which
    saves the ``cuCtxGetCurrent`` check, about 1 us a call."""
    in_context = _in_context(method)

    @functools.wraps(method)
    def call(
        self: CUDABackend, index: int, stream: int, /, *args: _P.args, **kwargs: _P.kwargs
    ) -> _R:
        if stream > MAX_DEFAULT_STREAM:
            return method(self, index, stream, *args, **kwargs)
        return in_context(self, index, stream, *args, **kwargs)

    return call


def _in_event_context(
    method: Callable[Concatenate[CUDABackend, CUDAEvent, _P], _R],
) -> Callable[Concatenate[CUDABackend, CUDAEvent, _P], _R]:
    """Run ``method(self, event, ...)`` with the event's device's primary context current."""

    @functools.wraps(method)
    def call(self: CUDABackend, event: CUDAEvent, /, *args: _P.args, **kwargs: _P.kwargs) -> _R:
        _, previous = self._enter(event.device)
        try:
            return method(self, event, *args, **kwargs)
        finally:
            if previous is not None:
                self._leave(event.device, previous)

    return call


# event_query, event_synchronize and event_elapsed_ms take the event's own context
for _name in ("event_destroy",):
    setattr(CUDABackend, _name, _in_event_context(getattr(CUDABackend, _name)))
for _name in ("stream_query", "stream_synchronize", "stream_wait_event"):
    setattr(CUDABackend, _name, _in_context_for_default_streams(getattr(CUDABackend, _name)))
for _name in (
    "malloc", "free", "mem_get_info", "host_alloc", "host_free", "vm_reserve", "vm_release",
    "vm_map", "vm_unmap", "stream_create", "stream_priority_range", "stream_destroy",
    "event_create", "memcpy_async", "memset_async", "graph_capture_begin", "graph_capture_end",
    "graph_instantiate", "graph_launch", "graph_destroy", "graph_exec_destroy",
    "graph_debug_dump",
):  # fmt: skip
    setattr(CUDABackend, _name, _in_context(getattr(CUDABackend, _name)))
del _name
