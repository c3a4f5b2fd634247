"""Host memory for the host caching allocator, from a backend's device."""

from __future__ import annotations

from ...backends._base import Backend, BackendOutOfMemory

__all__ = ["HostMemorySource"]


class HostMemorySource:
    """Where the host caching allocator gets raw host memory for device ``index`` of
    ``backend`` (as ``MemorySource`` gets a device's segments for its caching allocator).

    ``pinned`` says whether the backend's host memory is pinned for the device (see
    ``Backend.host_memory_pinned``); without pinning it is ordinary page-aligned host memory.
    Host memory is never split, so a "segment" here is one raw allocation, named by its address.
    """

    __slots__ = ("backend", "index", "pinned")

    def __init__(self, backend: Backend, index: int) -> None:
        self.backend = backend
        self.index = index
        self.pinned = bool(backend.host_memory_pinned(index))

    def allocate(self, size: int) -> int | None:
        """Return the address of ``size`` new bytes of host memory, or None when there is none.

        Every error but the backend's out-of-memory is a driver failure and propagates.
        """
        try:
            return self.backend.host_alloc(self.index, size)
        except BackendOutOfMemory:
            return None

    def release(self, address: int) -> None:
        """Give host memory from :meth:`allocate` back to the backend."""
        self.backend.host_free(self.index, address)
