"""The host caching allocator's statistics, with ``torch.cuda.host_memory_stats()``'s keys."""

from __future__ import annotations

from collections.abc import Iterable

from ..device._stats import Stat

__all__ = ["DurationStat", "HostStats"]


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
