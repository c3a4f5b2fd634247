"""A simulated device: address space only, any capacity, for replaying big GPU workloads offline.

Addresses follow one documented rule (docs/allocator.md section 13) so that replays are
reproducible: device ``i`` hands out addresses from a bump pointer starting at
``0x7F0000000000 + i * 2**44``, each allocation aligned to 2 MiB, never reusing an address.
Allocations fail with ``BackendOutOfMemory`` once the bytes held would exceed the capacity.

The device has virtual memory (for expandable segments): ``vm_reserve`` hands out an address
range without holding any memory: the lowest range given back earlier that is large enough,
else the next by the same rule, so cycles of reserve and release never use up the address
space, whatever order ranges are given back in; ``vm_map``
backs 2 MiB pages of it, which count against the capacity like allocations until ``vm_unmap``.
A device whose address range (2**44 bytes, unbounded for the last device) is used up fails
further requests as out of memory rather than hand out another device's addresses.

Streams and events complete at once; events carry host timestamps so ``elapsed_time`` works.
Host memory for ``accelrt.empty_host`` is ordinary page-aligned anonymous memory (``mmap``): the
device has no pinning, and says so (``host_memory_pinned`` and the device properties).
Memory is host-backed lazily: the first copy into or view of an allocation creates its host
bytes, so an 80 GiB replay uses no host memory while a small test can round-trip data.

Configuration (read when the backend is created): ``ACCELRT_SIM_DEVICES`` (device count,
default 2), ``ACCELRT_SIM_CAPACITY`` (bytes per device, e.g. ``"80GiB"``, the default) and
``ACCELRT_VISIBLE_DEVICES``. A device keeps the addresses of its physical index when visibility
renumbers it, so workers given different devices never share an address.
"""

from __future__ import annotations

import bisect
import ctypes
import functools
import mmap
import os
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable
from typing import Concatenate, ParamSpec, TypeVar

from .._device import DeviceProperties
from .._errors import InputError
from .._units import parse_bytes
from ._base import STORAGE_DTYPE_NAMES, BackendOutOfMemory, DType, dtypes, visible_devices

__all__ = ["SimBackend", "SimEvent"]

BASE_ADDRESS = 0x7F0000000000
DEVICE_STRIDE = 1 << 44
SEGMENT_ALIGNMENT = 2 << 20
DEFAULT_CAPACITY = 80 << 30
DEFAULT_DEVICE_COUNT = 2
MAX_DEVICE_COUNT = 1024
"""At most this many simulated devices (addresses stay below 2**54 + the base)."""
ENV_DEVICES = "ACCELRT_SIM_DEVICES"
ENV_CAPACITY = "ACCELRT_SIM_CAPACITY"
VM_GRANULARITY = 2 << 20
# Host backing of reserved ranges: private, anonymous, and (on Linux) not counted against the
# commit limit, so an untouched 90 GiB range costs nothing. Python < 3.13 lacks the constant.
_MMAP_FLAGS = mmap.MAP_PRIVATE | getattr(
    mmap, "MAP_NORESERVE", 0x4000 if sys.platform.startswith("linux") else 0
)


def _address_limit(index: int, device_count: int) -> int:
    """The end of device ``index``'s address range: the next device's base; none for the last
    (so one device of any capacity, as replays use, never runs out of addresses)."""
    return BASE_ADDRESS + (index + 1) * DEVICE_STRIDE if index + 1 < device_count else 1 << 63


class SimEvent:
    """A simulated event: the host time (ns) at which it was recorded, or None."""

    __slots__ = ("device", "time_ns", "timing")

    def __init__(self, device: int, timing: bool) -> None:
        self.device = device
        self.timing = timing
        self.time_ns: int | None = None


class _Reservation:
    """An address range from ``vm_reserve``: its mapped pages and, once touched, host bytes.

    Mapped pages are kept as sorted, disjoint, coalesced ``[first, last)`` page intervals, so a
    petabyte range costs as little as a small one.
    """

    __slots__ = ("backing", "intervals", "size")

    def __init__(self, size: int) -> None:
        self.size = size
        self.intervals: list[tuple[int, int]] = []
        self.backing: mmap.mmap | None = None

    def overlaps(self, first: int, last: int) -> bool:
        """Whether any page in ``[first, last)`` is mapped."""
        pos = bisect.bisect_right(self.intervals, (first, 1 << 62)) - 1
        if pos >= 0 and self.intervals[pos][1] > first:
            return True
        return pos + 1 < len(self.intervals) and self.intervals[pos + 1][0] < last

    def covers(self, first: int, last: int) -> bool:
        """Whether every page in ``[first, last)`` is mapped."""
        pos = bisect.bisect_right(self.intervals, (first, 1 << 62)) - 1
        return pos >= 0 and self.intervals[pos][0] <= first and last <= self.intervals[pos][1]

    def add(self, first: int, last: int) -> None:
        """Mark ``[first, last)`` mapped (none of it is), merging with touching intervals."""
        pos = bisect.bisect_left(self.intervals, (first, last))
        if pos > 0 and self.intervals[pos - 1][1] == first:
            pos -= 1
            first = self.intervals.pop(pos)[0]
        if pos < len(self.intervals) and self.intervals[pos][0] == last:
            last = self.intervals.pop(pos)[1]
        self.intervals.insert(pos, (first, last))

    def remove(self, first: int, last: int) -> None:
        """Mark ``[first, last)`` unmapped (all of it is mapped, in one interval)."""
        pos = bisect.bisect_right(self.intervals, (first, 1 << 62)) - 1
        start, end = self.intervals.pop(pos)
        pieces = [(a, b) for a, b in ((start, first), (last, end)) if a < b]
        self.intervals[pos:pos] = pieces


class _SimDevice:
    __slots__ = (
        "address_limit",
        "backing",
        "bases",
        "capacity",
        "held",
        "next_address",
        "physical_index",
        "planned",
        "planned_reservations",
        "released",
        "reservations",
        "sizes",
    )

    def __init__(self, index: int, capacity: int, address_limit: int) -> None:
        self.physical_index = index
        self.capacity = capacity
        self.held = 0
        self.next_address = BASE_ADDRESS + index * DEVICE_STRIDE
        self.address_limit = address_limit  # where the next device's addresses begin
        self.bases: list[int] = []  # sorted live allocation addresses
        self.sizes: dict[int, int] = {}
        self.backing: dict[int, bytearray] = {}
        self.planned: dict[int, deque[int]] = {}  # size -> addresses to hand out first
        self.reservations: dict[int, _Reservation] = {}  # base -> range (also in bases/sizes)
        self.planned_reservations: deque[int] = deque()  # vm_reserve hands these out first
        # Address ranges given back by vm_release below next_address, merged, sorted by start:
        # [start, end) pairs that vm_reserve hands out again (lowest first that fits).
        self.released: list[tuple[int, int]] = []

    def bump(self, nbytes: int) -> int:
        """Return the next free 2 MiB-aligned address for ``nbytes`` and move past it."""
        span = -(-max(nbytes, 1) // SEGMENT_ALIGNMENT) * SEGMENT_ALIGNMENT
        end = self.overlap_end(self.next_address, span)
        while end is not None:  # skip planned allocations in the way
            self.next_address = -(-end // SEGMENT_ALIGNMENT) * SEGMENT_ALIGNMENT
            end = self.overlap_end(self.next_address, span)
        ptr = self.next_address
        if ptr + span > self.address_limit:
            raise BackendOutOfMemory(
                f"sim device {self.physical_index} has used up its {DEVICE_STRIDE} bytes of "
                "address space (addresses are never reused)"
            )
        self.next_address += span
        return ptr

    def overlap_end(self, ptr: int, nbytes: int) -> int | None:
        """The end of the highest live allocation overlapping ``[ptr, ptr + nbytes)``, or None."""
        pos = bisect.bisect_right(self.bases, ptr + nbytes - 1) - 1
        if pos < 0:
            return None
        end = self.bases[pos] + max(self.sizes[self.bases[pos]], 1)
        return end if end > ptr else None

    def take_released(self, nbytes: int) -> int | None:
        """The start of the lowest released range that holds ``nbytes``, taken off the list."""
        for start, end in self.released:
            if end - start >= nbytes:
                self.claim(start, nbytes)
                return start
        return None

    def claim(self, ptr: int, nbytes: int) -> None:
        """Remove ``[ptr, ptr + nbytes)`` from the released ranges (it is in use again)."""
        last = ptr + nbytes
        kept: list[tuple[int, int]] = []
        for start, end in self.released:
            if end <= ptr or start >= last:
                kept.append((start, end))
                continue
            if start < ptr:
                kept.append((start, ptr))
            if end > last:
                kept.append((last, end))
        self.released = kept

    def release(self, ptr: int, nbytes: int) -> None:
        """Make ``[ptr, ptr + nbytes)`` reusable: merged with its released neighbours, and
        given back to the bump pointer when it ends there."""
        start, end = ptr, ptr + nbytes
        kept: list[tuple[int, int]] = []
        for first, last in self.released:
            if last == start:
                start = first
            elif first == end:
                end = last
            else:
                kept.append((first, last))
        if end >= self.next_address:
            self.next_address = start
        else:
            bisect.insort(kept, (start, end))
        self.released = kept


class SimBackend:
    """The simulated backend (``"sim"``): any number of devices of any capacity.

    Parameters
    ----------
    device_count : int, optional
        Number of physical devices; default ``ACCELRT_SIM_DEVICES`` or 2. Of these,
        ``ACCELRT_VISIBLE_DEVICES`` chooses the visible ones.
    capacity : int or str, optional
        Bytes per device; default ``ACCELRT_SIM_CAPACITY`` or 80 GiB.

    Raises
    ------
    TypeError
        If ``device_count`` is not an int.
    ValueError
        If the device count is not 1 to 1024, or the capacity cannot be parsed (the message
        names the environment variable when the value came from one).

    Notes
    -----
    Selected only explicitly: ``ACCELRT_BACKEND=sim``, ``accelrt.backends.use("sim")`` or
    ``accelrt replay --device sim``; auto-detection never picks it. Thread-safe: its address
    bookkeeping is behind one lock.
    """

    name = "sim"

    def __init__(self, device_count: int | None = None, capacity: int | str | None = None) -> None:
        if device_count is None:
            text = os.environ.get(ENV_DEVICES, str(DEFAULT_DEVICE_COUNT)).strip()
            if not (text.isascii() and text.isdigit() and len(text) <= 6):
                raise InputError(
                    f"{ENV_DEVICES}={text[:40]!r}: expected a device count in ASCII digits, "
                    f"1 to {MAX_DEVICE_COUNT}"
                )
            device_count = int(text)
            where = ENV_DEVICES
        else:
            where = "sim device_count"
        if isinstance(device_count, bool) or not isinstance(device_count, int):
            raise TypeError(f"{where} must be an int, got {device_count!r}")
        if not 1 <= device_count <= MAX_DEVICE_COUNT:
            raise InputError(f"{where} must be 1 to {MAX_DEVICE_COUNT}, got {device_count}")
        if capacity is None:
            capacity = os.environ.get(ENV_CAPACITY, DEFAULT_CAPACITY)
            self.capacity = parse_bytes(capacity, name=ENV_CAPACITY)
        else:
            self.capacity = parse_bytes(capacity, name="sim capacity")
        self._devices = [
            _SimDevice(i, self.capacity, _address_limit(i, device_count))
            for i in visible_devices(device_count)
        ]
        self._next_stream = 1
        self._lock = threading.RLock()  # address bookkeeping: copies run outside the allocator
        self._host: dict[int, mmap.mmap] = {}  # host_alloc address -> its anonymous mapping

    # discovery
    def is_available(self) -> bool:
        """Always True: the simulated device needs no driver."""
        return True

    def device_count(self) -> int:
        """Return the number of visible simulated devices."""
        return len(self._devices)

    def get_device_properties(self, index: int) -> DeviceProperties:
        """Return the simulated device's properties (capacity as total memory)."""
        dev = self._devices[index]
        return DeviceProperties(
            name="accelrt simulated device",
            vendor="accelrt",
            backend=self.name,
            index=index,
            total_memory=dev.capacity,
            multi_processor_count=1,
            max_allocation_bytes=dev.capacity,
            driver_version="sim",
            host_accessible=True,
            pinned_host_memory=False,
            raw={
                "physical_index": dev.physical_index,
                "base_address": BASE_ADDRESS + dev.physical_index * DEVICE_STRIDE,
            },
        )

    def supported_dtypes(self, index: int) -> frozenset[DType]:
        """Every fixed-size numpy dtype: the simulated device holds bytes of any kind."""
        return dtypes(STORAGE_DTYPE_NAMES)

    def supports_virtual_memory(self) -> bool:
        """True: the simulated device can reserve and map address ranges."""
        return True

    # memory
    def plan_addresses(self, index: int, allocations: Iterable[tuple[int, int]]) -> None:
        """Hand out recorded addresses: the next ``malloc`` of each size takes the next of its
        planned addresses, in order, where that range is free (else the bump pointer's).

        Parameters
        ----------
        index : int
            The device.
        allocations : iterable of (address, nbytes)
            E.g. the ``segment_alloc`` entries of a PyTorch recording, in order.

        Notes
        -----
        For exact replays of recordings (docs/allocator.md section 13): equal-size free blocks are
        chosen by lowest address, so a replay that wants PyTorch's choices needs its addresses.
        """
        planned = self._devices[index].planned
        for address, nbytes in allocations:
            planned.setdefault(nbytes, deque()).append(address)

    def plan_reservations(self, index: int, addresses: Iterable[int]) -> None:
        """Have the next ``vm_reserve`` calls return these addresses, in order, where free.

        For exact replays of recordings made with expandable segments (docs/allocator.md
        section 13): the ranges a recording's segments sat in.
        """
        self._devices[index].planned_reservations.extend(addresses)

    @staticmethod
    def _next_planned(dev: _SimDevice, queue: deque[int] | None, nbytes: int) -> int | None:
        """The first planned address of ``queue`` whose ``nbytes`` are free (taken off it)."""
        while queue:
            ptr = queue.popleft()
            if dev.overlap_end(ptr, nbytes) is None:
                return ptr
        return None

    def malloc(self, index: int, nbytes: int) -> int:
        """Hand out a planned address, else the next free 2 MiB-aligned one; never reused.

        Raises ``BackendOutOfMemory`` when the bytes held would exceed the capacity.
        """
        dev = self._devices[index]
        if dev.held + nbytes > dev.capacity:
            raise BackendOutOfMemory(
                f"sim:{index} has {dev.capacity - dev.held} bytes free, {nbytes} requested"
            )
        ptr = self._next_planned(dev, dev.planned.get(nbytes), nbytes) if dev.planned else None
        if ptr is None:
            ptr = dev.bump(nbytes)
        else:  # a planned address may lie in a range given back by vm_release
            dev.claim(ptr, nbytes)
        dev.held += nbytes
        bisect.insort(dev.bases, ptr)
        dev.sizes[ptr] = nbytes
        return ptr

    def free(self, index: int, ptr: int) -> None:
        """Release an allocation; ``ValueError`` if ``ptr`` is not a live allocation."""
        dev = self._devices[index]
        nbytes = None if ptr in dev.reservations else dev.sizes.pop(ptr, None)
        if nbytes is None:
            raise ValueError(f"sim:{index}: {ptr:#x} is not an address returned by malloc")
        del dev.bases[bisect.bisect_left(dev.bases, ptr)]
        dev.backing.pop(ptr, None)
        dev.held -= nbytes

    # virtual memory
    def vm_granularity(self, index: int) -> int:
        """2 MiB: mapped ranges start and end on 2 MiB boundaries."""
        return VM_GRANULARITY

    def vm_reserve(self, index: int, nbytes: int) -> int:
        """Reserve an address range; holds no memory. The range is the next planned one
        (``plan_reservations``) where free, else the lowest range given back by ``vm_release``
        that is large enough, else the next by the device's address rule.

        Raises ``ValueError`` unless ``nbytes`` is a positive multiple of 2 MiB.
        """
        if nbytes <= 0 or nbytes % VM_GRANULARITY:
            raise ValueError(f"sim:{index}: reserve {nbytes} bytes: not a multiple of 2 MiB")
        dev = self._devices[index]
        ptr = self._next_planned(dev, dev.planned_reservations, nbytes)
        if ptr is not None:
            dev.claim(ptr, nbytes)
        else:
            ptr = dev.take_released(nbytes)
            if ptr is None:
                ptr = dev.bump(nbytes)
        bisect.insort(dev.bases, ptr)
        dev.sizes[ptr] = nbytes
        dev.reservations[ptr] = _Reservation(nbytes)
        return ptr

    def vm_release(self, index: int, address: int) -> None:
        """Give back a reserved range; ``ValueError`` if it is not one or has mapped pages."""
        dev = self._devices[index]
        reservation = dev.reservations.get(address)
        if reservation is None or reservation.intervals:
            raise ValueError(
                f"sim:{index}: {address:#x} is not a reserved range with every page unmapped"
            )
        del dev.reservations[address], dev.sizes[address]
        del dev.bases[bisect.bisect_left(dev.bases, address)]
        dev.release(address, reservation.size)

    def _pages(self, index: int, address: int, nbytes: int) -> tuple[_Reservation, int, int]:
        dev = self._devices[index]
        pos = bisect.bisect_right(dev.bases, address) - 1
        base = dev.bases[pos] if pos >= 0 else -1
        reservation = dev.reservations.get(base)
        if (
            reservation is None
            or nbytes <= 0
            or (address - base) % VM_GRANULARITY
            or nbytes % VM_GRANULARITY
            or address + nbytes > base + reservation.size
        ):
            raise ValueError(
                f"sim:{index}: [{address:#x}, {address + nbytes:#x}) is not a 2 MiB-aligned "
                "range inside one reserved range"
            )
        first = (address - base) // VM_GRANULARITY
        return reservation, first, first + nbytes // VM_GRANULARITY

    def vm_map(self, index: int, address: int, nbytes: int) -> None:
        """Back pages of a reserved range; ``BackendOutOfMemory`` past the capacity.

        Raises ``ValueError`` if the range is not whole pages of one reserved range or a page
        is mapped already.
        """
        reservation, first, last = self._pages(index, address, nbytes)
        if reservation.overlaps(first, last):
            raise ValueError(f"sim:{index}: a page of [{address:#x}, +{nbytes}) is mapped")
        dev = self._devices[index]
        if dev.held + nbytes > dev.capacity:
            raise BackendOutOfMemory(
                f"sim:{index} has {dev.capacity - dev.held} bytes free, {nbytes} to map"
            )
        reservation.add(first, last)
        dev.held += nbytes

    def vm_unmap(self, index: int, address: int, nbytes: int) -> None:
        """Unback pages (their contents are lost); ``ValueError`` if a page is not mapped."""
        reservation, first, last = self._pages(index, address, nbytes)
        if not reservation.covers(first, last):
            raise ValueError(f"sim:{index}: a page of [{address:#x}, +{nbytes}) is not mapped")
        reservation.remove(first, last)
        self._devices[index].held -= nbytes
        if reservation.backing is not None and hasattr(mmap, "MADV_DONTNEED"):
            reservation.backing.madvise(mmap.MADV_DONTNEED, first * VM_GRANULARITY, nbytes)

    def mem_get_info(self, index: int) -> tuple[int, int]:
        """Return ``(capacity - bytes held, capacity)``."""
        dev = self._devices[index]
        return dev.capacity - dev.held, dev.capacity

    # streams and events: everything completes at once
    def stream_create(self, index: int, priority: int) -> int:
        """Return a new stream handle (unique within the backend)."""
        handle = self._next_stream
        self._next_stream += 1
        return handle

    def stream_destroy(self, index: int, stream: int) -> None:
        """Nothing to release."""

    def stream_query(self, index: int, stream: int) -> bool:
        """Always True: simulated work completes at once."""
        return True

    def stream_synchronize(self, index: int, stream: int) -> None:
        """Returns at once."""

    def stream_wait_event(self, index: int, stream: int, event: SimEvent) -> None:
        """Nothing to wait for."""

    def event_create(self, index: int, timing: bool) -> SimEvent:
        """Return an unrecorded event."""
        return SimEvent(index, timing)

    def event_record(self, event: SimEvent, index: int, stream: int) -> None:
        """Stamp the event with the host's monotonic clock."""
        event.time_ns = time.perf_counter_ns()

    def event_destroy(self, event: SimEvent) -> None:
        """Nothing to release."""

    def event_query(self, event: SimEvent) -> bool:
        """Always True."""
        return True

    def event_synchronize(self, event: SimEvent) -> None:
        """Returns at once."""

    def event_elapsed_ms(self, start: SimEvent, end: SimEvent) -> float:
        """Milliseconds between the host times at which the two events were recorded."""
        assert start.time_ns is not None and end.time_ns is not None  # Event checks: recorded
        return float(end.time_ns - start.time_ns) / 1e6

    # copies
    def _backing(self, index: int, ptr: int, nbytes: int) -> memoryview:
        dev = self._devices[index]
        pos = bisect.bisect_right(dev.bases, ptr) - 1
        base = dev.bases[pos] if pos >= 0 else -1
        size = dev.sizes.get(base, 0)
        if base < 0 or ptr + nbytes > base + size:
            raise ValueError(
                f"sim:{index}: [{ptr:#x}, {ptr + nbytes:#x}) is not inside one live allocation"
            )
        reservation = dev.reservations.get(base)
        if reservation is not None:
            return self._mapped_backing(index, reservation, ptr - base, nbytes)
        data = dev.backing.get(base)
        if data is None:
            data = dev.backing[base] = bytearray(size)
        offset = ptr - base
        return memoryview(data)[offset : offset + nbytes]

    def _mapped_backing(
        self, index: int, reservation: _Reservation, offset: int, nbytes: int
    ) -> memoryview:
        first = offset // VM_GRANULARITY
        last = -(-(offset + max(nbytes, 1)) // VM_GRANULARITY)
        if not reservation.covers(first, last):
            raise ValueError(
                f"sim:{index}: bytes [{offset:#x}, +{nbytes}) of a reserved range are not mapped"
            )
        if reservation.backing is None:  # address space only: host pages appear when touched
            try:
                reservation.backing = mmap.mmap(-1, reservation.size, flags=_MMAP_FLAGS)
            except OSError as exc:
                raise ValueError(
                    f"sim:{index}: cannot back a {reservation.size}-byte reserved range with "
                    f"host memory ({exc}); use a smaller ACCELRT_SIM_CAPACITY to hold data"
                ) from None
        return memoryview(reservation.backing)[offset : offset + nbytes]

    def memcpy_async(
        self, index: int, dst: int | memoryview, src: int | memoryview, nbytes: int, stream: int
    ) -> None:
        """Copy at once between host memory and the lazily created host backing."""
        target = self._backing(index, dst, nbytes) if isinstance(dst, int) else dst
        source = self._backing(index, src, nbytes) if isinstance(src, int) else src
        target[:nbytes] = source[:nbytes]

    def memset_async(self, index: int, ptr: int, value: int, nbytes: int, stream: int) -> None:
        """Fill at once."""
        view = self._backing(index, ptr, nbytes)
        view[:] = bytes([value]) * nbytes

    def host_view(self, index: int, ptr: int, nbytes: int) -> memoryview:
        """Return the host backing of ``[ptr, ptr + nbytes)`` (created on first use)."""
        return self._backing(index, ptr, nbytes)

    def synchronize(self, index: int) -> None:
        """Returns at once."""

    # host memory
    def host_memory_pinned(self, index: int) -> bool:
        """False: the simulated device's host memory is ordinary pageable memory."""
        return False

    def host_alloc(self, index: int, nbytes: int) -> int:
        """Map ``nbytes`` of anonymous host memory (page-aligned, zero-filled) for the host
        allocator; ``BackendOutOfMemory`` when the operating system refuses the mapping."""
        try:
            mapping = mmap.mmap(-1, nbytes)
        except (OSError, OverflowError, ValueError) as exc:
            raise BackendOutOfMemory(
                f"sim:{index}: the host could not map {nbytes} bytes ({exc})"
            ) from None
        anchor = ctypes.c_char.from_buffer(mapping)
        address = ctypes.addressof(anchor)
        del anchor  # no export stays on the mapping, so host_free can close it
        self._host[address] = mapping
        return address

    def host_free(self, index: int, ptr: int) -> None:
        """Unmap memory from ``host_alloc``; ``ValueError`` if ``ptr`` is not such memory."""
        mapping = self._host.pop(ptr, None)
        if mapping is None:
            raise ValueError(f"sim:{index}: {ptr:#x} is not an address returned by host_alloc")
        mapping.close()


_P = ParamSpec("_P")
_R = TypeVar("_R")


def _under_lock(
    method: Callable[Concatenate[SimBackend, _P], _R],
) -> Callable[Concatenate[SimBackend, _P], _R]:
    """Run ``method`` holding the backend's lock: copies on one thread look addresses up while
    another thread's allocator allocates or frees (the allocator's lock covers only itself)."""

    @functools.wraps(method)
    def call(self: SimBackend, /, *args: _P.args, **kwargs: _P.kwargs) -> _R:
        with self._lock:
            return method(self, *args, **kwargs)

    return call


for _name in (
    "plan_addresses", "plan_reservations", "malloc", "free", "vm_reserve", "vm_release",
    "vm_map", "vm_unmap", "memcpy_async", "memset_async", "host_view", "host_alloc",
    "host_free",
):  # fmt: skip
    setattr(SimBackend, _name, _under_lock(getattr(SimBackend, _name)))
del _name
