"""PyOpenCL for the ``opencl`` backend: importing it, the status and error codes the backend
reads, PyOpenCL's errors as ``AcceleratorError``, host views of SVM memory."""

from __future__ import annotations

import ctypes
from collections.abc import Callable, Sequence
from types import ModuleType
from typing import TYPE_CHECKING, Protocol, TypeAlias

from ..._errors import AcceleratorError

if TYPE_CHECKING:
    import numpy as np
    import numpy.typing as npt
    import pyopencl

# CL_OUT_OF_RESOURCES, CL_MEM_OBJECT_ALLOCATION_FAILURE, CL_OUT_OF_HOST_MEMORY,
# CL_INVALID_BUFFER_SIZE: what clSVMAlloc reports when a request cannot be met.
_OOM_CODES = frozenset({-5, -4, -6, -61})


class CLProfile(Protocol):
    """The profiled times of a command (``pyopencl.Event.profile``), in nanoseconds."""

    @property
    def end(self) -> int: ...


class CLEvent(Protocol):
    """What the backend uses of a ``pyopencl.Event`` (a copy's, a fill's or a marker's): its
    execution status, read with the raw ``cl_event_info`` code (``_EXECUTION_STATUS``), a
    blocking wait and its profiled times."""

    def get_info(self, param: int, /) -> int: ...

    def wait(self) -> None: ...

    @property
    def profile(self) -> CLProfile: ...


WaitList: TypeAlias = "Sequence[CLEvent] | None"
"""The events an enqueued command waits for (``wait_for``)."""

SVMMemcpy: TypeAlias = (
    "Callable[[pyopencl.CommandQueue, bool, pyopencl.SVMPointer, pyopencl.SVMPointer, WaitList, "
    "int], CLEvent]"
)
"""``clEnqueueSVMMemcpy``: ``(queue, is_blocking, dst, src, wait_for, nbytes)`` -> its event."""

Marker: TypeAlias = "Callable[[pyopencl.CommandQueue, WaitList], CLEvent]"
"""``clEnqueueMarkerWithWaitList``: ``(queue, wait_for)`` -> the marker."""


def _import_cl() -> ModuleType:
    import pyopencl

    return pyopencl


def _host_array(ptr: int, nbytes: int) -> npt.NDArray[np.uint8]:
    import numpy as np

    return np.frombuffer(memoryview((ctypes.c_char * nbytes).from_address(ptr)).cast("B"), np.uint8)


# CL_COMPLETE; a command's execution status is positive while it is queued, submitted or
# running, and negative (an error code) if it terminated abnormally
_CL_COMPLETE = 0
# CL_EVENT_COMMAND_EXECUTION_STATUS: read with ``event.get_info`` (a C call), not through
# PyOpenCL's ``command_execution_status`` property (a Python function around that call)
_EXECUTION_STATUS = 0x11D3


def _svm_memcpy_by_enqueue_copy(
    cl: ModuleType,
    queue: pyopencl.CommandQueue,
    is_blocking: bool,
    dst: pyopencl.SVMPointer,
    src: pyopencl.SVMPointer,
    wait_for: WaitList,
    nbytes: int,
) -> CLEvent:
    """PyOpenCL's ``_enqueue_svm_memcpy`` call (after ``cl``) through ``pyopencl.enqueue_copy``."""
    event: CLEvent = cl.enqueue_copy(
        queue, dst, src, byte_count=nbytes, is_blocking=is_blocking, wait_for=wait_for
    )
    return event


def _raise_driver_error(call: str, exc: Exception) -> None:
    """Raise ``AcceleratorError`` from ``exc`` if PyOpenCL raised it; return otherwise.

    The hot paths map errors inline with this (``except Exception as exc:
    _raise_driver_error(name, exc); raise``) instead of through ``map_driver_errors``' wrapper,
    which costs a call per call.
    """
    if type(exc).__module__.partition(".")[0] == "pyopencl":
        raise AcceleratorError(f"OpenCL {call} failed: {' '.join(str(exc).split())}") from exc
