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

from .. import _runtime
from .._device import DeviceLike
from . import _registry
from ._history import SNAPSHOT_SCHEMA_VERSION, Snapshot, TraceEntry
from ._summary import format_summary

__all__ = ["dump_snapshot", "memory_snapshot", "memory_summary", "record_memory_history"]

_ENABLED = ("all", "state")
_CONTEXTS = ("all", "alloc", "state")


def record_memory_history(
    enabled: str | None = "all",
    context: str | None = "all",
    stacks: str = "python",
    max_entries: int = sys.maxsize,
    device: DeviceLike = None,
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

    Raises
    ------
    ValueError
        For a mode not listed above or ``max_entries < 1``.
    RuntimeError, TypeError
        As ``set_device_index`` for a bad device.

    Notes
    -----
    Mirrors ``torch.cuda.memory._record_memory_history``. Starting again empties the buffer.
    """
    if enabled not in (*_ENABLED, None):
        raise ValueError(f"enabled must be 'all', 'state' or None, got {enabled!r}")
    if context not in (*_CONTEXTS, None):
        raise ValueError(f"context must be 'all', 'alloc', 'state' or None, got {context!r}")
    if stacks not in ("python", "all"):
        raise ValueError(f"stacks must be 'python' or 'all', got {stacks!r}")
    if isinstance(max_entries, bool) or not isinstance(max_entries, int) or max_entries < 1:
        raise ValueError(f"max_entries must be an int >= 1, got {max_entries!r}")
    backend, index = _runtime.resolve_device(device)
    _registry.get_allocator(backend, index).record_history(
        enabled,  # type: ignore[arg-type]
        context,  # type: ignore[arg-type]
        max_entries,
    )


def memory_snapshot() -> Snapshot:
    """Return the state of every device allocator of the accelerator, and their histories.

    Returns
    -------
    dict
        ``{"segments": [...], "device_traces": [[...] per device], "allocator_settings": {...},
        "accelrt_schema_version": 1}`` with PyTorch's key names (see
        ``accelrt.memory._history.Snapshot``). Segments list their blocks in address order
        with states ``active_allocated``, ``active_pending_free`` or ``inactive``; a device
        without history has an empty trace.

    Raises
    ------
    RuntimeError
        If there is no accelerator.

    Notes
    -----
    Creates no allocator and initialises nothing. Mirrors ``torch.cuda.memory._snapshot``.
    """
    backend = _runtime.require_accelerator()
    segments = []
    traces: list[list[TraceEntry]] = []
    for index in range(backend.device_count()):
        allocator = _registry.peek_allocator(backend, index)
        if allocator is None:
            traces.append([])
            continue
        device_segments, entries = allocator.snapshot()
        segments.extend(device_segments)
        traces.append(entries)
    return Snapshot(
        segments=segments,
        device_traces=traces,
        allocator_settings=_registry.allocator_config().to_torch_settings(),
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
