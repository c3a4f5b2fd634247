# The extension-type declarations of _stream_ops.py, which Cython compiles in pure-Python
# mode: each class there is a cdef class here, each field a typed field. Change both together.

from libc.stdint cimport int64_t

cimport cython


cdef class Epoch:
    cdef public int64_t value


cdef class StreamCore:
    cdef public object _ops
    cdef object __weakref__


cdef class EventCore:
    cdef public object _handle, _query


cdef class QueueStreamOps:
    cdef public object queue, last, keep, complete
    cpdef bint marker_done(self, object marker, str call=*) except -1
    cpdef object live_queue(self)
    cdef wait_for(self, object queue)
    cpdef synchronize(self)


cdef class SVMStreamOps(QueueStreamOps):
    cdef public object views, wrap_host, svm_memcpy
    cdef public Py_ssize_t scan_at, scan_bytes, unscanned
    cdef public int status_info
    cpdef bint marker_done(self, object marker, str call=*) except -1


cdef class USMStreamOps(QueueStreamOps):
    cdef public object views
    cdef public tuple last_view
    cdef public Py_ssize_t scan_at
    cdef wait_for(self, object queue)
    cpdef bint marker_done(self, object marker, str call=*) except -1


cdef class QueueEventCore:
    cdef public object marker, stream


@cython.locals(stream=QueueStreamOps)
cpdef bint query_queue_event(QueueEventCore event) except -1
