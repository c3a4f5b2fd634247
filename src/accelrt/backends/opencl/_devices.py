"""Discovery, properties and per-device state of the ``opencl`` backend (devices with
coarse-grained SVM, GPUs first)."""

from __future__ import annotations

import functools
import threading
from types import ModuleType
from typing import TYPE_CHECKING

from ..._device import DeviceProperties
from ..._lazy import PerDevice
from .._base import DType, dtypes, visible_devices
from ._cl import Marker, SVMMemcpy, _import_cl, _svm_memcpy_by_enqueue_copy
from ._queues import _CLStream

if TYPE_CHECKING:
    import pyopencl


class _CLDevice:
    """Per-device state, created on first use of the device."""

    __slots__ = (
        "allocations", "cl", "context", "device", "held", "index", "marker", "streams", "svm",
        "svm_memcpy",
    )  # fmt: skip

    def __init__(self, cl: ModuleType, device: pyopencl.Device, index: int) -> None:
        self.cl = cl  # the pyopencl module, so hot paths need no import statement
        self.device = device
        self.index = index
        self.context: pyopencl.Context = cl.Context([device])
        self.allocations: dict[int, pyopencl.SVMAllocation] = {}
        self.held = 0
        # (device pointer, bytes) -> the cl.SVM wrapper copies use; emptied when memory is freed
        self.svm: dict[tuple[int, int], pyopencl.SVMPointer] = {}
        # clEnqueueSVMMemcpy as PyOpenCL's extension exposes it, (queue, is_blocking, dst, src,
        # wait_for, byte_count) with both sides cl.SVM: what pyopencl.enqueue_copy calls after
        # about 1 us of dispatch in Python on its arguments' types. Where a PyOpenCL version
        # lacks it, the same call through enqueue_copy.
        self.svm_memcpy: SVMMemcpy = getattr(
            getattr(cl, "_cl", None), "_enqueue_svm_memcpy", None
        ) or functools.partial(_svm_memcpy_by_enqueue_copy, cl)
        # clEnqueueMarkerWithWaitList, (queue, wait_for): what pyopencl.enqueue_marker calls
        # after asking the queue's OpenCL version (SVM devices are OpenCL 2.0, so always it)
        self.marker: Marker = getattr(
            getattr(cl, "_cl", None), "_enqueue_marker_with_wait_list", cl.enqueue_marker
        )
        # the live streams by handle; 0 is the default stream
        self.streams: dict[int, _CLStream] = {}
        self.streams[0] = self.new_stream(0)

    def new_stream(self, handle: int) -> _CLStream:
        """Return a stream ``handle`` over a new in-order, profiling-enabled queue."""
        cl = self.cl
        props = cl.command_queue_properties.PROFILING_ENABLE
        return _CLStream(self, handle, cl.CommandQueue(self.context, self.device, properties=props))


class _Devices(PerDevice[_CLDevice]):
    """Discovery, properties and the lazy per-device state of the ``opencl`` backend."""

    name = "opencl"

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._cl_devices: list[pyopencl.Device] | None = None
        self._state: dict[int, _CLDevice] = {}
        self._next_stream = 1

    # discovery
    def _devices(self) -> list[pyopencl.Device]:
        if self._cl_devices is None:
            found: list[pyopencl.Device] = []
            try:
                cl = _import_cl()
                for platform in cl.get_platforms():
                    for dev in platform.get_devices():
                        if dev.svm_capabilities & cl.device_svm_capabilities.COARSE_GRAIN_BUFFER:
                            found.append(dev)
                rank = {cl.device_type.GPU: 0, cl.device_type.ACCELERATOR: 1}
                found.sort(key=lambda d: rank.get(d.type & ~cl.device_type.DEFAULT, 2))
            except Exception:  # no ICD loader, no platform, import failure: no devices
                found = []
            self._cl_devices = [found[i] for i in visible_devices(len(found))]
        return self._cl_devices

    def is_available(self) -> bool:
        """True if PyOpenCL imports and at least one device supports coarse-grained SVM."""
        return bool(self._devices())

    def device_count(self) -> int:
        """Number of OpenCL devices with coarse-grained SVM; 0 if PyOpenCL is missing."""
        devices = self._cl_devices  # found once; every device argument is counted
        return len(devices if devices is not None else self._devices())

    def is_gpu(self, index: int) -> bool:
        """Return True if device ``index`` is a GPU (auto-detection prefers those)."""
        cl = _import_cl()
        return bool(self._devices()[index].type & cl.device_type.GPU)

    def get_device_properties(self, index: int) -> DeviceProperties:
        """Read the device's name, vendor, memory, compute units and driver from OpenCL."""
        dev = self._devices()[index]
        return DeviceProperties(
            name=dev.name.strip(),
            vendor=dev.vendor.strip(),
            backend=self.name,
            index=index,
            total_memory=int(dev.global_mem_size),
            multi_processor_count=int(dev.max_compute_units),
            max_allocation_bytes=int(dev.max_mem_alloc_size),
            driver_version=dev.driver_version.strip(),
            host_accessible=bool(dev.host_unified_memory),
            pinned_host_memory=self.host_memory_pinned(index),
            raw={
                "platform": dev.platform.name.strip(),
                "version": dev.version.strip(),
                "type": int(dev.type),
                "svm_capabilities": int(dev.svm_capabilities),
                "max_work_group_size": int(dev.max_work_group_size),
                "global_mem_cache_size": int(dev.global_mem_cache_size),
                "local_mem_size": int(dev.local_mem_size),
            },
        )

    def supported_dtypes(self, index: int) -> frozenset[DType]:
        """Return the dtypes device ``index`` supports.

        Integers, bool, float32 and complex64 always (OpenCL requires them); float64 and
        complex128 where the device reports double precision; float16 with ``cl_khr_fp16``.
        """
        dev = self._devices()[index]
        names = ["bool", "float32", "complex64"]
        names += [f"{kind}{bits}" for kind in ("int", "uint") for bits in (8, 16, 32, 64)]
        if dev.double_fp_config:
            names += ["float64", "complex128"]
        if "cl_khr_fp16" in dev.extensions.split():
            names.append("float16")
        return dtypes(names)

    def _new_dev(self, index: int) -> _CLDevice:
        return _CLDevice(_import_cl(), self._devices()[index], index)

    def context(self, index: int) -> pyopencl.Context:
        """Return the device's ``pyopencl.Context`` (for native interop, e.g. user events)."""
        return self._dev(index).context

    def host_memory_pinned(self, index: int) -> bool:
        """True: host memory is the driver's, ``CL_MEM_ALLOC_HOST_PTR`` buffers mapped into the
        process (page-locked on GPU drivers; on a CPU device such as PoCL's, memory the device
        itself allocated, which it reads and writes without staging)."""
        return True
