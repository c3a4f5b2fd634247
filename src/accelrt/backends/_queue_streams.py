"""What the queue backends (``opencl``, ``xpu``) share: event handles, the error of an unknown
stream handle, and the stream and event methods that only find a stream's object and call it
(the objects themselves are each backend's, on ``_stream_ops``' bases)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Generic, Protocol, TypeVar

from .._stream_ops import QueueEventCore  # the build where there is one (_compiled.py)

__all__ = ["QueueEvent", "QueueStreamsEvents", "no_stream"]


class QueueEvent(QueueEventCore):
    """An event handle of a queue backend: the marker of its last recording (None before the
    first) and the stream it was recorded on (whose finished copies waiting on it forgets),
    both ``QueueEventCore``'s fields (accelrt/_stream_ops.py, compiled where it can be).

    Each backend's class names the types of the two (``OpenCLEvent``: a ``CLEvent`` and a
    ``_CLStream``; ``XPUEvent``: a ``dpctl.SyclEvent`` and an ``_XPUStream``)."""

    __slots__ = ("device", "timing")

    def __init__(self, device: int, timing: bool) -> None:
        self.device = device
        self.timing = timing
        self.marker = None
        self.stream = None


def no_stream(backend: str, index: int, stream: int) -> ValueError:
    """The error of a stream handle that is not a live stream of device ``index``."""
    return ValueError(
        f"{backend}:{index} has no stream with handle {stream:#x}: it was destroyed or "
        "belongs to another device"
    )


class _Clearable(Protocol):
    def clear(self) -> None: ...


class _QueueStream(Protocol):
    """What the methods below use of a backend's per-stream object."""

    @property
    def last(self) -> object: ...  # the last command enqueued, None once known finished
    @last.setter
    def last(self, value: None) -> None: ...
    @property
    def keep(self) -> _Clearable: ...  # the host objects of copies in flight

    def query(self) -> bool: ...
    def synchronize(self) -> None: ...
    def record(self, event: QueueEvent) -> None: ...
    def memcpy_async(self, dst: int | memoryview, src: int | memoryview, nbytes: int) -> None: ...


_S = TypeVar("_S", bound=_QueueStream)
_E = TypeVar("_E", bound=QueueEvent)


class _QueueDevice(Protocol[_S]):
    """What the methods below read of a device's state: its live streams by handle."""

    streams: dict[int, _S]


class QueueStreamsEvents(Generic[_S, _E]):
    """The stream and event methods of a queue backend that are the same for every one: a
    base of its ``_StreamsEvents`` after its ``_Devices`` (which gives ``_dev`` and ``_state``),
    with ``_event_type`` its event class (``_E``) and ``_S`` its per-stream class."""

    _event_type: type[_E]

    if TYPE_CHECKING:
        name: str

        @property
        def _state(self) -> Mapping[int, _QueueDevice[_S]]: ...
        def _dev(self, index: int) -> _QueueDevice[_S]: ...
        def _wait_destroyed(self, found: _S) -> None: ...

    def stream_ops(self, index: int, stream: int) -> _S | None:
        """Return the stream's ``StreamOps`` (one object per handle), None for an unknown one."""
        return self._dev(index).streams.get(stream)

    def _stream(self, index: int, stream: int) -> _S:
        """Return a live stream of device ``index``; ``ValueError`` if there is none."""
        found = self._dev(index).streams.get(stream)
        if found is None:
            raise no_stream(self.name, index, stream)
        return found

    def stream_destroy(self, index: int, stream: int) -> None:
        """Drop the stream: take its queue and wait for it as the backend does
        (``_wait_destroyed``); its handle is unknown from then on."""
        state = self._state.get(index)
        found = state.streams.pop(stream, None) if state is not None else None
        if found is not None:
            self._wait_destroyed(found)
            found.last = None
            found.keep.clear()

    def stream_query(self, index: int, stream: int) -> bool:
        """Whether the last command accelrt enqueued on the queue has completed (True for a
        handle that is not a live stream: nothing enqueued). See the stream's ``query``."""
        state = self._state.get(index)
        found = state.streams.get(stream) if state is not None else None
        return found is None or found.query()

    def stream_synchronize(self, index: int, stream: int) -> None:
        """Wait for the queue (``clFinish``, ``queue.wait()``)."""
        self._stream(index, stream).synchronize()

    def event_create(self, index: int, timing: bool) -> _E:
        """Return an unrecorded event (its marker is made when it is recorded)."""
        return self._event_type(index, timing)

    def event_record(self, event: _E, index: int, stream: int) -> None:
        """Enqueue a marker on the stream's queue (a barrier): the event's new marker."""
        self._stream(index, stream).record(event)

    def event_destroy(self, event: _E) -> None:
        """Drop the event's marker (the library releases its native event with it)."""
        event.marker = None

    def memcpy_async(
        self, index: int, dst: int | memoryview, src: int | memoryview, nbytes: int, stream: int
    ) -> None:
        """Enqueue the copy on the stream's queue, non-blocking; host memory is kept alive
        until it completes (see the stream's ``memcpy_async``)."""
        self._stream(index, stream).memcpy_async(dst, src, nbytes)
