"""The host (pinned) caching allocator: PyTorch's CachingHostAllocator policy on sim and PoCL.

Rounding to powers of two, one LIFO free list per size, reuse only after the events of the
streams that used a block, ``empty_host_cache``, ``host_memory_stats()`` after every step,
``HostBuffer`` and copies, bad input and faults (docs/host-allocator.md).
"""

from __future__ import annotations

import copy
import ctypes
import gc
import os
import pickle
import random
import sys
import threading
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

import numpy as np
import pytest

import accelrt as acc
from accelrt.backends import get_backend
from accelrt.memory import HostCachingAllocator
from accelrt.memory.host._allocator import host_round_size
from accelrt.testing import use_no_accelerator

KiB, MiB = 1 << 10, 1 << 20
TIMES = ("total", "max", "min", "avg")


def counts(stats: dict[str, int]) -> dict[str, int]:
    """The statistics without the measured times (their counts stay)."""
    return {
        k: v
        for k, v in stats.items()
        if not (k.startswith(("host_alloc_time.", "host_free_time.")) and k.endswith(TIMES))
    }


def expected(
    *,
    allocations: tuple[int, int, int, int] = (0, 0, 0, 0),
    allocated_bytes: tuple[int, int, int, int] = (0, 0, 0, 0),
    active_requests: tuple[int, int, int, int] = (0, 0, 0, 0),
    active_bytes: tuple[int, int, int, int] = (0, 0, 0, 0),
    alloc_count: int = 0,
    free_count: int = 0,
) -> dict[str, int]:
    """The expected ``counts()``: each stat as (current, peak, allocated, freed)."""
    out = {"host_alloc_time.count": alloc_count, "host_free_time.count": free_count}
    for name, (current, peak, allocated, freed) in (
        ("allocations", allocations),
        ("allocated_bytes", allocated_bytes),
        ("active_requests", active_requests),
        ("active_bytes", active_bytes),
    ):
        out |= {
            f"{name}.current": current,
            f"{name}.peak": peak,
            f"{name}.allocated": allocated,
            f"{name}.freed": freed,
        }
    out["num_host_alloc"] = allocations[2]
    out["num_host_free"] = allocations[3]
    return dict(sorted(out.items()))


class Gate:
    """A stream whose work does not complete until ``open()``.

    On PoCL, a real barrier behind a user event; on ``sim`` (whose work completes at once), the
    backend's events report "not completed" until the gate opens.
    """

    def __init__(self, device: str, monkeypatch: pytest.MonkeyPatch) -> None:
        self.stream = acc.Stream()
        self.device = device
        self.is_open = False
        backend = get_backend(device)
        if device == "opencl":
            import pyopencl as cl

            self._event = cl.UserEvent(backend.context(0))  # type: ignore[attr-defined]
            cl.enqueue_barrier(
                backend.queue(0, self.stream.handle),  # type: ignore[attr-defined]
                wait_for=[self._event],
            )
        else:
            real_query = backend.event_query
            monkeypatch.setattr(
                backend, "event_query", lambda event: self.is_open and real_query(event)
            )

    def open(self) -> None:
        self.is_open = True
        if self.device == "opencl":
            import pyopencl as cl

            self._event.set_status(cl.command_execution_status.COMPLETE)
        self.stream.synchronize()


@pytest.fixture
def gate(device: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[Gate]:
    g = Gate(device, monkeypatch)
    yield g
    if not g.is_open:
        g.open()


# ---------------------------------------------------------------------- rounding and reuse
def test_round_size_is_the_next_power_of_two() -> None:
    sizes = [1, 2, 3, 4, 5, 511, 512, 513, 1000, 4096, 4097, MiB - 1, MiB, MiB + 1, 3 << 30]
    assert [host_round_size(n) for n in sizes] == [
        1, 2, 4, 4, 8, 512, 512, 1024, 1024, 4096, 8192, MiB, MiB, 2 * MiB, 4 << 30,
    ]  # fmt: skip


def test_blocks_are_rounded_and_reused_last_in_first_out_per_size(device: str) -> None:
    a, b, c = acc.empty_host(1000), acc.empty_host(1024), acc.empty_host(3)
    assert (a.nbytes, b.nbytes, c.nbytes) == (1000, 1024, 3)
    assert counts(acc.host_memory_stats())["allocated_bytes.current"] == 1024 + 1024 + 4
    a_ptr, b_ptr = a.ptr, b.ptr
    a.free()
    b.free()
    bigger = acc.empty_host(1025)  # 2048: another list, new memory
    assert bigger.ptr not in (a_ptr, b_ptr)
    first, second = acc.empty_host(600), acc.empty_host(1024)  # the 1024 list, newest first
    assert (first.ptr, second.ptr) == (b_ptr, a_ptr)
    assert acc.host_memory_stats()["num_host_alloc"] == 4
    for buf in (bigger, first, second, c):
        buf.free()


def test_blocks_of_one_device_are_not_reused_for_another(device: str) -> None:
    if acc.device_count() < 2:
        pytest.skip(f"{device} has one device")
    a = acc.empty_host(KiB, device=0)
    ptr = a.ptr
    a.free()
    other = acc.empty_host(KiB, device=1)
    assert other.ptr != ptr and other.device == acc.Device(device, 1)
    again = acc.empty_host(KiB, device=0)
    assert again.ptr == ptr
    other.free()
    again.free()


# ---------------------------------------------------------------------- streams and events
def test_reuse_waits_for_the_event_of_the_copy_stream(device: str, gate: Gate) -> None:
    host = acc.empty_host(64 * KiB)
    ptr = host.ptr
    dev = acc.empty(64 * KiB, stream=gate.stream)
    acc.copy_(dev, host, stream=gate.stream)  # records the gated stream on the host block
    host.free()
    pending = counts(acc.host_memory_stats())
    assert (pending["active_requests.current"], pending["active_bytes.current"]) == (1, 64 * KiB)
    blocked = acc.empty_host(64 * KiB)
    assert blocked.ptr != ptr, "a host block still used by a stream's copy was reused"
    acc.empty_host_cache()  # keeps the block whose event has not completed
    assert acc.host_memory_stats()["allocations.current"] == 2
    gate.open()
    again = acc.empty_host(64 * KiB)  # events are checked first: the block is free now
    assert again.ptr == ptr
    assert counts(acc.host_memory_stats()) == expected(
        allocations=(2, 2, 2, 0),
        allocated_bytes=(128 * KiB, 128 * KiB, 128 * KiB, 0),
        active_requests=(2, 2, 3, 1),
        active_bytes=(128 * KiB, 128 * KiB, 192 * KiB, 64 * KiB),
        alloc_count=2,
    )
    for buf in (blocked, again, dev):
        buf.free()


def test_record_stream_on_host_memory_waits_for_every_stream(device: str, gate: Gate) -> None:
    other = acc.Stream()
    host = acc.empty_host(4 * KiB)
    ptr = host.ptr
    acc.record_stream(host, gate.stream)
    host.record_stream(other)
    host.free()
    assert acc.empty_host(4 * KiB).ptr != ptr
    gate.open()
    other.synchronize()
    assert acc.empty_host(4 * KiB).ptr == ptr


def test_a_block_no_stream_used_is_reusable_at_once(device: str, gate: Gate) -> None:
    host = acc.empty_host(4 * KiB)
    ptr = host.ptr
    host.numpy()[:] = 1  # host-only use records nothing
    host.free()
    assert acc.host_memory_stats()["active_requests.current"] == 0
    assert acc.empty_host(4 * KiB).ptr == ptr


def test_data_round_trip_while_the_host_block_is_reused_as_soon_as_it_may(
    device: str, gate: Gate
) -> None:
    nbytes = MiB
    pattern = (np.arange(nbytes // 4, dtype=np.uint32) * 2654435761).astype(np.uint32)
    staging = acc.empty_host(nbytes)
    staging.numpy()[:] = pattern.view(np.uint8)
    ptr = staging.ptr
    dev = acc.empty(nbytes, stream=gate.stream)
    acc.copy_(dev, staging, stream=gate.stream)
    staging.free()
    # The next batch must not land in the block the queued copy still reads.
    scribble = acc.empty_host(nbytes)
    assert scribble.ptr != ptr
    scribble.numpy()[:] = 0xAB
    gate.open()
    back = acc.empty_host(nbytes)  # the copy has run: its block is reused at once
    assert back.ptr == ptr
    acc.copy_(back, dev, stream=gate.stream)
    gate.stream.synchronize()
    assert (back.numpy().view(np.uint32) == pattern).all()
    out = np.zeros(nbytes, np.uint8)
    acc.copy_(out, dev, stream=gate.stream)  # pageable memory keeps working
    gate.stream.synchronize()
    assert (out.view(np.uint32) == pattern).all()
    for buf in (scribble, back, dev):
        buf.free()


def test_copy_from_pageable_memory_still_works(device: str) -> None:
    data = np.arange(1000, dtype=np.float32)
    with acc.empty(data.nbytes) as dev, acc.empty_host(data.nbytes) as host:
        acc.copy_(dev, data)
        acc.copy_(host, dev)
        acc.synchronize()
        assert (host.numpy().view(np.float32) == data).all()
    assert acc.host_memory_stats()["active_requests.current"] == 1  # until events are checked
    acc.synchronize()
    acc.empty_host_cache()
    assert counts(acc.host_memory_stats())["allocations.current"] == 0


# ---------------------------------------------------------------------- statistics
def test_stats_after_each_step(device: str) -> None:
    assert acc.host_memory_stats() == {}
    acc.empty_host_cache()  # no-op before first use
    acc.reset_peak_host_memory_stats()
    acc.reset_accumulated_host_memory_stats()
    assert acc.host_memory_stats() == {}

    a = acc.empty_host(1000)  # 1024
    assert counts(acc.host_memory_stats()) == expected(
        allocations=(1, 1, 1, 0),
        allocated_bytes=(1024, 1024, 1024, 0),
        active_requests=(1, 1, 1, 0),
        active_bytes=(1024, 1024, 1024, 0),
        alloc_count=1,
    )
    b = acc.empty_host(3000)  # 4096
    assert counts(acc.host_memory_stats()) == expected(
        allocations=(2, 2, 2, 0),
        allocated_bytes=(5120, 5120, 5120, 0),
        active_requests=(2, 2, 2, 0),
        active_bytes=(5120, 5120, 5120, 0),
        alloc_count=2,
    )
    a.free()
    a.free()  # a no-op
    assert counts(acc.host_memory_stats()) == expected(
        allocations=(2, 2, 2, 0),
        allocated_bytes=(5120, 5120, 5120, 0),
        active_requests=(1, 2, 2, 1),
        active_bytes=(4096, 5120, 5120, 1024),
        alloc_count=2,
    )
    c = acc.empty_host(600)  # a cache hit on a's block
    assert counts(acc.host_memory_stats()) == expected(
        allocations=(2, 2, 2, 0),
        allocated_bytes=(5120, 5120, 5120, 0),
        active_requests=(2, 2, 3, 1),
        active_bytes=(5120, 5120, 6144, 1024),
        alloc_count=2,
    )
    acc.empty_host_cache()  # nothing cached: nothing changes
    assert counts(acc.host_memory_stats())["allocations.current"] == 2
    b.free()
    c.free()
    acc.reset_peak_host_memory_stats()
    assert counts(acc.host_memory_stats()) == expected(
        allocations=(2, 2, 2, 0),
        allocated_bytes=(5120, 5120, 5120, 0),
        active_requests=(0, 0, 3, 3),
        active_bytes=(0, 0, 6144, 6144),
        alloc_count=2,
    )
    acc.empty_host_cache()
    stats = acc.host_memory_stats()
    assert counts(stats) == expected(
        allocations=(0, 2, 2, 2),
        allocated_bytes=(0, 5120, 5120, 5120),
        active_requests=(0, 0, 3, 3),
        active_bytes=(0, 0, 6144, 6144),
        alloc_count=2,
        free_count=2,
    )
    for name in ("host_alloc_time", "host_free_time"):
        assert stats[f"{name}.max"] >= stats[f"{name}.min"] >= 0
        assert stats[f"{name}.total"] >= stats[f"{name}.max"]
        assert stats[f"{name}.avg"] == stats[f"{name}.total"] // 2
    acc.reset_accumulated_host_memory_stats()
    acc.reset_peak_host_memory_stats()
    stats = acc.host_memory_stats()
    assert counts(stats) == expected()
    assert stats["host_alloc_time.total"] == stats["host_alloc_time.max"] == 0
    assert stats["host_free_time.avg"] == stats["host_free_time.min"] == 0


def test_active_peaks_are_summed_per_size_as_pytorch_reports_them(device: str) -> None:
    acc.empty_host(KiB).free()
    acc.empty_host(4 * KiB).free()  # never two at once, but two sizes each peaked at one
    stats = acc.host_memory_stats()
    assert (stats["active_requests.peak"], stats["active_bytes.peak"]) == (2, 5 * KiB)
    assert (stats["allocations.peak"], stats["allocated_bytes.peak"]) == (2, 5 * KiB)


def test_keys_are_torch_cuda_host_memory_stats_keys(device: str) -> None:
    acc.empty_host(1).free()
    stats = acc.host_memory_stats()
    assert list(stats) == sorted(stats)
    assert set(stats) == {
        f"{stat}.{metric}"
        for stat in ("allocations", "allocated_bytes", "active_requests", "active_bytes")
        for metric in ("current", "peak", "allocated", "freed")
    } | {
        f"{name}.{metric}"
        for name in ("host_alloc_time", "host_free_time")
        for metric in ("total", "max", "min", "count", "avg")
    } | {"num_host_alloc", "num_host_free"}
    assert acc.host_memory_stats is acc.memory.host_memory_stats


# ---------------------------------------------------------------------- HostBuffer
def test_host_buffer_views_are_zero_copy(device: str) -> None:
    host = acc.empty_host(100)
    view = host.numpy()
    assert (view.shape, view.dtype, view.flags.writeable) == ((100,), np.uint8, True)
    view[:] = np.arange(100, dtype=np.uint8)
    assert ctypes.string_at(host.ptr, 100) == bytes(range(100))
    assert view.__array_interface__["data"][0] == host.ptr
    exported = np.from_dlpack(host)
    assert exported.__array_interface__["data"][0] == host.ptr
    assert host.__dlpack_device__() == (1, 0)
    if sys.version_info >= (3, 12):
        mv = memoryview(host)  # type: ignore[arg-type]
        assert (mv.nbytes, mv.readonly, mv[5]) == (100, False, 5)
    assert len(host) == 100
    pinned = {"sim": False, "opencl": True}.get(device, True)  # sim has no pinning
    assert host.pinned is pinned is get_backend(device).host_memory_pinned(0)
    assert acc.get_device_properties().pinned_host_memory is pinned
    assert host.device == acc.Device(device, 0)
    assert repr(host) == (
        f"HostBuffer(ptr={host.ptr:#x}, nbytes=100, device={device}:0, pinned={host.pinned})"
    )
    host.free()
    assert repr(host).endswith(", freed)") and host.freed


def test_sim_host_memory_is_page_aligned(sim: str) -> None:
    with acc.empty_host(10) as host:
        assert host.ptr % 4096 == 0


def test_a_view_keeps_the_buffer_alive_and_the_finaliser_frees(device: str) -> None:
    host = acc.empty_host(KiB)
    view = host.numpy()
    del host
    gc.collect()
    assert acc.host_memory_stats()["active_requests.current"] == 1  # the view holds it
    del view
    gc.collect()
    assert acc.host_memory_stats()["active_requests.current"] == 0


def test_a_finaliser_inside_an_allocator_operation_waits_for_its_end(device: str) -> None:
    allocator = acc.memory.get_host_allocator()
    host = acc.empty_host(KiB)
    block = host.block
    with allocator._lock:  # as if the garbage collector ran inside an allocator call
        allocator.free_soon(block)
        assert block.allocated
    assert acc.empty_host(KiB).block is block  # the next operation ran the free first
    host._block = None  # already freed through the finaliser path


def test_empty_buffer(device: str) -> None:
    host = acc.empty_host(0)
    assert (host.ptr, host.nbytes, host.freed) == (0, 0, False)
    assert host.numpy().shape == (0,)
    host.record_stream(acc.current_stream())  # nothing to record
    host.free()
    host.free()
    assert counts(acc.host_memory_stats()) == expected()


def test_threads_share_one_consistent_allocator(device: str) -> None:
    errors: list[BaseException] = []

    def work(seed: int) -> None:
        try:
            rng = np.random.default_rng(seed)
            for _ in range(300):
                with acc.empty_host(int(rng.integers(1, 64 * KiB))) as host:
                    host.numpy()[:1] = seed
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    stats = acc.host_memory_stats()
    allocator = acc.memory.get_host_allocator()
    cached = allocator.cached_blocks()
    assert stats["active_requests.current"] == 0
    assert stats["active_requests.allocated"] == 1200
    assert stats["allocations.current"] == len(cached) == len(allocator.blocks())
    assert stats["allocated_bytes.current"] == sum(b.size for b in cached)
    acc.empty_host_cache()
    assert acc.host_memory_stats()["allocated_bytes.current"] == 0


# ---------------------------------------------------------------------- bad input and faults
def _message(call: Callable[[], object], kind: type[BaseException]) -> str:
    with pytest.raises(kind) as info:
        call()
    return str(info.value)


@pytest.mark.parametrize(
    ("size", "kind", "message"),
    [
        (-1, ValueError, "allocation size must be >= 0 bytes, got -1"),
        (
            (1 << 60) + 1,
            ValueError,
            "allocation size must be between 1 and 2**60 bytes, got 1152921504606846977: "
            "no host has that much memory",
        ),
        (1.5, TypeError, "allocation size must be an int number of bytes, got float 1.5"),
        (True, TypeError, "allocation size must be an int number of bytes, got True"),
        ("1KiB", TypeError, "allocation size must be an int number of bytes, got str '1KiB'"),
    ],
)
def test_bad_sizes(device: str, size: object, kind: type[Exception], message: str) -> None:
    assert _message(lambda: acc.empty_host(size), kind) == message  # type: ignore[arg-type]
    if "host" not in message:  # the same words as empty()
        assert _message(lambda: acc.empty(size), kind) == message  # type: ignore[arg-type]
    assert counts(acc.host_memory_stats() or expected()) == expected()


def test_bad_devices_as_for_empty(device: str) -> None:
    count = acc.device_count()
    foreign = "sim:0" if device == "cuda" else "cuda:0"  # a device of another backend
    for bad, kind in ((count, ValueError), (-1, ValueError), (foreign, ValueError)):
        text = _message(lambda bad=bad: acc.empty_host(8, device=bad), kind)
        assert text == _message(lambda bad=bad: acc.empty(8, device=bad), kind)
    assert _message(lambda: acc.empty_host(8, device=count), ValueError) == (
        f"device index {count} is out of range [0, {count})"
    )
    text = _message(lambda: acc.empty_host(8, device=1.0), TypeError)  # type: ignore[arg-type]
    assert text.startswith("device must be an int index, a string like 'opencl:0'")


def test_no_accelerator() -> None:
    use_no_accelerator()
    assert acc.host_memory_stats() == {}
    acc.empty_host_cache()
    with pytest.raises(RuntimeError, match=r"^Cannot access accelerator device when none is"):
        acc.empty_host(8)


def test_using_a_freed_host_buffer_is_a_clear_error(device: str) -> None:
    host = acc.empty_host(64)
    host.free()
    host.free()  # freeing twice does nothing
    message = (
        f"{host!r} was freed: its memory went back to the host allocator; allocate another "
        "with accelrt.empty_host()"
    )
    dev = acc.empty(64)
    uses: list[Callable[[], object]] = [
        lambda: host.ptr,
        host.numpy,
        host.__dlpack__,
        lambda: acc.copy_(dev, host),
        lambda: acc.copy_(host, dev),
        lambda: acc.record_stream(host, acc.current_stream()),
    ]
    for use in uses:
        assert _message(use, ValueError) == message
    with pytest.raises(TypeError, match=r"^record_stream\(\) takes a Stream, got str$"):
        acc.record_stream(acc.empty_host(8), "s")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"takes a Buffer or a HostBuffer, got bytes$"):
        acc.record_stream(b"x", acc.current_stream())  # type: ignore[arg-type]
    assert counts(acc.host_memory_stats())["active_requests.current"] == 0
    dev.free()


def test_the_allocator_refuses_foreign_and_freed_blocks(device: str) -> None:
    allocator = acc.memory.get_host_allocator()
    block = allocator.malloc(8, 0)
    allocator.free(block)
    with pytest.raises(ValueError, match=r"host block at 0x[0-9a-f]+ is not allocated by this"):
        allocator.free(block)
    with pytest.raises(ValueError, match=r"host block at 0x[0-9a-f]+ is not allocated$"):
        allocator.record_stream(block, 0, 0)
    other = HostCachingAllocator(get_backend(device))
    mine = allocator.malloc(8, 0)
    with pytest.raises(ValueError, match="not allocated by this allocator"):
        other.free(mine)
    allocator.free(mine)


def test_host_out_of_memory_changes_nothing(sim: str) -> None:
    acc.empty_host(8).free()
    before = acc.host_memory_stats()
    with pytest.raises(acc.OutOfMemoryError) as info:
        acc.empty_host(1 << 59)
    err = info.value
    assert str(err).startswith(
        "Out of host memory. Tried to allocate 536870912.00 GiB of host memory for sim:0 "
        "(576460752303423488 bytes requested, rounded up to a power of two)."
    )
    assert (err.requested_bytes, err.allocation_bytes, err.reserved_bytes) == (1 << 59, 1 << 59, 8)
    assert isinstance(err, MemoryError)
    assert acc.host_memory_stats() == before
    acc.empty_host(8).free()


def test_driver_errors_leave_the_allocator_consistent(
    sim: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    backend = get_backend("sim")

    def fail(*args: object) -> None:
        raise acc.AcceleratorError("injected")

    with monkeypatch.context() as patch:
        patch.setattr(backend, "host_alloc", fail)
        with pytest.raises(acc.AcceleratorError, match="injected"):
            acc.empty_host(8)
    assert counts(acc.host_memory_stats()) == expected()

    host = acc.empty_host(8)
    ptr = host.ptr
    stream = acc.Stream()
    host.record_stream(stream)
    with monkeypatch.context() as patch:
        patch.setattr(backend, "event_record", fail)
        with pytest.warns(RuntimeWarning, match="no event could be recorded on stream"):
            host.free()  # the stream is waited for instead: the block is cached at once
    assert acc.host_memory_stats()["active_requests.current"] == 0
    assert acc.empty_host(8).ptr == ptr

    acc.empty_host(16).free()
    with monkeypatch.context() as patch:
        patch.setattr(backend, "host_free", fail)
        with pytest.raises(acc.AcceleratorError, match="injected"):
            acc.empty_host_cache()
    stats = counts(acc.host_memory_stats())
    assert stats["allocations.current"] == 2 and stats["num_host_free"] == 0
    acc.empty_host_cache()  # the rest is released later
    assert counts(acc.host_memory_stats())["allocations.current"] == 0


# ---------------------------------------------------------------------- interrupts
if TYPE_CHECKING:
    from conftest import SigintAtRandomLines

_HOST_FILES = {
    os.path.join(os.path.dirname(acc.memory.__file__), name)
    for name in (  # noqa: SIM905 (one line, not one a name)
        "host/_allocator.py host/_buffer.py host/_source.py device/_events.py device/_stats.py"
    ).split()
}


def test_keyboard_interrupts_leave_the_host_allocator_consistent(
    sim: str,
    sigint_at_random_lines: type[SigintAtRandomLines],
    settle: Callable[[float], int],
) -> None:
    acc.empty_host(1).free()
    allocator = acc.memory.get_host_allocator()
    rng = random.Random(14)
    live: list[acc.HostBuffer] = []
    interrupts = 0
    injector = sigint_at_random_lines(_HOST_FILES, 3, most=40)
    for _ in range(800):
        try:
            with injector:
                roll = rng.random()
                if roll < 0.55 or not live:
                    live.append(acc.empty_host(rng.choice([1, 100, 4 * KiB, 3 * MiB])))
                elif roll < 0.97:
                    live.pop(rng.randrange(len(live))).free()
                else:
                    acc.empty_host_cache()
        except KeyboardInterrupt:
            interrupts += 1
        interrupts += settle(0.003)
    interrupts += settle(0.5)
    assert injector.sent >= 400 and interrupts > 50  # host calls were interrupted
    gc.collect()  # buffers dropped by an interrupt between a call and the list are freed
    blocks, cached = allocator.blocks(), allocator.cached_blocks()
    held = [b for b in blocks if b.allocated]
    stats = acc.host_memory_stats()
    live_ptrs = {b.ptr for b in live if not b.freed}
    assert len(held) == len(live_ptrs) == stats["active_requests.current"]
    assert sorted(b.address for b in held + cached) == [b.address for b in blocks]
    assert stats["allocations.current"] == len(blocks)
    assert stats["allocated_bytes.current"] == sum(b.size for b in blocks)
    assert stats["active_bytes.current"] == sum(b.size for b in held)
    for buf in live:
        buf.free()
    acc.empty_host_cache()
    assert counts(acc.host_memory_stats())["allocations.current"] == 0


def test_a_host_buffer_cannot_be_copied_or_pickled(device: str) -> None:
    host = acc.empty_host(KiB)
    for duplicate in (copy.copy, copy.deepcopy, pickle.dumps):
        with pytest.raises(TypeError, match=r"an accelrt.HostBuffer owns its memory"):
            duplicate(host)
    host.free()
    assert acc.host_memory_stats()["active_requests.current"] == 0
