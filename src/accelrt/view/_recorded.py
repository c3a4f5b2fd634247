"""What the picture of a snapshot's device takes from its entries and end segments before the
history is replayed: the distinct stacks (:class:`_Stacks`), per event its stack and time,
and the recorded OOMs (:class:`RecordedDetails`)."""

from __future__ import annotations

import array
import itertools
import operator
from collections.abc import Hashable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, cast

import numpy as np
import numpy.typing as npt

from ..trace._format import Trace
from ..trace._snapshot import device_segments
from ..trace._snapshot_schema import FileEntry, FileSegment, FileSnapshot
from ._model import Int64Array, RecordedOom, _allocating
from ._stacks import CleanStack, clean_stack

if TYPE_CHECKING:
    pass


__all__ = ["RecordedDetails", "recorded_details", "snapshot_details"]

_Cleaned = tuple[object, tuple[str, ...], tuple[str, ...], int]
"""A frame and what it adds to its stack (:func:`clean_stack` of it alone): Python lines, C++
lines, hidden frames; the frame is held so that its identity is not another's."""
_PYTHON_LINES, _NATIVE_LINES, _HIDDEN = (operator.itemgetter(n) for n in (1, 2, 3))
_CLEANED_FRAMES = 1 << 16
"""About the most frame dicts :class:`_Stacks` remembers cleaned (then it forgets them all):
PyTorch's snapshots share a few thousand among all their stacks."""


_FRAME_CONTENT = operator.itemgetter("name", "filename", "line")


def _content_key(frames: list[object]) -> Hashable:
    """The names, files and lines of the dict frames of ``frames``, three after three; the
    identity of ``frames`` where one of them cannot be hashed (a stack of its own)."""
    try:  # every frame a dict with all three (as PyTorch writes them): at C speed
        dicts = cast("list[dict[str, object]]", frames)  # a TypeError where one is not
        key = tuple(itertools.chain.from_iterable(map(_FRAME_CONTENT, dicts)))
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
        self._by_frames: dict[Hashable, int] = {}
        self._by_ids: dict[bytes, int] = {}
        self._lines: dict[str, str] = {}
        self._cleaned: dict[int, _Cleaned] = {}  # by the identity of the frame
        self._first: dict[tuple[int, ...], tuple[list[object], int]] = {}

    def intern(self, frames: object) -> int:
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

    def _by_content(self, frames: list[object]) -> int:
        key = _content_key(frames)
        ident = self._by_frames.get(key)
        if ident is None:
            ident = self._by_frames[key] = self.add(frames)
        return ident

    def add(self, frames: object) -> int:
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

    def _clean(self, frames: list[object]) -> list[_Cleaned]:
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
    ooms: list[RecordedOom]


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
    entries: Sequence[FileEntry] | None = None,
    end_segments: Sequence[FileSegment] = (),
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


def snapshot_details(snapshot: FileSnapshot, trace: Trace) -> RecordedDetails:
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
        device_segments(snapshot, device),
    )


def _entries_by_event(entries: Sequence[FileEntry], n_events: int) -> list[FileEntry] | None:
    """The snapshot entry behind each trace event (as ``trace_from_snapshot`` made them), or
    None where they do not line up with the ``n_events`` events."""
    out: list[FileEntry] = []
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


def _times(values: Sequence[object], scale: float) -> npt.NDArray[np.float64] | None:
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


def _recorded_ooms(
    entries: Sequence[FileEntry], reserved: int, stacks: _Stacks
) -> list[RecordedOom]:
    """The snapshot's ``oom`` entries with the reserved bytes PyTorch held then, starting from
    ``reserved`` when recording began; each request's stack added to ``stacks``."""
    ooms: list[RecordedOom] = []
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
