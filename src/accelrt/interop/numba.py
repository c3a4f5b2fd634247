"""Numba on accelrt's caching allocator: an External Memory Management (EMM) plugin.

>>> from accelrt.interop import numba as acc_numba             # doctest: +SKIP
>>> acc_numba.use_accelrt_allocator()   # before Numba makes its context  # doctest: +SKIP
>>> d = numba.cuda.device_array(10)     # its memory is an accelrt Buffer # doctest: +SKIP

or, without code, ``NUMBA_CUDA_MEMORY_MANAGER=accelrt.interop.numba``. The plugin,
:class:`AccelrtNumbaManager` (a ``numba.cuda.HostOnlyCUDAMemoryManager``: Numba keeps managing
host memory), allocates device memory with ``accelrt.empty`` on the accelrt device of Numba's
context, ordered on accelrt's current stream of that device (the default stream unless set;
Numba's EMM interface passes no stream). Imports Numba only when used.
"""

from __future__ import annotations

import ctypes
import functools
import importlib
from types import ModuleType
from typing import TYPE_CHECKING, Any, NoReturn

from .. import _runtime
from .._stream import current_stream
from ..memory import Buffer, empty, empty_cache, get_memory_info
from . import _cuda_index, _library

if TYPE_CHECKING:
    from cuda.bindings.driver import CUdeviceptr
    from numba.cuda import MemoryInfo, MemoryPointer

__all__ = ["AccelrtNumbaManager", "use_accelrt_allocator"]  # noqa: F822 (module __getattr__)

INSTALL_HINT = "pip install numba-cuda"


def _numba_cuda() -> ModuleType:
    return _library("numba.cuda", "numba", "Numba", INSTALL_HINT)


def _device_pointer(ptr: int) -> CUdeviceptr | ctypes.c_uint64:
    """The pointer type Numba's ``MemoryPointer`` takes with the binding Numba's driver uses.

    numba-cuda always drives CUDA through ``cuda-bindings`` (its driver module has no
    ``USE_NV_BINDING``, and its ``NUMBA_CUDA_USE_NVIDIA_BINDING`` setting no longer chooses):
    a ``CUdeviceptr``. The ``numba.cuda`` of Numba 0.60 and older uses ``cuda-bindings`` only
    when its driver's ``USE_NV_BINDING`` is true, and ctypes (a ``c_uint64``) otherwise.
    """
    driver = importlib.import_module("numba.cuda.cudadrv.driver")
    if getattr(driver, "USE_NV_BINDING", True):
        from cuda.bindings.driver import CUdeviceptr

        return CUdeviceptr(ptr)
    return ctypes.c_uint64(ptr)


@functools.cache
def _manager_class() -> type:
    cuda = _numba_cuda()
    base: Any = cuda.HostOnlyCUDAMemoryManager  # a dynamic base class

    class AccelrtNumbaManager(base):  # type: ignore[misc]
        """Numba's device memory from accelrt's caching allocator (EMM interface version 1).

        Notes
        -----
        ``memalloc`` returns a ``numba.cuda.MemoryPointer`` whose finaliser frees the accelrt
        ``Buffer`` (the block returns to accelrt's cache); ``get_memory_info`` is
        ``accelrt.get_memory_info``; ``reset`` also empties accelrt's cache for the device.
        IPC handles are not supported yet (``get_ipc_handle`` raises ``NotImplementedError``).
        Needs the ``cuda`` backend as the accelerator. Mirrors RMM's ``RMMNumbaManager``.
        """

        def initialize(self) -> None:
            """Check that accelrt runs CUDA and map Numba's device to accelrt's.

            Raises
            ------
            RuntimeError
                If the accelerator is not the ``cuda`` backend.
            ValueError
                If Numba's device is hidden from accelrt (``ACCELRT_VISIBLE_DEVICES``).
            """
            super().initialize()
            self._accelrt_index()

        def _accelrt_index(self) -> int:
            backend = _runtime.require_accelerator()
            if backend.name != "cuda":
                raise RuntimeError(
                    f"accelrt's Numba memory manager needs the 'cuda' backend, but the "
                    f"accelerator is {backend.name!r}: call accelrt.backends.use('cuda')"
                )
            return _cuda_index(backend, int(self.context.device.id), "Numba's context")

        def memalloc(self, size: int) -> MemoryPointer:
            """Allocate ``size`` bytes of device memory from accelrt.

            Returns
            -------
            numba.cuda.MemoryPointer

            Raises
            ------
            OutOfMemoryError
                If the device has no memory for it.
            """
            index = self._accelrt_index()
            buffer = empty(size, stream=current_stream(index))
            return cuda.MemoryPointer(
                self.context,
                _device_pointer(buffer.ptr),
                size,
                finalizer=_finalizer(buffer),
            )

        def get_memory_info(self) -> MemoryInfo:
            """Return ``numba.cuda.MemoryInfo(free, total)`` of the device, in bytes."""
            free, total = get_memory_info(self._accelrt_index())
            return cuda.MemoryInfo(free=free, total=total)

        def get_ipc_handle(self, memory: MemoryPointer) -> NoReturn:
            """Not supported yet.

            Raises
            ------
            NotImplementedError
                Always: accelrt does not export IPC handles of its blocks yet.
            """
            raise NotImplementedError(
                "accelrt's Numba memory manager cannot make IPC handles yet; use Numba's own "
                "memory manager for arrays shared between processes"
            )

        def reset(self) -> None:
            """Numba's context reset: release Numba's host memory and accelrt's cache."""
            super().reset()
            empty_cache(self._accelrt_index())

        @property
        def interface_version(self) -> int:
            """The EMM interface version this plugin implements: 1."""
            return 1

    return AccelrtNumbaManager


class _Release:
    """Numba's finaliser of a ``MemoryPointer``: lets go of the ``Buffer`` behind it.

    Numba runs it from ``weakref.finalize`` when the pointer is collected, which may be in
    the middle of an accelrt allocator call on this thread (the garbage collector runs where
    objects are made). So it does not call ``buffer.free()``, which would re-enter that call:
    it drops the only reference, and the buffer's own finaliser frees the block, at once or,
    inside an allocator call, as that call ends.
    """

    __slots__ = ("buffer",)

    def __init__(self, buffer: Buffer) -> None:
        self.buffer: Buffer | None = buffer

    def __call__(self) -> None:
        self.buffer = None


def _finalizer(buffer: Buffer) -> _Release:
    """A finaliser that frees ``buffer`` without keeping the MemoryPointer alive."""
    return _Release(buffer)


def use_accelrt_allocator() -> None:
    """Make Numba allocate device memory from accelrt (``numba.cuda.set_memory_manager``).

    Call it before Numba creates its CUDA context (before the first device array or kernel
    launch), as Numba requires for any EMM plugin. Raises ``ImportError`` if Numba is not
    installed; the message names the pip package.
    """
    _numba_cuda().set_memory_manager(_manager_class())


def __getattr__(name: str) -> type:
    """``AccelrtNumbaManager`` and ``_numba_memory_manager`` (the name Numba's
    ``NUMBA_CUDA_MEMORY_MANAGER`` looks up), made on first use: they subclass a Numba class."""
    if name in ("AccelrtNumbaManager", "_numba_memory_manager"):
        return _manager_class()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
