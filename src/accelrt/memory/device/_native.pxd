# What buffers/_native.pyx and calls/_native.pyx call in the allocator's compiled hit path
# (device/_native.pyx): Buffer.free and its finaliser, and empty(n)'s cache hit (docs/design.md,
# "Pairs").

from libc.stdint cimport int64_t

cdef object buffer_malloc(object allocator, object nbytes, int64_t stream, int64_t* address)
cdef int buffer_free(object allocator, object block) except -1
cdef int buffer_free_collected(object allocator, object block) except -1
cdef bint is_hit_path(object allocator) noexcept
