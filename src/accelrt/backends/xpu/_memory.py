"""Memory of the ``xpu`` backend: USM device allocations for the caching allocator's
segments, USM host allocations for the host caching allocator."""

from __future__ import annotations

import ctypes
from collections.abc import Callable
from typing import Any

from ..._text import error_line
from .._base import BackendOutOfMemory
from ._devices import _Devices


def _usm_allocation(index: int, nbytes: int, kind: str, make: Callable[[], Any]) -> Any:
    """``make()``, a dpctl USM allocation of ``nbytes`` ``kind`` on device ``index``.

    Raises ``BackendOutOfMemory`` (its cause the runtime's error) for a ``MemoryError`` or
    dpctl's ``USMAllocationError`` (its text names the allocation); other errors pass as they
    are.
    """
    try:
        return make()
    except MemoryError as exc:
        raise BackendOutOfMemory(f"xpu:{index}: {nbytes} {kind}: {error_line(exc)}") from exc
    except Exception as exc:
        if "alloc" in str(exc).lower():
            raise BackendOutOfMemory(f"xpu:{index}: {error_line(exc)}") from exc
        raise


class _DeviceMemory(_Devices):
    """Device memory (``sycl::malloc_device``) of the ``xpu`` backend."""

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
        queue = state.streams[0].queue
        memory = _usm_allocation(
            index, nbytes, "bytes", lambda: state.dpctl.memory.MemoryUSMDevice(nbytes, queue=queue)
        )
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
        state.forget_views()
        state.held -= int(memory.nbytes)
        del memory

    def mem_get_info(self, index: int) -> tuple[int, int]:
        """``(total - bytes held by this process through this backend, total)``: approximated,
        since SYCL reports no free memory through dpctl; total is ``global_mem_size``."""
        total = int(self._devices()[index].global_mem_size)
        held = self._state[index].held if index in self._state else 0
        return max(total - held, 0), total

    def host_view(self, index: int, ptr: int, nbytes: int) -> memoryview | None:
        """A view of device memory on a CPU device (USM device memory is host memory there),
        else None. Valid once the work that uses it has completed."""
        if not self._devices()[index].is_cpu:
            return None
        return memoryview((ctypes.c_char * nbytes).from_address(ptr)).cast("B")


class _HostMemory(_Devices):
    """Host memory (``sycl::malloc_host``) of the ``xpu`` backend."""

    def host_alloc(self, index: int, nbytes: int) -> int:
        """``sycl::malloc_host`` (``dpctl.memory.MemoryUSMHost``) in the device's context.

        Raises ``BackendOutOfMemory`` when the runtime cannot allocate it.
        """
        state = self._dev(index)
        queue = state.streams[0].queue
        memory = _usm_allocation(
            index,
            nbytes,
            "host bytes",
            lambda: state.dpctl.memory.MemoryUSMHost(nbytes, queue=queue),
        )
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
