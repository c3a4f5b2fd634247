"""``memory_summary``'s table (PyTorch's layout and unit choices over ``memory_stats()`` keys)
and the tables of what was live at a moment (the peak, an OOM), grouped by stack frame or op."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

from ..._units import format_bytes

__all__ = ["fit_frame", "format_live_groups", "format_summary"]

_WIDTH = 75
_SIZE_PREFIXES = ("B  ", "KiB", "MiB", "GiB", "TiB", "PiB")
_COUNT_PREFIXES = (" ", "K", "M")

_POOLED_ROWS: tuple[tuple[str, str, bool], ...] = (
    ("allocated_bytes", "Allocated memory", True),
    ("active_bytes", "Active memory", True),
    ("requested_bytes", "Requested memory", True),
    ("reserved_bytes", "Reserved memory", True),
    ("inactive_split_bytes", "Non-releasable memory", True),
    ("allocation", "Allocations", False),
    ("active", "Active allocs", False),
    ("segment", "Reserved segments", False),
    ("inactive_split", "Non-releasable allocs", False),
)
_SINGLE_ROWS = (
    ("oversize_allocations", "Oversize allocations"),
    ("oversize_segments", "Oversize segments"),
)
_METRICS = ("current", "peak", "allocated", "freed")
_POOLS = (
    ("all", ""),
    ("large_pool", "      from large pool"),
    ("small_pool", "      from small pool"),
)
_HEADER = "        Metric         | Cur Usage  | Peak Usage | Tot Alloc  | Tot Freed  "


def _scaled(
    value: int, preferred: float, prefixes: tuple[str, ...], base: int, threshold: int
) -> tuple[int, str]:
    """Divide by ``base`` while ``preferred`` (the row's "all" value) is >= ``threshold``."""
    prefix = prefixes[0]
    for next_prefix in prefixes[1:]:
        if preferred < threshold:
            break
        prefix, value, preferred = next_prefix, value // base, preferred / base
    return value, prefix


def _format_size(value: int, preferred: float) -> str:
    """Bytes in B, then KiB, MiB... from 768 of the smaller unit (as PyTorch)."""
    scaled, prefix = _scaled(value, preferred, _SIZE_PREFIXES, 1024, 768 * 1024)
    return f"{scaled:6d} {prefix}"


def _format_count(value: int, preferred: float) -> str:
    """A count, then K and M from 750 of the smaller unit (as PyTorch)."""
    scaled, prefix = _scaled(value, preferred, _COUNT_PREFIXES, 1000, 750 * 1000)
    return f"{scaled:7d} {prefix} "


def _row(name: str, values: list[int], units: list[int], fmt: Callable[[int, float], str]) -> str:
    cells = " | ".join(fmt(v, u) for v, u in zip(values, units, strict=True))
    return f" {name:<21} | {cells} "


def format_summary(stats: Mapping[str, int], device: str, *, abbreviated: bool = False) -> str:
    """Format ``memory_stats()`` keys as PyTorch's ``memory_summary`` table.

    Parameters
    ----------
    stats : mapping
        ``memory_stats()`` output (every key present; an empty mapping counts as all zero).
    device : str
        The device's name for the title, e.g. ``"opencl:0"``.
    abbreviated : bool
        Leave out the large-pool and small-pool sub-rows.

    Returns
    -------
    str
        The table, 75 characters wide between its borders, ending in a newline. Each column is
        current, peak, total allocated and total freed; a row's unit is chosen from its "all"
        value (B below 768 KiB, then KiB, MiB...; counts in K from 750,000), exactly as
        ``torch.cuda.memory_summary`` does.
    """

    def get(key: str) -> int:
        return int(stats.get(key, 0))

    title = f"accelrt memory summary, device {device}"
    counters = (
        f"OOMs: {get('num_ooms')}",
        f"device malloc retries: {get('num_alloc_retries')}",
    )
    lines = ["=" * _WIDTH, f"{title:^{_WIDTH}}", "-" * _WIDTH]
    lines.append(f"{counters[0]:^37}|{counters[1]:^37}")
    lines += ["=" * _WIDTH, _HEADER]
    pools = _POOLS[:1] if abbreviated else _POOLS
    for key, name, is_size in _POOLED_ROWS:
        fmt = _format_size if is_size else _format_count
        lines.append("-" * _WIDTH)
        units = [get(f"{key}.all.{m}") for m in _METRICS]
        for pool, label in pools:
            values = [get(f"{key}.{pool}.{m}") for m in _METRICS]
            lines.append(_row(label or name, values, units, fmt))
    for key, name in _SINGLE_ROWS:
        lines.append("-" * _WIDTH)
        values = [get(f"{key}.{m}") for m in _METRICS]
        lines.append(_row(name, values, values, _format_count))
    lines.append("=" * _WIDTH)
    return "".join(f"|{line}|\n" for line in lines)


def format_live_groups(
    title: str, rows: Sequence[tuple[str, int, int]], live_bytes: int, *, width: int = 100
) -> str:
    """Format what was live at one moment, grouped (by stack frame or op), as a text table.

    Parameters
    ----------
    title : str
        The table's first line, e.g. ``"Live at the peak (event 812), by stack frame"``.
    rows : sequence of (str, int, int)
        ``(key, bytes, allocations)`` per group, largest first.
    live_bytes : int
        All live bytes then (for the share column).
    width : int
        The widest a line may be; long keys are cut from the left (keeping ``file:line``).

    Returns
    -------
    str
        The table, ending in a newline; no line is longer than ``width``.
    """
    key_width = max(20, width - 34)
    lines = [title, f"{'bytes':>12} {'share':>6} {'allocs':>8}  where"]
    for key, nbytes, count in rows:
        share = f"{100 * nbytes / live_bytes:5.1f}%" if live_bytes else "    - "
        shown = fit_frame(key, key_width)
        lines.append(f"{format_bytes(nbytes):>12} {share:>6} {count:>8}  {shown}")
    return "\n".join(lines) + "\n"


def fit_frame(text: str, width: int) -> str:
    """Shorten a frame ``"function  path:line"`` to ``width`` characters.

    The function name is kept and the path is cut from the left (so ``file:line`` stays);
    other text is cut from the left. ``width`` below 8 is taken as 8.
    """
    width = max(8, width)
    if len(text) <= width:
        return text
    name, sep, where = text.partition("  ")
    if sep and len(name) + 6 < width:
        return f"{name}  ...{where[-(width - len(name) - 5) :]}"
    return "..." + text[-(width - 3) :]
