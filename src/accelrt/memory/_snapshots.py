"""Memory history, snapshots and the summary table: why memory ran out, in PyTorch's format.

Mirrors ``torch.cuda.memory._record_memory_history``, ``torch.cuda.memory._snapshot``,
``torch.cuda.memory._dump_snapshot``, ``torch.cuda.memory_summary`` and, for the named stages
a snapshot carries, ``torch.profiler.record_function``; the snapshot's keys are
PyTorch's, so ``torch.cuda._memory_viz`` and pytorch.org/memory_viz read what
``dump_snapshot`` writes (docs/allocator.md section 10).
"""

from __future__ import annotations

import os
import pickle
import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager

from .. import _runtime
from .._device import DeviceLike
from .buffers._buffer import Buffer
from .device import _registry
from .device._block import PoolId
from .history._history import (
    ACTIONS,
    SNAPSHOT_SCHEMA_VERSION,
    Annotation,
    Snapshot,
    TraceEntry,
    get_user_metadata,
    set_user_metadata,
)
from .history._summary import format_summary

__all__ = [
    "annotate_buffer",
    "dump_snapshot",
    "get_memory_metadata",
    "memory_snapshot",
    "memory_summary",
    "record_function",
    "record_memory_history",
    "set_memory_metadata",
]

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
    *,
    compile_context: bool = False,
    global_record_annotations: bool = False,
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
    compile_context : bool
        Accepted for PyTorch compatibility; records nothing (accelrt has no compiled regions
        whose names PyTorch puts in each entry's ``compile_context``).
    global_record_annotations : bool
        Keep the named stages (:func:`record_function`) of every thread; False (default):
        only those of the thread that calls this function, as PyTorch's thread-local
        callback does.

    Raises
    ------
    ValueError
        For a mode not listed above, ``max_entries < 1`` or an unknown action in
        ``skip_actions`` (the message lists them).
    RuntimeError, TypeError
        As ``set_device_index`` for a bad device; ``TypeError`` if ``skip_actions`` is a
        string (give a list), or ``clear_history``, ``compile_context`` or
        ``global_record_annotations`` is not a bool.

    Notes
    -----
    Mirrors ``torch.cuda.memory._record_memory_history`` (PyTorch 2.14's arguments but
    ``record_pinned_host_memory`` and ``record_cuda``; docs/conformance.md).
    ``enabled=None`` stops and discards the history and its named stages. Named stages are
    kept in "all" mode only (as the entries are), in a ring of ``max_entries`` of their own.
    """
    if enabled not in (*_ENABLED, None):
        raise ValueError(f"enabled must be 'all', 'state' or None, got {enabled!r}")
    if context not in (*_CONTEXTS, None):
        raise ValueError(f"context must be 'all', 'alloc', 'state' or None, got {context!r}")
    if stacks not in ("python", "all"):
        raise ValueError(f"stacks must be 'python' or 'all', got {stacks!r}")
    if isinstance(max_entries, bool) or not isinstance(max_entries, int) or max_entries < 1:
        raise ValueError(f"max_entries must be an int >= 1, got {max_entries!r}")
    for name, flag in (
        ("clear_history", clear_history),
        ("compile_context", compile_context),
        ("global_record_annotations", global_record_annotations),
    ):
        if not isinstance(flag, bool):
            raise TypeError(f"{name} must be a bool, got {flag!r}")
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
        global_record_annotations,
    )


def _annotate(name: str, stage: str) -> None:
    """Add a stage edge to the history of this thread's current device, if it has one."""
    backend = _runtime.accelerator()
    if backend is None:
        return
    allocator = _registry.peek_allocator(backend, _runtime.current_index(backend))
    if allocator is not None:
        allocator.record_annotation(name, stage)


@contextmanager
def record_function(name: str) -> Iterator[None]:
    """Mark a named stage of the run (``"forward"``, ``"optimizer"``, ...) in the memory history.

    Use it as ``with record_function(name):`` or as a decorator ``@record_function(name)``.

    Parameters
    ----------
    name : str
        The stage's name.

    Raises
    ------
    TypeError
        If ``name`` is not a string.

    Notes
    -----
    On entering and on leaving (exceptions included), an entry ``{"name": name, "stage":
    "START"`` or ``"END", "device": i, "time_us": t}`` is added to the history of the
    calling thread's current device i, if it records one (``record_memory_history`` in
    "all" mode; only on the thread that started it unless ``global_record_annotations``).
    ``memory_snapshot()`` returns them as ``external_annotations``, as PyTorch's snapshots
    carry the ranges of ``torch.profiler.record_function``; ``time_us`` is on the clock of
    the trace entries. Without a history, or without an accelerator, it does nothing (a
    microsecond). Stages nest and may overlap.
    """
    if not isinstance(name, str):
        raise TypeError(f"record_function() takes a stage name (str), got {name!r}")
    _annotate(name, "START")
    try:
        yield
    finally:
        _annotate(name, "END")


def set_memory_metadata(metadata: str) -> None:
    """Stamp the history entries the calling thread records from now on with ``metadata``.

    Parameters
    ----------
    metadata : str
        Any text (a phase, a layer, a request id); "" stops stamping.

    Raises
    ------
    TypeError
        If ``metadata`` is not a string.

    Notes
    -----
    Thread-local, for every device: each entry the thread's allocator calls record while a
    history is recorded gets ``"user_metadata": metadata`` (entries recorded with none set
    have no such key; PyTorch's carry ``""``). Segments, blocks and ``memory_stats`` are not
    affected. Mirrors ``torch.cuda.memory._set_memory_metadata``.
    """
    if not isinstance(metadata, str):
        raise TypeError(f"set_memory_metadata() takes a string, got {metadata!r}")
    set_user_metadata(metadata)


def annotate_buffer(buffer: Buffer, metadata: str) -> None:
    """Attach ``metadata`` to a live buffer's allocation, after the fact, in the history.

    Parameters
    ----------
    buffer : Buffer
        Device memory from :func:`empty` (a 0-byte buffer has no allocation: nothing is kept).
    metadata : str
        Any text, e.g. "saved for backward".

    Raises
    ------
    TypeError
        If ``buffer`` is not a :class:`Buffer` or ``metadata`` is not a string.
    ValueError
        If the buffer was freed.

    Notes
    -----
    While a history is recorded in "all" mode, adds an entry ``{"action": "annotate", "addr":
    <the allocation's address>, "size": <its bytes>, "user_metadata": metadata, "frames":
    <the caller's stack>, ...}``; otherwise it has no effect. The allocation's own entry is
    not changed: annotations pile up as entries of their own, which PyTorch's memory
    visualizer shows beside the allocation. Mirrors ``torch.cuda.memory._annotate_tensor``
    (PyTorch 2.14), for a buffer instead of a tensor.
    """
    if not isinstance(buffer, Buffer):
        raise TypeError(f"annotate_buffer() takes a Buffer, got {type(buffer).__name__}")
    if not isinstance(metadata, str):
        raise TypeError(f"annotate_buffer() takes a string as metadata, got {metadata!r}")
    if buffer.nbytes == 0:
        return
    buffer.allocator.annotate_block(buffer.block, metadata)


def get_memory_metadata() -> str:
    """Return the calling thread's ``set_memory_metadata`` string ("" when none is set).

    Mirrors ``torch.cuda.memory._get_memory_metadata``.
    """
    return get_user_metadata()


def memory_snapshot(mempool_id: PoolId | None = None, include_traces: bool = True) -> Snapshot:
    """Return the state of every device allocator of the accelerator, and their histories.

    Parameters
    ----------
    mempool_id : tuple of (int, int), optional
        Only the segments of this private pool (``MemPool.id``; ``(0, 0)`` the default
        pools); every segment when None.
    include_traces : bool
        False leaves ``device_traces`` empty (one empty list per device) and
        ``external_annotations`` empty: the state only.

    Returns
    -------
    dict
        ``{"segments": [...], "device_traces": [[...] per device], "external_annotations":
        [...], "allocator_settings": {...}, "accelrt_schema_version": 2}`` with PyTorch's key
        names (see
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
    annotations: list[Annotation] = []
    for index in range(backend.device_count()):
        allocator = _registry.peek_allocator(backend, index)
        if allocator is None:
            traces.append([])
            continue
        device_segments, entries = allocator.snapshot(mempool_id, include_traces)
        segments.extend(device_segments)
        traces.append(entries)
        counters.append({"device": index, **allocator.policy_counters})
        if include_traces:
            annotations.extend(allocator.annotations())
    if config.policy == "accelrt":
        settings["accelrt_policy"] = counters
    return Snapshot(
        segments=segments,
        device_traces=traces,
        external_annotations=annotations,
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
