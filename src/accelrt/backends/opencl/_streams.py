"""Streams (in-order queues), events (markers), copies, fills and synchronisation of the
``opencl`` backend."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..._stream_ops import query_queue_event  # the build where there is one (_compiled.py)
from .._queue_streams import QueueStreamsEvents
from ._cl import _import_cl, _raise_driver_error
from ._devices import _Devices
from ._queues import OpenCLEvent, _CLStream, _drop_completed, _finish, _no_stream, _svm

if TYPE_CHECKING:
    import pyopencl


class _StreamsEvents(_Devices, QueueStreamsEvents[_CLStream, OpenCLEvent]):
    """Streams, events, copies, fills and synchronisation of the ``opencl`` backend, on the
    queue backends' shared methods (``QueueStreamsEvents``)."""

    _event_type = OpenCLEvent

    def stream_create(self, index: int, priority: int) -> int:
        """Create an in-order, profiling-enabled command queue. Priority is advisory only."""
        state = self._dev(index)
        with self._lock:
            handle = self._next_stream
            self._next_stream += 1
        state.streams[handle] = state.new_stream(handle)
        return handle

    def queue(self, index: int, stream: int) -> pyopencl.CommandQueue:
        """Return the ``pyopencl.CommandQueue`` behind a stream handle (for native interop).

        Raises
        ------
        ValueError
            If ``stream`` is not a live stream of device ``index``.
        """
        queue = self._stream(index, stream).queue
        if queue is None:  # destroyed by another thread meanwhile
            raise _no_stream(index, stream)
        return queue

    def native_stream(self, index: int, stream: int) -> int:
        """Return the ``cl_command_queue`` behind a stream handle, as an int (``Stream.
        native_handle``); ``ValueError`` if ``stream`` is not a live stream of device ``index``.
        """
        return int(self.queue(index, stream).int_ptr)

    def _wait_destroyed(self, found: _CLStream) -> None:
        """``stream_destroy``'s wait: take the queue (None from then on) and finish it
        (``clFinish``)."""
        queue, found.queue = found.queue, None
        if queue is not None:  # (popped once: it is)
            queue.finish()

    def stream_wait_event(self, index: int, stream: int, event: OpenCLEvent) -> None:
        """Enqueue a barrier that waits for the event's marker."""
        if event.marker is not None:
            found = self._stream(index, stream)
            found.last = _import_cl().enqueue_barrier(found.queue, wait_for=[event.marker])

    # events
    # True if unrecorded or the marker has completed: the function itself (compiled in
    # accelrt/_stream_ops.py; the stream's marker_done reads the status), which Event.query
    # calls with no Python frame between
    event_query = staticmethod(query_queue_event)

    def event_synchronize(self, event: OpenCLEvent) -> None:
        """``clWaitForEvents`` on the marker; forget the host objects of the stream's copies
        that have finished (those before the marker have)."""
        marker = event.marker
        if marker is not None:
            try:
                marker.wait()
                stream = event.stream  # recorded with the marker
                if stream is not None and stream.keep:
                    _drop_completed(stream.keep)
            except Exception as exc:
                _raise_driver_error("event_synchronize", exc)
                raise

    def event_elapsed_ms(self, start: OpenCLEvent, end: OpenCLEvent) -> float:
        """Difference of the markers' profiled end times, in milliseconds."""
        assert start.marker is not None and end.marker is not None  # Event checks: recorded
        return float(end.marker.profile.end - start.marker.profile.end) / 1e6

    # copies: memcpy_async is QueueStreamsEvents' (_CLStream's memcpy_async, its base's, and
    # rescan: clEnqueueSVMMemcpy)
    def memset_async(self, index: int, ptr: int, value: int, nbytes: int, stream: int) -> None:
        """``clEnqueueSVMMemFill`` with a one-byte pattern."""
        import numpy as np

        found = self._stream(index, stream)
        state = found.device
        found.last = state.cl.enqueue_svm_memfill(
            found.queue, _svm(state, ptr, nbytes), np.uint8(value)
        )

    def synchronize(self, index: int) -> None:
        """``clFinish`` on every queue of the device."""
        state = self._state.get(index)
        if state is None:
            return
        streams = list(state.streams.values())  # a copy: another thread may add a stream
        for stream in streams:
            _finish(stream)
        for stream in streams:
            if stream.keep:
                _drop_completed(stream.keep)
