"""The tables and lines ``accelrt replay`` prints: a column per setting (heads in a short
form), the mid-run banner, the notes, and the totals over a snapshot's recorded devices."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from .._text import printable
from .._units import format_bytes
from ._output import _console
from ._runs import _totals

if TYPE_CHECKING:
    from ..memory._config import AllocatorConfig, Setting
    from ..replay import ReplayReport
    from ..trace import Trace


def _bytes_or_dash(n: int | None) -> str:
    return "-" if n is None else format_bytes(n)


def _start_range(report: ReplayReport) -> str:
    """The table cell for a report's start-state range: low-high, "exact" or "-"."""
    low, high = report.peak_reserved_low_bytes, report.peak_reserved_high_bytes
    if low is None or high is None:
        return "exact" if report.start_state != "empty" else "-"
    return f"{format_bytes(low)}-{format_bytes(high)}"


def _midrun_banner(reports: Sequence[ReplayReport]) -> str:
    """What a user must know when a recording started mid-run (empty if it did not)."""
    if all(r.start_state == "empty" for r in reports):
        return ""
    before = reports[0].reserved_before_recording_bytes
    lines = [
        f"The recording started mid-run: {before} bytes ({format_bytes(before)}) were reserved "
        "before its first event."
    ]
    for r in reports:
        line = f"  [{r.config}] start state {r.describe_start()}"
        low, high = r.peak_reserved_low_bytes, r.peak_reserved_high_bytes
        if low is not None and high is not None:
            spread = high / low - 1 if low else 0.0
            line += (
                f"; peak reserved {low}-{high} bytes depending on what the unrecorded part held "
                f"(spread {spread:.1%})"
            )
        lines.append(line)
    if any(r.start_state == "modelled" for r in reports):
        lines.append(
            "  Modelled starts are estimates (docs/snapshot-replay.md gives the measured "
            "errors); --start recorded keeps the recorded layout under every setting."
        )
    return "\n".join(lines)


def _print_reports(
    name: str,
    skipped_host: int,
    reports: Sequence[ReplayReport],
    configs: Sequence[AllocatorConfig],
    sources: Sequence[str],
) -> None:
    """Print one trace's replays, a column per setting (``configs``: what each ran under, the
    column heads their :attr:`~accelrt.memory.AllocatorConfig.short_label`); ``sources`` says
    where each setting came from (``Setting.source``: ``--config``, ``environment VAR``,
    ``recorded``...). The trace's ``name`` is shown escaped (:func:`accelrt._text.printable`)."""
    from rich.table import Table
    from rich.text import Text

    first = reports[0]
    console = _console()
    view = (
        "all events" if first.include_host else f"device view, {skipped_host} host events skipped"
    )
    from ..trace._recording import UNLIMITED_CAPACITY

    capacity = (
        "unlimited"
        if first.capacity_bytes >= UNLIMITED_CAPACITY
        else format_bytes(first.capacity_bytes)
    )
    console.print(
        Text.assemble(
            (printable(name), "bold"),
            f" on {first.device} ({capacity}): {first.events} events ({view}); trace peak live "
            f"{first.trace_peak_live_bytes} bytes ({format_bytes(first.trace_peak_live_bytes)})",
        ),
        soft_wrap=True,
    )
    banner = _midrun_banner(reports)
    if banner:
        console.print(banner, soft_wrap=True)
    table = Table()
    table.add_column("", style="bold")
    for config in configs:
        table.add_column(config.short_label, justify="right", overflow="fold")
    rows: list[tuple[str, Callable[[ReplayReport], str]]] = [
        ("peak requested", lambda r: format_bytes(r.peak_requested_bytes)),
        ("peak allocated", lambda r: format_bytes(r.peak_allocated_bytes)),
        ("peak reserved", lambda r: format_bytes(r.peak_reserved_bytes)),
        ("fragmentation", lambda r: f"{r.fragmentation:.4f}"),
        ("live floor", lambda r: _bytes_or_dash(r.floor_live_bytes)),  # accelrt._bounds
        ("rounded floor", lambda r: _bytes_or_dash(r.floor_rounded_bytes)),
        ("offline plan", lambda r: _bytes_or_dash(r.plan_peak_bytes)),
        ("device mallocs", lambda r: str(r.num_device_alloc)),
        ("device frees", lambda r: str(r.num_device_free)),
        ("alloc retries", lambda r: str(r.num_alloc_retries)),
        ("OOMs", lambda r: str(r.num_ooms)),
        ("wall seconds", lambda r: f"{r.wall_seconds:.3f}"),
        ("events/second", lambda r: f"{r.events_per_second:,.0f}"),
    ]
    if any(r.start_state != "empty" for r in reports):  # a recording begun mid-run
        rows.insert(3, ("start-state range", _start_range))
    for label, cell in rows:
        table.add_row(label, *(cell(r) for r in reports))
    table.add_row("setting from", *sources)
    console.print(table)
    shortened = {c.short_label: c.describe() for c in configs}
    if any(short != full for short, full in shortened.items()):
        console.print("Column heads in full:", soft_wrap=True)
        for short, full in shortened.items():
            if short != full:
                console.print(f"  {short} = {full}", soft_wrap=True)
    for r in reports:
        match = "equals" if r.peak_requested_bytes == r.trace_peak_live_bytes else "differs from"
        console.print(
            f"[{r.config}] peak requested {r.peak_requested_bytes} bytes "
            f"{match} the trace's peak live {r.trace_peak_live_bytes} bytes; peak reserved "
            f"{r.peak_reserved_bytes} bytes",
            soft_wrap=True,  # one line in a pipe or a CI log: never broken mid-sentence
        )
        for oom in r.ooms[:5]:
            console.print(
                f"  OOM at event {oom.event}: {oom.requested_bytes} bytes on stream {oom.stream}"
                f" with {format_bytes(oom.reserved_bytes)} reserved",
                soft_wrap=True,
            )
        if len(r.ooms) > 5:
            console.print(f"  ... and {len(r.ooms) - 5} more OOMs", soft_wrap=True)
        if r.recorded_peak_reserved_bytes is not None:
            # a modelled start is a what-if: its difference is the setting's, not an error
            what = "this setting (a what-if)" if r.start_state == "modelled" else "accelrt"
            change = "change" if r.start_state == "modelled" else "difference"
            relative = r.peak_reserved_difference  # None where PyTorch reserved nothing
            shown = "undefined (PyTorch recorded no reserved memory)"
            if relative is not None:
                shown = f"{relative:+.3%}"
            console.print(
                f"  PyTorch recorded: peak reserved {r.recorded_peak_reserved_bytes} bytes "
                f"({format_bytes(r.recorded_peak_reserved_bytes)}), "
                f"{r.recorded_num_device_alloc} device mallocs; {what}: "
                f"{r.peak_reserved_bytes} bytes, {r.num_device_alloc} device mallocs; "
                f"{change} {shown}",
                soft_wrap=True,
            )
        for note in r.notes:
            console.print(f"  note: {note}", soft_wrap=True)
    from .._verdict import fragmentation_summary

    summary = fragmentation_summary(reports)
    if summary is not None:
        console.print(summary, soft_wrap=True)


def _print_totals(
    name: str,
    traces: Sequence[Trace],
    settings: Sequence[Setting],
    runs: Sequence[Sequence[ReplayReport]],
) -> None:
    """Print the peaks of every recorded device, a row each and their total, a column pair
    (peak requested, peak reserved) per setting; then each total in bytes. Names are shown
    escaped (:func:`accelrt._text.printable`)."""
    from rich.table import Table
    from rich.text import Text

    from ..memory._config import setting_text

    console = _console()
    console.print(
        Text.assemble((printable(name), "bold"), f": {len(traces)} recorded devices"),
        soft_wrap=True,
    )
    table = Table()
    table.add_column("device", style="bold")
    for setting in settings:
        head = setting.short_label
        table.add_column(f"{head}\npeak requested", justify="right", overflow="fold")
        table.add_column(f"{head}\npeak reserved", justify="right", overflow="fold")
    for trace, reports in zip(traces, runs, strict=True):
        cells = [(r.peak_requested_bytes, r.peak_reserved_bytes) for r in reports]
        table.add_row(printable(trace.name), *(format_bytes(x) for pair in cells for x in pair))
    totals = _totals(settings, runs)
    pairs = [(t["peak_requested_bytes"], t["peak_reserved_bytes"]) for t in totals]
    table.add_row("total", *(format_bytes(x) for pair in pairs for x in pair), style="bold")
    console.print(table)
    for total in totals:
        shown = setting_text(total["config"], total["config_source"])
        requested, reserved = total["peak_requested_bytes"], total["peak_reserved_bytes"]
        recorded = total["recorded_peak_reserved_bytes"]
        console.print(
            f"[{shown}] total of {total['devices']} devices: peak requested {requested} bytes, "
            f"peak reserved {reserved} bytes"
            + ("" if recorded is None else f"; PyTorch recorded {recorded} bytes"),
            soft_wrap=True,
        )
