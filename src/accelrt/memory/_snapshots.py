"""Memory history, snapshots and the summary table: why memory ran out, in PyTorch's format.

Mirrors ``torch.cuda.memory._record_memory_history``, ``torch.cuda.memory._snapshot``,
``torch.cuda.memory._dump_snapshot`` and ``torch.cuda.memory_summary``; the snapshot's keys are
PyTorch's, so ``torch.cuda._memory_viz`` and pytorch.org/memory_viz read what
``dump_snapshot`` writes (docs/allocator.md section 10).
"""

from __future__ import annotations

import os
import pickle
import sys
from collections.abc import Sequence

from .. import _runtime
from .._device import DeviceLike
from .device import _registry
from .device._block import PoolId
from .history._history import ACTIONS, SNAPSHOT_SCHEMA_VERSION, Snapshot, TraceEntry
from .history._summary import format_summary

__all__ = ["dump_snapshot", "memory_snapshot", "memory_summary", "record_memory_history"]

_ENABLED = ("all", "state")
_CONTEXTS = ("all", "alloc", "state")


def record_memory_history(
    enabled: str | None = "all",
    context: str | None = "all",
    stacks: str = "python",
    max_entries: int = sys.maxsize,
    device: DeviceLike = None,
    clear_history: bool = False,
    skip_actions: Sequence[str] | None = None,
) -> None:
    """Start or stop recording allocator history on a device.

    Parameters
    ----------
    enabled : {"all", "state"} or None
        "all": keep a ring buffer of every allocator action (alloc, free_requested,
        free_completed, segment_alloc, segment_free, oom) and the stacks of live blocks;
        "state": only the stacks of live blocks; None: stop and discard the history.
    context : {"all", "alloc", "state"} or None
        Which actions capture a Python stack: "all" allocations and frees; "alloc" and
        "state" allocations (whose stacks live blocks keep); None no stacks (cheapest).
    stacks : {"python", "all"}
        Stacks are Python frames; "all" is accepted for PyTorch compatibility and means the
        same here (accelrt has no C++ frames to add).
    max_entries : int
        Ring buffer length (>= 1); the oldest entries are dropped first.
    device : int, str, Device or None
        The device (the current device if None). Creates its allocator if needed.
    clear_history : bool
        Start from an empty buffer. Otherwise calling it again while recording keeps what was
        recorded (the newest ``max_entries`` entries) and applies the new modes from now on.
    skip_actions : sequence of str, optional
        Actions not to record, among "alloc", "free_requested", "free_completed",
        "segment_alloc", "segment_free", "segment_map", "segment_unmap" and "oom" (live
        blocks keep their stacks all the same).

    Raises
    ------
    ValueError
        For a mode not listed above, ``max_entries < 1`` or an unknown action in
        ``skip_actions`` (the message lists them).
    RuntimeError, TypeError
        As ``set_device_index`` for a bad device; ``TypeError`` if ``skip_actions`` is a
        string (give a list) or ``clear_history`` not a bool.

    Notes
    -----
    Mirrors ``torch.cuda.memory._record_memory_history`` (PyTorch 2.13's arguments but
    ``compile_context`` and ``global_record_annotations``: accelrt has no compiler and no
    annotations; docs/conformance.md). ``enabled=None`` stops and discards the history.
    """
    if enabled not in (*_ENABLED, None):
        raise ValueError(f"enabled must be 'all', 'state' or None, got {enabled!r}")
    if context not in (*_CONTEXTS, None):
        raise ValueError(f"context must be 'all', 'alloc', 'state' or None, got {context!r}")
    if stacks not in ("python", "all"):
        raise ValueError(f"stacks must be 'python' or 'all', got {stacks!r}")
    if isinstance(max_entries, bool) or not isinstance(max_entries, int) or max_entries < 1:
        raise ValueError(f"max_entries must be an int >= 1, got {max_entries!r}")
    if not isinstance(clear_history, bool):
        raise TypeError(f"clear_history must be a bool, got {clear_history!r}")
    if isinstance(skip_actions, str):
        raise TypeError(f"skip_actions must be a list of actions, got the string {skip_actions!r}")
    skip = frozenset(skip_actions or ())
    if not skip <= ACTIONS:
        unknown = ", ".join(sorted(map(repr, skip - ACTIONS)))
        raise ValueError(
            f"skip_actions: unknown action {unknown}; the actions are {', '.join(sorted(ACTIONS))}"
        )
    backend, index = _runtime.resolve_device(device)
    _registry.get_allocator(backend, index).record_history(
        enabled,  # type: ignore[arg-type]
        context,  # type: ignore[arg-type]
        max_entries,
        skip,
        clear_history,
    )


def memory_snapshot(mempool_id: PoolId | None = None, include_traces: bool = True) -> Snapshot:
    """Return the state of every device allocator of the accelerator, and their histories.

    Parameters
    ----------
    mempool_id : tuple of (int, int), optional
        Only the segments of this private pool (``MemPool.id``; ``(0, 0)`` the default
        pools); every segment when None.
    include_traces : bool
        False leaves ``device_traces`` empty (one empty list per device): the state only.

    Returns
    -------
    dict
        ``{"segments": [...], "device_traces": [[...] per device], "allocator_settings": {...},
        "accelrt_schema_version": 1}`` with PyTorch's key names (see
        ``accelrt.memory.history._history.Snapshot``). Segments list their blocks in address order
        with states ``active_allocated``, ``active_pending_free`` or ``inactive``; a device
        without history has an empty trace.

    Raises
    ------
    RuntimeError
        If there is no accelerator.

    Notes
    -----
    Creates no allocator and initialises nothing. Mirrors ``torch.cuda.memory._snapshot``
    (and its ``mempool_id`` and ``include_traces`` arguments). Under ``policy:accelrt``,
    ``allocator_settings["accelrt_policy"]`` lists each device's adoptions, reclaims and pages
    moved (docs/allocator.md section 16.4); PyTorch's readers ignore the key.
    """
    backend = _runtime.require_accelerator()
    segments = []
    traces: list[list[TraceEntry]] = []
    config = _registry.allocator_config()
    settings = config.to_torch_settings()
    counters: list[dict[str, int]] = []  # policy:accelrt's, per device (accelrt only)
    for index in range(backend.device_count()):
        allocator = _registry.peek_allocator(backend, index)
        if allocator is None:
            traces.append([])
            continue
        device_segments, entries = allocator.snapshot(mempool_id, include_traces)
        segments.extend(device_segments)
        traces.append(entries)
        counters.append({"device": index, **allocator.policy_counters})
    if config.policy == "accelrt":
        settings["accelrt_policy"] = counters
    return Snapshot(
        segments=segments,
        device_traces=traces,
        allocator_settings=settings,
        accelrt_schema_version=SNAPSHOT_SCHEMA_VERSION,
    )


def dump_snapshot(path: str | os.PathLike[str]) -> None:
    """Pickle ``memory_snapshot()`` to ``path`` for PyTorch's viewers or ``accelrt snapshot``.

    Raises
    ------
    OSError
        If the file cannot be written.
    RuntimeError
        If there is no accelerator.

    Notes
    -----
    The pickle holds plain data only (dicts, lists, tuples, strings, numbers), so accelrt's
    restricted reader and ``torch.cuda._memory_viz`` both load it. Mirrors
    ``torch.cuda.memory._dump_snapshot``.
    """
    snapshot = memory_snapshot()
    with open(path, "wb") as f:
        pickle.dump(snapshot, f, protocol=4)


def memory_summary(device: DeviceLike = None, abbreviated: bool = False) -> str:
    """Return the allocator statistics of a device as PyTorch's summary table.

    Parameters
    ----------
    device : int, str, Device or None
        The device (the current device if None).
    abbreviated : bool
        Leave out the large-pool and small-pool sub-rows.

    Returns
    -------
    str
        Rows for allocated, active, requested, reserved and non-releasable memory;
        allocations, active allocs, segments, non-releasable allocs; oversize allocations and
        segments. Columns: current, peak, total allocated, total freed; units chosen as
        PyTorch does. All zero before the device's allocator exists.

    Raises
    ------
    RuntimeError, TypeError, ValueError
        As ``set_device_index`` for a bad device.

    Notes
    -----
    Mirrors ``torch.cuda.memory_summary``.
    """
    backend, index = _runtime.resolve_device(device, init=False)
    allocator = _registry.peek_allocator(backend, index)
    stats = allocator.memory_stats() if allocator is not None else {}
    return format_summary(stats, f"{backend.name}:{index}", abbreviated=abbreviated)
