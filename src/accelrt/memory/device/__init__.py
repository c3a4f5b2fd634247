"""The device caching allocator (PyTorch's ``CUDACachingAllocator`` policy): blocks and their
free lists, statistics, segments and the memory source (the seam to the backend), the
allocator itself with its compiled hit path (``_native.pyx``, picked by ``_core``), the
per-device registry and private pools. Nothing here is public by this path: ``accelrt.memory``
re-exports what is.
"""
