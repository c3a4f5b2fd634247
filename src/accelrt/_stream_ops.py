"""The per-call methods of streams, written once: ``Stream.query``/``synchronize``,
``Event.query``, a queue stream's ``query`` and ``synchronize``, the queue backends' event
query, and OpenCL's and XPU's ``memcpy_async`` (docs/design.md, "Streams written once").

This file is plain Python and is also compiled, as it is, by Cython's pure-Python mode at
install: ``_stream_ops.pxd`` beside it declares the seven classes as extension types with typed
fields, so that in the build the chain from ``stream.synchronize()`` to the driver runs no
bytecode. The same code runs interpreted where the build is missing or ``ACCELRT_PURE_PYTHON``
is set (``accelrt._compiled.load_source_or_build``). Change this file and its ``.pxd``
together: a field here is a ``cdef public`` field there.

``Epoch`` is the runtime's counter of changes to what is current, which the compiled
``accelrt.empty`` reads. ``StreamCore`` holds ``accelrt.Stream``'s backend object and its two
per-call methods; ``Stream`` (_stream.py) derives from it. ``EventCore`` holds
``accelrt.Event``'s native event and its ``query``; ``Event`` derives from it.
``QueueStreamOps`` holds the fields of a backend's per-stream object whose stream is an
in-order queue, and its ``query`` and ``synchronize``; ``SVMStreamOps`` adds how a queue of
PyOpenCL reads a command's status and copies by SVM memcpys (the base of OpenCL's
``_CLStream``); ``USMStreamOps`` the same of a SYCL queue through dpctl, and its wait (the base
of XPU's ``_XPUStream``). ``QueueEventCore`` holds the two fields of a queue backend's event
handle that ``query_queue_event``, both backends' event query, reads (the base of
``backends._queue_streams.QueueEvent``). A Python call costs about 25 ns and an idle
``clFinish`` through PyOpenCL about 80 ns, so two Python frames on top of the driver call were
1.45x the raw call (``bench/runtime_overhead.py`` measures it).

Nothing here imports the rest of accelrt: it sits at the bottom of the layers.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Mapping
from typing import Any, NoReturn, Protocol

__all__ = [
    "NO_VIEW",
    "EventCore",
    "QueueEventCore",
    "QueueStreamOps",
    "SVMStreamOps",
    "StreamCore",
    "USMStreamOps",
    "query_queue_event",
]


class _Ops(Protocol):
    """What ``StreamCore`` calls on its backend object (``backends._base.StreamOps``)."""

    def query(self) -> bool: ...

    def synchronize(self) -> None: ...


class Epoch:
    """A counter bumped whenever what the current accelerator, device or stream is may change
    (``use``, ``set_current_index``, a stream made current, ``reset_state``, a fork), so that
    a per-thread cache of those lookups knows when it is stale.

    ``accelrt._runtime.STATE_EPOCH`` is the one instance; the compiled ``accelrt.empty``
    (memory/calls/_native.pyx) reads its ``value`` from C, which is why it lives here.
    """

    __slots__ = ("value",)
    value: int

    def __init__(self) -> None:
        self.value = 0

    def bump(self) -> None:
        """Invalidate every cached lookup."""
        self.value += 1


class _Queue(Protocol):
    """What ``QueueStreamOps`` calls on its queue (a ``pyopencl.CommandQueue``, say)."""

    def finish(self) -> None: ...


class StreamCore:
    """``accelrt.Stream``'s backend object (a ``StreamOps``) and its per-call methods. (Its
    other fields are ``Stream``'s own slots, which Python code reads faster than an extension
    type's fields.)"""

    __slots__ = ("__weakref__", "_ops")
    _ops: _Ops

    def query(self) -> bool:
        """Return True if all work submitted to the stream has completed. Does not block."""
        return self._ops.query()

    def synchronize(self) -> None:
        """Block until all work submitted to the stream has completed."""
        ops = self._ops
        if isinstance(ops, QueueStreamOps):
            queue_ops: QueueStreamOps = ops  # typed: the build calls it without a lookup
            queue_ops.synchronize()
        else:
            ops.synchronize()


class EventCore:
    """``accelrt.Event``'s native event and its backend's ``event_query``, bound at the first
    record (both None before it), and its ``query``. (Its other fields are ``Event``'s own
    slots.) Where the backend's ``event_query`` is compiled too (``opencl`` and ``xpu``:
    ``query_queue_event``), a query runs no bytecode until the driver."""

    __slots__ = ("_handle", "_query")
    _handle: object
    _query: Callable[[Any], bool] | None

    def query(self) -> bool:
        """Return True if the recorded work has completed (True if never recorded)."""
        query = self._query
        if query is None:
            return True
        return query(self._handle)


class QueueStreamOps:
    """The fields of a stream that is an in-order queue, and its ``query`` and ``synchronize``.

    ``queue`` has a blocking ``finish()`` (None once the stream was destroyed); ``last`` is
    the last command enqueued (None once finished); ``keep`` (a ``collections.deque``) holds
    what the queue's commands need alive, each entry appended after its command was
    enqueued; ``complete`` is the status of a finished command, as ``marker_done`` reads it.
    A subclass supplies ``missing()`` (raise the error of an unknown stream),
    ``failed(call, exc)`` (raise the error for a driver exception, or return to re-raise it),
    ``marker_done``, and for its copies ``device_view`` and ``rescan``.
    """

    __slots__ = ("complete", "keep", "last", "queue")
    queue: _Queue | None
    last: object
    keep: deque[Any]  # each backend's own entries (deque is invariant: a subclass narrows it)
    complete: object

    def query(self) -> bool:
        """Whether the last command accelrt submitted (``last``) has completed: True when
        there is none (work submitted directly to the native queue is not seen)."""
        last = self.last
        return last is None or self.marker_done(last, "stream_query")

    def marker_done(self, marker: Any, call: str = "event_query") -> bool:
        """Whether ``marker``, a command of this queue, has completed; a driver error is
        ``failed(call, error)``'s."""
        raise NotImplementedError

    def missing(self) -> NoReturn:
        """Raise the error of a stream that does not exist (any more)."""
        raise NotImplementedError

    def live_queue(self) -> Any:
        """The queue (a subclass's type); ``missing()``'s error once the stream was destroyed."""
        queue = self.queue
        if queue is None:
            self.missing()
        return queue

    def failed(self, call: str, exc: Exception) -> None:
        """Raise the error for driver exception ``exc`` in ``call``, or return to re-raise it."""

    def device_view(self, address: int, nbytes: int) -> object:
        """The backend's object for ``nbytes`` of device memory at ``address`` that the
        copies' cache (``views``) lacks: a ``cl.SVM`` (OpenCL), a dpctl ``MemoryUSMDevice``
        (SYCL)."""
        raise NotImplementedError

    def rescan(self, keep: deque[tuple[Any, Any]]) -> None:
        """Forget the finished copies at the head of ``keep`` (and, where the backend counts
        them, set when to look again)."""
        raise NotImplementedError

    def wait_for(self, queue: Any) -> None:
        """Block until ``queue``'s work has completed: ``queue.finish()``."""
        queue.finish()

    def synchronize(self) -> None:
        """Block until the queue's work has completed; forget what that work needed.

        ``keep`` is swapped for an empty deque before the wait (:meth:`wait_for`): every entry
        in the old one was appended, so enqueued, before it, and is forgotten without asking
        its command's status. What another thread enqueues meanwhile goes to the new one.
        """
        queue = self.live_queue()
        done = self.keep
        if done:
            self.keep = deque()
        try:
            self.wait_for(queue)
        except Exception as exc:
            if done:  # the work may still run: keep what it needs
                done.extend(self.keep)
                self.keep = done
            self.failed("stream_synchronize", exc)
            raise
        self.last = None


class _CLEvent(Protocol):
    """What ``SVMStreamOps.marker_done`` calls on a ``pyopencl.Event``."""

    def get_info(self, param: int, /) -> object: ...


class SVMStreamOps(QueueStreamOps):
    """A queue stream whose copies are ``clEnqueueSVMMemcpy`` calls through PyOpenCL: the base
    of OpenCL's ``_CLStream`` (backends/opencl/_queues.py).

    Fields, set by the subclass: ``views`` (a dict from (address, nbytes) to the ``cl.SVM`` of
    that device memory; a miss calls ``device_view(address, nbytes)``), ``wrap_host`` (makes
    the ``cl.SVM`` of a host memoryview), ``svm_memcpy`` (``(queue, is_blocking, dst, src,
    wait_for, nbytes)`` -> the copy's event), ``scan_at`` and ``scan_bytes`` (a copy of host
    memory calls ``rescan(keep)`` first once ``keep`` holds ``scan_at`` entries or
    ``unscanned`` bytes reach ``scan_bytes``), ``unscanned`` (bytes of host memory added to
    ``keep`` since the last rescan), ``status_info`` (``CL_EVENT_COMMAND_EXECUTION_STATUS``,
    read with ``event.get_info``) and ``complete`` (``CL_COMPLETE``).
    """

    __slots__ = (
        "scan_at", "scan_bytes", "status_info", "svm_memcpy", "unscanned", "views", "wrap_host"
    )  # fmt: skip
    views: Mapping[tuple[int, int], object]
    wrap_host: Callable[[memoryview], object]
    svm_memcpy: Callable[..., object]
    scan_at: int
    scan_bytes: int
    unscanned: int
    status_info: int

    def marker_done(self, marker: _CLEvent, call: str = "event_query") -> bool:
        """Whether ``marker``, a ``pyopencl.Event`` of this queue, has completed (its
        ``get_info``, a C call: PyOpenCL's ``command_execution_status`` property adds a Python
        frame); a PyOpenCL error is ``failed(call, error)``'s."""
        try:
            done: bool = marker.get_info(self.status_info) == self.complete
        except Exception as exc:
            self.failed(call, exc)
            raise
        return done

    def memcpy_async(self, dst: int | memoryview, src: int | memoryview, nbytes: int) -> None:
        """``clEnqueueSVMMemcpy``, non-blocking; host memory is kept alive until it completes
        (in ``keep``, as ``(event, host memoryview)``; when it is trimmed: ``_CLStream.rescan``).
        """
        queue = self.live_queue()
        host: memoryview | None = None
        try:
            if isinstance(dst, int):
                target = self.views.get((dst, nbytes))
                if target is None:
                    target = self.device_view(dst, nbytes)
            else:
                host = dst
                target = self.wrap_host(dst)
            if isinstance(src, int):
                source = self.views.get((src, nbytes))
                if source is None:
                    source = self.device_view(src, nbytes)
            else:
                # PyOpenCL wraps only writable memory: stage a read-only source (bytes)
                host = src if not src.readonly else memoryview(bytearray(src))
                source = self.wrap_host(host)
            event = self.svm_memcpy(queue, False, target, source, None, nbytes)
            self.last = event
            if host is not None:
                keep = self.keep  # read after the enqueue (see QueueStreamOps.synchronize)
                self.unscanned += host.nbytes
                if len(keep) >= self.scan_at or self.unscanned >= self.scan_bytes:
                    self.rescan(keep)
                keep.append((event, host))
        except Exception as exc:
            self.failed("memcpy_async", exc)
            raise


class _SyclEvent(Protocol):
    """What ``USMStreamOps.marker_done`` reads of a ``dpctl.SyclEvent``."""

    @property
    def execution_status(self) -> object: ...


class QueueEventCore:
    """The fields of a queue backend's event handle that its query reads: ``marker``, the
    native event of its last recording (None before the first), and ``stream``, the
    ``QueueStreamOps`` it was recorded on (None before the first). The base of
    ``backends._queue_streams.QueueEvent``; compiled, ``query_queue_event`` reads both as C
    fields instead of looking up two attributes of a Python class."""

    __slots__ = ("marker", "stream")
    marker: object
    stream: QueueStreamOps | None


def query_queue_event(event: QueueEventCore | None) -> bool:
    """The ``event_query`` of the queue backends (``opencl``, ``xpu``): True if ``event`` was
    never recorded, else whether its marker has completed, as the stream it was recorded on
    reads it (``marker_done``; a driver error is that stream's ``failed("event_query", ...)``).
    Compiled, ``Event.query`` reaches the driver with no Python frame between, and reads the
    event's two fields from C (``.pxd``: a ``QueueEventCore``). Raises ``TypeError`` for None
    (which the build would otherwise read as an event)."""
    if event is None:
        raise TypeError("query_queue_event() needs an opencl or xpu event handle, got None")
    marker = event.marker
    if marker is None:
        return True
    stream = event.stream
    assert stream is not None  # a marker is recorded on a stream
    return stream.marker_done(marker)


NO_VIEW: tuple[int, int, object] = (-1, -1, None)
"""``USMStreamOps.last_view`` when there is none (no address is -1)."""


class _SyclQueue(Protocol):
    """What ``USMStreamOps`` calls on its queue (a ``dpctl.SyclQueue``)."""

    def wait(self) -> None: ...

    def memcpy_async(self, dest: object, src: object, count: int, /) -> object: ...


class USMStreamOps(QueueStreamOps):
    """A queue stream whose copies are ``queue.memcpy_async`` calls on a ``dpctl.SyclQueue``
    (USM memory): the base of the ``xpu`` backend's ``_XPUStream`` (backends/xpu/_queues.py).

    Fields, set by the subclass: ``queue`` (the ``dpctl.SyclQueue``, None once destroyed),
    ``views`` (a dict from (address, nbytes) to the dpctl ``MemoryUSMDevice`` of that device
    memory; a miss calls ``device_view(address, nbytes)``), ``last_view`` (the
    ``(address, nbytes, view)`` of the last device memory this stream copied, looked at
    before ``views``; ``NO_VIEW`` when there is none: set it so whenever ``views`` is emptied),
    ``scan_at`` (a copy of host memory calls ``rescan(keep)`` first once ``keep`` holds
    that many entries) and ``complete`` (``dpctl.event_status_type.complete``).

    Compiled, a copy, a ``synchronize`` and a ``query`` run no bytecode between ``accelrt``'s
    call and dpctl; on Intel's OpenCL CPU device the host work around a copy costs more than
    in a tight loop (the runtime's calls leave the caches cold), so each call counts
    (``bench/xpu_overhead.py`` measures them against the raw dpctl calls).
    """

    __slots__ = ("last_view", "scan_at", "views")
    queue: _SyclQueue | None  # type: ignore[assignment]  # (it waits with wait, not finish)
    views: Mapping[tuple[int, int], object]
    last_view: tuple[int, int, object]
    scan_at: int

    def marker_done(self, marker: _SyclEvent, call: str = "event_query") -> bool:
        """Whether ``marker``, a command of this queue, has completed; a dpctl error is
        ``failed(call, error)``'s."""
        try:
            done: bool = marker.execution_status == self.complete
        except Exception as exc:
            self.failed(call, exc)
            raise
        return done

    def view(self, address: int, nbytes: int) -> object:
        """The dpctl memory object of ``nbytes`` of device memory at ``address`` (from
        ``views``, else ``device_view``), remembered as ``last_view``."""
        found = self.views.get((address, nbytes))
        if found is None:
            found = self.device_view(address, nbytes)
        self.last_view = (address, nbytes, found)
        return found

    def wait_for(self, queue: Any) -> None:
        """Block until ``queue``'s work has completed: a SYCL queue waits with ``wait()``
        (``QueueStreamOps.synchronize`` does the rest)."""
        queue.wait()

    def memcpy_async(self, dst: int | memoryview, src: int | memoryview, nbytes: int) -> None:
        """``queue.memcpy_async``, non-blocking; host memory (a memoryview, either side) is
        kept alive until the copy completes (in ``keep``, as ``(event, host memoryview)``)."""
        queue = self.live_queue()
        host: memoryview | None = None
        try:
            if isinstance(dst, int):
                hit = self.last_view  # one read: another thread may replace it
                target = hit[2] if hit[0] == dst and hit[1] == nbytes else self.view(dst, nbytes)
            else:
                target = host = dst
            if isinstance(src, int):
                hit = self.last_view
                source = hit[2] if hit[0] == src and hit[1] == nbytes else self.view(src, nbytes)
            else:
                source = host = src
            event = queue.memcpy_async(target, source, nbytes)
        except Exception as exc:
            self.failed("memcpy_async", exc)
            raise
        self.last = event
        if host is not None:
            keep = self.keep  # read after the enqueue (see QueueStreamOps.synchronize)
            if len(keep) >= self.scan_at:
                self.rescan(keep)
            keep.append((event, host))
