"""The moments a memory picture captures: after which events the replay keeps the segment
map (:func:`picture_moments`, bounded by what the maps hold together), and each map matched to
the picture's allocations (:class:`_Moments`)."""

from __future__ import annotations

import operator
from collections import defaultdict
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING

import numpy as np

from ..memory.history._history import SegmentInfo
from ..trace._columns import OP_EMPTY_CACHE, OP_FREE
from ..trace._format import Trace
from ..trace._snapshot_schema import FileSegment
from ._model import Moment, SegmentRow, View, _failed_events, _freed

if TYPE_CHECKING:
    pass


__all__ = [
    "CAPTURED_BLOCKS",
    "CAPTURED_SEGMENTS",
    "DEFAULT_MOMENTS",
    "MIN_MOMENTS",
    "picture_moments",
]

DEFAULT_MOMENTS = 240
"""How many evenly spread events a picture captures the segment map after (plus the peak and
every OOM)."""
CAPTURED_SEGMENTS = 150_000
"""About how many segments the segment maps a snapshot's picture captures hold together at
most: a recording with many segments gets fewer moments than ``DEFAULT_MOMENTS`` (each
captured segment costs about 3 microseconds and 1.5 KB while the replay runs)."""
CAPTURED_BLOCKS = 1_000_000
"""About how many allocated blocks the segment maps a picture captures hold together at most:
a trace that holds many allocations at once (a paged KV cache: 10^5 blocks of one size) gets
fewer moments than ``DEFAULT_MOMENTS`` (each captured block costs about 2 to 4 microseconds
while the replay runs and 1 more while the page's data is made), so that the capture grows
with the trace, not with its square."""
MIN_MOMENTS = 24
"""The fewest moments a picture captures by default, whatever its segments and blocks."""
_STATE_CODES = {"active_allocated": 0, "active_pending_free": 1, "inactive": 2}
_BY_ADDRESS = operator.itemgetter("address")


def picture_moments(trace: Trace, moments: int | None = None) -> list[int]:
    """Return the event indices after which a picture of ``trace`` shows the segment map.

    Pass them to ``accelrt.replay.replay(..., capture_at=...)``; the report then has what
    :func:`view_of_trace` draws.

    Parameters
    ----------
    trace : Trace
    moments : int, optional
        About this many indices, evenly spread, the last event included; plus the event of
        the peak of live bytes and every recorded OOM. ``[-1]`` (before the first event) for
        an empty trace. Default: ``DEFAULT_MOMENTS``, or fewer where the maps would hold more
        than ``CAPTURED_BLOCKS`` allocations (the most the trace holds at once, with a
        snapshot's blocks live at its start) or, a snapshot's, ``CAPTURED_SEGMENTS`` segments
        (the most of its start or end) together; at least ``MIN_MOMENTS``.

    Returns
    -------
    list of int
        Sorted event indices.

    Raises
    ------
    ValueError
        If ``moments`` is less than 1.
    """
    if moments is not None and moments < 1:
        raise ValueError(f"moments must be at least 1, got {moments}")
    events = trace.events
    n_events = len(events)
    if n_events == 0:
        return [-1]
    failed = _failed_events(trace)
    ops = events.op.copy()
    ops[failed] = OP_EMPTY_CACHE  # a failed request allocates nothing
    walk = np.flatnonzero(ops != OP_EMPTY_CACHE)
    frees = ops[walk] == OP_FREE
    sizes = events.size[walk]
    partner = _freed(events.addr[walk], frees)
    change = np.where(frees, 0, sizes)
    has = partner >= 0
    change[has] = -sizes[partner[has]]
    live = np.cumsum(change)
    if moments is None:
        made = (sizes != 0).astype(np.int64)  # allocations of no bytes make no block
        counted = np.where(frees, 0, made)
        counted[has] = -made[partner[has]]
        moments = _default_moments(trace, int(np.cumsum(counted).max(initial=0)))
    step = max(1, n_events // moments)
    chosen = {*range(step - 1, n_events, step), n_events - 1, -1}
    if len(live) and live.max() > 0:
        chosen.add(int(walk[np.argmax(live)]))  # the first event at the peak
    chosen.update(failed.tolist())
    return sorted(chosen)


def _default_moments(trace: Trace, peak_allocations: int) -> int:
    """How many moments :func:`picture_moments` spreads by default over ``trace``, whose events
    make at most ``peak_allocations`` allocations of some bytes that are live at once."""
    blocks, segments = peak_allocations, 1
    recording = trace.recording
    if recording is not None:  # with the blocks and segments it held when recording began
        start = recording.start_segments
        blocks += sum(1 for s in start for b in s.blocks if b.requested_size)
        segments = max(len(start), recording.segments_at_end, 1)
    moments = min(DEFAULT_MOMENTS, CAPTURED_BLOCKS // max(blocks, 1), CAPTURED_SEGMENTS // segments)
    return max(MIN_MOMENTS, moments)


def _unused_by_size(live: list[int], sizes: list[int]) -> dict[int, Iterator[int]]:
    """Per requested size, an iterator over the allocations of ``live`` of that size, in the
    order of ``live``: a block takes the first it yields that is not used yet, so that the
    matching of a moment costs one pass over ``live`` however many blocks share a size."""
    groups: dict[int, list[int]] = defaultdict(list)
    for i in live:
        groups[sizes[i]].append(i)
    return {size: iter(members) for size, members in groups.items()}


class _Moments:
    """Turns captured segment maps into the page's moments, allocated blocks tied to the
    allocations live then; a segment unchanged since the moment before is shared with it."""

    def __init__(self, view: View) -> None:
        self.view = view
        self.sizes = view.size.tolist()
        self.previous: dict[int, SegmentRow] = {}

    def moment(self, state: int, segments: Sequence[SegmentInfo | FileSegment]) -> Moment:
        view, sizes = self.view, self.sizes
        live = view.live_at(state)
        by_addr = dict(zip(view.addr[live].tolist(), live.tolist(), strict=True))
        # per requested size, the live allocations not yet looked at, oldest first: made when
        # an address does not match; a block whose address does not match takes the first
        # unused one, and (``used`` only grows) what it passes over is used for good
        by_size: dict[int, Iterator[int]] | None = None
        used: set[int] = set()
        out = []
        shown: dict[int, SegmentRow] = {}
        code_of, owner_at = _STATE_CODES.get, by_addr.get
        for seg in sorted(segments, key=_BY_ADDRESS):
            blocks: list[list[int]] = []
            add = blocks.append
            for blk in seg["blocks"]:
                code = code_of(blk["state"], 2)
                requested = blk.get("requested_size", 0)
                if code == 2:
                    if requested >= 0:
                        add([blk["size"], 2, -1])  # free
                        continue
                    code = 3  # unmapped
                owner = owner_at(blk["address"], -1)
                if owner < 0 or owner in used or sizes[owner] != requested:
                    if by_size is None:
                        by_size = _unused_by_size(live.tolist(), sizes)
                    owner = next((i for i in by_size.get(requested, ()) if i not in used), -1)
                if owner >= 0:
                    used.add(owner)
                add([blk["size"], code, owner])
            row: SegmentRow = [
                seg["address"],
                seg["total_size"],
                seg.get("stream", 0),
                int(bool(seg.get("is_expandable"))),
                blocks,
            ]
            before = self.previous.get(row[0])
            row = before if before == row else row
            shown[row[0]] = row
            out.append(row)
        self.previous = shown
        return {"state": state, "segments": out}
