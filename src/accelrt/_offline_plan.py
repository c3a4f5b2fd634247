"""An offline memory plan: an offset for every block when every lifetime is known beforehand.

This is dynamic storage allocation (DSA; Garey & Johnson, *Computers and Intractability*, 1979,
problem SR2): each block has a size and a lifetime ``[start, end)``; give each an offset so that
no two blocks alive at the same moment share an address, keeping the highest address used (the
plan's peak) low. Finding the lowest peak is NP-hard, so :func:`plan` places the blocks with two
heuristics and keeps the placement with the lower peak. Either is a real placement: its peak is
what an allocator with perfect foresight and no segments, pools or streams needs at most, and it
is at least the peak of live bytes.

1. **Best fit in start order.** Each block, as it starts, goes into the smallest free gap that
   holds it (at the gap's low end; gaps merge as blocks end), else on top of everything live:
   the classic best-fit rule (Knuth, *The Art of Computer Programming* vol. 1, section 2.5;
   Wilson, Johnstone, Neely & Boles, "Dynamic Storage Allocation: A Survey and Critical
   Review", 1995) on a single unbounded arena.
2. **Greedy by size** (Pisarchyk & Lee, "Efficient Memory Management for Deep Neural Net
   Inference", 2020, arXiv:2001.03288, "greedy by size for offset calculation"; TensorFlow
   Lite's ``GreedyBySizeAssignment``, tensorflow/lite/delegates/gpu/common/memory_management)
   for the :data:`GREEDY_BLOCKS` largest blocks: from the largest (ties: the earlier start
   first), each goes into the smallest gap between the placed blocks whose lifetimes overlap
   its own, else just above the highest of them. Its cost grows with the square of the blocks
   it places, so the other blocks then go best fit in start order around those, each into a
   gap that stays free of them for its whole lifetime.

Greedy by size wins where big blocks of changing sizes come and go (bert_mlm_varlen: 1.0000 of
the rounded live peak against 1.0646 for best fit alone); best fit where many blocks of one size
live for different spans (lstm_seq2seq_train: 1.0084 against 1.0298).

Cost: two sorts and, per block, a few dict and ``bisect`` operations in each sweep, plus one
numpy pass over the placed large blocks per large block; a block that must keep clear of more
than :data:`_FEW` large blocks still to come checks its candidate offsets against them in one
numpy pass (bert_mlm_varlen: 3.7 s of Python checks become 0.2 s). Above :data:`BOTH_UP_TO`
blocks only greedy by size runs (one sweep), so a replay's bounds cost about what loading the
trace does.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

__all__ = [
    "BEST_FIT",
    "BOTH_UP_TO",
    "GREEDY_BLOCKS",
    "GREEDY_BY_SIZE",
    "Plan",
    "Times",
    "plan",
    "plannable",
]

Int64Array = npt.NDArray[np.int64]
Times = npt.NDArray[np.int32 | np.int64]
"""Lifetime bounds: int32 where they fit (as the bounds pass them), else int64."""

GREEDY_BLOCKS = 8192
"""How many of the largest blocks greedy by size places (its cost: this many numpy passes)."""
BOTH_UP_TO = 50_000
"""Up to this many blocks both heuristics run and the lower peak is kept; above it greedy by
size alone (each sweep costs about 2.5 us a block: a replay's bounds stay well under its load
time). Greedy by size is the one that wins on the large traces measured (module docstring)."""
BEST_FIT = "best fit in start order"
GREEDY_BY_SIZE = "greedy by size, then best fit in start order"
_SHIFT = 64
"""A free gap is kept as one int, its length shifted above its offset: ints sort by length,
then offset, so ``bisect`` finds the best fit (offsets are below 2**63)."""
_MASK = (1 << _SHIFT) - 1
_TRIES = 8
"""Gaps tried, smallest first, for a block that must keep clear of large blocks still to come."""
_CHUNK = 1 << 16
"""Blocks turned into Python lists at a time by the sweeps."""
_FEW = 32
"""Ranges to keep clear of up to which plain lists beat numpy (:func:`_clear_of`)."""
_NEVER = 1 << 63
"""A time after every block's start."""


@dataclass(frozen=True)
class Plan:
    """A placement of blocks.

    Attributes
    ----------
    offsets : ndarray of int64
        Each block's offset in bytes from the bottom of the arena.
    peak_bytes : int
        The highest address used: ``max(offsets + sizes)`` (0 without blocks).
    algorithm : str
        The heuristic whose placement this is: :data:`BEST_FIT` or :data:`GREEDY_BY_SIZE`.
    """

    offsets: Int64Array
    peak_bytes: int
    algorithm: str


def plan(
    start: npt.ArrayLike,
    end: npt.ArrayLike,
    size: npt.ArrayLike,
    *,
    greedy_blocks: int = GREEDY_BLOCKS,
) -> Plan:
    """Place blocks with known lifetimes at offsets, keeping the peak low (see the module).

    Parameters
    ----------
    start, end : array_like of int
        Each block's lifetime ``[start, end)`` in any integer time unit (event indices);
        integer arrays are used as they are (int32 saves memory).
    size : array_like of int
        Each block's bytes.
    greedy_blocks : int
        How many of the largest blocks greedy by size places (default :data:`GREEDY_BLOCKS`).

    Returns
    -------
    Plan
        The lower-peak placement of the two heuristics (best fit on a tie); above
        :data:`BOTH_UP_TO` blocks, greedy by size's.

    Raises
    ------
    ValueError
        If the arrays differ in length or are not integers, a size is not positive, a
        lifetime is empty (``end <= start``), the sizes add up to 2**63 or more (offsets
        would overflow: :func:`plannable`), or ``greedy_blocks`` is negative.
    """
    starts, ends = np.asarray(start), np.asarray(end)
    sizes = np.asarray(size, dtype=np.int64)
    n = len(sizes)
    if not len(starts) == len(ends) == n:
        raise ValueError(f"start, end and size differ in length: {len(starts)}, {len(ends)}, {n}")
    if not n:
        return Plan(np.zeros(0, dtype=np.int64), 0, BEST_FIT)
    if not (np.issubdtype(starts.dtype, np.integer) and np.issubdtype(ends.dtype, np.integer)):
        raise ValueError(f"start and end must be integers, got {starts.dtype} and {ends.dtype}")
    if int(sizes.min()) <= 0 or bool(np.any(ends <= starts)):
        raise ValueError("every block needs a positive size and a lifetime with end > start")
    if not plannable(sizes):
        raise ValueError("the sizes add up to 2**63 bytes or more")
    if greedy_blocks < 0:
        raise ValueError(f"greedy_blocks must be >= 0, got {greedy_blocks}")
    return min(_placements(starts, ends, sizes, greedy_blocks), key=lambda p: p.peak_bytes)


def plannable(size: Int64Array) -> bool:
    """Whether blocks of these sizes can be planned: they add up to less than 2**63 bytes."""
    if not len(size) or int(size.max()) < (1 << 63) // len(size):
        return True
    return bool(sum(size.tolist()) < 1 << 63)


def _placements(start: Times, end: Times, size: Int64Array, k: int) -> list[Plan]:
    """The placement of each heuristic, best fit first, greedy by size placing the ``k``
    largest blocks (checked arrays, at least one block); greedy by size alone above
    :data:`BOTH_UP_TO` blocks."""
    largest = _largest(start, size, k)  # first: its sorts' memory is free before the sweeps
    plans: list[tuple[Int64Array, str]] = []
    if len(size) <= BOTH_UP_TO:
        best_fit = np.zeros(len(size), dtype=np.int64)
        _best_fit_in_start_order(start, end, size, best_fit, np.zeros(len(size), dtype=np.bool_))
        plans.append((best_fit, BEST_FIT))
    greedy = np.zeros(len(size), dtype=np.int64)
    greedy[largest] = _greedy_by_size(start[largest], end[largest], size[largest])
    fixed = np.zeros(len(size), dtype=np.bool_)
    fixed[largest] = True
    _best_fit_in_start_order(start, end, size, greedy, fixed)
    plans.append((greedy, GREEDY_BY_SIZE))
    return [Plan(placed, int((placed + size).max()), algorithm) for placed, algorithm in plans]


def _largest(start: Times, size: Int64Array, k: int) -> npt.NDArray[np.intp]:
    """The ``k`` (>= 0) largest blocks, largest first (ties: the earlier start first)."""
    candidates = np.arange(len(size))
    if 0 < k < len(size):  # only those at least as large as the k-th largest need sorting
        kth = len(size) - k
        candidates = np.flatnonzero(size >= np.partition(size, kth)[kth])
    return candidates[np.lexsort((start[candidates], -size[candidates]))][:k]


def _greedy_by_size(start: Times, end: Times, size: Int64Array) -> Int64Array:
    """Offsets of blocks given largest first, each in the smallest gap its overlappers leave."""
    offsets = np.empty(len(size), dtype=np.int64)
    tops = np.empty(len(size), dtype=np.int64)
    rows = zip(start.tolist(), end.tolist(), size.tolist(), strict=True)
    for i, (lo_time, hi_time, nbytes) in enumerate(rows):
        overlapping = np.flatnonzero((start[:i] < hi_time) & (end[:i] > lo_time))
        offset = 0
        if len(overlapping):
            by_offset = overlapping[np.argsort(offsets[overlapping], kind="stable")]
            lows = offsets[by_offset]
            highs = np.maximum.accumulate(tops[by_offset])
            free_from = np.concatenate(([0], highs[:-1]))  # where the gap below each begins
            gaps = lows - free_from
            fits = np.flatnonzero(gaps >= nbytes)
            offset = int(free_from[fits[np.argmin(gaps[fits])]] if len(fits) else highs[-1])
        offsets[i] = offset
        tops[i] = offset + nbytes
    return offsets


class _FreeSpace:
    """The free address ranges of an unbounded arena: gaps below ``top``, everything above it.

    Gaps are maximal (each ends where a live block begins) and are kept three ways: by
    length then offset (``keys``, for the best fit), by offset (``starts``, for the gap that
    holds an address) and by both ends (``end_of``, ``start_of``, for merging).
    """

    __slots__ = ("end_of", "keys", "start_of", "starts", "top")

    def __init__(self) -> None:
        self.keys: list[int] = []
        self.starts: list[int] = []
        self.end_of: dict[int, int] = {}
        self.start_of: dict[int, int] = {}
        self.top = 0

    def _add(self, lo: int, hi: int) -> None:
        self.end_of[lo] = hi
        self.start_of[hi] = lo
        bisect.insort(self.keys, (hi - lo) << _SHIFT | lo)
        bisect.insort(self.starts, lo)

    def _remove(self, lo: int) -> int:
        hi = self.end_of.pop(lo)
        del self.start_of[hi]
        del self.keys[bisect.bisect_left(self.keys, (hi - lo) << _SHIFT | lo)]
        del self.starts[bisect.bisect_left(self.starts, lo)]
        return hi

    def release(self, lo: int, hi: int) -> None:
        """Free ``[lo, hi)``, merging it with the gaps on either side (updated in place)."""
        keys = self.keys
        below = self.start_of.pop(lo, None)  # the gap [below, lo), if any
        above = self.end_of.pop(hi, None)  # the gap [hi, above), if any
        if below is not None:
            del keys[bisect.bisect_left(keys, (lo - below) << _SHIFT | below)]
            lo = below
        if above is not None:
            del keys[bisect.bisect_left(keys, (above - hi) << _SHIFT | hi)]
            where = bisect.bisect_left(self.starts, hi)
            if below is None:
                self.starts[where] = lo  # keeps its place: no gap starts in [lo, hi)
            else:
                del self.starts[where]
            hi = above
        elif hi == self.top:  # (a gap never ends at top)
            if below is not None:
                del self.end_of[lo]
                del self.starts[bisect.bisect_left(self.starts, lo)]
            self.top = lo
            return
        elif below is None:
            bisect.insort(self.starts, lo)
        self.end_of[lo] = hi
        self.start_of[hi] = lo
        bisect.insort(keys, (hi - lo) << _SHIFT | lo)

    def take(self, lo: int, hi: int) -> None:
        """Occupy ``[lo, hi)``, which must be free: inside one gap, or at or above ``top``."""
        if lo >= self.top:
            if lo > self.top:
                self._add(self.top, lo)
            self.top = hi
            return
        gap_lo = self.starts[bisect.bisect_right(self.starts, lo) - 1]
        gap_hi = self._remove(gap_lo)
        if gap_lo < lo:
            self._add(gap_lo, lo)
        if hi < gap_hi:
            self._add(hi, gap_hi)

    def take_best_fit(self, nbytes: int) -> int:
        """Occupy ``nbytes`` at the low end of the smallest gap that holds them, else at ``top``;
        return the offset. (``take`` with the gap known: the common case, kept short.)"""
        keys = self.keys
        k = bisect.bisect_left(keys, nbytes << _SHIFT)
        if k == len(keys):
            lo = self.top
            self.top = lo + nbytes
            return lo
        key = keys[k]
        lo = key & _MASK
        rest = (key >> _SHIFT) - nbytes
        del keys[k]
        hi = self.end_of.pop(lo)
        if rest:
            bisect.insort(keys, rest << _SHIFT | (lo + nbytes))
            self.end_of[lo + nbytes] = hi
            self.start_of[hi] = lo + nbytes
            self.starts[bisect.bisect_left(self.starts, lo)] = lo + nbytes  # keeps its place
        else:
            del self.start_of[hi]
            del self.starts[bisect.bisect_left(self.starts, lo)]
        return lo

    def best_fits(self, nbytes: int) -> list[tuple[int, int]]:
        """The gaps that hold ``nbytes``, smallest first (at most ``_TRIES``), as (lo, hi)."""
        k = bisect.bisect_left(self.keys, nbytes << _SHIFT)
        return [(key & _MASK, (key & _MASK) + (key >> _SHIFT)) for key in self.keys[k : k + _TRIES]]


def _best_fit_in_start_order(
    start: Times,
    end: Times,
    size: Int64Array,
    offsets: Int64Array,
    fixed: npt.NDArray[np.bool_],
) -> None:
    """Sweep time: blocks not ``fixed`` go best fit as they start; ``fixed`` ones keep
    ``offsets``. The others' offsets are written into ``offsets``.

    A block goes at the low end of the smallest gap that holds it, or of one of the next
    smallest (either end) where a fixed block starting during its lifetime needs the low
    end; else on top, above such fixed blocks. At one moment, blocks end before any starts.
    """
    later = np.flatnonzero(fixed)
    later = later[np.argsort(start[later], kind="stable")]
    later_start = start[later]
    later_lo = offsets[later]
    later_hi = later_lo + size[later]
    ending = _ending(end, size)
    stop, ends_at, freed = next(ending)
    space = _FreeSpace()
    live: dict[int, int] = {}
    in_order = bool(np.all(start[1:] >= start[:-1]))  # as the bounds give them: no sort
    by_start = None if in_order else np.argsort(start, kind="stable")
    for lo_block in range(0, len(size), _CHUNK):
        hi_block = min(len(size), lo_block + _CHUNK)
        blocks = np.arange(lo_block, hi_block) if by_start is None else by_start[lo_block:hi_block]
        born_at = start[blocks]
        # the fixed blocks that start while each lives (or with it, placed yet or not)
        first = np.searchsorted(later_start, born_at)
        last = np.searchsorted(later_start, end[blocks])
        rows = zip(
            blocks.tolist(),
            born_at.tolist(),
            size[blocks].tolist(),
            fixed[blocks].tolist(),
            first.tolist(),
            last.tolist(),
            strict=True,
        )
        new_blocks: list[int] = []
        new_offsets: list[int] = []
        for block, born, nbytes, is_fixed, first_later, last_later in rows:
            while ends_at <= born:
                lo = live.pop(stop)
                space.release(lo, lo + freed)
                stop, ends_at, freed = next(ending)
            if is_fixed:
                lo = live[block] = int(offsets[block])
                space.take(lo, lo + nbytes)
                continue
            if first_later == last_later:  # none: the plain best fit
                lo = space.take_best_fit(nbytes)
            else:
                window = slice(first_later, last_later)
                lo = _clear_of(space, nbytes, later_lo[window], later_hi[window])
                space.take(lo, lo + nbytes)
            live[block] = lo
            new_blocks.append(block)
            new_offsets.append(lo)
        offsets[new_blocks] = new_offsets


def _ending(end: Times, size: Int64Array) -> Iterator[tuple[int, int, int]]:
    """``(block, end, bytes)`` in order of ``end``, a chunk of lists at a time; then one that
    never comes (end beyond every start)."""
    by_end = np.argsort(end, kind="stable")
    for lo in range(0, len(end), _CHUNK):
        blocks = by_end[lo : lo + _CHUNK]
        yield from zip(blocks.tolist(), end[blocks].tolist(), size[blocks].tolist(), strict=True)
    yield -1, _NEVER, 0


def _clear_of(space: _FreeSpace, nbytes: int, lows: Int64Array, highs: Int64Array) -> int:
    """A free offset for ``nbytes`` whose range meets none of ``[lows, highs)`` (blocks to come).

    The ends of the smallest gaps that hold it first, else the lowest offset from ``top`` up.
    Up to :data:`_FEW` ranges as plain lists (a numpy call costs more than checking a few),
    more with numpy (:func:`_clear_of_many`).
    """
    candidates = [
        lo for gap_lo, gap_hi in space.best_fits(nbytes) for lo in (gap_lo, gap_hi - nbytes)
    ]
    if len(lows) > _FEW:
        return _clear_of_many(candidates, space.top, nbytes, lows, highs)
    ranges = list(zip(lows.tolist(), highs.tolist(), strict=True))
    for lo in candidates:
        if not any(low < lo + nbytes and high > lo for low, high in ranges):
            return lo
    lo = space.top
    while True:  # the lowest clear offset: each step jumps past every range it meets
        hits = [high for low, high in ranges if low < lo + nbytes and high > lo]
        if not hits:
            return lo
        lo = max(hits)


def _clear_of_many(
    candidates: list[int], top: int, nbytes: int, lows: Int64Array, highs: Int64Array
) -> int:
    """:func:`_clear_of` for many ranges: the first of ``candidates`` clear of all of them,
    else the lowest clear offset from ``top`` up (where the ranges above ``top``, merged in
    order of ``lows``, first leave a gap of ``nbytes``, else above the highest)."""
    if candidates:
        tried = np.array(candidates, dtype=np.int64)[:, np.newaxis]
        meets = (lows < tried + nbytes) & (highs > tried)
        clear = np.flatnonzero(~meets.any(axis=1))
        if len(clear):
            return candidates[int(clear[0])]
    above = highs > top  # (the others end below any offset from top up)
    lows, highs = lows[above], highs[above]
    if not len(lows):
        return top
    by_low = np.argsort(lows, kind="stable")
    ends = np.maximum.accumulate(highs[by_low])  # the highest end so far, above top
    free_from = np.concatenate(([top], ends[:-1]))  # where the gap below each range begins
    fits = np.flatnonzero(lows[by_low] - free_from >= nbytes)
    return int(free_from[fits[0]] if len(fits) else ends[-1])
