"""Memory history and snapshots in PyTorch's format (docs/allocator.md section 10).

``History`` is the per-device ring buffer behind ``record_memory_history``: one entry per
allocator action with the Python stack that caused it. It observes the allocator through one
hook (:meth:`History.record`), so the allocator's hot path holds no history code. The
``TypedDict`` classes are the snapshot schema that ``memory_snapshot()`` returns and
``dump_snapshot`` pickles; the key names are PyTorch's, so ``torch.cuda._memory_viz`` and
pytorch.org/memory_viz read our files.

Stacks are captured cheaply: the hot path keeps ``(code, line)`` pairs and turns them into
frame dicts only when a snapshot is taken.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from collections import deque
from types import CodeType
from typing import Literal, Protocol, TypedDict

__all__ = [
    "SNAPSHOT_SCHEMA_VERSION",
    "Annotation",
    "BlockInfo",
    "Frame",
    "History",
    "RawFrames",
    "SegmentInfo",
    "Snapshot",
    "TraceEntry",
    "capture_frames",
    "frames_to_dicts",
    "get_user_metadata",
    "set_user_metadata",
]

SNAPSHOT_SCHEMA_VERSION = 2
"""Version of the ``accelrt_schema_version`` key; bumped when the schema changes (2: the
``external_annotations`` list)."""

MAX_STACK_DEPTH = 64
RawFrames = tuple[tuple[CodeType, int], ...]
EnabledMode = Literal["all", "state"]
ContextMode = Literal["all", "alloc", "state"]


class Frame(TypedDict):
    """One Python stack frame: file, line number and function name."""

    filename: str
    line: int
    name: str


class _BlockKeys(TypedDict):
    address: int
    size: int
    requested_size: int
    state: str
    frames: list[Frame]


class BlockInfo(_BlockKeys, total=False):
    """A block of a segment. ``state``: active_allocated, active_pending_free or inactive.

    ``stream`` (accelrt's, not PyTorch's) is there only in an arena of ``policy:accelrt``,
    whose blocks belong to several streams: the block's owner stream (docs/allocator.md 16.5).
    """

    stream: int


class SegmentInfo(TypedDict):
    """A segment and its blocks in address order (PyTorch's ``SegmentInfo`` keys)."""

    device: int
    address: int
    total_size: int
    allocated_size: int
    active_size: int
    requested_size: int
    stream: int
    segment_type: str
    segment_pool_id: tuple[int, int]
    is_expandable: bool
    frames: list[Frame]
    blocks: list[BlockInfo]


class _TraceEntryRequired(TypedDict):
    action: str
    size: int
    stream: int
    time_us: int
    frames: list[Frame]


class TraceEntry(_TraceEntryRequired, total=False):
    """One history entry.

    ``action`` is alloc, free_requested, free_completed, segment_alloc, segment_free,
    segment_map, segment_unmap, snapshot or oom; an ``oom`` entry has ``device_free`` (bytes)
    where the others have ``addr``, as in PyTorch. ``user_metadata``: the recording thread's
    ``set_memory_metadata`` string, when one was set.
    """

    addr: int
    device_free: int
    user_metadata: str


class Annotation(TypedDict):
    """One edge of a named stage (``accelrt.memory.record_function``): ``stage`` is "START"
    or "END"; ``time_us`` on the clock of the trace entries' ``time_us``. PyTorch's
    ``external_annotations`` entries, as ``torch.profiler.record_function`` makes them."""

    name: str
    stage: str
    device: int
    time_us: int


class Snapshot(TypedDict):
    """What ``memory_snapshot()`` returns; ``device_traces[i]`` is device i's history, and
    ``external_annotations`` every device's named stages, device by device, oldest first."""

    segments: list[SegmentInfo]
    device_traces: list[list[TraceEntry]]
    external_annotations: list[Annotation]
    allocator_settings: dict[str, object]
    accelrt_schema_version: int


_HISTORY_DIR = os.path.dirname(os.path.abspath(__file__))  # accelrt/memory/history
_PACKAGE_DIR = os.path.dirname(os.path.dirname(_HISTORY_DIR)) + os.sep  # accelrt/


def capture_frames(skip: int = 2) -> RawFrames:
    """Return the caller's Python stack (innermost first), from the first frame outside accelrt.

    ``skip`` frames are dropped first, then frames in accelrt's own package. Costs about a
    microsecond per frame: only code objects and line numbers are kept.
    """
    frame = sys._getframe(skip)
    while frame.f_back is not None and frame.f_code.co_filename.startswith(_PACKAGE_DIR):
        frame = frame.f_back
    out: list[tuple[CodeType, int]] = []
    while frame is not None and len(out) < MAX_STACK_DEPTH:
        out.append((frame.f_code, frame.f_lineno))
        frame = frame.f_back  # type: ignore[assignment]
    return tuple(out)


def frames_to_dicts(frames: RawFrames | None) -> list[Frame]:
    """Turn captured frames into snapshot frame dicts."""
    if not frames:
        return []
    return [Frame(filename=c.co_filename, line=n, name=c.co_name) for c, n in frames]


class _UserMetadata(threading.local):
    value = ""


_USER_METADATA = _UserMetadata()


def set_user_metadata(metadata: str) -> None:
    """Set the calling thread's ``user_metadata`` for the entries it records ("" clears)."""
    _USER_METADATA.value = metadata


def get_user_metadata() -> str:
    """Return the calling thread's ``user_metadata`` ("" when none is set)."""
    return _USER_METADATA.value


ACTIONS = frozenset({
    "alloc", "free_requested", "free_completed", "segment_alloc", "segment_free", "segment_map",
    "segment_unmap", "oom", "annotate",
})  # fmt: skip
"""The actions a history records (PyTorch's trace entry actions)."""


class StackOwner(Protocol):
    """What keeps the stack that made it: a block or a segment (device/_block.py)."""

    frames: RawFrames | None


class History:
    """The ring buffer of one device's allocator actions.

    Parameters
    ----------
    enabled : {"all", "state"}
        "all" records every action; "state" keeps only the stacks of live blocks.
    context : {"all", "alloc", "state"} or None
        Which actions get a Python stack: "all" allocations and frees, "alloc" and "state"
        allocations only, None none.
    max_entries : int
        Ring buffer size; the oldest entries are dropped first.
    skip_actions : frozenset of str
        Actions kept out of the buffer (live blocks keep their stacks all the same).
    previous : History, optional
        A history whose entries and annotations this one starts with (the newest
        ``max_entries`` of each).
    global_annotations : bool
        Keep the annotations of every thread; False: only those of the thread that made this
        history (PyTorch's ``global_record_annotations``).
    """

    __slots__ = (
        "annotation_thread",
        "annotations",
        "context",
        "enabled",
        "entries",
        "skip_actions",
        "stack_allocs",
        "stack_frees",
    )

    def __init__(
        self,
        enabled: EnabledMode,
        context: ContextMode | None,
        max_entries: int,
        skip_actions: frozenset[str] = frozenset(),
        previous: History | None = None,
        global_annotations: bool = False,
    ) -> None:
        self.enabled = enabled
        self.context = context
        self.skip_actions = skip_actions
        self.entries: deque[tuple[str, int, int, int, int, RawFrames | None, int, str]] = deque(
            () if previous is None else previous.entries, maxlen=max_entries
        )
        self.stack_allocs = context is not None
        self.stack_frees = context == "all"
        self.annotations: deque[tuple[str, str, int]] = deque(
            () if previous is None else previous.annotations, maxlen=max_entries
        )
        self.annotation_thread = None if global_annotations else threading.get_ident()

    def record(
        self,
        action: str,
        addr: int,
        size: int,
        stream: int,
        owner: StackOwner | None = None,
        device_free: int = 0,
    ) -> None:
        """Observe one allocator action: the allocator's only history hook.

        Parameters
        ----------
        action : str
            "alloc", "free_requested", "free_completed", "segment_alloc", "segment_free",
            "segment_map", "segment_unmap" or "oom" ("annotate" entries come from
            :meth:`annotate_allocation`).
        addr, size, stream : int
            The entry's address, bytes (the requested size for alloc and frees, the segment's
            or mapped range's bytes for segment entries, the rounded request for "oom") and
            stream handle.
        owner : Block or segment, optional
            The block allocated or freed, or the segment created: allocations and new
            segments keep the stack that made them (for snapshots); completed frees drop it.
        device_free : int
            For "oom": the device's free bytes.

        Notes
        -----
        Stacks are captured here, inside the allocator call, so they show the caller's frames.
        In "state" mode no entry is kept, only the stacks of live blocks.
        """
        frames: RawFrames | None = None
        if action == "free_completed":
            if owner is not None:
                owner.frames = None
        elif self.stack_frees if action == "free_requested" else self.stack_allocs:
            frames = capture_frames()
            # a segment keeps the stack of its first mapping; frees keep none
            if (
                owner is not None
                and action != "free_requested"
                and (action != "segment_map" or owner.frames is None)
            ):
                owner.frames = frames
        if self.enabled == "all" and action not in self.skip_actions:
            now_us = time.time_ns() // 1000
            self.entries.append(
                (action, addr, size, stream, now_us, frames, device_free, _USER_METADATA.value)
            )

    def annotate_allocation(self, addr: int, size: int, stream: int, metadata: str) -> None:
        """Keep an ``annotate`` entry for the live allocation at ``addr`` (``size`` bytes):
        ``metadata`` as its ``user_metadata``, the caller's stack as allocations keep theirs;
        in "all" mode, unless ``skip_actions`` has "annotate"."""
        if self.enabled == "all" and "annotate" not in self.skip_actions:
            frames = capture_frames() if self.stack_allocs else None
            now_us = time.time_ns() // 1000
            self.entries.append(("annotate", addr, size, stream, now_us, frames, 0, metadata))

    def annotate(self, name: str, stage: str) -> None:
        """Keep one edge of a named stage (``stage`` "START" or "END"), in "all" mode, from
        the thread that started the history unless annotations are global."""
        if self.enabled == "all" and (
            self.annotation_thread is None or self.annotation_thread == threading.get_ident()
        ):
            self.annotations.append((name, stage, time.time_ns() // 1000))

    def to_annotations(self, device: int) -> list[Annotation]:
        """Return the kept annotations as snapshot ``external_annotations`` entries."""
        return [
            Annotation(name=name, stage=stage, device=device, time_us=time_us)
            for name, stage, time_us in self.annotations
        ]

    def to_entries(self) -> list[TraceEntry]:
        """Return the buffer as snapshot trace entries, oldest first."""
        out: list[TraceEntry] = []
        for action, addr, size, stream, time_us, frames, device_free, metadata in self.entries:
            entry = TraceEntry(
                action=action,
                size=size,
                stream=stream,
                time_us=time_us,
                frames=frames_to_dicts(frames),
            )
            if action == "oom":
                entry["device_free"] = device_free
            else:
                entry["addr"] = addr
            if metadata:
                entry["user_metadata"] = metadata
            out.append(entry)
        return out
