"""Building a memory picture: the allocation columns of a trace, the segment maps and OOMs of
a replay it is given (:func:`view_of_trace`), and the end state of a snapshot recorded without
history (:func:`end_state_view`). Nothing here replays; a JSONL trace's ``op`` and ``t``
fields are read again from its file."""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

from .._gc import collector_paused
from .._units import format_bytes
from ..trace._columns import OP_ALLOC, OP_FREE, _signed
from ..trace._format import Trace
from ..trace._jsonl import _lines_of, _text_chunks
from ..trace._snapshot_schema import FileEntry, FileSegment
from ._model import (
    EVENT_ALLOC,
    EVENT_EMPTY_CACHE,
    EVENT_FREE,
    EVENT_OOM,
    Int64Array,
    View,
    _allocating,
    _failed_events,
    _freed,
)
from ._moments import _Moments
from ._recorded import RecordedDetails, _Stacks, _start_blocks, _times, recorded_details
from ._stacks import CleanStack

if TYPE_CHECKING:
    from ..replay import ReplayReport


__all__ = ["end_state_view", "view_of_trace"]


def _jsonl_extras(trace: Trace) -> tuple[list[object], list[int | float | None]] | None:
    """``op`` and ``t`` of each event of a JSONL trace, read again from its file.

    None when the file is gone, is not JSONL or does not line up with ``trace.events``.
    """
    if trace.path is None or trace.recording is not None or not os.path.isfile(trace.path):
        return None
    ops: list[object] = []
    times: list[int | float | None] = []
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

    def column(before: list[int], values: Int64Array) -> Int64Array:
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
        phases=trace.phases,
    )


def _op_ids(names: list[object], ops: list[str]) -> list[int]:
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


def view_of_trace(
    trace: Trace,
    report: ReplayReport | None = None,
    *,
    title: str | None = None,
    entries: list[FileEntry] | None = None,
    end_segments: Sequence[FileSegment] = (),
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


def end_state_view(segments: Sequence[FileSegment], title: str) -> View:
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
