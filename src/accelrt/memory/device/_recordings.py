"""``Recordings``: the caching allocator's state as recordings see it, out and in.

Out: the segment list, snapshots in PyTorch's schema and the history of allocator events
(``record_history``, its annotations). In: ``restore_segment``, which recreates a recorded
segment so that a replay can start where a recording started (docs/allocator.md section 13).
A base of ``SlowPath`` (device/_allocator.py); it holds no state of its own.
"""

from __future__ import annotations

import itertools
import operator
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from .._atomic import atomic
from .._policy import K_MIN_BLOCK_SIZE, K_SMALL_BUFFER, page_size
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
from ._block import SHARED_STREAM, AnySegment, Block, BlockPool, PoolId

if TYPE_CHECKING:
    from ..._errors import OutOfMemoryError
    from .._config import AllocatorConfig
    from ._source import MemorySource
    from ._stats import DeviceStats

__all__ = ["Recordings"]


class Recordings:
    """Snapshots, history and ``restore_segment``: a base of ``SlowPath``, which sets the
    attributes and defines the methods declared here."""

    device_index: int
    config: AllocatorConfig
    stats: DeviceStats
    _lock: Any
    _source: MemorySource
    _segments: dict[int, AnySegment]
    _small: BlockPool
    _large: BlockPool
    _active: dict[int, Block]
    _observer: History | None
    _Block: type[Block]
    _fraction_refuses: Callable[[int], bool]
    _new_segment: Callable[[BlockPool, int, int], Block | None]
    _count_device_memory: Callable[[BlockPool, int], None]
    _out_of_memory: Callable[[int, int, int, int], OutOfMemoryError]
    _mark_allocated: Callable[[Block, int], None]

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
