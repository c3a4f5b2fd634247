# The compiled Buffer's fields, and the C function that allocates one, for the compiled calls over
# it (memory/calls/_native.pyx).
from libc.stdint cimport int64_t

cimport cython


@cython.final
cdef class Buffer:
    cdef public object _allocator, _block, _pin, _stream, nbytes
    cdef readonly int64_t ptr
    cdef object __weakref__


cdef Buffer malloc_buffer(object allocator, object nbytes, int64_t handle, object stream)
