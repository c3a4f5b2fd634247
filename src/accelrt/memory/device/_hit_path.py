"""The caching allocator's hit path in Python: ``malloc``, ``free`` and what they run on every
call (best fit, splitting, merging, statistics).

Compiled twin: device/_native.pyx ``HitPath`` (a file with a compiled sibling: change both;
docs/design.md, "Pairs"). Both classes have the methods below by the same names, and
``CachingAllocator`` (device/_core.py) is ``HitPath`` in front of ``SlowPath``
(device/_allocator.py, every rare path): the compiled ``HitPath`` where it is built, this one
otherwise. Only ``_expandable_candidate`` is Python's own (compiled: ``BlockPool.expandable_fit``).
tests/memory/test_native_core.py holds the two to identical blocks, addresses, statistics and
snapshots, and checks that they have the same methods.

The class attributes name the types the allocator builds its blocks, free lists and statistics
from; the compiled ``HitPath`` names its compiled ones, with the same attributes.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from .._atomic import PENDING, deliver, register
from .._policy import K_SMALL_SIZE, MAX_REQUEST_BYTES, page_floor, round_size, should_split
from ._block import DEFAULT_POOL_ID, Block, BlockPool, PoolId
from ._requests import _not_allocated, _request_size
from ._stats import DeviceStats, Stat, StatArray

if TYPE_CHECKING:
    from .._config import AllocatorConfig
    from ..history._history import History

__all__ = ["HitPath"]


class HitPath:
    """``malloc``, ``free`` and what they run on every call: the first base of
    ``CachingAllocator`` (device/_core.py), whose second, ``SlowPath``, sets the attributes
    and defines the methods declared here without a body."""

    _Block: type[Block] = Block
    _BlockPool: type[BlockPool] = BlockPool
    _Stat: type[Stat] = Stat
    _StatArray: type[StatArray] = StatArray
    _ActiveBlocks: type[dict[int, Block]] = dict

    # set by SlowPath
    config: AllocatorConfig
    stats: DeviceStats
    device_name: str
    _lock: Any
    _small: BlockPool
    _large: BlockPool
    _active: dict[int, Block]
    _routes: dict[int, list[PoolId]]
    _observer: History | None
    _max_split: int
    _expandable: bool
    _allowed_max: int | None
    _clock: int
    _floor_page: int
    _floor_peak: int
    # defined by SlowPath (and its bases)
    _catch_up: Callable[[], None]
    _routed_pool: Callable[[int], BlockPool]
    _malloc_slow: Callable[[BlockPool, int, int, int], Block]
    _pool_no_split: Callable[[PoolId], bool]
    _release: Callable[[Block, bool], None]
    _release_dropped_pool_cache: Callable[[PoolId], None]

    def _make_lock(self) -> Any:
        """The lock every public method holds (the compiled core brings its own)."""
        return threading.RLock()

    # ------------------------------------------------------------------ malloc
    def malloc(self, nbytes: int, stream: int) -> Block:
        """Allocate a block of at least ``nbytes`` on ``stream``.

        Parameters
        ----------
        nbytes : int
            Requested size in bytes, 1 <= nbytes <= 2**60.
        stream : int
            The backend stream handle the memory will be used on.

        Returns
        -------
        Block
            An allocated block; ``block.address`` is the device pointer. It comes from the
            private pool the calling thread allocates to (``use_mem_pool``), else from the
            device's default pools.

        Raises
        ------
        TypeError
            If ``nbytes`` is not an integer.
        ValueError
            If ``nbytes`` < 1 or > 2**60.
        OutOfMemoryError
            If the malloc ladder (docs/allocator.md section 6) finds no memory; the allocator
            is unchanged except for cached memory released on the way, pages mapped on the way
            (they stay cached) and the ``num_ooms`` counter.
        """
        if type(nbytes) is not int or not 0 < nbytes <= MAX_REQUEST_BYTES:
            nbytes = _request_size(nbytes, "device")
        with self._lock:
            try:  # atomic: all or nothing, even under KeyboardInterrupt
                self._catch_up()
                size = round_size(nbytes, self.config)
                if self._routes:
                    pool = self._routed_pool(size)
                else:
                    pool = self._small if size <= K_SMALL_SIZE else self._large
                block = self._get_free_block(pool, size, stream)
                if block is None:
                    block = self._malloc_slow(pool, size, nbytes, stream)
                block = self._alloc_found_block(block, size, nbytes)
                if self._observer is not None:
                    self._observer.record("alloc", block.address, nbytes, stream, block)
                return block
            finally:
                if PENDING.flag:
                    deliver()

    def _get_free_block(self, pool: BlockPool, size: int, stream: int) -> Block | None:
        if self._allowed_max is not None and self.config.garbage_collection_threshold > 0:
            pool.get_free_blocks_call_count += 1
        block = pool.lower_bound(stream, size)
        if block is None:
            return None
        if block.segment.is_expandable:
            block = self._expandable_candidate(pool, size, stream)
            if block is None:
                return None
        max_split = self._max_split
        if size < max_split and block.size >= max_split:
            return None  # keep oversize blocks for oversize requests
        if size >= max_split and block.size >= size + self.config.max_non_split_rounding:
            return None
        pool.remove(block)
        return block

    def _expandable_candidate(self, pool: BlockPool, size: int, stream: int) -> Block | None:
        """Best fit when the first candidate is in an expandable segment (section 3).

        Compiled twin: device/_native.pyx ``BlockPool.expandable_fit``."""
        candidates = pool.candidates(stream, size)
        current = next(candidates)
        if not self._expandable:  # switched off after some were made: skip their blocks
            for candidate in candidates:
                if not candidate.segment.is_expandable:
                    return candidate
            return None
        for candidate in candidates:
            if not current.segment.is_expandable:
                break
            if _growable_size(candidate) >= _growable_size(current):
                break
            current = candidate
        return current

    # ------------------------------------------------------------------ handing out blocks
    def _alloc_found_block(self, block: Block, size: int, nbytes: int) -> Block:
        stats = self.stats
        pool = block.pool
        is_small = pool.is_small
        if self._floor_page:
            self._note_floor(is_small, size)
        counts_split = not block.segment.is_expandable  # inactive_split skips expandable
        already_split = block.prev is not None or block.next is not None  # hot: no call
        if should_split(block.size, size, is_small, self._max_split, self._expandable) and (
            pool.pool_id is DEFAULT_POOL_ID or not self._pool_no_split(pool.pool_id)
        ):
            remaining = block
            block = self._Block(remaining.address, size, remaining.stream, pool, remaining.segment)
            block.prev = remaining.prev
            if block.prev is not None:
                block.prev.next = block
            block.next = remaining
            remaining.prev = block
            remaining.address += size
            remaining.size -= size
            self._clock += 1
            remaining.stamp = self._clock
            pool.insert(remaining)
            if counts_split and already_split:
                stats.inactive_split_bytes.decrease(is_small, size)
            elif counts_split:
                stats.inactive_split_bytes.increase(is_small, remaining.size)
                stats.inactive_split.increase(is_small, 1)
        elif already_split and counts_split:
            stats.inactive_split_bytes.decrease(is_small, block.size)
            stats.inactive_split.decrease(is_small, 1)
        self._mark_allocated(block, nbytes)
        return block

    def _note_floor(self, is_small: bool, size: int) -> None:
        """Raise ``_floor_peak`` to the page floor of the live bytes with ``size`` more (a
        request about to be served): policy:accelrt's budget (docs/allocator.md 16.1)."""
        large = self.stats.allocated_bytes.large.current
        small = self.stats.allocated_bytes.small.current
        if is_small:
            small += size
        else:
            large += size
        floor = page_floor(large, small, self._floor_page)
        if floor > self._floor_peak:
            self._floor_peak = floor

    def _mark_allocated(self, block: Block, nbytes: int) -> None:
        """Hand ``block`` out for a request of ``nbytes`` and count it in the statistics."""
        stats = self.stats
        is_small = block.pool.is_small
        block.allocated = True
        block.requested_size = nbytes
        self._active[block.address] = block
        stats.allocation.increase(is_small, 1)
        stats.allocated_bytes.increase(is_small, block.size)
        stats.active.increase(is_small, 1)
        stats.active_bytes.increase(is_small, block.size)
        stats.requested_bytes.increase(is_small, nbytes)
        if block.size >= self._max_split:
            stats.oversize_allocations.increase(1)

    # ------------------------------------------------------------------ free
    def free(self, block: Block) -> None:
        """Give a block back; reusable at once on its stream, elsewhere after its events.

        The block returns to the pool it came from, whichever pool the thread allocates to
        now.

        Raises
        ------
        ValueError
            If the block is not currently allocated by this allocator (double free, or a
            block of another device); nothing changes.
        """
        with self._lock:
            if self._active.get(block.address) is not block or not block.allocated:
                raise _not_allocated(self.device_name, block.address)
            try:  # atomic: all or nothing, even under KeyboardInterrupt
                stats = self.stats
                is_small = block.pool.is_small
                if self._observer is not None:
                    self._observer.record(
                        "free_requested", block.address, block.requested_size, block.stream, block
                    )
                block.allocated = False
                stats.allocation.decrease(is_small, 1)
                stats.allocated_bytes.decrease(is_small, block.size)
                if block.size >= self._max_split:
                    stats.oversize_allocations.decrease(1)
                self._release(block, bool(block.stream_uses))
            finally:
                if PENDING.flag:
                    deliver()

    def _free_block(self, block: Block) -> None:
        stats = self.stats
        pool = block.pool
        is_small = pool.is_small
        original_size = block.size
        requested = block.requested_size
        split_blocks_change = 0
        split_bytes_change = 0
        if self._observer is not None:
            self._observer.record("free_completed", block.address, requested, block.stream, block)
        del self._active[block.address]
        for candidate in (block.prev, block.next):
            subsumed = self._try_merge(block, candidate, pool)
            if subsumed:
                split_blocks_change -= 1
                split_bytes_change -= subsumed
        self._clock += 1
        block.stamp = self._clock
        pool.insert(block)
        if not block.segment.is_expandable:  # inactive_split skips expandable segments
            if block.prev is not None or block.next is not None:  # split (hot: no call)
                split_blocks_change += 1
                split_bytes_change += block.size
            if split_blocks_change > 0:
                stats.inactive_split.increase(is_small, split_blocks_change)
            elif split_blocks_change < 0:
                stats.inactive_split.decrease(is_small, -split_blocks_change)
            if split_bytes_change > 0:
                stats.inactive_split_bytes.increase(is_small, split_bytes_change)
            elif split_bytes_change < 0:
                stats.inactive_split_bytes.decrease(is_small, -split_bytes_change)
        stats.active.decrease(is_small, 1)
        stats.active_bytes.decrease(is_small, original_size)
        stats.requested_bytes.decrease(is_small, requested)
        if pool.pool_id is not DEFAULT_POOL_ID:
            self._release_dropped_pool_cache(pool.pool_id)

    @staticmethod
    def _try_merge(dst: Block, src: Block | None, pool: BlockPool) -> int:
        if (
            src is None
            or src.allocated
            or src.event_count > 0
            or src.stream_uses
            or src.mapped is not dst.mapped
            or src.stream != dst.stream
        ):
            return 0
        if src.mapped:
            pool.remove(src)
        else:
            pool.remove_unmapped(src)
        if dst.prev is src:
            dst.address = src.address
            dst.prev = src.prev
            if dst.prev is not None:
                dst.prev.next = dst
        else:
            dst.next = src.next
            if dst.next is not None:
                dst.next.prev = dst
        dst.size += src.size
        return src.size


register(HitPath.malloc)  # the hot paths test PENDING themselves
register(HitPath.free)


def _growable_size(block: Block) -> int:
    """A free block's size plus the unmapped block after it: what it could grow to."""
    following = block.next
    if following is not None and not following.mapped:
        return block.size + following.size
    return block.size
