"""Memory of the ``opencl`` backend: coarse-grained SVM for the caching allocator's segments,
mapped ``CL_MEM_ALLOC_HOST_PTR`` buffers for the host caching allocator."""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

from .._base import BackendOutOfMemory
from ._cl import _OOM_CODES, _host_array, _import_cl
from ._devices import _Devices
from ._queues import _finish

if TYPE_CHECKING:
    import pyopencl


def _raise_if_out_of_memory(exc: Exception) -> None:
    """Raise ``BackendOutOfMemory`` (its cause ``exc``) if the PyOpenCL error ``exc`` has one of
    ``_OOM_CODES``: the driver could not meet the request; return for any other error."""
    code = exc.code if hasattr(exc, "code") else None
    if code in _OOM_CODES:
        raise BackendOutOfMemory(str(exc)) from exc


class _DeviceMemory(_Devices):
    """Device memory (``clSVMAlloc``) of the ``opencl`` backend."""

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
            _raise_if_out_of_memory(exc)
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
        state.held -= int(allocation.size or 0)  # (an allocation has a size)
        allocation.release()

    def mem_get_info(self, index: int) -> tuple[int, int]:
        """``(total - bytes held by this process through this backend, total)``."""
        total = int(self._devices()[index].global_mem_size)
        held = self._state[index].held if index in self._state else 0
        return max(total - held, 0), total

    def host_view(self, index: int, ptr: int, nbytes: int) -> memoryview | None:
        """A view of SVM memory when the device shares the host's memory (PoCL CPU), else None.

        Coarse-grained SVM on a host-unified device is host memory; reading or writing it
        through the view is valid once the work that uses it has completed.
        """
        if not self._devices()[index].host_unified_memory:
            return None
        return _host_array(ptr, nbytes).data.cast("B")


class _HostMemory(_Devices):
    """Host memory (mapped ``CL_MEM_ALLOC_HOST_PTR`` buffers) of the ``opencl`` backend."""

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
            _raise_if_out_of_memory(exc)
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


class _MappedArray(Protocol):
    """The numpy array ``pyopencl.enqueue_map_buffer`` maps a host buffer to."""

    @property
    def base(self) -> pyopencl.MemoryMap: ...


class _CLHostMemory:
    """The host allocations of the backend (address -> device, buffer, mapped array), and per
    device the private queue that maps and unmaps them."""

    __slots__ = ("allocations", "queues")

    def __init__(self) -> None:
        # address -> (device, buffer, its mapping)
        self.allocations: dict[int, tuple[int, pyopencl.Buffer, _MappedArray]] = {}
        self.queues: dict[int, pyopencl.CommandQueue] = {}
