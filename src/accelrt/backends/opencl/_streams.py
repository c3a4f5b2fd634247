"""Streams (in-order queues), events (markers), copies, fills and synchronisation of the
``opencl`` backend."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ._cl import _CL_COMPLETE, _EXECUTION_STATUS, _import_cl, _raise_driver_error
from ._devices import _Devices
from ._queues import OpenCLEvent, _CLStream, _drop_completed, _finish, _no_stream, _svm

if TYPE_CHECKING:
    import pyopencl


class _StreamsEvents(_Devices):
    """Streams, events, copies, fills and synchronisation of the ``opencl`` backend."""

    def stream_create(self, index: int, priority: int) -> int:
        """Create an in-order, profiling-enabled command queue. Priority is advisory only."""
        state = self._dev(index)
        with self._lock:
            handle = self._next_stream
            self._next_stream += 1
        state.streams[handle] = state.new_stream(handle)
        return handle

    def stream_ops(self, index: int, stream: int) -> _CLStream | None:
        """Return the stream's ``StreamOps`` (one object per handle), None for an unknown one."""
        return self._dev(index).streams.get(stream)

    def _stream(self, index: int, stream: int) -> _CLStream:
        """Return a live stream of device ``index``; ``ValueError`` if there is none."""
        found = self._dev(index).streams.get(stream)
        if found is None:
            raise _no_stream(index, stream)
        return found

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

    def stream_destroy(self, index: int, stream: int) -> None:
        """Finish and drop the queue."""
        state = self._state.get(index)
        if state is None:
            return
        found = state.streams.pop(stream, None)
        if found is not None:
            queue, found.queue = found.queue, None
            if queue is not None:  # (popped once: it is)
                queue.finish()
            found.last = None
            found.keep.clear()

    def stream_query(self, index: int, stream: int) -> bool:
        """Whether the last command accelrt enqueued on the queue has completed (True for a
        handle that is not a live stream: nothing enqueued). See ``_CLStream.query``."""
        state = self._state.get(index)
        found = state.streams.get(stream) if state is not None else None
        return found is None or found.query()

    def stream_synchronize(self, index: int, stream: int) -> None:
        """``clFinish`` on the queue."""
        self._stream(index, stream).synchronize()

    def stream_wait_event(self, index: int, stream: int, event: OpenCLEvent) -> None:
        """Enqueue a barrier that waits for the event's marker."""
        if event.marker is not None:
            found = self._stream(index, stream)
            found.last = _import_cl().enqueue_barrier(found.queue, wait_for=[event.marker])

    # events
    def event_create(self, index: int, timing: bool) -> OpenCLEvent:
        """Return an unrecorded event (markers are made when it is recorded)."""
        return OpenCLEvent(index, timing)

    def event_record(self, event: OpenCLEvent, index: int, stream: int) -> None:
        """Enqueue a marker on the stream's queue."""
        self._stream(index, stream).record(event)

    def event_destroy(self, event: OpenCLEvent) -> None:
        """Drop the event's marker (pyopencl releases the ``cl_event`` with it)."""
        event.marker = None

    def event_query(self, event: OpenCLEvent) -> bool:
        """True if unrecorded or the marker has completed."""
        marker = event.marker
        if marker is None:
            return True
        try:
            status: int = marker.get_info(_EXECUTION_STATUS)
        except Exception as exc:
            _raise_driver_error("event_query", exc)
            raise
        return status == _CL_COMPLETE

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

    # copies
    def memcpy_async(
        self, index: int, dst: int | memoryview, src: int | memoryview, nbytes: int, stream: int
    ) -> None:
        """``clEnqueueSVMMemcpy``, non-blocking; host memory is kept alive until it completes.

        See ``_CLStream``'s ``memcpy_async`` (its base's) and ``rescan``.
        """
        self._stream(index, stream).memcpy_async(dst, src, nbytes)

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
