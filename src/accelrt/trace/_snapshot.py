"""PyTorch memory snapshot pickles as traces: safe reading, the start state, the recorded figures.

A snapshot (``torch.cuda.memory._dump_snapshot``) holds the allocator's end state (segments and
their blocks) and, when history was recorded, a ring buffer of events per device. To replay it
exactly (ALLOCATOR.md section 13) this module

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
from ..memory._policy import K_SMALL_BUFFER, K_SMALL_SIZE, round_size
from ._format import Trace, TraceEvent, TraceFormatError

__all__ = [
    "BlockState",
    "Recording",
    "SegmentState",
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


@dataclass(frozen=True)
class BlockState:
    """A block of a segment at one moment: its bytes and, if allocated, the requested bytes."""

    address: int
    size: int
    requested_size: int  # 0 when free


@dataclass(frozen=True)
class SegmentState:
    """A segment at one moment: its address, bytes, owning stream and blocks (address order)."""

    address: int
    size: int
    stream: int
    blocks: tuple[BlockState, ...]

    @property
    def is_small(self) -> bool:
        """Whether it belongs to the small pool (PyTorch's small segments are 2 MiB)."""
        return self.size == K_SMALL_BUFFER


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
    """The segments of one device, walked backwards from the end state."""

    def __init__(self, settings: AllocatorConfig) -> None:
        self.settings = settings
        # address -> [size, stream, sorted block starts, {start: [size, requested]}]
        self.segments: dict[int, tuple[int, int, list[int], dict[int, list[int]]]] = {}
        self.starts: list[int] = []
        self.inconsistent = 0

    def add_segment(self, address: int, size: int, stream: int, blocks: list[BlockState]) -> None:
        starts = [b.address for b in blocks]
        table = {b.address: [b.size, b.requested_size] for b in blocks}
        self.segments[address] = (size, stream, starts, table)
        insort(self.starts, address)

    def _segment_of(self, addr: int) -> tuple[int, int, list[int], dict[int, list[int]]] | None:
        pos = bisect_right(self.starts, addr) - 1
        if pos < 0:
            return None
        seg = self.segments[self.starts[pos]]
        return seg if addr < self.starts[pos] + seg[0] else None

    def undo_alloc(self, addr: int) -> None:
        """The block at ``addr`` was allocated here: before, it was free (merged)."""
        seg = self._segment_of(addr)
        if seg is None or addr not in seg[3] or not seg[3][addr][1]:
            self.inconsistent += 1
            return
        _, _, starts, table = seg
        table[addr][1] = 0
        i = starts.index(addr)
        if i + 1 < len(starts) and table[starts[i + 1]][1] == 0:
            table[addr][0] += table.pop(starts.pop(i + 1))[0]
        if i > 0 and table[starts[i - 1]][1] == 0:
            table[starts[i - 1]][0] += table.pop(starts.pop(i))[0]

    def undo_free(self, addr: int, requested: int) -> None:
        """The block at ``addr`` was freed here: before, it was allocated (split it out)."""
        seg = self._segment_of(addr)
        if seg is None or requested <= 0:
            self.inconsistent += 1
            return
        seg_size, _, starts, table = seg
        i = bisect_right(starts, addr) - 1
        start = starts[i]
        free_size, state = table[start]
        end = start + free_size
        size = round_size(requested, self.settings)
        if state != 0 or addr + size > end:
            self.inconsistent += 1
            return
        if seg_size != K_SMALL_BUFFER and 0 < end - addr - size <= K_SMALL_SIZE:
            size = end - addr  # a large block whose remainder was not worth splitting
        if start < addr:
            table[start][0] = addr - start
            starts.insert(i + 1, addr)
        table[addr] = [size, requested]
        if addr + size < end:
            insort(starts, addr + size)
            table[addr + size] = [end - addr - size, 0]

    def undo_segment_alloc(self, addr: int, size: int) -> None:
        seg = self.segments.get(addr)
        if seg is None or seg[0] != size or len(seg[2]) != 1 or seg[3][addr][1]:
            self.inconsistent += 1
            return
        del self.segments[addr]
        self.starts.remove(addr)

    def undo_segment_free(self, addr: int, size: int, stream: int) -> None:
        if self._segment_of(addr) is not None:
            self.inconsistent += 1
            return
        self.add_segment(addr, size, stream, [BlockState(addr, size, 0)])

    def state(self) -> tuple[SegmentState, ...]:
        return tuple(
            SegmentState(
                address,
                size,
                stream,
                tuple(BlockState(s, table[s][0], table[s][1]) for s in starts),
            )
            for address in self.starts
            for size, stream, starts, table in (self.segments[address],)
        )


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
    # An expandable segment grows by mapping pages, which this rewind does not model; such
    # recordings are replayed from an empty start, exact when they started empty.
    if not (settings.expandable_segments and reserved_start == 0):
        for seg in end_segments:
            rewind.add_segment(
                seg["address"], seg["total_size"], seg.get("stream", 0), _blocks_of(seg)
            )
        for entry in reversed(entries):
            action = entry["action"]
            if action == "alloc":
                rewind.undo_alloc(entry["addr"])
            elif action == "free_requested":
                rewind.undo_free(entry["addr"], entry["size"])
            elif action in ("segment_alloc", "segment_map"):
                rewind.undo_segment_alloc(entry["addr"], entry["size"])
            elif action in ("segment_free", "segment_unmap"):
                rewind.undo_segment_free(entry["addr"], entry["size"], entry.get("stream", 0))
    start = rewind.state()

    events: list[TraceEvent] = []
    live = {b.address: b.requested_size for s in start for b in s.blocks if b.requested_size}
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
