"""The OpenCL backend, through PyOpenCL: any vendor's device; PoCL's CPU device where no GPU is.

Mapping of the runtime's concepts onto OpenCL:

- device memory is coarse-grained shared virtual memory (``clSVMAlloc``), so pointers are plain
  integers and the caching allocator splits segments by offset;
- a stream is an in-order command queue with profiling enabled; handle 0 is the device's default
  queue;
- an event is a marker enqueued on the queue; waiting on an event from another queue is a
  barrier with a wait list;
- copies and fills are SVM memcpy and memfill;
- pinned host memory (``accelrt.empty_host``) is a ``CL_MEM_ALLOC_HOST_PTR`` buffer mapped
  once for its host address (page-locked by GPU drivers; ordinary memory on PoCL's CPU device).

PoCL 3.0 (the pip ``pocl-binary-distribution``) corrupts memory when an SVM allocation is bound
to a queue or when its free is enqueued, so neither is ever done: raw SVM is released with
``clSVMFree`` only after every queue of the device has finished.

OpenCL cannot report free device memory; ``mem_get_info`` returns ``total - bytes this process
holds through this backend``.
"""

from __future__ import annotations

import ctypes
import functools
import threading
from collections import deque
from collections.abc import Callable
from typing import Any

from .._device import DeviceProperties
from .._errors import AcceleratorError
from .._stream_ops import SVMStreamOps  # the build where there is one (_compiled.py)
from ._base import (
    BackendOutOfMemory,
    NoVirtualMemory,
    dtypes,
    map_driver_errors,
    visible_devices,
)

__all__ = ["OpenCLBackend", "OpenCLEvent"]


# CL_OUT_OF_RESOURCES, CL_MEM_OBJECT_ALLOCATION_FAILURE, CL_OUT_OF_HOST_MEMORY,
# CL_INVALID_BUFFER_SIZE: what clSVMAlloc reports when a request cannot be met.
_OOM_CODES = frozenset({-5, -4, -6, -61})


def _import_cl() -> Any:
    import pyopencl

    return pyopencl


def _host_array(ptr: int, nbytes: int) -> Any:
    import numpy as np

    return np.frombuffer(memoryview((ctypes.c_char * nbytes).from_address(ptr)).cast("B"), np.uint8)


# CL_COMPLETE; a command's execution status is positive while it is queued, submitted or
# running, and negative (an error code) if it terminated abnormally
_CL_COMPLETE = 0
# CL_EVENT_COMMAND_EXECUTION_STATUS: read with ``event.get_info`` (a C call), not through
# PyOpenCL's ``command_execution_status`` property (a Python function around that call)
_EXECUTION_STATUS = 0x11D3

# the largest number of cached cl.SVM wrappers of device memory per device (see _svm)
_SVM_CACHE_SIZE = 4096

# A copy looks for finished copies of its queue to forget (see _CLStream.rescan) once
# this many more host objects than the last look left are held (at least as many as it left),
# or this many bytes were added since: asking a command's status while the device runs it
# costs about 1.4 us on PoCL, more than the rest of the copy call, so looking at every copy
# would cost more than the copy; these bound the finished host memory held between looks.
_KEEP_SCAN = 32
_KEEP_SCAN_BYTES = 64 << 20


def _svm(state: _CLDevice, ptr: int, nbytes: int) -> Any:
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
        svm = state.svm[key] = state.cl.SVM(_host_array(ptr, nbytes))
    return svm


def _svm_memcpy_by_enqueue_copy(
    cl: Any, queue: Any, is_blocking: bool, dst: Any, src: Any, wait_for: Any, nbytes: int
) -> Any:
    """PyOpenCL's ``_enqueue_svm_memcpy`` call (after ``cl``) through ``pyopencl.enqueue_copy``."""
    return cl.enqueue_copy(
        queue, dst, src, byte_count=nbytes, is_blocking=is_blocking, wait_for=wait_for
    )


def _drop_completed(keep: deque[tuple[Any, Any]]) -> None:
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


def _raise_driver_error(call: str, exc: Exception) -> None:
    """Raise ``AcceleratorError`` from ``exc`` if PyOpenCL raised it; return otherwise.

    The hot paths map errors inline with this (``except Exception as exc:
    _raise_driver_error(name, exc); raise``) instead of through ``map_driver_errors``' wrapper,
    which costs a call per call.
    """
    if type(exc).__module__.partition(".")[0] == "pyopencl":
        raise AcceleratorError(f"OpenCL {call} failed: {' '.join(str(exc).split())}") from exc


class OpenCLEvent:
    """An OpenCL event handle: the marker of its last recording (None before the first) and
    the stream it was recorded on (whose finished copies waiting on it forgets)."""

    __slots__ = ("device", "marker", "stream", "timing")

    def __init__(self, device: int, timing: bool) -> None:
        self.device = device
        self.timing = timing
        self.marker: Any = None
        self.stream: _CLStream | None = None


class _CLDevice:
    """Per-device state, created on first use of the device."""

    __slots__ = (
        "allocations", "cl", "context", "device", "held", "index", "marker", "streams", "svm",
        "svm_memcpy",
    )  # fmt: skip

    def __init__(self, cl: Any, device: Any, index: int) -> None:
        self.cl = cl  # the pyopencl module, so hot paths need no import statement
        self.device = device
        self.index = index
        self.context = cl.Context([device])
        self.allocations: dict[int, Any] = {}
        self.held = 0
        # (device pointer, bytes) -> the cl.SVM wrapper copies use; emptied when memory is freed
        self.svm: dict[tuple[int, int], Any] = {}
        # clEnqueueSVMMemcpy as PyOpenCL's extension exposes it, (queue, is_blocking, dst, src,
        # wait_for, byte_count) with both sides cl.SVM: what pyopencl.enqueue_copy calls after
        # about 1 us of dispatch in Python on its arguments' types. Where a PyOpenCL version
        # lacks it, the same call through enqueue_copy.
        self.svm_memcpy: Callable[..., Any] = getattr(
            getattr(cl, "_cl", None), "_enqueue_svm_memcpy", None
        ) or functools.partial(_svm_memcpy_by_enqueue_copy, cl)
        # clEnqueueMarkerWithWaitList, (queue, wait_for): what pyopencl.enqueue_marker calls
        # after asking the queue's OpenCL version (SVM devices are OpenCL 2.0, so always it)
        self.marker: Callable[[Any, Any], Any] = getattr(
            getattr(cl, "_cl", None), "_enqueue_marker_with_wait_list", cl.enqueue_marker
        )
        # the live streams by handle; 0 is the default stream
        self.streams: dict[int, _CLStream] = {}
        self.streams[0] = self.new_stream(0)

    def new_stream(self, handle: int) -> _CLStream:
        """Return a stream ``handle`` over a new in-order, profiling-enabled queue."""
        cl = self.cl
        props = cl.command_queue_properties.PROFILING_ENABLE
        return _CLStream(self, handle, cl.CommandQueue(self.context, self.device, properties=props))


def _no_stream(index: int, stream: int) -> ValueError:
    return ValueError(
        f"opencl:{index} has no stream with handle {stream:#x}: it was destroyed or "
        "belongs to another device"
    )


class _CLStream(SVMStreamOps):
    """One stream of a device (``StreamOps``): its queue and what accelrt enqueued on it.

    ``OpenCLBackend.stream_ops`` hands out the one object of a live handle, so every ``Stream``
    wrapping the handle shares ``last`` and ``keep`` and no call looks the handle up.
    ``stream_destroy`` sets ``queue`` to None: the methods that enqueue or wait then raise the
    ``ValueError`` of an unknown handle, and ``query`` is True (nothing accelrt enqueued).
    """

    __slots__ = ("device", "handle")  # and the fields of its bases

    def __init__(self, device: _CLDevice, handle: int, queue: Any) -> None:
        self.device = device
        self.handle = handle
        self.queue: Any = queue
        # the last command this backend enqueued on the queue, None once finished
        self.last: Any = None
        # the (event, host object) pairs of the queue's async host copies in enqueue order,
        # kept until the copy completes (an in-order queue completes them in that order)
        self.keep: deque[tuple[Any, Any]] = deque()
        self.views = device.svm
        self.wrap_host = device.cl.SVM
        self.svm_memcpy = device.svm_memcpy
        self.scan_at = _KEEP_SCAN  # the length of keep at which a copy forgets finished ones
        self.scan_bytes = _KEEP_SCAN_BYTES
        self.unscanned = 0  # bytes of host objects added to keep since it was last looked at

    def query(self) -> bool:
        """Whether the last command accelrt enqueued on the queue has completed.

        Work enqueued directly on the native queue is not seen; record an event after it.
        """
        last = self.last
        if last is None:  # nothing enqueued, or finished
            return True
        try:
            status: int = last.get_info(_EXECUTION_STATUS)
        except Exception as exc:
            _raise_driver_error("stream_query", exc)
            raise
        return status == _CL_COMPLETE

    # synchronize: QueueStreamOps's (compiled where it can be), with these two
    def missing(self) -> None:
        """Raise the ``ValueError`` of an unknown handle (the stream was destroyed)."""
        raise _no_stream(self.device.index, self.handle)

    def failed(self, call: str, exc: Exception) -> None:
        """Raise ``AcceleratorError`` for a PyOpenCL error in ``call``."""
        _raise_driver_error(call, exc)

    def record(self, event: Any) -> None:
        """Enqueue a marker on the queue: the event's new marker."""
        queue = self.queue
        if queue is None:
            raise _no_stream(self.device.index, self.handle)
        try:
            event.marker = self.last = self.device.marker(queue, None)
            event.stream = self
        except Exception as exc:
            _raise_driver_error("event_record", exc)
            raise

    # memcpy_async: _SVMStream's (compiled where it can be), with these two
    def device_view(self, address: int, nbytes: int) -> Any:
        """The ``cl.SVM`` of device memory, made and cached (``_svm``)."""
        return _svm(self.device, address, nbytes)

    def rescan(self, keep: deque[tuple[Any, Any]]) -> None:
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


class OpenCLBackend(NoVirtualMemory):
    """The ``opencl`` backend: every OpenCL device with coarse-grained SVM, GPUs first.

    Notes
    -----
    Devices are ordered GPUs first, then accelerators, then CPUs, each in platform order, so
    ``opencl:0`` is the best device present; ``ACCELRT_VISIBLE_DEVICES`` indexes that order.
    ``is_available`` and ``device_count`` enumerate platforms without creating a context.
    Thread-safe: one lock guards the lazy per-device state.
    """

    no_vmm_reason = (
        "OpenCL has no API to reserve address space and map pages into it (virtual memory)"
    )

    name = "opencl"

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._cl_devices: list[Any] | None = None
        self._state: dict[int, _CLDevice] = {}
        self._next_stream = 1

    # discovery
    def _devices(self) -> list[Any]:
        if self._cl_devices is None:
            found: list[Any] = []
            try:
                cl = _import_cl()
                for platform in cl.get_platforms():
                    for dev in platform.get_devices():
                        if dev.svm_capabilities & cl.device_svm_capabilities.COARSE_GRAIN_BUFFER:
                            found.append(dev)
                rank = {cl.device_type.GPU: 0, cl.device_type.ACCELERATOR: 1}
                found.sort(key=lambda d: rank.get(d.type & ~cl.device_type.DEFAULT, 2))
            except Exception:  # no ICD loader, no platform, import failure: no devices
                found = []
            self._cl_devices = [found[i] for i in visible_devices(len(found))]
        return self._cl_devices

    def is_available(self) -> bool:
        """True if PyOpenCL imports and at least one device supports coarse-grained SVM."""
        return bool(self._devices())

    def device_count(self) -> int:
        """Number of OpenCL devices with coarse-grained SVM; 0 if PyOpenCL is missing."""
        devices = self._cl_devices  # found once; every device argument is counted
        return len(devices if devices is not None else self._devices())

    def is_gpu(self, index: int) -> bool:
        """Return True if device ``index`` is a GPU (auto-detection prefers those)."""
        cl = _import_cl()
        return bool(self._devices()[index].type & cl.device_type.GPU)

    def get_device_properties(self, index: int) -> DeviceProperties:
        """Read the device's name, vendor, memory, compute units and driver from OpenCL."""
        dev = self._devices()[index]
        return DeviceProperties(
            name=dev.name.strip(),
            vendor=dev.vendor.strip(),
            backend=self.name,
            index=index,
            total_memory=int(dev.global_mem_size),
            multi_processor_count=int(dev.max_compute_units),
            max_allocation_bytes=int(dev.max_mem_alloc_size),
            driver_version=dev.driver_version.strip(),
            host_accessible=bool(dev.host_unified_memory),
            pinned_host_memory=self.host_memory_pinned(index),
            raw={
                "platform": dev.platform.name.strip(),
                "version": dev.version.strip(),
                "type": int(dev.type),
                "svm_capabilities": int(dev.svm_capabilities),
                "max_work_group_size": int(dev.max_work_group_size),
                "global_mem_cache_size": int(dev.global_mem_cache_size),
                "local_mem_size": int(dev.local_mem_size),
            },
        )

    def supported_dtypes(self, index: int) -> frozenset[Any]:
        """Return the dtypes device ``index`` supports.

        Integers, bool, float32 and complex64 always (OpenCL requires them); float64 and
        complex128 where the device reports double precision; float16 with ``cl_khr_fp16``.
        """
        dev = self._devices()[index]
        names = ["bool", "float32", "complex64"]
        names += [f"{kind}{bits}" for kind in ("int", "uint") for bits in (8, 16, 32, 64)]
        if dev.double_fp_config:
            names += ["float64", "complex128"]
        if "cl_khr_fp16" in dev.extensions.split():
            names.append("float16")
        return dtypes(names)

    def _dev(self, index: int) -> _CLDevice:
        state = self._state.get(index)
        if state is None:
            with self._lock:
                state = self._state.get(index)
                if state is None:
                    state = _CLDevice(_import_cl(), self._devices()[index], index)
                    self._state[index] = state
        return state

    # memory
    def malloc(self, index: int, nbytes: int) -> int:
        """``clSVMAlloc`` (coarse grain, read-write, unbound to any queue).

        Raises ``BackendOutOfMemory`` when the bytes this process holds on the device would
        exceed its reported global memory: drivers such as PoCL overcommit SVM, so without this
        check capacity, memory fraction and out-of-memory would mean nothing on them. PoCL's
        reported memory follows ``POCL_MEMORY_LIMIT`` (GB).
        """
        cl = _import_cl()
        state = self._dev(index)
        total = int(self._devices()[index].global_mem_size)
        if state.held + nbytes > total:
            raise BackendOutOfMemory(
                f"opencl:{index} holds {state.held} of its {total} bytes; {nbytes} more do not fit"
            )
        try:
            allocation = cl.SVMAllocation(state.context, nbytes, 0, cl.svm_mem_flags.READ_WRITE)
        except cl.Error as exc:
            code = exc.code if hasattr(exc, "code") else None
            if code in _OOM_CODES:
                raise BackendOutOfMemory(str(exc)) from exc
            raise
        ptr = int(allocation.svm_ptr)
        state.allocations[ptr] = allocation
        state.held += nbytes
        return ptr

    def free(self, index: int, ptr: int) -> None:
        """Finish every queue of the device, then ``clSVMFree`` (never enqueued: PoCL bug)."""
        state = self._dev(index)
        allocation = state.allocations.pop(ptr, None)
        if allocation is None:
            raise ValueError(f"opencl:{index}: {ptr:#x} is not an address returned by malloc")
        streams = list(state.streams.values())  # a copy: another thread may add a stream
        for stream in streams:
            _finish(stream)
        for stream in streams:  # every queue has finished: every copy has run
            stream.keep.clear()
        state.svm.clear()
        state.held -= int(allocation.size)
        allocation.release()

    def mem_get_info(self, index: int) -> tuple[int, int]:
        """``(total - bytes held by this process through this backend, total)``."""
        total = int(self._devices()[index].global_mem_size)
        held = self._state[index].held if index in self._state else 0
        return max(total - held, 0), total

    # streams
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

    def context(self, index: int) -> Any:
        """Return the device's ``pyopencl.Context`` (for native interop, e.g. user events)."""
        return self._dev(index).context

    def queue(self, index: int, stream: int) -> Any:
        """Return the ``pyopencl.CommandQueue`` behind a stream handle (for native interop).

        Raises
        ------
        ValueError
            If ``stream`` is not a live stream of device ``index``.
        """
        return self._stream(index, stream).queue

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

    def stream_wait_event(self, index: int, stream: int, event: Any) -> None:
        """Enqueue a barrier that waits for the event's marker."""
        if event.marker is not None:
            found = self._stream(index, stream)
            found.last = _import_cl().enqueue_barrier(found.queue, wait_for=[event.marker])

    # events
    def event_create(self, index: int, timing: bool) -> OpenCLEvent:
        """Return an unrecorded event (markers are made when it is recorded)."""
        return OpenCLEvent(index, timing)

    def event_record(self, event: Any, index: int, stream: int) -> None:
        """Enqueue a marker on the stream's queue."""
        self._stream(index, stream).record(event)

    def event_destroy(self, event: Any) -> None:
        """Drop the event's marker (pyopencl releases the ``cl_event`` with it)."""
        event.marker = None

    def event_query(self, event: Any) -> bool:
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

    def event_synchronize(self, event: Any) -> None:
        """``clWaitForEvents`` on the marker; forget the host objects of the stream's copies
        that have finished (those before the marker have)."""
        marker = event.marker
        if marker is not None:
            try:
                marker.wait()
                keep = event.stream.keep
                if keep:
                    _drop_completed(keep)
            except Exception as exc:
                _raise_driver_error("event_synchronize", exc)
                raise

    def event_elapsed_ms(self, start: Any, end: Any) -> float:
        """Difference of the markers' profiled end times, in milliseconds."""
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

    def host_view(self, index: int, ptr: int, nbytes: int) -> memoryview | None:
        """A view of SVM memory when the device shares the host's memory (PoCL CPU), else None.

        Coarse-grained SVM on a host-unified device is host memory; reading or writing it
        through the view is valid once the work that uses it has completed.
        """
        if not self._devices()[index].host_unified_memory:
            return None
        return memoryview(_host_array(ptr, nbytes)).cast("B")

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

    # host memory (accelrt.empty_host): mapped CL_MEM_ALLOC_HOST_PTR buffers
    _host: _CLHostMemory | None = None

    def _host_memory(self) -> _CLHostMemory:
        host = self._host
        if host is None:
            with self._lock:
                host = self._host
                if host is None:
                    host = self._host = _CLHostMemory()
        return host

    def host_memory_pinned(self, index: int) -> bool:
        """True: host memory is the driver's, ``CL_MEM_ALLOC_HOST_PTR`` buffers mapped into the
        process (page-locked on GPU drivers; on a CPU device such as PoCL's, memory the device
        itself allocated, which it reads and writes without staging)."""
        return True

    def host_alloc(self, index: int, nbytes: int) -> int:
        """Create a ``CL_MEM_ALLOC_HOST_PTR`` buffer and map it read-write for its host address.

        The map runs on a private queue of the device (a blocking map on a stream's queue would
        wait for the stream's work). Raises ``BackendOutOfMemory`` when the driver has no memory
        for the buffer.
        """
        import numpy as np

        cl = _import_cl()
        state = self._dev(index)
        host = self._host_memory()
        with self._lock:
            queue = host.queues.get(index)
            if queue is None:
                queue = host.queues[index] = cl.CommandQueue(state.context, self._devices()[index])
        flags = cl.mem_flags.READ_WRITE | cl.mem_flags.ALLOC_HOST_PTR
        access = cl.map_flags.READ | cl.map_flags.WRITE
        try:
            buffer = cl.Buffer(state.context, flags, nbytes)
            mapped, _ = cl.enqueue_map_buffer(
                queue, buffer, access, 0, (nbytes,), np.uint8, is_blocking=True
            )
        except cl.Error as exc:
            code = exc.code if hasattr(exc, "code") else None
            if code in _OOM_CODES:
                raise BackendOutOfMemory(str(exc)) from exc
            raise
        address = int(mapped.__array_interface__["data"][0])
        with self._lock:
            host.allocations[address] = (index, buffer, mapped)
        return address

    def host_free(self, index: int, ptr: int) -> None:
        """Unmap and release a buffer from ``host_alloc``; ``ValueError`` if ``ptr`` is not one."""
        host = self._host_memory()
        with self._lock:
            entry = host.allocations.pop(ptr, None)
        if entry is None:
            raise ValueError(f"opencl:{index}: {ptr:#x} is not an address returned by host_alloc")
        device, buffer, mapped = entry
        queue = host.queues[device]
        mapped.base.release(queue)  # the pyopencl MemoryMap: enqueue the unmap
        queue.finish()
        buffer.release()


class _CLHostMemory:
    """The host allocations of the backend (address -> device, buffer, mapped array), and per
    device the private queue that maps and unmaps them."""

    __slots__ = ("allocations", "queues")

    def __init__(self) -> None:
        self.allocations: dict[int, tuple[int, Any, Any]] = {}
        self.queues: dict[int, Any] = {}


# stream_query, stream_synchronize, event_record, event_query, event_synchronize and
# memcpy_async map PyOpenCL's errors inline (_raise_driver_error): a wrapper costs a call per call
_DRIVER_CALLS = (
    "malloc", "free", "stream_create", "stream_destroy", "stream_wait_event",
    "event_elapsed_ms", "memset_async", "synchronize",
    "host_alloc", "host_free",  # the host allocator's calls
)  # fmt: skip
map_driver_errors(OpenCLBackend, _DRIVER_CALLS, _raise_driver_error)
