"""The per-queue objects of the ``opencl`` backend: an event handle, a stream's ``StreamOps``
(its queue, its last command, the host objects of its copies) and the cached ``cl.SVM``
wrappers copies use."""

from __future__ import annotations

from collections import deque
from types import ModuleType
from typing import TYPE_CHECKING, NoReturn, Protocol

from ..._stream_ops import SVMStreamOps  # the build where there is one (_compiled.py)
from .._queue_streams import QueueEvent, no_stream
from ._cl import (
    _CL_COMPLETE,
    _EXECUTION_STATUS,
    CLEvent,
    SVMMemcpy,
    WaitList,
    _host_array,
    _raise_driver_error,
)

if TYPE_CHECKING:
    import pyopencl


class _CLDevice(Protocol):
    """What the per-queue objects use of a device's state (``_devices._CLDevice``)."""

    cl: ModuleType  # the pyopencl module
    index: int
    svm: dict[tuple[int, int], pyopencl.SVMPointer]  # the cached cl.SVM wrappers (see _svm)
    svm_memcpy: SVMMemcpy

    def marker(self, queue: pyopencl.CommandQueue, wait_for: WaitList, /) -> CLEvent: ...


# the largest number of cached cl.SVM wrappers of device memory per device (see _svm)
_SVM_CACHE_SIZE = 4096

# A copy looks for finished copies of its queue to forget (see _CLStream.rescan) once
# this many more host objects than the last look left are held (at least as many as it left),
# or this many bytes were added since: asking a command's status while the device runs it
# costs about 1.4 us on PoCL, more than the rest of the copy call, so looking at every copy
# would cost more than the copy; these bound the finished host memory held between looks.
_KEEP_SCAN = 32
_KEEP_SCAN_BYTES = 64 << 20


def _svm(state: _CLDevice, ptr: int, nbytes: int) -> pyopencl.SVMPointer:
    """Return a ``cl.SVM`` over ``nbytes`` of device memory at ``ptr``, cached per range.

    Building one costs a ctypes array, a memoryview and a numpy view; a program copies the
    same buffers again and again, so the wrapper is kept until its memory is freed (the cache
    is emptied by ``free``, and when it is full).
    """
    key = (ptr, nbytes)
    svm = state.svm.get(key)
    if svm is None:
        if len(state.svm) >= _SVM_CACHE_SIZE:
            state.svm.clear()
        made: pyopencl.SVMPointer = state.cl.SVM(_host_array(ptr, nbytes))
        svm = state.svm[key] = made
    return svm


def _drop_completed(keep: deque[tuple[CLEvent, memoryview]]) -> None:
    """Forget the host objects of copies at the head of ``keep`` that have finished.

    Safe against another thread trimming the same queue's entries at the same time.
    """
    while keep:
        entry = keep[0]
        if entry[0].get_info(_EXECUTION_STATUS) > _CL_COMPLETE:  # not finished yet
            return
        try:
            taken = keep.popleft()
        except IndexError:  # another thread emptied it
            return
        if taken is not entry:  # another thread took ours first: put back the one we took
            keep.appendleft(taken)


def _finish(stream: _CLStream) -> None:
    """``clFinish`` on a stream's queue (unless it was destroyed meanwhile); it is idle after."""
    queue = stream.queue
    if queue is not None:
        queue.finish()
    stream.last = None


class OpenCLEvent(QueueEvent):
    """An OpenCL event handle: the marker (a ``pyopencl.Event``) of its last recording (None
    before the first) and the ``_CLStream`` it was recorded on (whose finished copies waiting
    on it forgets)."""

    __slots__ = ()
    marker: CLEvent | None
    stream: _CLStream | None


def _no_stream(index: int, stream: int) -> ValueError:
    return no_stream("opencl", index, stream)


class _CLStream(SVMStreamOps):
    """One stream of a device (``StreamOps``): its queue and what accelrt enqueued on it.

    ``OpenCLBackend.stream_ops`` hands out the one object of a live handle, so every ``Stream``
    wrapping the handle shares ``last`` and ``keep`` and no call looks the handle up.
    ``stream_destroy`` sets ``queue`` to None: the methods that enqueue or wait then raise the
    ``ValueError`` of an unknown handle, and ``query`` is True (nothing accelrt enqueued).
    """

    __slots__ = ("device", "handle")  # and the fields of its bases
    queue: pyopencl.CommandQueue | None
    last: CLEvent | None
    keep: deque[tuple[CLEvent, memoryview]]
    views: dict[tuple[int, int], pyopencl.SVMPointer]
    svm_memcpy: SVMMemcpy

    def __init__(self, device: _CLDevice, handle: int, queue: pyopencl.CommandQueue) -> None:
        self.device = device
        self.handle = handle
        self.queue = queue
        # the last command this backend enqueued on the queue, None once finished
        self.last = None
        # the (event, host object) pairs of the queue's async host copies in enqueue order,
        # kept until the copy completes (an in-order queue completes them in that order)
        self.keep = deque()
        self.views = device.svm
        self.wrap_host = device.cl.SVM
        self.svm_memcpy = device.svm_memcpy
        self.scan_at = _KEEP_SCAN  # the length of keep at which a copy forgets finished ones
        self.scan_bytes = _KEEP_SCAN_BYTES
        self.unscanned = 0  # bytes of host objects added to keep since it was last looked at
        self.status_info = _EXECUTION_STATUS  # what marker_done reads of an event, and
        self.complete = _CL_COMPLETE  # the status of a finished one

    # query and synchronize: QueueStreamOps's, marker_done SVMStreamOps' (compiled where they
    # can be), with these two
    def missing(self) -> NoReturn:
        """Raise the ``ValueError`` of an unknown handle (the stream was destroyed)."""
        raise _no_stream(self.device.index, self.handle)

    def failed(self, call: str, exc: Exception) -> None:
        """Raise ``AcceleratorError`` for a PyOpenCL error in ``call``."""
        _raise_driver_error(call, exc)

    def record(self, event: QueueEvent) -> None:
        """Enqueue a marker on the queue: the new marker of the event (an ``OpenCLEvent``)."""
        queue = self.live_queue()
        try:
            event.marker = self.last = self.device.marker(queue, None)
            event.stream = self
        except Exception as exc:
            _raise_driver_error("event_record", exc)
            raise

    # memcpy_async: _SVMStream's (compiled where it can be), with these two
    def device_view(self, address: int, nbytes: int) -> pyopencl.SVMPointer:
        """The ``cl.SVM`` of device memory, made and cached (``_svm``)."""
        return _svm(self.device, address, nbytes)

    def rescan(self, keep: deque[tuple[CLEvent, memoryview]]) -> None:
        """Forget the host objects of the finished copies at the head of ``keep``.

        A copy of host memory calls this once ``keep`` holds ``scan_at`` entries or
        ``_KEEP_SCAN_BYTES`` were added since the last look. ``scan_at`` becomes what this
        look left plus as many again, and at least ``_KEEP_SCAN`` more: a look that finds the
        queue's oldest copy still running (a status query costing more than a copy call) comes
        once per ``_KEEP_SCAN`` copies at most, and the finished host objects held beyond those
        in flight at the last look are no more than those (or ``_KEEP_SCAN``), and no more than
        ``_KEEP_SCAN_BYTES``. ``synchronize`` and waiting for an event recorded after the
        copies forget them too.
        """
        _drop_completed(keep)
        self.scan_at = len(keep) + max(_KEEP_SCAN, len(keep))
        self.unscanned = 0
