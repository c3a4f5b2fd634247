"""The start state of a snapshot's recording: its segments and blocks rewound from the end state.

A snapshot holds the allocator's end state; walking a device's history backwards from it
(:class:`Rewind`) gives the segments and blocks that existed when recording began
(:class:`SegmentState`), less what the simulated device could not restore
(:func:`restorable_start`). :mod:`accelrt.trace._snapshot` reads the snapshot and makes the
trace; this module only rewinds.
"""

from __future__ import annotations

from bisect import bisect_right, insort
from typing import Any, TypeAlias

from ..memory._config import AllocatorConfig
from ..memory._policy import (
    K_MIN_BLOCK_SIZE,
    K_SMALL_BUFFER,
    UNLIMITED,
    expandable_address_space,
    page_size,
    round_size,
    should_split,
)
from ._format import TraceFormatError
from ._recording import UNLIMITED_CAPACITY, UNMAPPED, BlockState, SegmentState
from ._snapshot_schema import ALLOCATED_STATES, MAX_FILE_VALUE, FileEntry, FileSegment

_Segment: TypeAlias = list[Any]
"""A segment of :class:`Rewind`: ``[size, stream, sorted block starts, {start: [size, state]},
is_small, is_expandable]``, a list of mixed items (changed in place as the walk goes back)."""

__all__ = [
    "Rewind",
    "blocks_of",
    "expandable_groups",
    "pool_returns",
    "range_pools",
    "restorable_start",
]


class Rewind:
    """The segments of one device, walked backwards from the end state.

    Each segment is ``[size, stream, sorted block starts, {start: [size, state]}, is_small,
    is_expandable]`` where state is the requested bytes (allocated), 0 (free) or ``UNMAPPED``.
    All of an expandable segment's mapped ranges of one (stream, pool) form one segment here (a
    span); going back in time a span widens to the pages unmapped during the recording, and
    one reserved at addresses another (stream, pool) used before it was released is dropped
    once nothing of it is mapped. Segments never overlap, and their blocks always tile them:
    what would break that is counted in ``inconsistent`` instead.
    """

    def __init__(self, settings: AllocatorConfig) -> None:
        self.settings = settings
        self.segments: dict[int, _Segment] = {}
        self.starts: list[int] = []
        self.inconsistent = 0
        self.claims: list[tuple[int, int, int, bool]] = []
        """``(low, high, stream, is_small)`` of every expandable range the recording shows."""

    def add_segment(
        self,
        address: int,
        size: int,
        stream: int,
        blocks: list[BlockState],
        is_small: bool,
        is_expandable: bool = False,
    ) -> None:
        """Add a segment whose blocks tile it and that overlaps no other; else count it."""
        cursor = address
        for b in blocks:
            if b.address != cursor or b.size <= 0:
                break
            cursor += b.size
        else:
            pos = bisect_right(self.starts, address)
            before_ok = pos == 0 or self._end(self.starts[pos - 1]) <= address
            after_ok = pos == len(self.starts) or address + size <= self.starts[pos]
            if blocks and cursor == address + size and before_ok and after_ok:
                starts = [b.address for b in blocks]
                table = {b.address: [b.size, b.requested_size] for b in blocks}
                self.segments[address] = [size, stream, starts, table, is_small, is_expandable]
                self.starts.insert(pos, address)
                return
        self.inconsistent += 1

    def _end(self, start: int) -> int:
        return start + int(self.segments[start][0])

    def _segment_of(self, addr: int) -> _Segment | None:
        pos = bisect_right(self.starts, addr) - 1
        if pos < 0:
            return None
        seg = self.segments[self.starts[pos]]
        return seg if addr < self.starts[pos] + seg[0] else None

    @staticmethod
    def _merge_around(seg: _Segment, addr: int) -> None:
        """Merge the block at ``addr`` with neighbours in the same free or unmapped state."""
        starts, table = seg[2], seg[3]
        state = table[addr][1]
        i = starts.index(addr)
        if i + 1 < len(starts) and table[starts[i + 1]][1] == state:
            table[addr][0] += table.pop(starts.pop(i + 1))[0]
        if i > 0 and table[starts[i - 1]][1] == state:
            table[starts[i - 1]][0] += table.pop(starts.pop(i))[0]

    def _carve(self, addr: int, size: int, before: int, after: int) -> _Segment | None:
        """Turn ``[addr, addr + size)`` of one block in state ``before`` into ``after``."""
        seg = self._segment_of(addr)
        if seg is None or size <= 0:
            return None
        starts, table = seg[2], seg[3]
        i = bisect_right(starts, addr) - 1
        start = starts[i]
        block_size, state = table[start]
        end = start + block_size
        if state != before or addr + size > end:
            return None
        if start < addr:
            table[start][0] = addr - start
            starts.insert(i + 1, addr)
        table[addr] = [size, after]
        if addr + size < end:
            insort(starts, addr + size)
            table[addr + size] = [end - addr - size, before]
        return seg

    def undo_alloc(self, addr: int) -> None:
        """The block at ``addr`` was allocated here: before, it was free (merged)."""
        seg = self._segment_of(addr)
        if seg is None or addr not in seg[3] or seg[3][addr][1] <= 0:
            self.inconsistent += 1
            return
        seg[3][addr][1] = 0
        self._merge_around(seg, addr)

    def undo_free(self, addr: int, requested: int) -> None:
        """The block at ``addr`` was freed here: before, it was allocated (split it out)."""
        seg = self._segment_of(addr)
        if seg is None or requested <= 0:
            self.inconsistent += 1
            return
        starts, table = seg[2], seg[3]
        start = starts[bisect_right(starts, addr) - 1]
        free_end = start + table[start][0]
        size = round_size(requested, self.settings)
        fits = table[start][1] == 0 and addr + size <= free_end
        max_split = self.settings.max_split_size or UNLIMITED
        expandable = bool(seg[5]) or self.settings.expandable_segments
        if fits and not should_split(free_end - addr, size, seg[4], max_split, expandable):
            size = free_end - addr  # handed out whole: the remainder was not worth a split
        if not fits or self._carve(addr, size, 0, requested) is None:
            self.inconsistent += 1

    def undo_segment_alloc(self, addr: int, size: int) -> None:
        seg = self.segments.get(addr)
        if seg is None or seg[0] != size or len(seg[2]) != 1 or seg[3][addr][1] or seg[5]:
            self.inconsistent += 1
            return
        del self.segments[addr]
        self.starts.remove(addr)

    def undo_segment_free(self, addr: int, size: int, stream: int) -> None:
        if self._segment_of(addr) is not None:
            self.inconsistent += 1
            return
        self.add_segment(addr, size, stream, [BlockState(addr, size, 0)], size == K_SMALL_BUFFER)

    def _expandable_at(self, addr: int) -> bool:
        seg = self._segment_of(addr)
        return seg is not None and bool(seg[5])

    def undo_segment_map(self, addr: int, size: int) -> None:
        """Pages were mapped here: before, they were unmapped."""
        seg = self._carve(addr, size, 0, UNMAPPED) if self._expandable_at(addr) else None
        if seg is None:
            self.inconsistent += 1
            return
        self._merge_around(seg, addr)

    def undo_segment_unmap(self, addr: int, size: int, stream: int, is_small: bool) -> None:
        """Pages were unmapped here: before, they were mapped and free (in the span of
        ``(stream, is_small)`` that held them then, :meth:`_span_for`)."""
        span = self._span_for(addr, addr + size, stream, is_small)
        seg = self._carve(addr, size, UNMAPPED, 0) if span is not None else None
        if seg is None:
            self.inconsistent += 1
            return
        self._merge_around(seg, addr)

    def _span_for(self, low: int, high: int, stream: int, is_small: bool) -> _Segment | None:
        """The span of ``(stream, is_small)`` that held ``[low, high)`` before it was unmapped.

        The span holding ``low`` now if it is that (stream, pool)'s, widened up to ``high``;
        else, when one holds ``low`` but nothing of it is mapped, it was reserved after this
        point (its addresses reused): it is dropped. With none holding ``low``, the nearest span
        of that (stream, pool) widens to the range when another (stream, pool) never held
        anything of the range or between them; else the range starts a span of its own. None
        where pages of another segment are in the way.
        """
        key = (stream, is_small)
        pos = bisect_right(self.starts, low) - 1
        if pos >= 0 and low < self._end(self.starts[pos]):
            start = self.starts[pos]
            seg = self.segments[start]
            if seg[5] and (seg[1], seg[4]) == key:
                return self._widen(start, low, high)
            if not seg[5] or any(seg[3][b][1] != UNMAPPED for b in seg[2]):
                return None
            del self.segments[start]  # reserved later, at addresses this range had before
            self.starts.pop(pos)
            pos -= 1
        above = pos + 1  # the spans either side of the range, nearest first
        neighbours = (*self.starts[above : above + 1], *self.starts[max(pos, 0) : pos + 1])
        if self._claimed(low, high, key):  # addresses reused: a reservation of their own
            neighbours = ()
        for start in neighbours:
            seg = self.segments[start]
            if seg[5] and (seg[1], seg[4]) == key:
                widened = self._widen(start, low, high)
                if widened is not None:
                    return widened
        if self._blocked(low, high, None):
            return None
        insort(self.starts, low)
        self.segments[low] = [
            high - low,
            stream,
            [low],
            {low: [high - low, UNMAPPED]},
            is_small,
            True,
        ]
        return self.segments[low]

    def _blocked(self, low: int, high: int, own: int | None) -> bool:
        """Whether a segment other than the one at ``own`` lies in ``[low, high)``."""
        i = bisect_right(self.starts, low) - 1
        for start in self.starts[max(i, 0) :]:
            if start >= high:
                break
            if start != own and self._end(start) > low:
                return True
        return False

    def _claimed(self, low: int, high: int, key: tuple[int, bool]) -> bool:
        """Whether another (stream, pool) ever held an expandable range in ``[low, high)``."""
        return any(lo < high and low < hi and (s, small) != key for lo, hi, s, small in self.claims)

    def _widen(self, start: int, low: int, high: int) -> _Segment | None:
        """Widen the span at ``start`` with unmapped pages to cover ``[low, high)``; None where
        something else lies in between (the span is then unchanged)."""
        seg = self.segments[start]
        size, stream, starts, table = seg[0], seg[1], seg[2], seg[3]
        new_low, new_high = min(low, start), max(high, start + size)
        if (new_low, new_high) == (start, start + size):
            return seg
        gap_low, gap_high = (high, start) if high <= start else (start + size, low)
        if self._blocked(new_low, new_high, start) or self._claimed(
            gap_low, gap_high, (stream, seg[4])
        ):
            return None
        if new_low < start:
            first = starts[0]
            if table[first][1] == UNMAPPED:
                table[new_low] = [table.pop(first)[0] + start - new_low, UNMAPPED]
                starts[0] = new_low
            else:
                table[new_low] = [start - new_low, UNMAPPED]
                starts.insert(0, new_low)
            del self.segments[start]
            self.starts.remove(start)
            self.segments[new_low] = seg
            insort(self.starts, new_low)
        if new_high > start + size:
            last = starts[-1]
            if table[last][1] == UNMAPPED:
                table[last][0] += new_high - (start + size)
            else:
                table[start + size] = [new_high - (start + size), UNMAPPED]
                starts.append(start + size)
        seg[0] = new_high - new_low
        return seg

    def state(self) -> tuple[SegmentState, ...]:
        out = []
        for address in self.starts:
            size, stream, starts, table, is_small, is_expandable = self.segments[address]
            blocks = tuple(BlockState(s, table[s][0], table[s][1]) for s in starts)
            if is_expandable and all(b.requested_size == UNMAPPED for b in blocks):
                continue  # nothing mapped when recording began
            out.append(SegmentState(address, size, stream, blocks, is_small, is_expandable))
        return tuple(out)


def mapped_bytes(segment: SegmentState) -> int:
    """The device memory a start segment holds (an expandable one: its mapped blocks)."""
    if not segment.is_expandable:
        return segment.size
    return sum(b.size for b in segment.blocks if b.requested_size != UNMAPPED)


def restorable(segment: SegmentState) -> bool:
    """Whether ``CachingAllocator.restore_segment`` takes the segment as it is.

    Blocks of positive multiples of 512 bytes, no two free or two unmapped blocks side by
    side, unmapped blocks only in an expandable segment and there in whole pages, and an
    expandable segment a whole number of pages (so its mapped runs are too).
    """
    previous = 1
    page = page_size(segment.is_small) if segment.is_expandable else 0
    offset = 0
    for b in segment.blocks:
        state = min(b.requested_size, 1)
        if b.size <= 0 or b.size % K_MIN_BLOCK_SIZE or state == previous < 1:
            return False
        if state == UNMAPPED and (not page or offset % page or b.size % page):
            return False
        previous = state
        offset += b.size
    return offset == segment.size and (not page or segment.size % page == 0)


def expandable_groups(
    end_segments: list[FileSegment],
) -> list[tuple[int, int, int, bool, list[BlockState]]]:
    """Join the mapped ranges of each (stream, pool) into one span of an expandable segment.

    Returns ``(address, size, stream, is_small, blocks)`` per span: the span runs from the
    lowest to the highest address the end state shows for it, and the stretches between
    mapped ranges are unmapped blocks. (The rewind widens it to pages unmapped during the
    recording: ``Rewind.undo_segment_unmap``.)
    """
    groups: dict[tuple[int, bool], list[FileSegment]] = {}
    for seg in end_segments:
        key = (seg.get("stream", 0), seg.get("segment_type") == "small")
        groups.setdefault(key, []).append(seg)
    out = []
    for (stream, is_small), ranges in sorted(groups.items()):
        ranges.sort(key=lambda r: r["address"])
        low = cursor = ranges[0]["address"]
        blocks: list[BlockState] = []
        for seg in ranges:
            if seg["address"] > cursor:
                blocks.append(BlockState(cursor, seg["address"] - cursor, UNMAPPED))
            blocks.extend(blocks_of(seg))
            cursor = seg["address"] + seg["total_size"]
        out.append((low, cursor - low, stream, is_small, blocks))
    return out


def range_pools(entries: list[FileEntry], large_page: int) -> dict[int, bool]:
    """Whether each ``segment_map``/``segment_unmap`` entry (by index) is of the small pool.

    A history entry does not name its pool; the large pool maps whole large pages, so a size
    that is not a whole number of them is the small pool's. (A run of small pages that makes
    whole large pages reads as the large pool's.)
    """
    return {
        i: entry["size"] % large_page != 0
        for i, entry in enumerate(entries)
        if entry["action"] in ("segment_map", "segment_unmap")
    }


def blocks_of(segment: FileSegment) -> list[BlockState]:
    """A segment's blocks; an allocated block's requested bytes are kept in ``[1, size]``."""
    return [
        BlockState(
            b["address"],
            b["size"],
            min(max(b.get("requested_size", b["size"]), 1), b["size"])
            if b["state"] in ALLOCATED_STATES
            else 0,
        )
        for b in segment["blocks"]
    ]


def pool_returns(entries: list[FileEntry], end_segments: list[FileSegment]) -> set[int]:
    """The indices of the entries where a block went back to its pool.

    A block goes back at its ``free_completed``, which comes after its ``free_requested`` when
    the block was used on other streams (``record_stream``) and stayed pending until their work
    ended. So every ``free_completed`` returns a block (one whose request came before the
    recording began included), and a ``free_requested`` does only when no completion of it was
    recorded (``skip_actions``, an older PyTorch), unless the block is still pending in the end
    state.
    """
    returns: set[int] = set()
    requested: dict[int, int] = {}  # address -> its free_requested awaiting a completion
    for i, entry in enumerate(entries):
        action = entry["action"]
        if action == "free_requested":
            requested[entry["addr"]] = i
        elif action == "free_completed":
            requested.pop(entry["addr"], None)
            returns.add(i)
        elif action == "alloc" and entry["addr"] in requested:  # reused: it was returned
            returns.add(requested.pop(entry["addr"]))
    pending = {
        b["address"]
        for seg in end_segments
        for b in seg["blocks"]
        if b["state"] == "active_pending_free"
    }
    returns.update(i for addr, i in requested.items() if addr not in pending)
    return returns


def restorable_start(
    rewound: tuple[SegmentState, ...], capacity: int | None, where: str
) -> tuple[tuple[SegmentState, ...], int | None, int]:
    """Keep the rewound segments a replay on the simulated device can restore.

    Returns the segments kept, the device capacity to replay with (the recorded one, or None
    where it does not hold what the start state holds) and how many segments were left out.
    """
    kept = [s for s in rewound if restorable(s)]
    held = sum(mapped_bytes(s) for s in kept)
    if capacity is not None and not (0 < capacity < MAX_FILE_VALUE and capacity >= held):
        capacity = None  # an oom entry that cannot be right: the device held more, or no memory
    device_bytes = capacity or UNLIMITED_CAPACITY
    if held > device_bytes:
        raise TraceFormatError(
            f"{where}: the recording's start state holds {held} bytes, more than the "
            f"simulated device's {device_bytes} (a damaged file)"
        )
    kept = [  # an expandable segment reserves 1.125 x the device, in whole pages
        s
        for s in kept
        if not s.is_expandable
        or s.size <= expandable_address_space(device_bytes, page_size(s.is_small))
    ]
    return tuple(kept), capacity, len(rewound) - len(kept)
