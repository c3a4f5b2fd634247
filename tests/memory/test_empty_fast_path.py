"""``accelrt.empty(n)`` follows every change of current device, stream and accelerator.

With the compiled core, the common call ``empty(n)`` takes a per-thread cache of the current
device's allocator and stream (memory/calls/_native.pyx); these tests change what is current
in each
way the runtime allows and check that the next ``empty(n)`` sees it. On the pure-Python core
the same tests check the reference, which looks everything up on every call.
"""

from __future__ import annotations

import copy
import pickle
import threading

import pytest

import accelrt as acc
from accelrt.memory import calls
from accelrt.memory.calls import _calls
from accelrt.memory.device import _core
from accelrt.testing import install_backend, reset_runtime


def _warm() -> None:
    """Call ``empty(n)`` until the compiled core's cache is filled (a lazy first lookup
    changes the state it caches, so the second call fills it for good)."""
    for _ in range(3):
        acc.empty(512).free()


@pytest.fixture
def two_sims(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ACCELRT_SIM_DEVICES", "2")
    acc.backends.use("sim")


def test_set_stream_and_stream_contexts(two_sims: None) -> None:
    default = acc.current_stream()
    _warm()
    assert acc.empty(512).stream == default
    side = acc.Stream()
    acc.set_stream(side)
    _warm()
    assert acc.empty(512).stream == side
    other = acc.Stream()
    with other:
        assert acc.empty(512).stream == other
    assert acc.empty(512).stream == side
    acc.set_stream(default)
    assert acc.empty(512).stream == default


def test_set_device(two_sims: None) -> None:
    _warm()
    assert acc.empty(512).device == acc.Device("sim", 0)
    acc.set_device_index(1)
    held = acc.empty(512)
    assert held.device == acc.Device("sim", 1)
    assert acc.memory_allocated(1) == 512
    _warm()
    acc.set_device_index(0)
    assert acc.empty(512).device == acc.Device("sim", 0)


def test_each_thread_has_its_own_current_device(two_sims: None) -> None:
    acc.set_device_index(1)
    _warm()
    assert acc.empty(512).device.index == 1
    seen: list[int | None] = []

    def other_thread() -> None:
        seen.append(acc.empty(512).device.index)  # a new thread starts on device 0
        _warm()
        acc.set_device_index(1)
        seen.append(acc.empty(512).device.index)

    worker = threading.Thread(target=other_thread)
    worker.start()
    worker.join()
    assert seen == [0, 1]
    assert acc.empty(512).device.index == 1


def test_switching_accelerators_and_reset(two_sims: None) -> None:
    _warm()
    sim_buffer = acc.empty(512)
    assert sim_buffer.device.type == "sim"
    allocator = sim_buffer.allocator
    sim = acc.backends.get_backend("sim")
    reset_runtime()  # it forgets the sim backend too: put the same one back
    install_backend("sim", sim)
    acc.backends.use("sim")
    fresh = acc.empty(512)
    assert fresh.allocator is not allocator  # the reset forgot the allocators
    assert acc.memory_stats()["allocation.all.current"] == 1


def test_arguments_and_errors_are_the_reference_ones(two_sims: None) -> None:
    _warm()
    assert acc.empty(0).nbytes == 0 and acc.empty(0).ptr == 0
    with pytest.raises(ValueError, match=r"allocation size must be >= 0 bytes, got -1"):
        acc.empty(-1)
    with pytest.raises(TypeError, match=r"allocation size must be an int number of bytes"):
        acc.empty(1.5)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"got 1152921504606846977: no device has that much"):
        acc.empty((1 << 60) + 1)
    assert acc.empty(512, device=1).device.index == 1
    side = acc.Stream(device=1)
    assert acc.empty(512, stream=side).stream == side
    assert acc.memory_stats(0)["allocation.all.current"] == 0  # nothing left allocated


def test_the_compiled_empty_is_in_use_where_the_core_is() -> None:
    # memory/calls picks the compiled empty where the compiled core runs, which falls back to
    # the Python one it imports; on the Python core the Python one is the public function
    if _core.native is None:
        assert calls.native is None and acc.empty is _calls.empty
    else:
        assert calls.native is not None and acc.empty is calls.native.empty
        assert acc.empty is not _calls.empty and acc.empty.__doc__ == _calls.empty.__doc__
    assert acc.memory.empty is acc.empty


def test_threads_taking_turns_each_see_their_own_device(two_sims: None) -> None:
    # The compiled empty(n) remembers the last thread's cache: turns between two threads on
    # different devices must switch it every time.
    acc.set_device_index(1)
    _warm()
    turn = [threading.Event(), threading.Event()]
    seen: list[tuple[str, int | None]] = []

    def other_thread() -> None:
        _warm()  # this thread stays on device 0
        for _ in range(5):
            turn[1].wait()
            turn[1].clear()
            seen.append(("other", acc.empty(512).device.index))
            turn[0].set()

    worker = threading.Thread(target=other_thread)
    worker.start()
    for _ in range(5):
        seen.append(("main", acc.empty(512).device.index))
        turn[1].set()
        turn[0].wait()
        turn[0].clear()
    worker.join()
    assert seen == [("main", 1), ("other", 0)] * 5


def test_buffer_is_one_class_with_the_whole_api(two_sims: None) -> None:
    _warm()
    buffer = acc.empty(512)
    assert type(buffer) is acc.Buffer and isinstance(buffer, acc.Buffer)
    assert acc.Buffer.__doc__ is not None and "A block of device memory" in acc.Buffer.__doc__
    assert (len(buffer), buffer.device, buffer.stream) == (
        512,
        acc.Device("sim", 0),
        acc.current_stream(),
    )
    assert buffer.allocator is acc.memory.get_allocator(0) and buffer.block.address == buffer.ptr
    assert repr(buffer) == f"Buffer(ptr={buffer.ptr:#x}, nbytes=512, device=sim:0)"
    with buffer as same:
        assert same is buffer and not buffer.freed
    assert buffer.freed and repr(buffer).endswith("sim:0 freed)")
    assert acc.memory_stats()["allocation.all.current"] == 0


def test_a_dropped_buffer_is_freed_at_once_and_waits_inside_an_operation(two_sims: None) -> None:
    _warm()
    allocator = acc.memory.get_allocator(0)
    acc.empty(4096)  # dropped: the finaliser frees it now
    assert acc.memory_stats()["allocation.all.current"] == 0
    buffer = acc.empty(4096)
    block, address = buffer.block, buffer.ptr
    with allocator._lock:  # as if the garbage collector ran inside an allocator call
        del buffer
        assert block.allocated and acc.memory_stats()["allocation.all.current"] == 1
    again = acc.empty(4096)  # the next operation ran the free first
    assert again.ptr == address and acc.memory_stats()["allocation.all.current"] == 1


def test_a_buffer_cannot_be_copied_or_pickled(two_sims: None) -> None:
    # A copy would own the same block: its free would free another buffer's memory.
    buffer = acc.empty(512)
    for duplicate in (copy.copy, copy.deepcopy, pickle.dumps):
        with pytest.raises(TypeError, match=r"an accelrt.Buffer owns its memory"):
            duplicate(buffer)
    buffer.free()
    assert acc.memory_stats()["allocation.all.current"] == 0
