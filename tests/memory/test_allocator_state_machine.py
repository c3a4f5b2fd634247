"""Stateful property test: one ``CachingAllocator`` under random sequences of operations.

A hypothesis ``RuleBasedStateMachine`` drives one allocator on a small simulated device through
mallocs of every size class on three streams (some bigger than the device, many that run it out
of memory), frees, ``record_stream``, ``empty_cache``, settings changed at run time (expandable
segments on and off, ``max_split_size_mb``, ``roundup_power2_divisions``, garbage collection, a
memory fraction) and three private pools that are entered, left and released (the second never
splits a block, ``MemPool(no_split=True)``; the third lends its free blocks to default-pool
requests that ran out, ``MemPool(use_on_oom=True)``). After every step
the invariants recompute the allocator's books from its blocks (docs/allocator.md sections 1-8
and 14) and compare them with its statistics, its snapshot, a model of the live blocks kept
here and the simulated device's own accounting.
"""

from __future__ import annotations

import functools
import itertools
import warnings
from collections import Counter
from collections.abc import Callable
from typing import Any, TypeVar

import pytest
from hypothesis import currently_in_test_context, event, given, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
)

from accelrt import OutOfMemoryError
from accelrt.backends.sim import VM_GRANULARITY, SimBackend
from accelrt.memory import AllocatorConfig, Block, CachingAllocator, round_size, segment_size

MiB = 1 << 20
SHARED_STREAM = -1  # the stream of a policy:accelrt arena and of its unmapped blocks: every one's
PoolId = tuple[int, int]
DEFAULT_POOL: PoolId = (0, 0)
PRIVATE_POOLS: tuple[PoolId, ...] = ((0, 1), (0, 2), (0, 3))
NO_SPLIT: PoolId = (0, 2)  # MemPool(no_split=True)
LENDER: PoolId = (0, 3)  # MemPool(use_on_oom=True)
CAPACITIES = (64 * MiB, 256 * MiB, 1024 * MiB)
MAX_SPLIT_MB = (None, 20, 32, 64)
FRACTIONS = (0.25, 0.5, 0.75, 1.0)
GC_THRESHOLDS = (0.0, 0.5, 0.8)
MAX_NON_SPLIT_ROUNDING = 20 * MiB  # the default of max_non_split_rounding_mb
SMALL_PAGE, LARGE_PAGE = 2 * MiB, 20 * MiB
HISTORY_ENTRIES = 1 << 20
MAX_REQUEST = 1 << 60
STAT_ARRAYS = (  # memory_stats()' StatArrays, as in c10::CachingDeviceAllocator::DeviceStats
    "allocation",
    "segment",
    "active",
    "inactive_split",
    "allocated_bytes",
    "reserved_bytes",
    "active_bytes",
    "inactive_split_bytes",
    "requested_bytes",
)
SIZES = st.one_of(st.integers(1, 4096), st.integers(1, 2 * MiB), st.integers(MiB, 64 * MiB))
STREAM_INDEX = st.integers(0, 2)
PICK = st.integers(0, 1 << 16)  # index of a live block, modulo their number

F = TypeVar("F", bound=Callable[..., None])


class Live:
    """The model of one block handed out by the allocator."""

    __slots__ = ("block", "nbytes", "pool_id", "uses")

    def __init__(self, block: Block, nbytes: int, pool_id: PoolId) -> None:
        self.block = block
        self.nbytes = nbytes
        self.pool_id = pool_id
        self.uses: set[int] = set()  # streams named by record_stream, other than its own


def note(what: str) -> None:
    """Count ``what`` in hypothesis' statistics (``--hypothesis-show-statistics``)."""
    if currently_in_test_context():
        event(what)


def is_free(block: Block) -> bool:
    """Neither allocated nor waiting for events (nor set aside until a pool routing ends: it
    keeps its stream uses): a block the allocator may merge."""
    return not block.allocated and block.event_count == 0 and not block.stream_uses


def page_of(is_small: bool) -> int:
    return SMALL_PAGE if is_small else LARGE_PAGE


def round_up(value: int, step: int) -> int:
    return -(-value // step) * step


class World:
    """One allocator on one simulated device, and the model the checks compare it with."""

    def __init__(
        self,
        capacity: int,
        *,
        expandable: bool = False,
        max_split_mb: int | None = None,
        roundup: bool = False,
        gc_threshold: float = 0.0,
        arenas: bool = False,
    ) -> None:
        self.capacity = capacity
        self.backend = SimBackend(device_count=1, capacity=capacity)
        self.streams = [0, self.backend.stream_create(0, 0), self.backend.stream_create(0, 0)]
        self.expandable = expandable
        self.max_split_mb = max_split_mb
        self.roundup = roundup
        self.gc_threshold = gc_threshold
        self.arenas = arenas  # policy:accelrt (docs/allocator.md section 16)
        self.throw_on_oom = False  # throw_on_cudamalloc_oom (docs/allocator.md section 6)
        with warnings.catch_warnings():  # the settings policy:accelrt ignores, said once
            warnings.simplefilter("ignore", RuntimeWarning)
            self.alloc = CachingAllocator(self.backend, 0, self.config())
        self.alloc.record_history("all", None, HISTORY_ENTRIES)
        self.live: list[Live] = []
        self.pending: list[Live] = []  # freed after record_stream: waiting for events
        # freed after record_stream while a pool routing (a capture) was underway: no event yet
        self.deferred: list[Live] = []
        self.stale: list[Block] = []  # blocks given back, for double-free attempts
        self.route: list[PoolId] = []  # this thread's begin_allocate_to_pool stack
        self.created: set[PoolId] = set()
        self.released: set[PoolId] = set()
        self.alloc.create_pool(NO_SPLIT, no_split=True)
        self.alloc.create_pool(LENDER, use_on_oom=True)
        self.created |= {NO_SPLIT, LENDER}
        self.allowed: int | None = None  # fraction x capacity, once a fraction is set

    # ------------------------------------------------------------------ settings
    def config(self) -> AllocatorConfig:
        """A fresh config with the model's settings (unset keys take their defaults)."""
        parts = []
        if self.expandable:
            parts.append("expandable_segments:True")
        if self.max_split_mb is not None:
            parts.append(f"max_split_size_mb:{self.max_split_mb}")
        if self.roundup:
            parts.append("roundup_power2_divisions:4")
        if self.gc_threshold:
            parts.append(f"garbage_collection_threshold:{self.gc_threshold}")
        if self.arenas:
            parts.append("policy:accelrt")
        if self.throw_on_oom:
            parts.append("throw_on_cudamalloc_oom:True")
        return AllocatorConfig.parse(",".join(parts))

    @property
    def pages(self) -> bool:
        """Whether new memory comes as pages: expandable segments or policy:accelrt's arenas."""
        return self.expandable or self.arenas

    def apply_config(self) -> None:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            self.alloc.set_config(self.config())
        assert self.alloc.expandable_segments is self.pages
        unlimited = self.max_split_mb is None or self.arenas
        expected = -1 if unlimited else self.max_split_mb * MiB
        assert self.alloc.memory_stats()["max_split_size"] == expected

    def set_fraction(self, fraction: float) -> None:
        self.alloc.set_memory_fraction(fraction)
        self.allowed = int(fraction * self.capacity)

    # ------------------------------------------------------------------ operations
    def target_pool(self) -> PoolId:
        return self.route[-1] if self.route else DEFAULT_POOL

    def malloc(self, nbytes: int, stream_index: int) -> Block | None:
        """Allocate through the allocator and the model; None on out of memory."""
        alloc = self.alloc
        stream = self.streams[stream_index]
        rounded = round_size(nbytes, alloc.config)
        before = alloc.memory_stats()
        try:
            block = alloc.malloc(nbytes, stream)
        except OutOfMemoryError as error:
            note("malloc: out of memory" + (" (expandable)" if self.expandable else ""))
            if self.pending:
                note("malloc: OOM with frees pending")
            synced = alloc.memory_stats()["num_sync_all_streams"] > before["num_sync_all_streams"]
            if synced or not self.route:  # processed first, or the ladder waited for each
                self.pending.clear()
            if not self.route:  # the set-aside ones' events recorded first
                self.deferred.clear()
            self.check_out_of_memory(error, nbytes, rounded, before)
            return None
        if self.route:  # no event is queried while a pool routing (a capture) is underway
            if alloc.memory_stats()["num_sync_all_streams"] > before["num_sync_all_streams"]:
                self.pending.clear()  # but the ladder's last step waited for every event
            elif self.pending:
                note("malloc: pending frees wait for the routing to end")
        else:
            if self.pending or self.deferred:
                note("malloc: completed pending frees")
            self.pending.clear()  # events are complete at once on sim: processed at malloc
            self.deferred.clear()  # recorded first, then processed
        after = alloc.memory_stats()
        assert isinstance(block, Block)
        assert block.allocated and block.event_count == 0 and not block.stream_uses
        assert block.requested_size == nbytes and block.stream == stream
        pool_id = block.pool.pool_id
        if pool_id != self.target_pool():  # lent on OOM: the ladder found nothing else
            assert self.target_pool() == DEFAULT_POOL and pool_id == LENDER, "only LENDER lends"
            assert LENDER not in self.released, "a released pool lent a block"
            assert after["num_ooms"] == before["num_ooms"]
            note("malloc: lent by a use_on_oom pool")
        assert block.pool.is_small == (rounded <= MiB)
        assert block.size >= rounded and block.size % 512 == 0
        if pool_id == NO_SPLIT:  # a whole free block, or a whole new segment or mapped run
            note("malloc: a whole block of a no_split pool")
        elif self.pages or block.pool.is_small:
            assert block.size == rounded, "any rest of 512 bytes or more is split off"
        elif self.max_split_mb is None or rounded < self.max_split_mb * MiB:
            assert block.size <= rounded + MiB, "a large rest of more than 1 MiB is split off"
        else:
            assert block.size < rounded + MAX_NON_SPLIT_ROUNDING
        if not self.pages:
            assert not block.segment.is_expandable, "blocks of expandable segments are skipped"
            new_segment = after["num_device_alloc"] > before["num_device_alloc"]
            if new_segment and self.allowed is not None:
                assert alloc.reserved_bytes <= self.allowed, "a new segment broke the fraction"
        assert all(block is not other.block for other in self.live)
        grew = after["num_device_alloc"] - before["num_device_alloc"]
        released = after["num_device_free"] - before["num_device_free"]
        if block.segment.is_expandable:
            note("malloc: block of an expandable segment" + (" (new pages)" if grew else ""))
        if released:
            note("malloc: released cached memory and succeeded")
        if self.route:
            note("malloc: into a private pool")
        self.live.append(Live(block, nbytes, pool_id))
        return block

    def check_out_of_memory(
        self, error: OutOfMemoryError, nbytes: int, rounded: int, before: dict[str, int]
    ) -> None:
        """An OOM is legitimate and leaves the books as they were (but the cache released)."""
        alloc = self.alloc
        stats = alloc.memory_stats()
        assert isinstance(error, MemoryError)
        assert stats["num_ooms"] == before["num_ooms"] + 1
        rejected = stats["num_oom_rejections"] - before["num_oom_rejections"]
        assert rejected in (0, 1) and (not rejected or self.throw_on_oom)
        if rejected:  # refused past the fraction at once: the ladder's retry never ran
            note("malloc: rejected past the fraction (throw_on_cudamalloc_oom)")
            assert self.allowed is not None
            assert stats["num_alloc_retries"] == before["num_alloc_retries"]
        assert error.requested_bytes == nbytes
        alloc_size = round_up(rounded, SMALL_PAGE) if self.arenas else segment_size(rounded)
        assert error.allocation_bytes == alloc_size
        for key in ("allocation", "allocated_bytes"):
            for kind in ("all", "small_pool", "large_pool"):
                name = f"{key}.{kind}.current"
                assert stats[name] == before[name], name
        free, total = self.backend.mem_get_info(0)
        assert total == self.capacity
        refused = self.allowed is not None and alloc.reserved_bytes + alloc_size > self.allowed
        if self.arenas:  # the map that failed needed at most the request in 2 MiB pages
            pages = round_up(rounded, SMALL_PAGE)
            refused = self.allowed is not None and alloc.reserved_bytes + pages > self.allowed
            assert refused or free < pages
        elif self.expandable:  # the map that failed needed at most the request in whole pages
            assert refused or free < round_up(rounded, page_of(rounded <= MiB))
        else:
            assert refused or free < alloc_size, "out of memory with room for the segment"
        if not rejected:  # step 6 waited for all events and released every whole free segment
            self.check_cache_released(unmapped_too=not self.pages)

    def free(self, pick: int) -> None:
        record = self.live.pop(pick % len(self.live))
        block = record.block
        assert set(block.stream_uses or ()) == record.uses
        self.alloc.free(block)
        assert not block.allocated
        if record.uses and self.route:  # set aside until no routing is underway
            note("free: set aside while a pool routing is underway")
            assert block.event_count == 0 and set(block.stream_uses or ()) == record.uses
            self.deferred.append(record)
            return
        assert not block.stream_uses
        if record.uses:
            assert block.event_count == len(record.uses), "one event per stream used"
            self.pending.append(record)
        else:
            assert block.event_count == 0
        self.stale = [*self.stale[-7:], block]

    def record_stream(self, pick: int, stream_index: int) -> None:
        record = self.live[pick % len(self.live)]
        stream = self.streams[stream_index]
        self.alloc.record_stream(record.block, stream)
        if stream != record.block.stream:
            record.uses.add(stream)

    def empty_cache(self) -> None:
        syncs = self.alloc.memory_stats()["num_sync_all_streams"]
        self.alloc.empty_cache()
        self.pending.clear()
        if not self.route:
            self.deferred.clear()
        assert self.alloc.memory_stats()["num_sync_all_streams"] == syncs + 1
        self.check_cache_released(unmapped_too=True)

    def release_pool(self, pool_id: PoolId) -> None:
        assert pool_id not in self.route
        if any(r.pool_id == pool_id for r in self.live + self.pending + self.deferred):
            note("release_pool: while blocks are active")
        self.alloc.release_pool(pool_id)
        self.released.add(pool_id)
        self.check_released_pools()

    def free_everything(self) -> None:
        """Free every block, leave every pool, empty the cache and release every pool."""
        while self.live:
            self.free(0)
        while self.route:
            self.alloc.end_allocate_to_pool(self.route.pop())
        self.empty_cache()
        for pool_id in PRIVATE_POOLS:
            if pool_id not in self.released:
                self.release_pool(pool_id)

    # ------------------------------------------------------------------ checks
    def check_all(self) -> None:
        self.check_tiling()
        self.check_mapping()
        self.check_pools()
        self.check_model()
        self.check_stats()
        self.check_snapshot()
        self.check_device()
        self.check_released_pools()

    def check_tiling(self) -> None:
        """1. Blocks tile their segments; links, segment, pool and stream agree."""
        end = 0
        for segment, blocks in self.alloc.segments():
            assert segment.address >= end, "segments overlap"
            assert segment.size > 0 and blocks, segment
            assert blocks[0].prev is None and blocks[-1].next is None
            address = segment.address
            for i, block in enumerate(blocks):
                assert block.address == address, f"gap or overlap at {block!r} in {segment!r}"
                assert block.size > 0 and block.size % 512 == 0, block
                assert block.segment is segment, block
                assert block.pool is segment.pool, block
                if segment.stream == SHARED_STREAM:  # an arena: owners, unmapped is everyone's
                    assert (block.stream == SHARED_STREAM) is not block.mapped, block
                    assert block.stream == SHARED_STREAM or block.stream in self.streams, block
                else:
                    assert block.stream == segment.stream, block
                if i:
                    assert block.prev is blocks[i - 1] and blocks[i - 1].next is block
                address += block.size
            assert address == segment.address + segment.size, f"blocks do not fill {segment!r}"
            end = address

    def check_mapping(self) -> None:
        """2. Mapped pages cover exactly the blocks that need them; free neighbours merged."""
        for segment, blocks in self.alloc.segments():
            for block in blocks:
                if not block.allocated and block.stream_uses:  # only a set-aside block
                    assert any(r.block is block for r in self.deferred), f"stray uses: {block!r}"
                if not is_free(block):
                    assert block.mapped, f"an active block is unmapped: {block!r}"
            for left, right in itertools.pairwise(blocks):
                assert left.mapped or right.mapped, f"adjacent unmapped: {left!r}, {right!r}"
                both_free = is_free(left) and is_free(right) and left.mapped and right.mapped
                mergeable = both_free and left.stream == right.stream  # arenas: same owner
                assert not mergeable, f"adjacent free blocks not merged: {left!r}, {right!r}"
            if not segment.is_expandable:
                assert all(block.mapped for block in blocks), segment
                continue
            page = segment.page_size
            arena = segment.stream == SHARED_STREAM
            assert page == (SMALL_PAGE if arena else page_of(segment.pool.is_small))
            assert segment.size % page == 0 and segment.address % VM_GRANULARITY == 0
            mapped = 0
            for block in blocks:
                if block.mapped:
                    mapped += block.size
                else:
                    offset = block.address - segment.address
                    assert offset % page == 0 and block.size % page == 0, block
            assert mapped == segment.mapped_bytes, segment
            assert 0 <= mapped <= segment.size

    def check_pools(self) -> None:
        """3. Every block is in its own pool only, and pool ids are the ones that exist."""
        alloc = self.alloc
        pool_ids = set(alloc.pool_ids())
        assert pool_ids <= set(PRIVATE_POOLS)
        assert pool_ids >= self.created - self.released, "a pool disappeared while owned"
        pools = alloc._all_pools()  # every BlockPool, also of pools that hold no segment
        free_mapped: Counter[int] = Counter()
        unmapped: Counter[int] = Counter()
        by_stream: dict[tuple[int, int], list[Block]] = {}
        for segment, blocks in alloc.segments():
            pool = segment.pool
            assert any(pool is p for p in pools), f"{segment!r} has a pool the allocator lost"
            assert pool.pool_id == DEFAULT_POOL or pool.pool_id in pool_ids, segment
            for block in blocks:
                if not is_free(block):
                    assert pool.get(block.address) is None, f"active block in pool: {block!r}"
                    continue
                assert pool.get(block.address) is block, f"free block not in pool: {block!r}"
                if block.mapped:
                    free_mapped[id(pool)] += 1
                    by_stream.setdefault((id(pool), block.stream), []).append(block)
                else:
                    unmapped[id(pool)] += 1
        for pool in pools:
            assert len(pool) == free_mapped[id(pool)], f"stale free blocks in {pool.pool_id}"
            assert pool.unmapped_count() == unmapped[id(pool)], "stale unmapped blocks"
            for stream in self.streams:
                expected = sorted(
                    by_stream.get((id(pool), stream), []), key=lambda b: (b.size, b.address)
                )
                listed = pool.stream_blocks(stream)
                assert len(listed) == len(expected), "pool lists the wrong blocks"
                assert all(a is b for a, b in zip(listed, expected, strict=True)), "stale order"

    def check_model(self) -> None:
        """The allocated and pending blocks are exactly the model's, in the model's pools."""
        allocated: dict[int, Block] = {}
        pending: dict[int, Block] = {}
        deferred: dict[int, Block] = {}
        for _, blocks in self.alloc.segments():
            for block in blocks:
                if block.allocated:
                    allocated[id(block)] = block
                elif block.event_count:
                    pending[id(block)] = block
                elif block.stream_uses:
                    deferred[id(block)] = block
        assert set(allocated) == {id(r.block) for r in self.live}, "live blocks differ"
        assert set(pending) == {id(r.block) for r in self.pending}, "pending blocks differ"
        assert set(deferred) == {id(r.block) for r in self.deferred}, "set-aside blocks differ"
        for record in self.live:
            block = record.block
            assert block.requested_size == record.nbytes
            assert block.pool.pool_id == record.pool_id, "a block changed pools"
            assert set(block.stream_uses or ()) == record.uses
        for record in self.pending:
            assert record.block.event_count == len(record.uses)
            assert record.block.pool.pool_id == record.pool_id

    def check_stats(self) -> None:
        """4. Every memory_stats() value equals a recomputation from the blocks and model."""
        alloc = self.alloc
        stats = alloc.memory_stats()
        expected = {name: [0, 0] for name in STAT_ARRAYS}  # [small_pool, large_pool]
        by_pool: dict[PoolId, list[int]] = {}  # reserved_bytes_by_private_pools

        def add(name: str, is_small: bool, amount: int) -> None:
            expected[name][0 if is_small else 1] += amount

        for segment, blocks in alloc.segments():
            small = segment.pool.is_small
            held = segment.mapped_bytes if segment.is_expandable else segment.size
            if segment.pool.pool_id != DEFAULT_POOL and held:
                by_pool.setdefault(segment.pool.pool_id, [0, 0])[0 if small else 1] += held
            if segment.is_expandable:
                add("reserved_bytes", small, held)
                continue
            add("reserved_bytes", small, held)
            add("segment", small, 1)
            if len(blocks) > 1:
                for block in blocks:
                    if is_free(block):
                        add("inactive_split", small, 1)
                        add("inactive_split_bytes", small, block.size)
        for record in self.live:
            small = record.block.pool.is_small
            add("allocation", small, 1)
            add("allocated_bytes", small, record.block.size)
        for record in self.live + self.pending + self.deferred:
            small = record.block.pool.is_small
            add("active", small, 1)
            add("active_bytes", small, record.block.size)
            add("requested_bytes", small, record.nbytes)
        for name in STAT_ARRAYS:
            small, large = expected[name]
            assert stats[f"{name}.small_pool.current"] == small, f"{name}.small_pool"
            assert stats[f"{name}.large_pool.current"] == large, f"{name}.large_pool"
            assert stats[f"{name}.all.current"] == small + large, f"{name}.all"
            for kind in ("all", "small_pool", "large_pool"):
                key = f"{name}.{kind}"
                current = stats[f"{key}.current"]
                assert stats[f"{key}.allocated"] - stats[f"{key}.freed"] == current, key
                assert stats[f"{key}.peak"] >= current >= 0, key
        for name in ("oversize_allocations", "oversize_segments"):
            assert stats[f"{name}.allocated"] - stats[f"{name}.freed"] == stats[f"{name}.current"]
        prefix = "reserved_bytes_by_private_pools."
        seen = {key[len(prefix) :].split(".")[0] for key in stats if key.startswith(prefix)}
        for first, second in by_pool:
            assert f"{first}_{second}" in seen, "a private pool holding memory has its stats"
        for name in seen:
            first, second = (int(part) for part in name.split("_"))
            small, large = by_pool.get((first, second), [0, 0])
            key = f"{prefix}{name}"
            assert stats[f"{key}.small_pool.current"] == small, key
            assert stats[f"{key}.large_pool.current"] == large, key
            assert stats[f"{key}.all.current"] == small + large, key
        # counted by the max_split_size in force now (a change recounts them)
        unlimited = self.max_split_mb is None or self.arenas
        limit = MAX_REQUEST if unlimited else self.max_split_mb * MiB
        oversize = sum(r.block.size >= limit for r in self.live)
        assert stats["oversize_allocations.current"] == oversize, "oversize_allocations"
        oversize = sum(not s.is_expandable and s.size >= limit for s, _ in alloc.segments())
        assert stats["oversize_segments.current"] == oversize, "oversize_segments"
        free, total = self.backend.mem_get_info(0)
        reserved = stats["reserved_bytes.all.current"]
        assert reserved == alloc.reserved_bytes == total - free, "reserved != device held"

    def check_snapshot(self) -> None:
        """The snapshot (mapped runs only) adds up to the same figures."""
        stats = self.alloc.memory_stats()
        segments, _ = self.alloc.snapshot()
        sums = Counter[str]()
        for info in segments:
            assert info["segment_pool_id"] == DEFAULT_POOL or info["segment_pool_id"] in set(
                self.alloc.pool_ids()
            )
            address = info["address"]
            for block in info["blocks"]:
                assert block["address"] == address
                address += block["size"]
            assert address == info["address"] + info["total_size"]
            for key in ("total_size", "allocated_size", "active_size", "requested_size"):
                sums[key] += info[key]
        assert sums["total_size"] == stats["reserved_bytes.all.current"]
        assert sums["allocated_size"] == stats["allocated_bytes.all.current"]
        assert sums["active_size"] == stats["active_bytes.all.current"]
        assert sums["requested_size"] == stats["requested_bytes.all.current"]

    def check_device(self) -> None:
        """The simulated device holds exactly the segments and pages the allocator says."""
        device = self.backend._devices[0]
        ordinary = {a: s for a, s in device.sizes.items() if a not in device.reservations}
        mine: dict[int, int] = {}
        reservations: dict[int, list[tuple[int, int]]] = {}
        for segment, blocks in self.alloc.segments():
            if not segment.is_expandable:
                mine[segment.address] = segment.size
                continue
            assert device.reservations[segment.address].size == segment.size
            pages: list[tuple[int, int]] = []  # coalesced [first, last) 2 MiB device pages
            for block in blocks:
                if not block.mapped:
                    continue
                first = (block.address - segment.address) // VM_GRANULARITY
                last = round_up(block.address + block.size - segment.address, VM_GRANULARITY)
                last //= VM_GRANULARITY
                if pages and pages[-1][1] >= first:
                    pages[-1] = (pages[-1][0], max(pages[-1][1], last))
                else:
                    pages.append((first, last))
            reservations[segment.address] = pages
        assert ordinary == mine, "the device's allocations differ from the ordinary segments"
        assert set(device.reservations) == set(reservations), "reserved ranges differ"
        for address, pages in reservations.items():
            assert device.reservations[address].intervals == pages, "mapped pages differ"

    def check_released_pools(self) -> None:
        """A released pool caches nothing: what it cached went at once, each block goes as it
        is freed; once it holds no segment its id is forgotten (docs/allocator.md section 14).
        """
        pool_ids = set(self.alloc.pool_ids())
        segments = self.alloc.segments()
        for pool_id in self.released:
            own = [(s, blocks) for s, blocks in segments if s.pool.pool_id == pool_id]
            self.check_nothing_cached(own, unmapped_too=True)
            assert (pool_id in pool_ids) == bool(own), f"pool {pool_id} not forgotten"
            if not any(r.pool_id == pool_id for r in self.live + self.pending + self.deferred):
                assert not own, f"released pool {pool_id} keeps {own}"
                note("released pool: gone")

    def check_cache_released(self, *, unmapped_too: bool) -> None:
        """After empty_cache (and the OOM ladder's release): nothing pending and nothing
        cached that could be given back."""
        assert not self.pending
        segments = self.alloc.segments()
        for _, blocks in segments:
            assert all(block.event_count == 0 for block in blocks), "an event was not waited"
        self.check_nothing_cached(segments, unmapped_too=unmapped_too)

    @staticmethod
    def check_nothing_cached(
        segments: list[tuple[Any, list[Block]]], *, unmapped_too: bool
    ) -> None:
        """No whole free ordinary segment, and (unmapped_too) no whole free page mapped."""
        for segment, blocks in segments:
            if not segment.is_expandable:
                assert len(blocks) > 1 or not is_free(blocks[0]), f"{segment!r} kept cached"
            elif unmapped_too:
                page = segment.page_size
                for block in blocks:
                    if block.mapped and is_free(block):
                        first = round_up(block.address - segment.address, page)
                        last = (block.address + block.size - segment.address) // page * page
                        assert first >= last, f"a whole free page stays mapped in {block!r}"

    def check_history(self) -> None:
        """The device counters match the history, whose byte counts add up to reserved."""
        stats = self.alloc.memory_stats()
        _, entries = self.alloc.snapshot()
        count: Counter[str] = Counter()
        nbytes: Counter[str] = Counter()
        for entry in entries:
            count[entry["action"]] += 1
            nbytes[entry["action"]] += entry["size"]
            if entry["action"] in ("segment_map", "segment_unmap"):
                assert entry["addr"] % VM_GRANULARITY == 0 and entry["size"] % SMALL_PAGE == 0
        assert stats["num_device_alloc"] == count["segment_alloc"] + count["segment_map"]
        assert stats["num_device_free"] == count["segment_free"] + count["segment_unmap"]
        assert stats["num_ooms"] == count["oom"]
        assert count["segment_alloc"] - count["segment_free"] == stats["segment.all.current"]
        held = nbytes["segment_alloc"] - nbytes["segment_free"]
        held += nbytes["segment_map"] - nbytes["segment_unmap"]
        assert held == self.alloc.reserved_bytes

    def check_empty(self) -> None:
        """After free_everything: nothing held, no segment or address range left."""
        self.check_all()
        self.check_history()
        stats = self.alloc.memory_stats()
        assert self.alloc.reserved_bytes == 0 == stats["reserved_bytes.all.current"]
        assert self.backend.mem_get_info(0) == (self.capacity, self.capacity)
        for name in STAT_ARRAYS:
            assert stats[f"{name}.all.current"] == 0, name
        assert self.alloc.segments() == []  # no address range is kept either


def guarded(method: F) -> F:
    """Mark the machine broken while a step or invariant runs, so that teardown does not hide
    the first failure behind a second one."""

    @functools.wraps(method)
    def wrapper(self: AllocatorMachine, *args: Any, **kwargs: Any) -> None:
        self.broken = True
        method(self, *args, **kwargs)
        self.broken = False

    return wrapper  # type: ignore[return-value]


class AllocatorMachine(RuleBasedStateMachine):
    """Random operations on one allocator; the books are checked after every step."""

    def __init__(self) -> None:
        super().__init__()
        self.world: World | None = None
        self.broken = False

    @property
    def w(self) -> World:
        assert self.world is not None
        return self.world

    @initialize(
        capacity=st.sampled_from(CAPACITIES),
        expandable=st.booleans(),
        max_split_mb=st.sampled_from(MAX_SPLIT_MB),
        fraction=st.one_of(st.none(), st.sampled_from(FRACTIONS)),
        arenas=st.booleans(),
    )
    @guarded
    def start(
        self,
        capacity: int,
        expandable: bool,
        max_split_mb: int | None,
        fraction: float | None,
        arenas: bool,
    ) -> None:
        self.world = World(
            capacity, expandable=expandable, max_split_mb=max_split_mb, arenas=arenas
        )
        if fraction is not None:
            self.world.set_fraction(fraction)

    # ------------------------------------------------------------------ allocation
    @rule(nbytes=SIZES, stream=STREAM_INDEX)
    @guarded
    def malloc(self, nbytes: int, stream: int) -> None:
        self.w.malloc(nbytes, stream)

    @rule(nbytes=st.integers(1, 4096), stream=STREAM_INDEX)
    @guarded
    def malloc_small(self, nbytes: int, stream: int) -> None:
        self.w.malloc(nbytes, stream)

    @rule(nbytes=st.integers(MiB, 64 * MiB), stream=STREAM_INDEX)
    @guarded
    def malloc_large(self, nbytes: int, stream: int) -> None:
        self.w.malloc(nbytes, stream)

    @rule(pool_id=st.sampled_from(PRIVATE_POOLS), nbytes=SIZES, stream=STREAM_INDEX)
    @guarded
    def malloc_in_pool(self, pool_id: PoolId, nbytes: int, stream: int) -> None:
        """``with use_mem_pool(pool): empty(nbytes)``, on top of the pools already entered."""
        w = self.w
        if pool_id in w.released:
            return
        w.alloc.begin_allocate_to_pool(pool_id)
        w.route.append(pool_id)
        w.created.add(pool_id)
        try:
            w.malloc(nbytes, stream)
        finally:
            w.alloc.end_allocate_to_pool(w.route.pop())

    @rule(times=st.integers(1, 3), extra=st.integers(1, 64 * MiB), stream=STREAM_INDEX)
    @guarded
    def malloc_bigger_than_device(self, times: int, extra: int, stream: int) -> None:
        assert self.w.malloc(self.w.capacity * times + extra, stream) is None

    @precondition(lambda self: self.world is not None and bool(self.world.live))
    @rule(pick=PICK)
    @guarded
    def free(self, pick: int) -> None:
        self.w.free(pick)

    @precondition(lambda self: self.world is not None and bool(self.world.live))
    @rule(pick=PICK, stream=STREAM_INDEX)
    @guarded
    def record_stream_and_free(self, pick: int, stream: int) -> None:
        index = pick % len(self.w.live)
        self.w.record_stream(index, stream)
        self.w.free(index)

    @precondition(lambda self: self.world is not None and bool(self.world.live))
    @rule(pick=PICK, stream=STREAM_INDEX)
    @guarded
    def record_stream(self, pick: int, stream: int) -> None:
        self.w.record_stream(pick, stream)

    @precondition(lambda self: self.world is not None and bool(self.world.stale))
    @rule(pick=PICK, stream=STREAM_INDEX)
    @guarded
    def free_twice(self, pick: int, stream: int) -> None:
        """Freeing (or record_stream on) a block that is not allocated raises, changes nothing."""
        w = self.w
        block = w.stale[pick % len(w.stale)]
        if any(block is record.block for record in w.live):
            return  # handed out again (a whole cached block is reused as it is)
        before = w.alloc.memory_stats()
        with pytest.raises(ValueError, match="not allocated"):
            w.alloc.free(block)
        with pytest.raises(ValueError, match="not allocated"):
            w.alloc.record_stream(block, w.streams[stream])
        assert w.alloc.memory_stats() == before

    @rule()
    @guarded
    def empty_cache(self) -> None:
        self.w.empty_cache()

    @rule()
    @guarded
    def reset_peaks(self) -> None:
        self.w.alloc.reset_peak_memory_stats()
        stats = self.w.alloc.memory_stats()
        for name in STAT_ARRAYS:
            assert stats[f"{name}.all.peak"] == stats[f"{name}.all.current"]

    # ------------------------------------------------------------------ settings
    @rule()
    @guarded
    def toggle_expandable(self) -> None:
        self.w.expandable = not self.w.expandable
        self.w.apply_config()

    @rule()
    @guarded
    def toggle_policy(self) -> None:
        """Between policy:pytorch and policy:accelrt; what is cached stays as it is."""
        self.w.arenas = not self.w.arenas
        self.w.apply_config()

    @rule()
    @guarded
    def toggle_throw_on_oom(self) -> None:
        """throw_on_cudamalloc_oom on or off: a request past the fraction fails at once."""
        self.w.throw_on_oom = not self.w.throw_on_oom
        self.w.apply_config()

    @rule(max_split_mb=st.sampled_from(MAX_SPLIT_MB))
    @guarded
    def set_max_split(self, max_split_mb: int | None) -> None:
        self.w.max_split_mb = max_split_mb
        self.w.apply_config()

    @rule(roundup=st.booleans(), gc_threshold=st.sampled_from(GC_THRESHOLDS))
    @guarded
    def set_rounding_and_gc(self, roundup: bool, gc_threshold: float) -> None:
        self.w.roundup = roundup
        self.w.gc_threshold = gc_threshold
        self.w.apply_config()

    @rule(fraction=st.sampled_from(FRACTIONS))
    @guarded
    def set_memory_fraction(self, fraction: float) -> None:
        self.w.set_fraction(fraction)

    # ------------------------------------------------------------------ private pools
    @precondition(lambda self: self.world is not None and len(self.world.route) < 4)
    @rule(pool_id=st.sampled_from(PRIVATE_POOLS))
    @guarded
    def begin_pool(self, pool_id: PoolId) -> None:
        w = self.w
        if pool_id in w.released:
            return  # its owner is gone: nobody can allocate to it any more
        w.alloc.begin_allocate_to_pool(pool_id)
        w.route.append(pool_id)
        w.created.add(pool_id)
        assert pool_id in w.alloc.pool_ids()

    @precondition(lambda self: self.world is not None and bool(self.world.route))
    @rule()
    @guarded
    def end_pool(self) -> None:
        self.w.alloc.end_allocate_to_pool(self.w.route.pop())

    @rule(pool_id=st.sampled_from((DEFAULT_POOL, *PRIVATE_POOLS)))
    @guarded
    def end_pool_anywhere(self, pool_id: PoolId) -> None:
        # Contexts may end out of order: the pool's latest entry goes, wherever it is.
        w = self.w
        if pool_id not in w.route:
            with pytest.raises(ValueError, match="not allocating to pool"):
                w.alloc.end_allocate_to_pool(pool_id)
            return
        w.alloc.end_allocate_to_pool(pool_id)
        del w.route[len(w.route) - 1 - w.route[::-1].index(pool_id)]

    @rule(pool_id=st.sampled_from(PRIVATE_POOLS))
    @guarded
    def release_pool(self, pool_id: PoolId) -> None:
        w = self.w
        if pool_id in w.released or pool_id in w.route:
            return  # a MemPool cannot die while use_mem_pool holds it
        w.release_pool(pool_id)

    # ------------------------------------------------------------------ invariants
    @invariant()
    @guarded
    def blocks_tile_segments(self) -> None:
        self.w.check_tiling()

    @invariant()
    @guarded
    def pages_mapped_exactly(self) -> None:
        self.w.check_mapping()
        self.w.check_device()

    @invariant()
    @guarded
    def blocks_in_own_pool(self) -> None:
        self.w.check_pools()
        self.w.check_model()
        self.w.check_released_pools()

    @invariant()
    @guarded
    def stats_match_blocks(self) -> None:
        self.w.check_stats()
        self.w.check_snapshot()
        self.w.check_history()

    def teardown(self) -> None:
        if self.world is None or self.broken:
            return  # a step failed: hypothesis reports that failure
        self.world.free_everything()
        self.world.check_empty()


AllocatorMachine.TestCase.settings = settings(
    max_examples=120, stateful_step_count=60, deadline=None
)
TestAllocatorStateMachine = AllocatorMachine.TestCase


OPS = st.lists(
    st.tuples(
        st.sampled_from(["alloc", "alloc", "alloc", "free", "record_and_free", "empty_cache"]),
        SIZES,
        STREAM_INDEX,
    ),
    max_size=60,
)


@settings(max_examples=60, deadline=None)
@given(ops=OPS, capacity=st.sampled_from(CAPACITIES))
def test_expandable_segments_unmap_every_page(
    ops: list[tuple[str, int, int]], capacity: int
) -> None:
    """With expandable segments from the start, every mapped page is unmapped again once all
    is freed and the cache emptied: the maps and unmaps counted in num_device_alloc and
    num_device_free (and in the history) cancel, reserved returns to 0, the device is free."""
    world = World(capacity, expandable=True)
    for action, size, stream in ops:
        if action == "alloc":
            world.malloc(size, stream)
        elif action in ("free", "record_and_free") and world.live:
            if action == "record_and_free":
                world.record_stream(size, (stream + 1) % 3)
            world.free(size)
        elif action == "empty_cache":
            world.empty_cache()
        world.check_all()
    world.free_everything()
    world.check_empty()
    stats = world.alloc.memory_stats()
    _, entries = world.alloc.snapshot()
    actions = Counter(entry["action"] for entry in entries)
    assert actions["segment_alloc"] == actions["segment_free"] == 0, "no ordinary segment"
    assert stats["num_device_alloc"] == actions["segment_map"]
    assert stats["num_device_free"] == actions["segment_unmap"]
    mapped = sum(e["size"] for e in entries if e["action"] == "segment_map")
    unmapped = sum(e["size"] for e in entries if e["action"] == "segment_unmap")
    assert mapped - unmapped == 0 == stats["reserved_bytes.all.current"]
    assert (stats["num_device_alloc"] > 0) == (mapped > 0)
    assert world.backend.mem_get_info(0) == (capacity, capacity)


def test_out_of_memory_leaves_no_address_range_reserved() -> None:
    world = World(64 * MiB, expandable=True)
    for _ in range(3):
        assert world.malloc(100 * MiB, 0) is None
    world.alloc.begin_allocate_to_pool((0, 1))
    with pytest.raises(OutOfMemoryError):
        world.alloc.malloc(100 * MiB, 0)
    world.alloc.end_allocate_to_pool((0, 1))
    world.alloc.release_pool((0, 1))
    world.alloc.empty_cache()
    assert world.alloc.reserved_bytes == 0
    assert world.alloc.pool_ids() == [NO_SPLIT, LENDER]  # (0, 1) is forgotten; World made these
    assert world.alloc.segments() == []  # 8 all-unmapped expandable segments stay
    assert not world.backend._devices[0].reservations


def test_a_use_on_oom_pool_lends_when_the_default_pool_runs_out() -> None:
    # the random runs rarely get there: the default pool out of memory while LENDER holds a
    # free piece of a partly used segment on the same stream
    world = World(64 * MiB)
    world.alloc.begin_allocate_to_pool(LENDER)
    world.route.append(LENDER)
    world.malloc(512, 0)
    world.malloc(512, 0)
    world.alloc.end_allocate_to_pool(world.route.pop())
    world.free(1)
    world.set_fraction(1 / 32)  # 2 MiB: no segment beyond LENDER's
    lent = world.malloc(4096, 0)
    assert lent is not None and lent.pool.pool_id == LENDER and lent.size == 4096
    world.check_all()
    assert world.malloc(4 * MiB, 0) is None  # nothing that big to lend
    world.free_everything()
    world.check_empty()
