"""The CUDA backend without a GPU: discovery, error mapping and driver call sequences.

Everything here runs on a machine with no NVIDIA driver. The backend takes its driver layer
as a parameter, so most tests inject :class:`FakeDriver`, a small in-process model of the
``cuda.bindings.driver`` functions the backend uses: it records every call, keeps device memory
in host bytes (so copies round-trip data), models the virtual-memory functions and returns
error codes on demand. What only a real GPU can show is in ``test_cuda_gpu.py`` and
``docs/cuda.md``.
"""

from __future__ import annotations

import ctypes
import json
import pickle
import threading
from collections.abc import Callable, Iterator
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

import accelrt as acc
from accelrt.backends import Backend, BackendOutOfMemory, get_backend
from accelrt.backends.cuda import CUDABackend, CUDAError, CUDAEvent
from accelrt.backends.cuda import _driver as cuda_driver
from accelrt.memory import AllocatorConfig, CachingAllocator
from accelrt.testing import forget_backend, install_backend, reset_runtime

MiB = 1 << 20
GRANULARITY = 2 * MiB

SUCCESS = 0
OUT_OF_MEMORY = 2
INVALID_VALUE = 1
INSUFFICIENT_DRIVER = 35
NO_DEVICE = 100
INVALID_HANDLE = 400
NOT_READY = 600
ILLEGAL_ADDRESS = 700
ERROR_NAMES = {
    SUCCESS: "CUDA_SUCCESS",
    INVALID_VALUE: "CUDA_ERROR_INVALID_VALUE",
    OUT_OF_MEMORY: "CUDA_ERROR_OUT_OF_MEMORY",
    INSUFFICIENT_DRIVER: "CUDA_ERROR_INSUFFICIENT_DRIVER",
    NO_DEVICE: "CUDA_ERROR_NO_DEVICE",
    INVALID_HANDLE: "CUDA_ERROR_INVALID_HANDLE",
    NOT_READY: "CUDA_ERROR_NOT_READY",
    ILLEGAL_ADDRESS: "CUDA_ERROR_ILLEGAL_ADDRESS",
}


class _Names:
    """An enum stand-in whose members are their own names (``X.CU_FOO == "CU_FOO"``)."""

    def __getattr__(self, name: str) -> str:
        return name


class CUstream_flags:
    CU_STREAM_NON_BLOCKING = 1


class CUevent_flags:
    CU_EVENT_DEFAULT = 0
    CU_EVENT_DISABLE_TIMING = 2


class CUmemAllocationGranularity_flags:
    CU_MEM_ALLOC_GRANULARITY_MINIMUM = 0


def _recorded(method: Callable[..., Any]) -> Callable[..., Any]:
    """Record the call, then return the failure queued for it or run the model."""

    def call(self: FakeDriver, *args: Any) -> Any:
        name = method.__name__
        self.calls.append((name, args))
        failures = self.fail.get(name)
        if failures:
            code = failures.pop(0)
            if code is not None:
                return (code,)
        return method(self, *args)

    call.__name__ = method.__name__
    return call


class FakeDriver:
    """A model of the parts of ``cuda.bindings.driver`` the backend uses.

    ``fail[name]`` is a list of codes the next calls of ``name`` return (``None`` lets a call
    through); ``calls`` lists ``(name, args)`` in order.
    """

    CUresult = int
    CUdeviceptr = int
    CUstream = int
    CUstream_flags = CUstream_flags
    CUevent_flags = CUevent_flags
    CUmemAllocationGranularity_flags = CUmemAllocationGranularity_flags
    CUdevice_attribute = _Names()
    CUmemAllocationType = _Names()
    CUmemLocationType = _Names()
    CUmemAccess_flags = _Names()
    CU_MEMHOSTALLOC_PORTABLE = 1

    def __init__(self, devices: int = 1, total: int = 64 * MiB, init: int = SUCCESS) -> None:
        self.calls: list[tuple[str, tuple[Any, ...]]] = []
        self.fail: dict[str, list[int | None]] = {}
        self.devices = devices
        self.total = total
        self.init = init
        self.used = 0
        self.memory: dict[int, bytearray] = {}  # cuMemAlloc address -> bytes
        self.next_address = 0x7F00_0000_0000
        self.next_handle = 0x1000
        self.reserved: dict[int, int] = {}  # base -> size
        self.physical: dict[int, int] = {}  # cuMemCreate handle -> size
        self.mappings: dict[int, int] = {}  # page address -> handle
        self.access: list[tuple[int, int, int, str]] = []
        self.streams: dict[int, tuple[int, int]] = {}  # handle -> (flags, priority)
        self.events: dict[int, int] = {}  # handle -> flags
        self.event_times: dict[int, float] = {}
        self.pending: set[int] = set()  # events cuEventQuery reports as not ready
        self.clock = 0.0
        self.host: dict[int, Any] = {}  # cuMemHostAlloc address -> ctypes buffer
        self.local = threading.local()

    # --- helpers
    def names(self) -> list[str]:
        return [name for name, _ in self.calls]

    def _handle(self) -> int:
        self.next_handle += 1
        return self.next_handle

    def _find(self, ptr: int, nbytes: int) -> memoryview:
        for base, data in self.memory.items():
            if base <= ptr and ptr + nbytes <= base + len(data):
                return memoryview(data)[ptr - base : ptr - base + nbytes]
        raise AssertionError(f"{ptr:#x}+{nbytes} is not device memory")

    # --- errors, init, devices
    def cuGetErrorName(self, code: int) -> tuple[int, bytes | None]:
        name = ERROR_NAMES.get(int(code))
        return (SUCCESS, name.encode()) if name else (INVALID_VALUE, None)

    def cuGetErrorString(self, code: int) -> tuple[int, bytes | None]:
        name = ERROR_NAMES.get(int(code))
        text = name.lower().replace("_", " ") if name else None
        return (SUCCESS, text.encode()) if text else (INVALID_VALUE, None)

    @_recorded
    def cuInit(self, flags: int) -> tuple[int]:
        return (self.init,)

    @_recorded
    def cuDeviceGetCount(self) -> tuple[int, int]:
        return (SUCCESS, self.devices)

    @_recorded
    def cuDeviceGet(self, ordinal: int) -> tuple[int, int]:
        return (SUCCESS, ordinal)

    @_recorded
    def cuDeviceGetName(self, length: int, dev: int) -> tuple[int, bytes]:
        return (SUCCESS, f"Fake GPU {dev}".encode().ljust(length, b"\0"))

    @_recorded
    def cuDeviceTotalMem(self, dev: int) -> tuple[int, int]:
        return (SUCCESS, self.total)

    @_recorded
    def cuDriverGetVersion(self) -> tuple[int, int]:
        return (SUCCESS, 12040)

    @_recorded
    def cuDeviceGetAttribute(self, attribute: str, dev: int) -> tuple[int, int]:
        values = {
            "CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR": 9,
            "CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR": 0,
            "CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT": 132,
            "CU_DEVICE_ATTRIBUTE_WARP_SIZE": 32,
            "CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED": 1,
        }
        return (SUCCESS, values.get(attribute, 7))

    @_recorded
    def cuDeviceGetUuid(self, dev: int) -> tuple[int, Any]:
        return (SUCCESS, SimpleNamespace(bytes=bytes(range(16))))

    # --- contexts
    @_recorded
    def cuDevicePrimaryCtxRetain(self, dev: int) -> tuple[int, int]:
        return (SUCCESS, 0xC000 + dev)

    @_recorded
    def cuCtxGetCurrent(self) -> tuple[int, int]:
        return (SUCCESS, getattr(self.local, "current", 0))

    @_recorded
    def cuCtxSetCurrent(self, ctx: int) -> tuple[int]:
        self.local.current = ctx
        return (SUCCESS,)

    @_recorded
    def cuCtxSynchronize(self) -> tuple[int]:
        self.pending.clear()
        return (SUCCESS,)

    @_recorded
    def cuCtxGetStreamPriorityRange(self) -> tuple[int, int, int]:
        return (SUCCESS, 0, -5)

    # --- memory
    @_recorded
    def cuMemAlloc(self, nbytes: int) -> tuple[int, int] | tuple[int]:
        if self.used + nbytes > self.total:
            return (OUT_OF_MEMORY,)
        address = self.next_address
        self.next_address += -(-nbytes // 512) * 512
        self.memory[address] = bytearray(nbytes)
        self.used += nbytes
        return (SUCCESS, address)

    @_recorded
    def cuMemFree(self, ptr: int) -> tuple[int]:
        self.used -= len(self.memory.pop(ptr))
        return (SUCCESS,)

    @_recorded
    def cuMemGetInfo(self) -> tuple[int, int, int]:
        return (SUCCESS, self.total - self.used, self.total)

    @_recorded
    def cuMemHostAlloc(self, nbytes: int, flags: int) -> tuple[int, int]:
        buffer = (ctypes.c_char * nbytes)()
        address = ctypes.addressof(buffer)
        self.host[address] = buffer
        return (SUCCESS, address)

    @_recorded
    def cuMemFreeHost(self, ptr: int) -> tuple[int]:
        del self.host[ptr]
        return (SUCCESS,)

    # --- virtual memory
    def CUmemAllocationProp(self) -> Any:
        return SimpleNamespace(type=None, location=SimpleNamespace(type=None, id=None))

    def CUmemAccessDesc(self) -> Any:
        return SimpleNamespace(location=SimpleNamespace(type=None, id=None), flags=None)

    @_recorded
    def cuMemGetAllocationGranularity(self, prop: Any, option: int) -> tuple[int, int]:
        assert prop.type == "CU_MEM_ALLOCATION_TYPE_PINNED"
        assert prop.location.type == "CU_MEM_LOCATION_TYPE_DEVICE"
        return (SUCCESS, GRANULARITY)

    @_recorded
    def cuMemAddressReserve(self, size: int, align: int, addr: int, flags: int) -> Any:
        base = 0x10_0000_0000_0000 + len(self.reserved) * (1 << 40)
        self.reserved[base] = size
        return (SUCCESS, base)

    @_recorded
    def cuMemAddressFree(self, ptr: int, size: int) -> tuple[int]:
        assert self.reserved.pop(ptr) == size
        return (SUCCESS,)

    @_recorded
    def cuMemCreate(self, size: int, prop: Any, flags: int) -> tuple[int, int] | tuple[int]:
        assert prop.type == "CU_MEM_ALLOCATION_TYPE_PINNED"
        if self.used + size > self.total:
            return (OUT_OF_MEMORY,)
        handle = self._handle()
        self.physical[handle] = size
        self.used += size
        return (SUCCESS, handle)

    @_recorded
    def cuMemRelease(self, handle: int) -> tuple[int]:
        self.used -= self.physical.pop(handle)
        return (SUCCESS,)

    @_recorded
    def cuMemMap(self, ptr: int, size: int, offset: int, handle: int, flags: int) -> tuple[int]:
        assert ptr not in self.mappings and size == self.physical[handle] and offset == 0
        self.mappings[ptr] = handle
        return (SUCCESS,)

    @_recorded
    def cuMemUnmap(self, ptr: int, size: int) -> tuple[int]:
        del self.mappings[ptr]
        return (SUCCESS,)

    @_recorded
    def cuMemSetAccess(self, ptr: int, size: int, descs: list[Any], count: int) -> tuple[int]:
        [desc] = descs
        self.access.append((ptr, size, desc.location.id, desc.flags))
        return (SUCCESS,)

    # --- streams and events
    @_recorded
    def cuStreamCreateWithPriority(self, flags: int, priority: int) -> tuple[int, int]:
        handle = 0x5000 + len(self.streams) + 1
        self.streams[handle] = (flags, priority)
        return (SUCCESS, handle)

    @_recorded
    def cuStreamDestroy(self, stream: int) -> tuple[int]:
        del self.streams[stream]
        return (SUCCESS,)

    @_recorded
    def cuStreamQuery(self, stream: int) -> tuple[int]:
        return (NOT_READY if self.pending else SUCCESS,)

    @_recorded
    def cuStreamSynchronize(self, stream: int) -> tuple[int]:
        self.pending.clear()
        return (SUCCESS,)

    @_recorded
    def cuStreamWaitEvent(self, stream: int, event: int, flags: int) -> tuple[int]:
        return (SUCCESS,)

    @_recorded
    def cuEventCreate(self, flags: int) -> tuple[int, int]:
        handle = 0xE000 + self._handle()
        self.events[handle] = flags
        return (SUCCESS, handle)

    @_recorded
    def cuEventDestroy(self, event: int) -> tuple[int]:
        del self.events[event]
        return (SUCCESS,)

    @_recorded
    def cuEventRecord(self, event: int, stream: int) -> tuple[int]:
        self.clock += 1.5
        self.event_times[event] = self.clock
        return (SUCCESS,)

    @_recorded
    def cuEventQuery(self, event: int) -> tuple[int]:
        return (NOT_READY if event in self.pending else SUCCESS,)

    @_recorded
    def cuEventSynchronize(self, event: int) -> tuple[int]:
        self.pending.discard(event)
        return (SUCCESS,)

    @_recorded
    def cuEventElapsedTime(self, start: int, end: int) -> tuple[int, float] | tuple[int]:
        if any(self.events[e] & CUevent_flags.CU_EVENT_DISABLE_TIMING for e in (start, end)):
            return (INVALID_HANDLE,)
        return (SUCCESS, self.event_times[end] - self.event_times[start])

    # --- copies
    @_recorded
    def cuMemcpyHtoDAsync(self, dst: int, src: int, nbytes: int, stream: int) -> tuple[int]:
        self._find(dst, nbytes)[:] = ctypes.string_at(src, nbytes)
        return (SUCCESS,)

    @_recorded
    def cuMemcpyDtoHAsync(self, dst: int, src: int, nbytes: int, stream: int) -> tuple[int]:
        ctypes.memmove(dst, bytes(self._find(src, nbytes)), nbytes)
        return (SUCCESS,)

    @_recorded
    def cuMemcpyDtoDAsync(self, dst: int, src: int, nbytes: int, stream: int) -> tuple[int]:
        self._find(dst, nbytes)[:] = bytes(self._find(src, nbytes))
        return (SUCCESS,)

    @_recorded
    def cuMemsetD8Async(self, ptr: int, value: int, nbytes: int, stream: int) -> tuple[int]:
        self._find(ptr, nbytes)[:] = bytes([value]) * nbytes
        return (SUCCESS,)


@pytest.fixture
def fake() -> FakeDriver:
    return FakeDriver()


@pytest.fixture
def backend(fake: FakeDriver) -> CUDABackend:
    return CUDABackend(driver=fake)


@pytest.fixture
def fake_cuda(fake: FakeDriver, backend: CUDABackend) -> Iterator[FakeDriver]:
    """The fake-driver CUDA backend registered as ``cuda`` and made the accelerator."""
    install_backend("cuda", backend)
    acc.backends.use("cuda")
    yield fake
    reset_runtime()
    forget_backend("cuda")


# ---------------------------------------------------------------- the real module, no driver
def _real_cuda_devices() -> int:
    return CUDABackend().device_count()


def test_registered_and_importing_never_fails() -> None:
    assert "cuda" in acc.backends.registered_backends()
    backend = CUDABackend()
    assert isinstance(backend, Backend)
    assert backend.name == "cuda"


@pytest.mark.skipif(_real_cuda_devices() > 0, reason="a CUDA device is present")
def test_no_gpu_means_zero_devices_and_a_reason() -> None:
    backend = CUDABackend()
    assert backend.device_count() == 0
    assert backend.is_available() is False
    assert backend.supports_virtual_memory() is False
    reason = backend.unavailable_reason()
    assert reason is not None
    assert "driver" in reason or "cuda-bindings" in reason


@pytest.mark.skipif(_real_cuda_devices() > 0, reason="a CUDA device is present")
def test_auto_detection_passes_over_cuda_without_a_gpu() -> None:
    forget_backend("cuda")
    assert acc.current_accelerator() != acc.Device("cuda")


@pytest.mark.skipif(_real_cuda_devices() > 0, reason="a CUDA device is present")
def test_info_shows_why_cuda_is_unavailable(capsys: pytest.CaptureFixture[str]) -> None:
    from accelrt.cli import main

    forget_backend("cuda")
    assert main(["info", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert "cuda" not in data["available_backends"]
    assert data["unavailable_backends"]["cuda"] == CUDABackend().unavailable_reason()
    assert main(["info"]) == 0
    assert "cuda: unavailable: " in capsys.readouterr().out


# ---------------------------------------------------------------- discovery with fakes
def test_without_cuda_bindings_the_reason_says_how_to_install(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def missing() -> Any:
        raise ModuleNotFoundError("No module named 'cuda'")

    monkeypatch.setattr(cuda_driver, "_load_driver", missing)
    backend = CUDABackend()
    assert backend.device_count() == 0
    assert "pip install 'accelrt[cuda]'" in (backend.unavailable_reason() or "")
    with pytest.raises(ImportError, match=r"accelrt\[cuda\]"):
        _ = backend.driver


def test_a_broken_cuda_bindings_means_zero_devices(monkeypatch: pytest.MonkeyPatch) -> None:
    def broken() -> Any:
        raise OSError("undefined symbol: cuGetProcAddress_v2")

    monkeypatch.setattr(cuda_driver, "_load_driver", broken)
    backend = CUDABackend()
    assert backend.device_count() == 0
    assert "could not be imported: undefined symbol" in (backend.unavailable_reason() or "")


def test_a_driver_that_cannot_be_loaded_means_zero_devices(fake: FakeDriver) -> None:
    def no_library(flags: int) -> Any:
        raise RuntimeError('"cuda" is an NVIDIA driver library and can only be found ...')

    fake.cuInit = no_library  # type: ignore[method-assign]
    backend = CUDABackend(driver=fake)
    assert backend.device_count() == 0
    assert (backend.unavailable_reason() or "").startswith("no NVIDIA driver could be loaded")


@pytest.mark.parametrize(
    ("init", "devices", "expected"),
    [
        (NO_DEVICE, 1, "CUDA_ERROR_NO_DEVICE"),
        (INSUFFICIENT_DRIVER, 1, "cuda-bindings<13"),
        (ILLEGAL_ADDRESS, 1, "cuInit failed: CUDA_ERROR_ILLEGAL_ADDRESS"),
        (SUCCESS, 0, "reports no CUDA device"),
    ],
)
def test_driver_without_devices_gives_a_reason(init: int, devices: int, expected: str) -> None:
    backend = CUDABackend(driver=FakeDriver(devices=devices, init=init))
    assert backend.device_count() == 0
    assert not backend.is_available()
    assert expected in (backend.unavailable_reason() or "")


def test_visible_devices_apply_on_top_of_the_driver(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ACCELRT_VISIBLE_DEVICES", "2,0")
    fake = FakeDriver(devices=3)
    backend = CUDABackend(driver=fake)
    assert backend.device_count() == 2
    assert backend.unavailable_reason() is None
    assert backend.physical_index(0) == 2
    assert backend.get_device_properties(0).name == "Fake GPU 2"
    monkeypatch.setenv("ACCELRT_VISIBLE_DEVICES", "")
    hidden = CUDABackend(driver=FakeDriver(devices=3))
    assert hidden.device_count() == 0
    assert "hides all 3" in (hidden.unavailable_reason() or "")


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (None, 4),
        ("", 0),
        ("2,0", 2),
        (" 1 , 3", 2),
        ("1abc,2", 2),  # a leading integer counts, as the driver reads it
        ("0,7,1", 1),  # the count stops at the first GPU beyond the four
        ("0,-1,1", 1),  # and at the first entry that is not a non-negative integer
        ("1,x,2", 1),
        ("0,2,0", 0),  # a repeat hides every device
        ("GPU-8e1b,0", None),  # UUIDs: only the driver can resolve them
        ("MIG-0f3a", None),
    ],
)
def test_nvml_count_reads_cuda_visible_devices(value: str | None, expected: int | None) -> None:
    from accelrt.backends.cuda._nvml import _visible_count

    assert _visible_count(value, 4) == expected


class FakeNVML:
    """``libnvidia-ml``'s three calls the count uses, answering ``count`` GPUs."""

    def __init__(self, count: int, init: int = 0, cuda_version: int = 13000) -> None:
        self.count, self.init, self.shutdowns = count, init, 0
        self.cuda_version = cuda_version  # the CUDA version the driver supports: 13000 = 13.0

    def nvmlInit_v2(self) -> int:
        return self.init

    def nvmlDeviceGetCount_v2(self, out: Any) -> int:
        out._obj.value = self.count
        return 0

    def nvmlSystemGetCudaDriverVersion_v2(self, out: Any) -> int:
        out._obj.value = self.cuda_version
        return 0

    def nvmlShutdown(self) -> int:
        self.shutdowns += 1
        return 0


def test_nvml_device_count(monkeypatch: pytest.MonkeyPatch) -> None:
    from accelrt.backends.cuda import _nvml

    monkeypatch.setattr(_nvml.ctypes, "CDLL", lambda name: FakeNVML(3))
    monkeypatch.setattr(_nvml, "_bindings_major", lambda: 13)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    assert _nvml.nvml_device_count() == 3
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2,1")
    assert _nvml.nvml_device_count() == 2
    # a CUDA 12.4 driver under cuda-bindings 13: cuInit would fail; the driver says why
    monkeypatch.setattr(_nvml.ctypes, "CDLL", lambda name: FakeNVML(3, cuda_version=12040))
    assert _nvml.nvml_device_count() is None
    monkeypatch.setattr(_nvml, "_bindings_major", lambda: 12)
    assert _nvml.nvml_device_count() == 2
    failing = FakeNVML(3, init=9)  # NVML_ERROR_DRIVER_NOT_LOADED
    monkeypatch.setattr(_nvml.ctypes, "CDLL", lambda name: failing)
    assert _nvml.nvml_device_count() is None

    def missing(name: str) -> Any:
        raise OSError(f"{name}: cannot open shared object file")

    monkeypatch.setattr(_nvml.ctypes, "CDLL", missing)
    assert _nvml.nvml_device_count() is None


def test_counting_through_nvml_leaves_cuda_uninitialised(fake: FakeDriver) -> None:
    # cuInit in a parent makes every driver call of a forked child fail; counting must not
    backend = CUDABackend(driver=fake, nvml=lambda: 1)
    assert backend.device_count() == 1 and backend.is_available()
    assert backend.unavailable_reason() is None
    assert fake.names() == []
    assert backend.get_device_properties(0).name == "Fake GPU 0"  # first use: cuInit first
    assert fake.names()[:2] == ["cuInit", "cuDeviceGet"]
    assert fake.names().count("cuInit") == 1


def test_a_failing_cuinit_after_an_nvml_count_is_a_clear_error() -> None:
    fake = FakeDriver(init=INSUFFICIENT_DRIVER)
    backend = CUDABackend(driver=fake, nvml=lambda: 1)
    assert backend.device_count() == 1
    with pytest.raises(CUDAError, match=r"^CUDA cuInit failed on cuda:0: CUDA_ERROR_INSUFF"):
        backend.get_device_properties(0)
    assert fake.names() == ["cuInit"]


@pytest.mark.parametrize("answer", [None, 0])
def test_without_an_nvml_count_the_driver_counts(fake: FakeDriver, answer: int | None) -> None:
    backend = CUDABackend(driver=fake, nvml=lambda: answer)
    assert backend.device_count() == 1
    assert fake.names() == ["cuInit", "cuDeviceGetCount"]
    backend.get_device_properties(0)
    assert fake.names().count("cuInit") == 1


def test_discovery_and_properties_create_no_context(fake: FakeDriver, backend: CUDABackend) -> None:
    assert backend.is_available() and backend.device_count() == 1
    props = backend.get_device_properties(0)
    assert backend.supports_virtual_memory()
    assert not any(name.startswith(("cuCtx", "cuDevicePrimaryCtx")) for name in fake.names())
    assert (props.name, props.vendor, props.backend, props.index) == (
        "Fake GPU 0",
        "NVIDIA",
        "cuda",
        0,
    )
    assert props.total_memory == props.max_allocation_bytes == 64 * MiB
    assert props.multi_processor_count == 132
    assert props.driver_version == "12.4"
    assert props.host_accessible is False
    assert props.pinned_host_memory is True
    assert props.raw["compute_capability"] == "9.0"
    assert (props.raw["major"], props.raw["minor"], props.raw["warp_size"]) == (9, 0, 32)
    assert props.raw["uuid"] == "00010203-0405-0607-0809-0a0b0c0d0e0f"
    assert len(backend.supported_dtypes(0)) == 14


def test_auto_detection_selects_cuda_first(backend: CUDABackend) -> None:
    install_backend("cuda", backend)
    try:
        assert acc.current_accelerator() == acc.Device("cuda")
        assert acc.device_count() == 1
    finally:
        reset_runtime()
        forget_backend("cuda")


# ---------------------------------------------------------------- errors
def test_driver_errors_become_accelerator_errors_with_the_driver_name(
    fake: FakeDriver, backend: CUDABackend
) -> None:
    fake.fail["cuStreamSynchronize"] = [ILLEGAL_ADDRESS]
    with pytest.raises(CUDAError) as info:
        backend.stream_synchronize(0, 0)
    exc = info.value
    assert isinstance(exc, acc.AcceleratorError)
    assert (exc.function, exc.result, exc.error_name) == (
        "cuStreamSynchronize",
        ILLEGAL_ADDRESS,
        "CUDA_ERROR_ILLEGAL_ADDRESS",
    )
    assert str(exc) == (
        "CUDA cuStreamSynchronize failed on cuda:0: CUDA_ERROR_ILLEGAL_ADDRESS "
        "(cuda error illegal address)"
    )
    again = pickle.loads(pickle.dumps(exc))
    assert (type(again), str(again), again.error_name) == (CUDAError, str(exc), exc.error_name)


def test_an_unknown_code_is_named_by_number(fake: FakeDriver, backend: CUDABackend) -> None:
    fake.fail["cuStreamWaitEvent"] = [12345]
    event = backend.event_create(0, False)
    with pytest.raises(CUDAError, match=r"cuStreamWaitEvent failed on cuda:0: CUresult 12345$"):
        backend.stream_wait_event(0, 0, event)


def test_out_of_memory_from_malloc_is_backend_out_of_memory(
    fake: FakeDriver, backend: CUDABackend
) -> None:
    with pytest.raises(BackendOutOfMemory, match="CUDA_ERROR_OUT_OF_MEMORY"):
        backend.malloc(0, 65 * MiB)
    fake.fail["cuMemAlloc"] = [ILLEGAL_ADDRESS]
    with pytest.raises(CUDAError, match="CUDA_ERROR_ILLEGAL_ADDRESS"):
        backend.malloc(0, MiB)


def test_out_of_memory_through_the_allocator_is_out_of_memory_error(fake_cuda: FakeDriver) -> None:
    keep = acc.empty(40 * MiB)
    with pytest.raises(acc.OutOfMemoryError) as info:
        acc.empty(40 * MiB)
    assert info.value.device == "cuda:0"
    assert info.value.total_bytes == 64 * MiB
    # the allocator released its cache and retried before giving up
    assert fake_cuda.names().count("cuMemAlloc") >= 2
    del keep


def test_not_ready_is_an_answer_not_an_error(fake: FakeDriver, backend: CUDABackend) -> None:
    event = backend.event_create(0, False)
    backend.event_record(event, 0, 0)
    fake.pending.add(int(event.handle))
    assert backend.event_query(event) is False
    assert backend.stream_query(0, 0) is False
    backend.event_synchronize(event)
    assert backend.event_query(event) is True
    assert backend.stream_query(0, 0) is True
    fake.fail["cuEventQuery"] = [ILLEGAL_ADDRESS]
    with pytest.raises(CUDAError, match="cuEventQuery failed on cuda:0"):
        backend.event_query(event)


# ---------------------------------------------------------------- contexts
def test_primary_context_is_retained_once_and_made_current(
    fake: FakeDriver, backend: CUDABackend
) -> None:
    backend.malloc(0, MiB)
    backend.mem_get_info(0)
    assert fake.names().count("cuDevicePrimaryCtxRetain") == 1
    assert fake.names().count("cuCtxSetCurrent") == 1  # this thread keeps it afterwards
    assert fake.local.current == 0xC000
    assert backend.context(0) == 0xC000


def test_another_current_context_is_restored(fake: FakeDriver, backend: CUDABackend) -> None:
    fake.local.current = 0xBEEF  # e.g. a context another library made current
    backend.malloc(0, MiB)
    sets = [args[0] for name, args in fake.calls if name == "cuCtxSetCurrent"]
    assert sets == [0xC000, 0xBEEF]
    assert fake.local.current == 0xBEEF


def test_stream_and_event_calls_on_created_streams_leave_the_context_alone(
    fake: FakeDriver, backend: CUDABackend
) -> None:
    stream = backend.stream_create(0, 0)
    event = backend.event_create(0, timing=False)
    fake.local.current = 0xBEEF  # another context, or none: the handles carry their own
    del fake.calls[:]
    backend.event_record(event, 0, stream)
    backend.stream_query(0, stream)
    backend.stream_wait_event(0, stream, event)
    backend.event_query(event)
    backend.event_synchronize(event)
    backend.stream_synchronize(0, stream)
    assert not any(name.startswith("cuCtx") for name in fake.names()), fake.names()
    backend.stream_query(0, 0)  # the legacy default stream is the current context's
    assert fake.names()[-4:] == ["cuCtxGetCurrent", "cuCtxSetCurrent", "cuStreamQuery",
                                 "cuCtxSetCurrent"]  # fmt: skip
    assert fake.local.current == 0xBEEF


def test_synchronize_creates_no_context_on_an_unused_device(
    fake: FakeDriver, backend: CUDABackend
) -> None:
    backend.synchronize(0)
    assert "cuDevicePrimaryCtxRetain" not in fake.names()
    backend.malloc(0, MiB)
    backend.synchronize(0)
    assert fake.names()[-1] == "cuCtxSynchronize"


# ---------------------------------------------------------------- memory and streams
def test_malloc_and_free(fake: FakeDriver, backend: CUDABackend) -> None:
    ptr = backend.malloc(0, 3 * MiB)
    assert backend.mem_get_info(0) == (61 * MiB, 64 * MiB)
    with pytest.raises(ValueError, match="not an address returned by malloc"):
        backend.free(0, ptr + 1)
    backend.free(0, ptr)
    assert ("cuMemFree", (ptr,)) in fake.calls
    assert backend.mem_get_info(0) == (64 * MiB, 64 * MiB)


def test_streams_have_priorities_and_native_handles(fake_cuda: FakeDriver) -> None:
    stream = acc.Stream(priority=-2)
    assert stream.handle in fake_cuda.streams
    assert fake_cuda.streams[stream.handle] == (CUstream_flags.CU_STREAM_NON_BLOCKING, -2)
    assert stream.query() is True
    stream.synchronize()
    assert ("cuStreamSynchronize", (stream.handle,)) in fake_cuda.calls
    backend = get_backend("cuda")
    assert isinstance(backend, CUDABackend)
    assert backend.stream_priority_range(0) == (0, -5)
    foreign = acc.Stream.from_handle(0xABC0)  # e.g. torch.cuda.Stream().cuda_stream
    foreign.synchronize()
    assert ("cuStreamSynchronize", (0xABC0,)) in fake_cuda.calls
    backend.stream_destroy(0, 0xABC0)  # not ours: left alone
    backend.stream_destroy(0, stream.handle)
    assert fake_cuda.names().count("cuStreamDestroy") == 1
    assert stream.handle not in fake_cuda.streams


def test_events_time_work(fake_cuda: FakeDriver) -> None:
    stream = acc.Stream()
    start, end = acc.Event(enable_timing=True), acc.Event(enable_timing=True)
    start.record(stream)
    end.record(stream)
    assert start.elapsed_time(end) == pytest.approx(1.5)
    assert fake_cuda.names()[-1] == "cuEventElapsedTime"
    handles = {int(e._handle.handle): e._handle for e in (start, end)}
    assert start.event_id == int(start._handle.handle)  # the CUevent
    assert all(fake_cuda.events[h] == CUevent_flags.CU_EVENT_DEFAULT for h in handles)
    plain = acc.Event()
    plain.record(stream)
    assert fake_cuda.events[int(plain._handle.handle)] == CUevent_flags.CU_EVENT_DISABLE_TIMING
    stream.wait_event(plain)
    assert fake_cuda.calls[-1] == ("cuStreamWaitEvent", (stream.handle, plain._handle.handle, 0))
    backend = get_backend("cuda")
    event = plain._handle
    assert isinstance(event, CUDAEvent) and repr(event).startswith("CUDAEvent(device=0")
    with pytest.raises(CUDAError, match="CUDA_ERROR_INVALID_HANDLE"):
        backend.event_elapsed_ms(start._handle, event)  # a timing-disabled event
    backend.event_destroy(event)
    assert int(event.handle) not in fake_cuda.events


# ---------------------------------------------------------------- copies
def test_copies_in_every_direction_round_trip(fake_cuda: FakeDriver) -> None:
    data = np.arange(1000, dtype=np.float32)
    stream = acc.Stream()
    a = acc.empty(data.nbytes, stream=stream)
    b = acc.empty(data.nbytes, stream=stream)
    acc.copy_(a, data, stream=stream)
    acc.copy_(b, a, stream=stream)
    out = np.zeros_like(data)
    acc.copy_(out, b, stream=stream)
    stream.synchronize()
    np.testing.assert_array_equal(out, data)
    copies = [(name, args) for name, args in fake_cuda.calls if name.startswith("cuMemcpy")]
    assert [name for name, _ in copies] == [
        "cuMemcpyHtoDAsync",
        "cuMemcpyDtoDAsync",
        "cuMemcpyDtoHAsync",
    ]
    (_, h2d), (_, d2d), (_, d2h) = copies
    assert h2d == (a.block.address, data.ctypes.data, data.nbytes, stream.handle)
    assert d2d == (b.block.address, a.block.address, data.nbytes, stream.handle)
    assert d2h == (out.ctypes.data, b.block.address, data.nbytes, stream.handle)


def test_memset(fake: FakeDriver, backend: CUDABackend) -> None:
    ptr = backend.malloc(0, 64)
    backend.memset_async(0, ptr, 0xAB, 64, 0)
    out = bytearray(64)
    backend.memcpy_async(0, memoryview(out), ptr, 64, 0)
    assert out == b"\xab" * 64
    assert backend.host_view(0, ptr, 64) is None
    with pytest.raises(ValueError, match="device address on one side"):
        backend.memcpy_async(0, memoryview(bytearray(4)), memoryview(b"abcd"), 4, 0)


def test_host_memory_is_kept_alive_until_its_copy_completes(
    fake: FakeDriver, backend: CUDABackend
) -> None:
    ptr = backend.malloc(0, 16)
    src = memoryview(bytearray(b"x" * 16))
    backend.memcpy_async(0, ptr, src, 16, 0)
    state = backend._state[0]
    [(event, kept)] = state.keepalive
    assert kept is src
    assert fake.calls[-1] == ("cuEventRecord", (event, 0))
    assert fake.events[event] == CUevent_flags.CU_EVENT_DISABLE_TIMING
    fake.pending.add(event)  # the copy has not completed: the next copy keeps both
    backend.memcpy_async(0, ptr, memoryview(bytearray(16)), 16, 0)
    assert len(state.keepalive) == 2
    fake.pending.clear()
    backend.stream_synchronize(0, 0)
    assert not state.keepalive
    assert len(state.idle_events) == 2  # events are reused, not created per copy
    backend.memcpy_async(0, ptr, src, 16, 0)
    assert fake.names().count("cuEventCreate") == 2
    backend.synchronize(0)
    assert not state.keepalive


def test_pinned_host_memory(fake: FakeDriver, backend: CUDABackend) -> None:
    assert backend.host_memory_pinned(0) is True
    ptr = backend.host_alloc(0, 4096)
    assert fake.calls[-1] == ("cuMemHostAlloc", (4096, FakeDriver.CU_MEMHOSTALLOC_PORTABLE))
    with pytest.raises(ValueError, match="not an address returned by host_alloc"):
        backend.host_free(0, ptr + 1)
    backend.host_free(0, ptr)
    assert fake.calls[-1] == ("cuMemFreeHost", (ptr,))
    fake.fail["cuMemHostAlloc"] = [OUT_OF_MEMORY]
    with pytest.raises(BackendOutOfMemory, match="cuMemHostAlloc"):
        backend.host_alloc(0, 4096)


# ---------------------------------------------------------------- virtual memory
def _vmm_calls(fake: FakeDriver) -> list[tuple[str, tuple[Any, ...]]]:
    return [
        (name, args)
        for name, args in fake.calls
        if name.startswith(("cuMemAddress", "cuMemCreate", "cuMemMap", "cuMemSetAccess"))
        or name in ("cuMemUnmap", "cuMemRelease", "cuCtxSynchronize")
    ]


def test_vm_map_and_unmap_call_sequence(fake: FakeDriver, backend: CUDABackend) -> None:
    assert backend.vm_granularity(0) == GRANULARITY
    base = backend.vm_reserve(0, 8 * GRANULARITY)
    backend.vm_map(0, base + GRANULARITY, 3 * GRANULARITY)
    handles = [fake.mappings[base + i * GRANULARITY] for i in (1, 2, 3)]
    pages = [base + i * GRANULARITY for i in (1, 2, 3)]
    calls = _vmm_calls(fake)
    assert [name for name, _ in calls] == [
        "cuMemAddressReserve",
        *["cuMemCreate"] * 3,
        *["cuMemMap"] * 3,
        "cuMemSetAccess",
    ]
    assert calls[0][1] == (8 * GRANULARITY, GRANULARITY, 0, 0)
    for _, (size, prop, flags) in calls[1:4]:
        assert (size, prop.location.id, flags) == (GRANULARITY, 0, 0)
    assert [args for _, args in calls[4:7]] == [
        (page, GRANULARITY, 0, handle, 0) for page, handle in zip(pages, handles, strict=True)
    ]
    ptr, size, _, count = calls[7][1]
    assert (ptr, size, count) == (base + GRANULARITY, 3 * GRANULARITY, 1)
    assert fake.access == [
        (base + GRANULARITY, 3 * GRANULARITY, 0, "CU_MEM_ACCESS_FLAGS_PROT_READWRITE")
    ]
    assert fake.used == 3 * GRANULARITY
    fake.calls.clear()
    backend.vm_unmap(0, base + 2 * GRANULARITY, GRANULARITY)  # the middle page only
    assert _vmm_calls(fake) == [
        ("cuCtxSynchronize", ()),
        ("cuMemUnmap", (base + 2 * GRANULARITY, GRANULARITY)),
        ("cuMemRelease", (handles[1],)),
    ]
    with pytest.raises(ValueError, match="mapped"):
        backend.vm_release(0, base)
    backend.vm_unmap(0, base + GRANULARITY, GRANULARITY)
    backend.vm_unmap(0, base + 3 * GRANULARITY, GRANULARITY)
    backend.vm_release(0, base)
    assert fake.calls[-1] == ("cuMemAddressFree", (base, 8 * GRANULARITY))
    assert fake.used == 0 and not fake.mappings and not fake.physical and not fake.reserved


def _indices(fake: FakeDriver, name: str) -> list[int]:
    return [i for i, (n, _) in enumerate(fake.calls) if n == name]


def test_vm_arguments_are_checked(backend: CUDABackend) -> None:
    with pytest.raises(ValueError, match="granularity"):
        backend.vm_reserve(0, GRANULARITY + 1)
    base = backend.vm_reserve(0, 4 * GRANULARITY)
    with pytest.raises(ValueError, match="inside one reserved range"):
        backend.vm_map(0, base + 3 * GRANULARITY, 2 * GRANULARITY)
    with pytest.raises(ValueError, match="inside one reserved range"):
        backend.vm_map(0, base + 4096, GRANULARITY)
    backend.vm_map(0, base, GRANULARITY)
    with pytest.raises(ValueError, match="is mapped"):
        backend.vm_map(0, base, 2 * GRANULARITY)
    with pytest.raises(ValueError, match="is not mapped"):
        backend.vm_unmap(0, base, 2 * GRANULARITY)
    with pytest.raises(ValueError, match="not a reserved range"):
        backend.vm_release(0, base + GRANULARITY)


def test_vm_map_out_of_memory_maps_nothing(fake: FakeDriver, backend: CUDABackend) -> None:
    base = backend.vm_reserve(0, 4 * GRANULARITY)
    fake.fail["cuMemCreate"] = [None, OUT_OF_MEMORY]
    with pytest.raises(BackendOutOfMemory, match="CUDA_ERROR_OUT_OF_MEMORY"):
        backend.vm_map(0, base, 3 * GRANULARITY)
    assert fake.names()[-2:] == ["cuMemCreate", "cuMemRelease"]
    assert fake.used == 0 and not fake.physical and not fake.mappings
    backend.vm_map(0, base, 3 * GRANULARITY)  # nothing was left behind: the pages are free
    assert len(fake.mappings) == 3


def test_vm_map_driver_failure_undoes_the_mapping(fake: FakeDriver, backend: CUDABackend) -> None:
    base = backend.vm_reserve(0, 4 * GRANULARITY)
    fake.fail["cuMemSetAccess"] = [INVALID_VALUE]
    with pytest.raises(CUDAError, match="cuMemSetAccess failed on cuda:0: CUDA_ERROR_INVALID"):
        backend.vm_map(0, base, 2 * GRANULARITY)
    assert fake.names()[-4:] == ["cuMemUnmap", "cuMemUnmap", "cuMemRelease", "cuMemRelease"]
    assert fake.used == 0 and not fake.physical and not fake.mappings
    fake.fail["cuMemAddressReserve"] = [OUT_OF_MEMORY]
    with pytest.raises(BackendOutOfMemory, match="cuMemAddressReserve"):
        backend.vm_reserve(0, GRANULARITY)


def test_expandable_segments_grow_and_shrink_through_the_driver(
    fake: FakeDriver, backend: CUDABackend
) -> None:
    fake.total = 1 << 30
    alloc = CachingAllocator(backend, 0, AllocatorConfig.parse("expandable_segments:True"))
    a = alloc.malloc(30 * MiB, 0)  # large pool: 20 MiB pages, two mapped
    b = alloc.malloc(30 * MiB, 0)  # one more page
    assert b.address == a.address + 30 * MiB
    [reserve] = [args for name, args in fake.calls if name == "cuMemAddressReserve"]
    assert reserve[0] == 1160 * MiB  # 1.125 x the device's memory in 20 MiB pages
    assert fake.names().count("cuMemCreate") == 3 * 10  # 60 MiB in 2 MiB handles
    assert fake.names().count("cuMemSetAccess") == 2  # one per growth
    assert fake.used == 60 * MiB
    assert "cuMemAlloc" not in fake.names()
    alloc.free(a)
    alloc.free(b)
    alloc.empty_cache()
    assert fake.used == 0 and not fake.mappings and not fake.physical
    assert fake.names().count("cuMemUnmap") == 30
    assert fake.names()[-1] == "cuMemAddressFree"
    assert not fake.reserved


def test_policy_accelrt_moves_pages_and_orders_streams_through_the_driver(
    fake: FakeDriver, backend: CUDABackend
) -> None:
    """policy:accelrt on CUDA's driver: an adoption is one event recorded on the owner and
    waited on by the new stream; a move unmaps the idle pages (after synchronizing their
    owner) and maps as many new ones, so the device holds 160 MiB, not 220 MiB."""
    fake.total = 1 << 30
    alloc = CachingAllocator(backend, 0, AllocatorConfig.parse("policy:accelrt"))
    side = backend.stream_create(0, 0)
    a = alloc.malloc(60 * MiB, 0)
    alloc.malloc(60 * MiB, 0)
    alloc.free(a)
    before = len(fake.calls)
    alloc.malloc(100 * MiB, 0)
    names = fake.names()[before:]
    assert names.count("cuMemUnmap") == 30 and names.count("cuMemCreate") == 50
    assert names.index("cuStreamSynchronize") < names.index("cuMemUnmap")
    assert fake.used == 160 * MiB
    c = alloc.malloc(10 * MiB, side)  # nothing free on the side stream or stream 0: maps
    alloc.free(c)
    before = len(fake.calls)
    d = alloc.malloc(10 * MiB, 0)  # adopts the side stream's free block
    assert d.address == c.address
    names = fake.names()[before:]
    assert "cuEventRecord" in names and "cuStreamWaitEvent" in names
    assert "cuMemCreate" not in names
