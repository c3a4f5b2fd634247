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
Raw memory comes through a :class:`~accelrt.memory.host._source.HostMemorySource`, the host
counterpart of the device allocator's memory source. Thread-safe: one lock; operations are all
or nothing, even under ``KeyboardInterrupt`` (``_atomic.py``). docs/host-allocator.md describes
the behaviour exactly.
"""

from __future__ import annotations

import threading
import time

from ..._device import Device
from ..._errors import OutOfMemoryError
from ..._lazy import made_once
from ..._units import format_bytes
from ...backends._base import Backend
from .._atomic import PENDING, atomic, deliver, protect_sigint, register
from ..device._events import StreamEvents
from ..device._oom import oom_error
from ..device._requests import _request_size
from ..device._stats import StatsMethods
from ._source import HostMemorySource
from ._stats import HostStats

__all__ = ["HostBlock", "HostCachingAllocator", "host_round_size"]


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


class HostCachingAllocator(StreamEvents[HostBlock], StatsMethods[HostStats]):
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
    module docstring states the policy. Frees that wait for streams are ``StreamEvents``'
    (device/_events.py), shared with the device allocator: here one queue holds every event.
    """

    _QUEUE_PER_STREAM = False
    _USED_BLOCK = "the host block at {:#x}"

    def __init__(self, backend: Backend) -> None:
        self.backend = backend
        self._lock = threading.RLock()
        self._sources: dict[int, HostMemorySource] = {}
        self._device_info: dict[int, tuple[Device, bool]] = {}  # index -> (Device, pinned)
        self._free: dict[tuple[int, int], list[HostBlock]] = {}  # (device, size) -> LIFO
        self._blocks: dict[int, HostBlock] = {}  # address -> every block held
        self._events = {}
        self._idle_events = {}
        self._finalized = []
        self.stats = HostStats()
        protect_sigint()

    def source(self, device_index: int) -> HostMemorySource:
        """Return the memory source of a device (created on first use)."""
        return made_once(self._sources, device_index, self._lock, self._new_source)

    def _new_source(self, device_index: int) -> HostMemorySource:
        return HostMemorySource(self.backend, device_index)

    def device_info(self, device_index: int) -> tuple[Device, bool]:
        """Return ``(Device, pinned)`` of a device: whether its host memory is pinned."""
        info = self._device_info.get(device_index)
        if info is None:
            info = (Device(self.backend.name, device_index), self.source(device_index).pinned)
            self._device_info[device_index] = info
        return info

    # ------------------------------------------------------------------ malloc
    def malloc(self, nbytes: int, device_index: int) -> HostBlock:
        """Return an allocated block of ``host_round_size(nbytes)`` bytes of host memory for
        device ``device_index`` (already range-checked); ``nbytes`` from 1 to 2**60.

        Raises
        ------
        TypeError, ValueError
            For an ``nbytes`` that is not an integer from 1 to 2**60 (as
            ``CachingAllocator.malloc``).
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
                self._catch_up()
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
        return oom_error(message, device, nbytes, size, active, held, free_bytes, total_bytes)

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
                block.allocated = False
                self._release(block, bool(block.streams))
            finally:
                if PENDING.flag:
                    deliver()

    def _take_stream_uses(self, block: HostBlock) -> list[tuple[int, int]]:
        streams, block.streams = block.streams, None
        return sorted(streams or ())

    def _free_block(self, block: HostBlock) -> None:
        key = (block.device_index, block.size)
        cached = self._free.get(key)
        if cached is None:
            cached = self._free[key] = []
        cached.append(block)
        self.stats.deactivate(block.size)

    @atomic
    def free_soon(self, block: HostBlock) -> None:
        """Free ``block`` now, or, when called inside one of this allocator's operations on this
        thread (a finaliser the garbage collector ran there), as that operation ends.

        For finalisers: nothing re-enters an operation half-way. A block that is not
        allocated by then is left alone.
        """
        if not self._deferred_inside_operation(self._free_if_allocated, block):
            with self._lock:
                self._free_if_allocated(block)

    def _free_if_allocated(self, block: HostBlock) -> None:
        if self._blocks.get(block.address) is block and block.allocated:
            self.free(block)

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
            self._catch_up()
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
            self._destroy_idle_events()

    # ------------------------------------------------------------------ blocks
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
