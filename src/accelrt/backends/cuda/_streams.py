"""CUDA streams and events, and the work ordered on streams: copies (host objects kept alive
until an event recorded after the copy completes), memsets and device synchronisation."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ._devices import _CUDADevice, _Devices
from ._driver import CUDA_ERROR_NOT_READY, CUDA_SUCCESS

if TYPE_CHECKING:
    from cuda.bindings.driver import CUevent, CUstream

MAX_DEFAULT_STREAM = 2
"""Stream handles up to this one (0 legacy default, 1 ``CU_STREAM_LEGACY``, 2
``CU_STREAM_PER_THREAD``) name the current context's default streams; larger ones are
``CUstream`` pointers that carry their own context."""

MAX_IDLE_EVENTS = 64
"""Events kept for reuse per device by the host-copy keep-alive (the rest are destroyed)."""


class CUDAEvent:
    """A CUDA event handle: the device, the native ``CUevent`` and whether it times.

    Attributes
    ----------
    device : int
        The accelrt device index the event belongs to.
    handle : CUevent
        The driver's event; ``int(event.handle)`` is the native ``CUevent`` value.
    timing : bool
        Whether it was created with timing (no ``CU_EVENT_DISABLE_TIMING``).
    """

    __slots__ = ("device", "handle", "timing")

    def __init__(self, device: int, handle: CUevent, timing: bool) -> None:
        self.device = device
        self.handle = handle
        self.timing = timing

    def __repr__(self) -> str:
        return (
            f"CUDAEvent(device={self.device}, handle={int(self.handle):#x}, timing={self.timing})"
        )


def _host_address(view: memoryview, nbytes: int) -> int:
    """The address of the first byte of a C-contiguous host buffer of at least ``nbytes``."""
    import numpy as np

    array = np.frombuffer(view, dtype=np.uint8)
    if array.size < nbytes:
        raise ValueError(f"host buffer has {array.size} bytes, {nbytes} to copy")
    return int(array.__array_interface__["data"][0])


class _StreamsEvents(_Devices):
    """Streams, events, copies, memsets and ``synchronize`` of the ``cuda`` backend."""

    def stream_create(self, index: int, priority: int) -> int:
        """``cuStreamCreateWithPriority(CU_STREAM_NON_BLOCKING, priority)``.

        Returns the native ``CUstream`` as an int. Lower priorities are more urgent; the driver
        clamps them to ``cuCtxGetStreamPriorityRange``.

        Raises ``CUDAError`` if the driver fails.
        """
        state = self._dev(index)
        flags = int(self.driver.CUstream_flags.CU_STREAM_NON_BLOCKING)
        handle = self._call("cuStreamCreateWithPriority", index, flags, priority)
        stream = int(handle)
        state.streams[stream] = handle
        return stream

    def stream_priority_range(self, index: int) -> tuple[int, int]:
        """``cuCtxGetStreamPriorityRange``: ``(least, greatest)``, e.g. ``(0, -5)``."""
        least, greatest = self._call("cuCtxGetStreamPriorityRange", index)
        return int(least), int(greatest)

    def stream_destroy(self, index: int, stream: int) -> None:
        """``cuStreamDestroy`` of a stream from ``stream_create``; other handles are left alone.

        The driver releases the stream once its queued work has completed.
        """
        state = self._dev(index)
        handle = state.streams.pop(stream, None)
        if handle is not None:
            self._call("cuStreamDestroy", index, handle)

    def stream_query(self, index: int, stream: int) -> bool:
        """``cuStreamQuery``: True when all work on the stream has completed."""
        state = self._dev(index)
        code = int(self.driver.cuStreamQuery(self._stream(state, stream))[0])
        if code == CUDA_ERROR_NOT_READY:
            return False
        if code != CUDA_SUCCESS:
            raise self._error("cuStreamQuery", code, index)
        return True

    def stream_synchronize(self, index: int, stream: int) -> None:
        """``cuStreamSynchronize``: block until the stream's work has completed."""
        state = self._dev(index)
        self._call("cuStreamSynchronize", index, self._stream(state, stream))
        self._prune_keepalive(index, state)

    def stream_wait_event(self, index: int, stream: int, event: CUDAEvent) -> None:
        """``cuStreamWaitEvent``: later work on ``stream`` waits for ``event`` (no host wait)."""
        state = self._dev(index)
        self._call("cuStreamWaitEvent", index, self._stream(state, stream), event.handle, 0)

    def native_event(self, event: CUDAEvent) -> int:
        """The event's ``CUevent`` as an int (``Event.event_id``)."""
        return int(event.handle)

    def event_create(self, index: int, timing: bool) -> CUDAEvent:
        """``cuEventCreate``, with ``CU_EVENT_DISABLE_TIMING`` unless ``timing``."""
        flags = self.driver.CUevent_flags
        flag = flags.CU_EVENT_DEFAULT if timing else flags.CU_EVENT_DISABLE_TIMING
        return CUDAEvent(index, self._call("cuEventCreate", index, int(flag)), timing)

    def event_record(self, event: CUDAEvent, index: int, stream: int) -> None:
        """``cuEventRecord`` on ``stream`` (with the device's context current only for the
        default streams: a created stream and the event carry their own)."""
        if stream > MAX_DEFAULT_STREAM:
            state, previous = self._dev(index), None
        else:
            state, previous = self._enter(index)
        try:
            self._call("cuEventRecord", index, event.handle, self._stream(state, stream))
        finally:
            self._leave(index, previous)

    def event_destroy(self, event: CUDAEvent) -> None:
        """``cuEventDestroy``; the driver releases it once its recorded work completes."""
        self._call("cuEventDestroy", event.device, event.handle)

    def event_query(self, event: CUDAEvent) -> bool:
        """``cuEventQuery``: True when the recorded work has completed (True if unrecorded)."""
        code = int(self.driver.cuEventQuery(event.handle)[0])
        if code == CUDA_ERROR_NOT_READY:
            return False
        if code != CUDA_SUCCESS:
            raise self._error("cuEventQuery", code, event.device)
        return True

    def event_synchronize(self, event: CUDAEvent) -> None:
        """``cuEventSynchronize``: block until the recorded work has completed."""
        self._call("cuEventSynchronize", event.device, event.handle)

    def event_elapsed_ms(self, start: CUDAEvent, end: CUDAEvent) -> float:
        """``cuEventElapsedTime``: milliseconds from ``start`` to ``end`` (about 0.5 us steps).

        Raises ``CUDAError`` (``CUDA_ERROR_INVALID_HANDLE``) if either event lacks timing or was
        not recorded, ``CUDA_ERROR_NOT_READY`` if either has not completed.
        """
        return float(self._call("cuEventElapsedTime", start.device, start.handle, end.handle))

    def _keep_alive(self, index: int, state: _CUDADevice, stream: CUstream, host: object) -> None:
        """Record an event after a host copy on ``stream`` and keep ``host`` until it completes."""
        with self._lock:
            self._prune_keepalive(index, state)
            if state.idle_events:
                event = state.idle_events.pop()
            else:
                flag = int(self.driver.CUevent_flags.CU_EVENT_DISABLE_TIMING)
                event = self._call("cuEventCreate", index, flag)
            try:
                self._call("cuEventRecord", index, event, stream)
            except BaseException:
                state.idle_events.append(event)
                raise
            state.keepalive.append((event, host))

    def _prune_keepalive(self, index: int, state: _CUDADevice, done: bool = False) -> None:
        """Drop host objects whose copies have completed (all of them when ``done``)."""
        with self._lock:
            while state.keepalive:
                event = state.keepalive[0][0]
                if not done:
                    code = int(self.driver.cuEventQuery(event)[0])
                    if code == CUDA_ERROR_NOT_READY:
                        return
                    if code != CUDA_SUCCESS:
                        raise self._error("cuEventQuery", code, index)
                state.keepalive.popleft()
                if len(state.idle_events) < MAX_IDLE_EVENTS:
                    state.idle_events.append(event)
                else:
                    self._call("cuEventDestroy", index, event)

    def memcpy_async(
        self, index: int, dst: int | memoryview, src: int | memoryview, nbytes: int, stream: int
    ) -> None:
        """Copy ``nbytes`` on ``stream``, asynchronously with respect to the host.

        ``cuMemcpyDtoDAsync`` between device addresses, ``cuMemcpyHtoDAsync`` from a host
        ``memoryview``, ``cuMemcpyDtoHAsync`` into a writable one. The host object is kept
        alive until an event recorded after the copy completes.

        Raises
        ------
        ValueError
            If neither side is a device address, or a host buffer is shorter than ``nbytes``.
        CUDAError
            If the driver fails.

        Notes
        -----
        With pageable host memory the driver stages the copy and returns once the host bytes
        are safe (host to device) or the copy is done (device to host); with page-locked host
        memory the copy is truly asynchronous.
        """
        if nbytes == 0:
            return
        drv = self.driver
        state = self._dev(index)
        handle = self._stream(state, stream)
        if isinstance(dst, int) and isinstance(src, int):
            self._call(
                "cuMemcpyDtoDAsync",
                index,
                drv.CUdeviceptr(dst),
                drv.CUdeviceptr(src),
                nbytes,
                handle,
            )
        elif isinstance(dst, int):
            self._call(
                "cuMemcpyHtoDAsync",
                index,
                drv.CUdeviceptr(dst),
                _host_address(src, nbytes),  # type: ignore[arg-type]
                nbytes,
                handle,
            )
            self._keep_alive(index, state, handle, src)
        elif isinstance(src, int):
            self._call(
                "cuMemcpyDtoHAsync",
                index,
                _host_address(dst, nbytes),
                drv.CUdeviceptr(src),
                nbytes,
                handle,
            )
            self._keep_alive(index, state, handle, dst)
        else:
            raise ValueError(f"cuda:{index}: memcpy_async needs a device address on one side")

    def memset_async(self, index: int, ptr: int, value: int, nbytes: int, stream: int) -> None:
        """``cuMemsetD8Async``: set ``nbytes`` bytes at ``ptr`` to ``value`` on ``stream``."""
        if nbytes == 0:
            return
        state = self._dev(index)
        self._call(
            "cuMemsetD8Async",
            index,
            self.driver.CUdeviceptr(ptr),
            value,
            nbytes,
            self._stream(state, stream),
        )

    def synchronize(self, index: int) -> None:
        """``cuCtxSynchronize``: block until all work on the device has completed.

        Returns at once, creating no context, on a device accelrt has not used yet.
        """
        state = self._state.get(index)
        if state is None:
            return
        _, previous = self._enter(index)
        try:
            self._call("cuCtxSynchronize", index)
            self._prune_keepalive(index, state, done=True)
        finally:
            self._leave(index, previous)
