"""``Releasing``: cached memory back to the device.

``empty_cache`` and the malloc ladder's releases (docs/allocator.md sections 6 and 7): whole
free ordinary segments and free pages of expandable segments, in every pool, the oldest first
for garbage collection past its threshold. A base of ``SlowPath`` (device/_allocator.py); it
holds no state of its own.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from .._atomic import atomic
from .._policy import UNLIMITED
from ._block import AnySegment, Block, BlockPool, ExpandableSegment, PoolId, Segment

if TYPE_CHECKING:
    from .._config import AllocatorConfig
    from ..history._history import History
    from ._private_pools import PrivatePool
    from ._source import MemorySource
    from ._stats import DeviceStats

__all__ = ["Releasing"]


class Releasing:
    """``empty_cache`` and the releases of the malloc ladder: a base of ``SlowPath``, which
    sets the attributes and defines the methods declared here."""

    config: AllocatorConfig
    stats: DeviceStats
    _lock: Any
    _small: BlockPool
    _large: BlockPool
    _private: dict[PoolId, PrivatePool]
    _allowed_max: int | None
    _segments: dict[int, AnySegment]
    _observer: History | None
    _max_split: int
    _reserved: int
    _finalized: list[Callable[[], None]]
    _arena_order: dict[int, int]
    _free_finalized: Callable[[], None]
    _destroy_idle_events: Callable[[], None]
    _synchronize_and_free_events: Callable[[], None]
    _release_if_abandoned: Callable[[PoolId], None]
    _join_owners: Callable[[BlockPool], None]
    _unmap_block: Callable[[Block], None]
    _source_of: Callable[[BlockPool], MemorySource]
    _count_device_memory: Callable[[BlockPool, int], None]

    # ------------------------------------------------------------------ releasing
    @atomic
    def empty_cache(self) -> None:
        """Wait for pending frees, then return every cached, unused segment to the device.

        Mirrors ``torch.cuda.empty_cache``: ordinary segments with no allocated block are
        released, whole free pages of expandable segments are unmapped, in every pool
        (private ones too). Blocks still allocated, and free pieces of partly used ordinary
        segments, stay. Unlike PyTorch, the address ranges of expandable segments with nothing
        mapped are given back too. The events the allocator keeps for reuse are destroyed.
        """
        with self._lock:
            if self._finalized:
                self._free_finalized()
            try:
                self._release_cached_blocks()
                for pool in self._all_pools():
                    self._release_unused_ranges(pool)
            finally:  # a driver error half-way may have emptied a dropped pool already
                self._forget_dropped_pools()
            self._destroy_idle_events()

    def _all_pools(self) -> list[BlockPool]:
        pools = [self._large, self._small]
        for private in self._private.values():
            pools += (private.large, private.small)
        return pools

    def _release_cached_blocks(self) -> None:
        self._synchronize_and_free_events()
        try:
            for pool in self._all_pools():
                self._release_pool_blocks(pool)
            for pool_id, private in list(self._private.items()):
                if not private.owner_alive:  # its last segment may have gone just now
                    self._release_if_abandoned(pool_id)
        finally:  # a driver error in a later pool must not leave an emptied dropped pool known
            self._forget_dropped_pools()

    def _forget_dropped_pools(self) -> None:
        """Forget the dropped pools that hold no segment (no device call: it cannot fail)."""
        in_use = {segment.pool.pool_id for segment in self._segments.values()}
        for pool_id, private in list(self._private.items()):
            if not private.owner_alive and pool_id not in in_use:
                del self._private[pool_id]

    def _release_pool_blocks(self, pool: BlockPool) -> None:
        """Release the pool's unsplit ordinary segments and unmap its expandable free pages."""
        if self._arena_order:  # a page free under two owners' blocks can go too
            self._join_owners(pool)
        to_unmap = []
        for block in pool.blocks():
            if block.segment.is_expandable:
                to_unmap.append(block)  # unmapping changes the pool: do it after the walk
            elif not block.is_split():
                self._release_block(block)
        for block in to_unmap:
            self._unmap_block(block)
            if block.prev is None and block.next is None and not block.mapped:
                self._release_expandable(block)

    def _release_unused_ranges(self, pool: BlockPool) -> None:
        """Give back the address ranges of the pool's expandable segments with nothing mapped.

        Only ``empty_cache()`` and a released pool do this (the OOM retry, as PyTorch's, keeps
        them for the next request): a range whose first map ran out of memory holds no memory
        but would otherwise stay reserved for ever.
        """
        for stream in pool.unmapped_streams():
            for block in pool.unmapped_blocks(stream):
                if block.prev is None and block.next is None:
                    self._release_expandable(block)

    def _release_block(self, block: Block) -> None:
        stats = self.stats
        pool = block.pool
        segment = block.segment
        assert isinstance(segment, Segment)
        self._source_of(pool).release(segment)
        if self._observer is not None:
            self._observer.record("segment_free", block.address, block.size, block.stream)
        pool.remove(block)
        del self._segments[block.address]
        self._count_device_memory(pool, -block.size)
        stats.segment.decrease(pool.is_small, 1)
        if block.size >= self._max_split:
            stats.oversize_segments.decrease(1)

    def _release_expandable(self, block: Block) -> None:
        """Give back the address range of an expandable segment that is all unmapped."""
        segment = block.segment
        assert isinstance(segment, ExpandableSegment)
        block.pool.remove_unmapped(block)
        segment.release()
        del self._segments[segment.address]

    def _release_available_cached_blocks(self, pool: BlockPool, size: int, stream: int) -> bool:
        if self._max_split == UNLIMITED:
            return False
        target = max(size, self._max_split)
        block = pool.lower_bound(stream, target)
        if block is not None and not block.segment.is_expandable and not block.is_split():
            self._release_block(block)
            return True
        released = 0
        for candidate in reversed(pool.stream_blocks_below(stream, target)):
            if released >= target or candidate.size < self._max_split:
                break
            if not candidate.segment.is_expandable and not candidate.is_split():
                released += candidate.size
                self._release_block(candidate)
        return released >= target

    def _garbage_collect(self) -> None:
        assert self._allowed_max is not None
        threshold = int(self.config.garbage_collection_threshold * self._allowed_max)
        if self._reserved <= threshold:
            return
        target = self._reserved - threshold
        pool = self._large
        calls = pool.get_free_blocks_call_count
        freeable = [b for b in pool.blocks() if _collectable(b)]
        total_age = sum(calls - b.gc_count_base for b in freeable)
        count = len(freeable)
        reclaimed = 0
        freed_any = True
        while reclaimed < target and freed_any and count > 0:
            age_threshold = total_age / count
            freed_any = False
            for block in pool.blocks():
                age = calls - block.gc_count_base
                if _collectable(block) and age >= age_threshold:
                    freed_any = True
                    reclaimed += block.size
                    total_age -= age
                    count -= 1
                    self._release_block(block)


def _collectable(block: Block) -> bool:
    """Whether garbage collection may release a free block: a whole ordinary segment."""
    return not block.is_split() and not block.segment.is_expandable
