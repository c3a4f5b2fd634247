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
says why (``accelrt info`` shows it). Discovery calls only ``cuInit``, ``cuDeviceGetCount``
and device attribute queries, which create no context.

Driver errors raise :class:`CUDAError` (an ``AcceleratorError``) carrying the driver's error
name (``CUDA_ERROR_ILLEGAL_ADDRESS``) and code. ``CUDA_VISIBLE_DEVICES`` is applied by the
driver, ``ACCELRT_VISIBLE_DEVICES`` on top of it.

The driver layer is a parameter: ``CUDABackend(driver=...)`` takes any object with the
functions and types of ``cuda.bindings.driver`` that this module uses, so the call sequences
are tested without a GPU (``tests/backends/test_cuda_nogpu.py``).
"""

from __future__ import annotations

import functools
import os
import threading
import uuid
from collections import deque
from collections.abc import Callable
from typing import Any

from .._device import DeviceProperties
from .._errors import AcceleratorError
from ._base import STORAGE_DTYPE_NAMES, BackendOutOfMemory, dtypes, visible_devices

__all__ = ["CUDABackend", "CUDAError", "CUDAEvent"]

INSTALL_HINT = "pip install 'accelrt[cuda]'"

# CUresult codes this module tells apart (cuda.h).
CUDA_SUCCESS = 0
CUDA_ERROR_OUT_OF_MEMORY = 2
CUDA_ERROR_INSUFFICIENT_DRIVER = 35
CUDA_ERROR_NO_DEVICE = 100
CUDA_ERROR_NOT_READY = 600

MAX_IDLE_EVENTS = 64
"""Events kept for reuse per device by the host-copy keep-alive (the rest are destroyed)."""


def _load_driver() -> Any:
    from cuda.bindings import driver

    return driver


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split()) or type(exc).__name__


class CUDAError(AcceleratorError):
    """A CUDA driver call failed.

    Parameters
    ----------
    message : str
        The full explanation: the call, the device, the driver's error name and description.
    function : str
        The driver function that failed, e.g. ``"cuMemcpyHtoDAsync"``.
    result : int
        The ``CUresult`` code, e.g. 700.
    error_name : str
        The driver's name of the code, e.g. ``"CUDA_ERROR_ILLEGAL_ADDRESS"``.

    Notes
    -----
    Mirrors ``torch.AcceleratorError`` raised for ``cudaError_t`` failures; pickles.
    """

    def __init__(self, message: str, *, function: str, result: int, error_name: str) -> None:
        super().__init__(message)
        self.function = function
        self.result = result
        self.error_name = error_name

    def __reduce__(self) -> tuple[Any, ...]:
        kwargs = {"function": self.function, "result": self.result, "error_name": self.error_name}
        return (_rebuild_cuda_error, (str(self), kwargs))


def _rebuild_cuda_error(message: str, kwargs: dict[str, Any]) -> CUDAError:
    return CUDAError(message, **kwargs)


class CUDAEvent:
    """A CUDA event handle: the device, the native ``CUevent`` and whether it times.

    Attributes
    ----------
    device : int
        The accelrt device index the event belongs to.
    handle : CUevent
        The driver's event; ``int(event.handle)`` is the native ``CUevent`` value.
    timing : bool
        Whether it was created with timing (no ``CU_EVENT_DISABLE_TIMING``).
    """

    __slots__ = ("device", "handle", "timing")

    def __init__(self, device: int, handle: Any, timing: bool) -> None:
        self.device = device
        self.handle = handle
        self.timing = timing

    def __repr__(self) -> str:
        return (
            f"CUDAEvent(device={self.device}, handle={int(self.handle):#x}, timing={self.timing})"
        )


class _Reservation:
    """An address range from ``vm_reserve``: its size and one physical handle per mapped page."""

    __slots__ = ("handles", "size")

    def __init__(self, size: int) -> None:
        self.size = size
        self.handles: dict[int, Any] = {}  # page address -> CUmemGenericAllocationHandle


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

    def __init__(self, device: Any, context: Any) -> None:
        self.device = device
        self.context = context
        self.context_id = int(context)
        self.allocations: set[int] = set()
        self.streams: dict[int, Any] = {}  # handle -> CUstream created by stream_create
        self.reservations: dict[int, _Reservation] = {}
        # (event, host object) of async host copies, kept until the event completes
        self.keepalive: deque[tuple[Any, Any]] = deque()
        self.idle_events: list[Any] = []  # timing-disabled events for the keep-alive


def _host_address(view: memoryview, nbytes: int) -> int:
    """The address of the first byte of a C-contiguous host buffer of at least ``nbytes``."""
    import numpy as np

    array = np.frombuffer(view, dtype=np.uint8)
    if array.size < nbytes:
        raise ValueError(f"host buffer has {array.size} bytes, {nbytes} to copy")
    return int(array.__array_interface__["data"][0])


class CUDABackend:
    """The ``cuda`` backend: NVIDIA GPUs through the CUDA driver API (``cuda-bindings``).

    Parameters
    ----------
    driver : module or object, optional
        The driver layer: ``cuda.bindings.driver`` (the default, imported on first use) or an
        object with the same functions and types, e.g. a fake for tests.

    Notes
    -----
    Selected first by auto-detection when a driver and a GPU are present. ``is_available``,
    ``device_count`` and ``get_device_properties`` create no context; the first call that
    uses a device retains its primary context. Thread-safe: one lock guards the lazy
    per-device state, address reservations and the host-copy keep-alive.
    """

    name = "cuda"

    def __init__(self, driver: Any = None) -> None:
        self._driver = driver
        self._lock = threading.RLock()
        self._physical: list[int] | None = None  # visible index -> CUDA device ordinal
        self._reason: str | None = None
        self._state: dict[int, _CUDADevice] = {}
        self._handles: dict[int, Any] = {}  # visible index -> CUdevice
        self._granularity: dict[int, int] = {}
        self._vmm: bool | None = None
        self._host: set[int] = set()  # live host_alloc addresses

    # ------------------------------------------------------------------ driver plumbing
    @property
    def driver(self) -> Any:
        """The driver layer (``cuda.bindings.driver`` unless another was given).

        Raises
        ------
        ImportError
            If ``cuda-bindings`` is not installed (the message says how to install it).
        """
        if self._driver is None:
            try:
                self._driver = _load_driver()
            except ImportError as exc:
                raise ImportError(
                    f"the CUDA backend needs cuda-bindings: {INSTALL_HINT} ({_one_line(exc)})",
                    name="cuda",
                ) from exc
        return self._driver

    def _error_name(self, code: int) -> tuple[str, str]:
        """The driver's name and description of ``code`` (fallbacks when it has none)."""
        drv = self.driver
        name = description = ""
        try:
            result = drv.cuGetErrorName(drv.CUresult(code))
            if int(result[0]) == CUDA_SUCCESS and result[1]:
                name = result[1].decode() if isinstance(result[1], bytes) else str(result[1])
            result = drv.cuGetErrorString(drv.CUresult(code))
            if int(result[0]) == CUDA_SUCCESS and result[1]:
                raw = result[1]
                description = raw.decode() if isinstance(raw, bytes) else str(raw)
        except Exception:  # an unknown code, a driver that cannot be loaded
            pass
        return name or f"CUresult {code}", description

    def _error(self, function: str, code: int, index: int | None) -> CUDAError:
        name, description = self._error_name(code)
        where = f" on cuda:{index}" if index is not None else ""
        detail = f" ({description})" if description else ""
        return CUDAError(
            f"CUDA {function} failed{where}: {name}{detail}",
            function=function,
            result=code,
            error_name=name,
        )

    def _call(self, function: str, index: int | None, *args: Any) -> Any:
        """Call driver ``function``; return its outputs (None, one value or a tuple).

        Raises ``CUDAError`` for any result but ``CUDA_SUCCESS``.
        """
        result = getattr(self.driver, function)(*args)
        code = int(result[0])
        if code != CUDA_SUCCESS:
            raise self._error(function, code, index)
        if len(result) == 1:
            return None
        return result[1] if len(result) == 2 else tuple(result[1:])

    def _oom_or_raise(self, function: str, index: int, code: int, nbytes: int) -> None:
        """Raise ``BackendOutOfMemory`` for an out-of-memory result, else ``CUDAError``."""
        if code == CUDA_ERROR_OUT_OF_MEMORY:
            raise BackendOutOfMemory(
                f"cuda:{index}: {function} of {nbytes} bytes failed: CUDA_ERROR_OUT_OF_MEMORY"
            )
        raise self._error(function, code, index)

    # ------------------------------------------------------------------ discovery
    def _probe(self) -> tuple[int, str | None]:
        """The number of CUDA devices the driver reports and, when 0, why."""
        try:
            drv = self.driver
        except ImportError as exc:
            return 0, f"cuda-bindings is not installed ({INSTALL_HINT}): {_one_line(exc)}"
        except Exception as exc:  # a broken installation: counting devices never raises
            return 0, f"cuda-bindings could not be imported: {_one_line(exc)}"
        try:
            code = int(drv.cuInit(0)[0])
        except Exception as exc:  # cuda-pathfinder raises when libcuda.so cannot be found
            return 0, f"no NVIDIA driver could be loaded: {_one_line(exc)}"
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
        try:
            count = int(self._call("cuDeviceGetCount", None))
        except Exception as exc:
            return 0, f"cuDeviceGetCount failed: {_one_line(exc)}"
        if count == 0:
            return 0, "the NVIDIA driver reports no CUDA device"
        return count, None

    def _devices(self) -> list[int]:
        if self._physical is None:
            with self._lock:
                if self._physical is None:
                    count, reason = self._probe()
                    physical = visible_devices(count) if count else []
                    if count and not physical:
                        reason = f"ACCELRT_VISIBLE_DEVICES hides all {count} CUDA device(s)"
                    self._reason = reason
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

    def physical_index(self, index: int) -> int:
        """Return the CUDA device ordinal of accelrt device ``index`` (after visibility)."""
        return self._devices()[index]

    def _device(self, index: int) -> Any:
        handle = self._handles.get(index)
        if handle is None:
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
        raw: dict[str, Any] = {
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

    def supported_dtypes(self, index: int) -> frozenset[Any]:
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

    # ------------------------------------------------------------------ contexts
    def _dev(self, index: int) -> _CUDADevice:
        """The device's state, retaining its primary context on first use."""
        state = self._state.get(index)
        if state is None:
            with self._lock:
                state = self._state.get(index)
                if state is None:
                    device = self._device(index)
                    context = self._call("cuDevicePrimaryCtxRetain", index, device)
                    state = self._state[index] = _CUDADevice(device, context)
        return state

    def _enter(self, index: int) -> tuple[_CUDADevice, Any]:
        """Make device ``index``'s primary context current; return its state and the context to
        restore afterwards (None when nothing needs restoring)."""
        state = self._dev(index)
        current = self._call("cuCtxGetCurrent", index)
        current_id = int(current)
        if current_id == state.context_id:
            return state, None
        self._call("cuCtxSetCurrent", index, state.context)
        return state, (current if current_id else None)

    def _leave(self, index: int, previous: Any) -> None:
        if previous is not None:
            self._call("cuCtxSetCurrent", index, previous)

    def context(self, index: int) -> Any:
        """Return device ``index``'s primary context (a ``CUcontext``), retaining it.

        Raises
        ------
        CUDAError
            If the driver cannot retain it.
        """
        return self._dev(index).context

    def _stream(self, state: _CUDADevice, stream: int) -> Any:
        handle = state.streams.get(stream)
        return handle if handle is not None else self.driver.CUstream(stream)

    # ------------------------------------------------------------------ memory
    def malloc(self, index: int, nbytes: int) -> int:
        """``cuMemAlloc``: ``nbytes`` of device memory, 256-byte aligned.

        Raises
        ------
        BackendOutOfMemory
            On ``CUDA_ERROR_OUT_OF_MEMORY`` (the allocator frees cached blocks and retries).
        CUDAError
            On any other driver error.
        """
        state = self._dev(index)
        result = self.driver.cuMemAlloc(nbytes)
        code = int(result[0])
        if code != CUDA_SUCCESS:
            self._oom_or_raise("cuMemAlloc", index, code, nbytes)
        ptr = int(result[1])
        state.allocations.add(ptr)
        return ptr

    def free(self, index: int, ptr: int) -> None:
        """``cuMemFree`` (which waits for the device's queued work, as the Protocol asks).

        Raises
        ------
        ValueError
            If ``ptr`` is not an address ``malloc`` returned.
        CUDAError
            If the driver fails (the memory then counts as freed).
        """
        state = self._dev(index)
        if ptr not in state.allocations:
            raise ValueError(f"cuda:{index}: {ptr:#x} is not an address returned by malloc")
        state.allocations.discard(ptr)
        self._call("cuMemFree", index, self.driver.CUdeviceptr(ptr))

    def mem_get_info(self, index: int) -> tuple[int, int]:
        """``cuMemGetInfo``: ``(free bytes, total bytes)`` of the device, all processes counted.

        Retains the device's primary context (as ``torch.cuda.mem_get_info`` initialises it).
        """
        free, total = self._call("cuMemGetInfo", index)
        return int(free), int(total)

    # ------------------------------------------------------------------ pinned host memory
    def host_memory_pinned(self, index: int) -> bool:
        """True: ``host_alloc`` memory is page-locked by the driver (``cuMemHostAlloc``)."""
        return True

    def host_alloc(self, index: int, nbytes: int) -> int:
        """``cuMemHostAlloc(CU_MEMHOSTALLOC_PORTABLE)``: page-locked host memory.

        Parameters
        ----------
        index : int
            The device whose primary context allocates it; portable memory is pinned for
            every context, so copies with any device run asynchronously.
        nbytes : int
            Bytes, >= 1.

        Returns
        -------
        int
            The host address, valid until ``host_free``.

        Raises
        ------
        BackendOutOfMemory
            On ``CUDA_ERROR_OUT_OF_MEMORY`` (the host cannot lock that much memory).
        CUDAError
            On any other driver error.

        Notes
        -----
        Mirrors ``cudaHostAlloc`` in PyTorch's ``CachingHostAllocator``.
        """
        drv = self.driver
        result = drv.cuMemHostAlloc(nbytes, int(drv.CU_MEMHOSTALLOC_PORTABLE))
        code = int(result[0])
        if code != CUDA_SUCCESS:
            self._oom_or_raise("cuMemHostAlloc", index, code, nbytes)
        ptr = int(result[1])
        with self._lock:
            self._host.add(ptr)
        return ptr

    def host_free(self, index: int, ptr: int) -> None:
        """``cuMemFreeHost`` of memory from :meth:`host_alloc`.

        Raises
        ------
        ValueError
            If ``ptr`` is not an address ``host_alloc`` returned.
        CUDAError
            If the driver fails.
        """
        with self._lock:
            if ptr not in self._host:
                raise ValueError(f"cuda:{index}: {ptr:#x} is not an address returned by host_alloc")
            self._host.discard(ptr)
        self._call("cuMemFreeHost", index, ptr)

    # ------------------------------------------------------------------ virtual memory
    def _allocation_prop(self, index: int) -> Any:
        drv = self.driver
        prop = drv.CUmemAllocationProp()
        prop.type = drv.CUmemAllocationType.CU_MEM_ALLOCATION_TYPE_PINNED
        prop.location.type = drv.CUmemLocationType.CU_MEM_LOCATION_TYPE_DEVICE
        prop.location.id = self._devices()[index]
        return prop

    def vm_granularity(self, index: int) -> int:
        """The device's minimum allocation granularity in bytes (2 MiB on current GPUs).

        ``cuMemGetAllocationGranularity(CU_MEM_ALLOC_GRANULARITY_MINIMUM)`` for pinned device
        memory; ``vm_map`` maps and ``vm_unmap`` unmaps whole pages of this size.
        """
        granularity = self._granularity.get(index)
        if granularity is None:
            option = self.driver.CUmemAllocationGranularity_flags.CU_MEM_ALLOC_GRANULARITY_MINIMUM
            granularity = int(
                self._call(
                    "cuMemGetAllocationGranularity", index, self._allocation_prop(index), option
                )
            )
            self._granularity[index] = granularity
        return granularity

    def _check_pages(self, index: int, what: str, nbytes: int) -> int:
        granularity = self.vm_granularity(index)
        if nbytes <= 0 or nbytes % granularity:
            raise ValueError(
                f"cuda:{index}: {what} {nbytes} bytes: not a positive multiple of the device's "
                f"{granularity}-byte allocation granularity"
            )
        return granularity

    def vm_reserve(self, index: int, nbytes: int) -> int:
        """``cuMemAddressReserve``: ``nbytes`` of address space, no memory behind it.

        Raises
        ------
        ValueError
            If ``nbytes`` is not a positive multiple of ``vm_granularity``.
        BackendOutOfMemory
            If the driver has no address space left (``CUDA_ERROR_OUT_OF_MEMORY``).
        CUDAError
            On any other driver error.
        """
        granularity = self._check_pages(index, "reserve", nbytes)
        state = self._dev(index)
        result = self.driver.cuMemAddressReserve(nbytes, granularity, self.driver.CUdeviceptr(0), 0)
        code = int(result[0])
        if code != CUDA_SUCCESS:
            self._oom_or_raise("cuMemAddressReserve", index, code, nbytes)
        address = int(result[1])
        with self._lock:
            state.reservations[address] = _Reservation(nbytes)
        return address

    def vm_release(self, index: int, address: int) -> None:
        """``cuMemAddressFree`` of a range from ``vm_reserve``.

        Raises
        ------
        ValueError
            If ``address`` is not a reserved range or a page of it is still mapped.
        CUDAError
            If the driver fails.
        """
        state = self._dev(index)
        with self._lock:
            reservation = state.reservations.get(address)
            if reservation is None or reservation.handles:
                raise ValueError(
                    f"cuda:{index}: {address:#x} is not a reserved range with every page unmapped"
                )
            del state.reservations[address]
        self._call("cuMemAddressFree", index, self.driver.CUdeviceptr(address), reservation.size)

    def _pages(self, index: int, address: int, nbytes: int) -> tuple[_Reservation, list[int]]:
        """The reservation holding ``[address, address + nbytes)`` and the page addresses."""
        granularity = self._check_pages(index, "map or unmap", nbytes)
        state = self._dev(index)
        for base, reservation in state.reservations.items():
            if base <= address and address + nbytes <= base + reservation.size:
                if (address - base) % granularity:
                    break
                return reservation, list(range(address, address + nbytes, granularity))
        raise ValueError(
            f"cuda:{index}: [{address:#x}, {address + nbytes:#x}) is not a page-aligned range "
            "inside one reserved range"
        )

    def vm_map(self, index: int, address: int, nbytes: int) -> None:
        """Back ``[address, address + nbytes)`` of a reserved range with device memory.

        One ``cuMemCreate`` handle per granularity page, ``cuMemMap`` of each, then one
        ``cuMemSetAccess`` (read-write for the device) over the range: PyTorch's
        ``ExpandableSegment::map``. Either every page is mapped or, on failure, none.

        Raises
        ------
        ValueError
            If the range is not whole pages inside one reserved range, or a page is mapped.
        BackendOutOfMemory
            If ``cuMemCreate`` runs out of device memory (nothing stays mapped or allocated).
        CUDAError
            On any other driver error (nothing stays mapped or allocated).
        """
        drv = self.driver
        granularity = self.vm_granularity(index)
        with self._lock:
            reservation, pages = self._pages(index, address, nbytes)
            if any(page in reservation.handles for page in pages):
                raise ValueError(f"cuda:{index}: a page of [{address:#x}, +{nbytes}) is mapped")
            prop = self._allocation_prop(index)
            created: list[Any] = []
            mapped: list[int] = []
            try:
                for _ in pages:
                    result = drv.cuMemCreate(granularity, prop, 0)
                    code = int(result[0])
                    if code != CUDA_SUCCESS:
                        self._oom_or_raise("cuMemCreate", index, code, nbytes)
                    created.append(result[1])
                for page, handle in zip(pages, created, strict=True):
                    self._call("cuMemMap", index, drv.CUdeviceptr(page), granularity, 0, handle, 0)
                    mapped.append(page)
                access = drv.CUmemAccessDesc()
                access.location.type = drv.CUmemLocationType.CU_MEM_LOCATION_TYPE_DEVICE
                access.location.id = self._devices()[index]
                access.flags = drv.CUmemAccess_flags.CU_MEM_ACCESS_FLAGS_PROT_READWRITE
                self._call("cuMemSetAccess", index, drv.CUdeviceptr(address), nbytes, [access], 1)
            except BaseException:
                for page in mapped:  # undo, ignoring secondary failures
                    drv.cuMemUnmap(drv.CUdeviceptr(page), granularity)
                for handle in created:
                    drv.cuMemRelease(handle)
                raise
            reservation.handles.update(zip(pages, created, strict=True))

    def vm_unmap(self, index: int, address: int, nbytes: int) -> None:
        """Return the memory behind ``[address, address + nbytes)``; the range stays reserved.

        Waits for the device (``cuCtxSynchronize``: queued work may still use the pages, as
        PyTorch synchronises the segment's stream), then ``cuMemUnmap`` and ``cuMemRelease``
        each page.

        Raises
        ------
        ValueError
            If the range is not whole pages inside one reserved range, or a page is not mapped.
        CUDAError
            If the driver fails.
        """
        drv = self.driver
        granularity = self.vm_granularity(index)
        with self._lock:
            reservation, pages = self._pages(index, address, nbytes)
            if not all(page in reservation.handles for page in pages):
                raise ValueError(f"cuda:{index}: a page of [{address:#x}, +{nbytes}) is not mapped")
        self._call("cuCtxSynchronize", index)  # outside the lock: other threads copy meanwhile
        with self._lock:
            for page in pages:
                handle = reservation.handles.pop(page)
                self._call("cuMemUnmap", index, drv.CUdeviceptr(page), granularity)
                self._call("cuMemRelease", index, handle)

    # ------------------------------------------------------------------ streams
    def stream_create(self, index: int, priority: int) -> int:
        """``cuStreamCreateWithPriority(CU_STREAM_NON_BLOCKING, priority)``.

        Returns the native ``CUstream`` as an int. Lower priorities are more urgent; the driver
        clamps them to ``cuCtxGetStreamPriorityRange``.

        Raises ``CUDAError`` if the driver fails.
        """
        state = self._dev(index)
        flags = int(self.driver.CUstream_flags.CU_STREAM_NON_BLOCKING)
        handle = self._call("cuStreamCreateWithPriority", index, flags, priority)
        stream = int(handle)
        state.streams[stream] = handle
        return stream

    def stream_priority_range(self, index: int) -> tuple[int, int]:
        """``cuCtxGetStreamPriorityRange``: ``(least, greatest)``, e.g. ``(0, -5)``."""
        least, greatest = self._call("cuCtxGetStreamPriorityRange", index)
        return int(least), int(greatest)

    def stream_destroy(self, index: int, stream: int) -> None:
        """``cuStreamDestroy`` of a stream from ``stream_create``; other handles are left alone.

        The driver releases the stream once its queued work has completed.
        """
        state = self._dev(index)
        handle = state.streams.pop(stream, None)
        if handle is not None:
            self._call("cuStreamDestroy", index, handle)

    def stream_query(self, index: int, stream: int) -> bool:
        """``cuStreamQuery``: True when all work on the stream has completed."""
        state = self._dev(index)
        code = int(self.driver.cuStreamQuery(self._stream(state, stream))[0])
        if code == CUDA_ERROR_NOT_READY:
            return False
        if code != CUDA_SUCCESS:
            raise self._error("cuStreamQuery", code, index)
        return True

    def stream_synchronize(self, index: int, stream: int) -> None:
        """``cuStreamSynchronize``: block until the stream's work has completed."""
        state = self._dev(index)
        self._call("cuStreamSynchronize", index, self._stream(state, stream))
        self._prune_keepalive(index, state)

    def stream_wait_event(self, index: int, stream: int, event: Any) -> None:
        """``cuStreamWaitEvent``: later work on ``stream`` waits for ``event`` (no host wait)."""
        state = self._dev(index)
        self._call("cuStreamWaitEvent", index, self._stream(state, stream), event.handle, 0)

    # ------------------------------------------------------------------ events
    def event_create(self, index: int, timing: bool) -> CUDAEvent:
        """``cuEventCreate``, with ``CU_EVENT_DISABLE_TIMING`` unless ``timing``."""
        flags = self.driver.CUevent_flags
        flag = flags.CU_EVENT_DEFAULT if timing else flags.CU_EVENT_DISABLE_TIMING
        return CUDAEvent(index, self._call("cuEventCreate", index, int(flag)), timing)

    def event_record(self, event: Any, index: int, stream: int) -> None:
        """``cuEventRecord`` on ``stream``."""
        state, previous = self._enter(index)
        try:
            self._call("cuEventRecord", index, event.handle, self._stream(state, stream))
        finally:
            self._leave(index, previous)

    def event_destroy(self, event: Any) -> None:
        """``cuEventDestroy``; the driver releases it once its recorded work completes."""
        self._call("cuEventDestroy", event.device, event.handle)

    def event_query(self, event: Any) -> bool:
        """``cuEventQuery``: True when the recorded work has completed (True if unrecorded)."""
        code = int(self.driver.cuEventQuery(event.handle)[0])
        if code == CUDA_ERROR_NOT_READY:
            return False
        if code != CUDA_SUCCESS:
            raise self._error("cuEventQuery", code, event.device)
        return True

    def event_synchronize(self, event: Any) -> None:
        """``cuEventSynchronize``: block until the recorded work has completed."""
        self._call("cuEventSynchronize", event.device, event.handle)

    def event_elapsed_ms(self, start: Any, end: Any) -> float:
        """``cuEventElapsedTime``: milliseconds from ``start`` to ``end`` (about 0.5 us steps).

        Raises ``CUDAError`` (``CUDA_ERROR_INVALID_HANDLE``) if either event lacks timing or was
        not recorded, ``CUDA_ERROR_NOT_READY`` if either has not completed.
        """
        return float(self._call("cuEventElapsedTime", start.device, start.handle, end.handle))

    # ------------------------------------------------------------------ copies
    def _keep_alive(self, index: int, state: _CUDADevice, stream: Any, host: Any) -> None:
        """Record an event after a host copy on ``stream`` and keep ``host`` until it completes."""
        with self._lock:
            self._prune_keepalive(index, state)
            if state.idle_events:
                event = state.idle_events.pop()
            else:
                flag = int(self.driver.CUevent_flags.CU_EVENT_DISABLE_TIMING)
                event = self._call("cuEventCreate", index, flag)
            try:
                self._call("cuEventRecord", index, event, stream)
            except BaseException:
                state.idle_events.append(event)
                raise
            state.keepalive.append((event, host))

    def _prune_keepalive(self, index: int, state: _CUDADevice, done: bool = False) -> None:
        """Drop host objects whose copies have completed (all of them when ``done``)."""
        with self._lock:
            while state.keepalive:
                event = state.keepalive[0][0]
                if not done:
                    code = int(self.driver.cuEventQuery(event)[0])
                    if code == CUDA_ERROR_NOT_READY:
                        return
                    if code != CUDA_SUCCESS:
                        raise self._error("cuEventQuery", code, index)
                state.keepalive.popleft()
                if len(state.idle_events) < MAX_IDLE_EVENTS:
                    state.idle_events.append(event)
                else:
                    self._call("cuEventDestroy", index, event)

    def memcpy_async(
        self, index: int, dst: int | memoryview, src: int | memoryview, nbytes: int, stream: int
    ) -> None:
        """Copy ``nbytes`` on ``stream``, asynchronously with respect to the host.

        ``cuMemcpyDtoDAsync`` between device addresses, ``cuMemcpyHtoDAsync`` from a host
        ``memoryview``, ``cuMemcpyDtoHAsync`` into a writable one. The host object is kept
        alive until an event recorded after the copy completes.

        Raises
        ------
        ValueError
            If neither side is a device address, or a host buffer is shorter than ``nbytes``.
        CUDAError
            If the driver fails.

        Notes
        -----
        With pageable host memory the driver stages the copy and returns once the host bytes
        are safe (host to device) or the copy is done (device to host); with page-locked host
        memory the copy is truly asynchronous.
        """
        if nbytes == 0:
            return
        drv = self.driver
        state = self._dev(index)
        handle = self._stream(state, stream)
        if isinstance(dst, int) and isinstance(src, int):
            self._call(
                "cuMemcpyDtoDAsync",
                index,
                drv.CUdeviceptr(dst),
                drv.CUdeviceptr(src),
                nbytes,
                handle,
            )
        elif isinstance(dst, int):
            self._call(
                "cuMemcpyHtoDAsync",
                index,
                drv.CUdeviceptr(dst),
                _host_address(src, nbytes),  # type: ignore[arg-type]
                nbytes,
                handle,
            )
            self._keep_alive(index, state, handle, src)
        elif isinstance(src, int):
            self._call(
                "cuMemcpyDtoHAsync",
                index,
                _host_address(dst, nbytes),
                drv.CUdeviceptr(src),
                nbytes,
                handle,
            )
            self._keep_alive(index, state, handle, dst)
        else:
            raise ValueError(f"cuda:{index}: memcpy_async needs a device address on one side")

    def memset_async(self, index: int, ptr: int, value: int, nbytes: int, stream: int) -> None:
        """``cuMemsetD8Async``: set ``nbytes`` bytes at ``ptr`` to ``value`` on ``stream``."""
        if nbytes == 0:
            return
        state = self._dev(index)
        self._call(
            "cuMemsetD8Async",
            index,
            self.driver.CUdeviceptr(ptr),
            value,
            nbytes,
            self._stream(state, stream),
        )

    # ------------------------------------------------------------------ graph capture
    def graph_capture_begin(self, index: int, stream: int, mode: str) -> None:
        """``cuStreamBeginCapture(stream, CU_STREAM_CAPTURE_MODE_<MODE>)``.

        Raises
        ------
        ValueError
            If ``mode`` is not ``"global"``, ``"thread_local"`` or ``"relaxed"``.
        CUDAError
            If the driver refuses (``CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED`` on the legacy
            default stream, for example).
        """
        if mode not in ("global", "thread_local", "relaxed"):
            raise ValueError(
                f"capture mode must be 'global', 'thread_local' or 'relaxed', got {mode!r}"
            )
        state = self._dev(index)
        value = getattr(self.driver.CUstreamCaptureMode, f"CU_STREAM_CAPTURE_MODE_{mode.upper()}")
        self._call("cuStreamBeginCapture", index, self._stream(state, stream), value)

    def graph_capture_end(self, index: int, stream: int) -> Any:
        """``cuStreamEndCapture``: the captured ``CUgraph``.

        Raises ``CUDAError`` (``CUDA_ERROR_STREAM_CAPTURE_INVALIDATED`` when an illegal call
        broke the capture, for example).
        """
        state = self._dev(index)
        return self._call("cuStreamEndCapture", index, self._stream(state, stream))

    def graph_instantiate(self, index: int, graph: Any) -> Any:
        """``cuGraphInstantiate(graph, 0)``: the ``CUgraphExec``. Raises ``CUDAError``."""
        return self._call("cuGraphInstantiate", index, graph, 0)

    def graph_launch(self, index: int, executable: Any, stream: int) -> None:
        """``cuGraphLaunch`` of a ``CUgraphExec`` on ``stream``. Raises ``CUDAError``."""
        state = self._dev(index)
        self._call("cuGraphLaunch", index, executable, self._stream(state, stream))

    def graph_destroy(self, index: int, graph: Any) -> None:
        """``cuGraphDestroy``. Raises ``CUDAError``."""
        self._call("cuGraphDestroy", index, graph)

    def graph_exec_destroy(self, index: int, executable: Any) -> None:
        """``cuGraphExecDestroy``. Raises ``CUDAError``."""
        self._call("cuGraphExecDestroy", index, executable)

    def graph_debug_dump(self, index: int, graph: Any, path: str) -> None:
        """``cuGraphDebugDotPrint(graph, path, CU_GRAPH_DEBUG_DOT_FLAGS_VERBOSE)``: the graph
        as Graphviz DOT. Raises ``CUDAError``."""
        flags = int(self.driver.CUgraphDebugDot_flags.CU_GRAPH_DEBUG_DOT_FLAGS_VERBOSE)
        self._call("cuGraphDebugDotPrint", index, graph, os.fsencode(path), flags)

    def host_view(self, index: int, ptr: int, nbytes: int) -> memoryview | None:
        """None: device memory is not host-accessible (``Buffer.numpy()`` copies instead)."""
        return None

    def synchronize(self, index: int) -> None:
        """``cuCtxSynchronize``: block until all work on the device has completed.

        Returns at once, creating no context, on a device accelrt has not used yet.
        """
        state = self._state.get(index)
        if state is None:
            return
        _, previous = self._enter(index)
        try:
            self._call("cuCtxSynchronize", index)
            self._prune_keepalive(index, state, done=True)
        finally:
            self._leave(index, previous)


def _in_context(method: Callable[..., Any]) -> Callable[..., Any]:
    """Run ``method(self, index, ...)`` with device ``index``'s primary context current."""

    @functools.wraps(method)
    def call(self: CUDABackend, index: int, *args: Any) -> Any:
        _, previous = self._enter(index)
        try:
            return method(self, index, *args)
        finally:
            if previous is not None:
                self._leave(index, previous)

    return call


def _in_event_context(method: Callable[..., Any]) -> Callable[..., Any]:
    """Run ``method(self, event, ...)`` with the event's device's primary context current."""

    @functools.wraps(method)
    def call(self: CUDABackend, event: Any, *args: Any) -> Any:
        _, previous = self._enter(event.device)
        try:
            return method(self, event, *args)
        finally:
            if previous is not None:
                self._leave(event.device, previous)

    return call


for _name in ("event_destroy", "event_query", "event_synchronize", "event_elapsed_ms"):
    setattr(CUDABackend, _name, _in_event_context(getattr(CUDABackend, _name)))
for _name in (
    "malloc", "free", "mem_get_info", "host_alloc", "host_free", "vm_reserve", "vm_release",
    "vm_map", "vm_unmap", "stream_create", "stream_priority_range", "stream_destroy",
    "stream_query", "stream_synchronize", "stream_wait_event", "event_create", "memcpy_async",
    "memset_async", "graph_capture_begin", "graph_capture_end", "graph_instantiate",
    "graph_launch", "graph_destroy", "graph_exec_destroy", "graph_debug_dump",
):  # fmt: skip
    setattr(CUDABackend, _name, _in_context(getattr(CUDABackend, _name)))
del _name
