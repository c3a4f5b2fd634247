"""The data of a memory picture: every allocation as compact columns, OOMs, segment maps.

A trace of ``E`` events has ``E + 1`` *states*: state 0 is before the first event and state
``s`` is after event ``s - 1``. Each allocation is live from state ``start`` (the state after
its alloc event; 0 for a block live when recording began) up to, not including, state ``end``
(the state after its free; ``E + 1`` if never freed). Allocations are numbered in the order
they are stacked: older ones lower.
"""

from __future__ import annotations

import gzip
import io
import json
import os
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt

from .._units import format_bytes
from ..memory._history import SegmentInfo
from ..trace._format import Trace
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
    "View",
    "live_groups",
    "picture_moments",
    "view_of_snapshot",
    "view_of_trace",
]

DEFAULT_MOMENTS = 240
"""How many evenly spread events a picture captures the segment map after (plus the peak and
every OOM)."""
EVENT_ALLOC, EVENT_FREE, EVENT_EMPTY_CACHE, EVENT_OOM = 0, 1, 2, 3
_STATE_CODES = {"active_allocated": 0, "active_pending_free": 1, "inactive": 2}
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


def _failed_events(trace: Trace) -> list[int]:
    """Event indices of a recording's failed requests (its ``oom`` entries)."""
    if trace.recording is None or not trace.recording.num_ooms:
        return []
    return [i for i, e in enumerate(trace.events) if e[0] == "alloc" and e[1] == _FAILED_ADDR]


def picture_moments(trace: Trace, moments: int = DEFAULT_MOMENTS) -> list[int]:
    """Return the event indices after which a picture of ``trace`` shows the segment map.

    Pass them to ``accelrt.replay.replay(..., capture_at=...)``; the report then has what
    :func:`view_of_trace` draws.

    Parameters
    ----------
    trace : Trace
    moments : int
        About this many indices, evenly spread, the last event included; plus the event of
        the peak of live bytes and every recorded OOM. ``[-1]`` (before the first event) for
        an empty trace.

    Returns
    -------
    list of int
        Sorted event indices.

    Raises
    ------
    ValueError
        If ``moments`` is less than 1.
    """
    if moments < 1:
        raise ValueError(f"moments must be at least 1, got {moments}")
    n_events = len(trace.events)
    if n_events == 0:
        return [-1]
    step = max(1, n_events // moments)
    chosen = {*range(step - 1, n_events, step), n_events - 1, -1}
    live: dict[int, int] = {}
    now = peak = 0
    peak_at = -1
    failed = set(_failed_events(trace))
    for i, (action, addr, size, _stream) in enumerate(trace.events):
        if action == "alloc" and i not in failed:
            live[addr] = size
            now += size
            if now > peak:
                peak, peak_at = now, i
        elif action == "free":
            now -= live.pop(addr, 0)
    chosen.add(peak_at)
    chosen.update(failed)
    return sorted(chosen)


# --------------------------------------------------------------------------- building


class _Builder:
    """Turns events into allocation columns, interning stacks and ops."""

    def __init__(self, n_events: int) -> None:
        self.start: list[int] = []
        self.end: list[int] = []
        self.size: list[int] = []
        self.addr: list[int] = []
        self.stream: list[int] = []
        self.stack: list[int] = []
        self.op: list[int] = []
        self.kind = np.zeros(n_events, dtype=np.int64)
        self.alloc_of = np.full(n_events, -1, dtype=np.int64)
        self.stacks: list[CleanStack] = []
        self.ops: list[str] = []
        self._stack_ids: dict[Any, int] = {}
        self._op_ids: dict[str, int] = {}
        self.live: dict[int, int] = {}
        self.n_events = n_events

    def stack_id(self, frames: Any) -> int:
        if not isinstance(frames, list) or not frames:
            return -1
        try:
            key: Any = tuple(
                (f.get("name"), f.get("filename"), f.get("line")) for f in frames if type(f) is dict
            )
            hash(key)
        except TypeError:
            key = id(frames)
        ident = self._stack_ids.get(key)
        if ident is None:
            ident = self._stack_ids[key] = len(self.stacks)
            self.stacks.append(clean_stack(frames))
        return ident

    def op_id(self, op: Any) -> int:
        if not isinstance(op, str) or not op:
            return -1
        ident = self._op_ids.get(op)
        if ident is None:
            ident = self._op_ids[op] = len(self.ops)
            self.ops.append(op[:200])
        return ident

    def add(self, start: int, size: int, addr: int, stream: int, stack: int, op: int) -> int:
        index = len(self.start)
        self.start.append(start)
        self.end.append(self.n_events + 1)
        self.size.append(size)
        self.addr.append(addr)
        self.stream.append(stream)
        self.stack.append(stack)
        self.op.append(op)
        return index

    def view(self, title: str, times: Sequence[float] | None) -> View:
        def col(values: list[int]) -> Int64Array:
            return np.asarray(values, dtype=np.int64).reshape(-1)

        return View(
            title=title,
            events=self.n_events,
            start=col(self.start),
            end=col(self.end),
            size=col(self.size),
            addr=col(self.addr),
            stream=col(self.stream),
            stack=col(self.stack),
            op=col(self.op),
            event_kind=self.kind,
            event_alloc=self.alloc_of,
            times=None if times is None else np.asarray(times, dtype=np.float64),
            stacks=self.stacks,
            ops=self.ops,
        )


def _jsonl_extras(trace: Trace) -> tuple[list[Any], list[Any]] | None:
    """``op`` and ``t`` of each event of a JSONL trace, read again from its file.

    None when the file is gone, is not JSONL or does not line up with ``trace.events``.
    """
    if trace.path is None or trace.recording is not None or not os.path.isfile(trace.path):
        return None
    ops: list[Any] = []
    times: list[Any] = []
    try:
        with open(trace.path, "rb") as raw:
            magic = raw.read(2)
        stream: Any = (
            gzip.open(trace.path, "rt", encoding="utf-8")  # noqa: SIM115
            if magic == b"\x1f\x8b"
            else open(trace.path, encoding="utf-8")  # noqa: SIM115
        )
        with stream as lines:
            first = True
            for line in lines:
                if not line.strip():
                    continue
                if first:
                    first = False
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
    except (OSError, ValueError, EOFError, io.UnsupportedOperation):
        return None
    if len(ops) != len(trace.events):
        return None
    return ops, times


def _snapshot_entries_by_event(trace: Trace, entries: list[Any]) -> list[Any] | None:
    """The snapshot entry behind each trace event (as ``trace_from_snapshot`` made them)."""
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
    return out if len(out) == len(trace.events) else None


def _time_us(entries: list[Any], scale: float) -> list[float] | None:
    values: list[float] = []
    for e in entries:
        v = e.get("time_us") if isinstance(e, dict) else e
        if not isinstance(v, (int, float)) or isinstance(v, bool):
            return None
        values.append(float(v))
    first = values[0] if values else 0.0
    return [(v - first) * scale for v in values] or None


def _build(trace: Trace, entries: list[Any] | None, end_blocks: dict[int, Any]) -> View:
    events = trace.events
    b = _Builder(len(events))
    failed = set(_failed_events(trace))
    per_event = _snapshot_entries_by_event(trace, entries) if entries is not None else None
    extras = _jsonl_extras(trace) if per_event is None else None
    if trace.recording is not None:  # blocks live when recording began, from state 0
        for seg in trace.recording.start_segments:
            for blk in seg.blocks:
                if blk.requested_size > 0:
                    frames = end_blocks.get(blk.address)
                    stack = b.stack_id(frames) if frames is not None else -1
                    b.live[blk.address] = b.add(
                        0, blk.requested_size, blk.address, seg.stream, stack, -1
                    )
    pre_live = len(b.start)
    ops = extras[0] if extras is not None else None
    zero: set[int] = set()
    for i, (action, addr, size, stream) in enumerate(events):
        if action == "alloc":
            if i in failed:
                b.kind[i] = EVENT_OOM
                continue
            b.kind[i] = EVENT_ALLOC
            if size == 0:
                zero.add(addr)
                continue
            entry = per_event[i] if per_event is not None else None
            stack = b.stack_id(entry.get("frames")) if entry is not None else -1
            op = b.op_id(ops[i]) if ops is not None else -1
            index = b.add(i + 1, size, addr, stream, stack, op)
            b.live[addr] = index
            b.alloc_of[i] = index
        elif action == "free":
            b.kind[i] = EVENT_FREE
            index = b.live.pop(addr, -1)
            if index < 0:
                zero.discard(addr)
                continue
            b.end[index] = i + 1
            b.alloc_of[i] = index
        else:
            b.kind[i] = EVENT_EMPTY_CACHE
    for index in range(pre_live):  # a stack from the end state is only right if never freed
        if b.end[index] != len(events) + 1:
            b.stack[index] = -1
    times: list[float] | None = None
    if per_event is not None:
        times = _time_us(per_event, 1.0)
    elif extras is not None and all(t is not None for t in extras[1]):
        times = _time_us(extras[1], 1e-3)  # record_torch: ns
    return b.view(trace.name, times)


def _moment(
    view: View, state: int, segments: Sequence[SegmentInfo] | Sequence[dict[str, Any]]
) -> dict[str, Any]:
    """One segment map, its allocated blocks tied to the allocations live at ``state``."""
    live = view.live_at(state)
    by_addr = {a: i for a, i in zip(view.addr[live].tolist(), live.tolist(), strict=True)}
    by_size: dict[int, list[int]] = defaultdict(list)
    for i, size in zip(live.tolist(), view.size[live].tolist(), strict=True):
        by_size[size].append(i)
    used: set[int] = set()
    out = []
    for seg in sorted(segments, key=lambda s: s["address"]):
        blocks = []
        for blk in seg["blocks"]:
            code = _STATE_CODES.get(blk["state"], 2)
            if code == 2 and blk.get("requested_size", 0) < 0:
                code = 3
            owner = -1
            if code != 2:
                requested = blk.get("requested_size", 0)
                owner = by_addr.get(blk["address"], -1)
                if owner < 0 or owner in used or int(view.size[owner]) != requested:
                    owner = next((i for i in by_size.get(requested, ()) if i not in used), -1)
                if owner >= 0:
                    used.add(owner)
            blocks.append([blk["size"], code, owner])
        out.append(
            [
                seg["address"],
                seg["total_size"],
                seg.get("stream", 0),
                int(bool(seg.get("is_expandable"))),
                blocks,
            ]
        )
    return {"state": state, "segments": out}


def view_of_trace(
    trace: Trace,
    report: ReplayReport | None = None,
    *,
    title: str | None = None,
    entries: list[dict[str, Any]] | None = None,
    end_segments: Sequence[dict[str, Any]] = (),
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

    Returns
    -------
    View

    Raises
    ------
    ValueError
        If ``report`` captured no segment map.
    """
    if report is not None and not report.segment_maps:
        raise ValueError(
            "the replay captured no segment map: run it with capture_at=picture_moments(trace)"
        )
    end_blocks = {
        blk["address"]: blk.get("frames")
        for seg in end_segments
        for blk in seg.get("blocks", ())
        if isinstance(blk, dict) and blk.get("state") == "active_allocated"
    }
    view = _build(trace, entries, end_blocks)
    if title:
        view.title = title
    totals = view.totals()
    recording = trace.recording
    if entries is not None and recording is not None:
        _recorded_ooms(view, trace, entries, totals)
    if report is None:
        return view
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
    view.moments = [_moment(view, i + 1, maps) for i, maps in sorted(report.segment_maps.items())]
    view.source = f"replay on {report.device} with {report.config}"
    view.notes = _replay_notes(report, trace)
    return view


def _recorded_ooms(view: View, trace: Trace, entries: list[Any], totals: Int64Array) -> None:
    """The snapshot's ``oom`` entries with the reserved bytes PyTorch held then."""
    recording = trace.recording
    assert recording is not None
    reserved = recording.reserved_at_start_bytes
    failed = iter(i for i in range(view.events) if view.event_kind[i] == EVENT_OOM)
    for entry in entries:
        if type(entry) is not dict:
            continue
        action = entry.get("action")
        if action in ("segment_alloc", "segment_map"):
            reserved += int(entry.get("size", 0))
        elif action in ("segment_free", "segment_unmap"):
            reserved -= int(entry.get("size", 0))
        elif action == "oom":
            event = next(failed, None)
            if event is None:
                break
            free = entry.get("device_free")
            view.ooms.append(
                {
                    "event": event,
                    "size": int(entry.get("size", 0)),
                    "free": free if isinstance(free, int) else None,
                    "reserved": reserved,
                    "live": int(totals[event]),
                    "stack": -1,
                    "source": "recorded",
                }
            )
            # the failed request's own stack
            frames = entry.get("frames")
            if frames:
                view.ooms[-1]["stack"] = _intern(view, frames)


def _intern(view: View, frames: Any) -> int:
    view.stacks.append(clean_stack(frames))
    return len(view.stacks) - 1


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
    return notes


def view_of_snapshot(
    path: str | os.PathLike[str],
    *,
    device_index: int | None = None,
    moments: int = DEFAULT_MOMENTS,
) -> View:
    """Build the picture of a snapshot pickle (PyTorch's or accelrt's).

    With allocation history, the history is replayed exactly from its rewound start (so the
    segment map can be shown at any captured moment); without, only the end state's segment
    map and nothing over time.

    Parameters
    ----------
    path : str or path-like
    device_index : int, optional
        The recorded device (default: the only one with history, else 0).
    moments : int
        About how many segment maps to capture (see :func:`picture_moments`).

    Returns
    -------
    View

    Raises
    ------
    TraceFormatError
        For a pickle that is not a plain-data snapshot (nothing in it runs).
    """
    snapshot = read_snapshot(path)
    name = os.path.basename(os.fspath(path)).rsplit(".", 1)[0]
    traces = snapshot.get("device_traces") or []
    has_history = devices_with_history(snapshot)
    if has_history and (device_index is None or device_index in has_history):
        from ..replay import replay

        trace = trace_from_snapshot(snapshot, device=device_index, path=os.fspath(path))
        device = trace.recording.device if trace.recording is not None else 0
        report = replay(trace, capture_at=picture_moments(trace, moments))
        segments = [s for s in snapshot["segments"] if s.get("device", 0) == device]
        return view_of_trace(
            trace, report, title=name, entries=traces[device], end_segments=segments
        )
    device = device_index or 0
    segments = [s for s in snapshot["segments"] if s.get("device", 0) == device]
    empty = np.zeros(0, dtype=np.int64)
    view = View(name, 0, empty, empty, empty, empty, empty, empty, empty, empty, empty)
    view.moments = [_moment(view, 0, segments)]
    view.source = "the snapshot's end state (no allocation history recorded)"
    return view
