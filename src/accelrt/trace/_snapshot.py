"""PyTorch memory snapshot pickles as traces: safe reading, the start state, the recorded figures.

A snapshot (``torch.cuda.memory._dump_snapshot``) holds the allocator's end state (segments and
their blocks) and, when history was recorded, a ring buffer of events per device. To replay it
exactly (docs/allocator.md section 13) this module

- reads the pickle with an unpickler that admits only plain data (no globals: nothing runs);
- rewinds the device's events from the end state to get the segments and blocks that existed
  when recording began (:class:`SegmentState`);
- keeps the addresses PyTorch's device returned for new segments, in order;
- marks where the program called ``empty_cache()`` (a run of ``segment_free`` entries);
- measures what PyTorch's allocator reserved (:class:`Recording`).
"""

from __future__ import annotations

import io
import os
import pickle
from bisect import bisect_right, insort
from dataclasses import dataclass
from typing import Any

from ..memory._config import AllocatorConfig
from ..memory._policy import K_SMALL_BUFFER, UNLIMITED, round_size, should_split
from ._format import Trace, TraceEvent, TraceFormatError

__all__ = [
    "BlockState",
    "Recording",
    "SegmentState",
    "UNMAPPED",
    "devices_with_history",
    "read_snapshot",
    "trace_from_snapshot",
]

_ALLOCATED_STATES = ("active_allocated", "active_pending_free")
_FAILED_ADDR = 0
"""The address of a request that ran out of memory (it never got one)."""
_SEGMENT_ENTRIES = ("segment_alloc", "segment_free", "segment_map", "segment_unmap")


class _PlainDataUnpickler(pickle.Unpickler):
    """Admits dicts, lists, tuples, sets, strings, bytes, numbers, booleans and None only."""

    def find_class(self, module: str, name: str) -> Any:
        raise pickle.UnpicklingError(f"global '{module}.{name}'")

    def persistent_load(self, pid: Any) -> Any:
        raise pickle.UnpicklingError(f"persistent id {pid!r}")


def read_snapshot(path: str | os.PathLike[str]) -> dict[str, Any]:
    """Read a PyTorch memory snapshot pickle without running any code.

    Parameters
    ----------
    path : str or path-like
        A file written by ``torch.cuda.memory._dump_snapshot`` or ``accelrt.dump_snapshot``.

    Returns
    -------
    dict
        The snapshot: ``segments``, ``device_traces`` and maybe ``allocator_settings``.

    Raises
    ------
    TraceFormatError
        If the pickle names any global (a class or function: code), is damaged, or is not a
        snapshot dict. Nothing in the file is executed either way.
    """
    with open(path, "rb") as f:
        data = f.read()
    try:
        snapshot = _PlainDataUnpickler(io.BytesIO(data)).load()
    except pickle.UnpicklingError as exc:
        raise TraceFormatError(
            f"{path}: refused: the pickle names {exc}, i.e. code; accelrt reads snapshots as "
            "plain data only and ran nothing from it"
        ) from None
    except (EOFError, ValueError, TypeError, IndexError, KeyError) as exc:
        raise TraceFormatError(f"{path}: not a readable pickle ({exc})") from None
    if not isinstance(snapshot, dict) or not isinstance(snapshot.get("segments"), list):
        raise TraceFormatError(
            f"{path}: not a PyTorch memory snapshot (expected a dict with 'segments' and "
            f"'device_traces'; got {type(snapshot).__name__})"
        )
    snapshot.setdefault("device_traces", [])
    return snapshot


UNMAPPED = -1
"""``BlockState.requested_size`` of an unmapped block of an expandable segment."""


@dataclass(frozen=True)
class BlockState:
    """A block of a segment at one moment: its bytes and what it holds.

    ``requested_size`` is the requested bytes of an allocated block, 0 for a free block and
    ``UNMAPPED`` (-1) for address space of an expandable segment with no memory behind it.
    """

    address: int
    size: int
    requested_size: int


@dataclass(frozen=True)
class SegmentState:
    """A segment at one moment: its address, bytes, owning stream and blocks (address order).

    For an expandable segment (``is_expandable``) the blocks tile the part of its reserved
    range the recording touched, unmapped stretches included; ``is_small`` says its pool.
    """

    address: int
    size: int
    stream: int
    blocks: tuple[BlockState, ...]
    is_small: bool
    is_expandable: bool = False


@dataclass(frozen=True)
class Recording:
    """What a snapshot recorded beyond the allocation events: enough to replay it exactly.

    Attributes
    ----------
    device : int
        The device index the trace is of.
    start_segments : tuple of SegmentState
        The segments and blocks when recording began (rewound from the end state).
    segment_addresses : tuple of (int, int)
        ``(address, bytes)`` of each ``segment_alloc`` in order: where the device put new
        segments.
    settings : AllocatorConfig
        The recorded ``allocator_settings`` (defaults when the snapshot has none).
    reserved_at_start_bytes, reserved_at_end_bytes, peak_reserved_bytes : int
        PyTorch's reserved bytes when recording began, at the end, and at the peak.
    num_device_alloc, num_device_free : int
        ``segment_alloc``/``segment_map`` and ``segment_free``/``segment_unmap`` entries.
    segments_at_end : int
        Segments in the end state.
    num_ooms : int
        ``oom`` entries.
    capacity_bytes : int or None
        The device's memory where the recording shows it (an ``oom`` entry's free bytes plus
        what was reserved then), else None.
    inconsistent_events : int
        Events the rewind could not place (the ring buffer dropped their context).
    """

    device: int
    start_segments: tuple[SegmentState, ...]
    segment_addresses: tuple[tuple[int, int], ...]
    settings: AllocatorConfig
    reserved_at_start_bytes: int
    reserved_at_end_bytes: int
    peak_reserved_bytes: int
    num_device_alloc: int
    num_device_free: int
    segments_at_end: int
    num_ooms: int
    capacity_bytes: int | None
    inconsistent_events: int


class _Rewind:
    """The segments of one device, walked backwards from the end state.

    Each segment is ``[size, stream, sorted block starts, {start: [size, state]}, is_small,
    is_expandable]`` where state is the requested bytes (allocated), 0 (free) or ``UNMAPPED``.
    All of an expandable segment's mapped ranges of one (stream, pool) form one segment here.
    """

    def __init__(self, settings: AllocatorConfig) -> None:
        self.settings = settings
        self.segments: dict[int, list[Any]] = {}
        self.starts: list[int] = []
        self.inconsistent = 0

    def add_segment(
        self,
        address: int,
        size: int,
        stream: int,
        blocks: list[BlockState],
        is_small: bool,
        is_expandable: bool = False,
    ) -> None:
        starts = [b.address for b in blocks]
        table = {b.address: [b.size, b.requested_size] for b in blocks}
        self.segments[address] = [size, stream, starts, table, is_small, is_expandable]
        insort(self.starts, address)

    def _segment_of(self, addr: int) -> list[Any] | None:
        pos = bisect_right(self.starts, addr) - 1
        if pos < 0:
            return None
        seg = self.segments[self.starts[pos]]
        return seg if addr < self.starts[pos] + seg[0] else None

    @staticmethod
    def _merge_around(seg: list[Any], addr: int) -> None:
        """Merge the block at ``addr`` with neighbours in the same free or unmapped state."""
        starts, table = seg[2], seg[3]
        state = table[addr][1]
        i = starts.index(addr)
        if i + 1 < len(starts) and table[starts[i + 1]][1] == state:
            table[addr][0] += table.pop(starts.pop(i + 1))[0]
        if i > 0 and table[starts[i - 1]][1] == state:
            table[starts[i - 1]][0] += table.pop(starts.pop(i))[0]

    def _carve(self, addr: int, size: int, before: int, after: int) -> list[Any] | None:
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

    def undo_segment_map(self, addr: int, size: int) -> None:
        """Pages were mapped here: before, they were unmapped."""
        seg = self._carve(addr, size, 0, UNMAPPED)
        if seg is None or not seg[5]:
            self.inconsistent += 1
            return
        self._merge_around(seg, addr)

    def undo_segment_unmap(self, addr: int, size: int) -> None:
        """Pages were unmapped here: before, they were mapped and free."""
        seg = self._carve(addr, size, UNMAPPED, 0)
        if seg is None or not seg[5]:
            self.inconsistent += 1
            return
        self._merge_around(seg, addr)

    def state(self) -> tuple[SegmentState, ...]:
        out = []
        for address in self.starts:
            size, stream, starts, table, is_small, is_expandable = self.segments[address]
            blocks = tuple(BlockState(s, table[s][0], table[s][1]) for s in starts)
            if is_expandable and all(b.requested_size == UNMAPPED for b in blocks):
                continue  # nothing mapped when recording began
            out.append(SegmentState(address, size, stream, blocks, is_small, is_expandable))
        return tuple(out)


def _expandable_groups(
    end_segments: list[dict[str, Any]], entries: list[dict[str, Any]]
) -> list[tuple[int, int, int, bool, list[BlockState]]]:
    """Join the mapped ranges of each (stream, pool) into one span of an expandable segment.

    Returns ``(address, size, stream, is_small, blocks)`` per span: the span runs from the
    lowest to the highest address the end state or a ``segment_map``/``segment_unmap`` entry
    shows for it, and the stretches between mapped ranges are unmapped blocks.
    """
    groups: dict[tuple[int, bool], list[dict[str, Any]]] = {}
    for seg in end_segments:
        key = (seg.get("stream", 0), seg.get("segment_type") == "small")
        groups.setdefault(key, []).append(seg)
    spans = []
    for (stream, is_small), ranges in groups.items():
        ranges.sort(key=lambda r: r["address"])
        low = ranges[0]["address"]
        high = ranges[-1]["address"] + ranges[-1]["total_size"]
        spans.append([low, high, stream, is_small, ranges])
    spans.sort()
    for entry in entries:  # pages touched during the recording belong to the span above them
        if entry["action"] not in ("segment_map", "segment_unmap"):
            continue
        addr, end = entry["addr"], entry["addr"] + entry["size"]
        same_stream = [s for s in spans if s[2] == entry.get("stream", 0)]
        target = next((s for s in same_stream if addr < s[1]), None)
        if target is None and same_stream:
            target = same_stream[-1]
        if target is not None:
            target[0], target[1] = min(target[0], addr), max(target[1], end)
    out = []
    for low, high, stream, is_small, ranges in spans:
        blocks: list[BlockState] = []
        cursor = low
        for seg in ranges:
            if seg["address"] > cursor:
                blocks.append(BlockState(cursor, seg["address"] - cursor, UNMAPPED))
            blocks.extend(_blocks_of(seg))
            cursor = seg["address"] + seg["total_size"]
        if high > cursor:
            blocks.append(BlockState(cursor, high - cursor, UNMAPPED))
        out.append((low, high - low, stream, is_small, blocks))
    return out


def _blocks_of(segment: dict[str, Any]) -> list[BlockState]:
    return [
        BlockState(
            b["address"],
            b["size"],
            b.get("requested_size", b["size"]) if b["state"] in _ALLOCATED_STATES else 0,
        )
        for b in segment["blocks"]
    ]


def devices_with_history(snapshot: dict[str, Any]) -> list[int]:
    """Return the device indices whose ``device_traces`` record at least one allocation."""
    traces = snapshot.get("device_traces") or []
    return [i for i, t in enumerate(traces) if any(e.get("action") == "alloc" for e in t)]


def trace_from_snapshot(
    snapshot: dict[str, Any], *, device: int | None = None, path: str | None = None
) -> Trace:
    """Turn one device of a snapshot into a replayable trace with its :class:`Recording`.

    Parameters
    ----------
    snapshot : dict
        From :func:`read_snapshot`.
    device : int, optional
        Which device; default the only device with events (an error if several have some).
    path : str, optional
        The file it came from (for the trace's name and messages).

    Returns
    -------
    Trace
        Events ``alloc`` (from ``alloc``), ``free`` (from ``free_requested``) and
        ``empty_cache`` (where a run of ``segment_free`` entries shows the program released
        its cache); ``trace.recording`` holds the start state and PyTorch's figures.

    Raises
    ------
    TraceFormatError
        If the snapshot recorded no history, the device is out of range or not given where
        several devices have events.
    """
    where = path or "snapshot"
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
                "(accelrt replay --device-index N)"
            )
        device = with_events[0]
    if not 0 <= device < len(traces):
        raise TraceFormatError(f"{where}: device index {device} is out of range [0, {len(traces)})")
    entries = traces[device]
    settings = AllocatorConfig.from_torch_settings(snapshot.get("allocator_settings"))
    end_segments = [s for s in snapshot["segments"] if s.get("device", 0) == device]
    reserved_end = sum(s["total_size"] for s in end_segments)
    grown = sum(e["size"] for e in entries if e["action"] in ("segment_alloc", "segment_map"))
    shrunk = sum(e["size"] for e in entries if e["action"] in ("segment_free", "segment_unmap"))
    reserved_start = reserved_end - grown + shrunk
    rewind = _Rewind(settings)
    for seg in end_segments:
        if not seg.get("is_expandable"):
            rewind.add_segment(
                seg["address"],
                seg["total_size"],
                seg.get("stream", 0),
                _blocks_of(seg),
                seg["total_size"] == K_SMALL_BUFFER,
            )
    expandable = [s for s in end_segments if s.get("is_expandable")]
    for address, size, stream, is_small, blocks in _expandable_groups(expandable, entries):
        rewind.add_segment(address, size, stream, blocks, is_small, is_expandable=True)
    for entry in reversed(entries):
        action = entry["action"]
        if action == "alloc":
            rewind.undo_alloc(entry["addr"])
        elif action == "free_requested":
            rewind.undo_free(entry["addr"], entry["size"])
        elif action == "segment_alloc":
            rewind.undo_segment_alloc(entry["addr"], entry["size"])
        elif action == "segment_free":
            rewind.undo_segment_free(entry["addr"], entry["size"], entry.get("stream", 0))
        elif action == "segment_map":
            rewind.undo_segment_map(entry["addr"], entry["size"])
        elif action == "segment_unmap":
            rewind.undo_segment_unmap(entry["addr"], entry["size"])
    start = rewind.state()

    events: list[TraceEvent] = []
    live = {b.address: b.requested_size for s in start for b in s.blocks if b.requested_size > 0}
    live_bytes = peak_live = sum(live.values())
    reserved = peak_reserved = reserved_start
    n_alloc = n_free = n_oom = 0
    capacity: int | None = None
    previous = ""
    release_run: int | None = None  # events index of the latest release run's empty_cache
    for entry in entries:
        action = entry["action"]
        if action == "alloc":
            events.append(TraceEvent("alloc", entry["addr"], entry["size"], entry.get("stream", 0)))
            live[entry["addr"]] = entry["size"]
            live_bytes += entry["size"]
            peak_live = max(peak_live, live_bytes)
            release_run = None
        elif action == "free_requested":
            events.append(TraceEvent("free", entry["addr"], entry["size"], entry.get("stream", 0)))
            live_bytes -= live.pop(entry["addr"], 0)
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
                events.append(TraceEvent("empty_cache", 0, 0, 0))
        elif action == "oom":
            n_oom += 1
            capacity = reserved + int(entry.get("device_free", 0))
            # The request that failed: PyTorch records no alloc for it. A release run right
            # before it (with no alloc or free between) was its last retry, not empty_cache().
            failed = TraceEvent("alloc", _FAILED_ADDR, entry["size"], entry.get("stream", 0))
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
        inconsistent_events=rewind.inconsistent,
    )
    name = os.path.basename(path or "snapshot").rsplit(".", 1)[0]
    header = {"name": name if len(with_events) == 1 else f"{name}_dev{device}"}
    return Trace(
        header=header,
        events=events,
        path=path,
        include_host=True,
        peak_live_bytes=peak_live,
        live_at_end_bytes=live_bytes,
        recording=recording,
    )
