"""The CUDA backend on a real NVIDIA GPU; every test is skipped where there is none.

These are the checks ``test_cuda_nogpu.py`` cannot make with its fake driver: that the real
``cuda-bindings`` accepts the arguments the backend passes, that data really moves, that the
virtual-memory mapping is usable memory, and which error names the real driver reports.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest

import accelrt as acc
from accelrt.backends import BackendOutOfMemory, get_backend
from accelrt.backends.cuda import CUDABackend, CUDAError
from accelrt.memory import AllocatorConfig, CachingAllocator
from accelrt.testing import forget_backend, reset_runtime

pytestmark = pytest.mark.requires_gpu

MiB = 1 << 20


def _skip_without_gpu() -> CUDABackend:
    backend = CUDABackend()
    if backend.device_count() == 0:
        pytest.skip("no CUDA device (`accelrt info` says why)")
    return backend


@pytest.fixture
def gpu() -> Iterator[CUDABackend]:
    """The real CUDA backend made the accelerator; skipped without a CUDA device."""
    _skip_without_gpu()
    forget_backend("cuda")
    acc.backends.use("cuda")
    backend = get_backend("cuda")
    assert isinstance(backend, CUDABackend)
    yield backend
    backend.synchronize(0)
    reset_runtime()


def test_auto_detection_picks_cuda() -> None:
    _skip_without_gpu()
    forget_backend("cuda")
    assert acc.current_accelerator() == acc.Device("cuda")


def test_properties_are_real(gpu: CUDABackend) -> None:
    props = acc.get_device_properties(0)
    free, total = gpu.mem_get_info(0)
    assert props.backend == "cuda" and props.vendor == "NVIDIA" and props.name
    assert props.total_memory == total >= free > 0
    assert props.multi_processor_count > 0
    assert props.raw["major"] >= 3
    assert gpu.supports_virtual_memory()
    assert gpu.vm_granularity(0) in (2 * MiB, 4 * MiB, 64 * 1024)


def test_copies_round_trip(gpu: CUDABackend) -> None:
    data = np.random.default_rng(0).integers(0, 255, 3 * MiB + 7, dtype=np.uint8)
    stream = acc.Stream(priority=gpu.stream_priority_range(0)[1])
    a = acc.empty(data.nbytes, stream=stream)
    b = acc.empty(data.nbytes, stream=stream)
    acc.copy_(a, data, stream=stream)
    acc.copy_(b, a, stream=stream)
    out = np.zeros_like(data)
    acc.copy_(out, b, stream=stream)
    stream.synchronize()
    np.testing.assert_array_equal(out, data)
    gpu.memset_async(0, b.block.address, 7, b.nbytes, stream.handle)
    acc.copy_(out, b, stream=stream)
    stream.synchronize()
    assert (out == 7).all()


def test_pinned_host_copies(gpu: CUDABackend) -> None:
    ptr = gpu.host_alloc(0, MiB)
    try:
        import ctypes

        host = np.frombuffer((ctypes.c_char * MiB).from_address(ptr), dtype=np.uint8)
        host[:] = np.arange(MiB, dtype=np.uint64).astype(np.uint8)
        device = gpu.malloc(0, MiB)
        gpu.memcpy_async(0, device, memoryview(host), MiB, 0)
        out = np.zeros(MiB, dtype=np.uint8)
        gpu.memcpy_async(0, memoryview(out), device, MiB, 0)
        gpu.synchronize(0)
        np.testing.assert_array_equal(out, host)
        gpu.free(0, device)
    finally:
        gpu.host_free(0, ptr)


def test_events_time_real_work(gpu: CUDABackend) -> None:
    stream = acc.Stream()
    buf = acc.empty(64 * MiB, stream=stream)
    start, end = acc.Event(enable_timing=True), acc.Event(enable_timing=True)
    start.record(stream)
    for _ in range(10):
        gpu.memset_async(0, buf.block.address, 1, buf.nbytes, stream.handle)
    end.record(stream)
    assert start.elapsed_time(end) > 0.0
    assert end.query() is True


def test_virtual_memory_holds_data(gpu: CUDABackend) -> None:
    page = gpu.vm_granularity(0)
    base = gpu.vm_reserve(0, 4 * page)
    gpu.vm_map(0, base, 2 * page)
    data = np.arange(2 * page, dtype=np.uint8)
    gpu.memcpy_async(0, base, memoryview(data), data.nbytes, 0)
    out = np.zeros_like(data)
    gpu.memcpy_async(0, memoryview(out), base, out.nbytes, 0)
    gpu.synchronize(0)
    np.testing.assert_array_equal(out, data)
    gpu.vm_unmap(0, base + page, page)
    gpu.vm_unmap(0, base, page)
    gpu.vm_release(0, base)


def test_expandable_segments_on_the_gpu(gpu: CUDABackend) -> None:
    alloc = CachingAllocator(gpu, 0, AllocatorConfig.parse("expandable_segments:True"))
    a = alloc.malloc(30 * MiB, 0)
    b = alloc.malloc(30 * MiB, 0)
    assert b.address == a.address + 30 * MiB
    data = np.full(60 * MiB, 3, dtype=np.uint8)
    gpu.memcpy_async(0, a.address, memoryview(data), data.nbytes, 0)  # spans both blocks
    out = np.zeros_like(data)
    gpu.memcpy_async(0, memoryview(out), a.address, out.nbytes, 0)
    gpu.synchronize(0)
    assert (out == 3).all()
    alloc.free(a)
    alloc.free(b)
    alloc.empty_cache()
    assert alloc.memory_stats()["reserved_bytes.all.current"] == 0


def test_real_driver_errors_are_named(gpu: CUDABackend) -> None:
    driver = gpu.driver
    with pytest.raises(CUDAError) as info:
        gpu._call("cuMemFree", 0, driver.CUdeviceptr(0xDEAD000))
    assert info.value.error_name.startswith("CUDA_ERROR_")
    total = gpu.mem_get_info(0)[1]
    with pytest.raises(BackendOutOfMemory, match="CUDA_ERROR_OUT_OF_MEMORY"):
        gpu.malloc(0, 4 * total)
    with pytest.raises(acc.OutOfMemoryError):
        acc.empty(4 * total)
