"""Allocator statistics with PyTorch's key schema.

A ``Stat`` tracks ``current``, ``peak``, ``allocated`` (sum of increases) and ``freed`` (sum of
decreases). A ``StatArray`` is one ``Stat`` each for ``all``, ``small_pool`` and ``large_pool``;
every update goes to ``all`` and to the block's pool. ``DeviceStats.as_dict`` flattens them into
``memory_stats()`` keys ``<name>.<pool>.<metric>`` (mirrors ``torch.cuda.memory_stats``).

Compiled twin: device/_native.pyx ``Stat`` and ``StatArray`` (the same attributes and
methods; change both).
"""

from __future__ import annotations

from typing import Any, Generic, Protocol, TypeVar

from .._atomic import atomic

__all__ = ["STAT_ARRAY_NAMES", "AllocatorStats", "DeviceStats", "Stat", "StatArray", "StatsMethods"]

#: The StatArray names in memory_stats(), as in c10::CachingDeviceAllocator::DeviceStats.
STAT_ARRAY_NAMES: tuple[str, ...] = (
    "allocation",
    "segment",
    "active",
    "inactive_split",
    "allocated_bytes",
    "reserved_bytes",
    "active_bytes",
    "inactive_split_bytes",
    "requested_bytes",
)
_POOLS: tuple[str, ...] = ("all", "small_pool", "large_pool")
_COUNTERS: tuple[str, ...] = (
    "num_alloc_retries",
    "num_ooms",
    "num_sync_all_streams",
    "num_device_alloc",
    "num_device_free",
    "num_oom_rejections",
)


class Stat:
    """One statistic: current value, peak, and the sums of increases and decreases."""

    __slots__ = ("allocated", "current", "freed", "peak")

    def __init__(self) -> None:
        self.current = 0
        self.peak = 0
        self.allocated = 0
        self.freed = 0

    def increase(self, amount: int) -> None:
        """Add ``amount`` to current (and to allocated); raise the peak if exceeded."""
        self.current += amount
        self.allocated += amount
        if self.current > self.peak:
            self.peak = self.current

    def decrease(self, amount: int) -> None:
        """Subtract ``amount`` from current and add it to freed."""
        self.current -= amount
        self.freed += amount

    def reset_peak(self) -> None:
        """Set peak to current."""
        self.peak = self.current

    def reset_accumulated(self) -> None:
        """Set allocated and freed to 0."""
        self.allocated = 0
        self.freed = 0


class StatArray:
    """A ``Stat`` for all pools together and one each for the small and the large pool."""

    __slots__ = ("all", "large", "small")

    def __init__(self) -> None:
        self.all = Stat()
        self.small = Stat()
        self.large = Stat()

    # The allocator's hot path calls these a dozen times per alloc+free pair, so the two
    # Stat updates are written out here rather than calling Stat.increase/decrease.
    def increase(self, is_small: bool, amount: int) -> None:
        """Increase ``all`` and the given pool's stat."""
        total = self.all
        total.current += amount
        total.allocated += amount
        if total.current > total.peak:
            total.peak = total.current
        pool = self.small if is_small else self.large
        pool.current += amount
        pool.allocated += amount
        if pool.current > pool.peak:
            pool.peak = pool.current

    def decrease(self, is_small: bool, amount: int) -> None:
        """Decrease ``all`` and the given pool's stat."""
        total = self.all
        total.current -= amount
        total.freed += amount
        pool = self.small if is_small else self.large
        pool.current -= amount
        pool.freed += amount

    def stats(self) -> tuple[Stat, Stat, Stat]:
        """Return the stats in key order: ``all``, ``small_pool``, ``large_pool``."""
        return (self.all, self.small, self.large)


class DeviceStats:
    """Every statistic of one device's allocator (docs/allocator.md section 8)."""

    __slots__ = (
        "_array_type",
        "active",
        "active_bytes",
        "allocated_bytes",
        "allocation",
        "inactive_split",
        "inactive_split_bytes",
        "max_split_size",
        "num_alloc_retries",
        "num_device_alloc",
        "num_device_free",
        "num_oom_rejections",
        "num_ooms",
        "num_sync_all_streams",
        "oversize_allocations",
        "oversize_segments",
        "requested_bytes",
        "reserved_bytes",
        "reserved_bytes_by_private_pools",
        "segment",
    )

    def __init__(
        self,
        max_split_size: int,
        stat_type: type[Stat] | None = None,
        array_type: type[StatArray] | None = None,
    ) -> None:
        """``max_split_size`` in bytes (-1: unset); the compiled core passes its own
        ``Stat``/``StatArray`` types (memory/device/_native.pyx), which have the same attributes."""
        stat_type = stat_type or Stat
        array_type = array_type or StatArray
        self.allocation = array_type()
        self.segment = array_type()
        self.active = array_type()
        self.inactive_split = array_type()
        self.allocated_bytes = array_type()
        self.reserved_bytes = array_type()
        self.active_bytes = array_type()
        self.inactive_split_bytes = array_type()
        self.requested_bytes = array_type()
        self.oversize_allocations = stat_type()
        self.oversize_segments = stat_type()
        self.num_alloc_retries = 0
        self.num_ooms = 0
        self.num_sync_all_streams = 0
        self.num_device_alloc = 0
        self.num_device_free = 0
        self.num_oom_rejections = 0
        self.max_split_size = max_split_size
        #: ``reserved_bytes`` of each private pool (``MemPool``) that has reserved memory, by
        #: pool id; an entry stays when the pool's memory is given back (current 0)
        self.reserved_bytes_by_private_pools: dict[tuple[int, int], StatArray] = {}
        self._array_type = array_type

    def private_pool_reserved(self, pool_id: tuple[int, int]) -> StatArray:
        """The ``reserved_bytes`` StatArray of private pool ``pool_id`` (made at first use)."""
        array = self.reserved_bytes_by_private_pools.get(pool_id)
        if array is None:
            array = self.reserved_bytes_by_private_pools[pool_id] = self._array_type()
        return array

    def _arrays(self) -> list[tuple[str, StatArray]]:
        arrays = [(name, getattr(self, name)) for name in STAT_ARRAY_NAMES]
        for (first, second), array in self.reserved_bytes_by_private_pools.items():
            arrays.append((f"reserved_bytes_by_private_pools.{first}_{second}", array))
        return arrays

    def as_dict(self) -> dict[str, int]:
        """Flatten into ``memory_stats()`` keys, sorted; e.g. ``allocated_bytes.all.current``,
        and a private pool's ``reserved_bytes_by_private_pools.<id0>_<id1>.all.current`` (the
        pool id's two numbers joined by ``_``, as PyTorch 2.14 flattens its nested dict)."""
        out: dict[str, int] = {}
        for name, array in self._arrays():
            for pool, stat in zip(_POOLS, array.stats(), strict=True):
                _put(out, f"{name}.{pool}", stat)
        _put(out, "oversize_allocations", self.oversize_allocations)
        _put(out, "oversize_segments", self.oversize_segments)
        for counter in _COUNTERS:
            out[counter] = getattr(self, counter)
        out["max_split_size"] = self.max_split_size
        return dict(sorted(out.items()))

    def _all_stats(self) -> list[Stat]:
        stats = [s for _, array in self._arrays() for s in array.stats()]
        return [*stats, self.oversize_allocations, self.oversize_segments]

    def reset_peak(self) -> None:
        """Set every peak to its current value."""
        for stat in self._all_stats():
            stat.reset_peak()

    def reset_accumulated(self) -> None:
        """Zero every allocated/freed sum and the num_* counters."""
        for stat in self._all_stats():
            stat.reset_accumulated()
        for counter in _COUNTERS:
            setattr(self, counter, 0)


def _put(out: dict[str, int], prefix: str, stat: Stat) -> None:
    out[f"{prefix}.current"] = stat.current
    out[f"{prefix}.peak"] = stat.peak
    out[f"{prefix}.allocated"] = stat.allocated
    out[f"{prefix}.freed"] = stat.freed


class AllocatorStats(Protocol):
    """What an allocator's ``stats`` has: :class:`DeviceStats`, or the host allocator's."""

    def as_dict(self) -> dict[str, int]: ...
    def reset_peak(self) -> None: ...
    def reset_accumulated(self) -> None: ...


S = TypeVar("S", bound=AllocatorStats)


class StatsMethods(Generic[S]):
    """``memory_stats`` and the resets of a caching allocator (device or host), a base class:
    the allocator sets ``stats`` and ``_lock``."""

    __slots__ = ()
    stats: S
    _lock: Any

    def memory_stats(self) -> dict[str, int]:
        """Return every statistic as flat keys (``stats.as_dict()``: ``memory_stats()``'s or
        ``host_memory_stats()``'s)."""
        with self._lock:
            return self.stats.as_dict()

    @atomic
    def reset_peak_memory_stats(self) -> None:
        """Set every peak to its current value (the host's durations: min and max to 0)."""
        with self._lock:
            self.stats.reset_peak()

    @atomic
    def reset_accumulated_memory_stats(self) -> None:
        """Zero the allocated/freed sums and the counters (the device's num_* counters; the
        host's num_host_alloc/num_host_free and its durations' total and count)."""
        with self._lock:
            self.stats.reset_accumulated()
