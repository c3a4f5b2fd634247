"""OpenCL C kernels for the ``xpu`` tests only: real device work that copies alone cannot give.

Built with ``dpctl.program.create_program_from_source`` (the OpenCL backend of SYCL, as Intel's
CPU runtime is here); ``slow_fill`` keeps a queue busy for a chosen time while it writes.
"""

from __future__ import annotations

from typing import Any

from accelrt.backends.xpu import _USMRange  # a USM range as dpctl reads it (no export pin)

SOURCE = """
__kernel void slow_fill(__global uchar *out, uchar value, uint iterations) {
    size_t i = get_global_id(0);
    uint x = (uint)i + 1u;
    for (uint k = 0; k < iterations; ++k) {
        x = x * 1664525u + 1013904223u;
    }
    /* x is never 0 for these seeds and counts in practice; the test checks the bytes */
    out[i] = x == 0u ? (uchar)0 : value;
}
"""


_programs: dict[Any, Any] = {}


def _kernel(queue: Any) -> Any:
    """The ``slow_fill`` kernel built for ``queue``'s context and device (built once each)."""
    import dpctl.program

    key = (queue.sycl_context, queue.sycl_device)
    program = _programs.get(key)
    if program is None:
        program = _programs[key] = dpctl.program.create_program_from_source(queue, SOURCE)
    return program.get_sycl_kernel("slow_fill")


def slow_fill(queue: Any, ptr: int, nbytes: int, value: int, iterations: int) -> Any:
    """Submit ``slow_fill`` on ``queue``: ``nbytes`` bytes of USM memory at address ``ptr`` set
    to ``value`` after ``iterations`` rounds of arithmetic per byte. Returns the kernel's
    ``dpctl.SyclEvent`` (not awaited). The address is passed, not the ``Buffer``: reading its
    ``__sycl_usm_array_interface__`` would keep the block from the allocator until the buffer
    is collected, which is not what the reuse tests are about."""
    import ctypes

    import dpctl.memory

    kernel = _kernel(queue)
    usm = dpctl.memory.as_usm_memory(_USMRange(ptr, nbytes, queue))
    return queue.submit_async(
        kernel, [usm, ctypes.c_uint8(value), ctypes.c_uint32(iterations)], [nbytes]
    )
