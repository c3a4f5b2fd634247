"""The data of a memory picture: every allocation as compact columns, OOMs, segment maps.

A trace of ``E`` events has ``E + 1`` *states*: state 0 is before the first event and state
``s`` is after event ``s - 1``. Each allocation is live from state ``start`` (the state after
its alloc event; 0 for a block live when recording began) up to, not including, state ``end``
(the state after its free; ``E + 1`` if never freed). Allocations are numbered in the order
they are stacked: older ones lower.
"""

from __future__ import annotations

import array
import itertools
import json
import operator
import os
from collections import defaultdict
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, cast

import numpy as np
import numpy.typing as npt

from .._gc import collector_paused
from .._units import format_bytes
from ..memory.history._history import SegmentInfo
from ..trace._columns import OP_ALLOC, OP_EMPTY_CACHE, OP_FREE, _signed
from ..trace._format import Trace, _lines_of, _text_chunks
from ..trace._snapshot import devices_with_history, trace_from_snapshot
from ..trace._snapshot_schema import read_snapshot
from ._stacks import CleanStack, clean_stack

if TYPE_CHECKING:
    from ..replay import ReplayReport

__all__ = [
    "EVENT_ALLOC",
    "EVENT_EMPTY_CACHE",
    "EVENT_FREE",
    "EVENT_OOM",
    "LiveGroup",
    "RecordedDetails",
    "SnapshotPicture",
    "View",
    "end_state_view",
    "live_groups",
    "picture_moments",
    "recorded_details",
    "snapshot_details",
    "view_of_snapshot",
    "view_of_trace",
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
EVENT_ALLOC, EVENT_FREE, EVENT_EMPTY_CACHE, EVENT_OOM = 0, 1, 2, 3
_STATE_CODES = {"active_allocated": 0, "active_pending_free": 1, "inactive": 2}
_BY_ADDRESS = operator.itemgetter("address")
_FAILED_ADDR = 0
Int64Array = npt.NDArray[np.int64]


@dataclass(frozen=True)
class LiveGroup:
    """Live bytes at one state that share a stack frame or an op.

    Attributes
    ----------
    key : str
        The innermost Python frame of the allocations' stacks (``"function  file:line"``),
        or their op name, or ``"(no stack)"`` / ``"(no op)"``.
    bytes : int
        Their requested bytes together.
    count : int
        How many allocations.
    """

    key: str
    bytes: int
    count: int


@dataclass
class View:
    """The data of one picture; see the module notes for states and allocation order.

    Attributes
    ----------
    title : str
    events : int
        Number of trace events ``E`` (states run from 0 to ``E``).
    start, end, size, addr, stream : numpy.ndarray of int64
        One entry per allocation: first live state, first state no longer live, requested
        bytes, the address the recorded program saw, its stream.
    stack, op : numpy.ndarray of int64
        Index into ``stacks`` / ``ops`` per allocation, -1 for none.
    event_kind : numpy.ndarray of int64
        Per event: ``EVENT_ALLOC``, ``EVENT_FREE``, ``EVENT_EMPTY_CACHE`` or ``EVENT_OOM``
        (a recorded allocation that failed).
    event_alloc : numpy.ndarray of int64
        Per event: the allocation it allocates or frees, -1 for none.
    times : numpy.ndarray of float64 or None
        Per event: microseconds since the first event, where the input has timestamps.
    stacks : list of CleanStack
    ops : list of str
    ooms : list of dict
        ``{"event", "size", "free" (bytes or None), "reserved" (bytes or None), "stack"
        (index or -1), "source" ("recorded" or "replay")}``.
    moments : list of dict
        ``{"state": s, "segments": [[address, size, stream, expandable, [[bytes, state,
        allocation or -1], ...]], ...]}``; block states 0 allocated, 1 pending free, 2 free,
        3 unmapped.
    source : str
        Where the segment maps come from (a replay and its settings), empty if none.
    notes : list of str
        Why the drawn segment maps may differ from what the recorded program had.
    history : bool
        False for a snapshot recorded without allocation history: no events, the end state's
        allocated blocks as allocations live at state 0 and its segment map as the one moment.
    """

    title: str
    events: int
    start: Int64Array
    end: Int64Array
    size: Int64Array
    addr: Int64Array
    stream: Int64Array
    stack: Int64Array
    op: Int64Array
    event_kind: Int64Array
    event_alloc: Int64Array
    times: npt.NDArray[np.float64] | None = None
    stacks: list[CleanStack] = field(default_factory=list)
    ops: list[str] = field(default_factory=list)
    ooms: list[dict[str, Any]] = field(default_factory=list)
    moments: list[dict[str, Any]] = field(default_factory=list)
    source: str = ""
    notes: list[str] = field(default_factory=list)
    history: bool = True

    def totals(self) -> Int64Array:
        """Live requested bytes at each state (``events + 1`` values)."""
        delta = np.zeros(self.events + 2, dtype=np.int64)
        np.add.at(delta, self.start, self.size)
        np.add.at(delta, self.end, -self.size)
        return np.cumsum(delta[: self.events + 1])

    @property
    def peak_state(self) -> int:
        """The first state where live bytes are at their peak."""
        return int(np.argmax(self.totals())) if self.events >= 0 else 0

    @property
    def peak_bytes(self) -> int:
        """The peak of live requested bytes."""
        return int(self.totals().max(initial=0))

    def frame_groups(self) -> tuple[Int64Array, list[str]]:
        """Group the allocations by the frame that names their stack.

        Returns
        -------
        ids : numpy.ndarray of int64
            Per allocation: an index into ``names``, -1 for an allocation with no stack.
        names : list of str
            Each group's frame (:attr:`CleanStack.top`: the innermost Python frame, else the
            innermost C++ frame left after noise filtering), in order of first use.

        Notes
        -----
        Stacks that differ only below their top frame share a group, so there are at most as
        many groups as ``stacks``. The page colours and aggregates allocations by these groups.
        """
        names: list[str] = []
        index: dict[str, int] = {}
        of_stack = np.empty(len(self.stacks) + 1, dtype=np.int64)
        of_stack[-1] = -1  # stack -1: no stack
        for n, stack in enumerate(self.stacks):
            top = stack.top
            if top == "(no stack)":
                of_stack[n] = -1
                continue
            if top not in index:
                index[top] = len(names)
                names.append(top)
            of_stack[n] = index[top]
        return of_stack[self.stack], names

    def live_at(self, state: int) -> npt.NDArray[np.int64]:
        """The indices of the allocations live at ``state``."""
        return np.flatnonzero((self.start <= state) & (self.end > state)).astype(np.int64)


def live_groups(view: View, state: int, by: str = "frame", limit: int = 20) -> list[LiveGroup]:
    """Group what was live at ``state`` by stack frame or by op, largest first.

    Parameters
    ----------
    view : View
    state : int
        A state in ``[0, view.events]`` (``view.peak_state``; an OOM's ``event + 1``).
    by : str
        ``"frame"`` (the innermost Python frame, else the innermost kept C++ frame) or
        ``"op"``.
    limit : int
        At most this many groups; the rest are summed in a last ``"(N other groups)"`` one.

    Returns
    -------
    list of LiveGroup

    Raises
    ------
    ValueError
        If ``by`` is neither ``"frame"`` nor ``"op"``, or ``state`` is out of range.
    """
    if by not in ("frame", "op"):
        raise ValueError(f"by must be 'frame' or 'op', got {by!r}")
    if not 0 <= state <= view.events:
        raise ValueError(f"state {state} is out of range [0, {view.events}]")
    live = view.live_at(state)
    ids = view.stack[live] if by == "frame" else view.op[live]
    sums: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    for ident, nbytes in zip(ids.tolist(), view.size[live].tolist(), strict=True):
        if by == "frame":
            key = view.stacks[ident].top if ident >= 0 else "(no stack)"
        else:
            key = view.ops[ident] if ident >= 0 else "(no op)"
        sums[key][0] += nbytes
        sums[key][1] += 1
    groups = sorted((LiveGroup(k, b, c) for k, (b, c) in sums.items()), key=lambda g: -g.bytes)
    if len(groups) > limit:
        rest = groups[limit - 1 :]
        other = LiveGroup(
            f"({len(rest)} other groups)", sum(g.bytes for g in rest), sum(g.count for g in rest)
        )
        groups = [*groups[: limit - 1], other]
    return groups


def _failed_events(trace: Trace) -> Int64Array:
    """Event indices of a recording's failed requests (its ``oom`` entries)."""
    if trace.recording is None or not trace.recording.num_ooms:
        return np.zeros(0, dtype=np.int64)
    events = trace.events
    return np.flatnonzero((events.op == OP_ALLOC) & (events.addr == _FAILED_ADDR))


def _allocating(trace: Trace) -> npt.NDArray[np.bool_]:
    """Per event: whether it makes an allocation of the picture (an alloc of some bytes that
    did not fail)."""
    events = trace.events
    mask: npt.NDArray[np.bool_] = (events.op == OP_ALLOC) & (events.size != 0)
    mask[_failed_events(trace)] = False
    return mask


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


def _freed(addr: Int64Array, frees: npt.NDArray[np.bool_]) -> Int64Array:
    """Per item of a sequence of allocations and frees (``frees``) of addresses ``addr``: for a
    free, the position of the allocation it frees, the latest of its address before it if no
    free of that address came between (as a dict of live addresses has it); else -1."""
    order = np.argsort(addr, kind="stable")
    by_addr, is_free = addr[order], frees[order]
    hit = is_free[1:] & ~is_free[:-1] & (by_addr[1:] == by_addr[:-1])
    out = np.full(len(addr), -1, dtype=np.int64)
    out[order[1:][hit]] = order[:-1][hit]
    return out


# --------------------------------------------------------------------------- building


_Cleaned = tuple[Any, tuple[str, ...], tuple[str, ...], int]
"""A frame and what it adds to its stack (:func:`clean_stack` of it alone): Python lines, C++
lines, hidden frames; the frame is held so that its identity is not another's."""
_PYTHON_LINES, _NATIVE_LINES, _HIDDEN = (operator.itemgetter(n) for n in (1, 2, 3))
_CLEANED_FRAMES = 1 << 16
"""About the most frame dicts :class:`_Stacks` remembers cleaned (then it forgets them all):
PyTorch's snapshots share a few thousand among all their stacks."""


_FRAME_CONTENT = operator.itemgetter("name", "filename", "line")


def _content_key(frames: list[Any]) -> Any:
    """The names, files and lines of the dict frames of ``frames``, three after three; the
    identity of ``frames`` where one of them cannot be hashed (a stack of its own)."""
    try:  # every frame a dict with all three (as PyTorch writes them): at C speed
        key = tuple(itertools.chain.from_iterable(map(_FRAME_CONTENT, frames)))
    except (KeyError, TypeError):
        key = tuple(
            value
            for f in frames
            if type(f) is dict
            for value in (f.get("name"), f.get("filename"), f.get("line"))
        )
    try:
        hash(key)
    except TypeError:
        return id(frames)
    return key


class _Stacks:
    """The distinct recorded stacks of a picture, each cleaned once (:func:`clean_stack`).

    A stack is found first as the stack first seen with the same length and the same frame
    dicts at a quarter, half and three quarters of the way (PyTorch's pickles hold one dict
    per distinct frame, shared by every stack it is in, so comparing two equal stacks is a
    walk of identical pointers), else by the identities of all its frame dicts, else by the
    frames' names, files and lines: each costs one pass over its frames, however many stacks
    share frames. The identities stay valid while the frames are alive: an instance lives no
    longer than what it reads.
    """

    def __init__(self) -> None:
        self.stacks: list[CleanStack] = []
        self._by_frames: dict[Any, int] = {}
        self._by_ids: dict[bytes, int] = {}
        self._lines: dict[str, str] = {}
        self._cleaned: dict[int, _Cleaned] = {}  # by the identity of the frame
        self._first: dict[tuple[int, ...], tuple[list[Any], int]] = {}

    def intern(self, frames: Any) -> int:
        """The index in ``stacks`` of the stack of ``frames`` (added if new); -1 for none."""
        if not isinstance(frames, list) or not frames:
            return -1
        n = len(frames)
        key = (n, id(frames[n >> 2]), id(frames[n >> 1]), id(frames[-1 - (n >> 2)]))
        first = self._first.get(key)
        if first is not None and first[0] == frames:
            return first[1]
        ids = array.array("Q", map(id, frames)).tobytes()
        ident = self._by_ids.get(ids)
        if ident is None:
            ident = self._by_ids[ids] = self._by_content(frames)
        if first is None:
            self._first[key] = (frames, ident)
        return ident

    def _by_content(self, frames: list[Any]) -> int:
        key = _content_key(frames)
        ident = self._by_frames.get(key)
        if ident is None:
            ident = self._by_frames[key] = self.add(frames)
        return ident

    def add(self, frames: Any) -> int:
        """Add the stack of ``frames`` as a stack of its own; return its index.

        :func:`clean_stack` cleans a stack frame by frame, so a stack is put together from its
        frames cleaned one at a time (``clean_stack([frame])``), each frame dict once however
        many stacks hold it (while at most about ``_CLEANED_FRAMES`` are remembered), and each
        line is held once however many stacks show it.
        """
        frames = frames if isinstance(frames, list) else []
        known = list(map(self._cleaned.get, map(id, frames)))
        cleaned = cast("list[_Cleaned]", known) if all(known) else self._clean(frames)
        python = tuple(itertools.chain.from_iterable(map(_PYTHON_LINES, cleaned)))
        native = tuple(itertools.chain.from_iterable(map(_NATIVE_LINES, cleaned)))
        self.stacks.append(CleanStack(python, native, sum(map(_HIDDEN, cleaned))))
        return len(self.stacks) - 1

    def _clean(self, frames: list[Any]) -> list[_Cleaned]:
        """Clean the frames of ``frames`` not cleaned yet; return what each adds to a stack."""
        cleaned = self._cleaned
        if len(cleaned) + len(frames) > _CLEANED_FRAMES:
            cleaned.clear()
        line = self._lines.setdefault
        for frame in frames:
            if id(frame) not in cleaned:
                one = clean_stack([frame])
                python = tuple(map(line, one.python, one.python))
                native = tuple(map(line, one.native, one.native))
                cleaned[id(frame)] = (frame, python, native, one.hidden)
        return [cleaned[id(frame)] for frame in frames]


@dataclass(frozen=True)
class RecordedDetails:
    """What the picture of a snapshot's device takes from its entries and end segments.

    Made by :func:`recorded_details` (or :func:`snapshot_details`) before the history is
    replayed, so that the entries, a dict each and most of a decoded snapshot's memory, need
    not be kept while the replay and the picture are made.

    Attributes
    ----------
    stacks : list of CleanStack
        The distinct stacks of the blocks live at the start, of the allocations, then (one
        each) of the recorded OOMs' requests.
    start_stack : numpy.ndarray of int64
        Per block live at the start, in ``trace.recording.start_segments`` order: the stack the
        end state shows at its address (an index into ``stacks``), -1 for none.
    event_stack : numpy.ndarray of int64
        Per event: the stack of the allocation it makes, -1 for none.
    times : numpy.ndarray of float64 or None
        Per event: microseconds since the first, where every event's entry has ``time_us``.
    ooms : list of dict
        Per recorded ``oom`` entry, in order: ``{"size", "free" (bytes or None), "reserved"
        (what PyTorch held then), "stack" (index or -1)}``.
    """

    stacks: list[CleanStack]
    start_stack: Int64Array
    event_stack: Int64Array
    times: npt.NDArray[np.float64] | None
    ooms: list[dict[str, Any]]


def _start_blocks(trace: Trace) -> list[tuple[int, int, int]]:
    """``(address, requested bytes, stream)`` of each block live when recording began."""
    segments = trace.recording.start_segments if trace.recording is not None else ()
    return [
        (b.address, b.requested_size, s.stream)
        for s in segments
        for b in s.blocks
        if b.requested_size > 0
    ]


def recorded_details(
    trace: Trace,
    entries: Sequence[Any] | None = None,
    end_segments: Sequence[dict[str, Any]] = (),
) -> RecordedDetails:
    """Take what a picture shows from a snapshot device's entries and end segments.

    Parameters
    ----------
    trace : Trace
        The device's trace (:func:`~accelrt.trace._snapshot.trace_from_snapshot`).
    entries : sequence of dict, optional
        The snapshot's ``device_traces[i]`` for the device: stacks, timestamps, recorded OOMs.
    end_segments : sequence of dict, optional
        The snapshot's segments of the device: the stacks of blocks live since before
        recording began.

    Returns
    -------
    RecordedDetails
        Nothing in it refers to ``entries`` or ``end_segments``.
    """
    stacks = _Stacks()
    end_frames = {
        blk["address"]: blk.get("frames")
        for seg in end_segments
        for blk in seg.get("blocks", ())
        if isinstance(blk, dict) and blk.get("state") == "active_allocated"
    }
    start_stack = [stacks.intern(end_frames.get(address)) for address, _, _ in _start_blocks(trace)]
    n_events = len(trace.events)
    event_stack = np.full(n_events, -1, dtype=np.int64)
    times = None
    per_event = _entries_by_event(entries, n_events) if entries is not None else None
    if per_event is not None:
        rows = np.flatnonzero(_allocating(trace)).tolist()
        event_stack[rows] = [stacks.intern(per_event[i].get("frames")) for i in rows]
        times = _times([e.get("time_us") for e in per_event], 1.0)
    ooms = []
    if entries is not None and trace.recording is not None and trace.recording.num_ooms:
        ooms = _recorded_ooms(entries, trace.recording.reserved_at_start_bytes, stacks)
    return RecordedDetails(
        stacks.stacks, np.asarray(start_stack, dtype=np.int64), event_stack, times, ooms
    )


def snapshot_details(snapshot: dict[str, Any], trace: Trace) -> RecordedDetails:
    """The :func:`recorded_details` of the device of ``trace`` in ``snapshot``.

    Parameters
    ----------
    snapshot : dict
        A snapshot (:func:`~accelrt.trace._snapshot_schema.read_snapshot`).
    trace : Trace
        One of its devices' traces; without a recording (not a snapshot's), no details.

    Returns
    -------
    RecordedDetails
    """
    if trace.recording is None:
        return recorded_details(trace)
    device = trace.recording.device
    return recorded_details(
        trace,
        snapshot["device_traces"][device],
        [s for s in snapshot["segments"] if s.get("device", 0) == device],
    )


def _entries_by_event(entries: Sequence[Any], n_events: int) -> list[Any] | None:
    """The snapshot entry behind each trace event (as ``trace_from_snapshot`` made them), or
    None where they do not line up with the ``n_events`` events."""
    out: list[Any] = []
    previous = ""
    release_run: int | None = None
    for entry in entries:
        if type(entry) is not dict:
            continue
        action = entry.get("action")
        if action in ("alloc", "free_requested"):
            out.append(entry)
            release_run = None
        elif action in ("segment_free", "segment_unmap"):
            if previous not in ("segment_free", "segment_unmap"):
                release_run = len(out)
                out.append(entry)
        elif action == "oom":
            if release_run is not None:
                out[release_run] = entry
            else:
                out.append(entry)
            release_run = None
        previous = str(action)
    return out if len(out) == n_events else None


def _times(values: list[Any], scale: float) -> npt.NDArray[np.float64] | None:
    """``values`` (timestamps) less the first, times ``scale``; None unless all are numbers."""
    if not values:
        return None
    if not {type(v) for v in values} <= {int, float} and not all(
        isinstance(v, (int, float)) and not isinstance(v, bool) for v in values
    ):
        return None
    times = np.asarray(values, dtype=np.float64)
    since: npt.NDArray[np.float64] = (times - times[0]) * scale
    return since


def _recorded_ooms(entries: Sequence[Any], reserved: int, stacks: _Stacks) -> list[dict[str, Any]]:
    """The snapshot's ``oom`` entries with the reserved bytes PyTorch held then, starting from
    ``reserved`` when recording began; each request's stack added to ``stacks``."""
    ooms = []
    for entry in entries:
        if type(entry) is not dict:
            continue
        action = entry.get("action")
        if action in ("segment_alloc", "segment_map"):
            reserved += int(entry.get("size", 0))
        elif action in ("segment_free", "segment_unmap"):
            reserved -= int(entry.get("size", 0))
        elif action == "oom":
            free = entry.get("device_free")
            frames = entry.get("frames")
            ooms.append(
                {
                    "size": int(entry.get("size", 0)),
                    "free": free if isinstance(free, int) else None,
                    "reserved": reserved,
                    "stack": stacks.add(frames) if frames else -1,  # the failed request's own
                }
            )
    return ooms


def _jsonl_extras(trace: Trace) -> tuple[list[Any], list[Any]] | None:
    """``op`` and ``t`` of each event of a JSONL trace, read again from its file.

    None when the file is gone, is not JSONL or does not line up with ``trace.events``.
    """
    if trace.path is None or trace.recording is not None or not os.path.isfile(trace.path):
        return None
    ops: list[Any] = []
    times: list[Any] = []
    header = True
    try:
        for chunk in _text_chunks(trace.path):
            for line in _lines_of(chunk.data):
                if not line.strip():
                    continue
                if header:
                    header = False
                    continue
                obj = json.loads(line)
                if (
                    obj.get("action") != "empty_cache"
                    and obj.get("host")
                    and not trace.include_host
                ):
                    continue
                ops.append(obj.get("op"))
                t = obj.get("t")
                times.append(t if isinstance(t, (int, float)) and not isinstance(t, bool) else None)
    except (OSError, ValueError):
        return None
    if len(ops) != len(trace.events):
        return None
    return ops, times


def _build(trace: Trace, details: RecordedDetails | None) -> View:
    """The allocation columns of ``trace``; stacks and times from ``details`` (a snapshot's)
    or, for a JSONL trace, ops and times read again from its file."""
    events = trace.events
    n_events = len(events)
    start_blocks = _start_blocks(trace)
    pre_live = len(start_blocks)
    if details is not None and (
        len(details.event_stack) != n_events or len(details.start_stack) != pre_live
    ):
        raise ValueError("the recorded details are of another trace: make them from this one")
    kind = np.full(n_events, EVENT_EMPTY_CACHE, dtype=np.int64)
    kind[events.op == OP_ALLOC] = EVENT_ALLOC
    kind[events.op == OP_FREE] = EVENT_FREE
    kind[_failed_events(trace)] = EVENT_OOM
    allocating = _allocating(trace)
    new = np.flatnonzero(allocating)
    count = pre_live + len(new)
    alloc_of = np.full(n_events, -1, dtype=np.int64)
    alloc_of[new] = np.arange(pre_live, count)
    # an allocation lives until the free of its address (a block live when recording began:
    # an allocation before the first event)
    walk = np.flatnonzero(allocating | (events.op == OP_FREE))
    partner = _freed(
        np.concatenate([np.asarray([a for a, _, _ in start_blocks], np.int64), events.addr[walk]]),
        np.concatenate([np.zeros(pre_live, dtype=np.bool_), events.op[walk] == OP_FREE]),
    )
    releases = np.flatnonzero(partner >= 0)
    freed = np.concatenate([np.arange(pre_live), alloc_of[walk]])[partner[releases]]
    freeing = walk[releases - pre_live]
    ends = np.full(count, n_events + 1, dtype=np.int64)
    ends[freed] = freeing + 1
    alloc_of[freeing] = freed

    def column(before: list[int], values: Any) -> Int64Array:
        return np.concatenate([np.asarray(before, dtype=np.int64), values]).astype(np.int64)

    stack = np.full(count, -1, dtype=np.int64)
    op = np.full(count, -1, dtype=np.int64)
    stacks: list[CleanStack] = []
    ops: list[str] = []
    times = None
    if details is not None:
        stacks = list(details.stacks)
        stack = column(details.start_stack.tolist(), details.event_stack[new])
        stack[:pre_live][ends[:pre_live] != n_events + 1] = -1  # the end state's stack is
        times = details.times  # only right for a block never freed
    else:
        extras = _jsonl_extras(trace)
        if extras is not None:
            op[pre_live:] = _op_ids([extras[0][i] for i in new.tolist()], ops)
            if all(t is not None for t in extras[1]):
                times = _times(extras[1], 1e-3)  # record_torch: ns
    return View(
        title=trace.name,
        events=n_events,
        start=column([0] * pre_live, new + 1),
        end=ends,
        size=column([s for _, s, _ in start_blocks], events.size[new]),
        addr=column([a for a, _, _ in start_blocks], events.addr[new]),
        stream=column([s for _, _, s in start_blocks], events.stream[new]),
        stack=stack,
        op=op,
        event_kind=kind,
        event_alloc=alloc_of,
        times=times,
        stacks=stacks,
        ops=ops,
    )


def _op_ids(names: list[Any], ops: list[str]) -> list[int]:
    """Per allocation, the index of its op in ``ops`` (added in order of first use, cut to 200
    characters), -1 for none."""
    index: dict[str, int] = {}
    out = []
    for name in names:
        if not isinstance(name, str) or not name:
            out.append(-1)
            continue
        ident = index.get(name)
        if ident is None:
            ident = index[name] = len(ops)
            ops.append(name[:200])
        out.append(ident)
    return out


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
        self.previous: dict[int, list[Any]] = {}

    def moment(
        self, state: int, segments: Sequence[SegmentInfo] | Sequence[dict[str, Any]]
    ) -> dict[str, Any]:
        view, sizes = self.view, self.sizes
        live = view.live_at(state)
        by_addr = dict(zip(view.addr[live].tolist(), live.tolist(), strict=True))
        # per requested size, the live allocations not yet looked at, oldest first: made when
        # an address does not match; a block whose address does not match takes the first
        # unused one, and (``used`` only grows) what it passes over is used for good
        by_size: dict[int, Iterator[int]] | None = None
        used: set[int] = set()
        out = []
        shown: dict[int, list[Any]] = {}
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
            row = [
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


def view_of_trace(
    trace: Trace,
    report: ReplayReport | None = None,
    *,
    title: str | None = None,
    entries: list[dict[str, Any]] | None = None,
    end_segments: Sequence[dict[str, Any]] = (),
    details: RecordedDetails | None = None,
) -> View:
    """Build the picture of a trace and, optionally, of a replay of it that already ran.

    Parameters
    ----------
    trace : Trace
        The trace (a PyTorch snapshot's: from its recorded start). A JSONL trace's ``op`` and
        ``t`` fields (``record_torch``) are read again from ``trace.path``.
    report : ReplayReport, optional
        Its replay, run with ``capture_at=picture_moments(trace)`` on whichever device, with
        whichever capacity and settings the user chose: the segment maps and replayed OOMs
        come from it. None: the timeline only.
    title : str, optional
        Default: the trace's name.
    entries : list of dict, optional
        A snapshot's ``device_traces[i]``: stacks, timestamps and recorded OOMs.
    end_segments : sequence of dict, optional
        A snapshot's segments of that device: stacks of blocks live since before recording.
    details : RecordedDetails, optional
        What :func:`recorded_details` took from ``entries`` and ``end_segments`` already
        (then neither is read): the entries need not be kept while the replay runs.

    Returns
    -------
    View

    Raises
    ------
    ValueError
        If ``report`` captured no segment map, or ``details`` are of another trace.
    """
    if report is not None and not report.segment_maps:
        raise ValueError(
            "the replay captured no segment map: run it with capture_at=picture_moments(trace)"
        )
    if details is None and (entries is not None or end_segments):
        details = recorded_details(trace, entries, end_segments)
    with collector_paused():  # no cycles among the columns and moments made here
        view = _build(trace, details)
        if title:
            view.title = title
        totals = view.totals()
        if details is not None:
            failed = np.flatnonzero(view.event_kind == EVENT_OOM).tolist()
            # the n-th oom entry is the n-th failed request
            for event, oom in zip(failed, details.ooms, strict=False):
                view.ooms.append(
                    {
                        "event": event,
                        "size": oom["size"],
                        "free": oom["free"],
                        "reserved": oom["reserved"],
                        "live": int(totals[event]),
                        "stack": oom["stack"],
                        "source": "recorded",
                    }
                )
        if report is None:
            return view
        _add_replayed_ooms(view, report, totals)
        moments = _Moments(view)
        view.moments = [moments.moment(i + 1, m) for i, m in sorted(report.segment_maps.items())]
    view.source = f"replay on {report.device} with {report.config}"
    view.notes = _replay_notes(report, trace)
    return view


def _add_replayed_ooms(view: View, report: ReplayReport, totals: Int64Array) -> None:
    """Add the OOMs of the replay that the recording does not list, in event order."""
    for oom in report.ooms:
        if view.event_kind[oom.event] == EVENT_OOM:
            continue  # a recorded OOM the replay also hit: listed once, as recorded
        view.ooms.append(
            {
                "event": oom.event,
                "size": oom.requested_bytes,
                "free": max(0, report.capacity_bytes - oom.reserved_bytes),
                "reserved": oom.reserved_bytes,
                "live": int(totals[oom.event]),
                "stack": int(view.stack[view.event_alloc[oom.event]])
                if view.event_alloc[oom.event] >= 0
                else -1,
                "source": "replay",
            }
        )
    replayed = {o.event for o in report.ooms}
    for listed in view.ooms:
        if listed["source"] == "recorded":
            listed["replayed"] = listed["event"] in replayed
    view.ooms.sort(key=lambda o: o["event"])


def _replay_notes(report: ReplayReport, trace: Trace) -> list[str]:
    notes = list(report.notes)
    recording = trace.recording
    if recording is None:
        return notes
    if report.peak_reserved_difference:
        notes.insert(
            0,
            f"the replay's peak reserved ({format_bytes(report.peak_reserved_bytes)}) differs "
            f"from what PyTorch recorded ({format_bytes(recording.peak_reserved_bytes)}, "
            f"{report.peak_reserved_difference:+.2%})",
        )
    if (
        any(s.is_expandable for s in recording.start_segments)
        or recording.settings.expandable_segments
    ):
        notes.append(
            "the recording used expandable segments: the segment map shows accelrt's replay of "
            "them (its pages and segment boundaries), not PyTorch's own mapping"
        )
    if recording.inconsistent_events:
        notes.append(
            f"{recording.inconsistent_events} recorded events could not be placed when rewinding, "
            "so the start state is approximate"
        )
    if report.start_state != "empty":  # began mid-run: say so, and how the start was built
        low, high = report.peak_reserved_low_bytes, report.peak_reserved_high_bytes
        spread = (
            ""
            if low is None or high is None
            else f"; peak reserved {format_bytes(low)} to {format_bytes(high)} depending on what "
            "the unrecorded part held"
        )
        notes.append(
            f"the recording started mid-run, with "
            f"{format_bytes(report.reserved_before_recording_bytes)} reserved before its first "
            f"event; start state {report.describe_start()}{spread}"
        )
    return notes


def view_of_snapshot(
    path: str | os.PathLike[str],
    *,
    device_index: int | None = None,
    moments: int | None = None,
    snapshot: dict[str, Any] | None = None,
) -> View:
    """Build the picture of a snapshot pickle (PyTorch's or accelrt's).

    With allocation history, the history is replayed exactly from its rewound start (so the
    segment map can be shown at any captured moment); without, the end state: its segment
    map, and the blocks allocated then (with their stacks) as what was live, nothing over time
    (``view.history`` is False).

    Parameters
    ----------
    path : str or path-like
    device_index : int, optional
        The recorded device (default: the only one with history, else 0).
    moments : int, optional
        About how many segment maps to capture (see :meth:`SnapshotPicture.draw`).
    snapshot : dict, optional
        The snapshot of ``path``, already read (:func:`~accelrt.trace.read_snapshot`): the
        file is not read again.

    Returns
    -------
    View

    Raises
    ------
    TraceFormatError
        For a pickle that is not a plain-data snapshot (nothing in it runs).
    """
    with collector_paused():  # a container per entry, no cycle among them
        if snapshot is None:
            snapshot = read_snapshot(path)
        picture = SnapshotPicture.take(path, snapshot, device_index)
        del snapshot  # (where this call read it) the picture holds what it shows
        return picture.draw(moments)


@dataclass(frozen=True)
class SnapshotPicture:
    """The picture of one device of a snapshot: what it shows, taken from the snapshot.

    :meth:`take` takes it; the snapshot (its entries, a dict each, are most of its memory) can
    then go before :meth:`draw` replays the history.

    Attributes
    ----------
    title : str
        The file's name without its last suffix.
    trace : Trace or None
        The device's trace; None for a device without allocation history.
    details : RecordedDetails or None
        What the picture takes from the device's entries and end segments.
    end_state : View or None
        For a device without history, its picture (:func:`end_state_view`), drawn already.
    """

    title: str
    trace: Trace | None = None
    details: RecordedDetails | None = None
    end_state: View | None = None

    @classmethod
    def take(
        cls,
        path: str | os.PathLike[str],
        snapshot: dict[str, Any],
        device_index: int | None = None,
    ) -> SnapshotPicture:
        """Take the picture of a device (default: the only one with history, else 0).

        Raises
        ------
        TraceFormatError
            As :func:`~accelrt.trace._snapshot.trace_from_snapshot`.
        """
        title = os.path.basename(os.fspath(path)).rsplit(".", 1)[0]
        has_history = devices_with_history(snapshot)
        if not has_history or (device_index is not None and device_index not in has_history):
            device = device_index or 0
            segments = [s for s in snapshot["segments"] if s.get("device", 0) == device]
            return cls(title, end_state=end_state_view(segments, title))
        trace = trace_from_snapshot(snapshot, device=device_index, path=os.fspath(path))
        return cls(title, trace, snapshot_details(snapshot, trace))

    def draw(
        self,
        moments: int | None = None,
        *,
        run: Callable[..., ReplayReport] | None = None,
    ) -> View:
        """Replay the history, capturing ``moments`` segment maps, and build the picture.

        Parameters
        ----------
        moments : int, optional
            About how many segment maps to capture; default: as :func:`picture_moments`
            spreads them (``DEFAULT_MOMENTS``, or fewer where the recording holds so many
            segments or allocations that the maps would hold more than ``CAPTURED_SEGMENTS``
            segments or ``CAPTURED_BLOCKS`` blocks together; at least ``MIN_MOMENTS``).
        run : callable, optional
            What replays the trace: called as ``run(trace, capture_at=...)`` (default
            :func:`accelrt.replay.replay`; e.g. one that shows progress).

        Returns
        -------
        View
        """
        if self.trace is None:
            assert self.end_state is not None
            return self.end_state
        if run is None:
            from ..replay import replay

            run = replay
        report = run(self.trace, capture_at=picture_moments(self.trace, moments))
        return view_of_trace(self.trace, report, title=self.title, details=self.details)


def end_state_view(segments: Sequence[dict[str, Any]], title: str) -> View:
    """The picture of a snapshot recorded without allocation history: its end state only.

    Parameters
    ----------
    segments : sequence of dict
        The snapshot's segments of one device.
    title : str

    Returns
    -------
    View
        No events (``view.history`` is False); each allocated block of the end state is an
        allocation live at state 0 (its requested bytes, address, stream and stack), and the
        one segment map is the end state's.
    """
    stacks = _Stacks()
    rows = [
        (
            blk.get("requested_size") or blk["size"],
            blk["address"],
            _signed(seg.get("stream", 0)),
            stacks.intern(blk.get("frames")),
        )
        for seg in sorted(segments, key=lambda s: s["address"])
        for blk in seg["blocks"]
        if blk["state"] == "active_allocated"
    ]
    columns = np.asarray(rows, dtype=np.int64).reshape(-1, 4).T
    size, addr, stream, stack = (np.ascontiguousarray(c) for c in columns)
    count = len(rows)
    empty = np.zeros(0, dtype=np.int64)
    view = View(
        title=title,
        events=0,
        start=np.zeros(count, dtype=np.int64),
        end=np.ones(count, dtype=np.int64),
        size=size,
        addr=addr,
        stream=stream,
        stack=stack,
        op=np.full(count, -1, dtype=np.int64),
        event_kind=empty,
        event_alloc=empty,
        stacks=stacks.stacks,
        history=False,
    )
    view.moments = [_Moments(view).moment(0, segments)]
    view.source = "the snapshot's end state (no allocation history recorded)"
    return view
