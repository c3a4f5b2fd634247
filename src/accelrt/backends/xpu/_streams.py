"""Streams (in-order queues), events (barriers), copies, fills and synchronisation of the
``xpu`` backend."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..._errors import AcceleratorError
from ..._stream_ops import query_queue_event
from .._queue_streams import QueueStreamsEvents
from ._devices import _Devices
from ._queues import XPUEvent, _drop_completed, _XPUStream
from ._sycl import _describe, _memset_lib, _raise_driver_error

if TYPE_CHECKING:
    from dpctl import SyclQueue


class _StreamsEvents(_Devices, QueueStreamsEvents[_XPUStream, XPUEvent]):
    """The ``xpu`` backend's own stream methods (adopted queues among them), events, fills
    and synchronisation; ``QueueStreamsEvents`` has those both queue backends share."""

    _event_type = XPUEvent

    def stream_create(self, index: int, priority: int) -> int:
        """Create an in-order, profiling queue in the device's context; priority is advisory
        (dpctl 0.22 creates no prioritised queues)."""
        state = self._dev(index)
        with self._lock:
            handle = self._next_stream
            self._next_stream += 1
        state.streams[handle] = _XPUStream(state, handle, state.new_queue(), owned=True)
        return handle

    def adopt_queue(self, index: int, queue: SyclQueue) -> int:
        """Give a user's ``dpctl.SyclQueue`` a stream handle of device ``index``.

        Parameters
        ----------
        index : int
            The device the queue must belong to.
        queue : dpctl.SyclQueue
            An in-order queue of that device in the backend's context (``context(index)``).

        Returns
        -------
        int
            The handle (the same for the same queue object every time); the stream does not
            own the queue: destroying it forgets the queue and leaves it alone.

        Raises
        ------
        TypeError
            If ``queue`` is not a ``dpctl.SyclQueue``.
        ValueError
            If the queue is of another device, another context, or is not in-order.
        """
        state = self._dev(index)
        dpctl = state.dpctl
        if not isinstance(queue, dpctl.SyclQueue):
            raise TypeError(f"expected a dpctl.SyclQueue, got {type(queue).__name__}")
        if queue.sycl_device != state.device:
            raise ValueError(
                f"the queue is on SYCL device {_describe(queue.sycl_device)}, not on "
                f"xpu:{index} ({_describe(state.device)}); pass the device it is on"
            )
        if queue.sycl_context != state.context:
            raise ValueError(
                f"the queue's SYCL context {queue.sycl_context!r} is not xpu:{index}'s "
                f"{state.context!r}: memory of one context is not usable in another. Make the "
                "queue with dpctl.SyclQueue(accelrt.backends.get_backend('xpu').context(i), "
                "device, property='in_order')"
            )
        if not queue.is_in_order:
            raise ValueError(
                "the queue is out-of-order; a stream must be an in-order queue (make it with "
                "property='in_order')"
            )
        with self._lock:
            for handle, stream in state.streams.items():
                if stream.queue is queue:
                    return handle
            handle = self._next_stream
            self._next_stream += 1
            state.streams[handle] = _XPUStream(state, handle, queue, owned=False)
        return handle

    def queue(self, index: int, stream: int) -> SyclQueue:
        """Return the ``dpctl.SyclQueue`` behind a stream handle (for native interop).

        Raises ``ValueError`` if ``stream`` is not a live stream of device ``index``.
        """
        return self._stream(index, stream).live_queue()

    def native_stream(self, index: int, stream: int) -> int:
        """Return the ``DPCTLSyclQueueRef`` of a stream's queue as an int (``Stream.
        native_handle``); ``ValueError`` if ``stream`` is not a live stream of device ``index``.
        """
        return int(self.queue(index, stream).addressof_ref())

    def _wait_destroyed(self, found: _XPUStream) -> None:
        """``stream_destroy``'s wait: take the queue (None from then on) and ``queue.wait()``,
        unless the queue is a user's (adopted: only forgotten)."""
        queue, found.queue = found.queue, None
        if found.owned and queue is not None:  # (popped once: it is)
            queue.wait()

    def stream_wait_event(self, index: int, stream: int, event: XPUEvent) -> None:
        """Submit a barrier that waits for the event's marker (``submit_barrier([marker])``)."""
        marker = event.marker
        if marker is not None:
            found = self._stream(index, stream)
            found.last = found.live_queue().submit_barrier([marker])

    # ------------------------------------------------------------------ events
    # True if unrecorded or the marker's execution status is ``complete``: the function itself
    # (compiled in accelrt/_stream_ops.py), which Event.query calls with no Python frame between
    event_query = staticmethod(query_queue_event)

    def event_synchronize(self, event: XPUEvent) -> None:
        """``SyclEvent.wait()`` on the marker; forget the finished copies of its stream."""
        marker = event.marker
        if marker is not None:
            try:
                marker.wait()
            except Exception as exc:
                _raise_driver_error("event_synchronize", exc)
                raise
            stream = event.stream
            if stream is not None and stream.keep:
                _drop_completed(stream.keep, stream.complete)

    def event_elapsed_ms(self, start: XPUEvent, end: XPUEvent) -> float:
        """Difference of the markers' profiled end times (ns), in milliseconds."""
        assert start.marker is not None and end.marker is not None  # Event checks: recorded
        return float(end.marker.profiling_info_end - start.marker.profiling_info_end) / 1e6

    # ------------------------------------------------------------------ copies
    # memcpy_async is QueueStreamsEvents' (_XPUStream's: queue.memcpy_async)
    def memset_async(self, index: int, ptr: int, value: int, nbytes: int, stream: int) -> None:
        """``sycl::queue::memset`` (``DPCTLQueue_Memset``), then a barrier as the stream's last
        command (what ``query`` asks)."""
        found = self._stream(index, stream)
        queue = found.live_queue()
        lib = _memset_lib(found.device.dpctl)
        ref = lib.DPCTLQueue_Memset(queue.addressof_ref(), ptr, value & 0xFF, nbytes)
        if not ref:
            raise AcceleratorError(
                f"SYCL memset of {nbytes} bytes at {ptr:#x} on xpu:{index} failed"
            )
        lib.DPCTLEvent_Delete(ref)  # the in-order queue orders the barrier after it
        found.last = queue.submit_barrier()

    def synchronize(self, index: int) -> None:
        """``queue.wait()`` on every queue of the device."""
        state = self._state.get(index)
        if state is not None:
            state.finish_all()
