"""The per-queue objects of the ``xpu`` backend: an event handle and a stream's
``StreamOps`` (its in-order queue, its last command, the host objects of its copies)."""

from __future__ import annotations

from collections import deque
from types import ModuleType
from typing import TYPE_CHECKING, Protocol

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
# this many (see _XPUStream.memcpy_async)
_KEEP_SCAN = 32


class XPUEvent(QueueEvent):
    """An XPU event handle: the ``dpctl.SyclEvent`` of its last recording (a barrier; None
    before the first) and the ``_XPUStream`` it was recorded on."""

    __slots__ = ()
    marker: SyclEvent | None
    stream: _XPUStream | None


_complete: list[event_status_type] = []  # dpctl.event_status_type.complete, once dpctl is imported


def _no_stream(index: int, stream: int) -> ValueError:
    return no_stream("xpu", index, stream)


class _XPUStream:
    """One stream of a device (``StreamOps``): its in-order queue and the last command accelrt
    submitted to it (None when known finished), and the host objects of its copies in flight.

    ``stream_destroy`` sets ``queue`` to None: the methods that submit or wait then raise the
    ``ValueError`` of an unknown handle, and ``query`` is True.
    """

    __slots__ = ("complete", "device", "handle", "keep", "last", "owned", "queue")

    def __init__(self, device: _XPUDevice, handle: int, queue: SyclQueue, owned: bool) -> None:
        self.device = device
        self.handle = handle
        self.queue: SyclQueue | None = queue
        self.owned = owned  # False for a queue adopted from the user (Stream.from_handle)
        self.last: SyclEvent | None = None
        self.keep: deque[tuple[SyclEvent, memoryview]] = deque()
        self.complete = device.complete

    def live_queue(self) -> SyclQueue:
        """The queue; the ``ValueError`` of an unknown handle once the stream was destroyed."""
        queue = self.queue
        if queue is None:
            raise _no_stream(self.device.index, self.handle)
        return queue

    def query(self) -> bool:
        """Whether the last command accelrt submitted has completed (work submitted directly
        to the native queue is not seen; record an event after it)."""
        last = self.last
        if last is None:
            return True
        try:
            done: bool = last.execution_status == self.complete
        except Exception as exc:
            _raise_driver_error("stream_query", exc)
            raise
        return done

    def synchronize(self) -> None:
        """``queue.wait()``; forget the host objects of its copies (all have run)."""
        queue = self.queue
        if queue is None:
            raise _no_stream(self.device.index, self.handle)
        done = self.keep
        if done:
            self.keep = deque()
        try:
            queue.wait()
        except Exception as exc:
            if done:
                done.extend(self.keep)
                self.keep = done
            _raise_driver_error("stream_synchronize", exc)
            raise
        self.last = None

    def record(self, event: QueueEvent) -> None:
        """Submit a barrier: the new marker of the event (an ``XPUEvent``)."""
        queue = self.queue
        if queue is None:
            raise _no_stream(self.device.index, self.handle)
        try:
            event.marker = self.last = queue.submit_barrier()
        except Exception as exc:
            _raise_driver_error("event_record", exc)
            raise
        event.stream = self

    def memcpy_async(self, dst: int | memoryview, src: int | memoryview, nbytes: int) -> None:
        """``queue.memcpy_async``; host memory is kept alive until the copy completes."""
        queue = self.queue
        if queue is None:
            raise _no_stream(self.device.index, self.handle)
        views = self.device.views
        host: memoryview | None = None
        try:
            if isinstance(dst, int):
                target = views.get((dst, nbytes))
                if target is None:
                    target = self.device.view(dst, nbytes)
            else:
                target = host = dst
            if isinstance(src, int):
                source = views.get((src, nbytes))
                if source is None:
                    source = self.device.view(src, nbytes)
            else:
                source = host = src
            event = self.last = queue.memcpy_async(target, source, nbytes)
        except Exception as exc:
            _raise_driver_error("memcpy_async", exc)
            raise
        if host is not None:
            keep = self.keep
            if len(keep) >= _KEEP_SCAN:
                _drop_completed(keep, self.complete)
            keep.append((event, host))


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
