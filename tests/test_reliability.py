"""Bad input and faults: clear errors, and the allocator stays consistent (docs/reliability.md)."""

from __future__ import annotations

import gc
import warnings

import pytest

import accelrt as acc
from accelrt.backends.sim import SimBackend
from accelrt.memory import AllocatorConfig, CachingAllocator

MiB = 1 << 20


def test_free_after_the_recorded_stream_is_gone(queue_backend: str) -> None:
    buf = acc.empty(MiB)
    side = acc.Stream()
    acc.record_stream(buf, side)
    del side
    gc.collect()  # the stream is destroyed (its queue finished)
    with pytest.warns(RuntimeWarning, match="the stream is gone"):
        buf.free()
    stats = acc.memory_stats()
    assert stats["active_bytes.all.current"] == 0  # freed, not stranded
    acc.empty_cache()
    assert acc.memory_reserved() == 0


def test_max_split_size_changed_with_live_blocks_keeps_stats_consistent() -> None:
    backend = SimBackend(device_count=1)
    alloc = CachingAllocator(backend, 0, AllocatorConfig.parse("max_split_size_mb:40"))
    big = alloc.malloc(50 * MiB, 0)  # oversize under 40 MiB
    assert alloc.memory_stats()["oversize_allocations.current"] == 1
    alloc.set_config(AllocatorConfig.parse("max_split_size_mb:100"))
    stats = alloc.memory_stats()
    assert stats["oversize_allocations.current"] == 0 and stats["oversize_segments.current"] == 0
    alloc.free(big)
    alloc.set_config(AllocatorConfig())
    alloc.empty_cache()
    stats = alloc.memory_stats()
    assert stats["oversize_allocations.current"] == stats["oversize_segments.current"] == 0
    assert all(v >= 0 for k, v in stats.items() if k.endswith(".current"))


def test_unrelated_setting_keeps_the_memory_fraction(sim: str) -> None:
    acc.empty(1).free()
    acc.set_allocator_settings("per_process_memory_fraction:0.5")
    acc.set_per_process_memory_fraction(0.25)
    acc.set_allocator_settings("garbage_collection_threshold:0.9")  # must not restore 0.5
    with pytest.raises(acc.OutOfMemoryError, match=r"accelrt may use 20\.00 GiB"):
        acc.empty(30 << 30)


def test_queue_backends_enforce_the_device_capacity(queue_backend: str) -> None:
    _, total = acc.get_memory_info()
    held = [acc.empty(total // 4) for _ in range(4)]
    with pytest.raises(acc.OutOfMemoryError) as info:
        acc.empty(total // 4)
    assert info.value.total_bytes == total and info.value.free_bytes == 0
    for buf in held:
        buf.free()
    acc.empty_cache()
    assert acc.get_memory_info() == (total, total)
    acc.empty(total // 4).free()  # usable again


def test_wrong_types_name_the_argument(sim: str) -> None:
    with pytest.raises(TypeError, match=r"Event.record\(\) takes a Stream, got str"):
        acc.Event().record("x")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"elapsed_time\(\) takes an Event, got int"):
        acc.Event(enable_timing=True).elapsed_time(3)  # type: ignore[arg-type]
    buf = acc.empty(16)
    host = bytearray(16)
    with pytest.raises(TypeError, match=r"copy_\(\) stream must be an accelrt.Stream, got str"):
        acc.copy_(host, buf, stream="s")  # type: ignore[arg-type]
    buf.free()


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"ACCELRT_SIM_CAPACITY": "abc"}, r"cannot parse ACCELRT_SIM_CAPACITY 'abc'"),
        ({"ACCELRT_SIM_DEVICES": "100000000"}, r"ACCELRT_SIM_DEVICES='100000000': expected"),
        ({"ACCELRT_SIM_DEVICES": "٣"}, r"ACCELRT_SIM_DEVICES='٣': expected a device count"),
        ({"ACCELRT_SIM_DEVICES": "0"}, r"ACCELRT_SIM_DEVICES must be 1 to 1024, got 0"),
    ],
)
def test_environment_errors_name_their_variable(
    monkeypatch: pytest.MonkeyPatch, env: dict[str, str], message: str
) -> None:
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("ACCELRT_BACKEND", "sim")
    with pytest.raises(ValueError, match=message):
        acc.empty(1)
    monkeypatch.delenv("ACCELRT_BACKEND")


def test_device_strings_are_bounded() -> None:
    with pytest.raises(ValueError, match=r"an index of at most 9 digits"):
        acc.Device("sim:" + "9" * 5000)
    with pytest.raises(ValueError, match=r"in ASCII"):
        acc.Device("sim:٣")


class _FaultySim(SimBackend):
    """A simulated backend whose next call of ``fail`` raises (a driver error)."""

    fail = ""

    def __init__(self) -> None:
        super().__init__(device_count=1, capacity=256 * MiB)

    def __getattribute__(self, name: str) -> object:
        if name != "fail" and name == object.__getattribute__(self, "fail"):
            self.fail = ""
            raise RuntimeError(f"injected failure of {name}")
        return object.__getattribute__(self, name)


@pytest.mark.parametrize("failing", ["event_create", "event_record", "malloc", "free", "vm_map"])
def test_backend_errors_inside_allocator_calls_leave_it_consistent(failing: str) -> None:
    backend = _FaultySim()
    expandable = failing not in ("malloc", "free")  # ordinary segments use malloc and free
    alloc = CachingAllocator(backend, 0, AllocatorConfig(expandable_segments=expandable))
    side = backend.stream_create(0, 0)
    kept = alloc.malloc(3 * MiB, 0)
    block = alloc.malloc(MiB, 0)
    alloc.record_stream(block, side)
    backend.fail = failing
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # a failed event record warns, and waits instead
            alloc.free(block)  # event_create / event_record
        alloc.free(kept)
        alloc.empty_cache()  # free
        alloc.malloc(30 * MiB, 0)  # malloc / vm_map
    except RuntimeError as exc:
        assert str(exc) == f"injected failure of {failing}"
    assert backend.fail == ""  # the fault was injected
    for _, blocks in alloc.segments():  # consistent: free what is left and release all
        for b in blocks:
            if b.allocated:
                alloc.free(b)
    alloc.empty_cache()
    stats = alloc.memory_stats()
    assert stats["reserved_bytes.all.current"] == alloc.reserved_bytes == 0
    assert stats["allocated_bytes.all.current"] == stats["active_bytes.all.current"] == 0
    assert backend.mem_get_info(0) == (256 * MiB, 256 * MiB)


def test_opencl_driver_errors_are_accelerator_errors(opencl: str) -> None:
    if acc.device_count() < 2:
        pytest.skip("needs two OpenCL devices")
    backend = acc.backends.get_backend("opencl")
    event = acc.Stream(device=0).record_event()
    stream = acc.Stream(device=1)
    with pytest.raises(acc.AcceleratorError, match=r"OpenCL stream_wait_event failed: .*CONTEXT"):
        backend.stream_wait_event(1, stream.handle, event._handle)  # another device's event


def test_sim_reuses_released_ranges_whatever_the_order(sim: str) -> None:
    # Four streams, each with a large and a small expandable segment: empty_cache gives eight
    # ranges back in an order where the latest is not last, so reusing only the latest range
    # ran out of address space at cycle 60 with 80 GiB free (issue 26).
    from accelrt.backends.sim import BASE_ADDRESS

    acc.set_allocator_settings("expandable_segments:True")
    streams = [acc.Stream(device=0) for _ in range(4)]
    highest = set()
    for _ in range(200):
        bufs = [acc.empty(n, stream=s) for s in streams for n in (MiB, 100)]
        highest.add(max(b.ptr for b in bufs))
        for buf in bufs:
            buf.free()
        acc.empty_cache(0)
        assert acc.memory_reserved(0) == 0
    assert len(highest) == 1  # every cycle lands in the same ranges
    assert max(highest) < BASE_ADDRESS + 8 * 91 * 1024 * MiB


def test_sim_released_ranges_merge_and_are_taken_lowest_first() -> None:
    from accelrt.backends.sim import BASE_ADDRESS, SimBackend

    backend = SimBackend(device_count=1, capacity="1GiB")
    size = 64 * MiB
    a, b, c, d = (backend.vm_reserve(0, size) for _ in range(4))
    assert [a, b, c, d] == [BASE_ADDRESS + i * size for i in range(4)]
    backend.vm_release(0, c)
    backend.vm_release(0, a)
    assert backend.vm_reserve(0, size) == a  # the lowest released range that fits
    backend.vm_release(0, b)
    # b and c merged into one 128 MiB range: a request of twice the size fits there
    assert backend.vm_reserve(0, 2 * size) == b
    assert backend.vm_reserve(0, size) == d + size  # nothing released is left: the bump rule
    for ptr in (a, b, d, d + size):
        backend.vm_release(0, ptr)
    assert backend.vm_reserve(0, 5 * size) == BASE_ADDRESS  # all merged back to the start


def test_sim_address_space_is_never_shared_between_devices(sim: str) -> None:
    from accelrt.backends.sim import BASE_ADDRESS, DEVICE_STRIDE

    acc.set_allocator_settings("expandable_segments:True")
    for _ in range(300):  # each cycle reserves a 90 GiB range and gives it back
        buf = acc.empty(MiB, device=0)
        assert BASE_ADDRESS <= buf.ptr < BASE_ADDRESS + DEVICE_STRIDE
        buf.free()
        acc.empty_cache(0)
