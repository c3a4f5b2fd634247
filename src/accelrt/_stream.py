"""``Stream`` and ``Event``: device-agnostic wrappers around a backend's stream and event handles.

Mirrors ``torch.Stream`` / ``torch.Event`` and ``torch.accelerator.current_stream`` /
``set_stream``. The current stream is per thread and per device; until set it is the device's
default stream (handle 0).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Protocol

from . import _runtime
from ._device import Device, DeviceLike
from ._readonly import read_only
from ._stream_ops import EventCore, StreamCore  # the build where there is one (_compiled.py)
from .backends._base import Backend, EventHandle, StreamOps, bind_stream
from .memory._atomic import finaliser

__all__ = ["Event", "Stream", "current_stream", "set_stream"]


class _ThreadState(threading.local):
    """This thread's ``with stream:`` stack and current stream of each device. The class
    defaults stand for "none yet", so reading them never raises and swallows an AttributeError
    (as ``getattr`` with a default does on a ``threading.local``)."""

    stack: list[tuple[int, Stream]] | None = None
    streams: dict[tuple[str, int], Stream] | None = None
    current: tuple[int, Stream] | None = None  # (runtime epoch, current_stream()'s answer)


_local = _ThreadState()


CAPTURING: set[Stream] = set()
"""The streams an ``accelrt.Graph`` captures on now (streams compare by backend, device and
handle, so any ``Stream`` of the same handle is found)."""


def _foreign_backend(
    handle: object, device: DeviceLike, name: str, kind: str, plural: str
) -> tuple[Backend, int]:
    """The backend and index of ``device`` for ``Stream.from_handle`` of ``handle``, a foreign
    ``kind`` of object (``plural`` in the message, e.g. ``"CUDA streams"``) that only backend
    ``name`` wraps.

    Raises ``TypeError`` naming the object, the device and the backend to use if the device's
    backend is another; otherwise as ``resolve_device``.
    """
    backend, index = _runtime.resolve_device(device)
    if backend.name != name:
        raise TypeError(
            f"{type(handle).__name__} is a {kind}, but the device is "
            f"{Device(backend.name, index)}; {plural} wrap only on the {name!r} backend "
            f"(acc.backends.use({name!r}))"
        )
    return backend, index


class Stream(StreamCore):
    """A queue of device work that runs in order; work on different streams may overlap.

    Parameters
    ----------
    device : int, str, Device or None
        The device; None for the current device.
    priority : int
        Scheduling priority hint; lower is more urgent (CUDA's convention). Backends without
        priorities ignore it.

    Raises
    ------
    RuntimeError
        If there is no accelerator.
    TypeError, ValueError
        For a bad device argument (see ``accelrt.current_device_index``).

    Notes
    -----
    Creating a stream does not make it current; use ``with stream:`` or ``set_stream``. Streams
    compare equal when they wrap the same handle on the same device. Mirrors ``torch.Stream``.

    Examples
    --------
    >>> import accelrt as acc
    >>> s = acc.Stream()
    >>> with s:
    ...     assert acc.current_stream() == s
    """

    __slots__ = ("_backend", "_handle", "_index", "_owned", "_priority")

    def __init__(self, device: DeviceLike = None, priority: int = 0) -> None:
        backend, index = _runtime.resolve_device(device)
        if isinstance(priority, bool) or not isinstance(priority, int):
            raise TypeError(f"stream priority must be an int, got {priority!r}")
        self._backend = backend
        self._index = index
        self._priority = priority
        self._handle = backend.stream_create(index, priority)
        self._owned = True
        self._ops: StreamOps = bind_stream(backend, index, self._handle)

    @classmethod
    def from_handle(cls, handle: object, device: DeviceLike = None) -> Stream:
        """Rebuild a ``Stream`` from its backend handle and device, or wrap a foreign stream.

        Parameters
        ----------
        handle : int or object with ``__cuda_stream__``
            A stream's ``handle`` (0 is the device's default stream), or, on the ``cuda``
            backend, any object implementing the CUDA stream protocol: a ``__cuda_stream__()``
            method returning ``(0, native CUstream as int)`` (PyTorch, CuPy and ``cuda.core``
            streams; an attribute holding the tuple is accepted too, as early ``cuda.core``
            had). On the ``xpu`` backend, a ``dpctl.SyclQueue``: an in-order queue of the
            device in the backend's context (``get_backend('xpu').context(i)``), which the
            stream then submits to (it does not own it).
        device : int, str, Device or None
            The stream's device; None for the current device. The CUDA stream protocol does
            not carry the device: pass it when the foreign stream is not on the current one.

        Returns
        -------
        Stream
            A stream equal to (and hashing as) the one the handle came from. It does not own
            the handle: the original (or the foreign object) keeps the backend stream alive.

        Raises
        ------
        TypeError
            If ``handle`` is neither an int nor an object with ``__cuda_stream__``, if
            ``__cuda_stream__`` does not give a ``(version, handle)`` pair of ints, or if the
            object is a CUDA stream and the device is not a ``cuda`` device, or a dpctl
            object and the device is not an ``xpu`` device or the object not a ``SyclQueue``.
        ValueError
            If the handle is negative, the protocol version is not 0, or for a bad device
            argument; a ``SyclQueue`` of another device or context, or out-of-order (the
            message names it). A handle that was never a stream of that device fails when the
            stream is first used.

        Notes
        -----
        Mirrors ``torch.Stream(stream_id=..., device_index=..., device_type=...)`` and
        ``cuda.core``'s ``Stream.from_handle`` / ``Device.create_stream(obj)``; handles pass
        between threads and libraries as plain ints. The foreign object is not kept alive:
        keep it (or its library's stream) alive while the ``Stream`` is used.
        """
        if not isinstance(handle, int) and hasattr(handle, "__cuda_stream__"):
            backend, index = _foreign_backend(
                handle, device, "cuda", "CUDA stream (it has __cuda_stream__)", "CUDA streams"
            )
            return cls._wrap(backend, index, _cuda_stream_handle(handle))
        if type(handle).__module__.partition(".")[0] == "dpctl":
            return cls._from_sycl_queue(handle, device)
        if isinstance(handle, bool) or not isinstance(handle, int):
            raise TypeError(
                f"stream handle must be an int, got {handle!r} (or, on cuda, an object with "
                "__cuda_stream__); on xpu, a dpctl.SyclQueue"
            )
        if handle < 0:
            raise ValueError(f"stream handle must be >= 0, got {handle}")
        backend, index = _runtime.resolve_device(device)
        return cls._wrap(backend, index, handle)

    @classmethod
    def _from_sycl_queue(cls, queue: object, device: DeviceLike) -> Stream:
        """``from_handle`` of a ``dpctl.SyclQueue``: the ``xpu`` stream over that queue."""
        backend, index = _foreign_backend(
            queue, device, "xpu", "dpctl (SYCL) object", "SYCL queues"
        )
        adopt = backend.adopt_queue  # type: ignore[attr-defined]
        return cls._wrap(backend, index, adopt(index, queue))

    @classmethod
    def _wrap(cls, backend: Backend, index: int, handle: int, priority: int = 0) -> Stream:
        stream = cls.__new__(cls)
        stream._backend = backend
        stream._index = index
        stream._handle = handle
        stream._priority = priority
        stream._owned = False
        stream._ops = bind_stream(backend, index, handle)
        return stream

    @property
    def device(self) -> Device:
        """The stream's device."""
        return Device(self._backend.name, self._index)

    device_index: read_only[int] = read_only("_index", "The stream's device index.")
    handle: read_only[int] = read_only(
        "_handle", "The backend's stream handle (0 is the device's default stream)."
    )
    priority: read_only[int] = read_only("_priority", "The priority the stream was created with.")
    stream_id: read_only[int] = read_only(
        "_handle",
        """The stream's id: its backend handle (0 is the device's default stream).

        Mirrors ``torch.Stream.stream_id``; with ``device_index`` and ``device_type`` it
        rebuilds the stream (``Stream.from_handle``). Unlike PyTorch's, it packs no stream
        type into its bits (docs/conformance.md).""",
    )

    @property
    def device_type(self) -> str:
        """The stream's device type, the backend's name (``"opencl"``, ``"cuda"``, ``"sim"``).

        Mirrors ``torch.Stream.device_type``."""
        return self._backend.name

    @property
    def native_handle(self) -> int:
        """The backend's own stream object, as an int: the ``CUstream`` on ``cuda``, the
        ``cl_command_queue`` on ``opencl``, the ``DPCTLSyclQueueRef`` of the ``dpctl.SyclQueue``
        on ``xpu``, the handle itself on ``sim``.

        Mirrors ``torch.Stream.native_handle``; pass it to native libraries on the same device.

        Raises
        ------
        ValueError
            If the stream was destroyed (OpenCL: the queue is gone).
        """
        native = getattr(self._backend, "native_stream", None)
        return self._handle if native is None else int(native(self._index, self._handle))

    def is_capturing(self) -> bool:
        """True while an ``accelrt.Graph`` captures the work submitted to this stream.

        Mirrors ``torch.Stream.is_capturing``."""
        return self in CAPTURING

    @property
    def __cuda_stream__(self) -> Callable[[], tuple[int, int]]:
        """The CUDA stream protocol, on ``cuda`` streams only.

        ``stream.__cuda_stream__()`` returns ``(0, handle)``: protocol version 0 and the native
        ``CUstream`` as an int (0 for the legacy default stream), so PyTorch
        (``torch.cuda.ExternalStream``), CuPy (``cupy.cuda.ExternalStream``) and ``cuda.core``
        can use accelrt streams.

        Raises
        ------
        AttributeError
            On any other backend, so that ``hasattr(stream, "__cuda_stream__")`` is False
            there, as consumers check.
        """
        if self._backend.name != "cuda":
            raise AttributeError(
                f"a stream of {self.device} is not a CUDA stream and has no __cuda_stream__"
            )
        handle = self._handle
        return lambda: (0, handle)

    def wait_event(self, event: Event) -> None:
        """Make future work on this stream wait for ``event``; the host does not block.

        Raises
        ------
        TypeError
            If ``event`` is not an ``Event``.
        ValueError
            If the event was recorded on another device (the message names both devices);
            as in PyTorch, streams wait only for events of their own device here.
        """
        _check_event(event, "wait_event")
        if event._handle is None:
            return
        if event.device != self.device:
            raise ValueError(
                f"a stream of {self.device} cannot wait for an event recorded on {event.device}; "
                "record the event on a stream of the same device"
            )
        self._backend.stream_wait_event(self._index, self._handle, event._handle)

    def wait_stream(self, stream: Stream) -> None:
        """Make future work on this stream wait for the work already submitted to ``stream``.

        Raises
        ------
        TypeError
            If ``stream`` is not a ``Stream``.
        """
        if not isinstance(stream, Stream):
            raise TypeError(f"wait_stream() takes a Stream, got {type(stream).__name__}")
        self.wait_event(stream.record_event())

    def record_event(self, event: Event | None = None) -> Event:
        """Record ``event`` (a new one if None) at the current end of this stream and return it."""
        if event is None:
            event = Event()
        event.record(self)
        return event

    def __enter__(self) -> Stream:
        stack = _local.stack
        if stack is None:
            stack = _local.stack = []
        stack.append((_runtime.current_index(self._backend), _current(self._backend, self._index)))
        _runtime.set_current_index(self._backend, self._index)
        _set_current(self)
        return self

    def __exit__(self, *exc_info: object) -> None:
        previous_index, previous_stream = _local.stack.pop()  # type: ignore[union-attr]
        _set_current(previous_stream)
        _runtime.set_current_index(self._backend, previous_index)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Stream):
            return False
        return (self._backend.name, self._index, self._handle) == (
            other._backend.name,
            other._index,
            other._handle,
        )

    def __hash__(self) -> int:
        return hash((self._backend.name, self._index, self._handle))

    def __repr__(self) -> str:
        return f"Stream(device={self.device!s}, handle={self._handle:#x})"

    @finaliser  # a Ctrl-C while the queue finishes arrives after it (memory/_atomic.py)
    def __del__(self) -> None:
        try:
            if self._owned:
                self._owned = False
                self._backend.stream_destroy(self._index, self._handle)
        except Exception:  # __del__ never raises
            pass


class Event(EventCore):
    """A point in a stream's work: record it, wait for it, time between two of them.

    Parameters
    ----------
    enable_timing : bool
        Allow ``elapsed_time``. Default False.

    Notes
    -----
    An event belongs to no device until first recorded (``device`` is None); ``query`` is True
    before recording. Mirrors ``torch.Event``.
    """

    __slots__ = ("_backend", "_enable_timing", "_index")  # and EventCore's (_stream_ops.py)

    def __init__(self, enable_timing: bool = False) -> None:
        self._enable_timing = bool(enable_timing)
        self._backend: Backend | None = None
        self._index: int | None = None
        self._handle: EventHandle | None = None
        self._query = None

    @property
    def device(self) -> Device | None:
        """The device of the stream it was last recorded on; None before recording."""
        if self._backend is None:
            return None
        return Device(self._backend.name, self._index)

    enable_timing: read_only[bool] = read_only("_enable_timing", "Whether the event can time work.")

    @property
    def event_id(self) -> int:
        """The event's native object as an int: the ``CUevent`` on ``cuda``; on backends whose
        native event changes with each record (OpenCL and SYCL markers) or that have none
        (``sim``), an id unique among live events. 0 before the first record, which creates
        the native event.

        Mirrors ``torch.Event.event_id``.
        """
        if self._backend is None:
            return 0
        native = getattr(self._backend, "native_event", None)
        return id(self._handle) if native is None else int(native(self._handle))

    def record(self, stream: Stream | None = None) -> None:
        """Record the event at the current end of ``stream`` (the current stream if None).

        Raises
        ------
        TypeError
            If ``stream`` is not a ``Stream``.
        ValueError
            If the event was recorded on another device before.
        """
        if stream is None:
            stream = current_stream()
        elif not isinstance(stream, Stream):
            raise TypeError(f"Event.record() takes a Stream, got {type(stream).__name__}")
        backend = self._backend
        if backend is None:
            self._backend, self._index = stream._backend, stream._index
            self._handle = stream._backend.event_create(stream._index, self._enable_timing)
            self._query = stream._backend.event_query
        elif (backend is not stream._backend or self._index != stream._index) and (
            (backend.name, self._index) != (stream._backend.name, stream._index)
        ):  # the tuples only when the quick identity test fails
            raise ValueError(
                f"event was recorded on {self.device} and cannot be recorded on a stream of "
                f"{stream.device}; create a new Event"
            )
        stream._ops.record(self._handle)

    def wait(self, stream: Stream | None = None) -> None:
        """Make future work on ``stream`` (the current stream if None) wait for this event.

        Raises as :meth:`Stream.wait_event`; ``TypeError`` if ``stream`` is not a Stream.
        """
        if stream is not None and not isinstance(stream, Stream):
            raise TypeError(f"Event.wait() takes a Stream, got {type(stream).__name__}")
        (stream if stream is not None else current_stream()).wait_event(self)

    def synchronize(self) -> None:
        """Block until the recorded work has completed (returns at once if never recorded)."""
        if self._backend is not None:
            self._backend.event_synchronize(self._handle)

    def elapsed_time(self, end_event: Event) -> float:
        """Return the milliseconds between this event and ``end_event``, a float.

        Waits for ``end_event`` to complete first. Raises ``TypeError`` if ``end_event`` is not
        an ``Event``, and ``ValueError`` if either event was created without
        ``enable_timing=True``, either has not been recorded, or they were recorded on
        different devices (as PyTorch refuses).
        """
        _check_event(end_event, "elapsed_time")
        if not (self._enable_timing and end_event._enable_timing):
            raise ValueError("Both events must be created with argument 'enable_timing=True'.")
        if self._backend is None or end_event._backend is None:
            raise ValueError("Both events must be recorded before calculating elapsed time.")
        if self.device != end_event.device:
            raise ValueError(
                f"events recorded on {self.device} and {end_event.device} cannot be timed "
                "against each other; record both on streams of one device"
            )
        end_event.synchronize()
        return self._backend.event_elapsed_ms(self._handle, end_event._handle)

    def __repr__(self) -> str:
        return f"Event(device={self.device}, enable_timing={self._enable_timing})"


def _check_event(value: object, call: str) -> None:
    """Raise ``TypeError`` naming ``call`` (a method's name) unless ``value`` is an ``Event``."""
    if not isinstance(value, Event):
        raise TypeError(f"{call}() takes an Event, got {type(value).__name__}")


class _CUDAStreamLike(Protocol):
    """An object implementing the CUDA stream protocol: ``__cuda_stream__`` is a method that
    returns ``(version, CUstream as int)`` (or, as early ``cuda.core`` had, that tuple)."""

    @property
    def __cuda_stream__(self) -> object: ...


def _cuda_stream_handle(obj: _CUDAStreamLike) -> int:
    """The native ``CUstream`` of an object implementing the CUDA stream protocol."""
    protocol = obj.__cuda_stream__
    info = protocol() if callable(protocol) else protocol
    if (
        not isinstance(info, tuple)
        or len(info) != 2
        or not all(isinstance(v, int) and not isinstance(v, bool) for v in info)
    ):
        raise TypeError(
            f"{type(obj).__name__}.__cuda_stream__() must return (version, handle) ints, "
            f"got {info!r}"
        )
    version, handle = info
    if version != 0:
        raise ValueError(
            f"{type(obj).__name__}.__cuda_stream__() has protocol version {version}; "
            "accelrt understands version 0"
        )
    if handle < 0:
        raise ValueError(f"{type(obj).__name__}.__cuda_stream__() gave handle {handle} < 0")
    return int(handle)


def _current(backend: Backend, index: int) -> Stream:
    """This thread's current stream of ``backend``'s device ``index`` (a resolved device)."""
    streams = _local.streams
    stream = streams.get((backend.name, index)) if streams is not None else None
    if stream is None:
        stream = Stream._wrap(backend, index, 0)
        _set_current(stream)
    return stream


def _set_current(stream: Stream) -> None:
    streams = _local.streams
    if streams is None:
        streams = _local.streams = {}
    streams[(stream._backend.name, stream._index)] = stream
    _runtime.STATE_EPOCH.bump()


def current_stream(device: DeviceLike = None) -> Stream:
    """Return this thread's current stream of ``device`` (its default stream until set).

    ``device`` is an int, a str, a ``Device``, or None for the current device. Raises
    ``RuntimeError`` if there is no accelerator, ``TypeError`` or ``ValueError`` for a bad
    device argument. Mirrors ``torch.accelerator.current_stream``.
    """
    if device is None:  # the common call: this thread's answer, while nothing has changed
        cached = _local.current
        if cached is not None and cached[0] == _runtime.STATE_EPOCH.value:
            return cached[1]
        epoch = _runtime.STATE_EPOCH.value
    backend, index = _runtime.resolve_device(device)
    streams = _local.streams
    stream = streams.get((backend.name, index)) if streams is not None else None
    if stream is None:
        stream = _current(backend, index)
    if device is None:
        _local.current = (epoch, stream)
    return stream


def set_stream(stream: Stream) -> None:
    """Make ``stream`` current on its device, and make its device the current device.

    Raises
    ------
    TypeError
        If ``stream`` is not a ``Stream``.
    ValueError
        If the stream belongs to a backend that is not the current accelerator.
    RuntimeError
        In a child forked after the parent initialised the accelerator.

    Notes
    -----
    Mirrors ``torch.accelerator.set_stream``.
    """
    if not isinstance(stream, Stream):
        raise TypeError(f"set_stream() takes a Stream, got {type(stream).__name__}")
    _runtime.check_not_forked(stream._backend)
    if stream._backend is not _runtime.require_accelerator():
        raise ValueError(
            f"stream {stream!r} is not on the current accelerator "
            f"{_runtime.require_accelerator().name!r}"
        )
    _runtime.set_current_index(stream._backend, stream._index)
    _set_current(stream)


def reset_local() -> None:
    """Forget this thread's current streams (for tests; see ``_runtime.reset_state``)."""
    _local.__dict__.clear()
    _runtime.STATE_EPOCH.bump()
