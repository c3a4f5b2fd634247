"""The host (pinned) caching allocator: host memory for fast, asynchronous host-device copies.

Reproduces the policy of PyTorch's ``CachingHostAllocator`` (``ATen/core/CachingHostAllocator.h``,
behind ``torch.cuda``'s and ``torch.xpu``'s pinned memory), with its default settings:

- a request of n >= 1 bytes takes a block of ``2**ceil(log2(n))`` bytes (1 stays 1); blocks are
  never split or merged, and a zero-byte request never reaches the allocator;
- the free blocks of one size (and one device) form one list, used last in, first out; a
  request of that size takes the most recently cached block, else new memory from the backend;
- a block records the streams that used it (``record_stream``; ``accelrt.copy_`` records its
  stream by itself). Freeing it records one event on each such stream, and it returns to its free
  list only once all of them have completed; a block no stream used returns at once. Pending
  events are checked, oldest first, at the start of every allocation and of ``empty_cache``,
  stopping at the first that has not completed;
- ``empty_cache`` releases every block on a free list to the backend; blocks in use or waiting
  for events stay;
- statistics with ``torch.cuda.host_memory_stats()``'s keys (:class:`HostStats`).

One allocator per backend and process, as PyTorch has one per device type; a block belongs to the
device whose backend context allocated it, and is reused for requests on that device only.
Raw memory comes through a :class:`~accelrt.memory.device._segments.HostMemorySource`, the host
counterpart of the device allocator's memory source. Thread-safe: one lock; operations are all
or nothing, even under ``KeyboardInterrupt`` (``_atomic.py``). docs/host-allocator.md describes
the behaviour exactly.
"""

from __future__ import annotations

import threading
import time
import warnings
from collections import deque
from collections.abc import Iterable
from typing import Any

from ... import _runtime
from ..._device import Device, DeviceLike
from ..._errors import OutOfMemoryError
from ..._units import format_bytes
from ...backends._base import Backend
from .._atomic import PENDING, atomic, deliver, protect_sigint, register
from ..device._allocator import _as_size, _request_size
from ..device._segments import HostMemorySource
from ..device._stats import Stat
from ._buffer import HostBuffer

__all__ = [
    "DurationStat",
    "HostBlock",
    "HostCachingAllocator",
    "HostStats",
    "empty_host",
    "empty_host_cache",
    "get_host_allocator",
    "host_memory_stats",
    "host_round_size",
    "reset_accumulated_host_memory_stats",
    "reset_peak_host_memory_stats",
]


def host_round_size(nbytes: int) -> int:
    """Return the block size of a host request: ``nbytes`` rounded up to a power of two.

    Parameters
    ----------
    nbytes : int
        The request in bytes, >= 1.

    Returns
    -------
    int
        ``2**ceil(log2(nbytes))`` bytes: 1 -> 1, 3 -> 4, 4097 -> 8192. Mirrors
        ``c10::llvm::PowerOf2Ceil`` in PyTorch's CachingHostAllocator.
    """
    return 1 << (nbytes - 1).bit_length()


class DurationStat:
    """A duration statistic in microseconds: total, count, max and min of the samples.

    Mirrors c10's ``DurationStat``: a min of 0 means "no sample since the last peak reset".
    """

    __slots__ = ("count", "max", "min", "total")

    def __init__(self) -> None:
        self.total = 0
        self.count = 0
        self.max = 0
        self.min = 0

    def increase(self, amount: int) -> None:
        """Add one sample of ``amount`` microseconds."""
        self.total += amount
        self.count += 1
        self.max = max(self.max, amount)
        self.min = amount if self.min == 0 else min(self.min, amount)

    def reset_accumulated(self) -> None:
        """Set total and count to 0."""
        self.total = 0
        self.count = 0

    def reset_peak(self) -> None:
        """Set min and max to 0."""
        self.min = 0
        self.max = 0


class HostStats:
    """The host allocator's statistics, kept as PyTorch's ``HostStatsStaged`` keeps them.

    Attributes
    ----------
    allocations, allocated_bytes : Stat
        Blocks (and their bytes) held from the backend, in use or cached.
    active : dict of int to Stat
        Per block size: blocks handed out and not yet reusable (PyTorch's per-bucket
        ``active_requests``; its ``active_bytes`` are these times the size, every block of a
        bucket having that size). Reported summed over sizes, peaks included, as PyTorch does
        (so the reported peak is the sum of each size's own peak, an upper bound of the true
        peak).
    host_alloc_time, host_free_time : DurationStat
        Microseconds spent in the backend's ``host_alloc`` and ``host_free``.
    """

    __slots__ = ("active", "allocated_bytes", "allocations", "host_alloc_time", "host_free_time")

    def __init__(self) -> None:
        self.allocations = Stat()
        self.allocated_bytes = Stat()
        self.active: dict[int, Stat] = {}
        self.host_alloc_time = DurationStat()
        self.host_free_time = DurationStat()

    def activate(self, size: int) -> None:
        """Count a block of ``size`` bytes handed out."""
        stat = self.active.get(size)
        if stat is None:
            stat = self.active[size] = Stat()
        stat.current += 1
        stat.allocated += 1
        if stat.current > stat.peak:
            stat.peak = stat.current

    def deactivate(self, size: int) -> None:
        """Count a block of ``size`` bytes that became reusable."""
        stat = self.active[size]
        stat.current -= 1
        stat.freed += 1

    def active_bytes(self) -> int:
        """The bytes of the blocks handed out and not yet reusable."""
        return sum(size * stat.current for size, stat in self.active.items())

    def _all_stats(self) -> list[Stat]:
        return [self.allocations, self.allocated_bytes, *self.active.values()]

    def reset_peak(self) -> None:
        """Set every peak to its current value and clear the durations' min and max."""
        for stat in self._all_stats():
            stat.reset_peak()
        self.host_alloc_time.reset_peak()
        self.host_free_time.reset_peak()

    def reset_accumulated(self) -> None:
        """Zero every ``allocated``/``freed`` sum and the durations' total and count."""
        for stat in self._all_stats():
            stat.reset_accumulated()
        self.host_alloc_time.reset_accumulated()
        self.host_free_time.reset_accumulated()

    def as_dict(self) -> dict[str, int]:
        """Return the flat, sorted keys of ``torch.cuda.host_memory_stats()``.

        ``<stat>.<metric>`` for ``allocations``, ``allocated_bytes``, ``active_requests`` and
        ``active_bytes`` (metrics ``current``, ``peak``, ``allocated``, ``freed``);
        ``host_alloc_time.<m>`` and ``host_free_time.<m>`` (``total``, ``max``, ``min``,
        ``count``, ``avg`` = total // count, in microseconds); ``num_host_alloc`` and
        ``num_host_free`` (``allocations.allocated`` and ``allocations.freed``).
        """
        out: dict[str, int] = {
            "num_host_alloc": self.allocations.allocated,
            "num_host_free": self.allocations.freed,
        }
        summed = {
            "active_requests": _summed((1, stat) for stat in self.active.values()),
            "active_bytes": _summed(self.active.items()),
            "allocations": self.allocations,
            "allocated_bytes": self.allocated_bytes,
        }
        for name, stat in summed.items():
            out[f"{name}.current"] = stat.current
            out[f"{name}.peak"] = stat.peak
            out[f"{name}.allocated"] = stat.allocated
            out[f"{name}.freed"] = stat.freed
        for name, duration in (
            ("host_alloc_time", self.host_alloc_time),
            ("host_free_time", self.host_free_time),
        ):
            out[f"{name}.total"] = duration.total
            out[f"{name}.max"] = duration.max
            out[f"{name}.min"] = duration.min
            out[f"{name}.count"] = duration.count
            out[f"{name}.avg"] = duration.total // duration.count if duration.count else 0
        return dict(sorted(out.items()))


def _summed(weighted: Iterable[tuple[int, Stat]]) -> Stat:
    """The sum of ``weight * stat`` over the pairs, metric by metric (peaks too, as PyTorch)."""
    total = Stat()
    for weight, stat in weighted:
        total.current += weight * stat.current
        total.peak += weight * stat.peak
        total.allocated += weight * stat.allocated
        total.freed += weight * stat.freed
    return total


class HostBlock:
    """One block of host memory: a whole raw allocation (host blocks are never split).

    Attributes
    ----------
    address : int
        Its host address.
    size : int
        Its size in bytes (a power of two).
    device_index : int
        The device of the backend whose host memory it is.
    allocated : bool
        Handed out to a caller (False while cached or waiting for events).
    event_count : int
        Events recorded at its free that have not completed yet.
    streams : set of (int, int) or None
        ``(device index, stream handle)`` of the streams that used it since it was handed out.
    """

    __slots__ = ("address", "allocated", "device_index", "event_count", "size", "streams")

    def __init__(self, address: int, size: int, device_index: int) -> None:
        self.address = address
        self.size = size
        self.device_index = device_index
        self.allocated = False
        self.event_count = 0
        self.streams: set[tuple[int, int]] | None = None

    def __repr__(self) -> str:
        state = "allocated" if self.allocated else "pending" if self.event_count else "cached"
        return (
            f"HostBlock(address={self.address:#x}, size={self.size}, "
            f"device={self.device_index}, {state})"
        )


class HostCachingAllocator:
    """The host caching allocator of one backend (all its devices).

    Parameters
    ----------
    backend : Backend
        The backend whose ``host_alloc``/``host_free`` give the raw memory and whose events
        order reuse.

    Notes
    -----
    Thread-safe: every method runs under one lock, and is all or nothing even under
    ``KeyboardInterrupt``. Stream arguments are ``(device index, backend stream handle)``.
    Mirrors c10's ``CachingHostAllocatorImpl`` (default pool only: no private pools, no
    background thread, no ``pinned_max_round_threshold``/``pinned_max_cached_size``). The
    module docstring states the policy.
    """

    def __init__(self, backend: Backend) -> None:
        self.backend = backend
        self._lock = threading.RLock()
        self._sources: dict[int, HostMemorySource] = {}
        self._device_info: dict[int, tuple[Device, bool]] = {}  # index -> (Device, pinned)
        self._free: dict[tuple[int, int], list[HostBlock]] = {}  # (device, size) -> LIFO
        self._blocks: dict[int, HostBlock] = {}  # address -> every block held
        self._events: deque[tuple[Any, HostBlock, int]] = deque()  # oldest first
        self._idle_events: dict[int, list[Any]] = {}  # device -> completed events to reuse
        self._finalized: list[HostBlock] = []  # frees that finalisers asked for inside an op
        self.stats = HostStats()
        protect_sigint()

    def source(self, device_index: int) -> HostMemorySource:
        """Return the memory source of a device (created on first use)."""
        source = self._sources.get(device_index)
        if source is None:
            with self._lock:
                source = self._sources.get(device_index)
                if source is None:
                    source = self._sources[device_index] = HostMemorySource(
                        self.backend, device_index
                    )
        return source

    def device_info(self, device_index: int) -> tuple[Device, bool]:
        """Return ``(Device, pinned)`` of a device: whether its host memory is pinned."""
        info = self._device_info.get(device_index)
        if info is None:
            info = (Device(self.backend.name, device_index), self.source(device_index).pinned)
            self._device_info[device_index] = info
        return info

    # ------------------------------------------------------------------ malloc
    def malloc(self, nbytes: int, device_index: int) -> HostBlock:
        """Allocate a block of at least ``nbytes`` of host memory for a device.

        Parameters
        ----------
        nbytes : int
            Requested size in bytes, 1 <= nbytes <= 2**60.
        device_index : int
            The device (already range-checked) whose host memory it is.

        Returns
        -------
        HostBlock
            An allocated block of ``host_round_size(nbytes)`` bytes.

        Raises
        ------
        TypeError
            If ``nbytes`` is not an integer.
        ValueError
            If ``nbytes`` < 1 or > 2**60.
        OutOfMemoryError
            If the backend has no host memory for a new block (nothing changed; cached blocks
            are not released first, as in PyTorch: ``empty_cache`` does that).
        AcceleratorError
            For a driver error (nothing changed).
        """
        nbytes = _request_size(nbytes, "host")
        size = 1 << (nbytes - 1).bit_length()
        with self._lock:
            try:  # atomic: all or nothing, even under KeyboardInterrupt
                if self._finalized:
                    self._free_finalized()
                if self._events:
                    self._process_events()
                cached = self._free.get((device_index, size))
                if cached:
                    block = cached.pop()
                    block.allocated = True
                    self.stats.activate(size)
                    return block
                return self._allocate_new(nbytes, size, device_index)
            finally:
                if PENDING.flag:
                    deliver()

    def _allocate_new(self, nbytes: int, size: int, device_index: int) -> HostBlock:
        source = self.source(device_index)
        start = time.perf_counter_ns()
        address = source.allocate(size)
        elapsed_us = (time.perf_counter_ns() - start) // 1000
        if address is None:
            raise self._out_of_memory(nbytes, size, device_index)
        block = HostBlock(address, size, device_index)
        block.allocated = True
        stats = self.stats
        self._blocks[address] = block
        stats.host_alloc_time.increase(elapsed_us)
        stats.allocations.increase(1)
        stats.allocated_bytes.increase(size)
        stats.activate(size)
        return block

    def _out_of_memory(self, nbytes: int, size: int, device_index: int) -> OutOfMemoryError:
        held = self.stats.allocated_bytes.current
        active = self.stats.active_bytes()
        free_bytes, total_bytes = _host_memory_info()
        device = f"{self.backend.name}:{device_index}"
        kind = "pinned host memory" if self.source(device_index).pinned else "host memory"
        message = (
            f"Out of host memory. Tried to allocate {format_bytes(size)} of {kind} for "
            f"{device} ({nbytes} bytes requested, rounded up to a power of two). The host "
            f"allocator holds {format_bytes(held)}, of which {format_bytes(active)} is in use "
            f"and {format_bytes(held - active)} is cached or waiting for streams; "
            "accelrt.empty_host_cache() returns the cached memory."
        )
        return OutOfMemoryError(
            message,
            device=device,
            requested_bytes=nbytes,
            allocation_bytes=size,
            allocated_bytes=active,
            reserved_bytes=held,
            free_bytes=free_bytes,
            total_bytes=total_bytes,
        )

    # ------------------------------------------------------------------ free
    def free(self, block: HostBlock) -> None:
        """Give a block back: cached at once, or once the events of the streams that used it
        have completed.

        Raises
        ------
        ValueError
            If the block is not allocated by this allocator (freed twice, or another
            allocator's); nothing changes.
        """
        with self._lock:
            if self._blocks.get(block.address) is not block or not block.allocated:
                raise ValueError(
                    f"{self.backend.name}: host block at {block.address:#x} is not allocated "
                    "by this allocator (freed twice, or from another allocator)"
                )
            try:  # atomic: all or nothing, even under KeyboardInterrupt
                self._release(block)
            finally:
                if PENDING.flag:
                    deliver()

    def _release(self, block: HostBlock) -> None:
        block.allocated = False
        streams, block.streams = block.streams, None
        if not streams:
            self._cache(block)
            return
        for device_index, stream in sorted(streams):
            try:
                event = self._event_on(device_index, stream)
            except Exception as exc:
                self._wait_instead(block, device_index, stream, exc)
                continue
            block.event_count += 1
            self._events.append((event, block, device_index))
        if block.event_count == 0:
            self._cache(block)

    def _cache(self, block: HostBlock) -> None:
        key = (block.device_index, block.size)
        cached = self._free.get(key)
        if cached is None:
            cached = self._free[key] = []
        cached.append(block)
        self.stats.deactivate(block.size)

    def _event_on(self, device_index: int, stream: int) -> Any:
        idle = self._idle_events.get(device_index)
        event = idle.pop() if idle else None
        if event is None:
            event = self.backend.event_create(device_index, False)
        try:
            self.backend.event_record(event, device_index, stream)
        except BaseException:
            self._idle_events.setdefault(device_index, []).append(event)
            raise
        return event

    def _wait_instead(
        self, block: HostBlock, device_index: int, stream: int, exc: Exception
    ) -> None:
        try:
            self.backend.stream_synchronize(device_index, stream)
            how = "waited for the stream instead"
        except Exception:
            how = "the stream is gone: a destroyed stream has finished its work"
        warnings.warn(
            f"{self.backend.name}:{device_index}: no event could be recorded on stream "
            f"{stream:#x}, which used the host block at {block.address:#x}: {exc}; {how}, so "
            "the free does not wait for it",
            RuntimeWarning,
            stacklevel=5,
        )

    def _process_events(self) -> None:
        events = self._events
        idle = self._idle_events
        while events:
            event, block, device_index = events[0]
            if not self.backend.event_query(event):
                break
            events.popleft()
            idle.setdefault(device_index, []).append(event)
            block.event_count -= 1
            if block.event_count == 0:
                self._cache(block)

    @atomic
    def free_soon(self, block: HostBlock) -> None:
        """Free ``block`` now, or, when called inside one of this allocator's operations on this
        thread (a finaliser the garbage collector ran there), as that operation ends.

        For finalisers: nothing re-enters an operation half-way. A block that is not
        allocated by then is left alone.
        """
        if self._lock._is_owned():  # type: ignore[attr-defined]
            self._finalized.append(block)
            return
        with self._lock:
            if self._blocks.get(block.address) is block and block.allocated:
                self._release(block)

    def _free_finalized(self) -> None:
        work, self._finalized = self._finalized, []
        for block in work:
            if self._blocks.get(block.address) is block and block.allocated:
                self._release(block)

    @atomic
    def record_stream(self, block: HostBlock, device_index: int, stream: int) -> None:
        """Note that ``block`` is used on a stream; its free then waits for that stream's work.

        Raises
        ------
        ValueError
            If the block is not allocated by this allocator.
        """
        with self._lock:
            if self._blocks.get(block.address) is not block or not block.allocated:
                raise ValueError(
                    f"{self.backend.name}: host block at {block.address:#x} is not allocated"
                )
            if block.streams is None:
                block.streams = set()
            block.streams.add((device_index, stream))

    # ------------------------------------------------------------------ cache
    @atomic
    def empty_cache(self) -> None:
        """Release every cached block to the backend, after checking pending events.

        Blocks in use, and blocks whose events have not completed, stay (this does not wait for
        streams, as in PyTorch). The idle events kept for reuse are destroyed.

        Raises
        ------
        AcceleratorError
            For a driver error; the blocks not yet released stay cached, all counted.
        """
        with self._lock:
            if self._finalized:
                self._free_finalized()
            if self._events:
                self._process_events()
            stats = self.stats
            for key in sorted(self._free):
                cached = self._free[key]
                while cached:
                    block = cached[-1]
                    start = time.perf_counter_ns()
                    self.source(block.device_index).release(block.address)
                    elapsed_us = (time.perf_counter_ns() - start) // 1000
                    cached.pop()
                    del self._blocks[block.address]
                    stats.host_free_time.increase(elapsed_us)
                    stats.allocations.decrease(1)
                    stats.allocated_bytes.decrease(block.size)
                del self._free[key]
            for idle in self._idle_events.values():
                while idle:
                    self.backend.event_destroy(idle.pop())

    # ------------------------------------------------------------------ stats
    def memory_stats(self) -> dict[str, int]:
        """Return ``torch.cuda.host_memory_stats()``'s flat keys (:meth:`HostStats.as_dict`)."""
        with self._lock:
            return self.stats.as_dict()

    @atomic
    def reset_peak_memory_stats(self) -> None:
        """Set every peak to its current value; the durations' min and max to 0."""
        with self._lock:
            self.stats.reset_peak()

    @atomic
    def reset_accumulated_memory_stats(self) -> None:
        """Zero the allocated/freed sums (so ``num_host_alloc``/``num_host_free``) and the
        durations' total and count."""
        with self._lock:
            self.stats.reset_accumulated()

    def cached_blocks(self) -> list[HostBlock]:
        """Return the blocks on free lists, by (device, size), each list oldest first."""
        with self._lock:
            return [b for key in sorted(self._free) for b in self._free[key]]

    def blocks(self) -> list[HostBlock]:
        """Return every block held from the backend (allocated, pending or cached), by address."""
        with self._lock:
            return [self._blocks[a] for a in sorted(self._blocks)]


register(HostCachingAllocator.malloc)
register(HostCachingAllocator.free)


def _host_memory_info() -> tuple[int, int]:
    """(available, total) physical host memory in bytes where the OS reports it, else (0, 0)."""
    import os

    try:
        page = os.sysconf("SC_PAGE_SIZE")
        return os.sysconf("SC_AVPHYS_PAGES") * page, os.sysconf("SC_PHYS_PAGES") * page
    except (AttributeError, OSError, ValueError):
        return 0, 0


# ---------------------------------------------------------------------- the process's allocators
_lock = threading.Lock()
_allocators: dict[str, HostCachingAllocator] = {}


def _allocator_of(backend: Backend) -> HostCachingAllocator:
    allocator = _allocators.get(backend.name)
    if allocator is not None and allocator.backend is backend:
        return allocator
    with _lock:
        allocator = _allocators.get(backend.name)
        if allocator is None or allocator.backend is not backend:
            allocator = _allocators[backend.name] = HostCachingAllocator(backend)
        return allocator


def _existing_allocator() -> HostCachingAllocator | None:
    """The accelerator's host allocator if it exists; creates nothing, initialises no driver."""
    backend = _runtime.accelerator()
    if backend is None:
        return None
    allocator = _allocators.get(backend.name)
    return allocator if allocator is not None and allocator.backend is backend else None


def _reset() -> None:
    with _lock:
        for allocator in _allocators.values():
            allocator.empty_cache()
        _allocators.clear()


_runtime.on_reset(_reset)


# ---------------------------------------------------------------------- the public API
def empty_host(nbytes: int, *, device: DeviceLike = None) -> HostBuffer:
    """Allocate uninitialised pinned host memory from the host caching allocator.

    Parameters
    ----------
    nbytes : int
        Size in bytes, 0 <= nbytes <= 2**60. The block is ``nbytes`` rounded up to a power of
        two. Zero gives an empty buffer (``ptr == 0``) without touching the allocator, as
        PyTorch does.
    device : int, str, Device or None
        The device the memory is for (whose driver pins it); None for the current device.

    Returns
    -------
    HostBuffer
        Host memory that ``accelrt.copy_`` copies to and from device buffers asynchronously.

    Raises
    ------
    TypeError
        If ``nbytes`` is not an integer, or ``device`` is of a bad type.
    ValueError
        If ``nbytes`` is negative or over 2**60, or the device is out of range or not the
        accelerator's.
    RuntimeError
        If there is no accelerator.
    OutOfMemoryError
        If the backend has no host memory for a new block.

    Notes
    -----
    Thread-safe. The memory is pinned where the backend can pin it
    (``HostBuffer.pinned``; on ``sim`` it is ordinary page-aligned memory). A freed buffer's
    block is reused once every stream that used it has finished that work. Mirrors
    ``torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)``.

    Examples
    --------
    >>> import accelrt as acc
    >>> with acc.empty_host(1000) as host:
    ...     host.nbytes
    1000
    >>> acc.host_memory_stats()["allocated_bytes.current"]
    1024
    """
    if type(nbytes) is not int:
        nbytes = _as_size(nbytes)
    if nbytes < 0:
        raise ValueError(f"allocation size must be >= 0 bytes, got {nbytes}")
    backend, index = _runtime.resolve_device(device)
    allocator = _allocator_of(backend)
    where, pinned = allocator.device_info(index)
    if nbytes == 0:
        return HostBuffer(None, None, 0, where, pinned)
    try:  # atomic: the block is never allocated without a HostBuffer that frees it
        return HostBuffer(allocator, allocator.malloc(nbytes, index), nbytes, where, pinned)
    finally:
        if PENDING.flag:
            deliver()


register(empty_host)


def get_host_allocator() -> HostCachingAllocator:
    """Return the accelerator's host caching allocator, creating it on first use.

    Returns
    -------
    HostCachingAllocator
        The one host allocator of the accelerator backend; for tools and benchmarks that work
        below ``empty_host``.

    Raises
    ------
    RuntimeError
        If there is no accelerator.
    """
    return _allocator_of(_runtime.require_accelerator())


def host_memory_stats() -> dict[str, int]:
    """Return the host caching allocator's statistics.

    Returns
    -------
    dict of str to int
        Sorted flat keys, as ``torch.cuda.host_memory_stats()``: ``allocations``,
        ``allocated_bytes`` (blocks and bytes held from the backend, in use or cached),
        ``active_requests``, ``active_bytes`` (blocks and bytes handed out and not yet
        reusable), each ``.current``, ``.peak``, ``.allocated`` and ``.freed``;
        ``num_host_alloc`` and ``num_host_free`` (backend allocations and releases);
        ``host_alloc_time`` and ``host_free_time`` (microseconds in the backend's host
        allocations and releases), each ``.total``, ``.max``, ``.min``, ``.count`` and ``.avg``.
        Sizes are the rounded block sizes, in bytes. Empty before the first ``empty_host``.

    Raises
    ------
    ValueError
        If ``ACCELRT_BACKEND`` names an unregistered backend.

    Notes
    -----
    The ``active_*`` peaks are the sums of each block size's own peak, as PyTorch reports them
    (an upper bound of the true peak). A block freed after use on a stream stays active until
    an allocation or ``empty_host_cache`` sees its event completed. Creates nothing and
    initialises no driver. Mirrors ``torch.cuda.host_memory_stats``.
    """
    allocator = _existing_allocator()
    return allocator.memory_stats() if allocator is not None else {}


def empty_host_cache() -> None:
    """Return every cached, unused host block to the backend; no-op before first use.

    Blocks still in use, and freed blocks whose streams have not finished with them, stay
    (it does not wait for streams).

    Raises
    ------
    ValueError
        If ``ACCELRT_BACKEND`` names an unregistered backend.
    AcceleratorError
        For a driver error; what was not released stays cached.

    Notes
    -----
    Thread-safe. Mirrors ``torch.accelerator.empty_host_cache``.
    """
    allocator = _existing_allocator()
    if allocator is not None:
        allocator.empty_cache()


def reset_peak_host_memory_stats() -> None:
    """Set every peak host statistic to its current value; no-op before first use.

    Also clears the ``min`` and ``max`` of ``host_alloc_time`` and ``host_free_time``. Raises
    as ``host_memory_stats``. Mirrors ``torch.cuda.reset_peak_host_memory_stats``.
    """
    allocator = _existing_allocator()
    if allocator is not None:
        allocator.reset_peak_memory_stats()


def reset_accumulated_host_memory_stats() -> None:
    """Zero the accumulated host statistics; no-op before first use.

    The ``.allocated`` and ``.freed`` sums, hence ``num_host_alloc`` and ``num_host_free``,
    and the ``total`` and ``count`` of the times. Raises as ``host_memory_stats``. Mirrors
    ``torch.cuda.reset_accumulated_host_memory_stats``.
    """
    allocator = _existing_allocator()
    if allocator is not None:
        allocator.reset_accumulated_memory_stats()
