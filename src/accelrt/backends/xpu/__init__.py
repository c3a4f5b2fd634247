"""The XPU backend: Intel's SYCL runtime through dpctl (Level Zero GPUs; the OpenCL CPU device).

The device type PyTorch uses for this runtime. Mapping of the runtime's concepts onto SYCL:

- device memory is USM device memory (``sycl::malloc_device`` through
  ``dpctl.memory.MemoryUSMDevice``): pointers are plain integers, so the caching allocator
  splits segments by offset; host memory for ``accelrt.empty_host`` is USM host memory
  (``sycl::malloc_host``, ``MemoryUSMHost``: page-locked on GPUs);
- a stream is an in-order queue with profiling (``dpctl.SyclQueue(context, device,
  property=["in_order", "enable_profiling"])``); every queue of a device shares one
  ``SyclContext``, so memory is usable on all of them; handle 0 is the device's default queue;
- an event is a barrier (``submit_barrier()``) recorded on the queue: a marker whose
  ``SyclEvent`` carries the profiling times (ns) and the execution status;
- waiting on an event from another queue is ``submit_barrier([event])``;
- copies are ``queue.memcpy_async`` in every direction, fills ``sycl::queue::memset``
  (through dpctl's C interface, ``DPCTLQueue_Memset``).

Discovery: GPUs first (Level Zero's where both Level Zero and OpenCL list them), else the CPU
and accelerator devices. The ``intel-opencl-rt`` wheel installs Intel's OpenCL CPU runtime into
``sys.prefix/lib``, but its ICD file names a path that does not exist, so the ICD loader finds
no device: unless ``OCL_ICD_FILENAMES`` is set, the backend points it at that runtime
(``libintelocl.so``) before dpctl first loads the SYCL runtime. ``unavailable_reason`` (shown by
``accelrt info``) says why there is no device when there is none.

SYCL reports no free device memory in general (Level Zero's ``ext_intel_free_memory`` is not
reachable through dpctl 0.22): ``mem_get_info`` returns ``total - bytes this process holds
through this backend``, and ``malloc`` refuses to go beyond the device's
``global_mem_size`` (on the CPU device, host memory it would overcommit). SYCL has no
virtual-memory API reachable from Python (Level Zero's ``zeVirtualMemReserve``/``Map`` are not
wrapped by dpctl), so ``expandable_segments`` falls back to ordinary segments with a warning.

The package, by concept: ``_sycl`` (the ICD set-up, importing dpctl, dpctl's errors and C
interface), ``_devices`` (discovery, properties, per-device state), ``_queues`` (a stream's
queue object and the event handle), ``_memory`` (device and host memory) and ``_streams``
(streams, events, copies, fills, synchronisation). :class:`XPUBackend` composes them here.
"""

from __future__ import annotations

from .._base import NoVirtualMemory, map_driver_errors
from ._devices import _USMRange as _USMRange
from ._memory import _DeviceMemory, _HostMemory
from ._queues import XPUEvent as XPUEvent
from ._streams import _StreamsEvents
from ._sycl import INSTALL_HINT as INSTALL_HINT
from ._sycl import _raise_driver_error
from ._sycl import setup_icd as setup_icd

__all__ = ["INSTALL_HINT", "XPUBackend", "XPUEvent", "setup_icd"]


class XPUBackend(_DeviceMemory, _HostMemory, _StreamsEvents, NoVirtualMemory):
    """The ``xpu`` backend: SYCL devices through dpctl, GPUs first, else the CPU device.

    Notes
    -----
    ``is_available`` and ``device_count`` import dpctl and enumerate devices (the SYCL
    runtime creates no context for that); importing accelrt imports no dpctl. Thread-safe: one
    lock guards the lazy per-device state. ``ACCELRT_VISIBLE_DEVICES`` indexes the order.
    """

    no_vmm_reason = (
        "SYCL has no virtual-memory API that dpctl reaches (Level Zero's zeVirtualMemReserve and "
        "zeVirtualMemMap are not wrapped by dpctl 0.22)"
    )

    name = "xpu"


_DRIVER_CALLS = (
    "malloc", "free", "stream_create", "stream_destroy", "stream_wait_event",
    "event_elapsed_ms", "memset_async", "synchronize", "host_alloc", "host_free",
)  # fmt: skip
map_driver_errors(XPUBackend, _DRIVER_CALLS, _raise_driver_error)
