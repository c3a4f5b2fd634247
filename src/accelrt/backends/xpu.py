"""The XPU backend: Intel's SYCL runtime through dpctl (Level Zero GPUs; the OpenCL CPU device).

The device type PyTorch uses for this runtime. Mapping of the runtime's concepts onto SYCL:

- device memory is USM device memory (``sycl::malloc_device`` through
  ``dpctl.memory.MemoryUSMDevice``): pointers are plain integers, so the caching allocator
  splits segments by offset; host memory for ``accelrt.empty_host`` is USM host memory
  (``sycl::malloc_host``, ``MemoryUSMHost``: page-locked on GPUs);
- a stream is an in-order queue with profiling (``dpctl.SyclQueue(context, device,
  property=["in_order", "enable_profiling"])``); every queue of a device shares one
  ``SyclContext``, so memory is usable on all of them; handle 0 is the device's default queue;
- an event is a barrier (``submit_barrier()``) recorded on the queue: a marker whose
  ``SyclEvent`` carries the profiling times (ns) and the execution status;
- waiting on an event from another queue is ``submit_barrier([event])``;
- copies are ``queue.memcpy_async`` in every direction, fills ``sycl::queue::memset``
  (through dpctl's C interface, ``DPCTLQueue_Memset``).

Discovery: GPUs first (Level Zero's where both Level Zero and OpenCL list them), else the CPU
and accelerator devices. The ``intel-opencl-rt`` wheel installs Intel's OpenCL CPU runtime into
``sys.prefix/lib``, but its ICD file names a path that does not exist, so the ICD loader finds
no device: unless ``OCL_ICD_FILENAMES`` is set, the backend points it at that runtime
(``libintelocl.so``) before dpctl first loads the SYCL runtime. ``unavailable_reason`` (shown by
``accelrt info``) says why there is no device when there is none.

SYCL reports no free device memory in general (Level Zero's ``ext_intel_free_memory`` is not
reachable through dpctl 0.22): ``mem_get_info`` returns ``total - bytes this process holds
through this backend``, and ``malloc`` refuses to go beyond the device's
``global_mem_size`` (on the CPU device, host memory it would overcommit). SYCL has no
virtual-memory API reachable from Python (Level Zero's ``zeVirtualMemReserve``/``Map`` are not
wrapped by dpctl), so ``expandable_segments`` falls back to ordinary segments with a warning.
"""

from __future__ import annotations

import ctypes
import glob
import os
import sys
import threading
from collections import deque
from typing import Any

from .._device import DeviceProperties
from .._errors import AcceleratorError
from .._text import error_line
from ._base import (
    BackendOutOfMemory,
    NoVirtualMemory,
    dtypes,
    map_driver_errors,
    visible_devices,
)

__all__ = ["INSTALL_HINT", "XPUBackend", "XPUEvent", "setup_icd"]

INSTALL_HINT = "pip install 'accelrt[xpu]'"
"""How to install what the backend needs (dpctl and Intel's OpenCL CPU runtime)."""


# how many cached dpctl views of device memory ranges a device keeps (see _XPUDevice.view)
_VIEW_CACHE_SIZE = 4096
# a copy of host memory forgets the finished ones at the head of its queue's list once it holds
# this many (see _XPUStream.memcpy_async)
_KEEP_SCAN = 32

_icd_note: list[str] = []  # what setup_icd did, for unavailable_reason


def setup_icd() -> str | None:
    """Point the OpenCL ICD loader at Intel's runtime inside the environment, where needed.

    Returns
    -------
    str or None
        The library ``OCL_ICD_FILENAMES`` was set to, or None when nothing was done: the
        variable was already set (the user's choice wins), or no ``libintelocl.so*`` is in
        ``sys.prefix/lib`` (no ``intel-opencl-rt`` installed).

    Notes
    -----
    Must run before dpctl first enumerates devices (the SYCL runtime reads the variable once);
    the backend calls it before importing dpctl. It changes ``os.environ``, so subprocesses
    see the same devices. Other OpenCL ICDs (``/etc/OpenCL/vendors``) stay visible: the loader
    loads the listed file in addition to those. PyOpenCL's bundled loader ignores it.
    """
    if os.environ.get("OCL_ICD_FILENAMES"):
        return None
    libdir = os.path.join(sys.prefix, "lib")
    found = sorted(glob.glob(os.path.join(libdir, "libintelocl.so.*")))
    found = [p for p in found if not p.endswith(".py")]
    if not found and os.path.exists(os.path.join(libdir, "libintelocl.so")):
        found = [os.path.join(libdir, "libintelocl.so")]
    if not found:
        return None
    os.environ["OCL_ICD_FILENAMES"] = found[-1]
    return found[-1]


def _import_dpctl() -> Any:
    """Set up the ICD (once), then import dpctl and dpctl.memory."""
    if not _icd_note:
        path = setup_icd()
        _icd_note.append(path or "")
    import dpctl
    import dpctl.memory

    return dpctl


def _describe(device: Any) -> str:
    """A SYCL device in words: its filter string and name (a sub-device has no filter)."""
    try:
        where = repr(str(device.filter_string))
    except Exception:  # dpctl: "This SyclDevice is not a root device"
        where = "(a sub-device)"
    return f"{where} {str(device.name).strip()!r}"


def _raise_driver_error(call: str, exc: Exception) -> None:
    """Raise ``AcceleratorError`` from ``exc`` if dpctl (or SYCL) raised it; return otherwise."""
    if type(exc).__module__.partition(".")[0] == "dpctl":
        raise AcceleratorError(f"SYCL {call} failed: {error_line(exc)}") from exc


class _USMRange:
    """A ``__sycl_usm_array_interface__`` of bytes inside a USM allocation (for dpctl views)."""

    __slots__ = ("__sycl_usm_array_interface__",)

    def __init__(self, ptr: int, nbytes: int, syclobj: Any) -> None:
        self.__sycl_usm_array_interface__ = {
            "data": (ptr, False),
            "shape": (nbytes,),
            "strides": None,
            "typestr": "|u1",
            "version": 1,
            "syclobj": syclobj,
        }


class XPUEvent:
    """An XPU event handle: the ``dpctl.SyclEvent`` of its last recording (a barrier; None
    before the first) and the stream it was recorded on."""

    __slots__ = ("device", "marker", "stream", "timing")

    def __init__(self, device: int, timing: bool) -> None:
        self.device = device
        self.timing = timing
        self.marker: Any = None
        self.stream: _XPUStream | None = None


_complete: list[Any] = []  # dpctl.event_status_type.complete, once dpctl is imported


def _no_stream(index: int, stream: int) -> ValueError:
    return ValueError(
        f"xpu:{index} has no stream with handle {stream:#x}: it was destroyed or belongs to "
        "another device"
    )


class _XPUStream:
    """One stream of a device (``StreamOps``): its in-order queue and the last command accelrt
    submitted to it (None when known finished), and the host objects of its copies in flight.

    ``stream_destroy`` sets ``queue`` to None: the methods that submit or wait then raise the
    ``ValueError`` of an unknown handle, and ``query`` is True.
    """

    __slots__ = ("complete", "device", "handle", "keep", "last", "owned", "queue")

    def __init__(self, device: _XPUDevice, handle: int, queue: Any, owned: bool) -> None:
        self.device = device
        self.handle = handle
        self.queue: Any = queue
        self.owned = owned  # False for a queue adopted from the user (Stream.from_handle)
        self.last: Any = None
        self.keep: deque[tuple[Any, Any]] = deque()
        self.complete = device.complete

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

    def record(self, event: Any) -> None:
        """Submit a barrier: the event's new marker."""
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
        host: Any = None
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


def _drop_completed(keep: deque[tuple[Any, Any]], complete: Any) -> None:
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


class _XPUDevice:
    """Per-device state, created on first use of the device: its context, queues, memory."""

    __slots__ = (
        "allocations", "complete", "context", "device", "dpctl", "held", "index", "streams",
        "views",
    )  # fmt: skip

    def __init__(self, dpctl: Any, device: Any, index: int) -> None:
        self.dpctl = dpctl
        self.device = device
        self.index = index
        self.context = dpctl.SyclContext(device)
        self.complete = dpctl.event_status_type.complete
        if not _complete:
            _complete.append(self.complete)
        self.allocations: dict[int, Any] = {}
        self.held = 0
        # (pointer, bytes) -> a dpctl MemoryUSMDevice view of that range (copies use it);
        # building one costs ~15 us, so it is kept until memory is freed or the cache fills
        self.views: dict[tuple[int, int], Any] = {}
        self.streams: dict[int, _XPUStream] = {}
        self.streams[0] = _XPUStream(self, 0, self.new_queue(), owned=True)

    def new_queue(self) -> Any:
        """Return a new in-order, profiling queue of the device in its context."""
        return self.dpctl.SyclQueue(
            self.context, self.device, property=["in_order", "enable_profiling"]
        )

    def view(self, ptr: int, nbytes: int) -> Any:
        """Return (and cache) a dpctl ``MemoryUSMDevice`` over ``[ptr, ptr + nbytes)``."""
        views = self.views
        if len(views) >= _VIEW_CACHE_SIZE:
            views.clear()
        view = views[(ptr, nbytes)] = self.dpctl.memory.MemoryUSMDevice(
            _USMRange(ptr, nbytes, self.context)
        )
        return view

    def finish_all(self) -> None:
        """Wait for every queue of the device; forget the host objects of their copies."""
        streams = list(self.streams.values())  # a copy: another thread may add a stream
        for stream in streams:
            queue = stream.queue
            if queue is not None:
                queue.wait()
            stream.last = None
        for stream in streams:
            stream.keep.clear()


_dpctl_lib: list[Any] = []


def _memset_lib(dpctl: Any) -> Any:
    """dpctl's C interface with ``DPCTLQueue_Memset`` and ``DPCTLEvent_Delete`` typed."""
    if not _dpctl_lib:
        lib = ctypes.CDLL(os.path.join(dpctl.__path__[0], "libDPCTLSyclInterface.so"))
        lib.DPCTLQueue_Memset.restype = ctypes.c_void_p
        lib.DPCTLQueue_Memset.argtypes = [
            ctypes.c_void_p, ctypes.c_void_p, ctypes.c_uint8, ctypes.c_size_t,
        ]  # fmt: skip
        lib.DPCTLEvent_Delete.restype = None
        lib.DPCTLEvent_Delete.argtypes = [ctypes.c_void_p]
        _dpctl_lib.append(lib)
    return _dpctl_lib[0]


class XPUBackend(NoVirtualMemory):
    """The ``xpu`` backend: SYCL devices through dpctl, GPUs first, else the CPU device.

    Notes
    -----
    ``is_available`` and ``device_count`` import dpctl and enumerate devices (the SYCL
    runtime creates no context for that); importing accelrt imports no dpctl. Thread-safe: one
    lock guards the lazy per-device state. ``ACCELRT_VISIBLE_DEVICES`` indexes the order.
    """

    no_vmm_reason = (
        "SYCL has no virtual-memory API that dpctl reaches (Level Zero's zeVirtualMemReserve and "
        "zeVirtualMemMap are not wrapped by dpctl 0.22)"
    )

    name = "xpu"

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._sycl_devices: list[Any] | None = None
        self._reason: str | None = None
        self._state: dict[int, _XPUDevice] = {}
        self._next_stream = 1
        self._host: dict[int, tuple[int, Any]] = {}

    # ------------------------------------------------------------------ discovery
    def _probe(self) -> tuple[list[Any], str | None]:
        try:
            dpctl = _import_dpctl()
        except ImportError as exc:
            return [], f"dpctl is not installed ({INSTALL_HINT}): {error_line(exc)}"
        except Exception as exc:
            return [], f"dpctl could not be imported: {error_line(exc)}"
        try:
            every = list(dpctl.get_devices())
        except Exception as exc:
            return [], f"the SYCL runtime found no devices: {error_line(exc)}"
        usable = [d for d in every if d.has_aspect_usm_device_allocations]
        gpus = [d for d in usable if d.is_gpu]
        if gpus:  # one backend's GPUs: Level Zero's where both list them
            zero = [d for d in gpus if d.backend == dpctl.backend_type.level_zero]
            found = zero or gpus
        else:
            found = [d for d in usable if d.is_accelerator] + [d for d in usable if d.is_cpu]
        if found:
            return found, None
        if every:
            return [], (
                f"the SYCL runtime lists {len(every)} device(s) but none supports USM device "
                "allocations"
            )
        icd = _icd_note[0] if _icd_note else ""
        user = os.environ.get("OCL_ICD_FILENAMES", "")
        if icd:
            why = f"OCL_ICD_FILENAMES was set to {icd} and the SYCL runtime still found none"
        elif user:
            why = (
                f"OCL_ICD_FILENAMES={user!r} (set by the user) gives the SYCL runtime no device; "
                "point it at libintelocl.so of the intel-opencl-rt package, or unset it"
            )
        else:
            why = (
                f"no Intel OpenCL CPU runtime in {os.path.join(sys.prefix, 'lib')} "
                f"(pip install intel-opencl-rt, or {INSTALL_HINT}) and no Level Zero GPU driver"
            )
        return [], f"dpctl sees no SYCL device: {why}"

    def _devices(self) -> list[Any]:
        if self._sycl_devices is None:
            with self._lock:
                if self._sycl_devices is None:
                    found, reason = self._probe()
                    chosen = [found[i] for i in visible_devices(len(found))]
                    if found and not chosen:
                        reason = f"ACCELRT_VISIBLE_DEVICES hides all {len(found)} XPU device(s)"
                    self._reason = reason
                    self._sycl_devices = chosen
        return self._sycl_devices

    def is_available(self) -> bool:
        """True if dpctl imports and the SYCL runtime lists a device with USM; never raises."""
        return bool(self._devices())

    def device_count(self) -> int:
        """Return the number of usable SYCL devices; 0 without dpctl or devices; never raises."""
        devices = self._sycl_devices
        return len(devices if devices is not None else self._devices())

    def unavailable_reason(self) -> str | None:
        """Return why there are no XPU devices (``accelrt info`` shows it), or None.

        Returns
        -------
        str or None
            e.g. ``"dpctl is not installed (pip install 'accelrt[xpu]'): ..."`` or
            ``"dpctl sees no SYCL device: no Intel OpenCL CPU runtime in ..."``.
        """
        self._devices()
        return self._reason

    def is_gpu(self, index: int) -> bool:
        """Return True if device ``index`` is a GPU."""
        return bool(self._devices()[index].is_gpu)

    def sycl_device(self, index: int) -> Any:
        """Return the ``dpctl.SyclDevice`` of device ``index`` (for native interop)."""
        return self._devices()[index]

    def get_device_properties(self, index: int) -> DeviceProperties:
        """Read the device's name, vendor, memory, compute units and driver from SYCL."""
        dev = self._devices()[index]
        return DeviceProperties(
            name=str(dev.name).strip(),
            vendor=str(dev.vendor).strip(),
            backend=self.name,
            index=index,
            total_memory=int(dev.global_mem_size),
            multi_processor_count=int(dev.max_compute_units),
            max_allocation_bytes=int(dev.max_mem_alloc_size),
            driver_version=str(dev.driver_version).strip(),
            host_accessible=bool(dev.is_cpu),
            pinned_host_memory=self.host_memory_pinned(index),
            raw={
                "platform": str(dev.sycl_platform.name).strip(),
                "sycl_backend": str(dev.backend.name),
                "device_type": str(dev.device_type.name),
                "filter_string": str(dev.filter_string),
                "max_work_group_size": int(dev.max_work_group_size),
                "global_mem_cache_size": int(dev.global_mem_cache_size),
                "local_mem_size": int(dev.local_mem_size),
                "max_clock_frequency": int(dev.max_clock_frequency),
                "sub_group_sizes": tuple(int(s) for s in dev.sub_group_sizes),
            },
        )

    def supported_dtypes(self, index: int) -> frozenset[Any]:
        """Integers, bool, float32 and complex64; float64/complex128 with the ``fp64`` aspect,
        float16 with ``fp16``."""
        dev = self._devices()[index]
        names = ["bool", "float32", "complex64"]
        names += [f"{kind}{bits}" for kind in ("int", "uint") for bits in (8, 16, 32, 64)]
        if dev.has_aspect_fp64:
            names += ["float64", "complex128"]
        if dev.has_aspect_fp16:
            names.append("float16")
        return dtypes(names)

    def _dev(self, index: int) -> _XPUDevice:
        state = self._state.get(index)
        if state is None:
            with self._lock:
                state = self._state.get(index)
                if state is None:
                    state = _XPUDevice(_import_dpctl(), self._devices()[index], index)
                    self._state[index] = state
        return state

    def context(self, index: int) -> Any:
        """Return the device's ``dpctl.SyclContext``: every stream's queue and all memory of
        the backend belong to it (for native interop)."""
        return self._dev(index).context

    # ------------------------------------------------------------------ memory
    def malloc(self, index: int, nbytes: int) -> int:
        """``sycl::malloc_device`` (``dpctl.memory.MemoryUSMDevice``) in the device's context.

        Raises ``BackendOutOfMemory`` when the bytes this process holds on the device would
        exceed its ``global_mem_size`` (the CPU device would overcommit host memory), or when
        the runtime cannot allocate; ``AcceleratorError`` for other SYCL errors.
        """
        state = self._dev(index)
        total = int(state.device.global_mem_size)
        if state.held + nbytes > total:
            raise BackendOutOfMemory(
                f"xpu:{index} holds {state.held} of its {total} bytes; {nbytes} more do not fit"
            )
        try:
            memory = state.dpctl.memory.MemoryUSMDevice(nbytes, queue=state.streams[0].queue)
        except MemoryError as exc:
            raise BackendOutOfMemory(f"xpu:{index}: {nbytes} bytes: {error_line(exc)}") from exc
        except Exception as exc:
            if "alloc" in str(exc).lower():  # dpctl's USMAllocationError
                raise BackendOutOfMemory(f"xpu:{index}: {error_line(exc)}") from exc
            raise
        ptr = int(memory.__sycl_usm_array_interface__["data"][0])
        state.allocations[ptr] = memory
        state.held += nbytes
        return ptr

    def free(self, index: int, ptr: int) -> None:
        """Wait for every queue of the device, then ``sycl::free`` (the dpctl object dropped).

        Raises ``ValueError`` if ``ptr`` is not an address ``malloc`` returned.
        """
        state = self._dev(index)
        memory = state.allocations.pop(ptr, None)
        if memory is None:
            raise ValueError(f"xpu:{index}: {ptr:#x} is not an address returned by malloc")
        state.finish_all()
        state.views.clear()
        state.held -= int(memory.nbytes)
        del memory

    def mem_get_info(self, index: int) -> tuple[int, int]:
        """``(total - bytes held by this process through this backend, total)``: approximated,
        since SYCL reports no free memory through dpctl; total is ``global_mem_size``."""
        total = int(self._devices()[index].global_mem_size)
        held = self._state[index].held if index in self._state else 0
        return max(total - held, 0), total

    # ------------------------------------------------------------------ streams
    def stream_create(self, index: int, priority: int) -> int:
        """Create an in-order, profiling queue in the device's context; priority is advisory
        (dpctl 0.22 creates no prioritised queues)."""
        state = self._dev(index)
        with self._lock:
            handle = self._next_stream
            self._next_stream += 1
        state.streams[handle] = _XPUStream(state, handle, state.new_queue(), owned=True)
        return handle

    def adopt_queue(self, index: int, queue: Any) -> int:
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

    def stream_ops(self, index: int, stream: int) -> _XPUStream | None:
        """Return the stream's ``StreamOps`` (one object per handle), None for an unknown one."""
        return self._dev(index).streams.get(stream)

    def _stream(self, index: int, stream: int) -> _XPUStream:
        found = self._dev(index).streams.get(stream)
        if found is None:
            raise _no_stream(index, stream)
        return found

    def queue(self, index: int, stream: int) -> Any:
        """Return the ``dpctl.SyclQueue`` behind a stream handle (for native interop).

        Raises ``ValueError`` if ``stream`` is not a live stream of device ``index``.
        """
        return self._stream(index, stream).queue

    def native_stream(self, index: int, stream: int) -> int:
        """Return the ``DPCTLSyclQueueRef`` of a stream's queue as an int (``Stream.
        native_handle``); ``ValueError`` if ``stream`` is not a live stream of device ``index``.
        """
        return int(self.queue(index, stream).addressof_ref())

    def stream_destroy(self, index: int, stream: int) -> None:
        """Wait for the queue and drop it (an adopted queue is only forgotten)."""
        state = self._state.get(index)
        if state is None:
            return
        found = state.streams.pop(stream, None)
        if found is not None:
            queue, found.queue = found.queue, None
            if found.owned:
                queue.wait()
            found.last = None
            found.keep.clear()

    def stream_query(self, index: int, stream: int) -> bool:
        """Whether the last command accelrt submitted to the queue has completed (True for a
        handle that is not a live stream)."""
        state = self._state.get(index)
        found = state.streams.get(stream) if state is not None else None
        return found is None or found.query()

    def stream_synchronize(self, index: int, stream: int) -> None:
        """``queue.wait()``."""
        self._stream(index, stream).synchronize()

    def stream_wait_event(self, index: int, stream: int, event: Any) -> None:
        """Submit a barrier that waits for the event's marker (``submit_barrier([marker])``)."""
        marker = event.marker
        if marker is not None:
            found = self._stream(index, stream)
            found.last = found.queue.submit_barrier([marker])

    # ------------------------------------------------------------------ events
    def event_create(self, index: int, timing: bool) -> XPUEvent:
        """Return an unrecorded event (its marker is made when it is recorded)."""
        return XPUEvent(index, timing)

    def event_record(self, event: Any, index: int, stream: int) -> None:
        """Submit a barrier on the stream's queue: the event's marker."""
        self._stream(index, stream).record(event)

    def event_destroy(self, event: Any) -> None:
        """Drop the event's marker."""
        event.marker = None

    def event_query(self, event: Any) -> bool:
        """True if unrecorded or the marker's execution status is ``complete``."""
        marker = event.marker
        if marker is None:
            return True
        try:
            done: bool = marker.execution_status == _complete[0]
        except Exception as exc:
            _raise_driver_error("event_query", exc)
            raise
        return done

    def event_synchronize(self, event: Any) -> None:
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

    def event_elapsed_ms(self, start: Any, end: Any) -> float:
        """Difference of the markers' profiled end times (ns), in milliseconds."""
        return float(end.marker.profiling_info_end - start.marker.profiling_info_end) / 1e6

    # ------------------------------------------------------------------ copies
    def memcpy_async(
        self, index: int, dst: int | memoryview, src: int | memoryview, nbytes: int, stream: int
    ) -> None:
        """``queue.memcpy_async``; host memory is kept alive until the copy completes."""
        self._stream(index, stream).memcpy_async(dst, src, nbytes)

    def memset_async(self, index: int, ptr: int, value: int, nbytes: int, stream: int) -> None:
        """``sycl::queue::memset`` (``DPCTLQueue_Memset``), then a barrier as the stream's last
        command (what ``query`` asks)."""
        found = self._stream(index, stream)
        queue = found.queue
        lib = _memset_lib(found.device.dpctl)
        ref = lib.DPCTLQueue_Memset(queue.addressof_ref(), ptr, value & 0xFF, nbytes)
        if not ref:
            raise AcceleratorError(
                f"SYCL memset of {nbytes} bytes at {ptr:#x} on xpu:{index} failed"
            )
        lib.DPCTLEvent_Delete(ref)  # the in-order queue orders the barrier after it
        found.last = queue.submit_barrier()

    def host_view(self, index: int, ptr: int, nbytes: int) -> memoryview | None:
        """A view of device memory on a CPU device (USM device memory is host memory there),
        else None. Valid once the work that uses it has completed."""
        if not self._devices()[index].is_cpu:
            return None
        return memoryview((ctypes.c_char * nbytes).from_address(ptr)).cast("B")

    def synchronize(self, index: int) -> None:
        """``queue.wait()`` on every queue of the device."""
        state = self._state.get(index)
        if state is not None:
            state.finish_all()

    # ------------------------------------------------------------------ host memory
    def host_memory_pinned(self, index: int) -> bool:
        """True: ``host_alloc`` memory is USM host memory, the driver's own (page-locked on
        GPUs; on the CPU device, memory the device reads and writes without staging)."""
        return True

    def host_alloc(self, index: int, nbytes: int) -> int:
        """``sycl::malloc_host`` (``dpctl.memory.MemoryUSMHost``) in the device's context.

        Raises ``BackendOutOfMemory`` when the runtime cannot allocate it.
        """
        state = self._dev(index)
        try:
            memory = state.dpctl.memory.MemoryUSMHost(nbytes, queue=state.streams[0].queue)
        except MemoryError as exc:
            raise BackendOutOfMemory(f"xpu:{index}: {nbytes} host bytes: {exc}") from exc
        except Exception as exc:
            if "alloc" in str(exc).lower():
                raise BackendOutOfMemory(f"xpu:{index}: {error_line(exc)}") from exc
            raise
        ptr = int(memory.__sycl_usm_array_interface__["data"][0])
        with self._lock:
            self._host[ptr] = (index, memory)
        return ptr

    def host_free(self, index: int, ptr: int) -> None:
        """``sycl::free`` of memory from ``host_alloc``; ``ValueError`` if ``ptr`` is not one."""
        with self._lock:
            entry = self._host.pop(ptr, None)
        if entry is None:
            raise ValueError(f"xpu:{index}: {ptr:#x} is not an address returned by host_alloc")
        del entry


_DRIVER_CALLS = (
    "malloc", "free", "stream_create", "stream_destroy", "stream_wait_event",
    "event_elapsed_ms", "memset_async", "synchronize", "host_alloc", "host_free",
)  # fmt: skip
map_driver_errors(XPUBackend, _DRIVER_CALLS, _raise_driver_error)
