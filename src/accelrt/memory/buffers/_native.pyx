# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
"""The public fast path, compiled: ``Buffer``, ``empty(n)`` and the common calls of ``copy_``.

Python twins (change both; docs/design.md, "Pairs"): buffers/_buffer.py (``Buffer``'s fields,
finaliser and ``free``: ``_BufferFields`` and ``MemoryHandle.free``; its Python-level part,
``_BufferAPI``, is adopted at import, not repeated) and memory/_api.py (``empty`` and
``copy_``: every call this module does not take is theirs).

It runs where the allocator's compiled core (device/_native.pyx) runs, and reaches that core
only through the functions device/_native.pxd declares: a cache-hit ``empty(n).free()`` is
then two C calls into the hit path and no Python call.
"""

from cpython.buffer cimport PyBuffer_IsContiguous
from cpython.memoryview cimport PyMemoryView_FromObject, PyMemoryView_GET_BUFFER
from cpython.ref cimport PyObject
from libc.stdint cimport int64_t, uint64_t

cimport cython

from ..._stream_ops cimport Epoch
from ..device._native cimport (
    buffer_free,
    buffer_free_collected,
    buffer_malloc,
    is_hit_path,
)

__all__ = ["Buffer", "adopt", "copy_", "empty", "install_copy", "install_empty"]


@cython.final
@cython.freelist(64)
@cython.no_gc
cdef class Buffer:
    # accelrt.Buffer where the compiled core runs: its fields, free and finaliser in C.
    # memory/buffers/_buffer.py writes the rest of the class once, in Python, docstring included, and
    # gives it to this type (adopt; a docstring here would hide the adopted one). On the pure
    # core Buffer is a Python class with the same fields (_BufferFields). A final type with a
    # free list: making and dropping a buffer allocates nothing and runs no Python code.
    # Not tracked by the garbage collector (no_gc): it has no __dict__, and what its fields
    # reach (the allocator, its blocks, a stream, an export pin or a weak reference to one)
    # refers to no buffer but through a stream's held host objects (a copy from buf.numpy()),
    # which the backend's state reaches until the copy has finished: never an unreachable
    # cycle for the collector to find. Tracking it cost 7 ns of a 187 ns empty(n).free().
    # _pin is None until the memory is exported (memory/buffers/_buffer.py ExportPin): free() then
    # leaves the block to the exports' pin while one lives; a buffer that was never exported
    # pays one field test for it.

    cdef public object _allocator, _block, _pin, _stream, nbytes
    cdef readonly int64_t ptr
    cdef object __weakref__

    def __init__(self, allocator, block, nbytes, stream):
        self._allocator = allocator
        self._block = block
        self._stream = stream
        self.nbytes = nbytes
        self.ptr = block.address if block is not None else 0

    def __len__(self):  # a slot, so compiled here (adopt cannot fill a type's sq_length)
        return self.nbytes

    def free(self):
        """Give the memory back to the caching allocator, or to the exports that still view
        it; see ``Buffer``'s Notes. Freeing twice does nothing."""
        block = self._block
        self._block = None
        if block is None or self._allocator is None:
            return
        if self._pin is not None and self._defer_free(block):  # MemoryHandle's, adopted
            return
        buffer_free(self._allocator, block)

    def __dealloc__(self):
        # The finaliser (a __dealloc__, not a __del__: no Python-level call on every buffer's
        # death). It may run anywhere, even inside an allocator call on this thread (the
        # garbage collector runs when objects are made): the block is then freed as that call
        # ends, never half-way through it. Exports hold the buffer, so none is left now; a
        # block free() left to their pin is the pin's to free (a pin the buffer held, after
        # __cuda_array_interface__, goes with this buffer's fields).
        block = self._block
        if block is None or self._allocator is None:
            return
        self._block = None
        try:
            buffer_free_collected(self._allocator, block)
        except Exception:  # a finaliser never raises
            pass


cdef extern from *:
    """
    // Set an attribute of a static (immutable) type as type.__setattr__ does for a class,
    // slots included (a __len__ fills sq_length): the flag is lifted for that one call.
    static int accelrt_set_type_attr(PyObject* type, PyObject* name, PyObject* value) {
        PyTypeObject* t = (PyTypeObject*)type;
        unsigned long flags = t->tp_flags;
        t->tp_flags &= ~Py_TPFLAGS_IMMUTABLETYPE;
        int rc = PyObject_SetAttr(type, name, value);
        t->tp_flags = flags;
        return rc;
    }
    """
    int accelrt_set_type_attr(object type, object name, object value) except -1


cdef frozenset _NOT_ADOPTED = frozenset({
    "__annotations__", "__dict__", "__module__", "__orig_bases__", "__parameters__",
    "__qualname__", "__slots__", "__weakref__",
})


def adopt(type cls, type source):
    """Give the compiled type ``cls`` the Python-level attributes of ``source`` and its bases.

    ``source`` (memory/buffers/_buffer.py) holds the part of ``Buffer`` written in Python: properties,
    methods, special methods and the class docstring. Each is set on ``cls`` as on a Python
    class (special methods fill their slots), base classes first; what ``cls`` defines itself
    (its fields, ``__init__``, ``free``) is kept, so the class is written once for both cores.
    Called once, at import.
    """
    own = frozenset(cls.__dict__)  # before adopting: a base's name may be overridden
    for klass in reversed(source.__mro__):
        if klass is object:  # its attributes are cls's already
            continue
        for name, value in vars(klass).items():
            if name in _NOT_ADOPTED or (name in own and name != "__doc__"):
                continue
            accelrt_set_type_attr(cls, name, value)


@cython.final
cdef class _Current:
    """One thread's cached lookups for ``empty(n)``: valid while the epoch is unchanged."""

    cdef int64_t epoch
    cdef object allocator  # a HitPath (device/_native.pyx)
    cdef object stream
    cdef int64_t handle


cdef Epoch _state_epoch = Epoch()  # accelrt._runtime.STATE_EPOCH, from install_empty
cdef object _reference_empty = None  # memory/_api.py's empty: every case but the common one
cdef str _CACHE_KEY = "accelrt.memory.empty"
# The thread that last called empty(n), and its cache: a program allocating from one thread
# finds its cache without a dict lookup. Thread state ids are never reused.
cdef uint64_t _last_thread = 0
cdef _Current _last_current = None


def install_empty(runtime, reference_empty):
    """Give :func:`empty` what it needs; memory/_api.py calls this once.

    ``runtime`` is ``accelrt._runtime``: this module reads its ``STATE_EPOCH`` (the compiled
    ``accelrt._stream_ops.Epoch``) from C.
    """
    global _state_epoch, _reference_empty
    _state_epoch = <Epoch?>runtime.STATE_EPOCH
    _reference_empty = reference_empty


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

    The compiled form of memory/_api.py ``empty`` (same arguments, result and errors; its
    docstring is this function's documentation). The common call, ``empty(n)`` with n > 0,
    uses a per-thread cache of the current device's allocator and stream, valid while
    ``accelrt._runtime.STATE_EPOCH`` is unchanged; every other call is the Python function's.
    """
    global _last_thread, _last_current
    cdef _Current current
    cdef Buffer buffer
    cdef int64_t address
    if device is None and stream is None and type(nbytes) is int:
        current = _cached_current()
        if current is not None and current.epoch == _state_epoch.value:
            block = buffer_malloc(current.allocator, nbytes, current.handle, &address)
            if block is not None:  # (None: not a valid request; the Python function raises)
                buffer = Buffer.__new__(Buffer)
                buffer._allocator = current.allocator
                buffer._block = block
                buffer._stream = current.stream
                buffer.nbytes = nbytes
                buffer.ptr = address
                return buffer
    cdef int64_t epoch = _state_epoch.value
    result = _reference_empty(nbytes, device=device, stream=stream)
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


# ------------------------------------------------------------------------ the copy fast path
cdef object _reference_copy = None  # memory/_api.py's copy_: every case but the common ones
cdef object _current_stream = None  # accelrt._stream._current: (backend, index) -> Stream
cdef type _Stream = None
cdef type _HostBuffer = None


def install_copy(reference_copy, current_stream, stream_type, host_buffer_type):
    """Give :func:`copy_` what it needs; memory/_api.py calls this once."""
    global _reference_copy, _current_stream, _Stream, _HostBuffer
    _reference_copy = reference_copy
    _current_stream = current_stream
    _Stream = stream_type
    _HostBuffer = host_buffer_type


cdef object _host_bytes(object array, bint writable):
    """memory/_api.py ``_host_view`` for pageable host memory that passes its checks: the
    bytes as a 1-D unsigned-byte memoryview; None where the reference must decide (a
    HostBuffer, not a buffer, not C-contiguous, read-only for a destination)."""
    if isinstance(array, _HostBuffer):
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

    The compiled form of memory/_api.py ``copy_`` (same arguments, result and errors; its
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
        return _reference_copy(dst, src, stream=stream)
    if device_side._block is None:
        return _reference_copy(dst, src, stream=stream)
    owner = device_side._stream
    nbytes = device_side.nbytes
    if dst_buffer and src_buffer:
        device_side = <Buffer>src
        if (
            device_side._block is None
            or device_side.nbytes != nbytes
            or not _same_device(device_side._stream, owner)
        ):
            return _reference_copy(dst, src, stream=stream)
        source = device_side.ptr
    elif dst_buffer:
        source = _host_bytes(src, False)
        if source is None or PyMemoryView_GET_BUFFER(source).len != nbytes:
            return _reference_copy(dst, src, stream=stream)
    else:
        target = _host_bytes(dst, True)
        if target is None or PyMemoryView_GET_BUFFER(target).len != nbytes:
            return _reference_copy(dst, src, stream=stream)
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
            stream = _current_stream(owner._backend, owner._index)
    elif not isinstance(stream, _Stream) or not _same_device(stream, owner):
        return _reference_copy(dst, src, stream=stream)
    if nbytes:
        stream._ops.memcpy_async(target, source, nbytes)
    return dst
