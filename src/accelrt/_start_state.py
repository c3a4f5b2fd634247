"""The state a recording began with, rebuilt under a setting other than the one it was made with.

Most PyTorch memory recordings start mid-run: segments and blocks existed before the first
recorded event. Under the recorded setting the replay restores them exactly as the recording had
them (rewound from its end state). Under any other setting that layout is wrong: the setting
would have built its own segments during the unrecorded part of the run. Nothing of that part
was recorded, so it is modelled (docs/snapshot-replay.md, "Recordings that start mid-run"):

- the blocks live at the start are allocated afresh under the candidate setting, in address
  order (the order the recording's allocator placed them in, which follows their age);
- before the first event the unrecorded part also held memory that was freed again: the
  recording's cached free blocks are what is left of it. A share of their bytes, largest blocks
  first (a block that would pass the share is skipped for smaller ones), is taken as live beside
  the live blocks: allocated in the same address order, then freed, so the candidate setting
  builds segments for them as it would have;
- the share is calibrated once per recording (bisection, 1/4096 steps): the smallest with which
  the modelled run under the *recorded* setting reaches the recorded peak reserved bytes.

A share of 0 (only the live blocks: the least the unrecorded part can have needed) and of 1
(every cached block live at once) give the range a replay reports beside its estimate.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable
from typing import TYPE_CHECKING, Literal

from ._errors import InputError, OutOfMemoryError
from .memory._config import AllocatorConfig
from .memory._policy import round_size, segment_size

if TYPE_CHECKING:  # annotations only: the CLI imports this module to build its parser
    from .memory.device._block import Block
    from .memory.device._core import CachingAllocator
    from .trace._recording import Recording

__all__ = [
    "STARTS",
    "StartKind",
    "StartStateError",
    "cached_bytes",
    "cached_free_blocks",
    "calibrated_share",
    "check_start",
    "decides_alike",
    "describe_start",
    "largest_size",
    "rebuild_start",
]

StartKind = Literal["empty", "recorded", "modelled"]
STARTS = ("modelled", "recorded")
"""What ``replay(start=...)``, ``sweep(start=...)`` and ``--start`` take."""


def check_start(start: str) -> None:
    """Raise ``ValueError`` naming ``start`` unless it is one of :data:`STARTS`."""
    if start not in STARTS:
        raise ValueError(f"start must be 'modelled' or 'recorded', got {start!r}")


class StartStateError(InputError):
    """A setting cannot hold the blocks a recording began with (on the device replayed)."""


_CALIBRATED: dict[int, tuple[Recording, float]] = {}
"""Calibrated share per recording (by identity; the recording is kept so the id stays its own)."""
_CALIBRATED_KEPT = 16
_STEPS = 4096
"""The calibration's resolution: shares are multiples of 1/4096."""


def decides_alike(recorded: AllocatorConfig, setting: AllocatorConfig, largest: int) -> bool:
    """Whether two settings take the same decisions for every size up to ``largest`` bytes.

    Then the recorded start state is the candidate setting's too, and exact. Holds when the
    settings differ only in ``release_lock_on_malloc`` (no decision depends on it), in
    ``max_split_size_mb`` / ``max_non_split_rounding_mb`` where both limits lie above
    ``largest`` (no block or request reaches them), and in ``roundup_power2_divisions`` slots
    of sizes above ``largest``. ``largest`` should bound every request and segment of the run:
    the largest start segment and recorded request (the unrecorded part's requests each fit
    in a segment).
    """

    def without_sized_rules(config: AllocatorConfig) -> AllocatorConfig:
        return dataclasses.replace(
            config,
            max_split_size=None,
            max_non_split_rounding=AllocatorConfig().max_non_split_rounding,
            roundup_power2_divisions=AllocatorConfig().roundup_power2_divisions,
            release_lock_on_malloc=False,
        )

    if without_sized_rules(recorded) != without_sized_rules(setting):
        return False
    limits = (recorded.max_split_size, setting.max_split_size)
    same_limit = limits[0] == limits[1] and (
        recorded.max_non_split_rounding == setting.max_non_split_rounding
    )
    if not same_limit and any(m is not None and m <= largest for m in limits):
        return False
    slots = recorded.slot_for(largest) + 1
    return [max(d, 1) for d in recorded.roundup_power2_divisions[:slots]] == [
        max(d, 1) for d in setting.roundup_power2_divisions[:slots]
    ]


def largest_size(recording: Recording, largest_request: int) -> int:
    """The bound :func:`decides_alike` needs, in bytes: the largest start segment (of an
    expandable one, its largest block) and the segment the largest request would get."""
    settings = recording.settings
    sizes = [segment_size(round_size(largest_request, settings), settings.large_segment_size)]
    for segment in recording.start_segments:
        if segment.is_expandable:
            sizes.extend(b.size for b in segment.blocks)
        else:
            sizes.append(segment.size)
    return max(sizes)


def describe_start(kind: StartKind, share: float | None, cached_bytes: int) -> str:
    """One line saying how a replay built its start state, for tables and banners.

    ``kind`` as ``ReplayReport.start_state``; ``share`` and ``cached_bytes`` as its
    ``start_transient_share`` and ``start_cached_bytes``.
    """
    if kind == "empty":
        return "empty (the trace starts with the process)"
    if kind == "recorded":
        return "recorded (the recording's own segments and blocks)"
    return (
        f"modelled (live blocks re-placed; {share or 0.0:.1%} of the {cached_bytes:,} cached "
        "bytes taken as live before the first event)"
    )


def cached_free_blocks(recording: Recording) -> list[tuple[int, int, int]]:
    """The recording's free blocks at its start as ``(bytes, address, stream)``, largest first.

    Ties break by the lower address, so the order (and every ``k``) is reproducible.
    """
    free = [
        (b.size, b.address, s.stream)
        for s in recording.start_segments
        for b in s.blocks
        if b.requested_size == 0
    ]
    free.sort(key=lambda f: (-f[0], f[1]))
    return free


def cached_bytes(recording: Recording) -> int:
    """The bytes of the recording's free blocks at its start (``cached_free_blocks``)."""
    return sum(size for size, _, _ in cached_free_blocks(recording))


def rebuild_start(
    allocator: CachingAllocator,
    recording: Recording,
    handle_of: Callable[[int], int],
    share: float,
) -> dict[int, Block]:
    """Allocate the recording's start state under ``allocator``'s setting (module docstring).

    Parameters
    ----------
    allocator : CachingAllocator
        A fresh allocator with the candidate setting.
    recording : Recording
        The recording whose start is rebuilt.
    handle_of : callable
        Maps a recorded stream to the allocator's stream handle.
    share : float
        The share (0 to 1) of the cached bytes to hold while the live blocks are placed.

    Returns
    -------
    dict of int to Block
        The live blocks by their recorded addresses (the trace frees them by these).

    Raises
    ------
    StartStateError
        If the device cannot hold the blocks live at the start under this setting (the
        message names the setting and the bytes). A cached block that does not fit is left
        out instead: the unrecorded part cannot have needed it at once under this setting.
    """
    chosen = _held_blocks(recording, share)
    live: dict[int, Block] = {}
    held: list[Block] = []
    placed = 0
    try:
        for segment in sorted(recording.start_segments, key=lambda s: s.address):
            stream = handle_of(segment.stream)
            for b in segment.blocks:
                if b.requested_size > 0:
                    live[b.address] = allocator.malloc(b.requested_size, stream)
                    placed += b.requested_size
                elif b.requested_size == 0 and b.address in chosen:
                    with contextlib.suppress(OutOfMemoryError):  # it cannot have been live
                        held.append(allocator.malloc(b.size, stream))
    except OutOfMemoryError:
        for block in (*held, *live.values()):
            allocator.free(block)
        total = sum(
            b.requested_size
            for seg in recording.start_segments
            for b in seg.blocks
            if b.requested_size > 0
        )
        raise StartStateError(
            f"the recording began with {total:,} bytes live; {allocator.device_name} ran out "
            f"after placing {placed:,} of them ({allocator.reserved_bytes:,} bytes reserved) "
            f"under setting {allocator.config.describe()!r}; give a larger capacity or replay "
            "with --start recorded"
        ) from None
    for block in held:
        allocator.free(block)
    return live


def _held_blocks(recording: Recording, share: float) -> set[int]:
    """Addresses of the cached blocks held for ``share``: largest first, within the share."""
    budget = share * cached_bytes(recording)
    chosen: set[int] = set()
    for size, address, _ in cached_free_blocks(recording):
        if size <= budget:
            chosen.add(address)
            budget -= size
    return chosen


def calibrated_share(recording: Recording, peak_with: Callable[[float], int]) -> float:
    """The share for :func:`rebuild_start`, found once per recording and kept.

    Parameters
    ----------
    recording : Recording
        The recording.
    peak_with : callable
        ``peak_with(share)``: the peak reserved bytes of the whole replay under the *recorded*
        setting, started from ``rebuild_start(..., share=share)``.

    Returns
    -------
    float
        The smallest share (bisection in steps of 1/4096) whose modelled run reaches the
        recorded peak reserved bytes; 0 where even 0 reaches it, 1 where none does.
    """
    kept = _CALIBRATED.get(id(recording))
    if kept is not None and kept[0] is recording:
        return kept[1]
    target = recording.peak_reserved_bytes
    lo, hi = 0, _STEPS
    if not cached_free_blocks(recording) or peak_with(0.0) >= target:
        hi = 0
    elif peak_with(1.0) >= target:
        while hi - lo > 1:  # peak_with(lo) < target <= peak_with(hi), in steps
            mid = (lo + hi) // 2
            if peak_with(mid / _STEPS) >= target:
                hi = mid
            else:
                lo = mid
    if len(_CALIBRATED) >= _CALIBRATED_KEPT:
        _CALIBRATED.pop(next(iter(_CALIBRATED)))
    _CALIBRATED[id(recording)] = (recording, hi / _STEPS)
    return hi / _STEPS
