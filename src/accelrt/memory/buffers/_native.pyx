# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
"""``Buffer`` compiled: its fields, ``free`` and finaliser in C (fields declared in _native.pxd).

Python twin (change both; docs/design.md, "Pairs"): buffers/_buffer.py (``_BufferFields`` and
``MemoryHandle.free``; its Python-level part, ``_BufferAPI``, is adopted at import, not
repeated). The compiled ``empty(n)`` and ``copy_`` that make and read these buffers are
memory/calls/_native.pyx.

It runs where the allocator's compiled core (device/_native.pyx) runs, and reaches that core
only through the functions device/_native.pxd declares: making a buffer (``malloc_buffer``,
for the compiled ``empty``) and freeing one are each one C call into the hit path and no
Python call.
"""

from libc.stdint cimport int64_t

cimport cython

from ..device._native cimport buffer_free, buffer_free_collected, buffer_malloc

__all__ = ["Buffer", "adopt"]


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


cdef Buffer malloc_buffer(object allocator, object nbytes, int64_t handle, object stream):
    """A buffer of ``nbytes`` from the hit path of ``allocator`` (a compiled ``HitPath``) on
    ``stream`` (whose handle is ``handle``), made from the free list; None where the request is
    not valid (the Python ``empty`` then raises). memory/calls/_native.pyx ``empty``'s cache
    hit: one call, as the free list is inlined only in this module."""
    cdef int64_t address
    block = buffer_malloc(allocator, nbytes, handle, &address)
    if block is None:
        return None
    cdef Buffer buffer = Buffer.__new__(Buffer)
    buffer._allocator = allocator
    buffer._block = block
    buffer._stream = stream
    buffer.nbytes = nbytes
    buffer.ptr = address
    return buffer


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
