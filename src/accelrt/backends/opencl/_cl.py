"""PyOpenCL for the ``opencl`` backend: importing it, the status and error codes the backend
reads, PyOpenCL's errors as ``AcceleratorError``, host views of SVM memory."""

from __future__ import annotations

import ctypes
from typing import Any

from ..._errors import AcceleratorError

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


def _svm_memcpy_by_enqueue_copy(
    cl: Any, queue: Any, is_blocking: bool, dst: Any, src: Any, wait_for: Any, nbytes: int
) -> Any:
    """PyOpenCL's ``_enqueue_svm_memcpy`` call (after ``cl``) through ``pyopencl.enqueue_copy``."""
    return cl.enqueue_copy(
        queue, dst, src, byte_count=nbytes, is_blocking=is_blocking, wait_for=wait_for
    )


def _raise_driver_error(call: str, exc: Exception) -> None:
    """Raise ``AcceleratorError`` from ``exc`` if PyOpenCL raised it; return otherwise.

    The hot paths map errors inline with this (``except Exception as exc:
    _raise_driver_error(name, exc); raise``) instead of through ``map_driver_errors``' wrapper,
    which costs a call per call.
    """
    if type(exc).__module__.partition(".")[0] == "pyopencl":
        raise AcceleratorError(f"OpenCL {call} failed: {' '.join(str(exc).split())}") from exc
