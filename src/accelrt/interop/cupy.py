"""CuPy on accelrt's caching allocator: ``cupy.cuda.set_allocator`` with accelrt's pool.

>>> from accelrt.interop import cupy as acc_cupy               # doctest: +SKIP
>>> acc_cupy.use_accelrt_allocator()                            # doctest: +SKIP
>>> x = cupy.arange(10)     # its memory is an accelrt Buffer   # doctest: +SKIP

Each CuPy allocation is an ``accelrt.empty`` on the accelrt device of CuPy's current device,
ordered on CuPy's current stream (``cupy.cuda.get_current_stream()``): the block can be reused
on that stream as soon as CuPy drops it, as with RMM's ``rmm_cupy_allocator``. Memory CuPy uses
on other streams must be protected as for any accelrt buffer (``accelrt.record_stream``).
Needs the ``cuda`` backend as the accelerator; imports CuPy only when called.
"""

from __future__ import annotations

from types import ModuleType
from typing import TYPE_CHECKING

from .. import _runtime
from .._stream import Stream
from ..memory import empty
from . import _cuda_index, _library

if TYPE_CHECKING:
    from cupy.cuda import MemoryPointer

__all__ = ["accelrt_allocator", "use_accelrt_allocator"]

INSTALL_HINT = "pip install cupy-cuda12x (or cupy-cuda13x, matching your CUDA driver)"


def _cupy() -> ModuleType:
    return _library("cupy", "cupy", "CuPy", INSTALL_HINT)


def accelrt_allocator(nbytes: int) -> MemoryPointer:
    """Allocate ``nbytes`` for CuPy from accelrt's caching allocator.

    Parameters
    ----------
    nbytes : int
        Size in bytes, as CuPy asks.

    Returns
    -------
    cupy.cuda.MemoryPointer
        Over a ``cupy.cuda.UnownedMemory`` whose owner is the accelrt ``Buffer``: the memory
        returns to accelrt's cache when CuPy drops the last reference.

    Raises
    ------
    ImportError
        If CuPy is not installed (the message names the pip package).
    RuntimeError
        If the accelerator is not the ``cuda`` backend (or there is none).
    ValueError
        If CuPy's current device is hidden from accelrt.
    OutOfMemoryError
        If the device is out of memory (CuPy sees it as an error from the allocator).

    Notes
    -----
    Ordered on CuPy's current stream (a ``cupy.cuda.Stream``'s ``ptr``; the null stream is
    accelrt's default stream). For ``cupy.cuda.set_allocator``.
    """
    cupy = _cupy()
    backend = _runtime.require_accelerator()
    if backend.name != "cuda":
        raise RuntimeError(
            f"accelrt's CuPy allocator needs the 'cuda' backend, but the accelerator is "
            f"{backend.name!r}: call accelrt.backends.use('cuda') on a machine with a GPU"
        )
    ordinal = int(cupy.cuda.runtime.getDevice())
    index = _cuda_index(backend, ordinal, "CuPy's current device")
    stream = Stream.from_handle(int(cupy.cuda.get_current_stream().ptr), index)
    buffer = empty(nbytes, stream=stream)
    # A null pointer (0 bytes) must not make CuPy query its attributes: device -1, as RMM does.
    memory = cupy.cuda.UnownedMemory(buffer.ptr, nbytes, buffer, ordinal if buffer.ptr else -1)
    return cupy.cuda.MemoryPointer(memory, 0)


def use_accelrt_allocator() -> None:
    """Make CuPy allocate device memory from accelrt (``cupy.cuda.set_allocator``).

    Raises
    ------
    ImportError
        If CuPy is not installed (the message names the pip package).

    Notes
    -----
    Affects every later CuPy allocation in the process; ``cupy.cuda.set_allocator()`` with no
    argument (or CuPy's ``MemoryPool().malloc``) goes back. CuPy's own pool then holds
    nothing: ``accelrt.memory_stats()`` counts CuPy's arrays.
    """
    _cupy().cuda.set_allocator(accelrt_allocator)
