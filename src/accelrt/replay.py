"""Replay an allocation trace through a fresh caching allocator and report what it did.

The question a replay answers: "with this allocator setting, on this device, how much memory
would this program reserve, how fragmented would it be, and would it fit?" On the simulated
device (``sim``) only addresses are handed out, so an 80 GiB GPU trace replays on a laptop; on
a real device (``opencl:0``) every segment is really allocated.
"""

from __future__ import annotations

import time
import warnings
from collections.abc import Callable, Collection
from dataclasses import asdict, dataclass, field
from typing import Any

from ._device import Device
from ._errors import OutOfMemoryError
from .backends._base import Backend, get_backend
from .backends.sim import SimBackend
from .memory._allocator import CachingAllocator
from .memory._block import Block
from .memory._config import AllocatorConfig
from .memory._history import SegmentInfo
from .memory._policy import MAX_REQUEST_BYTES
from .trace._format import Trace

__all__ = ["OomRecord", "ReplayReport", "replay"]

ProgressCallback = Callable[[int, int], None]
_PROGRESS_EVERY = 4096
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

    blocks: dict[int, Block] = {}
    ooms: list[OomRecord] = []
    events = trace.events
    total = len(events)
    malloc = allocator.malloc
    free = allocator.free
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
                    blocks[addr] = malloc(size, handle_of(stream))
                except OutOfMemoryError:
                    ooms.append(OomRecord(i, size, stream, allocator.reserved_bytes))
            elif action == "free":
                block = blocks.pop(addr, None)
                if block is not None:
                    free(block)
            else:
                allocator.empty_cache()
            if i in captures:
                segment_maps[i] = allocator.snapshot()[0]
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
