# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
"""``empty`` and ``copy_`` compiled: the common calls, without a Python frame.

Python twin (change both; docs/design.md, "Pairs"): calls/_calls.py, whose ``empty`` and
``copy_`` take every call these functions do not, and whose docstrings are theirs.

It reads the compiled ``Buffer`` (buffers/_native.pxd), whose module makes one from the
allocator's compiled hit path (``malloc_buffer``) and frees it: a cache-hit ``empty(n).free()``
is then C calls only, and no Python call.
"""

from cpython.buffer cimport PyBuffer_IsContiguous
from cpython.memoryview cimport PyMemoryView_FromObject, PyMemoryView_GET_BUFFER
from cpython.ref cimport PyObject
from libc.stdint cimport int64_t, uint64_t

cimport cython

from ..._stream_ops cimport Epoch
from ..buffers._native cimport Buffer, malloc_buffer
from ..device._native cimport is_hit_path

from ... import _runtime
from ..._stream import Stream, _current
from ..host._buffer import HostBuffer
from . import _calls

__all__ = ["copy_", "empty"]


@cython.final
cdef class _Current:
    """One thread's cached lookups for ``empty(n)``: valid while the epoch is unchanged."""

    cdef int64_t epoch
    cdef object allocator  # a HitPath (device/_native.pyx)
    cdef object stream
    cdef int64_t handle


cdef Epoch _state_epoch = <Epoch?>_runtime.STATE_EPOCH  # read from C
cdef str _CACHE_KEY = "accelrt.memory.empty"
# The thread that last called empty(n), and its cache: a program allocating from one thread
# finds its cache without a dict lookup. Thread state ids are never reused.
cdef uint64_t _last_thread = 0
cdef _Current _last_current = None


cdef extern from *:
    """
    // This thread state's unique id (PyThreadState_GetID of the running thread).
    static inline uint64_t accelrt_thread_id(void) {
        return PyThreadState_GetID(PyThreadState_Get());
    }
    """
    PyObject* PyThreadState_GetDict()
    uint64_t accelrt_thread_id()


cdef inline _Current _cached_current():
    """This thread's cache for :func:`empty`, or None."""
    global _last_thread, _last_current
    cdef uint64_t thread = accelrt_thread_id()
    if thread == _last_thread:
        return _last_current
    cached = (<dict>PyThreadState_GetDict()).get(_CACHE_KEY)
    if cached is not None:
        _last_thread, _last_current = thread, <_Current>cached
    return <_Current>cached


def empty(nbytes, *, device=None, stream=None):
    """Allocate uninitialised device memory from the caching allocator.

    The compiled form of calls/_calls.py ``empty`` (same arguments, result and errors; its
    docstring is this function's documentation). The common call, ``empty(n)`` with n > 0,
    uses a per-thread cache of the current device's allocator and stream, valid while
    ``accelrt._runtime.STATE_EPOCH`` is unchanged; every other call is the Python function's.
    """
    global _last_thread, _last_current
    cdef _Current current
    cdef Buffer buffer
    if device is None and stream is None and type(nbytes) is int:
        current = _cached_current()
        if current is not None and current.epoch == _state_epoch.value:
            buffer = malloc_buffer(current.allocator, nbytes, current.handle, current.stream)
            if buffer is not None:  # (None: not a valid request; the Python function raises)
                return buffer
    cdef int64_t epoch = _state_epoch.value
    result = _calls.empty(nbytes, device=device, stream=stream)
    if (
        device is None
        and stream is None
        and isinstance(result, Buffer)
        and is_hit_path((<Buffer>result)._allocator)
    ):
        current = _Current.__new__(_Current)
        current.epoch = epoch
        current.allocator = (<Buffer>result)._allocator
        current.stream = (<Buffer>result)._stream
        current.handle = current.stream._handle
        (<dict>PyThreadState_GetDict())[_CACHE_KEY] = current
        _last_thread, _last_current = accelrt_thread_id(), current
    return result


cdef object _host_bytes(object array, bint writable):
    """calls/_calls.py ``_host_view`` for pageable host memory that passes its checks: the
    bytes as a 1-D unsigned-byte memoryview; None where the reference must decide (a
    HostBuffer, not a buffer, not C-contiguous, read-only for a destination)."""
    if isinstance(array, HostBuffer):
        return None
    try:
        view = PyMemoryView_FromObject(array)
    except Exception:
        return None
    cdef const char* format = PyMemoryView_GET_BUFFER(view).format
    if not PyBuffer_IsContiguous(PyMemoryView_GET_BUFFER(view), b"C"):
        return None
    if writable and PyMemoryView_GET_BUFFER(view).readonly:
        return None
    if (
        PyMemoryView_GET_BUFFER(view).ndim != 1
        or format == NULL
        or format[0] != b"B"
        or format[1] != 0
    ):
        return view.cast("B")
    return view


cdef inline bint _same_device(object stream, object other) except -1:
    """Whether two streams are on one device (a stream is on its own, without a lookup)."""
    return stream is other or (
        stream._backend is other._backend and stream._index == other._index
    )


def copy_(dst, src, *, stream=None):
    """Copy bytes between host memory and device buffers, on a stream.

    The compiled form of calls/_calls.py ``copy_`` (same arguments, result and errors; its
    docstring is this function's documentation). It takes a copy between two live buffers of
    one device, or between a live buffer and pageable host memory that passes the checks, on
    a stream of that device or the current one; every other call (a HostBuffer, any error) is
    the Python function's.
    """
    cdef bint dst_buffer = type(dst) is Buffer
    cdef bint src_buffer = type(src) is Buffer
    cdef Buffer device_side
    cdef object target, source, owner
    cdef Py_ssize_t nbytes
    if dst_buffer:
        device_side = <Buffer>dst
        target = device_side.ptr
    elif src_buffer:
        device_side = <Buffer>src
        source = device_side.ptr
    else:
        return _calls.copy_(dst, src, stream=stream)
    if device_side._block is None:
        return _calls.copy_(dst, src, stream=stream)
    owner = device_side._stream
    nbytes = device_side.nbytes
    if dst_buffer and src_buffer:
        device_side = <Buffer>src
        if (
            device_side._block is None
            or device_side.nbytes != nbytes
            or not _same_device(device_side._stream, owner)
        ):
            return _calls.copy_(dst, src, stream=stream)
        source = device_side.ptr
    elif dst_buffer:
        source = _host_bytes(src, False)
        if source is None or PyMemoryView_GET_BUFFER(source).len != nbytes:
            return _calls.copy_(dst, src, stream=stream)
    else:
        target = _host_bytes(dst, True)
        if target is None or PyMemoryView_GET_BUFFER(target).len != nbytes:
            return _calls.copy_(dst, src, stream=stream)
    cdef _Current current
    if stream is None:
        current = _cached_current()
        if (
            current is not None
            and current.epoch == _state_epoch.value
            and _same_device(current.stream, owner)
        ):
            stream = current.stream
        else:
            stream = _current(owner._backend, owner._index)
    elif not isinstance(stream, Stream) or not _same_device(stream, owner):
        return _calls.copy_(dst, src, stream=stream)
    if nbytes:
        stream._ops.memcpy_async(target, source, nbytes)
    return dst


empty.__doc__ = _calls.empty.__doc__
copy_.__doc__ = _calls.copy_.__doc__
