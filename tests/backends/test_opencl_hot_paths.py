"""The OpenCL backend's per-call paths (streams, events, copies) keep their guarantees.

Copies keep pageable host memory alive until the copy has run and no longer; cached ``cl.SVM``
wrappers of device memory go when the memory does; PyOpenCL's errors on the inline-mapped paths
become ``AcceleratorError`` and other errors pass through.
"""

from __future__ import annotations

import gc
import weakref
from typing import Any

import numpy as np
import pytest

import accelrt as acc
from accelrt.backends import get_backend
from accelrt.backends.opencl import _KEEP_SCAN

MiB = 1 << 20


class _Array(np.ndarray):
    """A numpy array that can be weakly referenced."""


@pytest.fixture
def cl(opencl: str) -> Any:
    return pytest.importorskip("pyopencl")


def _gate(cl: Any, stream: acc.Stream) -> Any:
    """Block ``stream``'s queue behind a user event; open it with ``_open``."""
    backend = get_backend("opencl")
    gate = cl.UserEvent(backend.context(0))  # type: ignore[attr-defined]
    cl.enqueue_barrier(backend.queue(0, stream.handle), wait_for=[gate])  # type: ignore[attr-defined]
    return gate


def _open(cl: Any, gate: Any) -> None:
    gate.set_status(cl.command_execution_status.COMPLETE)


def test_host_source_lives_until_the_copy_ran_then_goes(cl: Any) -> None:
    stream = acc.Stream()
    gate = _gate(cl, stream)
    buf = acc.empty(MiB, stream=stream)
    host = np.full(MiB, 5, np.uint8).view(_Array)
    alive = weakref.ref(host)
    acc.copy_(buf, host, stream=stream)
    del host
    gc.collect()
    assert alive() is not None  # queued behind the gate: the copy has not read it yet
    assert not stream.query()
    _open(cl, gate)
    stream.synchronize()
    gc.collect()
    assert alive() is None  # forgotten once the copy ran
    out = np.zeros(MiB, np.uint8)
    acc.copy_(out, buf, stream=stream)
    stream.synchronize()
    assert (out == 5).all()
    buf.free()


def test_finished_copies_are_forgotten_by_later_copies(opencl: str) -> None:
    stream = acc.Stream()
    buf = acc.empty(4096, stream=stream)
    refs = []
    for value in range(50):
        host = np.full(4096, value, np.uint8).view(_Array)
        refs.append(weakref.ref(host))
        acc.copy_(buf, host, stream=stream)
        stream.record_event().synchronize()  # done, but the stream was never synchronized
    del host
    gc.collect()
    assert sum(ref() is not None for ref in refs) <= 1  # at most the last one is still held
    out = np.zeros(4096, np.uint8)
    acc.copy_(out, buf, stream=stream)
    stream.synchronize()
    assert (out == 49).all()
    buf.free()


def test_device_copies_reuse_wrappers_until_the_memory_is_freed(opencl: str) -> None:
    backend = get_backend("opencl")
    stream = acc.Stream()
    a, b = acc.empty(MiB, stream=stream), acc.empty(MiB, stream=stream)
    acc.copy_(a, np.full(MiB, 3, np.uint8), stream=stream)
    for _ in range(3):
        acc.copy_(b, a, stream=stream)
    state = backend._state[0]  # type: ignore[attr-defined]
    assert set(state.svm) == {(a.ptr, MiB), (b.ptr, MiB)}
    a.free()
    b.free()
    acc.empty_cache()  # segments go back to the driver: their wrappers go too
    assert not state.svm
    c = acc.empty(MiB, stream=stream)
    acc.copy_(c, np.full(MiB, 9, np.uint8), stream=stream)
    out = np.zeros(MiB, np.uint8)
    acc.copy_(out, c, stream=stream)
    stream.synchronize()
    assert (out == 9).all()
    c.free()


class _FailingMarker:
    """Stands for a ``cl.Event`` whose driver calls fail."""

    def __init__(self, error: BaseException) -> None:
        self.error = error

    def get_info(self, param: int) -> int:
        raise self.error

    def wait(self) -> None:
        raise self.error


def test_driver_errors_are_accelerator_errors(cl: Any) -> None:
    stream = acc.Stream()
    event = stream.record_event()
    event.synchronize()
    event._handle.marker = _FailingMarker(cl.RuntimeError("clGetEventInfo failed: INVALID_EVENT"))
    with pytest.raises(acc.AcceleratorError, match=r"^OpenCL event_query failed: clGetEventInfo"):
        event.query()
    with pytest.raises(acc.AcceleratorError, match=r"^OpenCL event_synchronize failed: "):
        event.synchronize()
    ops = get_backend("opencl")._state[0].streams[stream.handle]  # type: ignore[attr-defined]
    ops.last = event._handle.marker
    with pytest.raises(acc.AcceleratorError, match=r"^OpenCL stream_query failed: ") as info:
        stream.query()
    assert isinstance(info.value.__cause__, cl.Error)
    event._handle.marker = _FailingMarker(ZeroDivisionError())
    with pytest.raises(ZeroDivisionError):  # not PyOpenCL's: unchanged
        event.query()
    ops.last = None


def test_unknown_stream_handle_is_a_value_error(opencl: str) -> None:
    stream = acc.Stream.from_handle(0x3039)
    match = r"^opencl:0 has no stream with handle 0x3039"
    with pytest.raises(ValueError, match=match):
        stream.synchronize()
    with pytest.raises(ValueError, match=match):
        acc.Event().record(stream)
    with pytest.raises(ValueError, match=match):
        acc.copy_(acc.empty(16), np.zeros(16, np.uint8), stream=stream)
    assert stream.query()  # nothing accelrt enqueued on it


def test_streams_wrapping_one_handle_share_its_last_command_and_host_objects(cl: Any) -> None:
    stream = acc.Stream()
    other = acc.Stream.from_handle(stream.handle)
    assert other._ops is stream._ops  # one StreamOps per handle
    assert acc.Stream.from_handle(0)._ops is acc.current_stream()._ops
    gate = _gate(cl, stream)
    buf = acc.empty(MiB, stream=stream)
    host = np.full(MiB, 7, np.uint8).view(_Array)
    alive = weakref.ref(host)
    acc.copy_(buf, host, stream=other)  # enqueued through the second wrapper
    del host
    assert not stream.query() and not other.query()  # both see the copy behind the gate
    _open(cl, gate)
    stream.synchronize()  # forgets the host object the copy through `other` kept
    gc.collect()
    assert alive() is None and other.query()
    buf.free()


def test_a_destroyed_stream_fails_as_an_unknown_handle_did(cl: Any) -> None:
    stream = acc.Stream()
    handle = stream.handle
    wrapper = acc.Stream.from_handle(handle)
    event = wrapper.record_event()
    buf = acc.empty(16)
    del stream  # the owner destroys the queue; the wrapper keeps the StreamOps
    gc.collect()
    match = rf"^opencl:0 has no stream with handle {handle:#x}: it was destroyed"
    for later in (wrapper, acc.Stream.from_handle(handle)):  # bound before, and after
        with pytest.raises(ValueError, match=match):
            later.synchronize()
        with pytest.raises(ValueError, match=match):
            event.record(later)
        with pytest.raises(ValueError, match=match):
            acc.copy_(buf, np.zeros(16, np.uint8), stream=later)
        assert later.query()  # nothing accelrt enqueued is pending
    buf.free()


@pytest.mark.parametrize(("nbytes", "held"), [(4096, _KEEP_SCAN), (16 << 20, 4)])
def test_copies_alone_forget_finished_copies(opencl: str, nbytes: int, held: int) -> None:
    """No synchronize and no event: later copies forget the host objects of finished ones, so
    a loop of copies holds no more than ``_KEEP_SCAN`` finished arrays, nor more than
    ``_KEEP_SCAN_BYTES`` of them (64 MiB: four of 16 MiB)."""
    stream = acc.Stream()
    queue = get_backend("opencl").queue(0, stream.handle)  # type: ignore[attr-defined]
    buf = acc.empty(nbytes, stream=stream)
    refs = []
    for value in range(3 * _KEEP_SCAN):
        host = np.full(nbytes, value, np.uint8).view(_Array)
        refs.append(weakref.ref(host))
        acc.copy_(buf, host, stream=stream)
        queue.finish()  # natively: accelrt does not see that the copy ran
    del host
    gc.collect()
    assert 1 <= sum(ref() is not None for ref in refs) <= held
    stream.synchronize()
    gc.collect()
    assert all(ref() is None for ref in refs)
    buf.free()


def test_svm_memcpy_through_enqueue_copy_where_the_extension_lacks_it(cl: Any) -> None:
    """The stand-in for PyOpenCL's ``_enqueue_svm_memcpy`` copies what that call copies."""
    from accelrt.backends.opencl import _svm_memcpy_by_enqueue_copy

    stream = acc.Stream()
    queue = get_backend("opencl").queue(0, stream.handle)  # type: ignore[attr-defined]
    buf = acc.empty(4096, stream=stream)
    host = (np.arange(4096) % 251).astype(np.uint8)
    event = _svm_memcpy_by_enqueue_copy(
        cl, queue, False, cl.SVM(buf.numpy()), cl.SVM(host), None, 4096
    )
    event.wait()
    assert buf.numpy().tobytes() == host.tobytes()
