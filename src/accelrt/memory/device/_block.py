"""Blocks, the pools of free blocks, and the segments blocks are carved from
(docs/allocator.md sections 1, 3 and 7).

Compiled twin: device/_native.pyx ``Block`` and ``BlockPool`` (the same attributes and
methods; change both). Segments have none.

A *block* is a piece of a segment, linked to its neighbours by ``prev``/``next``. A
``BlockPool`` holds the free blocks of one small (<= 1 MiB) or large pool, ordered by (stream,
size, address): per stream, a sorted list of integer keys ``size << 64 | address``, so a
best-fit lookup is one ``bisect``. It also holds the unmapped blocks of its expandable segments,
ordered by (stream, address). Each private memory pool has a small and a large ``BlockPool`` of
its own; ``pool_id`` says whose they are ((0, 0) for the device's default pools).

A block's segment is a :class:`Segment` (one raw backend allocation of a fixed size) or an
:class:`ExpandableSegment` (an address range reserved once per (stream, pool) whose pages are
mapped on demand and unmapped when freed; needs a backend with virtual memory). Blocks, pools
and segments refer to each other, so they share this module; ``_source.MemorySource`` makes
the segments.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right, insort
from collections.abc import Iterator

from ...backends._base import Backend, BackendOutOfMemory
from ..history._history import RawFrames

__all__ = [
    "DEFAULT_POOL_ID",
    "KEY_SHIFT",
    "AnySegment",
    "Block",
    "BlockPool",
    "ExpandableSegment",
    "PoolId",
    "SHARED_STREAM",
    "Segment",
    "link_after",
]

KEY_SHIFT = 64
_ADDRESS_MASK = (1 << KEY_SHIFT) - 1
PoolId = tuple[int, int]
DEFAULT_POOL_ID: PoolId = (0, 0)
SHARED_STREAM = -1
"""The stream of a ``policy:accelrt`` arena and of its unmapped blocks: every stream's."""


class Block:
    """A piece of a segment: allocated, pending free (waiting for events) or free.

    A free block is in its pool; a block of an expandable segment may also be unmapped (no
    memory behind its addresses yet), and then it is in its pool's unmapped set.
    """

    __slots__ = (
        "address",
        "allocated",
        "event_count",
        "frames",
        "gc_count_base",
        "mapped",
        "next",
        "pool",
        "prev",
        "requested_size",
        "segment",
        "size",
        "stamp",
        "stream",
        "stream_uses",
    )

    def __init__(
        self, address: int, size: int, stream: int, pool: BlockPool, segment: AnySegment
    ) -> None:
        self.address = address
        self.size = size
        self.stream = stream
        self.pool = pool
        self.segment = segment
        self.requested_size = 0
        self.allocated = False
        self.mapped = True
        self.event_count = 0
        self.stream_uses: set[int] | None = None
        self.prev: Block | None = None
        self.next: Block | None = None
        self.gc_count_base = 0
        self.stamp = 0  # when it last entered a free list (the allocator's clock; section 16)
        self.frames: RawFrames | None = None  # the stack that allocated it, when recorded

    def is_split(self) -> bool:
        """True if the block shares its segment with other blocks."""
        return self.prev is not None or self.next is not None

    def is_free(self) -> bool:
        """True if the block is neither allocated nor waiting for events (it may be unmapped)."""
        return not self.allocated and self.event_count == 0 and not self.stream_uses

    def __repr__(self) -> str:
        state = "allocated" if self.allocated else "free" if self.mapped else "unmapped"
        return f"Block(address={self.address:#x}, size={self.size}, stream={self.stream}, {state})"


class BlockPool:
    """The free blocks of one pool by (stream, size, address), and its unmapped blocks.

    Parameters
    ----------
    is_small : bool
        Small pool (blocks <= 1 MiB) or large pool.
    pool_id : tuple of (int, int)
        (0, 0) for the device's default pools, a ``MemPool``'s id for a private pool.
    """

    __slots__ = (
        "_blocks",
        "_keys",
        "_unmapped",
        "_unmapped_keys",
        "get_free_blocks_call_count",
        "is_small",
        "pool_id",
    )

    def __init__(self, is_small: bool, pool_id: PoolId = DEFAULT_POOL_ID) -> None:
        self.is_small = is_small
        self.pool_id = pool_id
        self._keys: dict[int, list[int]] = {}
        self._blocks: dict[int, Block] = {}
        self._unmapped_keys: dict[int, list[int]] = {}
        self._unmapped: dict[int, Block] = {}
        self.get_free_blocks_call_count = 0

    def __len__(self) -> int:
        return len(self._blocks)

    def insert(self, block: Block) -> None:
        """Add a free mapped block; its garbage-collection age starts now."""
        block.gc_count_base = self.get_free_blocks_call_count
        keys = self._keys.get(block.stream)
        if keys is None:
            keys = self._keys[block.stream] = []
        insort(keys, (block.size << KEY_SHIFT) | block.address)
        self._blocks[block.address] = block

    def remove(self, block: Block) -> None:
        """Remove a free mapped block."""
        keys = self._keys[block.stream]
        del keys[bisect_left(keys, (block.size << KEY_SHIFT) | block.address)]
        del self._blocks[block.address]

    def get(self, address: int) -> Block | None:
        """Return the free block (mapped or not) starting at ``address``, if any."""
        block = self._blocks.get(address)
        return block if block is not None else self._unmapped.get(address)

    def lower_bound(self, stream: int, size: int) -> Block | None:
        """Return the smallest block on ``stream`` with size >= ``size`` (lowest address first)."""
        keys = self._keys.get(stream)
        if not keys:
            return None
        i = bisect_left(keys, size << KEY_SHIFT)
        if i == len(keys):
            return None
        return self._blocks[keys[i] & _ADDRESS_MASK]

    def candidates(self, stream: int, size: int) -> Iterator[Block]:
        """Iterate over the blocks on ``stream`` of size >= ``size``, by (size, address)."""
        keys = self._keys.get(stream, [])
        for key in keys[bisect_left(keys, size << KEY_SHIFT) :]:
            yield self._blocks[key & _ADDRESS_MASK]

    def stream_blocks(self, stream: int, *, descending: bool = False) -> list[Block]:
        """Return the blocks on ``stream`` by (size, address), or the reverse."""
        keys = self._keys.get(stream, [])
        ordered = reversed(keys) if descending else iter(keys)
        return [self._blocks[k & _ADDRESS_MASK] for k in ordered]

    def stream_blocks_below(self, stream: int, size: int) -> list[Block]:
        """Return the blocks on ``stream`` smaller than ``size``, by (size, address)."""
        keys = self._keys.get(stream, [])
        return [
            self._blocks[k & _ADDRESS_MASK] for k in keys[: bisect_left(keys, size << KEY_SHIFT)]
        ]

    def streams(self) -> list[int]:
        """Return the streams that have free mapped blocks in this pool, in ascending order."""
        return sorted(stream for stream, keys in self._keys.items() if keys)

    def blocks(self) -> Iterator[Block]:
        """Iterate over a snapshot of all free mapped blocks in (stream, size, address) order."""
        ordered = [
            self._blocks[k & _ADDRESS_MASK] for s in sorted(self._keys) for k in self._keys[s]
        ]
        return iter(ordered)

    def blocks_from(self, size: int) -> list[Block]:
        """Every free mapped block of at least ``size`` bytes, in (stream, size, address)
        order."""
        floor = size << KEY_SHIFT
        return [
            self._blocks[k & _ADDRESS_MASK]
            for s in sorted(self._keys)
            for k in self._keys[s][bisect_left(self._keys[s], floor) :]
        ]

    # unmapped blocks of expandable segments, by (stream, address)
    def insert_unmapped(self, block: Block) -> None:
        """Add an unmapped block."""
        insort(self._unmapped_keys.setdefault(block.stream, []), block.address)
        self._unmapped[block.address] = block

    def remove_unmapped(self, block: Block) -> None:
        """Remove an unmapped block."""
        keys = self._unmapped_keys[block.stream]
        del keys[bisect_left(keys, block.address)]
        del self._unmapped[block.address]

    def unmapped_blocks(self, stream: int) -> list[Block]:
        """Return the unmapped blocks on ``stream`` in address order."""
        return [self._unmapped[a] for a in self._unmapped_keys.get(stream, [])]

    def unmapped_at(self, stream: int, address: int) -> Block | None:
        """Return the unmapped block on ``stream`` that holds ``address``, or None."""
        keys = self._unmapped_keys.get(stream, [])
        i = bisect_right(keys, address)
        if i == 0:
            return None
        block = self._unmapped[keys[i - 1]]
        return block if address < block.address + block.size else None

    def first_run(self, stream: int, size: int, shared: int) -> Block | None:
        """The first block of the lowest-address run of at least ``size`` bytes of unmapped
        blocks on ``shared`` and free mapped blocks of ``stream`` (``policy:accelrt``'s
        arenas, docs/allocator.md 16.2 step 4), or None when there is none.

        A run starts at an unmapped block, or at the free block of ``stream`` just before it.
        A walk that fails stops where any later run through the blocks it crossed would stop,
        with less room: the unmapped blocks below its end are passed over, so each block is
        walked once per call.
        """
        walked_to = 0  # where the last failed walk stopped
        for address in self._unmapped_keys.get(shared, []):
            if address < walked_to:
                continue
            start = self._unmapped[address]
            before = start.prev
            if (
                before is not None
                and before.mapped
                and before.stream == stream
                and before.is_free()
            ):
                start = before  # the stream's free block just before it
            room = 0
            walk: Block | None = start
            while room < size and walk is not None and (not walk.mapped or walk.stream == stream):
                if not walk.is_free():
                    break
                room += walk.size
                walk = walk.next
            if room >= size:
                return start
            walked_to = start.address + room
        return None

    def unmapped_streams(self) -> list[int]:
        """Return the streams that have unmapped blocks in this pool."""
        return [stream for stream, keys in self._unmapped_keys.items() if keys]

    def unmapped_count(self) -> int:
        """Return how many unmapped blocks the pool holds."""
        return len(self._unmapped)


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
    """A reserved address range of one (stream, pool) whose pages are mapped on demand; under
    ``policy:accelrt``, an arena shared by every stream (``stream`` is ``SHARED_STREAM``).

    Attributes
    ----------
    address, size : int
        The reserved range: its base address and bytes (a whole number of pages).
    page_size : int
        Bytes per page: 2 MiB for a small pool, 20 MiB for a large one.
    stream : int
        The stream handle every block of the segment belongs to, or ``SHARED_STREAM`` for an
        arena (each block then has its own owner stream).
    pool : BlockPool
        The free list its blocks return to.

    Notes
    -----
    Mirrors c10's ``ExpandableSegment``: :meth:`map` and :meth:`unmap` work in whole pages, and
    a map either maps every page it needs or, when the device is full, none.
    """

    __slots__ = (
        "_backend",
        "_index",
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
        backend: Backend,
        index: int,
        address: int,
        size: int,
        stream: int,
        pool: BlockPool,
        page: int,
    ) -> None:
        self._backend = backend
        self._index = index
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
            self._backend.vm_map(self._index, address, mapped)
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
        self._backend.vm_unmap(self._index, start, unmapped)
        self.mapped_bytes -= unmapped
        return start, unmapped

    def release(self) -> None:
        """Give the address range back; every page must be unmapped."""
        self._backend.vm_release(self._index, self.address)

    def __repr__(self) -> str:
        return (
            f"ExpandableSegment(address={self.address:#x}, size={self.size}, "
            f"mapped={self.mapped_bytes}, stream={self.stream})"
        )


AnySegment = Segment | ExpandableSegment


def link_after(prev: Block | None, block: Block, following: Block | None = None) -> None:
    """Put ``block`` between ``prev`` and ``following`` (default: what followed ``prev``)."""
    if following is None and prev is not None:
        following = prev.next
    block.prev = prev
    block.next = following
    if prev is not None:
        prev.next = block
    if following is not None:
        following.prev = block
