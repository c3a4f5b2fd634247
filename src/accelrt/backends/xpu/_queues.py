"""The per-queue objects of the ``xpu`` backend: an event handle and a stream's
``StreamOps`` (its in-order queue, its last command, the host objects of its copies)."""

from __future__ import annotations

from collections import deque
from types import ModuleType
from typing import TYPE_CHECKING, NoReturn, Protocol

from ..._stream_ops import NO_VIEW, USMStreamOps  # the build where there is one (_compiled.py)
from .._queue_streams import QueueEvent, no_stream
from ._sycl import _raise_driver_error

if TYPE_CHECKING:
    from dpctl import SyclEvent, SyclQueue, event_status_type
    from dpctl.memory import MemoryUSMDevice


class _XPUDevice(Protocol):
    """What the per-queue objects use of a device's state (``_devices._XPUDevice``)."""

    dpctl: ModuleType  # the dpctl module
    index: int
    complete: event_status_type  # dpctl.event_status_type.complete
    views: dict[tuple[int, int], MemoryUSMDevice]

    def view(self, ptr: int, nbytes: int) -> MemoryUSMDevice: ...


# a copy of host memory forgets the finished ones at the head of its queue's list once it holds
# this many (see _XPUStream.rescan)
_KEEP_SCAN = 32


class XPUEvent(QueueEvent):
    """An XPU event handle: the ``dpctl.SyclEvent`` of its last recording (a barrier; None
    before the first) and the ``_XPUStream`` it was recorded on."""

    __slots__ = ()
    marker: SyclEvent | None
    stream: _XPUStream | None


def _no_stream(index: int, stream: int) -> ValueError:
    return no_stream("xpu", index, stream)


class _XPUStream(USMStreamOps):
    """One stream of a device (``StreamOps``): its in-order queue and the last command accelrt
    submitted to it (None when known finished), and the host objects of its copies in flight.

    ``query``, ``synchronize`` and ``memcpy_async`` are ``USMStreamOps``'
    (accelrt/_stream_ops.py, compiled where it can be), with the hooks below.
    ``stream_destroy`` sets ``queue`` to None: the methods that submit or wait then raise the
    ``ValueError`` of an unknown handle, and ``query`` is True.
    """

    __slots__ = ("device", "handle", "owned")  # and the fields of its bases
    queue: SyclQueue | None
    last: SyclEvent | None
    keep: deque[tuple[SyclEvent, memoryview]]
    views: dict[tuple[int, int], MemoryUSMDevice]

    def __init__(self, device: _XPUDevice, handle: int, queue: SyclQueue, owned: bool) -> None:
        self.device = device
        self.handle = handle
        self.queue = queue
        self.owned = owned  # False for a queue adopted from the user (Stream.from_handle)
        self.last = None
        # the (event, host object) pairs of the queue's async host copies in submission
        # order, kept until the copy completes (an in-order queue completes them in order)
        self.keep = deque()
        self.views = device.views  # the device's cache, emptied in place (never replaced)
        self.last_view = NO_VIEW  # reset with views (_XPUDevice.forget_views)
        self.scan_at = _KEEP_SCAN
        self.complete = device.complete

    def record(self, event: QueueEvent) -> None:
        """Submit a barrier: the new marker of the event (an ``XPUEvent``)."""
        queue = self.live_queue()
        try:
            event.marker = self.last = queue.submit_barrier()
        except Exception as exc:
            _raise_driver_error("event_record", exc)
            raise
        event.stream = self

    # query, synchronize and memcpy_async: USMStreamOps' (compiled where it can be), with these
    def missing(self) -> NoReturn:
        """Raise the ``ValueError`` of an unknown handle (the stream was destroyed)."""
        raise _no_stream(self.device.index, self.handle)

    def failed(self, call: str, exc: Exception) -> None:
        """Raise ``AcceleratorError`` for a dpctl (SYCL) error in ``call``."""
        _raise_driver_error(call, exc)

    def device_view(self, address: int, nbytes: int) -> MemoryUSMDevice:
        """The dpctl ``MemoryUSMDevice`` of device memory, made and cached (``_XPUDevice.view``)."""
        return self.device.view(address, nbytes)

    def rescan(self, keep: deque[tuple[SyclEvent, memoryview]]) -> None:
        """Forget the host objects of the finished copies at the head of ``keep`` (a copy of
        host memory calls this once ``keep`` holds ``_KEEP_SCAN`` entries)."""
        _drop_completed(keep, self.complete)


def _drop_completed(keep: deque[tuple[SyclEvent, memoryview]], complete: event_status_type) -> None:
    """Forget the host objects of the finished copies at the head of ``keep``."""
    while keep:
        entry = keep[0]
        if entry[0].execution_status != complete:
            return
        try:
            taken = keep.popleft()
        except IndexError:
            return
        if taken is not entry:
            keep.appendleft(taken)
