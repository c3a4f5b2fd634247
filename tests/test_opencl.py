"""The OpenCL backend on a real device (PoCL's CPU device in CI): real queues, real async work."""

from __future__ import annotations

import numpy as np
import pytest

import accelrt as acc
from accelrt.backends import get_backend

MiB = 1 << 20


@pytest.fixture
def gated(opencl: str) -> tuple[acc.Stream, object]:
    """A stream whose queue is blocked behind a user event until the test opens the gate."""
    cl = pytest.importorskip("pyopencl")
    backend = get_backend("opencl")
    stream = acc.Stream()
    gate = cl.UserEvent(backend.context(0))  # type: ignore[attr-defined]
    cl.enqueue_barrier(backend.queue(0, stream.handle), wait_for=[gate])  # type: ignore[attr-defined]
    return stream, gate


def _open(gate: object) -> None:
    import pyopencl as cl

    gate.set_status(cl.command_execution_status.COMPLETE)  # type: ignore[attr-defined]


def test_freed_block_waits_for_other_stream(gated: tuple[acc.Stream, object]) -> None:
    user, gate = gated
    alloc_stream = acc.current_stream()
    pattern = (np.arange(MiB, dtype=np.uint32) * 2654435761).astype(np.uint32)
    buf = acc.empty(pattern.nbytes, stream=alloc_stream)  # 4 MiB: large pool, 20 MiB segment
    ptr = buf.ptr
    acc.copy_(buf, pattern, stream=user)  # queued behind the gate: not done yet
    acc.record_stream(buf, user)
    buf.free()
    assert acc.memory_stats()["active_bytes.all.current"] == pattern.nbytes
    blocked = acc.empty(pattern.nbytes, stream=alloc_stream)
    assert blocked.ptr != ptr, "a block still used by another stream was reused"
    assert not user.query()
    _open(gate)
    user.synchronize()
    reused = acc.empty(pattern.nbytes, stream=alloc_stream)
    assert reused.ptr == ptr  # reusable once the other stream's event completed
    out = np.zeros_like(pattern)
    acc.copy_(out, reused)
    alloc_stream.synchronize()
    assert (out == pattern).all()  # the data the other stream wrote is intact
    blocked.free()
    reused.free()


def test_without_record_stream_reuse_is_immediate(opencl: str) -> None:
    buf = acc.empty(4 * MiB)
    ptr = buf.ptr
    buf.free()
    assert acc.empty(4 * MiB).ptr == ptr


def test_event_orders_streams_and_times_real_work(gated: tuple[acc.Stream, object]) -> None:
    user, gate = gated
    other = acc.Stream()
    host = np.full(64 * MiB, 7, dtype=np.uint8)
    buf = acc.empty(host.nbytes, stream=user)
    start = user.record_event(acc.Event(enable_timing=True))
    acc.copy_(buf, host, stream=user)
    end = user.record_event(acc.Event(enable_timing=True))
    other.wait_event(end)
    out = np.zeros(host.nbytes, dtype=np.uint8)
    acc.copy_(out, buf, stream=other)  # ordered after the copy on `user`
    assert not end.query()
    _open(gate)
    other.synchronize()
    assert end.query()
    assert (out == 7).all()
    assert start.elapsed_time(end) > 0.0
    buf.free()


def test_memory_info_counts_what_we_hold(opencl: str) -> None:
    free0, total = acc.get_memory_info()
    buf = acc.empty(MiB + 1)  # a 20 MiB segment
    free1, total1 = acc.get_memory_info()
    assert total1 == total and free0 - free1 == 20 * MiB
    buf.free()
    acc.empty_cache()
    assert acc.get_memory_info() == (free0, total)


def test_device_oom_from_pocl(opencl: str) -> None:
    props = acc.get_device_properties()
    too_big = props.max_allocation_bytes + 2 * MiB
    with pytest.raises(acc.OutOfMemoryError, match=r"^Out of memory on opencl:0\. Tried to"):
        acc.empty(too_big)
    assert acc.memory_stats()["num_ooms"] == 1
    acc.empty(MiB).free()  # still usable
