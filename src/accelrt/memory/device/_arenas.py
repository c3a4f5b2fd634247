"""``policy:accelrt``: arenas shared by every stream, 2 MiB pages, idle pages moved on a miss.

docs/allocator.md section 16 specifies it. An *arena* is an expandable segment
(``_block.ExpandableSegment``) reserved for one pool and size class and shared by every stream:
its stream is ``SHARED_STREAM``, as are its unmapped blocks; every mapped block has an owner
stream (``Block.stream``), and free blocks merge only with free neighbours of the same owner
(``_try_merge``, in both cores). Hits are expandable segments' hits, unchanged, on the owner's
free list (the compiled core serves them). This module runs only on misses:

1. **adopt** another stream's free block of the same pool (best fit by size, then address),
   after making the request's stream wait for the owner's work (one event, on the device);
   when the request would take reserved memory above the **budget** (below), neighbouring
   free blocks of different owners are first joined into one (``_join_owners``);
2. **grow** the arena as expandable segments grow (the first run of own free and unmapped
   blocks that holds the request, starting at another stream's free block just below it,
   adopted, where there is one), mapping whole 2 MiB pages, large arenas up to the next
   ``large_segment_size`` boundary while reserved memory stays within the growth cap;
3. for a map that would take reserved memory above the **budget**, first **reclaim** the idle
   pages of cached free blocks (oldest stamp first, own pool first), unmapping them to map the
   same number of pages where they are needed.

The budget is ``max(F, H + H // 200) + A``: F the high-water mark of expandable segments' page
floor of the live bytes (``_policy.page_floor``, kept on every malloc by both cores' hit path),
H the high-water mark of requested bytes, A an allowance for large maps that had to move pages.
Every decision is a function of the calls made (never of timing), so both cores and every run
agree byte for byte.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import TYPE_CHECKING

from .._policy import K_MIN_BLOCK_SIZE, K_SMALL_BUFFER
from ._block import DEFAULT_POOL_ID, SHARED_STREAM, ExpandableSegment, link_after
from ._oom import FractionRejection

if TYPE_CHECKING:
    from ...backends._base import Backend, EventHandle
    from .._config import AllocatorConfig
    from ._block import AnySegment, Block, BlockPool, PoolId
    from ._source import MemorySource
    from ._stats import DeviceStats

__all__ = ["PAGE", "SharedArenas"]

PAGE = K_SMALL_BUFFER
"""The arenas' page: 2 MiB in both size classes."""


class SharedArenas:
    """The miss path of ``policy:accelrt`` (a base class of the caching allocator).

    The allocator sets the attributes below and defines the methods declared here; it calls
    :meth:`_reset_arenas` once, :meth:`_adopt` and :meth:`_grow_arena` on a miss, and
    :meth:`_keep_high_water` before statistics' peaks are reset.
    """

    backend: Backend
    device_index: int
    config: AllocatorConfig
    stats: DeviceStats
    _source: MemorySource
    _segments: dict[int, AnySegment]
    _Block: type[Block]
    _reserved: int
    _allowed_max: int | None
    _idle_events: dict[int, list[EventHandle]]
    _clock: int
    _floor_page: int  # the large page of the page floor; 0 when the policy is off
    _floor_peak: int
    # defined by HitPath (device/_hit_path.py, or its compiled twin)
    _note_floor: Callable[[bool, int], None]
    _try_merge: Callable[[Block, Block | None, BlockPool], int]

    def _all_pools(self) -> list[BlockPool]:
        raise NotImplementedError

    def _event_on(self, device_index: int, stream: int) -> EventHandle:
        raise NotImplementedError

    def _map_block(
        self, block: Block, nbytes: int, at: int | None = None, owner: int | None = None
    ) -> bool:
        raise NotImplementedError

    def _unmap_block(self, block: Block, lowest: int | None = None) -> None:
        raise NotImplementedError

    def _fraction_refuses(self, nbytes: int) -> bool:
        raise NotImplementedError

    def _pool_no_split(self, pool_id: PoolId) -> bool:
        raise NotImplementedError

    # ------------------------------------------------------------------ state
    def _reset_arenas(self) -> None:
        """Start with no arena, no allowance and no high-water mark."""
        self._high_water = 0  # H before the last reset of the statistics' peaks
        self._allowance = 0  # A
        self._allowance_from = 0  # S: the smallest request whose stitching raised A
        self._arena_order: dict[int, int] = {}  # arena address -> creation number
        self._arenas_made = 0
        #: policy counters (snapshot ``allocator_settings["accelrt_policy"]``)
        self.policy_counters = {"adoptions": 0, "reclaims": 0, "pages_moved": 0}

    def _keep_high_water(self) -> None:
        """Remember H before ``reset_peak_memory_stats`` resets the peak it is read from."""
        self._high_water = max(self._high_water, self.stats.requested_bytes.all.peak)

    def _note_request(self, pool: BlockPool, size: int, nbytes: int) -> None:
        """Count the request being served in F and H before any decision (16.1)."""
        self._note_floor(pool.is_small, size)
        requested = self.stats.requested_bytes.all
        self._high_water = max(self._high_water, requested.peak, requested.current + nbytes)

    def _base_budget(self) -> int:
        """B0 = max(F, 1.005 H), in bytes (integer arithmetic)."""
        high = self._high_water
        return max(self._floor_peak, high + high // 200)

    def _budget(self, size: int) -> int:
        """B for a request of ``size`` bytes: B0, plus A if ``size`` >= S (16.1), capped by the
        memory fraction's allowance (16.2)."""
        budget = self._base_budget()
        if size >= self._allowance_from:
            budget += self._allowance
        return budget if self._allowed_max is None else min(budget, self._allowed_max)

    def _join_owners(self, pool: BlockPool) -> None:
        """Merge neighbouring free arena blocks of different owners, once each owner's work
        has finished: a miss above the budget (16.2 step 3) can then adopt, or reclaim the
        pages of, the joined block, and releasing the cache (``empty_cache``, the malloc
        ladder's last step) can unmap a page they share (16.3). The merged block takes the
        lower one's owner and stamp."""
        waited: set[int] = set()
        for block in pool.blocks():
            if block.segment.stream != SHARED_STREAM or pool.get(block.address) is not block:
                continue  # not an arena's, or merged into a block before it
            right = block.next
            while right is not None and right.mapped and right.is_free():
                for stream in (block.stream, right.stream):
                    self._wait_for_stream(stream, waited)
                pool.remove(right)
                right.stream = block.stream
                pool.insert(right)
                pool.remove(block)
                self._try_merge(block, right, pool)
                pool.insert(block)
                right = block.next

    def _wait_for_stream(self, stream: int, waited: set[int]) -> None:
        """Wait on the host for ``stream``'s work, once per ``waited`` set."""
        if stream in waited:
            return
        waited.add(stream)
        with contextlib.suppress(Exception):  # a destroyed stream has finished its work
            self.backend.stream_synchronize(self.device_index, stream)

    # ------------------------------------------------------------------ adopt (16.2 step 3)
    def _adopt(self, pool: BlockPool, size: int, stream: int) -> Block | None:
        """Take the best fit (size, then address) among other streams' free arena blocks of
        ``pool``, out of the pool, owned by ``stream`` and cut to ``size`` (the remainder stays
        free, owned by ``stream``; a ``no_split`` pool's block stays whole); None when there is
        none."""
        best: Block | None = None
        for owner in pool.streams():
            if owner == stream:
                continue
            for candidate in pool.candidates(owner, size):
                if candidate.segment.stream == SHARED_STREAM:
                    if best is None or (candidate.size, candidate.address) < (
                        best.size,
                        best.address,
                    ):
                        best = candidate
                    break
        if best is None:
            return None
        self._take_over(pool, best, stream)
        remaining = best.size - size
        whole = pool.pool_id != DEFAULT_POOL_ID and self._pool_no_split(pool.pool_id)
        if remaining >= K_MIN_BLOCK_SIZE and not whole:
            rest = self._Block(best.address + size, remaining, stream, pool, best.segment)
            link_after(best, rest)
            best.size = size
            self._try_merge(rest, rest.next, pool)
            self._clock += 1
            rest.stamp = self._clock
            pool.insert(rest)
        return best

    def _take_over(self, pool: BlockPool, block: Block, stream: int) -> None:
        """Adopt ``block``, another stream's free block of ``pool``, for ``stream``: ``stream``
        waits on the device for the owner's work, and the block leaves the pool, owned by
        ``stream`` (its stamp kept); counted in ``policy_counters["adoptions"]``."""
        self._order_after(block.stream, stream)
        pool.remove(block)
        block.stream = stream
        self.policy_counters["adoptions"] += 1

    def _order_after(self, owner: int, stream: int) -> None:
        """Make ``stream`` wait, on the device, for the work queued so far on ``owner``."""
        try:
            event = self._event_on(self.device_index, owner)
        except Exception:  # the owner stream is gone: a destroyed stream has finished
            return
        try:
            self.backend.stream_wait_event(self.device_index, stream, event)
        finally:
            self._idle_events.setdefault(self.device_index, []).append(event)

    # ------------------------------------------------------------------ grow (16.2 steps 4-5)
    def _grow_arena(self, pool: BlockPool, size: int, stream: int) -> Block | None:
        """Map pages until a free run of ``size`` bytes owned by ``stream`` exists in an arena
        of ``pool``; return it out of the pool, or None when memory ran out (the malloc ladder
        then releases the cache and retries)."""
        start = self._arena_run(pool, size, stream)
        if start is None:
            return None
        base = start.address
        segment = start.segment
        current = start if start.mapped else None
        while current is None or current.size < size:
            have = 0 if current is None else current.size
            at = base + have
            unmapped = self._unmapped_at(pool, at)
            exact = -(-(size - have) // PAGE) * PAGE
            chunk = 0
            if not pool.is_small:  # up to the next large page, within the growth cap G
                offset = at - segment.address
                large = self._floor_page
                aligned = -(-(offset + exact) // large) * large - offset
                if aligned > exact:
                    cap = max(self._base_budget(), self._high_water + large) - self._reserved
                    chunk = min(aligned, max(exact, cap // PAGE * PAGE))
            need = min(unmapped.address + unmapped.size - at, max(exact, chunk))
            mapped = self._map_part(pool, at, need, stream, base, base + size)
            if mapped is None and need > exact:  # refused: the pages the request needs only
                mapped = self._map_part(pool, at, exact, stream, base, base + size)
            if mapped is None:
                if self.config.throw_on_cudamalloc_oom and self._fraction_refuses(exact):
                    raise FractionRejection  # past the fraction: no retries
                return None
            current = mapped
        pool.remove(current)
        return current

    def _map_part(
        self, pool: BlockPool, at: int, need: int, stream: int, lo: int, request_end: int
    ) -> Block | None:
        """Map ``need`` bytes at ``at`` for ``stream`` (reclaiming first above the budget,
        never from what the request will hold, ``[lo, request_end)``, or from the pages about
        to be mapped); the mapped block, merged with the free block before it, or None when
        the device or the memory fraction refused."""
        if not self._pages_for(pool, need, lo, max(request_end, at + need), request_end - lo):
            return None
        unmapped = self._unmapped_at(pool, at)  # a reclaim may have merged into it
        if not self._map_block(unmapped, need, at=at, owner=stream):
            return None
        return unmapped  # mapped now

    def _arena_run(self, pool: BlockPool, size: int, stream: int) -> Block | None:
        """The first block of the lowest-address run of free blocks of ``stream`` and
        unmapped blocks that holds ``size`` bytes (begun at another stream's free block just
        below it, adopted, if there is one), in a new arena if none has room; None when no
        address space is left."""
        found = pool.first_run(stream, size, SHARED_STREAM)
        if found is not None:
            return self._adopt_tail(pool, found, stream)
        segment = self._source.reserve(SHARED_STREAM, pool, PAGE)
        if segment is None:
            return None
        if segment.size < size:
            segment.release()
            return None
        self._segments[segment.address] = segment
        self._arena_order[segment.address] = self._arenas_made
        self._arenas_made += 1
        block = self._Block(segment.address, segment.size, SHARED_STREAM, pool, segment)
        block.mapped = False
        pool.insert_unmapped(block)
        return block

    def _adopt_tail(self, pool: BlockPool, start: Block, stream: int) -> Block:
        """``start``, or, where it is unmapped and the block before it is another stream's
        free block, that block, taken over by ``stream`` (the run then begins with it: 16.2
        step 4)."""
        if start.mapped:
            return start
        before = start.prev
        if before is None or not before.mapped or not before.is_free() or before.stream == stream:
            return start
        self._take_over(pool, before, stream)
        pool.insert(before)  # back in the pool, now in the request stream's list
        return before

    @staticmethod
    def _unmapped_at(pool: BlockPool, address: int) -> Block:
        """The unmapped arena block of ``pool`` that holds ``address``."""
        block = pool.unmapped_at(SHARED_STREAM, address)
        if block is None:
            raise AssertionError(f"no unmapped block holds {address:#x}")
        return block

    def _pages_for(self, pool: BlockPool, need: int, lo: int, hi: int, size: int) -> bool:
        """Make room for a map of ``need`` bytes for a request of ``size`` bytes: above the
        budget, reclaim idle pages first (never from ``[lo, hi)``, what the request will
        hold); False when the memory fraction forbids the pages still to be created."""
        if self._reserved + need > self._budget(size):
            reserved_before = self._reserved
            moved = self._reclaim(pool, need, lo, hi)
            if moved:
                counters = self.policy_counters
                counters["reclaims"] += 1
                counters["pages_moved"] += moved // PAGE
                if 3 * need >= reserved_before:  # a large tensor stitched from moved pages
                    self._allowance = min(self._allowance + need, self._high_water // 10)
                    if not self._allowance_from or size < self._allowance_from:
                        self._allowance_from = size
        return not self._fraction_refuses(need)

    def _reclaim(self, pool: BlockPool, want: int, lo: int, hi: int) -> int:
        """Unmap up to ``want`` bytes of whole idle pages of free arena blocks (16.2 step
        5.2): ``pool``'s blocks first, then the other default pool's (never a private pool's:
        a captured graph may still use its free blocks' addresses); oldest stamp first (then
        arena, address); the highest pages of a block first; a small arena keeps its last idle
        page from a large request. Returns the bytes unmapped."""
        order = self._arena_order
        victims = sorted(  # (addresses differ: tuples never compare their blocks)
            (block.stamp, order[block.segment.address], block.address, block)
            for arena_pool in self._all_pools()
            if arena_pool.pool_id == DEFAULT_POOL_ID  # a graph may replay a private one's
            for block in arena_pool.blocks_from(PAGE)
            if block.segment.stream == SHARED_STREAM
        )
        live: dict[int, int] = {}  # small arena address -> its mapped bytes not free
        waited: set[int] = set()
        got = 0
        for own_pool_only in (True, False):
            for *_, block in victims:
                if got >= want:
                    return got
                if (own_pool_only and block.pool is not pool) or not block.mapped:
                    continue
                above = 0
                if block.address < hi and block.address + block.size > lo:
                    if block.address + block.size <= hi:
                        continue  # inside what the request is about to hold
                    above = hi  # the run's last free block: only its pages above that
                segment = block.segment
                assert isinstance(segment, ExpandableSegment)
                if block.pool.is_small and not pool.is_small and block.size < 2 * PAGE:
                    # (a free block of two pages or more leaves its arena two idle pages)
                    if segment.address not in live:  # its bytes not free: allocated, pending
                        free = sum(b.size for b in block.pool.blocks() if b.segment is segment)
                        live[segment.address] = segment.mapped_bytes - free
                    if segment.mapped_bytes - live[segment.address] < 2 * PAGE:
                        continue
                got += self._unmap_idle_pages(block, want - got, waited, above)
        return got

    def _unmap_idle_pages(self, block: Block, want: int, waited: set[int], above: int) -> int:
        """Unmap the highest whole pages of a free block, at most ``want`` bytes of them and
        none below address ``above``, once its owner's work has finished; return the bytes
        unmapped."""
        segment = block.segment
        end = block.address + block.size
        top = segment.address + (end - segment.address) // PAGE * PAGE
        bottom = segment.address + -(-(block.address - segment.address) // PAGE) * PAGE
        bottom = max(bottom, top - -(-want // PAGE) * PAGE)
        if above > bottom:
            bottom = segment.address + -(-(above - segment.address) // PAGE) * PAGE
        if top <= bottom:
            return 0
        self._wait_for_stream(block.stream, waited)  # its last use may still be running
        self._unmap_block(block, lowest=bottom)
        return top - bottom
