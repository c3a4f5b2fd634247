"""Memory history in PyTorch's format: the recorder the allocator calls (``History``), the
snapshot schema (``TypedDict``s) and the ``memory_summary`` table. It imports nothing else of
accelrt.memory: the allocator uses it, not the other way round.
"""
