"""Replay an allocation trace through a fresh caching allocator and report what it did.

The question a replay answers: "with this allocator setting, on this device, how much memory
would this program reserve, how fragmented would it be, and would it fit?" On the simulated
device (``sim``) only addresses are handed out, so an 80 GiB GPU trace replays on a laptop; on
a real device (``opencl:0``) every segment is really allocated.
"""

from __future__ import annotations

import functools
import itertools
import time
import warnings
from collections.abc import Callable, Collection, Iterable
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from ._device import Device
from ._errors import OutOfMemoryError
from .backends._base import Backend, get_backend
from .backends.sim import SimBackend
from .memory._block import Block
from .memory._config import AllocatorConfig
from .memory._core import CachingAllocator
from .memory._history import SegmentInfo
from .memory._policy import MAX_REQUEST_BYTES
from .trace._columns import OP_ALLOC, OP_EMPTY_CACHE, OP_FREE, TraceEvents
from .trace._format import Trace

__all__ = ["OomRecord", "ReplayReport", "replay"]

ProgressCallback = Callable[[int, int], None]
_PROGRESS_EVERY = 4096
_CHUNK = 1 << 16
"""Events turned into Python lists at a time by the replay loop."""
_SKIP = 3
"""Work code of a zero-byte alloc: PyTorch hands out nothing for it."""
_TOO_BIG = 4
"""Work code of an alloc beyond ``MAX_REQUEST_BYTES``: an OOM without asking the allocator."""
UNLIMITED_CAPACITY = 1 << 50
"""Simulated capacity for a recording that shows no limit (1 PiB: it never runs out)."""


@dataclass(frozen=True)
class OomRecord:
    """An allocation of the trace that ran out of memory.

    Attributes
    ----------
    event : int
        Index of the event in the trace's event list (0-based).
    requested_bytes : int
        The size the trace asked for.
    stream : int
        The trace's stream.
    reserved_bytes : int
        What the allocator held when it failed.
    """

    event: int
    requested_bytes: int
    stream: int
    reserved_bytes: int


@dataclass(frozen=True)
class ReplayReport:
    """What one replay measured. Sizes in bytes, times in seconds where named so.

    Attributes
    ----------
    trace : str
        The trace's name.
    device : str
        Where it ran, e.g. ``"sim:0"``.
    capacity_bytes : int
        The device's total memory.
    config : str
        The allocator settings that differ from the defaults (``"defaults"`` if none).
    events : int
        Events replayed.
    include_host : bool
        Whether host-only events were replayed (False: the device view).
    trace_peak_live_bytes : int
        The peak of live bytes the trace itself implies.
    peak_requested_bytes : int
        Peak of ``requested_bytes.all``; equals ``trace_peak_live_bytes`` when nothing failed.
    peak_allocated_bytes : int
        Peak of ``allocated_bytes.all`` (after rounding).
    peak_reserved_bytes : int
        Peak of ``reserved_bytes.all``: what the device had to provide.
    fragmentation : float
        ``peak_reserved_bytes / peak_requested_bytes`` (0.0 if nothing was requested).
    num_device_alloc, num_device_free : int
        Segments obtained from and returned to the device.
    num_alloc_retries : int
        Times the allocator released its cache and retried.
    num_ooms : int
        Allocations that failed.
    ooms : list of OomRecord
        The failed allocations, in order.
    wall_seconds : float
        Time spent replaying.
    events_per_second : float
        ``events / wall_seconds``.
    recorded_peak_reserved_bytes : int or None
        For a PyTorch snapshot: the peak reserved bytes PyTorch's allocator recorded.
    recorded_num_device_alloc : int or None
        For a PyTorch snapshot: its ``segment_alloc``/``segment_map`` entries.
    peak_reserved_difference : float or None
        ``peak_reserved_bytes / recorded_peak_reserved_bytes - 1`` (0.0: identical).
    notes : list of str
        What makes this replay differ from the recording, where accelrt knows.
    memory_stats : dict
        The allocator's ``memory_stats()`` after the last event (left out of ``to_dict``).
    segment_maps : dict of int to list of SegmentInfo
        The allocator's segments (snapshot schema) after each event index asked for with
        ``capture_at`` (for pictures; left out of ``to_dict``).
    """

    trace: str
    device: str
    capacity_bytes: int
    config: str
    events: int
    include_host: bool
    trace_peak_live_bytes: int
    peak_requested_bytes: int
    peak_allocated_bytes: int
    peak_reserved_bytes: int
    fragmentation: float
    num_device_alloc: int
    num_device_free: int
    num_alloc_retries: int
    num_ooms: int
    wall_seconds: float
    events_per_second: float
    ooms: list[OomRecord] = field(default_factory=list)
    recorded_peak_reserved_bytes: int | None = None
    recorded_num_device_alloc: int | None = None
    peak_reserved_difference: float | None = None
    notes: list[str] = field(default_factory=list)
    memory_stats: dict[str, int] = field(default_factory=dict, repr=False)
    segment_maps: dict[int, list[SegmentInfo]] = field(default_factory=dict, repr=False)

    def to_dict(self) -> dict[str, Any]:
        """Return the report as plain JSON-serialisable data (without ``segment_maps``)."""
        data = asdict(self)
        del data["segment_maps"], data["memory_stats"]
        return data


def _open_device(
    device: str | Device, capacity: int | str | None, trace: Trace
) -> tuple[Backend, int]:
    dev = Device(device)
    index = dev.index if dev.index is not None else 0
    if dev.type == "sim":
        recording = trace.recording
        if capacity is None and "device_capacity_bytes" in trace.header:
            capacity = int(trace.header["device_capacity_bytes"])
        if capacity is None and recording is not None:
            capacity = recording.capacity_bytes or UNLIMITED_CAPACITY
        sim = SimBackend(device_count=index + 1, capacity=capacity)
        if recording is not None:
            starts = recording.start_segments
            fixed = [(s.address, s.size) for s in starts if not s.is_expandable]
            sim.plan_addresses(index, [*fixed, *recording.segment_addresses])
            sim.plan_reservations(index, [s.address for s in starts if s.is_expandable])
        return sim, index
    if capacity is not None:
        raise ValueError(
            f"capacity applies to the simulated device only; on {dev} cap memory with "
            "config 'per_process_memory_fraction:X' instead"
        )
    backend = get_backend(dev.type)
    count = backend.device_count()
    if not 0 <= index < count:
        raise ValueError(f"device index {index} is out of range [0, {count}) for {dev.type}")
    return backend, index


def replay(
    trace: Trace,
    *,
    device: str | Device = "sim",
    capacity: int | str | None = None,
    config: AllocatorConfig | str | None = None,
    progress: ProgressCallback | None = None,
    capture_at: Collection[int] = (),
) -> ReplayReport:
    """Run every event of ``trace`` through a fresh ``CachingAllocator``.

    Parameters
    ----------
    trace : Trace
        From ``accelrt.trace.load``.
    device : str or Device
        ``"sim"`` (default; a fresh simulated device) or a real device such as ``"opencl:0"``.
    capacity : int or str, optional
        Simulated device memory, e.g. ``"80GiB"``; default the trace header's
        ``device_capacity_bytes``, else ``ACCELRT_SIM_CAPACITY``, else 80 GiB. Only for ``sim``.
    config : AllocatorConfig or str, optional
        Allocator settings in ``ACCELRT_ALLOC_CONF`` syntax; default the defaults (the
        environment is not read, so replays are reproducible).
    progress : callable, optional
        Called as ``progress(done, total)`` every few thousand events and at the end.
    capture_at : collection of int
        Event indices after which to keep the allocator's segment map (``-1``: before the
        first event) in ``report.segment_maps``.

    Returns
    -------
    ReplayReport

    Raises
    ------
    ValueError
        For a bad device, capacity or config, or a capacity too small for the state a
        recording began with.

    Notes
    -----
    Allocations that run out of memory are recorded in the report, and the replay goes on
    (their frees are skipped). Zero-byte allocations are skipped, as PyTorch's allocator
    hands out no memory for them. On a real device all memory is given back at the end.
    """
    recording = trace.recording
    if config is None and recording is not None:
        settings = recording.settings
    else:
        settings = AllocatorConfig.coerce(config)
    backend, index = _open_device(device, capacity, trace)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        allocator = CachingAllocator(backend, index, settings)
    notes = [str(w.message) for w in caught]
    handles: dict[int, int] = {}

    def handle_of(stream: int) -> int:
        handle = handles.get(stream)
        if handle is None:
            handle = handles[stream] = 0 if stream == 0 else backend.stream_create(index, 0)
        return handle

    blocks = type(allocator)._ActiveBlocks()  # a dict, or the compiled core's map of them
    ooms: list[OomRecord] = []
    total = len(trace.events)
    try:
        if recording is not None:
            for segment in recording.start_segments:
                try:
                    restored = allocator.restore_segment(
                        segment.size,
                        handle_of(segment.stream),
                        [(b.size, b.requested_size) for b in segment.blocks],
                        is_small=segment.is_small,
                        expandable=segment.is_expandable,
                    )
                except OutOfMemoryError:
                    raise ValueError(
                        f"{trace.name}: the recording began with "
                        f"{recording.reserved_at_start_bytes} bytes reserved, more than "
                        f"{allocator.device_name} holds ({backend.mem_get_info(index)[1]} "
                        "bytes); give a larger capacity"
                    ) from None
                recorded = [b.address for b in segment.blocks if b.requested_size > 0]
                blocks.update(zip(recorded, restored, strict=True))  # the trace frees them by these
            allocator.reset_accumulated_memory_stats()  # count what the trace itself does
        captures = frozenset(capture_at)
        segment_maps: dict[int, list[SegmentInfo]] = {}
        if -1 in captures:
            segment_maps[-1] = allocator.snapshot()[0]
        start = time.perf_counter()
        _run_events(
            trace.events, allocator, blocks, handle_of, ooms, progress, captures, segment_maps
        )
        wall = time.perf_counter() - start
        if progress is not None:
            progress(total, total)
        stats = allocator.memory_stats()
    finally:
        for block in blocks.values():
            allocator.free(block)
        allocator.empty_cache()
        for handle in handles.values():
            if handle:
                backend.stream_destroy(index, handle)
    peak_requested = stats["requested_bytes.all.peak"]
    peak_reserved = stats["reserved_bytes.all.peak"]
    recorded_peak = recording.peak_reserved_bytes if recording is not None else None
    if recording is not None and recording.inconsistent_events:
        notes.append(
            f"{recording.inconsistent_events} events of the recording could not be placed when "
            "rewinding from its end state (its ring buffer lost their context), so the start "
            "state is approximate"
        )
    return ReplayReport(
        trace=trace.name,
        device=f"{backend.name}:{index}",
        capacity_bytes=backend.mem_get_info(index)[1],
        config=settings.describe(),
        events=total,
        include_host=trace.include_host,
        trace_peak_live_bytes=trace.peak_live_bytes,
        peak_requested_bytes=peak_requested,
        peak_allocated_bytes=stats["allocated_bytes.all.peak"],
        peak_reserved_bytes=peak_reserved,
        fragmentation=peak_reserved / peak_requested if peak_requested else 0.0,
        num_device_alloc=stats["num_device_alloc"],
        num_device_free=stats["num_device_free"],
        num_alloc_retries=stats["num_alloc_retries"],
        num_ooms=len(ooms),
        wall_seconds=wall,
        events_per_second=total / wall if wall > 0 else 0.0,
        ooms=ooms,
        recorded_peak_reserved_bytes=recorded_peak,
        recorded_num_device_alloc=recording.num_device_alloc if recording is not None else None,
        peak_reserved_difference=(peak_reserved / recorded_peak - 1.0 if recorded_peak else None),
        notes=notes,
        memory_stats=stats,
        segment_maps=segment_maps,
    )


def _run_events(
    events: TraceEvents,
    allocator: CachingAllocator,
    blocks: dict[int, Block],
    handle_of: Callable[[int], int],
    ooms: list[OomRecord],
    progress: ProgressCallback | None,
    captures: frozenset[int],
    segment_maps: dict[int, list[SegmentInfo]],
) -> None:
    """Run the events through ``allocator``: the replay loop.

    The columns are turned into Python lists a chunk at a time and walked with ``zip``; an
    event costs a dict operation and the allocator call, no object of its own. Zero-byte and
    oversized allocs get their own work codes beforehand. Chunks end where a progress report
    or a capture is due, so the loop never tests an index; the index of the rare event that
    runs out of memory is read back from the list iterator's remaining length.
    """
    total = len(events)
    codes = events.op.copy()
    allocs = codes == OP_ALLOC
    codes[allocs & (events.size == 0)] = _SKIP
    codes[allocs & (events.size > MAX_REQUEST_BYTES)] = _TOO_BIG
    del allocs
    # streams in the order the trace first allocates on them, as a lazy lookup would make them
    used, first_use = np.unique(events.stream[codes == OP_ALLOC], return_index=True)
    for stream in used[np.argsort(first_use)].tolist():
        handle_of(stream)
    handles = [handle_of(stream) for stream in used.tolist()]
    handle_column = None  # where every malloc has the same stream
    if len(used) > 1:
        lookup = np.array(handles, dtype=np.int64)
        handle_column = lookup[np.searchsorted(used, events.stream).clip(max=len(used) - 1)]
    only_handle = handles[0] if handles else 0
    del used, first_use
    # A capture after an event the loop skips (a zero-byte or oversized alloc) is not taken.
    taken = sorted(i for i in captures if 0 <= i < total and codes[i] not in (_SKIP, _TOO_BIG))
    step = _PROGRESS_EVERY if progress is not None else _CHUNK
    bounds = sorted({*range(0, total, step), *(i + 1 for i in taken), total})
    taken_set = frozenset(taken)
    run = getattr(allocator, "run_events", None)  # the compiled core's loop, where it runs
    if run is None:
        run = functools.partial(_run_chunk, allocator)
    for lo, hi in itertools.pairwise(bounds):
        if progress is not None and lo % _PROGRESS_EVERY == 0:
            progress(lo, total)
        i = lo
        while i < hi:
            i = run(codes, events.addr, events.size, handle_column, only_handle, blocks, i, hi)
            if i < hi:  # ran out of memory (or no device has that much): record, go on
                size = int(events.size[i])
                ooms.append(OomRecord(i, size, int(events.stream[i]), allocator.reserved_bytes))
                i += 1
        if hi - 1 in taken_set:
            segment_maps[hi - 1] = allocator.snapshot()[0]


def _run_chunk(
    allocator: CachingAllocator,
    codes: np.ndarray[Any, np.dtype[np.int8]],
    addrs: np.ndarray[Any, np.dtype[np.int64]],
    sizes: np.ndarray[Any, np.dtype[np.int64]],
    handles: np.ndarray[Any, np.dtype[np.int64]] | None,
    handle: int,
    blocks: dict[int, Block],
    start: int,
    stop: int,
) -> int:
    """Run events ``start`` to ``stop - 1``; return ``stop``, or the index of the first alloc
    that ran out of memory or is too large for any device (the caller records it).

    The Python form of the compiled core's ``run_events`` (memory/_native.pyx), with the same
    contract: the columns become Python lists for the span and are walked with ``zip``, an
    event costing a dict operation and the allocator call, no object of its own.
    """
    malloc = allocator.malloc
    free = allocator.free
    pop = blocks.pop
    handles_it: Iterable[int] = (
        itertools.repeat(handle) if handles is None else handles[start:stop].tolist()
    )
    rows = zip(
        itertools.count(start),
        codes[start:stop].tolist(),
        addrs[start:stop].tolist(),
        sizes[start:stop].tolist(),
        handles_it,
        strict=False,
    )
    for i, code, addr, size, on_stream in rows:
        if code == OP_ALLOC:
            try:
                blocks[addr] = malloc(size, on_stream)
            except OutOfMemoryError:
                return i
        elif code == OP_FREE:
            block = pop(addr, None)
            if block is not None:
                free(block)
        elif code == OP_EMPTY_CACHE:
            allocator.empty_cache()
        elif code == _TOO_BIG:
            return i
    return stop


def _run_events_reference(
    events: TraceEvents,
    allocator: CachingAllocator,
    blocks: dict[int, Block],
    handle_of: Callable[[int], int],
    ooms: list[OomRecord],
    progress: ProgressCallback | None,
    captures: frozenset[int],
    segment_maps: dict[int, list[SegmentInfo]],
) -> None:
    """The replay loop as first written, an object per event: the spec of :func:`_run_events`.

    Same arguments and effects; the differential test (tests/test_trace_columns.py) and
    ``bench/replay_speed.py`` run it in the fast loop's place.
    """
    total = len(events)
    for i, (action, addr, size, stream) in enumerate(events):
        if progress is not None and i % _PROGRESS_EVERY == 0:
            progress(i, total)
        if action == "alloc":
            if size == 0:
                continue
            if size > MAX_REQUEST_BYTES:  # no device has that much: an OOM, as on a GPU
                ooms.append(OomRecord(i, size, stream, allocator.reserved_bytes))
                continue
            try:
                blocks[addr] = allocator.malloc(size, handle_of(stream))
            except OutOfMemoryError:
                ooms.append(OomRecord(i, size, stream, allocator.reserved_bytes))
        elif action == "free":
            block = blocks.pop(addr, None)
            if block is not None:
                allocator.free(block)
        else:
            allocator.empty_cache()
        if i in captures:
            segment_maps[i] = allocator.snapshot()[0]
