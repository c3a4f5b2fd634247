"""Segments: the memory the caching allocator carves blocks from, behind one seam.

The allocator's core never calls a backend's ``malloc``/``free`` or its virtual-memory
functions itself: it asks a :class:`MemorySource` for segments and asks segments to grow and
release (docs/allocator.md sections 1 and 7).

- :class:`Segment`: an ordinary segment, one raw backend allocation of a fixed size.
- :class:`ExpandableSegment`: an address range reserved once per (stream, pool) whose pages
  are mapped on demand and unmapped when freed. Needs a backend with virtual memory.

The host (pinned) caching allocator (``_host.py``) gets its memory through the same seam: a
:class:`HostMemorySource` hands out and takes back raw host memory of a backend's device, and
the caching above it is the host allocator's own (a later CUDA graph pool sits here too).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..._errors import AcceleratorError
from ...backends._base import Backend, BackendOutOfMemory
from .._policy import expandable_address_space

if TYPE_CHECKING:
    from ..history._history import RawFrames
    from ._block import BlockPool

__all__ = ["AnySegment", "ExpandableSegment", "HostMemorySource", "MemorySource", "Segment"]


class Segment:
    """An ordinary segment: one raw device allocation, owned by the stream that created it.

    Attributes
    ----------
    address, size : int
        The allocation's address and bytes.
    stream : int
        The backend stream handle of the request that created it.
    pool : BlockPool
        The free list its blocks return to (which also says small or large, and which
        private pool).
    frames : tuple or None
        The Python stack that created it, when history records stacks.
    """

    __slots__ = ("address", "frames", "pool", "size", "stream")
    is_expandable = False

    def __init__(self, address: int, size: int, stream: int, pool: BlockPool) -> None:
        self.address = address
        self.size = size
        self.stream = stream
        self.pool = pool
        self.frames: RawFrames | None = None

    @property
    def is_small(self) -> bool:
        """Whether the segment belongs to a small pool."""
        return self.pool.is_small

    def __repr__(self) -> str:
        return f"Segment(address={self.address:#x}, size={self.size}, stream={self.stream})"


class ExpandableSegment:
    """A reserved address range of one (stream, pool) whose pages are mapped on demand.

    Attributes
    ----------
    address, size : int
        The reserved range: its base address and bytes (a whole number of pages).
    page_size : int
        Bytes per page: 2 MiB for a small pool, 20 MiB for a large one.
    stream : int
        The stream handle every block of the segment belongs to.
    pool : BlockPool
        The free list its blocks return to.

    Notes
    -----
    Mirrors c10's ``ExpandableSegment``: :meth:`map` and :meth:`unmap` work in whole pages, and
    a map either maps every page it needs or, when the device is full, none.
    """

    __slots__ = (
        "_source",
        "address",
        "frames",
        "mapped_bytes",
        "page_size",
        "pool",
        "size",
        "stream",
    )
    is_expandable = True

    def __init__(
        self,
        source: MemorySource,
        address: int,
        size: int,
        stream: int,
        pool: BlockPool,
        page: int,
    ) -> None:
        self._source = source
        self.address = address
        self.size = size
        self.stream = stream
        self.pool = pool
        self.page_size = page
        self.mapped_bytes = 0  # the allocator's blocks say which pages are mapped
        self.frames: RawFrames | None = None

    @property
    def is_small(self) -> bool:
        """Whether the segment belongs to a small pool."""
        return self.pool.is_small

    def map(self, address: int, nbytes: int) -> int:
        """Map the pages covering ``[address, address + nbytes)``; ``address`` starts a page.

        Returns
        -------
        int
            The bytes mapped from ``address`` (whole pages, >= ``nbytes``), or 0 when the device
            had no memory for them (then nothing was mapped).
        """
        first = (address - self.address) // self.page_size
        last = -(-(address + nbytes - self.address) // self.page_size)
        mapped = (last - first) * self.page_size
        try:
            self._source.backend.vm_map(self._source.index, address, mapped)
        except BackendOutOfMemory:
            return 0
        self.mapped_bytes += mapped
        return mapped

    def unmap(self, address: int, nbytes: int) -> tuple[int, int]:
        """Unmap the whole pages inside ``[address, address + nbytes)``.

        Returns
        -------
        (int, int)
            The address and bytes unmapped; bytes is 0 when no whole page lies inside.
        """
        first = -(-(address - self.address) // self.page_size)
        last = (address + nbytes - self.address) // self.page_size
        if first >= last:
            return address, 0
        start = self.address + first * self.page_size
        unmapped = (last - first) * self.page_size
        self._source.backend.vm_unmap(self._source.index, start, unmapped)
        self.mapped_bytes -= unmapped
        return start, unmapped

    def release(self) -> None:
        """Give the address range back; every page must be unmapped."""
        self._source.backend.vm_release(self._source.index, self.address)

    def __repr__(self) -> str:
        return (
            f"ExpandableSegment(address={self.address:#x}, size={self.size}, "
            f"mapped={self.mapped_bytes}, stream={self.stream})"
        )


AnySegment = Segment | ExpandableSegment


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
        return ExpandableSegment(self, address, size, stream, pool, page)


class HostMemorySource:
    """Where the host caching allocator gets raw host memory for one device of a backend.

    Parameters
    ----------
    backend : Backend
        The device's backend.
    index : int
        The device's index in the backend.

    Notes
    -----
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

        Any error other than the backend's out-of-memory is a driver failure and propagates.
        """
        try:
            return self.backend.host_alloc(self.index, size)
        except BackendOutOfMemory:
            return None

    def release(self, address: int) -> None:
        """Give host memory from :meth:`allocate` back to the backend."""
        self.backend.host_free(self.index, address)
