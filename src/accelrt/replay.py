"""Replay an allocation trace through a fresh caching allocator and report what it did.

The question a replay answers: "with this allocator setting, on this device, how much memory
would this program reserve, how fragmented would it be, and would it fit?" On the simulated
device (``sim``) only addresses are handed out, so an 80 GiB GPU trace replays on a laptop; on
a real device (``opencl:0``) every segment is really allocated.
"""

from __future__ import annotations

import functools
import itertools
import sys
import time
import warnings
from collections.abc import Callable, Collection, Iterable
from dataclasses import asdict, dataclass, field

import numpy as np
import numpy.typing as npt

from ._bounds import lower_bounds
from ._device import Device
from ._errors import OutOfMemoryError
from ._gc import collector_paused
from ._start_state import (
    StartKind,
    StartStateError,
    cached_bytes,
    calibrated_share,
    check_start,
    decides_alike,
    describe_start,
    largest_size,
    rebuild_start,
)
from .backends._base import Backend, get_backend
from .backends.sim import SimBackend
from .memory._config import AllocatorConfig
from .memory._policy import MAX_REQUEST_BYTES
from .memory.device._block import Block
from .memory.device._core import CachingAllocator
from .memory.history._history import SegmentInfo
from .trace._columns import OP_ALLOC, OP_EMPTY_CACHE, OP_FREE
from .trace._format import Trace
from .trace._recording import UNLIMITED_CAPACITY

__all__ = ["OomRecord", "ReplayReport", "replay", "replay_settings"]

ProgressCallback = Callable[[int, int], None]
_PROGRESS_EVERY = 4096
_CHUNK = 1 << 16
"""Events turned into Python lists at a time by the replay loop."""
_SKIP = 3
"""Work code of a zero-byte alloc: PyTorch hands out nothing for it."""
_TOO_BIG = 4
"""Work code of an alloc beyond ``MAX_REQUEST_BYTES``: an OOM without asking the allocator."""


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
    start_state : {"empty", "recorded", "modelled"}
        How the state the recording began with was built (``accelrt._start_state``):
        nothing to build (a JSONL trace, or a recording that began with the process), the
        recording's own segments and blocks (exact under the recorded setting), or modelled
        under this replay's setting.
    reserved_before_recording_bytes : int
        What the recording's own allocator held before its first event (0 if nothing).
    start_cached_bytes : int
        Of those, the bytes of free blocks it held cached.
    start_transient_share : float or None
        A modelled start: the share of the cached bytes taken as live before the first event
        (calibrated on the recorded setting).
    peak_reserved_low_bytes, peak_reserved_high_bytes : int or None
        A modelled start: the lowest and highest peak reserved bytes the model allows (none
        or all of the cached bytes taken as live; ``peak_reserved_bytes`` lies between).
    memory_stats : dict
        The allocator's ``memory_stats()`` after the last event (left out of ``to_dict``).
    segment_maps : dict of int to list of SegmentInfo
        The allocator's segments (snapshot schema) after each event index asked for with
        ``capture_at`` (for pictures; left out of ``to_dict``).
    floor_live_bytes : int or None
        Lower bound: the peak of live requested bytes (``accelrt._bounds``; for a recording
        with its starting blocks, and a request that ran out of memory counted at its moment).
    floor_rounded_bytes : int or None
        Lower bound under this setting: that peak with every request rounded as PyTorch does.
    plan_peak_bytes : int or None
        What perfect foresight needs: the peak of an offline plan of the rounded blocks
        (``accelrt._offline_plan``), at least ``floor_rounded_bytes``.
    plan_algorithm : str or None
        The heuristic that made that plan.
    recorded_num_ooms : int or None
        For a PyTorch snapshot: its ``oom`` entries (``accelrt._verdict`` reads them).
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
    start_state: StartKind = "empty"
    reserved_before_recording_bytes: int = 0
    start_cached_bytes: int = 0
    start_transient_share: float | None = None
    peak_reserved_low_bytes: int | None = None
    peak_reserved_high_bytes: int | None = None
    memory_stats: dict[str, int] = field(default_factory=dict, repr=False)
    segment_maps: dict[int, list[SegmentInfo]] = field(default_factory=dict, repr=False)
    floor_live_bytes: int | None = None
    floor_rounded_bytes: int | None = None
    plan_peak_bytes: int | None = None
    plan_algorithm: str | None = None
    recorded_num_ooms: int | None = None

    def describe_start(self) -> str:
        """One line saying how the start state was built (``start_state`` and its figures)."""
        return describe_start(self.start_state, self.start_transient_share, self.start_cached_bytes)

    def to_dict(self) -> dict[str, object]:
        """Return the report as plain JSON-serialisable data (without ``segment_maps``)."""
        data = asdict(self)
        del data["segment_maps"], data["memory_stats"]
        return data


def _open_device(
    device: str | Device, capacity: int | str | None, trace: Trace, *, recorded_start: bool
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
        if recording is not None and recorded_start:
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


def replay_settings(trace: Trace, config: AllocatorConfig | str | None) -> AllocatorConfig:
    """The settings :func:`replay` runs ``trace`` under: ``config``, else a recording's own
    (its snapshot's ``allocator_settings``), else the defaults.

    Raises
    ------
    TypeError, ValueError
        For a bad ``config`` (:meth:`AllocatorConfig.coerce`).
    """
    if config is None and trace.recording is not None:
        return trace.recording.settings
    return AllocatorConfig.coerce(config)


def replay(
    trace: Trace,
    *,
    device: str | Device = "sim",
    capacity: int | str | None = None,
    config: AllocatorConfig | str | None = None,
    progress: ProgressCallback | None = None,
    capture_at: Collection[int] = (),
    start: str = "modelled",
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
        Allocator settings in ``ACCELRT_ALLOC_CONF`` syntax; default the recorded settings of
        a snapshot, else the defaults (the environment is not read, so replays are
        reproducible).
    progress : callable, optional
        Called as ``progress(done, total)`` every few thousand events and at the end.
    capture_at : collection of int
        Event indices after which to keep the allocator's segment map (``-1``: before the
        first event) in ``report.segment_maps``.
    start : {"modelled", "recorded"}
        For a recording that began mid-run replayed with a setting other than the recorded
        one: ``"modelled"`` (default) rebuilds the start state under that setting
        (``accelrt._start_state``; docs/snapshot-replay.md), ``"recorded"`` restores the
        recording's own segments and blocks as they were. Under the recorded setting, or one
        that decides alike for every size the recording holds or asks for
        (``accelrt._start_state.decides_alike``), the recorded start is always used (it is
        exact).

    Returns
    -------
    ReplayReport

    Raises
    ------
    ValueError
        For a bad device, capacity, config or start.
    StartStateError
        (A ``ValueError``.) If the device cannot hold the state the recording began with
        under this setting: the message names the setting and the bytes.

    Notes
    -----
    Allocations that run out of memory are recorded in the report, and the replay goes on
    (their frees are skipped). Zero-byte allocations are skipped, as PyTorch's allocator
    hands out no memory for them. On a real device all memory is given back at the end.
    A modelled start replays the trace twice more on the simulated device for its range
    (and, once per recording, about a dozen times under the recorded setting to calibrate it).
    """
    check_start(start)
    recording = trace.recording
    settings = replay_settings(trace, config)
    kind: StartKind = "empty"
    if recording is not None and recording.start_segments:
        largest = largest_size(recording, int(trace.events.size.max(initial=0)))
        recorded = start == "recorded" or decides_alike(recording.settings, settings, largest)
        kind = "recorded" if recorded else "modelled"
    backend, index = _open_device(device, capacity, trace, recorded_start=kind != "modelled")
    share = -1.0  # the recorded start, or none
    low = high = None
    if kind == "modelled":
        assert recording is not None
        share, low, high = _model_start(trace, settings, backend.mem_get_info(index)[1])
    run = _Run(trace, backend, index, settings, share, progress, frozenset(capture_at))
    stats = run.execute()
    peak_requested = stats["requested_bytes.all.peak"]
    peak_reserved = stats["reserved_bytes.all.peak"]
    if low is not None and high is not None:
        low, high = min(low, peak_reserved), max(high, peak_reserved)
    recorded_peak = recording.peak_reserved_bytes if recording is not None else None
    notes = run.notes
    if recording is not None and recording.inconsistent_events:
        notes.append(
            f"{recording.inconsistent_events} events of the recording could not be placed when "
            "rewinding from its end state (its ring buffer lost their context), so the start "
            "state is approximate"
        )
    total = len(trace.events)
    bounds = lower_bounds(trace, settings)
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
        num_ooms=len(run.ooms),
        wall_seconds=run.wall_seconds,
        events_per_second=total / run.wall_seconds if run.wall_seconds > 0 else 0.0,
        ooms=run.ooms,
        recorded_peak_reserved_bytes=recorded_peak,
        recorded_num_device_alloc=recording.num_device_alloc if recording is not None else None,
        peak_reserved_difference=(peak_reserved / recorded_peak - 1.0 if recorded_peak else None),
        notes=notes,
        start_state=kind,
        reserved_before_recording_bytes=recording.reserved_at_start_bytes if recording else 0,
        start_cached_bytes=cached_bytes(recording) if recording else 0,
        start_transient_share=share if kind == "modelled" else None,
        peak_reserved_low_bytes=low,
        peak_reserved_high_bytes=high,
        memory_stats=stats,
        segment_maps=run.segment_maps,
        floor_live_bytes=bounds.peak_live_bytes,
        floor_rounded_bytes=bounds.peak_live_rounded_bytes,
        plan_peak_bytes=bounds.planned_peak_bytes,
        plan_algorithm=bounds.algorithm,
        recorded_num_ooms=recording.num_ooms if recording is not None else None,
    )


def _model_start(trace: Trace, settings: AllocatorConfig, capacity: int) -> tuple[float, int, int]:
    """A modelled start's share of cached bytes (calibrated on the recording) and the lowest
    and highest peak reserved bytes the model allows under ``settings`` on ``capacity`` bytes.

    Raises ``StartStateError`` where ``settings`` cannot hold the blocks live at the start.
    """
    recording = trace.recording
    assert recording is not None

    def peak_with(config: AllocatorConfig, share: float, capacity: int) -> int:
        sim = SimBackend(device_count=1, capacity=capacity)
        run = _Run(trace, sim, 0, config, share)
        return run.execute()["reserved_bytes.all.peak"]

    low = peak_with(settings, 0.0, capacity)  # first: raises where the start does not fit

    def recorded_peak_with(share: float) -> int:
        """The modelled run as the recording ran: its setting, on its own device."""
        try:
            return peak_with(
                recording.settings, share, recording.capacity_bytes or UNLIMITED_CAPACITY
            )
        except StartStateError:  # the recorded setting cannot hold this much at once
            return sys.maxsize

    share = calibrated_share(recording, recorded_peak_with)
    low, high = sorted((low, peak_with(settings, 1.0, capacity)))
    return share, low, high


class _Run:
    """One replay of a trace through a fresh allocator on ``backend``: start state, events.

    ``share`` < 0 restores a recording's start as recorded; otherwise the start is rebuilt
    under ``settings`` with that share of its cached bytes held (``rebuild_start``).
    ``progress`` and ``captures`` are ``replay``'s ``progress`` and ``capture_at``.
    """

    def __init__(
        self,
        trace: Trace,
        backend: Backend,
        index: int,
        settings: AllocatorConfig,
        share: float,
        progress: ProgressCallback | None = None,
        captures: frozenset[int] = frozenset(),
    ) -> None:
        self.trace, self.backend, self.index, self.share = trace, backend, index, share
        self.progress, self.captures = progress, captures
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            self.allocator = CachingAllocator(backend, index, settings)
        self.notes = [str(w.message) for w in caught]
        self.handles: dict[int, int] = {}
        self.ooms: list[OomRecord] = []
        self.segment_maps: dict[int, list[SegmentInfo]] = {}
        self.wall_seconds = 0.0

    def handle_of(self, stream: int) -> int:
        handle = self.handles.get(stream)
        if handle is None:
            handle = 0 if stream == 0 else self.backend.stream_create(self.index, 0)
            self.handles[stream] = handle
        return handle

    def execute(self) -> dict[str, int]:
        """Build the start state, run the events; return ``memory_stats()`` after the last."""
        allocator, trace, progress = self.allocator, self.trace, self.progress
        blocks = type(allocator)._ActiveBlocks()  # a dict, or the compiled core's map of them
        total = len(trace.events)
        try:
            if trace.recording is not None:
                if self.share < 0:
                    self._restore(blocks)
                else:
                    live = rebuild_start(allocator, trace.recording, self.handle_of, self.share)
                    blocks.update(live.items())
                allocator.reset_accumulated_memory_stats()  # count what the trace itself does
            if -1 in self.captures:
                self.segment_maps[-1] = allocator.snapshot()[0]
            begin = time.perf_counter()
            with collector_paused():  # blocks are containers: collections would walk them all
                _run_events(self, blocks)
            self.wall_seconds = time.perf_counter() - begin
            if progress is not None:
                progress(total, total)
            return allocator.memory_stats()
        finally:
            for block in blocks.values():
                allocator.free(block)
            allocator.empty_cache()
            for handle in self.handles.values():
                if handle:
                    self.backend.stream_destroy(self.index, handle)

    def _restore(self, blocks: dict[int, Block]) -> None:
        """Restore the recording's start segments and blocks as they were."""
        recording, allocator = self.trace.recording, self.allocator
        assert recording is not None
        for segment in recording.start_segments:
            try:
                restored = allocator.restore_segment(
                    segment.size,
                    self.handle_of(segment.stream),
                    [(b.size, b.requested_size) for b in segment.blocks],
                    is_small=segment.is_small,
                    expandable=segment.is_expandable,
                )
            except OutOfMemoryError:
                raise StartStateError(
                    f"{self.trace.name}: the recording began with "
                    f"{recording.reserved_at_start_bytes} bytes reserved, more than "
                    f"{allocator.device_name} holds "
                    f"({self.backend.mem_get_info(self.index)[1]} bytes) under setting "
                    f"{allocator.config.describe()!r}; give a larger capacity"
                ) from None
            recorded = [b.address for b in segment.blocks if b.requested_size > 0]
            blocks.update(zip(recorded, restored, strict=True))  # the trace frees them by these


def _run_events(run: _Run, blocks: dict[int, Block]) -> None:
    """Run ``run``'s events through its allocator, filing live blocks in ``blocks`` by their
    recorded address: the replay loop.

    The columns are turned into Python lists a chunk at a time and walked with ``zip``; an
    event costs a dict operation and the allocator call, no object of its own. Zero-byte and
    oversized allocs get their own work codes beforehand. Chunks end where a progress report
    or a capture is due, so the loop never tests an index; the index of the rare event that
    runs out of memory is read back from the list iterator's remaining length.
    """
    events, allocator, handle_of = run.trace.events, run.allocator, run.handle_of
    progress, captures, ooms, segment_maps = run.progress, run.captures, run.ooms, run.segment_maps
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
    run_chunk = getattr(allocator, "run_events", None)  # the compiled core's loop, where it runs
    if run_chunk is None:
        run_chunk = functools.partial(_run_chunk, allocator)
    for lo, hi in itertools.pairwise(bounds):
        if progress is not None and lo % _PROGRESS_EVERY == 0:
            progress(lo, total)
        i = lo
        while i < hi:
            i = run_chunk(
                codes, events.addr, events.size, handle_column, only_handle, blocks, i, hi
            )
            if i < hi:  # ran out of memory (or no device has that much): record, go on
                size = int(events.size[i])
                ooms.append(OomRecord(i, size, int(events.stream[i]), allocator.reserved_bytes))
                i += 1
        if hi - 1 in taken_set:
            segment_maps[hi - 1] = allocator.snapshot()[0]


def _run_chunk(
    allocator: CachingAllocator,
    codes: npt.NDArray[np.int8],
    addrs: npt.NDArray[np.int64],
    sizes: npt.NDArray[np.int64],
    handles: npt.NDArray[np.int64] | None,
    handle: int,
    blocks: dict[int, Block],
    start: int,
    stop: int,
) -> int:
    """Run events ``start`` to ``stop - 1``; return ``stop``, or the index of the first alloc
    that ran out of memory or is too large for any device (the caller records it).

    The Python form of the compiled core's ``run_events`` (memory/device/_native.pyx), with the same
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


def _run_events_reference(run: _Run, blocks: dict[int, Block]) -> None:
    """The replay loop as first written, an object per event: the spec of :func:`_run_events`.

    Same arguments and effects; the differential test (tests/test_trace_columns.py) and
    ``bench/replay_speed.py`` run it in the fast loop's place.
    """
    events, allocator, handle_of = run.trace.events, run.allocator, run.handle_of
    progress, captures, ooms, segment_maps = run.progress, run.captures, run.ooms, run.segment_maps
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
