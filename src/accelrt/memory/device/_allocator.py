"""``SlowPath``: the caching allocator's every path but its hit path, on both cores.

``CachingAllocator`` (device/_core.py) is ``HitPath`` in front of ``SlowPath``: ``HitPath``
(device/_hit_path.py, or its compiled twin device/_native.pyx) serves ``malloc`` and ``free``
from the free lists; this class holds the state and runs everything else (settings, new
segments and pages, the OOM ladder, events, private pools, releasing, snapshots, history) on
the blocks and pools whichever ``HitPath`` runs has built. It has no compiled twin.

The default policy reproduces PyTorch's CUDACachingAllocator (docs/allocator.md sections 1-8):
requests are rounded and split between a small and a large pool; a request takes the smallest
free block of its own stream that fits (lowest address first); blocks are split and merged
inside their segment; frees of blocks used by other streams wait for events recorded on those
streams; when nothing fits, the malloc ladder grows a segment, releases cached memory and
retries before raising ``OutOfMemoryError``.

The allocator gets its memory through a :class:`~accelrt.memory.device._source.MemorySource`:
it asks for ordinary segments, or for expandable segments that it grows by mapping pages, and
asks them back; it never calls the backend's ``malloc``/``free`` itself. Private pools
(``MemPool``) are pairs of free lists of their own. History is an observer behind one hook
(``_observer``).
"""

from __future__ import annotations

import itertools
import operator
import threading
from collections.abc import Callable, Sequence
from typing import Any

from ..._errors import OutOfMemoryError
from ..._warn import warn_user
from ...backends._base import Backend
from .._atomic import atomic, protect_sigint
from .._config import AllocatorConfig
from .._policy import (
    K_MIN_BLOCK_SIZE,
    K_SMALL_BUFFER,
    K_SMALL_SIZE,
    UNLIMITED,
    page_size,
    segment_size,
)
from ..history._history import (
    Annotation,
    BlockInfo,
    ContextMode,
    EnabledMode,
    History,
    SegmentInfo,
    TraceEntry,
    frames_to_dicts,
)
from ._arenas import SharedArenas
from ._block import (
    DEFAULT_POOL_ID,
    SHARED_STREAM,
    AnySegment,
    Block,
    BlockPool,
    ExpandableSegment,
    PoolId,
    Segment,
    link_after,
)
from ._events import StreamEvents
from ._oom import FractionRejection, out_of_memory_error
from ._source import MemorySource
from ._stats import DeviceStats, Stat, StatArray, StatsMethods

__all__ = ["SlowPath"]


class _PrivatePool:
    """The free lists of one ``MemPool`` on this device, whether its owner still exists, and
    its options (``MemPool(allocator=, use_on_oom=, no_split=)``; device/_pool.py)."""

    __slots__ = ("large", "no_split", "owner_alive", "small", "source", "use_on_oom")

    def __init__(
        self,
        pool_id: PoolId,
        pool_type: type[BlockPool],
        *,
        no_split: bool = False,
        use_on_oom: bool = False,
        source: MemorySource | None = None,
    ) -> None:
        self.small = pool_type(is_small=True, pool_id=pool_id)
        self.large = pool_type(is_small=False, pool_id=pool_id)
        self.owner_alive = True
        self.no_split = no_split  # blocks are handed out whole, never split
        self.use_on_oom = use_on_oom  # free blocks serve default-pool requests that ran out
        self.source = source  # where its segments come from; None: the device's source


class SlowPath(StreamEvents[Block], StatsMethods[DeviceStats], SharedArenas):
    """The second base of ``CachingAllocator`` (device/_core.py), which documents the
    allocator: its state, and every path but the hit path.

    It uses what ``HitPath`` (the first base) defines: the types below, the lock from
    ``_make_lock``, and the methods declared here without a body.
    """

    _USED_BLOCK = "the block at {:#x} (record_stream)"

    # defined by HitPath (device/_hit_path.py, or its compiled twin)
    _BlockPool: type[BlockPool]
    _Stat: type[Stat]
    _StatArray: type[StatArray]
    _ActiveBlocks: type[dict[int, Block]]
    _make_lock: Callable[[], Any]
    free: Callable[[Block], None]
    _get_free_block: Callable[[BlockPool, int, int], Block | None]
    _mark_allocated: Callable[[Block, int], None]

    def __init__(
        self, backend: Backend, device_index: int, config: AllocatorConfig | None = None
    ) -> None:
        self.backend = backend
        self.device_index = device_index
        self.device_name = f"{backend.name}:{device_index}"
        self._source = MemorySource(backend, device_index)
        self._lock = self._make_lock()
        self._small = self._BlockPool(is_small=True)
        self._large = self._BlockPool(is_small=False)
        self._private: dict[PoolId, _PrivatePool] = {}
        self._routes: dict[int, list[PoolId]] = {}  # thread id -> stack of active pool ids
        self._active: dict[int, Block] = self._ActiveBlocks()
        self._segments: dict[int, AnySegment] = {}
        self._events = {}
        self._idle_events = {}
        self._finalized = []
        # blocks freed while a private-pool routing (a capture) was underway, whose events
        # on other streams wait until none is (PyTorch's needs_events_deferred_until_no_capture)
        self._capture_deferred: list[Block] = []
        self._reserved = 0
        self._allowed_max: int | None = None
        self._fraction_from_config: float | None = None
        self.config = AllocatorConfig()
        self._max_split = UNLIMITED
        self._expandable = False
        self.stats = DeviceStats(-1, self._Stat, self._StatArray)
        self._warned_expandable = False
        self._arenas = False  # policy:accelrt in force (section 16)
        self._warned_policy = False
        self._clock = 0
        self._floor_page = 0
        self._floor_peak = 0
        self._reset_arenas()
        self._observer: History | None = None
        protect_sigint()
        self.set_config(config if config is not None else AllocatorConfig())

    # ------------------------------------------------------------------ settings
    @atomic
    def set_config(self, config: AllocatorConfig) -> None:
        """Apply new settings to future requests; cached blocks stay as they are.

        A ``per_process_memory_fraction`` in the config sets the memory fraction when it
        changes. ``expandable_segments`` and ``policy:accelrt`` need a backend with virtual
        memory: on one without, each warns once (naming the reason) and ordinary segments and
        PyTorch's policy are used. ``policy:accelrt`` warns once about the settings it ignores.
        """
        with self._lock:
            self.config = config
            self._arenas = self._use_arenas(config)
            self._floor_page = config.large_segment_size if self._arenas else 0
            max_split = config.max_split_size if config.max_split_size is not None else UNLIMITED
            if self._arenas:
                max_split = UNLIMITED
            if max_split != self._max_split:
                self._max_split = max_split
                self._recount_oversize()
            self.stats.max_split_size = -1 if max_split == UNLIMITED else max_split
            fraction = config.per_process_memory_fraction
            if fraction is not None and fraction != self._fraction_from_config:
                self.set_memory_fraction(fraction)
            self._fraction_from_config = fraction
            self._expandable = self._arenas or (
                config.expandable_segments and self._source.supports_expandable
            )
            wants_expandable = config.expandable_segments and config.policy == "pytorch"
            if wants_expandable and not self._expandable and not self._warned_expandable:
                self._warned_expandable = True
                warn_user(
                    f"{self.device_name}: expandable segments need virtual memory (reserving "
                    f"address space and mapping pages into it), which the {self.backend.name!r} "
                    "backend does not have; using normal segments",
                    RuntimeWarning,
                )

    def _use_arenas(self, config: AllocatorConfig) -> bool:
        """Whether ``config`` puts policy:accelrt in force here; warns once where it cannot be
        (no virtual memory) and once about the settings it ignores."""
        if config.policy != "accelrt":
            return False
        if not self._source.supports_expandable:
            if not self._warned_policy:
                self._warned_policy = True
                warn_user(
                    f"{self.device_name}: policy:accelrt maps pages into reserved address "
                    f"space, which needs virtual memory; the {self.backend.name!r} backend has "
                    "none, so PyTorch's policy (policy:pytorch) is used",
                    RuntimeWarning,
                )
            return False
        default = AllocatorConfig()
        ignored = [
            key
            for key, differs in (
                ("max_split_size_mb", config.max_split_size is not None),
                (
                    "max_non_split_rounding_mb",
                    config.max_non_split_rounding != default.max_non_split_rounding,
                ),
                ("garbage_collection_threshold", config.garbage_collection_threshold > 0),
                ("expandable_segments", config.expandable_segments),
            )
            if differs
        ]
        if ignored and not self._warned_policy:
            self._warned_policy = True
            warn_user(
                f"{self.device_name}: policy:accelrt ignores {', '.join(ignored)} (its arenas "
                "are always expandable and never keep blocks from splitting); memory_stats() "
                "shows max_split_size -1",
                RuntimeWarning,
            )
        return True

    def _recount_oversize(self) -> None:
        """Make the oversize statistics count by the new ``max_split_size`` (no stat drifts)."""
        for stat, count in (
            (
                self.stats.oversize_allocations,
                sum(b.allocated and b.size >= self._max_split for b in self._active.values()),
            ),
            (
                self.stats.oversize_segments,
                sum(
                    not s.is_expandable and s.size >= self._max_split
                    for s in self._segments.values()
                ),
            ),
        ):
            if count > stat.current:
                stat.increase(count - stat.current)
            elif count < stat.current:
                stat.decrease(stat.current - count)

    @property
    def expandable_segments(self) -> bool:
        """Whether new memory comes from expandable segments (setting on and backend able)."""
        return self._expandable

    @atomic
    def set_memory_fraction(self, fraction: float) -> None:
        """Cap reserved memory at ``fraction`` of the device's total memory.

        Raises
        ------
        TypeError
            If ``fraction`` is not a number.
        ValueError
            If ``fraction`` is not in (0, 1].
        """
        if isinstance(fraction, bool) or not isinstance(fraction, (int, float)):
            raise TypeError(f"memory fraction must be a float, got {fraction!r}")
        if not 0.0 < fraction <= 1.0:
            raise ValueError(f"memory fraction must be in (0, 1], got {fraction}")
        _, total = self.backend.mem_get_info(self.device_index)
        with self._lock:
            self._allowed_max = int(fraction * total)

    def _routed_pool(self, size: int) -> BlockPool:
        ids = self._routes.get(threading.get_ident())
        if not ids:
            return self._small if size <= K_SMALL_SIZE else self._large
        private = self._private[ids[-1]]
        return private.small if size <= K_SMALL_SIZE else private.large

    def _malloc_slow(self, pool: BlockPool, size: int, nbytes: int, stream: int) -> Block:
        in_arenas = self._arenas and self._source_of(pool) is self._source
        if in_arenas:
            self._note_request(pool, size, nbytes)
            # above the budget, free neighbours of different owners become one block (a join
            # needs free blocks of two owners: with one, it would walk them for nothing)
            if self._reserved + size > self._budget(size) and len(pool.streams()) > 1:
                self._join_owners(pool)
            adopted = self._adopt(pool, size, stream)
            if adopted is not None:
                return adopted
        if in_arenas:  # what its map needs at most: the request in whole pages
            alloc_size = -(-size // K_SMALL_BUFFER) * K_SMALL_BUFFER
        else:
            alloc_size = segment_size(size, self.config.large_segment_size)
        gc = self.config.garbage_collection_threshold > 0 and not self._arenas
        if self._allowed_max is not None and gc:
            self._garbage_collect()
        try:
            block = self._grow(pool, size, alloc_size, stream, is_retry=False)
            if block is None and self._release_available_cached_blocks(pool, size, stream):
                block = self._grow(pool, size, alloc_size, stream, is_retry=False)
            if block is None:
                self._release_cached_blocks()
                block = self._grow(pool, size, alloc_size, stream, is_retry=True)
        except FractionRejection:  # throw_on_cudamalloc_oom: past the fraction, no retry
            self.stats.num_oom_rejections += 1
            raise self._out_of_memory(nbytes, size, alloc_size, stream) from None
        if block is None and pool.pool_id is DEFAULT_POOL_ID and self._private:
            block = self._borrow_on_oom(size, stream)
        if block is None:
            raise self._out_of_memory(nbytes, size, alloc_size, stream)
        return block

    def _borrow_on_oom(self, size: int, stream: int) -> Block | None:
        """The last resort of a default-pool request: a free block of a ``use_on_oom`` pool.

        Pools are tried in creation order; only their free blocks (no new memory). Mirrors the
        ``use_on_oom_pools`` step of PyTorch's ``DeviceCachingAllocator::malloc``.
        """
        for private in self._private.values():
            if private.use_on_oom and private.owner_alive:
                pool = private.small if size <= K_SMALL_SIZE else private.large
                block = self._get_free_block(pool, size, stream)
                if block is not None:
                    return block
        return None

    def _grow(
        self, pool: BlockPool, size: int, alloc_size: int, stream: int, *, is_retry: bool
    ) -> Block | None:
        """Get fresh memory for a request of ``size`` rounded bytes: step 4 of the ladder."""
        if is_retry:
            self.stats.num_alloc_retries += 1
        own_source = self._source_of(pool) is self._source  # not a MemPool's own allocator
        if self._arenas and own_source:
            return self._grow_arena(pool, size, stream)
        if self._fraction_refuses(alloc_size):
            if self.config.throw_on_cudamalloc_oom:
                raise FractionRejection
            return None
        if self._expandable and own_source:
            return self._grow_expandable(pool, size, stream)
        return self._new_segment(pool, alloc_size, stream)

    def _source_of(self, pool: BlockPool) -> MemorySource:
        """Where the pool's ordinary segments come from: its ``MemPool``'s allocator, if it
        has one, else the device."""
        if pool.pool_id is DEFAULT_POOL_ID:
            return self._source
        private = self._private.get(pool.pool_id)
        return self._source if private is None or private.source is None else private.source

    def _count_device_memory(self, pool: BlockPool, nbytes: int) -> None:
        """Count ``nbytes`` newly held from the device (a segment or mapped pages), or with
        ``nbytes`` < 0 given back: reserved bytes and one device allocation or free."""
        self._reserved += nbytes
        stats = self.stats
        arrays = [stats.reserved_bytes]
        if pool.pool_id is not DEFAULT_POOL_ID:  # a MemPool's: its own reserved_bytes too
            arrays.append(stats.private_pool_reserved(pool.pool_id))
        for array in arrays:
            if nbytes > 0:
                array.increase(pool.is_small, nbytes)
            else:
                array.decrease(pool.is_small, -nbytes)
        if nbytes > 0:
            stats.num_device_alloc += 1
        else:
            stats.num_device_free += 1

    def _fraction_refuses(self, nbytes: int) -> bool:
        """Whether the memory fraction forbids reserving ``nbytes`` more (no device asked)."""
        return self._allowed_max is not None and self._reserved + nbytes > self._allowed_max

    def _new_segment(self, pool: BlockPool, alloc_size: int, stream: int) -> Block | None:
        """An ordinary segment of ``alloc_size`` bytes as one free block; None when full."""
        segment = self._source_of(pool).allocate(alloc_size, stream, pool)
        if segment is None:
            return None
        self._segments[segment.address] = segment
        self._count_device_memory(pool, alloc_size)
        self.stats.segment.increase(pool.is_small, 1)
        if alloc_size >= self._max_split:
            self.stats.oversize_segments.increase(1)
        if self._observer is not None:
            self._observer.record("segment_alloc", segment.address, alloc_size, stream, segment)
        return self._Block(segment.address, alloc_size, stream, pool, segment)

    # ------------------------------------------------------------------ expandable segments
    def _grow_expandable(self, pool: BlockPool, size: int, stream: int) -> Block | None:
        """Map pages until a free run of ``size`` bytes exists; return it out of the pool."""
        candidate = self._find_expandable_block(pool, size, stream)
        if candidate is None:
            return None
        if not candidate.mapped and not self._map_block(candidate, min(candidate.size, size)):
            return None
        while candidate.size < size:
            unmapped = candidate.next
            assert unmapped is not None and not unmapped.mapped  # free runs end unmapped
            if not self._map_block(unmapped, min(size - candidate.size, unmapped.size)):
                return None
            candidate = unmapped  # it absorbed the mapped block before it
        pool.remove(candidate)
        return candidate

    def _find_expandable_block(self, pool: BlockPool, size: int, stream: int) -> Block | None:
        """The lowest-address run of free and unmapped blocks of ``size`` bytes on ``stream``,
        in a new expandable segment if no existing one has room (section 7); None when even a
        new one could not hold ``size`` (its address range is given back at once)."""
        for unmapped in pool.unmapped_blocks(stream):
            start = unmapped
            if unmapped.prev is not None and unmapped.prev.is_free():
                start = unmapped.prev
            room = 0
            walk: Block | None = start
            while room < size and walk is not None and walk.is_free():
                room += walk.size
                walk = walk.next
            if room >= size:
                return start
        segment = self._source.reserve(stream, pool, self._page_size(pool))
        if segment is None:  # no address space left
            return None
        if segment.size < size:  # larger than the device: PyTorch would keep the range
            segment.release()
            return None
        self._segments[segment.address] = segment
        block = self._Block(segment.address, segment.size, stream, pool, segment)
        block.mapped = False
        pool.insert_unmapped(block)
        return block

    def _map_block(
        self, block: Block, nbytes: int, at: int | None = None, owner: int | None = None
    ) -> bool:
        """Map the pages under ``nbytes`` of an unmapped block from ``at`` (a page boundary;
        default its start), owned by ``owner`` (default its stream); False when full. The
        block becomes the mapped part, merged with free neighbours of the same owner."""
        segment = block.segment
        assert isinstance(segment, ExpandableSegment)
        start = block.address if at is None else at
        mapped = segment.map(start, nbytes)
        if not mapped:
            return False
        pool = block.pool
        pool.remove_unmapped(block)
        if start > block.address:  # the pages below stay unmapped
            head = self._Block(block.address, start - block.address, block.stream, pool, segment)
            head.mapped = False
            link_after(block.prev, head, block)
            pool.insert_unmapped(head)
            block.size -= start - block.address
            block.address = start
        block.mapped = True
        if mapped < block.size:
            rest = self._Block(
                block.address + mapped, block.size - mapped, block.stream, pool, segment
            )
            rest.mapped = False
            link_after(block, rest)
            pool.insert_unmapped(rest)
            block.size = mapped
        if owner is not None:
            block.stream = owner
        address = block.address
        self._try_merge(block, block.prev, pool)
        self._try_merge(block, block.next, pool)
        self._clock += 1
        block.stamp = self._clock
        pool.insert(block)
        self._count_device_memory(pool, mapped)
        if self._observer is not None:
            self._observer.record("segment_map", address, mapped, block.stream, segment)
        return True

    def _unmap_block(self, block: Block, lowest: int | None = None) -> None:
        """Unmap the whole pages inside a free mapped block from ``lowest`` (default its
        start) up; partial pages, and the pages below ``lowest``, stay mapped and free."""
        segment = block.segment
        assert isinstance(segment, ExpandableSegment)
        first = block.address if lowest is None else lowest
        start, unmapped = segment.unmap(first, block.address + block.size - first)
        if not unmapped:
            return
        pool = block.pool
        pool.remove(block)
        owner = block.stream
        before = start - block.address
        if before > 0:
            head = self._Block(block.address, before, owner, pool, segment)
            head.stamp = block.stamp
            link_after(block.prev, head, block)
            pool.insert(head)
        after = block.size - before - unmapped
        if after > 0:
            tail = self._Block(start + unmapped, after, owner, pool, segment)
            tail.stamp = block.stamp
            link_after(block, tail)
            pool.insert(tail)
        block.address = start
        block.size = unmapped
        block.mapped = False
        if segment.stream == SHARED_STREAM:  # an arena's unmapped blocks are every stream's
            block.stream = SHARED_STREAM
        self._try_merge(block, block.prev, pool)
        self._try_merge(block, block.next, pool)
        pool.insert_unmapped(block)
        self._count_device_memory(pool, -unmapped)
        if self._observer is not None:
            self._observer.record("segment_unmap", start, unmapped, owner)

    @atomic
    def restore_segment(
        self,
        size: int,
        stream: int,
        blocks: Sequence[tuple[int, int]],
        *,
        is_small: bool | None = None,
        expandable: bool = False,
    ) -> list[Block]:
        """Recreate a segment as a recording had it: for replays that start mid-run.

        Parameters
        ----------
        size : int
            The bytes the blocks cover. An ordinary segment of 2 MiB is a small-pool one.
        stream : int
            The stream handle that owns the segment and all its blocks.
        blocks : sequence of (block_bytes, requested_bytes)
            The blocks in address order; ``requested_bytes`` 0 marks a free block and -1 an
            unmapped stretch of an expandable segment (whole pages).
        is_small : bool, optional
            The pool; default: small for a 2 MiB ordinary segment. Required for expandable.
        expandable : bool
            Recreate part of an expandable segment: a new reserved range (on the simulated
            device, where ``SimBackend.plan_reservations`` put it) whose first ``size`` bytes
            are these blocks, the rest unmapped; the mapped blocks are mapped.

        Returns
        -------
        list of Block
            The allocated blocks, in address order, to be freed later like any others.

        Raises
        ------
        ValueError
            If the block sizes are not positive multiples of 512 summing to ``size``, two
            free or two unmapped blocks are adjacent (the allocator would have merged them),
            unmapped stretches are not whole pages, ``is_small`` is missing for an expandable
            segment, or the backend has no virtual memory for one; nothing changes.
        OutOfMemoryError
            If the device cannot hold the segment.

        Notes
        -----
        The memory counts in the statistics as device allocations (one per ordinary segment
        or mapped range). docs/allocator.md section 13.
        """
        sizes = [b for b, _ in blocks]
        states = [min(r, 1) for _, r in blocks]
        if any(b <= 0 or b % K_MIN_BLOCK_SIZE for b in sizes) or sum(sizes) != size:
            raise ValueError(
                f"blocks {sizes} must be positive multiples of {K_MIN_BLOCK_SIZE} bytes summing "
                f"to the segment's {size} bytes"
            )
        if any(states[i] == states[i + 1] < 1 for i in range(len(states) - 1)):
            raise ValueError("two free or unmapped blocks are adjacent: they would have merged")
        if expandable and (is_small is None or not self._source.supports_expandable):
            raise ValueError(
                "an expandable segment needs is_small and a backend with virtual memory"
            )
        if not expandable and -1 in states:
            raise ValueError("only an expandable segment has unmapped blocks")
        with self._lock:
            if expandable:
                assert is_small is not None
                pool = self._small if is_small else self._large
                return self._restore_expandable(pool, stream, list(blocks))
            if is_small is None:
                is_small = size == K_SMALL_BUFFER
            pool = self._small if is_small else self._large
            first = None if self._fraction_refuses(size) else self._new_segment(pool, size, stream)
            if first is None:
                raise self._out_of_memory(size, size, size, stream)
            chain = self._lay_out(first.segment, first.address, blocks)
            return [block for block in chain if block.allocated]

    def _page_size(self, pool: BlockPool) -> int:
        """The page size of a new expandable segment of ``pool`` under the current settings."""
        return page_size(pool.is_small, self.config.large_segment_size)

    def _restore_expandable(
        self, pool: BlockPool, stream: int, blocks: list[tuple[int, int]]
    ) -> list[Block]:
        segment = self._source.reserve(stream, pool, self._page_size(pool))
        if segment is None:
            raise self._out_of_memory(0, 0, 0, stream)
        span = sum(b for b, _ in blocks)
        offsets = itertools.accumulate((b for b, _ in blocks), initial=0)
        page = segment.page_size
        unaligned = [
            o
            for o, (b, r) in zip(offsets, blocks, strict=False)
            if r < 0 and (o % page or b % page)
        ]
        if span > segment.size or unaligned:
            segment.release()
            raise ValueError(
                f"expandable blocks {[b for b, _ in blocks]} do not fit a {segment.size}-byte "
                f"reserved range in whole {segment.page_size}-byte pages"
            )
        self._segments[segment.address] = segment
        if span < segment.size:
            blocks = [*blocks, (segment.size - span, -1)]
        chain = self._lay_out(segment, segment.address, blocks)
        for run in _mapped_runs(chain):  # whole pages: unmapped stretches are
            nbytes = sum(b.size for b in run)
            if not segment.map(run[0].address, nbytes):
                raise self._out_of_memory(nbytes, nbytes, nbytes, stream)
            self._count_device_memory(pool, nbytes)
        return [block for block in chain if block.allocated]

    def _lay_out(
        self, segment: AnySegment, address: int, blocks: Sequence[tuple[int, int]]
    ) -> list[Block]:
        """Cut a fresh segment into ``blocks`` (state -1: unmapped) and return the chain."""
        pool, stream, stats = segment.pool, segment.stream, self.stats
        chain: list[Block] = []
        for block_bytes, requested in blocks:
            block = self._Block(address, block_bytes, stream, pool, segment)
            if chain:
                block.prev, chain[-1].next = chain[-1], block
            chain.append(block)
            address += block_bytes
            if requested > 0:
                self._mark_allocated(block, requested)
            elif requested < 0:
                block.mapped = False
        for block in chain:
            if not block.mapped:
                pool.insert_unmapped(block)
            elif not block.allocated:
                pool.insert(block)
                if block.is_split() and not segment.is_expandable:
                    stats.inactive_split.increase(pool.is_small, 1)
                    stats.inactive_split_bytes.increase(pool.is_small, block.size)
        return chain

    @atomic
    def free_soon(self, block: Block) -> None:
        """Free ``block`` now, or, when called inside one of this allocator's operations on
        this thread (a finaliser the garbage collector ran there), as that operation ends.

        For finalisers: nothing re-enters an operation half-way. Errors are as :meth:`free`
        (raised later ones are dropped: the block was not allocated then).
        """
        if not self._deferred_inside_operation(self._free_if_allocated, block):
            self.free(block)

    def _free_if_allocated(self, block: Block) -> None:
        if self._active.get(block.address) is block and block.allocated:
            self.free(block)

    @atomic
    def record_stream(self, block: Block, stream: int) -> None:
        """Note that ``block`` is used on ``stream``; its free then waits for that stream.

        Mirrors ``torch.Tensor.record_stream``. Recording the block's own stream does nothing.

        Raises
        ------
        ValueError
            If the block is not currently allocated by this allocator.
        """
        with self._lock:
            if self._active.get(block.address) is not block or not block.allocated:
                raise ValueError(
                    f"{self.device_name}: block at {block.address:#x} is not allocated"
                )
            if stream == block.stream:
                return
            if block.stream_uses is None:
                block.stream_uses = set()
            block.stream_uses.add(stream)

    def _take_stream_uses(self, block: Block) -> list[tuple[int, int]]:
        streams = sorted(block.stream_uses or ())
        block.stream_uses = None
        return [(self.device_index, stream) for stream in streams]

    def _catch_up(self) -> None:
        """``StreamEvents._catch_up``; its event step runs also when only capture-deferred
        frees wait."""
        super()._catch_up()
        if self._capture_deferred and not self._events:
            self._process_events()

    def _insert_events(self, block: Block) -> None:
        """``StreamEvents._insert_events``, deferred while any thread routes allocations to a
        private pool (a graph capture or a ``use_mem_pool`` context): an event recorded on a
        capturing stream joins the graph, and querying it is illegal during capture. The
        block then waits, unusable, until an operation finds no routing (docs/allocator.md
        section 14; PyTorch's ``needs_events_deferred_until_no_capture``)."""
        if self._routes:
            self._capture_deferred.append(block)
        else:
            super()._insert_events(block)

    def _process_events(self) -> None:
        """``StreamEvents._process_events``, skipped while a private-pool routing is underway
        (PyTorch queries no event then); first the events of capture-deferred frees."""
        if self._routes:
            return
        self._insert_capture_deferred()
        super()._process_events()

    def _insert_capture_deferred(self) -> None:
        """Record the events of the frees set aside while a routing was underway."""
        if not self._capture_deferred:  # the usual case: no new list on every event step
            return
        deferred, self._capture_deferred = self._capture_deferred, []
        for block in deferred:
            super()._insert_events(block)

    def _synchronize_and_free_events(self) -> None:
        self.stats.num_sync_all_streams += 1
        if not self._routes:
            self._insert_capture_deferred()
        for queue in self._events.values():
            for event, block, device_index in queue:
                self.backend.event_synchronize(event)
                self._idle_events.setdefault(device_index, []).append(event)
                block.event_count -= 1
                if block.event_count == 0:
                    self._free_block(block)
        self._events.clear()

    def _release_dropped_pool_cache(self, pool_id: PoolId) -> None:
        """After a free into a private pool: release it if its owner is gone. The free itself
        has happened, so a driver error here is a warning (``empty_cache`` retries later)."""
        try:
            self._release_if_abandoned(pool_id)
        except Exception as exc:
            warn_user(
                f"{self.device_name}: releasing the cache of dropped MemPool {pool_id} failed "
                f"({exc}); empty_cache() releases it later",
                RuntimeWarning,
            )

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

    def _out_of_memory(
        self, nbytes: int, size: int, alloc_size: int, stream: int
    ) -> OutOfMemoryError:
        stats = self.stats
        stats.num_ooms += 1
        free, total = self.backend.mem_get_info(self.device_index)
        if self._observer is not None:
            self._observer.record("oom", 0, size, stream, device_free=free)
        return out_of_memory_error(
            self.device_name,
            self.backend.name,
            nbytes,
            alloc_size,
            free,
            total,
            stats.allocated_bytes.all.current,
            stats.reserved_bytes.all.current,
            self._allowed_max,
            self._expandable,
            self._source.supports_expandable,
            self._arenas,
        )

    # ------------------------------------------------------------------ private pools
    @atomic
    def create_pool(
        self,
        pool_id: PoolId,
        *,
        no_split: bool = False,
        use_on_oom: bool = False,
        source: MemorySource | None = None,
    ) -> None:
        """Make the free lists of private pool ``pool_id`` (a ``MemPool``); no-op if they exist.

        ``no_split``: its blocks are never split (a request takes a whole free block or a new
        segment). ``use_on_oom``: its free blocks serve default-pool requests that would
        otherwise raise ``OutOfMemoryError``. ``source``: where its segments come from
        (``MemPool(allocator=...)``); its segments are then never expandable.
        """
        with self._lock:
            if pool_id not in self._private:
                self._private[pool_id] = _PrivatePool(
                    pool_id,
                    self._BlockPool,
                    no_split=no_split,
                    use_on_oom=use_on_oom,
                    source=source,
                )

    def _pool_no_split(self, pool_id: PoolId) -> bool:
        """Whether private pool ``pool_id`` hands its blocks out whole (``no_split``)."""
        private = self._private.get(pool_id)
        return private is not None and private.no_split

    @atomic
    def begin_allocate_to_pool(self, pool_id: PoolId) -> None:
        """Route the calling thread's allocations to private pool ``pool_id`` (nestable)."""
        with self._lock:
            self.create_pool(pool_id)
            self._routes.setdefault(threading.get_ident(), []).append(pool_id)

    @atomic
    def end_allocate_to_pool(self, pool_id: PoolId) -> None:
        """Undo the calling thread's latest :meth:`begin_allocate_to_pool` of ``pool_id``.

        Contexts may end in any order (asyncio tasks interleave so): the pool's latest entry
        is removed wherever it is, and the thread goes on allocating to the latest pool still
        begun, or to the default pool. Mirrors ``endAllocateToPool`` of PyTorch's
        CUDACachingAllocator, which also removes the pool's entry wherever it is.

        Raises
        ------
        ValueError
            If the thread is not allocating to that pool; the routing is unchanged.
        """
        with self._lock:
            ident = threading.get_ident()
            ids = self._routes.get(ident, [])
            if pool_id not in ids:
                raise ValueError(
                    f"{self.device_name}: this thread is not allocating to pool {pool_id}"
                )
            del ids[len(ids) - 1 - ids[::-1].index(pool_id)]
            if not ids:
                del self._routes[ident]

    @atomic
    def release_pool(self, pool_id: PoolId) -> None:
        """The pool's owner is gone: release what it caches now, the rest as its blocks are freed.

        The pool's id is forgotten once it holds no segment. Called by a finaliser, so inside
        an operation of this allocator on this thread it waits for that operation to end, and
        a driver error while releasing is a ``RuntimeWarning`` (``empty_cache`` retries).
        """
        if self._deferred_inside_operation(self.release_pool, pool_id):
            return
        with self._lock:
            private = self._private.get(pool_id)
            if private is not None:
                private.owner_alive = False
                self._release_dropped_pool_cache(pool_id)

    def _release_if_abandoned(self, pool_id: PoolId) -> None:
        private = self._private.get(pool_id)
        if private is None or private.owner_alive:  # None: forgotten as another pool was
            return
        try:
            for pool in (private.large, private.small):  # nothing can allocate from it any more
                self._release_pool_blocks(pool)
                self._release_unused_ranges(pool)
        finally:
            self._forget_dropped_pools()

    def pool_ids(self) -> list[PoolId]:
        """Return the ids of the private pools that still exist on this device."""
        with self._lock:
            return list(self._private)

    # ------------------------------------------------------------------ history, snapshots
    @atomic
    def record_history(
        self,
        enabled: EnabledMode | None,
        context: ContextMode | None,
        max_entries: int,
        skip_actions: frozenset[str] = frozenset(),
        clear_history: bool = False,
        global_annotations: bool = False,
    ) -> None:
        """Start (or, with ``enabled=None``, stop and forget) recording history.

        See ``accelrt.record_memory_history`` for the modes. Starting again keeps the entries
        recorded so far (the newest ``max_entries``) unless ``clear_history``.
        """
        with self._lock:
            if enabled is None:
                self._observer = None
                return
            previous = None if clear_history else self._observer
            self._observer = History(
                enabled, context, max_entries, skip_actions, previous, global_annotations
            )

    @atomic
    def record_annotation(self, name: str, stage: str) -> None:
        """Add one edge of a named stage to the history, if one is recorded (History.annotate)."""
        with self._lock:
            if self._observer is not None:
                self._observer.annotate(name, stage)

    @atomic
    def annotate_block(self, block: Block, metadata: str) -> None:
        """Add an ``annotate`` entry for allocated ``block`` to the history, if one is
        recorded (History.annotate_allocation); ``block`` must be this allocator's."""
        with self._lock:
            if self._observer is not None:
                self._observer.annotate_allocation(
                    block.address, block.size, block.stream, metadata
                )

    def annotations(self) -> list[Annotation]:
        """Return the history's named stages as snapshot ``external_annotations`` entries."""
        with self._lock:
            observer = self._observer
            return [] if observer is None else observer.to_annotations(self.device_index)

    def snapshot(
        self, pool_id: PoolId | None = None, include_traces: bool = True
    ) -> tuple[list[SegmentInfo], list[TraceEntry]]:
        """Return the segments (with blocks) and the history entries, in PyTorch's schema.

        Parameters
        ----------
        pool_id : tuple of (int, int), optional
            Only the segments of this pool ((0, 0): the default pools); all when None.
        include_traces : bool
            False: no history entries (an empty list), without converting the history.

        Notes
        -----
        An expandable segment appears as one segment per contiguous mapped range, with
        ``is_expandable`` True; its unmapped blocks are left out, as PyTorch does.
        """
        with self._lock:
            segments = []
            for segment, blocks in self.segments():
                if pool_id is not None and segment.pool.pool_id != pool_id:
                    continue
                for run in _mapped_runs(blocks):
                    segments.append(self._segment_info(segment, run))
            observer = self._observer if include_traces else None
            return segments, observer.to_entries() if observer is not None else []

    def _segment_info(self, segment: AnySegment, blocks: list[Block]) -> SegmentInfo:
        """One snapshot segment of ``blocks`` (mapped, in address order), in one pass."""
        infos: list[BlockInfo] = []
        total = allocated = active = requested = 0
        shared = segment.stream == SHARED_STREAM  # an arena: say each block's owner
        for b in blocks:
            size = b.size
            total += size
            if b.allocated:
                state, asked = "active_allocated", b.requested_size
                allocated += size
                active += size
            elif b.event_count or b.stream_uses:  # waiting for events, or for a routing's end
                state, asked = "active_pending_free", b.requested_size
                active += size
            else:
                state, asked = "inactive", 0
            requested += asked
            frames = b.frames
            info: BlockInfo = {
                "address": b.address,
                "size": size,
                "requested_size": asked,
                "state": state,
                "frames": frames_to_dicts(frames) if frames else [],
            }
            if shared:
                info["stream"] = b.stream
            infos.append(info)
        return {
            "device": self.device_index,
            "address": blocks[0].address,
            "total_size": total,
            "allocated_size": allocated,
            "active_size": active,
            "requested_size": requested,
            # an arena (policy:accelrt) has blocks of several streams: its lowest block's
            "stream": blocks[0].stream if shared else segment.stream,
            "segment_type": "small" if segment.is_small else "large",
            "segment_pool_id": segment.pool.pool_id,
            "is_expandable": segment.is_expandable,
            "frames": frames_to_dicts(frames) if (frames := segment.frames) else [],
            "blocks": infos,
        }

    # ------------------------------------------------------------------ statistics
    @atomic
    def reset_peak_memory_stats(self) -> None:
        """Set every peak to its current value (mirrors ``torch.cuda.reset_peak_memory_stats``).

        policy:accelrt's budget keeps its own high-water mark of requested bytes first, so a
        reset changes no later decision (docs/allocator.md section 16.1).
        """
        with self._lock:
            self._keep_high_water()
            self.stats.reset_peak()

    @property
    def reserved_bytes(self) -> int:
        """Bytes currently held from the device (ordinary segments and mapped pages)."""
        return self._reserved

    def segments(self) -> list[tuple[AnySegment, list[Block]]]:
        """Return each segment with all its blocks in address order (unmapped ones included).

        For summaries, snapshots and tests; an expandable segment's blocks tile its whole
        reserved range.
        """
        with self._lock:
            out = []
            for segment in sorted(self._segments.values(), key=_ADDRESS):
                blocks: list[Block] = []
                block = self._block_at(segment.address, segment)
                while block is not None:
                    blocks.append(block)
                    block = block.next
                out.append((segment, blocks))
            return out

    def _block_at(self, address: int, segment: AnySegment) -> Block | None:
        block = self._active.get(address)
        if block is None:  # allocated and pending-free blocks are in _active, free ones not
            block = segment.pool.get(address)
        return block


def _collectable(block: Block) -> bool:
    """Whether garbage collection may release a free block: a whole ordinary segment."""
    return not block.is_split() and not block.segment.is_expandable


_ADDRESS = operator.attrgetter("address")


def _mapped_runs(blocks: list[Block]) -> list[list[Block]]:
    """Split a segment's blocks into runs of mapped blocks (one per snapshot segment)."""
    runs: list[list[Block]] = []
    current: list[Block] = []
    for block in blocks:
        if block.mapped:
            current.append(block)
        elif current:
            runs.append(current)
            current = []
    if current:
        runs.append(current)
    return runs
