"""The caching device allocator and everything about device memory.

The public functions (``accelrt.empty``, ``accelrt.memory_stats``, ...) are re-exported at the
top level; this package holds the machinery: ``CachingAllocator`` (one per device, generic over
a backend's primitives), its blocks and pools, statistics, configuration and ``Buffer``.
"""
