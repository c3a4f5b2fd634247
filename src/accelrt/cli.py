"""The ``accelrt`` command: ``info``, ``replay`` and ``snapshot summary|segments|view``."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from typing import Any

from ._units import format_bytes

__all__ = ["main"]


def _info_data() -> dict[str, Any]:
    from . import _runtime
    from .backends import available_backends, get_backend, registered_backends

    accelerator = None
    try:
        backend = _runtime.accelerator()
        accelerator = backend.name if backend is not None else None
    except ValueError as exc:
        accelerator = f"error: {exc}"
    data: dict[str, Any] = {
        "accelerator": accelerator,
        "registered_backends": registered_backends(),
        "available_backends": available_backends(),
        "devices": [],
    }
    for name in data["available_backends"]:
        if name == "sim" and accelerator != "sim":
            continue  # the simulated device is listed only when chosen
        backend = get_backend(name)
        for index in range(backend.device_count()):
            props = backend.get_device_properties(index)
            free = backend.mem_get_info(index)[0]
            data["devices"].append(
                {
                    "device": f"{name}:{index}",
                    "name": props.name,
                    "vendor": props.vendor,
                    "total_memory_bytes": props.total_memory,
                    "free_memory_bytes": free,
                    "max_allocation_bytes": props.max_allocation_bytes,
                    "compute_units": props.multi_processor_count,
                    "driver_version": props.driver_version,
                    "host_accessible": props.host_accessible,
                }
            )
    return data


def _cmd_info(args: argparse.Namespace) -> int:
    data = _info_data()
    if args.json:
        print(json.dumps(data, indent=2))
        return 0
    from rich.console import Console
    from rich.table import Table

    console = Console()
    console.print(f"accelerator: [bold]{data['accelerator'] or 'none'}[/bold]")
    console.print(
        f"backends: {', '.join(data['registered_backends'])} "
        f"(available: {', '.join(data['available_backends']) or 'none'})"
    )
    for dev in data["devices"]:
        table = Table(title=dev["device"], show_header=False)
        table.add_column("property", style="bold")
        table.add_column("value")
        table.add_row("name", dev["name"])
        table.add_row("vendor", dev["vendor"])
        table.add_row("total memory", format_bytes(dev["total_memory_bytes"]))
        table.add_row("free memory", format_bytes(dev["free_memory_bytes"]))
        table.add_row("max allocation", format_bytes(dev["max_allocation_bytes"]))
        table.add_row("compute units", str(dev["compute_units"]))
        table.add_row("driver", dev["driver_version"])
        table.add_row("host accessible", str(dev["host_accessible"]))
        console.print(table)
    if not data["devices"]:
        console.print("no devices")
    return 0


def _default_device() -> str:
    from . import _runtime

    backend = _runtime.accelerator()
    return f"{backend.name}:0" if backend is not None and backend.device_count() else "sim"


def _cmd_replay(args: argparse.Namespace) -> int:
    from .replay import ReplayReport, replay
    from .trace import load
    from .view import picture_moments

    trace = load(args.trace, include_host=args.include_host, device_index=args.device_index)
    # a PyTorch recording replays on the simulated device with its recorded settings
    device = args.device or ("sim" if trace.recording is not None else _default_device())
    configs: list[str | None] = list(args.config or [None if trace.recording else ""])
    reports: list[ReplayReport] = []
    show_progress = not args.json and not args.no_progress and sys.stderr.isatty()
    pictures = bool(getattr(args, "html", None) or getattr(args, "png", None))
    for config in configs:
        # the first setting's replay also captures what the pictures draw
        capture = picture_moments(trace) if pictures and not reports else ()
        if show_progress and len(trace.events) > 50_000:
            from rich.progress import Progress

            with Progress(transient=True) as bar:
                task = bar.add_task(f"replaying {trace.name}", total=len(trace.events))

                def advance(done: int, _total: int, task: Any = task) -> None:
                    bar.update(task, completed=done)

                reports.append(
                    replay(
                        trace,
                        device=device,
                        capacity=args.capacity,
                        config=config,
                        progress=advance,
                        capture_at=capture,
                    )
                )
        else:
            reports.append(
                replay(
                    trace, device=device, capacity=args.capacity, config=config, capture_at=capture
                )
            )
    if pictures:
        _write_pictures(args, trace, reports[0])
    if args.json:
        out = [r.to_dict() for r in reports]
        print(json.dumps(out[0] if len(out) == 1 else out, indent=2))
        return 0
    _print_reports(trace.name, trace.skipped_host_events, reports)
    return 0


def _write_pictures(args: argparse.Namespace, trace: Any, report: Any) -> None:
    from .view import render_html, render_png, view_of_trace

    view = view_of_trace(trace, report)
    if args.html:
        with open(args.html, "w", encoding="utf-8") as f:
            f.write(render_html(view))
    if args.png:
        render_png(view, args.png)


def _print_reports(name: str, skipped_host: int, reports: Sequence[Any]) -> None:
    from rich.console import Console
    from rich.table import Table

    first = reports[0]
    console = Console()
    view = (
        "all events" if first.include_host else f"device view, {skipped_host} host events skipped"
    )
    from .replay import UNLIMITED_CAPACITY

    capacity = (
        "unlimited"
        if first.capacity_bytes >= UNLIMITED_CAPACITY
        else format_bytes(first.capacity_bytes)
    )
    console.print(
        f"[bold]{name}[/bold] on {first.device} ({capacity}): "
        f"{first.events} events ({view}); trace peak live {first.trace_peak_live_bytes} bytes "
        f"({format_bytes(first.trace_peak_live_bytes)})"
    )
    table = Table()
    table.add_column("", style="bold")
    for r in reports:
        table.add_column(r.config, justify="right", overflow="fold")
    rows: list[tuple[str, Any]] = [
        ("peak requested", lambda r: format_bytes(r.peak_requested_bytes)),
        ("peak allocated", lambda r: format_bytes(r.peak_allocated_bytes)),
        ("peak reserved", lambda r: format_bytes(r.peak_reserved_bytes)),
        ("fragmentation", lambda r: f"{r.fragmentation:.4f}"),
        ("device mallocs", lambda r: str(r.num_device_alloc)),
        ("device frees", lambda r: str(r.num_device_free)),
        ("alloc retries", lambda r: str(r.num_alloc_retries)),
        ("OOMs", lambda r: str(r.num_ooms)),
        ("wall seconds", lambda r: f"{r.wall_seconds:.3f}"),
        ("events/second", lambda r: f"{r.events_per_second:,.0f}"),
    ]
    for label, cell in rows:
        table.add_row(label, *(cell(r) for r in reports))
    console.print(table)
    for r in reports:
        match = "equals" if r.peak_requested_bytes == r.trace_peak_live_bytes else "differs from"
        console.print(
            f"[{r.config}] peak requested {r.peak_requested_bytes} bytes {match} the trace's "
            f"peak live {r.trace_peak_live_bytes} bytes; peak reserved {r.peak_reserved_bytes} "
            "bytes"
        )
        for oom in r.ooms[:5]:
            console.print(
                f"  OOM at event {oom.event}: {oom.requested_bytes} bytes on stream {oom.stream}"
                f" with {format_bytes(oom.reserved_bytes)} reserved"
            )
        if len(r.ooms) > 5:
            console.print(f"  ... and {len(r.ooms) - 5} more OOMs")
        if r.recorded_peak_reserved_bytes is not None:
            console.print(
                f"  PyTorch recorded: peak reserved {r.recorded_peak_reserved_bytes} bytes "
                f"({format_bytes(r.recorded_peak_reserved_bytes)}), "
                f"{r.recorded_num_device_alloc} device mallocs; accelrt: "
                f"{r.peak_reserved_bytes} bytes, {r.num_device_alloc} device mallocs; "
                f"difference {r.peak_reserved_difference:+.3%}"
            )
        for note in r.notes:
            console.print(f"  note: {note}")


def build_parser() -> argparse.ArgumentParser:
    """Return the argument parser of the ``accelrt`` command."""
    parser = argparse.ArgumentParser(
        prog="accelrt",
        description="accelrt: a device-agnostic accelerator runtime with a caching allocator.",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    info = sub.add_parser("info", help="show backends, devices, properties and memory")
    info.add_argument("--json", action="store_true", help="print one JSON object")
    info.set_defaults(func=_cmd_info)
    rep = sub.add_parser("replay", help="replay an allocation trace through the caching allocator")
    rep.add_argument("trace", help="an accelrt trace (.jsonl.gz) or a PyTorch snapshot pickle")
    rep.add_argument(
        "--device",
        help="'sim' (simulated), or a real device such as 'opencl:0' (default: the accelerator's "
        "device 0, else sim)",
    )
    rep.add_argument("--capacity", help="simulated device memory, e.g. 80GiB (sim only)")
    rep.add_argument(
        "--config",
        action="append",
        help="allocator settings in ACCELRT_ALLOC_CONF syntax, e.g. max_split_size_mb:128; "
        "repeat to compare settings",
    )
    rep.add_argument(
        "--include-host", action="store_true", help="also replay events tagged host (CPU-only)"
    )
    rep.add_argument("--json", action="store_true", help="print the report as JSON")
    rep.add_argument("--no-progress", action="store_true", help="never show a progress bar")
    rep.add_argument(
        "--device-index",
        type=int,
        help="snapshots: the recorded device to replay (default: the only one with events)",
    )
    rep.add_argument("--html", help="also write the memory picture as a self-contained HTML file")
    rep.add_argument("--png", help="also write active memory over time as a PNG (matplotlib)")
    rep.set_defaults(func=_cmd_replay)

    snap = sub.add_parser("snapshot", help="look into a memory snapshot pickle (PyTorch's or ours)")
    snap_sub = snap.add_subparsers(dest="snapshot_command", required=True)
    for name, func, text in (
        ("summary", _cmd_snapshot_summary, "the memory_summary table of the recorded run"),
        ("segments", _cmd_snapshot_segments, "a text map of the segments at the end"),
        ("view", _cmd_snapshot_view, "write the memory picture (HTML, and PNG with --png)"),
    ):
        cmd = snap_sub.add_parser(name, help=text)
        cmd.add_argument("file", help="a snapshot pickle (read as plain data; nothing in it runs)")
        cmd.add_argument("--device-index", type=int, help="the recorded device (default: 0)")
        if name == "view":
            cmd.add_argument("-o", "--output", required=True, help="the HTML file to write")
            cmd.add_argument("--png", help="also write a PNG (matplotlib)")
        cmd.set_defaults(func=func)
    return parser


def _cmd_snapshot_summary(args: argparse.Namespace) -> int:
    from .memory._summary import format_summary
    from .replay import replay
    from .trace._snapshot import read_snapshot, trace_from_snapshot

    snapshot = read_snapshot(args.file)
    trace = trace_from_snapshot(snapshot, device=args.device_index, path=args.file)
    report = replay(trace)
    device = trace.recording.device if trace.recording is not None else 0
    name = f"{trace.name} (recorded device {device})"
    print(format_summary(report.memory_stats, name), end="")
    print(
        "Figures from replaying the recorded history from its rewound start state; PyTorch "
        f"recorded a peak reserved of {report.recorded_peak_reserved_bytes} bytes "
        f"(replay: {report.peak_reserved_bytes})."
    )
    return 0


def _cmd_snapshot_segments(args: argparse.Namespace) -> int:
    from .trace._snapshot import read_snapshot
    from .view import segment_text

    snapshot = read_snapshot(args.file)
    device = args.device_index or 0
    print(segment_text([s for s in snapshot["segments"] if s.get("device", 0) == device]))
    return 0


def _cmd_snapshot_view(args: argparse.Namespace) -> int:
    from .view import render_html, render_png, view_of_snapshot

    view = view_of_snapshot(args.file, device_index=args.device_index)
    with open(args.output, "w", encoding="utf-8") as f:
        f.write(render_html(view))
    if args.png:
        render_png(view, args.png)
    print(f"wrote {args.output}" + (f" and {args.png}" if args.png else ""))
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``accelrt`` command; return its exit status.

    Errors in the input (a missing or malformed trace, a bad setting) print one line to stderr
    and return 2.
    """
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        result: int = args.func(args)
    except (ValueError, TypeError, FileNotFoundError, RuntimeError) as exc:
        print(f"accelrt {args.command}: error: {exc}", file=sys.stderr)
        return 2
    return result


if __name__ == "__main__":
    sys.exit(main())
