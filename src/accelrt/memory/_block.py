"""Segments, blocks and the pools of free blocks (ALLOCATOR.md section 1).

A *segment* is one raw device allocation; a *block* is a piece of one, linked to its neighbours
by ``prev``/``next``. A ``BlockPool`` holds the free blocks of the small (<= 1 MiB) or the
large pool, ordered by (stream, size, address): per stream, a sorted list of integer keys
``size << 64 | address``, so a best-fit lookup is one ``bisect``.
"""

from __future__ import annotations

from bisect import bisect_left, insort
from collections.abc import Iterator

from ._history import RawFrames

__all__ = ["KEY_SHIFT", "Block", "BlockPool", "Segment"]

KEY_SHIFT = 64
_ADDRESS_MASK = (1 << KEY_SHIFT) - 1


class Segment:
    """One raw device allocation, owned by the stream whose request created it."""

    __slots__ = ("address", "frames", "is_small", "size", "stream")

    def __init__(self, address: int, size: int, stream: int, is_small: bool) -> None:
        self.address = address
        self.size = size
        self.stream = stream
        self.is_small = is_small
        self.frames: RawFrames | None = None  # the stack that created it, when recorded


class Block:
    """A piece of a segment: allocated, pending free (waiting for events) or free (in a pool)."""

    __slots__ = (
        "address",
        "allocated",
        "event_count",
        "frames",
        "gc_count_base",
        "next",
        "pool",
        "prev",
        "requested_size",
        "segment",
        "size",
        "stream",
        "stream_uses",
    )

    def __init__(
        self, address: int, size: int, stream: int, pool: BlockPool, segment: Segment
    ) -> None:
        self.address = address
        self.size = size
        self.stream = stream
        self.pool = pool
        self.segment = segment
        self.requested_size = 0
        self.allocated = False
        self.event_count = 0
        self.stream_uses: set[int] | None = None
        self.prev: Block | None = None
        self.next: Block | None = None
        self.gc_count_base = 0
        self.frames: RawFrames | None = None  # the stack that allocated it, when recorded

    def is_split(self) -> bool:
        """True if the block shares its segment with other blocks."""
        return self.prev is not None or self.next is not None

    def __repr__(self) -> str:
        state = "allocated" if self.allocated else "free"
        return f"Block(address={self.address:#x}, size={self.size}, stream={self.stream}, {state})"


class BlockPool:
    """The free blocks of one pool, ordered by (stream, size, address)."""

    __slots__ = ("_blocks", "_keys", "get_free_blocks_call_count", "is_small")

    def __init__(self, is_small: bool) -> None:
        self.is_small = is_small
        self._keys: dict[int, list[int]] = {}
        self._blocks: dict[int, Block] = {}
        self.get_free_blocks_call_count = 0

    def __len__(self) -> int:
        return len(self._blocks)

    def insert(self, block: Block) -> None:
        """Add a free block; its garbage-collection age starts now."""
        block.gc_count_base = self.get_free_blocks_call_count
        keys = self._keys.get(block.stream)
        if keys is None:
            keys = self._keys[block.stream] = []
        insort(keys, (block.size << KEY_SHIFT) | block.address)
        self._blocks[block.address] = block

    def remove(self, block: Block) -> None:
        """Remove a free block."""
        keys = self._keys[block.stream]
        del keys[bisect_left(keys, (block.size << KEY_SHIFT) | block.address)]
        del self._blocks[block.address]

    def get(self, address: int) -> Block | None:
        """Return the free block starting at ``address``, if any."""
        return self._blocks.get(address)

    def lower_bound(self, stream: int, size: int) -> Block | None:
        """Return the smallest block on ``stream`` with size >= ``size`` (lowest address first)."""
        keys = self._keys.get(stream)
        if not keys:
            return None
        i = bisect_left(keys, size << KEY_SHIFT)
        if i == len(keys):
            return None
        return self._blocks[keys[i] & _ADDRESS_MASK]

    def stream_blocks(self, stream: int, *, descending: bool = False) -> list[Block]:
        """Return the blocks on ``stream`` by (size, address), or the reverse."""
        keys = self._keys.get(stream, [])
        ordered = reversed(keys) if descending else iter(keys)
        return [self._blocks[k & _ADDRESS_MASK] for k in ordered]

    def blocks(self) -> Iterator[Block]:
        """Iterate over a snapshot of all blocks in (stream, size, address) order."""
        ordered = [
            self._blocks[k & _ADDRESS_MASK] for s in sorted(self._keys) for k in self._keys[s]
        ]
        return iter(ordered)
