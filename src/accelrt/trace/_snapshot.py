"""PyTorch memory snapshot pickles as traces: safe reading, the start state, the recorded figures.

A snapshot (``torch.cuda.memory._dump_snapshot``) holds the allocator's end state (segments and
their blocks) and, when history was recorded, a ring buffer of events per device. To replay it
exactly (docs/allocator.md section 13) this module

- reads and checks the file (``_snapshot_schema.read_snapshot``: plain data only, nothing
  runs, errors name the place inside the file);
- rewinds the device's events from the end state to get the segments and blocks that existed
  when recording began (:class:`SegmentState`), leaving out what could not be restored;
- keeps the addresses PyTorch's device returned for new segments, in order;
- marks where the program called ``empty_cache()`` (a run of ``segment_free`` entries);
- measures what PyTorch's allocator reserved (:class:`Recording`).
"""

from __future__ import annotations

import os

from ..memory._policy import (
    K_SMALL_BUFFER,
    MAX_REQUEST_BYTES,
    page_size,
)
from ._columns import OP_ALLOC, OP_EMPTY_CACHE, OP_FREE, TraceEvents
from ._format import Trace, TraceFormatError
from ._plain_pickle import describe
from ._recording import FAILED_ADDR, Recording
from ._rewind import (
    Rewind,
    blocks_of,
    expandable_groups,
    pool_returns,
    range_pools,
    restorable_start,
)
from ._snapshot_schema import (
    CheckedSnapshot,
    FileSegment,
    FileSnapshot,
    Problem,
    check_entries,
    check_snapshot,
    settings_of,
)

__all__ = [
    "Recording",
    "device_segments",
    "devices_text",
    "devices_with_history",
    "snapshot_devices",
    "snapshot_name",
    "trace_from_snapshot",
    "traces_from_snapshot",
]


def devices_with_history(snapshot: FileSnapshot) -> list[int]:
    """Return the device indices whose ``device_traces`` record at least one allocation.

    These are the devices :func:`trace_from_snapshot` can turn into a trace (and that
    :func:`traces_from_snapshot` takes): PyTorch records a device's history in
    ``device_traces[index]`` when ``torch.cuda.memory._record_memory_history`` was on.

    Parameters
    ----------
    snapshot : dict
        A PyTorch memory snapshot, from :func:`read_snapshot` (its ``data``) or any dict.

    Returns
    -------
    list of int
        Device indices in increasing order, each with at least one ``"alloc"`` entry; empty
        for a snapshot of the end state only (no ``device_traces``, or only other entries).

    Notes
    -----
    Never raises: a ``snapshot`` that is not a dict, ``device_traces`` that is not a list, and
    entries that are not dicts are passed over (:func:`read_snapshot` refuses them).
    """
    traces = snapshot.get("device_traces") if isinstance(snapshot, dict) else None
    if not isinstance(traces, list):
        return []
    return [
        i
        for i, t in enumerate(traces)
        if isinstance(t, list) and any(type(e) is dict and e.get("action") == "alloc" for e in t)
    ]


def snapshot_devices(snapshot: FileSnapshot, *, in_use: bool = False) -> list[int]:
    """Return the device indices a snapshot holds: those of its ``device_traces`` entries and
    of its segments, in order; ``in_use``: only those with segments or allocation history.

    Segments that are not dicts, or whose ``device`` is not a whole number, are passed over
    (:func:`read_snapshot` refuses them).
    """
    traces = snapshot.get("device_traces") if isinstance(snapshot, dict) else None
    segments = snapshot.get("segments") if isinstance(snapshot, dict) else None
    if in_use:
        devices = set(devices_with_history(snapshot))
    else:
        devices = set(range(len(traces))) if isinstance(traces, list) else set()
    for seg in segments if isinstance(segments, list) else ():
        device = seg.get("device", 0) if isinstance(seg, dict) else None
        if type(device) is int and device >= 0:
            devices.add(device)
    return sorted(devices)


def device_segments(snapshot: FileSnapshot, device: int) -> list[FileSegment]:
    """The segments of ``snapshot`` on recorded ``device`` (a segment without ``device`` is on
    device 0), in the snapshot's order: the one filter of segments by device."""
    return [s for s in snapshot["segments"] if s.get("device", 0) == device]


def snapshot_name(path: str | os.PathLike[str] | None, device: int | None = None) -> str:
    """The name of a snapshot's trace: its file's name without the last suffix, and
    ``_dev<N>`` for recorded device N where several devices recorded history."""
    name = os.path.basename(os.fspath(path or "snapshot")).rsplit(".", 1)[0]
    return name if device is None else f"{name}_dev{device}"


def devices_text(devices: list[int]) -> str:
    """``"0, 1, 2"``, or for more than 8 devices the first four and the last with the count."""
    if not devices:
        return "none"
    if len(devices) <= 8:
        return ", ".join(map(str, devices))
    return f"{', '.join(map(str, devices[:4]))}, ..., {devices[-1]} ({len(devices)} devices)"


def traces_from_snapshot(
    snapshot: FileSnapshot | CheckedSnapshot, *, path: str | None = None
) -> list[Trace]:
    """Turn every device of a snapshot that recorded history into a trace, in device order.

    Parameters
    ----------
    snapshot : dict or CheckedSnapshot
        From :func:`read_snapshot` (or ``read_checked_snapshot``: not checked again).
    path : str, optional
        The file it came from (for the traces' names and messages).

    Returns
    -------
    list of Trace
        One :func:`trace_from_snapshot` per device in :func:`devices_with_history`; with
        several, each is named ``<file>_dev<N>`` (``trace.recording.device`` is ``N``).

    Raises
    ------
    TraceFormatError
        As :func:`trace_from_snapshot`, for the snapshot or any of its devices (a snapshot
        without allocation history included).
    """
    data = snapshot.data if isinstance(snapshot, CheckedSnapshot) else snapshot
    devices: list[int | None] = [*devices_with_history(data)]
    # none with history: trace_from_snapshot says what is wrong
    return [trace_from_snapshot(snapshot, device=d, path=path) for d in devices or [None]]


def trace_from_snapshot(
    snapshot: FileSnapshot | CheckedSnapshot,
    *,
    device: int | None = None,
    path: str | None = None,
) -> Trace:
    """Turn one device of a snapshot into a replayable trace with its :class:`Recording`.

    Parameters
    ----------
    snapshot : dict or CheckedSnapshot
        From :func:`read_snapshot` (a dict made otherwise is checked the same way), or from
        ``read_checked_snapshot``: checked when it was read, not again.
    device : int, optional
        Which device; default the only device with events (an error if several have some).
    path : str, optional
        The file it came from (for the trace's name and messages).

    Returns
    -------
    Trace
        Events ``alloc`` (from ``alloc``), ``free`` (from ``free_requested``) and
        ``empty_cache`` (where a run of ``segment_free`` entries shows the program released
        its cache); ``trace.recording`` holds the start state and PyTorch's figures. Start
        segments the allocator could not restore as rewound (blocks that do not tile their
        segment, overlapping segments, sizes not multiples of 512...) are left out and counted
        in ``recording.inconsistent_events``, so the trace replays on the simulated device.

    Raises
    ------
    TraceFormatError
        If the snapshot does not fit PyTorch's schema (the message names the place inside
        it), recorded no history, the device is out of range or not given where several
        devices have events, an allocation is larger than any device (2**60 bytes), or the
        start state holds more memory than the simulated device can have. For every device
        at once: :func:`traces_from_snapshot`.
    """
    where = path or "snapshot"
    checked = snapshot if isinstance(snapshot, CheckedSnapshot) else None
    if checked is not None:
        snapshot = checked.data
    elif not isinstance(snapshot, dict):
        raise TraceFormatError(f"{where}: expected a snapshot dict, got {describe(snapshot)}")
    else:
        check_snapshot(snapshot, where, entries=False)
    traces = snapshot.get("device_traces") or []
    with_events = devices_with_history(snapshot)
    if not with_events:
        raise TraceFormatError(
            f"{where}: the snapshot has no allocation history (record it with "
            "torch.cuda.memory._record_memory_history() before the run)"
        )
    if device is None:
        if len(with_events) > 1:
            raise TraceFormatError(
                f"{where}: devices {with_events} all have events; choose one "
                "(accelrt replay --device-index N), or take them all with traces_from_snapshot"
            )
        device = with_events[0]
    if not 0 <= device < len(traces):
        raise TraceFormatError(
            f"{where}: device index {device} is out of range: the snapshot has devices "
            f"{devices_text(snapshot_devices(snapshot))}, with allocation history on "
            f"{devices_text(with_events)}; choose one of those"
        )
    entries = traces[device]
    if checked is not None:
        totals = checked.totals[device]
    else:
        try:
            totals = check_entries(entries, f"device_traces[{device}]")
        except Problem as exc:
            raise TraceFormatError(f"{where}: {exc}") from None
    if totals.too_large is not None:
        size = entries[totals.too_large]["size"]
        raise TraceFormatError(
            f"{where}: device_traces[{device}][{totals.too_large}].size: an allocation of "
            f"{size} bytes, more than any device has (at most 2**60)"
        )
    settings = checked.settings if checked is not None else settings_of(snapshot, where)
    end_segments = device_segments(snapshot, device)
    reserved_end = sum(s["total_size"] for s in end_segments)
    grown, shrunk = totals.grown, totals.shrunk
    reserved_start = reserved_end - grown + shrunk
    rewind = Rewind(settings)
    for seg in end_segments:
        if not seg.get("is_expandable"):
            rewind.add_segment(
                seg["address"],
                seg["total_size"],
                seg.get("stream", 0),
                blocks_of(seg),
                seg["total_size"] == K_SMALL_BUFFER,
            )
    spans = expandable_groups([s for s in end_segments if s.get("is_expandable")])
    for address, size, stream, is_small, blocks in spans:
        rewind.add_segment(address, size, stream, blocks, is_small, is_expandable=True)
        rewind.claims.append((address, address + size, stream, is_small))
    pools = range_pools(entries, page_size(False, settings.large_segment_size))
    for i, is_small in pools.items():
        entry = entries[i]
        claim = (entry["addr"], entry["addr"] + entry["size"], entry.get("stream", 0), is_small)
        rewind.claims.append(claim)
    returns = pool_returns(entries, end_segments)
    for i in range(len(entries) - 1, -1, -1):
        entry = entries[i]
        action = entry["action"]
        if action == "alloc":
            rewind.undo_alloc(entry["addr"])
        elif i in returns:
            rewind.undo_free(entry["addr"], entry["size"])
        elif action == "segment_alloc":
            rewind.undo_segment_alloc(entry["addr"], entry["size"])
        elif action == "segment_free":
            rewind.undo_segment_free(entry["addr"], entry["size"], entry.get("stream", 0))
        elif action == "segment_map":
            rewind.undo_segment_map(entry["addr"], entry["size"])
        elif action == "segment_unmap":
            stream = entry.get("stream", 0)
            rewind.undo_segment_unmap(entry["addr"], entry["size"], stream, pools[i])

    capacity = None if totals.at_oom is None else reserved_start + totals.at_oom
    start, capacity, dropped = restorable_start(rewind.state(), capacity, where)

    events: list[tuple[int, int, int, int]] = []  # (op, addr, size, stream)
    live = {b.address: b.requested_size for s in start for b in s.blocks if b.requested_size > 0}
    live_bytes = peak_live = sum(live.values())
    reserved = peak_reserved = reserved_start
    n_alloc = n_free = n_oom = 0
    previous = ""
    release_run: int | None = None  # events index of the latest release run's empty_cache
    for i, entry in enumerate(entries):
        action = entry["action"]
        if action == "alloc":
            events.append((OP_ALLOC, entry["addr"], entry["size"], entry.get("stream", 0)))
            live[entry["addr"]] = entry["size"]
            live_bytes += entry["size"]
            peak_live = max(peak_live, live_bytes)
            release_run = None
        elif action in ("free_requested", "free_completed"):
            if i in returns:  # the replay frees where the pool took the block back
                events.append((OP_FREE, entry["addr"], entry["size"], entry.get("stream", 0)))
            live_bytes -= live.pop(entry["addr"], 0)  # (0 at a completion: freed already)
            release_run = None
        elif action in ("segment_alloc", "segment_map"):
            n_alloc += 1
            reserved += entry["size"]
            peak_reserved = max(peak_reserved, reserved)
        elif action in ("segment_free", "segment_unmap"):
            n_free += 1
            reserved -= entry["size"]
            if previous not in ("segment_free", "segment_unmap"):
                release_run = len(events)
                events.append((OP_EMPTY_CACHE, 0, 0, 0))
        elif action == "oom":
            n_oom += 1
            # The request that failed: PyTorch records no alloc for it. A release run right
            # before it (with no alloc or free between) was its last retry, not empty_cache().
            # (One beyond 2**60 bytes, which no allocator takes, fails as a 2**60-byte one.)
            size = min(entry["size"], MAX_REQUEST_BYTES)
            failed = (OP_ALLOC, FAILED_ADDR, size, entry.get("stream", 0))
            if release_run is not None:
                events[release_run] = failed
            else:
                events.append(failed)
            release_run = None
        previous = action
    recording = Recording(
        device=device,
        start_segments=start,
        segment_addresses=tuple(
            (e["addr"], e["size"]) for e in entries if e["action"] == "segment_alloc"
        ),
        settings=settings,
        reserved_at_start_bytes=reserved_start,
        reserved_at_end_bytes=reserved_end,
        peak_reserved_bytes=peak_reserved,
        num_device_alloc=n_alloc,
        num_device_free=n_free,
        segments_at_end=len(end_segments),
        num_ooms=n_oom,
        capacity_bytes=capacity,
        inconsistent_events=rewind.inconsistent + dropped,
    )
    header = {"name": snapshot_name(path, None if len(with_events) == 1 else device)}
    return Trace(
        header=header,
        events=_event_columns(events),
        path=path,
        include_host=True,
        peak_live_bytes=peak_live,
        live_at_end_bytes=live_bytes,
        recording=recording,
    )


def _event_columns(rows: list[tuple[int, int, int, int]]) -> TraceEvents:
    """``(op, addr, size, stream)`` rows as columns (``TraceEvents.from_columns``)."""
    if not rows:
        return TraceEvents.from_events(())
    return TraceEvents.from_columns(*zip(*rows, strict=True))
