"""What a snapshot recorded beyond its allocation events (:class:`Recording`): the state its
allocator was in when recording began (:class:`SegmentState`, :class:`BlockState`, rewound by
:mod:`._rewind`) and PyTorch's own figures. Plain data: a replay reads it."""

from __future__ import annotations

from dataclasses import dataclass

from ..memory._config import AllocatorConfig

__all__ = [
    "FAILED_ADDR",
    "UNLIMITED_CAPACITY",
    "UNMAPPED",
    "BlockState",
    "Recording",
    "SegmentState",
]

FAILED_ADDR = 0
"""The address of a recorded request that ran out of memory (it never got one): the
``alloc`` event ``trace_from_snapshot`` writes for an ``oom`` entry."""

UNLIMITED_CAPACITY = 1 << 50
"""Simulated capacity for a recording that shows no limit (1 PiB: it never runs out)."""


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
        The segments and blocks when recording began (rewound from the end state); each one
        can be restored by ``CachingAllocator.restore_segment`` on the simulated device.
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
        what was reserved then), else None; None too where that would not hold the start state.
    inconsistent_events : int
        Events the rewind could not place (the ring buffer dropped their context), plus
        segments left out of the start state because their blocks do not tile them, they
        overlap another segment, or the allocator could not restore them as they are.
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
