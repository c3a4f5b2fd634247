"""``accelrt snapshot summary|segments|view|diff``: a recorded run's summary table, segment
map, pictures, and the comparison of two runs."""

from __future__ import annotations

import argparse
import os
import shutil
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING

from .._errors import InputError
from .._text import printable, shown
from .._units import format_bytes
from ._args import (
    _DEVICE_INDEX_HELP,
    SubParsers,
    _add_category_option,
    _check_png,
    _config_arg,
    _index_arg,
    _input_file,
    _not_the_input,
    _note_ignored,
    _output_arg,
    _settings,
    _show_progress,
)
from ._output import _view, _write_views
from ._runs import (
    _check_device_index,
    _read_snapshot_file,
    _recorded_device,
    _replay_shown,
    _snapshot_traces,
    _totals,
)

if TYPE_CHECKING:
    from ..memory._config import Setting
    from ..replay import ReplayReport
    from ..trace import Trace
    from ..trace._snapshot_schema import FileSnapshot
    from ..view import View
    from ..view._categories import CategoryRule


def _cmd_snapshot_summary(args: argparse.Namespace) -> int:
    from ..memory.history._summary import format_summary
    from ..replay import replay
    from ..trace._snapshot import devices_with_history
    from ..view import forensics_text

    checked = _read_snapshot_file(args.file, progress=_show_progress(args))
    snapshot = checked.data
    if not devices_with_history(snapshot):  # the end state only: say what it holds
        _check_device_index(args.file, snapshot, args.device_index)
        text = _end_state_summary(args.file, snapshot, args.device_index)
        print(printable(text, keep_newlines=True), end="")
        return 0
    traces = _snapshot_traces(args.file, checked, args.device_index)
    width = max(60, min(160, shutil.get_terminal_size().columns))
    reports = []
    for n, trace in enumerate(traces):
        report = replay(trace, capture_at=[len(trace.events) - 1])
        reports.append(report)
        name = f"{trace.name} (recorded device {_recorded_device(trace)})"
        summary = format_summary(report.memory_stats, name)
        print(("\n" if n else "") + printable(summary, keep_newlines=True), end="")
        print(
            "Figures from replaying the recorded history from its rewound start state under "
            f"its recorded settings ({report.config}); PyTorch recorded a peak reserved of "
            f"{report.recorded_peak_reserved_bytes} bytes (replay: {report.peak_reserved_bytes})."
        )
        print()
        view = _view(snapshot, trace, report, args.category)
        print(printable(forensics_text(view, width=width), keep_newlines=True), end="")
    if len(traces) > 1:
        from ..memory._config import RECORDED, Setting

        [total] = _totals([Setting(None, RECORDED)], [[r] for r in reports])
        print(
            f"\nTotal of {total['devices']} recorded devices: peak requested "
            f"{total['peak_requested_bytes']} bytes, peak reserved {total['peak_reserved_bytes']}"
            f" bytes (PyTorch recorded {total['recorded_peak_reserved_bytes']} bytes)."
        )
    return 0


def _end_state_summary(path: str, snapshot: FileSnapshot, device_index: int | None) -> str:
    """What ``snapshot summary`` prints for a snapshot without allocation history: per device
    with segments (or the one ``--device-index`` names), the end state it holds."""
    from ..trace._snapshot import device_segments, snapshot_devices, snapshot_name
    from ..view import end_state_text, end_state_view

    if device_index is not None:
        devices = [device_index]
    else:
        devices = snapshot_devices(snapshot, in_use=True) or [0]
    width = max(60, min(160, shutil.get_terminal_size().columns))
    parts = []
    for device in devices:
        view = end_state_view(device_segments(snapshot, device), snapshot_name(path))
        text = end_state_text(view, width=width)
        parts.append(f"{view.title} (recorded device {device})\n{text}")
    return "\n".join(parts)


def _diff_side(path: str, device_index: int | None) -> tuple[FileSnapshot | None, list[Trace]]:
    """One side of a diff: the snapshot it read (None for a JSONL trace) and its traces."""
    from ..trace._format import sniff
    from ..trace._load import load_sniffed

    _input_file(path, "a snapshot pickle or an accelrt trace (.jsonl.gz)")
    kind = sniff(path)
    if kind != "pickle":
        return None, [load_sniffed(path, kind)]
    checked = _read_snapshot_file(path)
    return checked.data, _snapshot_traces(path, checked, device_index)


def _diff_run(
    path: str,
    snapshot: FileSnapshot | None,
    trace: Trace,
    setting: Setting,
    several: bool,
    rules: Sequence[CategoryRule],
) -> tuple[str, View, ReplayReport]:
    """A label, the picture and the replay of one device of one side of a diff."""
    from ..replay import replay

    report = replay(trace, config=setting.config, capture_at=[len(trace.events) - 1])
    view = _view(snapshot, trace, report, rules)
    device = f" device {_recorded_device(trace)}" if several else ""
    return f"{os.path.basename(path)}{device}, setting from {setting.source}", view, report


def _cmd_snapshot_diff(args: argparse.Namespace) -> int:
    from ..trace._snapshot import devices_text
    from ..view import diff_text

    files: list[str] = args.files
    given: list[Setting] = args.config or []
    if len(files) > 2:
        raise InputError(f"snapshot diff compares two runs, got {len(files)} files; give A B")
    if len(files) == 1:
        if len(given) != 2:
            raise InputError(
                "snapshot diff with one file compares it under two settings: give --config "
                "twice (e.g. --config defaults --config expandable_segments:True), or give two "
                "files"
            )
        files = [files[0], files[0]]
    if len(given) > 2:
        raise InputError(f"--config given {len(given)} times; give it once for A and once for B")
    sides = [_diff_side(files[0], args.device_index)]
    # one file under two settings: read once (the replays do not change its traces)
    sides.append(sides[0] if files[1] == files[0] else _diff_side(files[1], args.device_index))
    (snap_a, traces_a), (snap_b, traces_b) = sides
    devices = [[_recorded_device(t) for t in traces] for _, traces in sides]
    if len(traces_a) + len(traces_b) > 2 and devices[0] != devices[1]:
        shown = [devices_text([d for d in ds if d is not None]) for ds in devices]
        raise InputError(
            f"{files[0]} has allocation history on devices {shown[0]} and {files[1]} on "
            f"{shown[1]}: compare one device of each with --device-index N"
        )
    # --config once: both sides; twice: A, then B; not at all: each side's own (_settings)
    settings = [
        given[min(n, len(given) - 1)]
        if given
        else _settings(None, recording=traces[0].recording is not None)[0]
        for n, (_, traces) in enumerate(sides)
    ]
    _note_ignored(settings)
    several = len(traces_a) > 1
    width = max(60, min(160, shutil.get_terminal_size().columns))
    peaks = []
    for n, (trace_a, trace_b) in enumerate(zip(traces_a, traces_b, strict=True)):
        a = _diff_run(files[0], snap_a, trace_a, settings[0], several, args.category)
        b = _diff_run(files[1], snap_b, trace_b, settings[1], several, args.category)
        text = printable(diff_text(a, b, width=width), keep_newlines=True)
        print(("\n" if n else "") + text, end="")
        for side, (_, _, report) in zip("AB", (a, b), strict=True):
            if report.start_state != "empty":  # a recording begun mid-run: how it started
                print(f"{side} start state: {report.describe_start()}")
        peaks.append((a[2].peak_reserved_bytes, b[2].peak_reserved_bytes))
    if several:
        total_a, total_b = (sum(p) for p in zip(*peaks, strict=True))
        print(
            f"\nTotal of {len(peaks)} recorded devices: peak reserved (replay) A {total_a} bytes "
            f"({format_bytes(total_a)}), B {total_b} bytes ({format_bytes(total_b)}), B - A "
            f"{total_b - total_a:+} bytes"
        )
    return 0


def _cmd_snapshot_segments(args: argparse.Namespace) -> int:
    from ..trace._snapshot import device_segments, snapshot_devices
    from ..view import segment_text

    snapshot = _read_snapshot_file(args.file, progress=_show_progress(args)).data
    _check_device_index(args.file, snapshot, args.device_index, history=False)
    if args.device_index is not None:
        devices = [args.device_index]
    else:  # every device with segments or history (device 0 of an empty snapshot)
        in_use = snapshot_devices(snapshot, in_use=True)
        devices = in_use or [0]
    mine = [device_segments(snapshot, d) for d in devices]
    if len(devices) == 1:
        print(segment_text(mine[0]))
        return 0
    parts = [f"recorded device {d}:\n{segment_text(s)}" for d, s in zip(devices, mine, strict=True)]
    total = segment_text([s for segments in mine for s in segments]).splitlines()[-1]
    print("\n\n".join([*parts, f"total of {len(devices)} recorded devices: {total}"]))
    return 0


def _cmd_snapshot_view(args: argparse.Namespace) -> int:
    from ..trace._snapshot import devices_with_history, snapshot_devices, snapshot_name
    from ..view import SnapshotPicture, add_categories

    show_progress = _show_progress(args)
    # a clear message for what is not a snapshot
    checked = _read_snapshot_file(args.file, progress=show_progress)  # read and checked once
    _check_device_index(args.file, checked.data, args.device_index)
    for output in (args.output, args.png):
        _not_the_input(output, args.file)
    _check_png(args.png)
    # every device with history, else (the end state) every one with segments
    in_use = snapshot_devices(checked.data, in_use=True)
    recorded = devices_with_history(checked.data) or in_use
    devices = [args.device_index] if args.device_index is not None else recorded or [0]
    # what each picture shows first, so that the snapshot's entries go before the replays
    pictures = [SnapshotPicture.take(args.file, checked, device) for device in devices]
    del checked
    views = []
    for device, picture in zip(devices, pictures, strict=True):
        report = None
        if picture.trace is not None:
            capture = picture.capture_at()
            report = _replay_shown(picture.trace, show_progress, capture_at=capture)
        view = picture.draw(report)
        if view.history:  # kinds of memory, where there are events to read them from
            add_categories(view, args.category)
        if len(recorded) > 1:  # the page says which device it shows
            view.title = snapshot_name(args.file, device)
        views.append(view)
    title = snapshot_name(args.file)
    _write_views(views, devices, args.output, args.png, title=title, stream=sys.stdout)
    return 0


def _moment_arg(text: str) -> int | None:
    """``--at``: None for the peak, else an event index."""
    value = text.strip()
    if value == "peak":
        return None
    if not value.isascii() or not value.isdigit() or len(value) > 18:
        raise argparse.ArgumentTypeError(
            f"--at takes 'peak' or an event index (a whole number >= 0), got {shown(text)}"
        )
    return int(value)


def _cmd_snapshot_stacks(args: argparse.Namespace) -> int:
    from ..view import folded_stacks

    _not_the_input(args.output, args.file)
    snapshot, traces = _diff_side(args.file, args.device_index)
    if len(traces) > 1:
        raise InputError(
            f"{args.file} has allocation history on several devices: choose one with "
            "--device-index N"
        )
    view = _view(snapshot, traces[0], None)
    if args.at is None:
        state = view.peak_state
    elif args.at < view.events:
        state = args.at + 1
    else:
        raise InputError(
            f"--at {args.at}: {args.file} has {view.events} events (0 to {view.events - 1})"
        )
    text = folded_stacks(view, state)
    if args.output is None:
        print(printable(text, keep_newlines=True), end="")
    else:
        with open(args.output, "w", encoding="utf-8", errors="backslashreplace") as out:
            out.write(text)
    return 0


def _add_snapshot_parser(sub: SubParsers) -> None:
    """The ``snapshot`` commands' options."""
    snap = sub.add_parser("snapshot", help="look into a memory snapshot pickle (PyTorch's or ours)")
    snap_sub = snap.add_subparsers(
        dest="snapshot_command", required=True, metavar="{summary,segments,view,diff,stacks}"
    )
    for name, func, text in (
        ("summary", _cmd_snapshot_summary, "the memory_summary table of the recorded run"),
        ("segments", _cmd_snapshot_segments, "a text map of the segments at the end"),
        ("view", _cmd_snapshot_view, "write the memory picture (HTML, and PNG with --png)"),
    ):
        cmd = snap_sub.add_parser(name, help=text)
        cmd.add_argument("file", help="a snapshot pickle (read as plain data; nothing in it runs)")
        cmd.add_argument("--device-index", type=_index_arg, help=_DEVICE_INDEX_HELP)
        cmd.add_argument("--no-progress", action="store_true", help="never show a progress bar")
        if name != "segments":
            _add_category_option(cmd)
        if name == "view":
            cmd.add_argument(
                "-o",
                "--output",
                required=True,
                type=_output_arg("--output"),
                help="the HTML file to write",
            )
            cmd.add_argument(
                "--png", type=_output_arg("--png"), help="also write a PNG (matplotlib)"
            )
        cmd.set_defaults(func=func)
    diff = snap_sub.add_parser(
        "diff", help="compare two runs: peaks, and live bytes per stack frame at each peak"
    )
    diff.add_argument(
        "files",
        nargs="+",
        metavar="FILE",
        help="two snapshots or traces (A B), or one replayed under two --config settings",
    )
    diff.add_argument(
        "--config",
        action="append",
        type=_config_arg,
        help="allocator settings for A, then for B ('defaults': the defaults; default: as "
        "replay's)",
    )
    diff.add_argument("--device-index", type=_index_arg, help=_DEVICE_INDEX_HELP)
    _add_category_option(diff)
    diff.set_defaults(func=_cmd_snapshot_diff)
    stacks = snap_sub.add_parser(
        "stacks",
        help="the live bytes at one moment as folded stacks, for flame graphs (flamegraph.pl, "
        "speedscope, inferno)",
    )
    stacks.add_argument("file", help="a snapshot pickle or an accelrt trace (.jsonl.gz)")
    stacks.add_argument(
        "--at",
        default="peak",
        type=_moment_arg,
        help="'peak' (the default), or an event index: what was live just after that event",
    )
    stacks.add_argument("--device-index", type=_index_arg, help=_DEVICE_INDEX_HELP)
    stacks.add_argument(
        "-o", "--output", type=_output_arg("--output"), help="the file to write (default: stdout)"
    )
    stacks.set_defaults(func=_cmd_snapshot_stacks)
