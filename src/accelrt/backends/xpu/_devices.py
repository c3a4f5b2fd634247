"""Discovery, properties and per-device state of the ``xpu`` backend (GPUs first, else the
CPU and accelerator devices; one ``SyclContext`` per device, shared by all its queues)."""

from __future__ import annotations

import os
import sys
import threading
from types import ModuleType
from typing import TYPE_CHECKING

from ..._device import DeviceProperties
from ..._lazy import made_once
from ..._stream_ops import NO_VIEW  # the build where there is one (_compiled.py)
from ..._text import error_line
from .._base import DType, choose_visible, dtypes
from ._queues import _XPUStream
from ._sycl import INSTALL_HINT, _icd_note, _import_dpctl

if TYPE_CHECKING:
    from dpctl import SyclContext, SyclDevice, SyclQueue
    from dpctl.memory import MemoryUSMDevice, MemoryUSMHost

KDL_ONEAPI = 14
"""DLPack's device type of SYCL (oneAPI) memory."""

# how many cached dpctl views of device memory ranges a device keeps (see _XPUDevice.view)
_VIEW_CACHE_SIZE = 4096


class _USMRange:
    """A ``__sycl_usm_array_interface__`` of bytes inside a USM allocation (for dpctl views)."""

    __slots__ = ("__sycl_usm_array_interface__",)

    def __init__(self, ptr: int, nbytes: int, syclobj: SyclContext) -> None:
        self.__sycl_usm_array_interface__ = {
            "data": (ptr, False),
            "shape": (nbytes,),
            "strides": None,
            "typestr": "|u1",
            "version": 1,
            "syclobj": syclobj,
        }


class _XPUDevice:
    """Per-device state, created on first use of the device: its context, queues, memory."""

    __slots__ = (
        "allocations", "complete", "context", "device", "dpctl", "held", "index", "streams",
        "views",
    )  # fmt: skip

    def __init__(self, dpctl: ModuleType, device: SyclDevice, index: int) -> None:
        self.dpctl = dpctl
        self.device = device
        self.index = index
        self.context: SyclContext = dpctl.SyclContext(device)
        self.complete = dpctl.event_status_type.complete
        self.allocations: dict[int, MemoryUSMDevice] = {}
        self.held = 0
        # (pointer, bytes) -> a dpctl MemoryUSMDevice view of that range (copies use it);
        # building one costs ~15 us, so it is kept until memory is freed or the cache fills
        self.views: dict[tuple[int, int], MemoryUSMDevice] = {}
        self.streams: dict[int, _XPUStream] = {}
        self.streams[0] = _XPUStream(self, 0, self.new_queue(), owned=True)

    def new_queue(self) -> SyclQueue:
        """Return a new in-order, profiling queue of the device in its context."""
        return self.dpctl.SyclQueue(
            self.context, self.device, property=["in_order", "enable_profiling"]
        )

    def view(self, ptr: int, nbytes: int) -> MemoryUSMDevice:
        """Return (and cache) a dpctl ``MemoryUSMDevice`` over ``[ptr, ptr + nbytes)``."""
        views = self.views
        if len(views) >= _VIEW_CACHE_SIZE:
            self.forget_views()
        view = views[(ptr, nbytes)] = self.dpctl.memory.MemoryUSMDevice(
            _USMRange(ptr, nbytes, self.context)
        )
        return view

    def forget_views(self) -> None:
        """Drop the cached views: ``views`` and each stream's ``last_view``."""
        self.views.clear()
        for stream in list(self.streams.values()):  # a copy: another thread may add a stream
            stream.last_view = NO_VIEW

    def finish_all(self) -> None:
        """Wait for every queue of the device; forget the host objects of their copies."""
        streams = list(self.streams.values())  # a copy: another thread may add a stream
        for stream in streams:
            queue = stream.queue
            if queue is not None:
                queue.wait()
            stream.last = None
        for stream in streams:
            stream.keep.clear()


class _Devices:
    """Discovery, properties and the lazy per-device state of the ``xpu`` backend."""

    name = "xpu"

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._sycl_devices: list[SyclDevice] | None = None
        self._reason: str | None = None
        self._state: dict[int, _XPUDevice] = {}
        self._next_stream = 1
        self._host: dict[int, tuple[int, MemoryUSMHost]] = {}

    # ------------------------------------------------------------------ discovery
    def _probe(self) -> tuple[list[SyclDevice], str | None]:
        try:
            dpctl = _import_dpctl()
        except ImportError as exc:
            return [], f"dpctl is not installed ({INSTALL_HINT}): {error_line(exc)}"
        except Exception as exc:
            return [], f"dpctl could not be imported: {error_line(exc)}"
        try:
            every = list(dpctl.get_devices())
        except Exception as exc:
            return [], f"the SYCL runtime found no devices: {error_line(exc)}"
        usable = [d for d in every if d.has_aspect_usm_device_allocations]
        gpus = [d for d in usable if d.is_gpu]
        if gpus:  # one backend's GPUs: Level Zero's where both list them
            zero = [d for d in gpus if d.backend == dpctl.backend_type.level_zero]
            found = zero or gpus
        else:
            found = [d for d in usable if d.is_accelerator] + [d for d in usable if d.is_cpu]
        if found:
            return found, None
        if every:
            return [], (
                f"the SYCL runtime lists {len(every)} device(s) but none supports USM device "
                "allocations"
            )
        icd = _icd_note[0] if _icd_note else ""
        user = os.environ.get("OCL_ICD_FILENAMES", "")
        if icd:
            why = f"OCL_ICD_FILENAMES was set to {icd} and the SYCL runtime still found none"
        elif user:
            why = (
                f"OCL_ICD_FILENAMES={user!r} (set by the user) gives the SYCL runtime no device; "
                "point it at libintelocl.so of the intel-opencl-rt package, or unset it"
            )
        else:
            why = (
                f"no Intel OpenCL CPU runtime in {os.path.join(sys.prefix, 'lib')} "
                f"(pip install intel-opencl-rt, or {INSTALL_HINT}) and no Level Zero GPU driver"
            )
        return [], f"dpctl sees no SYCL device: {why}"

    def _devices(self) -> list[SyclDevice]:
        if self._sycl_devices is None:
            with self._lock:
                if self._sycl_devices is None:
                    found, reason = self._probe()
                    chosen, self._reason = choose_visible(found, reason, "XPU")
                    self._sycl_devices = chosen
        return self._sycl_devices

    def is_available(self) -> bool:
        """True if dpctl imports and the SYCL runtime lists a device with USM; never raises."""
        return bool(self._devices())

    def device_count(self) -> int:
        """Return the number of usable SYCL devices; 0 without dpctl or devices; never raises."""
        devices = self._sycl_devices
        return len(devices if devices is not None else self._devices())

    def unavailable_reason(self) -> str | None:
        """Return why there are no XPU devices (``accelrt info`` shows it), or None.

        Returns
        -------
        str or None
            e.g. ``"dpctl is not installed (pip install 'accelrt[xpu]'): ..."`` or
            ``"dpctl sees no SYCL device: no Intel OpenCL CPU runtime in ..."``.
        """
        self._devices()
        return self._reason

    def is_gpu(self, index: int) -> bool:
        """Return True if device ``index`` is a GPU."""
        return bool(self._devices()[index].is_gpu)

    def sycl_device(self, index: int) -> SyclDevice:
        """Return the ``dpctl.SyclDevice`` of device ``index`` (for native interop)."""
        return self._devices()[index]

    def dlpack_device(self, index: int) -> tuple[int, int]:
        """Return device ``index`` as DLPack names it: ``(kDLOneAPI = 14, its index in
        dpctl.get_devices())``, the pair dpctl and dpnp read in ``__dlpack_device__``
        (``Buffer.__dlpack_device__`` answers it)."""
        return KDL_ONEAPI, int(self._devices()[index].get_device_id())

    def get_device_properties(self, index: int) -> DeviceProperties:
        """Read the device's name, vendor, memory, compute units and driver from SYCL."""
        dev = self._devices()[index]
        return DeviceProperties(
            name=str(dev.name).strip(),
            vendor=str(dev.vendor).strip(),
            backend=self.name,
            index=index,
            total_memory=int(dev.global_mem_size),
            multi_processor_count=int(dev.max_compute_units),
            max_allocation_bytes=int(dev.max_mem_alloc_size),
            driver_version=str(dev.driver_version).strip(),
            host_accessible=bool(dev.is_cpu),
            pinned_host_memory=self.host_memory_pinned(index),
            raw={
                "platform": str(dev.sycl_platform.name).strip(),
                "sycl_backend": str(dev.backend.name),
                "device_type": str(dev.device_type.name),
                "filter_string": str(dev.filter_string),
                "max_work_group_size": int(dev.max_work_group_size),
                "global_mem_cache_size": int(dev.global_mem_cache_size),
                "local_mem_size": int(dev.local_mem_size),
                "max_clock_frequency": int(dev.max_clock_frequency),
                "sub_group_sizes": tuple(int(s) for s in dev.sub_group_sizes),
            },
        )

    def supported_dtypes(self, index: int) -> frozenset[DType]:
        """Integers, bool, float32 and complex64; float64/complex128 with the ``fp64`` aspect,
        float16 with ``fp16``."""
        dev = self._devices()[index]
        names = ["bool", "float32", "complex64"]
        names += [f"{kind}{bits}" for kind in ("int", "uint") for bits in (8, 16, 32, 64)]
        if dev.has_aspect_fp64:
            names += ["float64", "complex128"]
        if dev.has_aspect_fp16:
            names.append("float16")
        return dtypes(names)

    def host_memory_pinned(self, index: int) -> bool:
        """True: ``host_alloc`` memory is USM host memory, the driver's own (page-locked on
        GPUs; on the CPU device, memory the device reads and writes without staging)."""
        return True

    def _dev(self, index: int) -> _XPUDevice:
        state = self._state.get(index)  # the hot case inline: no extra call
        if state is None:  # first use: made once, under the lock
            device = self._devices()[index]  # before the lock: a first probe takes it too
            state = made_once(
                self._state, index, self._lock, lambda i: _XPUDevice(_import_dpctl(), device, i)
            )
        return state

    def context(self, index: int) -> SyclContext:
        """Return the device's ``dpctl.SyclContext``: every stream's queue and all memory of
        the backend belong to it (for native interop)."""
        return self._dev(index).context
