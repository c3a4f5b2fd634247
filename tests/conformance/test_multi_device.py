"""Several devices of one backend: current device, allocations, independent allocators.

The simulated backend has 2 devices by default; the test suite gives PoCL 2 CPU devices
(``POCL_DEVICES``), so these run on OpenCL too.
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest

import accelrt as acc


def test_sim_has_two_devices_by_default(sim: str) -> None:
    assert acc.device_count() == 2


def test_synchronize_does_not_change_the_current_device(two_devices: str) -> None:
    acc.synchronize(1)
    assert acc.current_device_index() == 0
    acc.set_device_index(1)
    acc.synchronize(0)
    acc.synchronize()
    assert acc.current_device_index() == 1


def test_allocations_land_on_the_current_device(two_devices: str) -> None:
    with acc.device_index(1):
        buf = acc.empty(1000)
    assert buf.device == acc.Device(two_devices, 1)
    assert buf.stream == acc.current_stream(1)
    assert acc.memory_allocated(1) == 1024 and acc.memory_allocated(0) == 0
    buf.free()


def test_pointers_of_different_devices_never_collide(two_devices: str) -> None:
    buffers = [acc.empty(3 << 20, device=i % 2) for i in range(8)]
    segments = sorted(
        (segment.address, segment.address + segment.size, index)
        for index in (0, 1)
        for segment, _ in acc.memory.get_allocator(index).segments()
    )
    assert {index for _, _, index in segments} == {0, 1} and len(
        segments
    ) == 2  # 4 x 3 MiB fit one 20 MiB segment
    assert all(end <= start for (_, end, _), (start, _, _) in itertools.pairwise(segments))
    for b in buffers:
        b.free()


def test_per_device_allocators_and_stats_are_independent(two_devices: str) -> None:
    a = acc.empty(100, device=0)
    b = acc.empty(5000, device=f"{two_devices}:1")
    assert acc.memory_allocated(0) == 512 and acc.memory_allocated(1) == 5120
    assert acc.memory_stats(0)["allocation.all.current"] == 1
    a.free()
    acc.empty_cache(0)
    assert acc.memory_reserved(0) == 0 and acc.memory_reserved(1) == 2 << 20
    assert acc.memory_allocated(1) == 5120
    acc.reset_peak_memory_stats(1)
    assert acc.max_memory_allocated(0) == 512 and acc.max_memory_allocated(1) == 5120
    b.free()


def test_data_round_trips_on_each_device(two_devices: str) -> None:
    for index in (0, 1):
        host = np.arange(256, dtype=np.int32) * (index + 1)
        with acc.empty(host.nbytes, device=index) as buf:
            acc.copy_(buf, host, stream=acc.current_stream(index))
            out = np.zeros_like(host)
            acc.copy_(out, buf, stream=acc.current_stream(index))
            acc.synchronize(index)
            assert (out == host).all()


def test_events_and_streams_of_two_devices_are_not_mixed(two_devices: str) -> None:
    a, b = acc.Event(enable_timing=True), acc.Event(enable_timing=True)
    a.record(acc.Stream(device=0))
    b.record(acc.Stream(device=1))
    with pytest.raises(ValueError, match=r"recorded on .*:0 and .*:1 cannot be timed"):
        a.elapsed_time(b)
    with pytest.raises(ValueError, match=r"a stream of .*:1 cannot wait for an event recorded on"):
        acc.Stream(device=1).wait_event(a)
