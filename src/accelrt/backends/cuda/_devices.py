"""CUDA devices: discovery (no context created), properties, and per-device state with the
primary context, retained on a device's first use and made current around each call."""

from __future__ import annotations

import threading
import uuid
from collections import deque
from typing import TYPE_CHECKING

from ..._device import DeviceProperties
from ..._lazy import PerDevice
from ..._text import error_line
from .._base import STORAGE_DTYPE_NAMES, DType, choose_visible, dtypes
from ._driver import (
    CUDA_ERROR_INSUFFICIENT_DRIVER,
    CUDA_ERROR_NO_DEVICE,
    CUDA_SUCCESS,
    INSTALL_HINT,
    CUDAError,
    DriverLayer,
    _DriverCalls,
)
from ._nvml import NVMLCount, nvml_device_count

if TYPE_CHECKING:
    from cuda.bindings.driver import (
        CUcontext,
        CUdevice,
        CUevent,
        CUmemGenericAllocationHandle,
        CUstream,
    )


class _Reservation:
    """An address range from ``vm_reserve``: its size and one physical handle per mapped page."""

    __slots__ = ("handles", "size")

    def __init__(self, size: int) -> None:
        self.size = size
        self.handles: dict[int, CUmemGenericAllocationHandle] = {}  # by page address


def _forget_address(addresses: set[int], index: int, ptr: int, allocated_by: str) -> None:
    """Remove ``ptr`` from the live ``addresses`` of device ``index`` before its driver free.

    Raises ``ValueError`` if ``ptr`` is not one of them: not an address ``allocated_by``
    (``malloc``, ``host_alloc``) returned, or freed already; nothing changes then.
    """
    if ptr not in addresses:
        raise ValueError(f"cuda:{index}: {ptr:#x} is not an address returned by {allocated_by}")
    addresses.discard(ptr)


class _CUDADevice:
    """Per-device state, created on the device's first use (retains the primary context)."""

    __slots__ = (
        "allocations",
        "context",
        "context_id",
        "device",
        "idle_events",
        "keepalive",
        "reservations",
        "streams",
    )

    def __init__(self, device: CUdevice, context: CUcontext) -> None:
        self.device = device
        self.context = context
        self.context_id = int(context)
        self.allocations: set[int] = set()
        self.streams: dict[int, CUstream] = {}  # handle -> CUstream created by stream_create
        self.reservations: dict[int, _Reservation] = {}
        # (event, host object) of async host copies, kept until the event completes
        self.keepalive: deque[tuple[CUevent, object]] = deque()
        self.idle_events: list[CUevent] = []  # timing-disabled events for the keep-alive


class _Devices(_DriverCalls, PerDevice[_CUDADevice]):
    """Discovery, device properties and primary contexts: what every capability builds on."""

    name: str

    def __init__(self, driver: DriverLayer | None = None, nvml: NVMLCount | None = None) -> None:
        self._driver = driver
        # a given driver is the whole driver (a fake): no NVML beside it unless given too
        self._nvml = nvml if nvml is not None or driver is not None else nvml_device_count
        self._initialised = False  # cuInit has succeeded in this process
        self._captures = 0  # stream captures begun and not yet ended (graph_capture_*)
        self._lock = threading.RLock()
        self._physical: list[int] | None = None  # visible index -> CUDA device ordinal
        self._reason: str | None = None
        self._state: dict[int, _CUDADevice] = {}
        self._handles: dict[int, CUdevice] = {}  # visible index -> CUdevice
        self._granularity: dict[int, int] = {}
        self._vmm: bool | None = None
        self._host: set[int] = set()  # live host_alloc addresses

    def _probe(self) -> tuple[int, str | None]:
        """The number of CUDA devices and, when 0, why: NVML's count when it has one (no
        ``cuInit``: a later ``fork`` keeps a usable driver, as with ``torch.cuda``), else the
        driver's (``cuInit``, ``cuDeviceGetCount``)."""
        try:
            drv = self.driver
        except ImportError as exc:
            return 0, f"cuda-bindings is not installed ({INSTALL_HINT}): {error_line(exc)}"
        except Exception as exc:  # a broken installation: counting devices never raises
            return 0, f"cuda-bindings could not be imported: {error_line(exc)}"
        if self._nvml is not None and (count := self._nvml()):
            return count, None
        try:
            code = int(drv.cuInit(0)[0])
        except Exception as exc:  # cuda-pathfinder raises when libcuda.so cannot be found
            return 0, f"no NVIDIA driver could be loaded: {error_line(exc)}"
        if code == CUDA_ERROR_NO_DEVICE:
            return 0, "the NVIDIA driver found no CUDA-capable device (CUDA_ERROR_NO_DEVICE)"
        if code == CUDA_ERROR_INSUFFICIENT_DRIVER:
            return 0, (
                "the NVIDIA driver is older than this cuda-bindings needs "
                "(CUDA_ERROR_INSUFFICIENT_DRIVER): update the driver or install a cuda-bindings "
                "whose major version matches it, e.g. pip install 'cuda-bindings<13'"
            )
        if code != CUDA_SUCCESS:
            return 0, f"cuInit failed: {self._error_name(code)[0]}"
        self._initialised = True
        try:
            count = int(self._call("cuDeviceGetCount", None))
        except Exception as exc:
            return 0, f"cuDeviceGetCount failed: {error_line(exc)}"
        if count == 0:
            return 0, "the NVIDIA driver reports no CUDA device"
        return count, None

    def _devices(self) -> list[int]:
        if self._physical is None:
            with self._lock:
                if self._physical is None:
                    count, reason = self._probe()
                    physical, self._reason = choose_visible(range(count), reason, "CUDA")
                    self._physical = physical
        return self._physical

    def is_available(self) -> bool:
        """True if cuda-bindings imports, the driver loads and there is at least one GPU.

        Never raises; creates no context.
        """
        return bool(self._devices())

    def device_count(self) -> int:
        """Return the number of visible CUDA devices; 0 without cuda-bindings, driver or GPU.

        Never raises; creates no context (``cuInit`` and ``cuDeviceGetCount`` only).
        """
        return len(self._devices())

    def unavailable_reason(self) -> str | None:
        """Return why there are no CUDA devices, or None when there are some.

        Returns
        -------
        str or None
            e.g. ``"cuda-bindings is not installed (pip install 'accelrt[cuda]'): ..."`` or
            ``"no NVIDIA driver could be loaded: ..."``. ``accelrt info`` shows it.
        """
        self._devices()
        return self._reason

    def is_gpu(self, index: int) -> bool:
        """True: every CUDA device is a GPU."""
        return True

    def dlpack_device(self, index: int) -> tuple[int, int]:
        """Return device ``index`` as DLPack names it: ``(kDLCUDA = 2, its CUDA ordinal)``."""
        return 2, self.physical_index(index)

    def physical_index(self, index: int) -> int:
        """Return the CUDA device ordinal of accelrt device ``index`` (after visibility)."""
        return self._devices()[index]

    def _device(self, index: int) -> CUdevice:
        """Device ``index``'s ``CUdevice``; the first call initialises the driver (``cuInit``)
        when NVML counted the devices.

        Raises ``CUDAError`` if ``cuInit`` or ``cuDeviceGet`` fails.
        """
        handle = self._handles.get(index)
        if handle is None:
            if not self._initialised:
                with self._lock:
                    self._call("cuInit", index, 0)
                    self._initialised = True
            handle = self._handles[index] = self._call("cuDeviceGet", index, self._devices()[index])
        return handle

    def _attribute(self, index: int, name: str) -> int:
        attribute = getattr(self.driver.CUdevice_attribute, f"CU_DEVICE_ATTRIBUTE_{name}")
        return int(self._call("cuDeviceGetAttribute", index, attribute, self._device(index)))

    def get_device_properties(self, index: int) -> DeviceProperties:
        """Read the device's name, memory, multiprocessors and driver version.

        Parameters
        ----------
        index : int
            The device (already range-checked).

        Returns
        -------
        DeviceProperties
            ``total_memory`` from ``cuDeviceTotalMem`` (bytes), ``multi_processor_count`` the
            streaming multiprocessors, ``driver_version`` like ``"12.4"``, ``host_accessible``
            False; ``raw`` has ``major``, ``minor``, ``compute_capability`` (``"9.0"``),
            ``uuid``, ``pci_bus_id``, ``L2_cache_size``, ``warp_size``, ``is_integrated`` and
            more, named as ``torch.cuda.get_device_properties`` names them.

        Raises
        ------
        CUDAError
            If a driver query fails.

        Notes
        -----
        Creates no context. Mirrors ``torch.cuda.get_device_properties``.
        """
        dev = self._device(index)
        raw_name = self._call("cuDeviceGetName", index, 256, dev)
        name = raw_name.decode(errors="replace") if isinstance(raw_name, bytes) else str(raw_name)
        total = int(self._call("cuDeviceTotalMem", index, dev))
        version = int(self._call("cuDriverGetVersion", index))
        major = self._attribute(index, "COMPUTE_CAPABILITY_MAJOR")
        minor = self._attribute(index, "COMPUTE_CAPABILITY_MINOR")
        raw: dict[str, object] = {
            "physical_index": self._devices()[index],
            "major": major,
            "minor": minor,
            "compute_capability": f"{major}.{minor}",
            "driver_version_int": version,
        }
        try:
            raw["uuid"] = str(
                uuid.UUID(bytes=bytes(self._call("cuDeviceGetUuid", index, dev).bytes))
            )
        except (CUDAError, AttributeError, TypeError, ValueError):
            raw["uuid"] = None
        for key, attribute in (
            ("L2_cache_size", "L2_CACHE_SIZE"),
            ("warp_size", "WARP_SIZE"),
            ("max_threads_per_multi_processor", "MAX_THREADS_PER_MULTIPROCESSOR"),
            ("regs_per_multiprocessor", "MAX_REGISTERS_PER_MULTIPROCESSOR"),
            ("is_integrated", "INTEGRATED"),
            ("pci_bus_id", "PCI_BUS_ID"),
            ("pci_device_id", "PCI_DEVICE_ID"),
            ("pci_domain_id", "PCI_DOMAIN_ID"),
            ("memory_bus_width", "GLOBAL_MEMORY_BUS_WIDTH"),
            ("unified_addressing", "UNIFIED_ADDRESSING"),
            ("stream_priorities_supported", "STREAM_PRIORITIES_SUPPORTED"),
            ("virtual_memory_management_supported", "VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED"),
        ):
            raw[key] = self._attribute(index, attribute)
        return DeviceProperties(
            name=name.split("\x00", 1)[0].strip(),
            vendor="NVIDIA",
            backend=self.name,
            index=index,
            total_memory=total,
            multi_processor_count=self._attribute(index, "MULTIPROCESSOR_COUNT"),
            max_allocation_bytes=total,
            driver_version=f"{version // 1000}.{version % 1000 // 10}",
            host_accessible=False,
            pinned_host_memory=True,
            raw=raw,
        )

    def supported_dtypes(self, index: int) -> frozenset[DType]:
        """Every fixed-size numpy dtype: device memory holds bytes of any kind."""
        return dtypes(STORAGE_DTYPE_NAMES)

    def supports_virtual_memory(self) -> bool:
        """True if every visible device supports virtual memory management (VMM).

        Reads ``CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED``; False without
        devices. Creates no context.
        """
        if self._vmm is None:
            count = self.device_count()
            self._vmm = count > 0 and all(
                self._attribute(i, "VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED") for i in range(count)
            )
        return self._vmm

    def _new_dev(self, index: int) -> _CUDADevice:
        """A new state of the device: its primary context retained (``_dev``, under the lock)."""
        device = self._device(index)
        context = self._call("cuDevicePrimaryCtxRetain", index, device)
        return _CUDADevice(device, context)

    def _enter(self, index: int) -> tuple[_CUDADevice, CUcontext | None]:
        """Make device ``index``'s primary context current; return its state and the context to
        restore afterwards (None when nothing needs restoring)."""
        state = self._dev(index)
        current = self._call("cuCtxGetCurrent", index)
        current_id = int(current)
        if current_id == state.context_id:
            return state, None
        self._call("cuCtxSetCurrent", index, state.context)
        return state, (current if current_id else None)

    def _leave(self, index: int, previous: CUcontext | None) -> None:
        if previous is not None:
            self._call("cuCtxSetCurrent", index, previous)

    def context(self, index: int) -> CUcontext:
        """Return device ``index``'s primary context (a ``CUcontext``), retaining it.

        Raises
        ------
        CUDAError
            If the driver cannot retain it.
        """
        return self._dev(index).context

    def _stream(self, state: _CUDADevice, stream: int) -> CUstream:
        handle = state.streams.get(stream)
        return handle if handle is not None else self.driver.CUstream(stream)
