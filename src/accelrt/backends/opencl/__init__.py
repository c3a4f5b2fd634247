"""The OpenCL backend, through PyOpenCL: any vendor's device; PoCL's CPU device where no GPU is.

Mapping of the runtime's concepts onto OpenCL:

- device memory is coarse-grained shared virtual memory (``clSVMAlloc``), so pointers are plain
  integers and the caching allocator splits segments by offset;
- a stream is an in-order command queue with profiling enabled; handle 0 is the device's default
  queue;
- an event is a marker enqueued on the queue; waiting on an event from another queue is a
  barrier with a wait list;
- copies and fills are SVM memcpy and memfill;
- pinned host memory (``accelrt.empty_host``) is a ``CL_MEM_ALLOC_HOST_PTR`` buffer mapped
  once for its host address (page-locked by GPU drivers; ordinary memory on PoCL's CPU device).

PoCL 3.0 (the pip ``pocl-binary-distribution``) corrupts memory when an SVM allocation is bound
to a queue or when its free is enqueued, so neither is ever done: raw SVM is released with
``clSVMFree`` only after every queue of the device has finished.

OpenCL cannot report free device memory; ``mem_get_info`` returns ``total - bytes this process
holds through this backend``.

The package, by concept: ``_cl`` (importing PyOpenCL, its codes and errors), ``_devices``
(discovery, properties, per-device state), ``_queues`` (a stream's queue object, the event
handle, the cached ``cl.SVM`` wrappers), ``_memory`` (SVM and host memory) and ``_streams``
(streams, events, copies, fills, synchronisation). :class:`OpenCLBackend` composes them here.
"""

from __future__ import annotations

from .._base import NoVirtualMemory, map_driver_errors
from ._cl import _raise_driver_error
from ._cl import _svm_memcpy_by_enqueue_copy as _svm_memcpy_by_enqueue_copy
from ._memory import _DeviceMemory, _HostMemory
from ._queues import _KEEP_SCAN as _KEEP_SCAN
from ._queues import OpenCLEvent as OpenCLEvent
from ._streams import _StreamsEvents

__all__ = ["OpenCLBackend", "OpenCLEvent"]


class OpenCLBackend(_DeviceMemory, _HostMemory, _StreamsEvents, NoVirtualMemory):
    """The ``opencl`` backend: every OpenCL device with coarse-grained SVM, GPUs first.

    Notes
    -----
    Devices are ordered GPUs first, then accelerators, then CPUs, each in platform order, so
    ``opencl:0`` is the best device present; ``ACCELRT_VISIBLE_DEVICES`` indexes that order.
    ``is_available`` and ``device_count`` enumerate platforms without creating a context.
    Thread-safe: one lock guards the lazy per-device state.
    """

    no_vmm_reason = (
        "OpenCL has no API to reserve address space and map pages into it (virtual memory)"
    )

    name = "opencl"


# stream_query, stream_synchronize, event_record, event_query, event_synchronize and
# memcpy_async map PyOpenCL's errors inline (_raise_driver_error): a wrapper costs a call per call
_DRIVER_CALLS = (
    "malloc", "free", "stream_create", "stream_destroy", "stream_wait_event",
    "event_elapsed_ms", "memset_async", "synchronize",
    "host_alloc", "host_free",  # the host allocator's calls
)  # fmt: skip
map_driver_errors(OpenCLBackend, _DRIVER_CALLS, _raise_driver_error)
