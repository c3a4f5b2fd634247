"""The command's outputs of a sweep: the rich tables and the winner, CSV, Parquet, a PNG of
the peaks and JSON."""

from __future__ import annotations

import csv
import json
from typing import TYPE_CHECKING

from .._text import printable
from .._units import format_bytes
from ..memory._config import setting_text
from ..replay import ReplayReport
from ..trace._recording import UNLIMITED_CAPACITY
from ._model import SweepResult, SweepResults

if TYPE_CHECKING:
    from rich.console import Console


def _capacity_text(capacity: int | None) -> str:
    if capacity is None:
        return "default"
    if capacity >= UNLIMITED_CAPACITY:
        return "unlimited"
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20)):
        if capacity % size == 0:
            return f"{capacity // size} {unit}"
    return format_bytes(capacity)


def _start_text(report: ReplayReport | None) -> str:
    """The sweep table's start-state cell: "exact", "recorded", or "modelled LOW-HIGH"."""
    if report is None or report.start_state == "empty":
        return "exact" if report is not None else ""
    low, high = report.peak_reserved_low_bytes, report.peak_reserved_high_bytes
    if low is None or high is None:
        return "recorded"
    return f"modelled {format_bytes(low)}-{format_bytes(high)}"


def print_results(results: SweepResults, console: Console) -> None:
    """Print the per-trace table, the fleet summary and the winner with rich.

    Parameters
    ----------
    results : SweepResults
    console : rich.console.Console
    """
    from rich.markup import escape
    from rich.table import Table

    caps = results.capacities
    table = Table(title=f"accelrt sweep on {results.scheduler} (* best per trace)")
    table.add_column("trace / setting", overflow="fold", min_width=24)
    if caps != [None]:
        table.add_column("capacity", justify="right", no_wrap=True)
    for name in ("peak reserved", "frag.", "plan", "mallocs", "OOMs"):
        table.add_column(name, justify="right", no_wrap=True)
    if results.find_capacity:
        table.add_column("needs", justify="right", no_wrap=True)
    midrun = any(r.report is not None and r.report.start_state != "empty" for r in results)
    if midrun:  # a recording that began mid-run: how each setting's start state was built
        table.add_column("start state", justify="right", no_wrap=True)
    width = len(table.columns)
    errors = []
    for trace, device in results.units():  # a snapshot's recorded devices one by one
        best = results.best(trace, device)
        mine = [r for r in results if (r.trace, r.recorded_device) == (trace, device)]
        table.add_row(f"[bold]{escape(printable(mine[0].name))}[/bold]", *[""] * (width - 1))
        for i, r in enumerate(mine):
            cells = [escape(f"  {setting_text(r.config, r.config_source)}")]
            cells[0] += " *" if r is best else ""
            if caps != [None]:
                cells.append(_capacity_text(r.capacity))
            if r.report is None:
                cells += ["error", "", "", "", ""]
                errors.append(r.error or "")
            else:
                plan = r.report.plan_peak_bytes  # what an offline plan needs (accelrt._bounds)
                cells += [
                    format_bytes(r.report.peak_reserved_bytes),
                    f"{r.report.fragmentation:.4f}",
                    "-" if plan is None else format_bytes(plan),
                    str(r.report.num_device_alloc),
                    str(r.report.num_ooms),
                ]
            if results.find_capacity:
                cells.append(
                    format_bytes(r.min_capacity_bytes)
                    if r.min_capacity_bytes is not None
                    else ("never" if r.report is not None else "")
                )
            if midrun:
                cells.append(_start_text(r.report))
            table.add_row(*cells, end_section=i == len(mine) - 1)
    console.print(table)
    if midrun:
        console.print(
            "start state: recordings that began mid-run are exact under their recorded setting; "
            "under others their start is modelled, with the range of peaks the unrecorded part "
            "allows (docs/snapshot-replay.md)",
            markup=False,
            highlight=False,
        )
    for error in dict.fromkeys(errors):
        console.print(f"error: {printable(error)}", markup=False, highlight=False)

    summary = results.summary()
    units, files = len(results.units()), len(results.traces)
    plural = "s" if files > 1 else ""
    counted = f" ({files} file{plural}: each recorded device counts)" if units != files else ""
    fleet = Table(title=f"fleet summary: {units} traces{counted}, best first")
    sources = {r.config: r.config_source for r in results}
    fleet.add_column("#", justify="right", no_wrap=True)
    fleet.add_column("setting", overflow="fold", min_width=24)
    for name in ("traces", "total peak", "mallocs"):
        fleet.add_column(name, justify="right", no_wrap=True)
    for cap, _ in summary[0].fits if summary else ():
        fleet.add_column(f"fit {_capacity_text(cap)}", justify="right", no_wrap=True)
    if results.find_capacity:
        fleet.add_column("total needed", justify="right", no_wrap=True)
        fleet.add_column("max needed", justify="right", no_wrap=True)
    for s in summary:
        only = " (accelrt only)" if s.accelrt_only else ""
        cells = [
            str(s.rank),
            escape(setting_text(s.config, sources[s.config]) + only),
            str(s.traces),
            format_bytes(s.total_peak_reserved_bytes),
            str(s.total_device_mallocs),
        ]
        cells += [
            f"{n}/{sum(1 for r in results if r.config == s.config and r.capacity == cap)}"
            for cap, n in s.fits
        ]
        if results.find_capacity:
            cells += [
                format_bytes(s.total_min_capacity_bytes or 0),
                format_bytes(s.max_min_capacity_bytes or 0),
            ]
        fleet.add_row(*cells)
    console.print(fleet)
    win = results.winner()
    if win is None:
        console.print("no setting replayed any trace")
        return
    value = win.env_value
    accelrt_won = win.accelrt_only
    if accelrt_won:
        console.print(
            f"winner: {win.config} (accelrt only: PyTorch's allocator has no such policy)",
            markup=False,
            highlight=False,
        )
        console.print(f"export ACCELRT_ALLOC_CONF={value}", markup=False, highlight=False)
        win = results.winner(pytorch=True)
        if win is None:
            return
        value = win.env_value
        console.print(f"best PyTorch can use: {win.config}", markup=False, highlight=False)
    else:
        console.print(f"winner: {win.config}", markup=False, highlight=False)
    if value:
        console.print(
            f"export PYTORCH_CUDA_ALLOC_CONF={value}   # or ACCELRT_ALLOC_CONF={value}",
            markup=False,
            highlight=False,
        )
        if "per_process_memory_fraction" in value:
            console.print(
                "note: PyTorch takes the memory fraction from "
                "torch.cuda.set_per_process_memory_fraction, not from PYTORCH_CUDA_ALLOC_CONF"
            )
    elif accelrt_won:  # the best PyTorch can use, after an accelrt-only winner
        console.print("for PyTorch, leave PYTORCH_CUDA_ALLOC_CONF unset: the defaults")
    else:
        console.print("leave PYTORCH_CUDA_ALLOC_CONF (and ACCELRT_ALLOC_CONF) unset: the defaults")


def write_csv(results: SweepResults, path: str) -> None:
    """Write one CSV row per combination (:meth:`SweepResult.to_record`).

    Raises
    ------
    OSError
        If the file cannot be written.
    """
    columns = list(SweepResult("", "", None).to_record())
    with open(path, "w", newline="", encoding="utf-8") as f:
        writer = csv.DictWriter(f, fieldnames=columns)
        writer.writeheader()
        writer.writerows(results.to_records())


def write_parquet(results: SweepResults, path: str) -> None:
    """Write one Parquet row per combination (needs pyarrow).

    Raises
    ------
    ImportError
        If pyarrow is not installed.
    OSError
        If the file cannot be written.
    """
    import pyarrow.parquet as pq

    pq.write_table(results.to_arrow(), path)


def render_png(results: SweepResults, path: str) -> None:
    """Draw peak reserved bytes per setting per trace (grouped bars) into ``path``.

    Raises
    ------
    ImportError
        If matplotlib is not installed.
    OSError
        If the file cannot be written.
    """
    from matplotlib.figure import Figure

    rows = results._first_capacity_rows()
    configs = list(dict.fromkeys(r.config for r in rows))
    by_unit = {(r.trace, r.recorded_device, r.config): r for r in reversed(rows)}  # first wins
    units = results.units()  # a snapshot's recorded devices one by one
    names = {(r.trace, r.recorded_device): r.name for r in rows}
    width = 0.8 / max(1, len(configs))
    fig = Figure(figsize=(max(6.0, 0.6 * len(units) * max(1, len(configs)) ** 0.5 + 3), 5))
    ax = fig.add_subplot()
    for j, config in enumerate(configs):
        values = []
        for trace, device in units:
            row = by_unit.get((trace, device, config))
            peak = row.peak_reserved_bytes if row is not None else None
            values.append((peak or 0) / 2**30)
        xs = [i + (j - (len(configs) - 1) / 2) * width for i in range(len(units))]
        ax.bar(xs, values, width, label=config)
    ax.set_xticks(range(len(units)))
    ax.set_xticklabels([names.get(u, u[0]) for u in units], rotation=60, ha="right", fontsize=7)
    ax.set_ylabel("peak reserved (GiB)")
    ax.set_title("accelrt sweep: peak reserved per setting")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path)


def dumps_json(results: SweepResults) -> str:
    """Return :meth:`SweepResults.to_json` as indented JSON text."""
    return json.dumps(results.to_json(), indent=2)
