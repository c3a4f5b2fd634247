"""The memory source: where the caching allocator's segments come from, behind one seam.

The allocator's core never calls a backend's ``malloc``/``free`` or its virtual-memory
functions itself: it asks a :class:`MemorySource` for segments (``_block.Segment``,
``_block.ExpandableSegment``) and asks segments to grow and release (docs/allocator.md
sections 1 and 7). The host caching allocator gets its memory through the same kind of seam
(``host/_source.py``).
"""

from __future__ import annotations

from ..._errors import AcceleratorError
from ...backends._base import Backend, BackendOutOfMemory
from .._policy import expandable_address_space
from ._block import BlockPool, ExpandableSegment, Segment

__all__ = ["MemorySource"]


class MemorySource:
    """Where one device's allocator gets its segments: a backend's device.

    Parameters
    ----------
    backend : Backend
        The device's backend.
    index : int
        The device's index in the backend.

    Notes
    -----
    ``supports_expandable`` says whether the backend has virtual memory (reserve, map, unmap);
    without it the allocator uses ordinary segments only.
    """

    __slots__ = ("backend", "index", "supports_expandable")

    def __init__(self, backend: Backend, index: int) -> None:
        self.backend = backend
        self.index = index
        self.supports_expandable = bool(backend.supports_virtual_memory())

    def allocate(self, size: int, stream: int, pool: BlockPool) -> Segment | None:
        """Return a new ordinary segment of ``size`` bytes, or None when the device is full."""
        try:
            address = self.backend.malloc(self.index, size)
        except BackendOutOfMemory:
            return None
        return Segment(address, size, stream, pool)

    def release(self, segment: Segment) -> None:
        """Give an ordinary segment back to the device."""
        self.backend.free(self.index, segment.address)

    def reserve(self, stream: int, pool: BlockPool, page: int) -> ExpandableSegment | None:
        """Reserve the address range of a new expandable segment of ``page``-byte pages (no
        memory is mapped yet), or None when the device has no address space left.

        Its size is 1.125 times the device's total memory, rounded up to whole pages, as
        PyTorch reserves.

        Raises
        ------
        AcceleratorError
            If the backend's mapping granularity does not divide the page size.
        """
        _, total = self.backend.mem_get_info(self.index)
        granularity = self.backend.vm_granularity(self.index)
        if page % granularity:
            raise AcceleratorError(
                f"{self.backend.name}:{self.index} maps pages of {granularity} bytes, which do "
                f"not divide the allocator's {page}-byte pages: expandable segments cannot work"
            )
        size = expandable_address_space(total, page)
        try:
            address = self.backend.vm_reserve(self.index, size)
        except BackendOutOfMemory:
            return None
        return ExpandableSegment(self.backend, self.index, address, size, stream, pool, page)
