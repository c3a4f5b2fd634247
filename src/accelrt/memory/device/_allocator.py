"""``SlowPath``: the caching allocator's every path but its hit path, on both cores.

``CachingAllocator`` (device/_core.py) is ``HitPath`` in front of ``SlowPath``: ``HitPath``
(device/_hit_path.py, or its compiled twin device/_native.pyx) serves ``malloc`` and ``free``
from the free lists; this class holds the state and runs everything else on the blocks and
pools whichever ``HitPath`` runs has built: settings, new segments and pages, the OOM ladder
and events here, private pools (device/_private_pools.py), releasing (device/_release.py),
snapshots, history and restored segments (device/_recordings.py) and policy:accelrt's misses
(device/_arenas.py) in its bases. It has no compiled twin.

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

from collections.abc import Callable
from typing import Any

from ..._errors import OutOfMemoryError
from ..._warn import warn_user
from ...backends._base import Backend
from .._atomic import atomic, protect_sigint
from .._config import AllocatorConfig
from .._policy import (
    K_SMALL_BUFFER,
    UNLIMITED,
    segment_size,
)
from ..history._history import (
    History,
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
    link_after,
)
from ._events import StreamEvents
from ._oom import FractionRejection, out_of_memory_error
from ._private_pools import PrivatePool, PrivatePools
from ._recordings import Recordings
from ._release import Releasing
from ._source import MemorySource
from ._stats import DeviceStats, Stat, StatArray, StatsMethods

__all__ = ["SlowPath"]


class SlowPath(
    PrivatePools,
    Releasing,
    Recordings,
    StreamEvents[Block],
    StatsMethods[DeviceStats],
    SharedArenas,
):
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
        self._private: dict[PoolId, PrivatePool] = {}
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
