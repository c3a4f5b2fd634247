"""``CachingAllocator``: one per device, generic over a backend's raw primitives.

The default policy reproduces PyTorch's CUDACachingAllocator (ALLOCATOR.md sections 1-6, 8):
requests are rounded and split between a small and a large pool; a request takes the smallest
free block of its own stream that fits (lowest address first); blocks are split and merged
inside their segment; frees of blocks used by other streams wait for events recorded on those
streams; when nothing fits, the malloc ladder allocates a new segment, releases cached memory
and retries before raising ``OutOfMemoryError``.
"""

from __future__ import annotations

import operator
import threading
import warnings
from collections import deque
from collections.abc import Sequence
from typing import Any

from .._errors import OutOfMemoryError
from .._units import format_bytes
from ..backends._base import Backend, BackendOutOfMemory
from ._block import Block, BlockPool, Segment
from ._config import AllocatorConfig
from ._history import (
    BlockInfo,
    ContextMode,
    EnabledMode,
    History,
    RawFrames,
    SegmentInfo,
    TraceEntry,
    capture_frames,
    frames_to_dicts,
)
from ._stats import DeviceStats

__all__ = [
    "K_LARGE_BUFFER",
    "K_MIN_BLOCK_SIZE",
    "K_MIN_LARGE_ALLOC",
    "K_ROUND_LARGE",
    "K_SMALL_BUFFER",
    "K_SMALL_SIZE",
    "MAX_REQUEST_BYTES",
    "CachingAllocator",
    "round_size",
    "segment_size",
]

K_MIN_BLOCK_SIZE = 512  # every block is a multiple of this
K_SMALL_SIZE = 1 << 20  # requests up to this go to the small pool
K_SMALL_BUFFER = 2 << 20  # segment size of the small pool
K_LARGE_BUFFER = 20 << 20  # segment size for requests below K_MIN_LARGE_ALLOC
K_MIN_LARGE_ALLOC = 10 << 20
K_ROUND_LARGE = 2 << 20  # larger segments are rounded to this
MAX_REQUEST_BYTES = 1 << 60
_UNLIMITED = 1 << 64


def round_size(nbytes: int, config: AllocatorConfig) -> int:
    """Round a request as PyTorch does (ALLOCATOR.md section 2).

    Parameters
    ----------
    nbytes : int
        The requested size in bytes (>= 0).
    config : AllocatorConfig
        Supplies ``roundup_power2_divisions``.

    Returns
    -------
    int
        512 for requests below 512; else the next multiple of 512, or with d > 1 power-of-two
        divisions for the request's interval (and ``nbytes > 512 * d``) the next of d equal steps
        between the surrounding powers of two.
    """
    if nbytes < K_MIN_BLOCK_SIZE:
        return K_MIN_BLOCK_SIZE
    divisions = config.roundup_divisions_for(nbytes)
    if divisions > 1 and nbytes > K_MIN_BLOCK_SIZE * divisions:
        if nbytes & (nbytes - 1) == 0:
            return nbytes
        floor = 1 << (nbytes.bit_length() - 1)
        step = floor // divisions
        if step == 0:
            return floor << 1
        rounded = nbytes & ~(step - 1)
        return nbytes if rounded == nbytes else rounded + step
    return -(-nbytes // K_MIN_BLOCK_SIZE) * K_MIN_BLOCK_SIZE


def segment_size(rounded: int) -> int:
    """Return the size of a new segment for a rounded request (ALLOCATOR.md section 2)."""
    if rounded <= K_SMALL_SIZE:
        return K_SMALL_BUFFER
    if rounded < K_MIN_LARGE_ALLOC:
        return K_LARGE_BUFFER
    return -(-rounded // K_ROUND_LARGE) * K_ROUND_LARGE


class CachingAllocator:
    """The caching allocator of one device.

    Parameters
    ----------
    backend : Backend
        The device's backend; the allocator uses its ``malloc``/``free``, events and
        ``mem_get_info``.
    device_index : int
        The device's index within the backend.
    config : AllocatorConfig, optional
        Settings (the defaults when None). ``per_process_memory_fraction`` in it applies at once.

    Notes
    -----
    Thread-safe: every public method runs under one lock. Stream arguments are the backend's
    integer stream handles. Blocks are handed out as :class:`Block` objects; callers keep them
    and give them back to :meth:`free`. Mirrors c10's ``DeviceCachingAllocator``.
    """

    def __init__(
        self, backend: Backend, device_index: int, config: AllocatorConfig | None = None
    ) -> None:
        self.backend = backend
        self.device_index = device_index
        self.device_name = f"{backend.name}:{device_index}"
        self._lock = threading.RLock()
        self._small = BlockPool(is_small=True)
        self._large = BlockPool(is_small=False)
        self._active: dict[int, Block] = {}
        self._segments: dict[int, Segment] = {}
        self._events: dict[int, deque[tuple[Any, Block]]] = {}
        self._reserved = 0
        self._allowed_max: int | None = None
        self.config = AllocatorConfig()
        self._max_split = _UNLIMITED
        self.stats = DeviceStats(max_split_size=-1)
        self._warned_expandable = False
        self._history: History | None = None
        self.set_config(config if config is not None else AllocatorConfig())

    # ------------------------------------------------------------------ settings
    def set_config(self, config: AllocatorConfig) -> None:
        """Apply new settings to future requests; cached blocks stay as they are.

        A ``per_process_memory_fraction`` in the config sets the memory fraction. Expandable
        segments are not implemented yet: requesting them warns once and uses normal segments.
        """
        with self._lock:
            self.config = config
            self._max_split = (
                config.max_split_size if config.max_split_size is not None else _UNLIMITED
            )
            self.stats.max_split_size = (
                config.max_split_size if config.max_split_size is not None else -1
            )
            if config.per_process_memory_fraction is not None:
                self.set_memory_fraction(config.per_process_memory_fraction)
            if config.expandable_segments and not self._warned_expandable:
                self._warned_expandable = True
                warnings.warn(
                    f"{self.device_name}: expandable segments are not implemented yet; "
                    "using normal segments",
                    RuntimeWarning,
                    stacklevel=3,
                )

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
            An allocated block; ``block.address`` is the device pointer.

        Raises
        ------
        TypeError
            If ``nbytes`` is not an integer.
        ValueError
            If ``nbytes`` < 1 or > 2**60.
        OutOfMemoryError
            If the ladder of ALLOCATOR.md section 6 finds no memory; the allocator is unchanged
            except for cached blocks released on the way and the ``num_ooms`` counter.
        """
        if type(nbytes) is not int:
            nbytes = _as_size(nbytes)
        if nbytes < 1 or nbytes > MAX_REQUEST_BYTES:
            raise ValueError(
                f"allocation size must be between 1 and 2**60 bytes, got {nbytes}"
                + (": no device has that much memory" if nbytes > MAX_REQUEST_BYTES else "")
            )
        with self._lock:
            if self._events:
                self._process_events()
            size = round_size(nbytes, self.config)
            pool = self._small if size <= K_SMALL_SIZE else self._large
            history = self._history
            frames = capture_frames() if history is not None and history.stack_allocs else None
            block = self._get_free_block(pool, size, stream)
            if block is None:
                block = self._malloc_slow(pool, size, nbytes, stream, frames)
            block = self._alloc_found_block(block, size, nbytes, pool)
            if history is not None:
                block.frames = frames
                history.record("alloc", block.address, nbytes, stream, frames)
            return block

    def _malloc_slow(
        self, pool: BlockPool, size: int, nbytes: int, stream: int, frames: RawFrames | None
    ) -> Block:
        alloc_size = segment_size(size)
        if self._allowed_max is not None and self.config.garbage_collection_threshold > 0:
            self._garbage_collect()
        block = self._alloc_segment(pool, alloc_size, stream, is_retry=False)
        if block is None and self._release_available_cached_blocks(pool, size, stream):
            block = self._alloc_segment(pool, alloc_size, stream, is_retry=False)
        if block is None:
            self._release_cached_blocks()
            block = self._alloc_segment(pool, alloc_size, stream, is_retry=True)
        if block is None:
            raise self._out_of_memory(nbytes, alloc_size, stream, frames)
        block.segment.frames = frames
        return block

    def _get_free_block(self, pool: BlockPool, size: int, stream: int) -> Block | None:
        if self._allowed_max is not None and self.config.garbage_collection_threshold > 0:
            pool.get_free_blocks_call_count += 1
        block = pool.lower_bound(stream, size)
        if block is None:
            return None
        max_split = self._max_split
        if size < max_split and block.size >= max_split:
            return None  # keep oversize blocks for oversize requests
        if size >= max_split and block.size >= size + self.config.max_non_split_rounding:
            return None
        pool.remove(block)
        return block

    def _alloc_segment(
        self, pool: BlockPool, alloc_size: int, stream: int, *, is_retry: bool
    ) -> Block | None:
        stats = self.stats
        if is_retry:
            stats.num_alloc_retries += 1
        if self._allowed_max is not None and self._reserved + alloc_size > self._allowed_max:
            return None
        try:
            ptr = self.backend.malloc(self.device_index, alloc_size)
        except BackendOutOfMemory:
            return None
        self._reserved += alloc_size
        segment = Segment(ptr, alloc_size, stream, pool.is_small)
        self._segments[ptr] = segment
        stats.segment.increase(pool.is_small, 1)
        stats.reserved_bytes.increase(pool.is_small, alloc_size)
        if alloc_size >= self._max_split:
            stats.oversize_segments.increase(1)
        stats.num_device_alloc += 1
        if self._history is not None:
            self._history.record("segment_alloc", ptr, alloc_size, stream)
        return Block(ptr, alloc_size, stream, pool, segment)

    def _should_split(self, block: Block, size: int) -> bool:
        remaining = block.size - size
        if block.pool.is_small:
            return remaining >= K_MIN_BLOCK_SIZE
        return size < self._max_split and remaining > K_SMALL_SIZE

    def _alloc_found_block(self, block: Block, size: int, nbytes: int, pool: BlockPool) -> Block:
        stats = self.stats
        is_small = pool.is_small
        already_split = block.is_split()
        if self._should_split(block, size):
            remaining = block
            block = Block(remaining.address, size, remaining.stream, pool, remaining.segment)
            block.prev = remaining.prev
            if block.prev is not None:
                block.prev.next = block
            block.next = remaining
            remaining.prev = block
            remaining.address += size
            remaining.size -= size
            pool.insert(remaining)
            if already_split:
                stats.inactive_split_bytes.decrease(is_small, size)
            else:
                stats.inactive_split_bytes.increase(is_small, remaining.size)
                stats.inactive_split.increase(is_small, 1)
        elif already_split:
            stats.inactive_split_bytes.decrease(is_small, block.size)
            stats.inactive_split.decrease(is_small, 1)
        self._mark_allocated(block, nbytes)
        return block

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

    def restore_segment(
        self, size: int, stream: int, blocks: Sequence[tuple[int, int]]
    ) -> list[Block]:
        """Recreate a segment as a recording had it: for replays that start mid-run.

        Parameters
        ----------
        size : int
            Segment bytes; 2 MiB makes a small-pool segment, anything else a large-pool one
            (PyTorch's segment sizes never overlap).
        stream : int
            The stream handle that owns the segment and all its blocks.
        blocks : sequence of (block_bytes, requested_bytes)
            The segment's blocks in address order; ``requested_bytes`` 0 marks a free block.

        Returns
        -------
        list of Block
            The allocated blocks, in address order, to be freed later like any others.

        Raises
        ------
        ValueError
            If the block sizes are not positive multiples of 512 summing to ``size``, or two
            free blocks are adjacent (the allocator would have merged them); nothing changes.

        Notes
        -----
        The segment is obtained with ``backend.malloc`` (a simulated device can be told which
        address to return, see ``SimBackend.plan_addresses``) and counts in the statistics as
        a device allocation. ALLOCATOR.md section 13.
        """
        sizes = [b for b, _ in blocks]
        if any(b <= 0 or b % K_MIN_BLOCK_SIZE for b in sizes) or sum(sizes) != size:
            raise ValueError(
                f"blocks {sizes} must be positive multiples of {K_MIN_BLOCK_SIZE} bytes summing "
                f"to the segment's {size} bytes"
            )
        if any(blocks[i][1] == 0 == blocks[i + 1][1] for i in range(len(blocks) - 1)):
            raise ValueError("two free blocks are adjacent: the allocator would have merged them")
        with self._lock:
            pool = self._small if size == K_SMALL_BUFFER else self._large
            first = self._alloc_segment(pool, size, stream, is_retry=False)
            if first is None:
                raise self._out_of_memory(size, size, stream)
            segment, stats, is_small = first.segment, self.stats, pool.is_small
            chain: list[Block] = []
            address = segment.address
            for block_bytes, requested in blocks:
                block = Block(address, block_bytes, stream, pool, segment)
                if chain:
                    block.prev, chain[-1].next = chain[-1], block
                chain.append(block)
                address += block_bytes
                if requested:
                    self._mark_allocated(block, requested)
            for block in chain:
                if not block.allocated:
                    pool.insert(block)
                    if block.is_split():
                        stats.inactive_split.increase(is_small, 1)
                        stats.inactive_split_bytes.increase(is_small, block.size)
            return [block for block in chain if block.allocated]

    # ------------------------------------------------------------------ free
    def free(self, block: Block) -> None:
        """Give a block back; reusable at once on its stream, elsewhere after its events.

        Raises
        ------
        ValueError
            If the block is not currently allocated by this allocator (double free, or a
            block of another device); nothing changes.
        """
        with self._lock:
            if self._active.get(block.address) is not block or not block.allocated:
                raise ValueError(
                    f"{self.device_name}: block at {block.address:#x} is not allocated by this "
                    "allocator (freed twice, or from another device)"
                )
            stats = self.stats
            is_small = block.pool.is_small
            block.allocated = False
            history = self._history
            if history is not None:
                frames = capture_frames() if history.stack_frees else None
                history.record(
                    "free_requested", block.address, block.requested_size, block.stream, frames
                )
            stats.allocation.decrease(is_small, 1)
            stats.allocated_bytes.decrease(is_small, block.size)
            if block.size >= self._max_split:
                stats.oversize_allocations.decrease(1)
            if block.stream_uses:
                self._insert_events(block)
            else:
                self._free_block(block)

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

    def _insert_events(self, block: Block) -> None:
        streams = block.stream_uses or set()
        block.stream_uses = None
        for stream in sorted(streams):
            event = self.backend.event_create(self.device_index, False)
            self.backend.event_record(event, self.device_index, stream)
            block.event_count += 1
            queue = self._events.get(stream)
            if queue is None:
                queue = self._events[stream] = deque()
            queue.append((event, block))

    def _process_events(self) -> None:
        for stream in list(self._events):
            queue = self._events[stream]
            while queue:
                event, block = queue[0]
                if not self.backend.event_query(event):
                    break
                queue.popleft()
                block.event_count -= 1
                if block.event_count == 0:
                    self._free_block(block)
            if not queue:
                del self._events[stream]

    def _synchronize_and_free_events(self) -> None:
        self.stats.num_sync_all_streams += 1
        for queue in self._events.values():
            for event, block in queue:
                self.backend.event_synchronize(event)
                block.event_count -= 1
                if block.event_count == 0:
                    self._free_block(block)
        self._events.clear()

    def _free_block(self, block: Block) -> None:
        stats = self.stats
        pool = block.pool
        is_small = pool.is_small
        original_size = block.size
        requested = block.requested_size
        split_blocks_change = 0
        split_bytes_change = 0
        if self._history is not None:
            self._history.record("free_completed", block.address, requested, block.stream)
        block.frames = None
        del self._active[block.address]
        for candidate in (block.prev, block.next):
            subsumed = self._try_merge(block, candidate, pool)
            if subsumed:
                split_blocks_change -= 1
                split_bytes_change -= subsumed
        pool.insert(block)
        if block.is_split():
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

    @staticmethod
    def _try_merge(dst: Block, src: Block | None, pool: BlockPool) -> int:
        if src is None or src.allocated or src.event_count > 0 or src.stream_uses:
            return 0
        pool.remove(src)
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

    # ------------------------------------------------------------------ releasing
    def empty_cache(self) -> None:
        """Wait for pending frees, then return every free, unsplit segment to the device.

        Mirrors ``torch.cuda.empty_cache``: blocks still allocated, and free pieces of
        segments that are partly allocated, stay.
        """
        with self._lock:
            self._release_cached_blocks()

    def _release_cached_blocks(self) -> None:
        self._synchronize_and_free_events()
        for pool in (self._large, self._small):
            for block in pool.blocks():
                if not block.is_split():
                    self._release_block(block)

    def _release_block(self, block: Block) -> None:
        stats = self.stats
        pool = block.pool
        self.backend.free(self.device_index, block.address)
        if self._history is not None:
            self._history.record("segment_free", block.address, block.size, block.stream)
        pool.remove(block)
        del self._segments[block.address]
        self._reserved -= block.size
        stats.num_device_free += 1
        stats.segment.decrease(pool.is_small, 1)
        stats.reserved_bytes.decrease(pool.is_small, block.size)
        if block.size >= self._max_split:
            stats.oversize_segments.decrease(1)

    def _release_available_cached_blocks(self, pool: BlockPool, size: int, stream: int) -> bool:
        if self._max_split == _UNLIMITED:
            return False
        target = max(size, self._max_split)
        block = pool.lower_bound(stream, target)
        if block is not None and not block.is_split():
            self._release_block(block)
            return True
        released = 0
        for candidate in pool.stream_blocks(stream, descending=True):
            if released >= target or candidate.size < self._max_split:
                break
            if not candidate.is_split():
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
        freeable = [b for b in pool.blocks() if not b.is_split()]
        total_age = sum(calls - b.gc_count_base for b in freeable)
        count = len(freeable)
        reclaimed = 0
        freed_any = True
        while reclaimed < target and freed_any and count > 0:
            age_threshold = total_age / count
            freed_any = False
            for block in pool.blocks():
                age = calls - block.gc_count_base
                if not block.is_split() and age >= age_threshold:
                    freed_any = True
                    reclaimed += block.size
                    total_age -= age
                    count -= 1
                    self._release_block(block)

    def _out_of_memory(
        self, nbytes: int, alloc_size: int, stream: int, frames: RawFrames | None = None
    ) -> OutOfMemoryError:
        stats = self.stats
        stats.num_ooms += 1
        free, total = self.backend.mem_get_info(self.device_index)
        if self._history is not None:
            self._history.record("oom", 0, alloc_size, stream, frames, device_free=free)
        allocated = stats.allocated_bytes.all.current
        reserved = stats.reserved_bytes.all.current
        allowed = ""
        if self._allowed_max is not None:
            allowed = f" accelrt may use {format_bytes(self._allowed_max)} of it (memory fraction)."
        if self.backend.supports_virtual_memory():
            hint = "ACCELRT_ALLOC_CONF=expandable_segments:True"
        else:
            hint = "ACCELRT_ALLOC_CONF=max_split_size_mb:<MiB> (expandable segments need VMM)"
        message = (
            f"Out of memory on {self.device_name}. Tried to allocate {format_bytes(alloc_size)} "
            f"(a {format_bytes(nbytes)} request). The device has a total capacity of "
            f"{format_bytes(total)} of which {format_bytes(free)} is free.{allowed} Of the "
            f"allocated memory {format_bytes(allocated)} is allocated by accelrt, and "
            f"{format_bytes(reserved - allocated)} is reserved by accelrt but unallocated. If "
            f"reserved but unallocated memory is large, try {hint} to avoid fragmentation."
        )
        return OutOfMemoryError(
            message,
            device=self.device_name,
            requested_bytes=nbytes,
            allocation_bytes=alloc_size,
            allocated_bytes=allocated,
            reserved_bytes=reserved,
            free_bytes=free,
            total_bytes=total,
        )

    # ------------------------------------------------------------------ history, snapshots
    def record_history(
        self, enabled: EnabledMode | None, context: ContextMode | None, max_entries: int
    ) -> None:
        """Start (or, with ``enabled=None``, stop and forget) recording history.

        See ``accelrt.record_memory_history`` for the modes. Starting again starts an empty
        ring buffer.
        """
        with self._lock:
            self._history = None if enabled is None else History(enabled, context, max_entries)

    def snapshot(self) -> tuple[list[SegmentInfo], list[TraceEntry]]:
        """Return the segments (with blocks) and the history entries, in PyTorch's schema."""
        with self._lock:
            segments = []
            for segment, blocks in self.segments():
                infos = [
                    BlockInfo(
                        address=b.address,
                        size=b.size,
                        requested_size=b.requested_size if b.allocated or b.event_count else 0,
                        state=(
                            "active_allocated"
                            if b.allocated
                            else "active_pending_free"
                            if b.event_count
                            else "inactive"
                        ),
                        frames=frames_to_dicts(b.frames),
                    )
                    for b in blocks
                ]
                segments.append(
                    SegmentInfo(
                        device=self.device_index,
                        address=segment.address,
                        total_size=segment.size,
                        allocated_size=sum(b.size for b in blocks if b.allocated),
                        active_size=sum(b.size for b in blocks if b.allocated or b.event_count),
                        requested_size=sum(i["requested_size"] for i in infos),
                        stream=segment.stream,
                        segment_type="small" if segment.is_small else "large",
                        segment_pool_id=(0, 0),
                        is_expandable=False,
                        frames=frames_to_dicts(segment.frames),
                        blocks=infos,
                    )
                )
            entries = self._history.to_entries() if self._history is not None else []
            return segments, entries

    # ------------------------------------------------------------------ statistics
    def memory_stats(self) -> dict[str, int]:
        """Return every statistic as ``memory_stats()`` flat keys (ALLOCATOR.md section 8)."""
        with self._lock:
            return self.stats.as_dict()

    def reset_peak_memory_stats(self) -> None:
        """Set every peak to its current value."""
        with self._lock:
            self.stats.reset_peak()

    def reset_accumulated_memory_stats(self) -> None:
        """Zero the allocated/freed sums and the num_* counters."""
        with self._lock:
            self.stats.reset_accumulated()

    @property
    def reserved_bytes(self) -> int:
        """Bytes currently held from the device."""
        return self._reserved

    def segments(self) -> list[tuple[Segment, list[Block]]]:
        """Return each segment with its blocks in address order (for summaries and tests)."""
        with self._lock:
            out = []
            for segment in sorted(self._segments.values(), key=lambda s: s.address):
                blocks: list[Block] = []
                block = self._block_at(segment.address, segment)
                while block is not None:
                    blocks.append(block)
                    block = block.next
                out.append((segment, blocks))
            return out

    def _block_at(self, address: int, segment: Segment) -> Block | None:
        block = self._active.get(address)
        if block is None:
            block = (self._small if segment.is_small else self._large).get(address)
        return block


def _as_size(value: Any) -> int:
    if isinstance(value, bool):
        raise TypeError(f"allocation size must be an int number of bytes, got {value!r}")
    try:
        return operator.index(value)
    except TypeError:
        raise TypeError(
            f"allocation size must be an int number of bytes, got {type(value).__name__} {value!r}"
        ) from None
