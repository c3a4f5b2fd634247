"""The ``accelrt`` command: ``info``, ``replay`` and ``snapshot summary|segments|view``.

Every error in the input (a missing or malformed file, a bad option) is one line on stderr and
exit status 2; an interrupt (Ctrl-C) is one line and exit status 130.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import os
import re
import sys
from collections.abc import Callable, Sequence
from typing import Any, NoReturn, TypeVar

from ._units import format_bytes, parse_bytes

__all__ = ["main"]

MAX_DEVICE_INDEX = 1023
"""The largest device index the command accepts (``--device TYPE:N``, ``--device-index``).

The simulated backend creates every device up to the one asked for, so an unbounded index
would make ``--device sim:99999999`` build a hundred million devices."""
_DEVICE_RE = re.compile(r"([a-z_][a-z0-9_]*)(?::([0-9]+))?", re.ASCII)
_INDEX_RE = re.compile(r"[0-9]+", re.ASCII)
EXIT_USAGE = 2
EXIT_INTERRUPTED = 130
_T = TypeVar("_T")


class CliError(Exception):
    """An error in the command's input; ``main`` prints its message as one line."""


def _shown(value: str) -> str:
    """``repr(value)``, cut short for messages."""
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _one_line(text: str) -> str:
    return " ".join(text.split())


class _Parser(argparse.ArgumentParser):
    """An argument parser whose usage errors are one line (``prog: error: ...``), status 2."""

    def error(self, message: str) -> NoReturn:
        self.exit(
            EXIT_USAGE, f"{self.prog}: error: {_one_line(message)} (see '{self.prog} --help')\n"
        )


# option types: argparse turns their ArgumentTypeError into "argument --x: message"


def _device_arg(text: str) -> str:
    value = text.strip()
    if not value:
        raise argparse.ArgumentTypeError(
            "the device is empty; give 'sim', 'sim:N' or a backend's device such as 'opencl:0'"
        )
    match = _DEVICE_RE.fullmatch(value)
    if match is None:
        raise argparse.ArgumentTypeError(
            f"invalid device {_shown(text)}: expected TYPE or TYPE:INDEX in ASCII, such as "
            "'sim', 'sim:1' or 'opencl:0'"
        )
    index = match.group(2)
    if index is not None and (len(index) > 6 or int(index) > MAX_DEVICE_INDEX):
        raise argparse.ArgumentTypeError(
            f"device index {_shown(index)} of {match.group(1)!r} is too large: indices run from "
            f"0 to at most {MAX_DEVICE_INDEX} (e.g. '{match.group(1)}:0')"
        )
    return value


def _index_arg(text: str) -> int:
    value = text.strip()
    if value.startswith("-") and _INDEX_RE.fullmatch(value[1:]):
        raise argparse.ArgumentTypeError(f"the device index must be >= 0, got {_shown(text)}")
    if not _INDEX_RE.fullmatch(value):
        raise argparse.ArgumentTypeError(
            f"the device index must be a whole number in ASCII digits, such as 0, got "
            f"{_shown(text)}"
        )
    if len(value) > 6 or int(value) > MAX_DEVICE_INDEX:
        raise argparse.ArgumentTypeError(
            f"the device index {_shown(text)} is too large: at most {MAX_DEVICE_INDEX}"
        )
    return int(value)


def _capacity_arg(text: str) -> int:
    try:
        return parse_bytes(text, name="sim capacity")
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _config_arg(text: str) -> str:
    from .memory._config import AllocatorConfig

    try:
        AllocatorConfig.parse(text)
    except (TypeError, ValueError) as exc:
        raise argparse.ArgumentTypeError(f"{exc} (in {_shown(text)})") from None
    return text


def _output_arg(option: str) -> Callable[[str], str]:
    """A type for an option naming a file to write: refuse what cannot be written, up front."""

    def check(path: str) -> str:
        if not path.strip():
            raise argparse.ArgumentTypeError(f"{option} needs a file name, got {_shown(path)}")
        if os.path.isdir(path):
            raise argparse.ArgumentTypeError(
                f"{path} is a directory; give a file name, e.g. {os.path.join(path, 'memory')}"
            )
        folder = os.path.dirname(os.path.abspath(path))
        if not os.path.isdir(folder):
            raise argparse.ArgumentTypeError(
                f"cannot write {path}: the folder {folder} does not exist; create it first"
            )
        if not os.access(folder, os.W_OK) or (
            os.path.exists(path) and not os.access(path, os.W_OK)
        ):
            raise argparse.ArgumentTypeError(
                f"cannot write {path}: permission denied; choose a writable location"
            )
        return path

    return check


def _input_file(path: str, what: str) -> None:
    """Refuse a path that is not a readable regular file, naming it and what was expected."""
    if not path.strip():
        raise CliError(f"no file given (an empty name); give {what}")
    if os.path.isdir(path):
        raise CliError(f"{path} is a directory; give {what}")
    if not os.path.exists(path):
        raise CliError(f"{path}: No such file or directory; give {what}")
    if not os.path.isfile(path):
        raise CliError(f"{path} is not a regular file (a pipe or a device); save it to a file")
    if not os.access(path, os.R_OK):
        raise CliError(f"{path}: permission denied; make it readable")


def _not_the_input(output: str | None, source: str) -> None:
    if output and os.path.exists(output) and os.path.samefile(output, source):
        raise CliError(f"{output} is the input file; writing it would destroy it")


def _write_text(path: str, text: str) -> None:
    """Write ``text`` to ``path``; on failure remove what was started, if the file is new."""
    existed = os.path.exists(path)
    try:
        with open(path, "w", encoding="utf-8") as f:
            f.write(text)
    except OSError as exc:
        if not existed:
            with contextlib.suppress(OSError):
                os.remove(path)
        raise CliError(f"cannot write {path}: {exc.strerror or exc}") from None


def _write_png(view: Any, path: str) -> None:
    from .view import render_png

    try:
        render_png(view, path)
    except ImportError:
        raise CliError(f"writing {path} needs matplotlib: pip install 'accelrt[view]'") from None
    except OSError as exc:
        raise CliError(f"cannot write {path}: {exc.strerror or exc}") from None
    except ValueError as exc:
        raise CliError(f"cannot write {path}: {exc}") from None


def _check_png(path: str | None) -> None:
    """Refuse ``--png`` up front when matplotlib is missing or cannot write that format."""
    if not path:
        return
    import importlib.util

    if importlib.util.find_spec("matplotlib") is None:
        raise CliError(f"--png {path} needs matplotlib: pip install 'accelrt[view]'")
    suffix = os.path.splitext(path)[1].lower().lstrip(".")
    if suffix:
        from matplotlib.backend_bases import FigureCanvasBase

        formats = FigureCanvasBase.get_supported_filetypes()
        if suffix not in formats:
            raise CliError(
                f"--png {path}: cannot write a {suffix!r} file; use a name ending in .png "
                f"(or one of {', '.join(sorted(formats))})"
            )


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


def _check_device(device: str, capacity: int | None) -> None:
    """Refuse, before any work, a device that does not exist or a capacity it cannot take."""
    from ._device import Device
    from .backends import get_backend

    dev = Device(device)
    if dev.type == "sim":
        return
    if capacity is not None:
        raise CliError(
            f"--capacity applies to the simulated device only; on {dev} cap memory with "
            "--config per_process_memory_fraction:X instead, or use --device sim"
        )
    try:
        backend = get_backend(dev.type)
    except ImportError as exc:
        raise CliError(
            f"--device {dev}: the {dev.type!r} backend cannot be loaded ({exc}); install it, "
            "or use --device sim"
        ) from None
    count = backend.device_count()
    index = dev.index or 0
    if index >= count:
        raise CliError(
            f"--device {dev}: device index {index} is out of range [0, {count}) for "
            f"{dev.type}" + ("; use --device sim" if count == 0 else "")
        )


def _cmd_replay(args: argparse.Namespace) -> int:
    from .replay import ReplayReport, replay
    from .trace import load
    from .trace._format import sniff
    from .view import picture_moments

    _input_file(args.trace, "an accelrt trace (.jsonl.gz) or a PyTorch snapshot pickle")
    for output in (args.html, args.png):
        _not_the_input(output, args.trace)
    _check_png(args.png)
    if args.device is not None:
        _check_device(args.device, args.capacity)
    # a malformed snapshot shows as one line naming the file (load checks a JSONL trace itself)
    snapshot = args.trace if sniff(args.trace) == "pickle" else None
    trace = _malformed_snapshot_guard(
        snapshot, load, args.trace, include_host=args.include_host, device_index=args.device_index
    )
    # a PyTorch recording replays on the simulated device with its recorded settings
    device = args.device or ("sim" if trace.recording is not None else _default_device())
    if args.device is None:
        _check_device(device, args.capacity)
    configs: list[str | None] = list(args.config or [None if trace.recording else ""])
    reports: list[ReplayReport] = []
    show_progress = not args.json and not args.no_progress and sys.stderr.isatty()
    pictures = bool(getattr(args, "html", None) or getattr(args, "png", None))
    for config in configs:
        # the first setting's replay also captures what the pictures draw
        capture = picture_moments(trace) if pictures and not reports else ()
        run = functools.partial(
            _malformed_snapshot_guard,
            snapshot,
            replay,
            trace,
            device=device,
            capacity=args.capacity,
            config=config,
            capture_at=capture,
        )
        if show_progress and len(trace.events) > 50_000:
            from rich.progress import Progress

            with Progress(transient=True) as bar:
                task = bar.add_task(f"replaying {trace.name}", total=len(trace.events))

                def advance(done: int, _total: int, task: Any = task) -> None:
                    bar.update(task, completed=done)

                reports.append(run(progress=advance))
        else:
            reports.append(run())
    if pictures:
        _write_pictures(args, trace, reports[0])
    if args.json:
        out = [r.to_dict() for r in reports]
        print(json.dumps(out[0] if len(out) == 1 else out, indent=2))
        return 0
    _print_reports(trace.name, trace.skipped_host_events, reports)
    return 0


def _write_pictures(args: argparse.Namespace, trace: Any, report: Any) -> None:
    from .view import render_html, view_of_trace

    view = view_of_trace(trace, report)
    if args.html:
        _write_text(args.html, render_html(view))
    if args.png:
        _write_png(view, args.png)


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
    parser = _Parser(
        prog="accelrt",
        description="accelrt: a device-agnostic accelerator runtime with a caching allocator.",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="{info,replay,snapshot}")
    info = sub.add_parser("info", help="show backends, devices, properties and memory")
    info.add_argument("--json", action="store_true", help="print one JSON object")
    info.set_defaults(func=_cmd_info)
    rep = sub.add_parser("replay", help="replay an allocation trace through the caching allocator")
    rep.add_argument("trace", help="an accelrt trace (.jsonl.gz) or a PyTorch snapshot pickle")
    rep.add_argument(
        "--device",
        type=_device_arg,
        help="'sim' (simulated), or a real device such as 'opencl:0' (default: the accelerator's "
        f"device 0, else sim); indices up to {MAX_DEVICE_INDEX}",
    )
    rep.add_argument(
        "--capacity",
        type=_capacity_arg,
        help="simulated device memory, e.g. 80GiB (sim only; less than 2**63 bytes)",
    )
    rep.add_argument(
        "--config",
        action="append",
        type=_config_arg,
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
        type=_index_arg,
        help="snapshots: the recorded device to replay (default: the only one with events)",
    )
    rep.add_argument(
        "--html",
        type=_output_arg("--html"),
        help="also write the memory picture as a self-contained HTML file",
    )
    rep.add_argument(
        "--png",
        type=_output_arg("--png"),
        help="also write active memory over time as a PNG (matplotlib)",
    )
    rep.set_defaults(func=_cmd_replay)

    snap = sub.add_parser("snapshot", help="look into a memory snapshot pickle (PyTorch's or ours)")
    snap_sub = snap.add_subparsers(
        dest="snapshot_command", required=True, metavar="{summary,segments,view}"
    )
    for name, func, text in (
        ("summary", _cmd_snapshot_summary, "the memory_summary table of the recorded run"),
        ("segments", _cmd_snapshot_segments, "a text map of the segments at the end"),
        ("view", _cmd_snapshot_view, "write the memory picture (HTML, and PNG with --png)"),
    ):
        cmd = snap_sub.add_parser(name, help=text)
        cmd.add_argument("file", help="a snapshot pickle (read as plain data; nothing in it runs)")
        cmd.add_argument("--device-index", type=_index_arg, help="the recorded device (default: 0)")
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
    return parser


_SNAPSHOT = "a PyTorch memory snapshot pickle (torch.cuda.memory._dump_snapshot)"


def _read_snapshot_file(path: str) -> dict[str, Any]:
    """Read a snapshot pickle, first telling the user plainly when the file is something else."""
    from .trace._format import sniff
    from .trace._snapshot_schema import read_snapshot

    _input_file(path, _SNAPSHOT)
    kind = sniff(path)
    if kind == "jsonl":
        raise CliError(f"{path} is a JSONL trace, not a snapshot pickle; use accelrt replay {path}")
    if kind == "empty":
        raise CliError(f"{path} is empty, not a snapshot pickle; give {_SNAPSHOT}")
    if kind == "gzip":
        raise CliError(
            f"{path} is gzip'd data, neither a snapshot pickle nor a JSONL trace; if it is a "
            "gzip'd snapshot, decompress it first (gunzip)"
        )
    if kind != "pickle":
        raise CliError(
            f"{path} is not a snapshot pickle (a pickle of protocol 2 or later, starting with "
            f"byte 0x80) nor a JSONL trace; give {_SNAPSHOT}"
        )
    return _malformed_snapshot_guard(path, read_snapshot, path)


def _malformed_snapshot_guard(
    source: str | None, func: Callable[..., _T], /, *args: Any, **kw: Any
) -> _T:
    """Call ``func``; a snapshot dict of the wrong shape shows as a one-line error naming it.

    ``source`` is the snapshot's path (None: not a snapshot, call ``func`` unguarded).
    """
    if source is None:
        return func(*args, **kw)
    try:
        return func(*args, **kw)
    except (KeyError, IndexError, TypeError, AttributeError) as exc:
        what = f"missing key {exc}" if isinstance(exc, KeyError) else f"{exc}"
        raise CliError(
            f"{source}: not a well-formed memory snapshot ({type(exc).__name__}: {what})"
        ) from None
    except ValueError as exc:  # e.g. recorded settings out of range: say which file
        if str(exc).startswith(source):
            raise
        raise CliError(f"{source}: {exc}") from None


def _snapshot_devices(snapshot: dict[str, Any]) -> int:
    """How many devices a snapshot knows of: its device_traces and its segments' devices."""
    devices = [s.get("device", 0) for s in snapshot["segments"] if isinstance(s, dict)]
    known = [d for d in devices if isinstance(d, int) and not isinstance(d, bool)]
    return max(len(snapshot.get("device_traces") or []), max(known, default=0) + 1, 1)


def _check_snapshot_device(path: str, snapshot: dict[str, Any], index: int | None) -> None:
    if index is None:
        return
    count = _malformed_snapshot_guard(path, _snapshot_devices, snapshot)
    if index >= count:
        raise CliError(
            f"--device-index {index} is out of range [0, {count}) for {path}; choose a device "
            "the snapshot recorded"
        )


def _cmd_snapshot_summary(args: argparse.Namespace) -> int:
    from .memory._summary import format_summary
    from .replay import replay
    from .trace._snapshot import trace_from_snapshot

    snapshot = _read_snapshot_file(args.file)
    _check_snapshot_device(args.file, snapshot, args.device_index)
    trace = _malformed_snapshot_guard(
        args.file, trace_from_snapshot, snapshot, device=args.device_index, path=args.file
    )
    report = _malformed_snapshot_guard(args.file, replay, trace)
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
    from .view import segment_text

    snapshot = _read_snapshot_file(args.file)
    _check_snapshot_device(args.file, snapshot, args.device_index)
    device = args.device_index or 0

    def text() -> str:
        return segment_text([s for s in snapshot["segments"] if s.get("device", 0) == device])

    print(_malformed_snapshot_guard(args.file, text))
    return 0


def _cmd_snapshot_view(args: argparse.Namespace) -> int:
    from .view import render_html, view_of_snapshot

    snapshot = _read_snapshot_file(args.file)  # a clear message for what is not a snapshot
    _check_snapshot_device(args.file, snapshot, args.device_index)
    for output in (args.output, args.png):
        _not_the_input(output, args.file)
    _check_png(args.png)
    view = _malformed_snapshot_guard(
        args.file, view_of_snapshot, args.file, device_index=args.device_index
    )
    page = render_html(view)
    _write_text(args.output, page)
    if args.png:
        _write_png(view, args.png)
    print(f"wrote {args.output}" + (f" and {args.png}" if args.png else ""))
    return 0


def _command_name(args: argparse.Namespace) -> str:
    sub = getattr(args, "snapshot_command", None)
    return f"{args.command} {sub}" if sub else str(args.command)


def _quiet_stdout() -> None:
    """After a broken pipe, point stdout at /dev/null so that exiting does not fail again."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError, AttributeError):
        return


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``accelrt`` command; return its exit status.

    Errors in the input (a missing or malformed trace, a bad option or setting) print one line
    to stderr and return 2; Ctrl-C (``KeyboardInterrupt``) prints one line and returns 130.
    Set ``ACCELRT_DEBUG=1`` to see the traceback of an unexpected error.
    """
    try:
        parser = build_parser()
        try:
            args = parser.parse_args(argv)
        except SystemExit as exc:  # --help (0), or a usage error already printed (2)
            return exc.code if isinstance(exc.code, int) else EXIT_USAGE
        command = _command_name(args)
        try:
            result: int = args.func(args)
        except BrokenPipeError:  # the reader of our output went away (e.g. `| head`)
            _quiet_stdout()
            return 1
        except (CliError, ValueError, TypeError, OSError, RuntimeError, ImportError) as exc:
            message = str(exc)
            if isinstance(exc, OSError) and exc.strerror and exc.filename is not None:
                message = f"{exc.filename}: {exc.strerror}"
            print(f"accelrt {command}: error: {_one_line(message)}", file=sys.stderr)
            return EXIT_USAGE
        except Exception as exc:  # a bug, or input no check foresaw: still one line
            if os.environ.get("ACCELRT_DEBUG"):
                raise
            print(
                f"accelrt {command}: error: unexpected {type(exc).__name__}: "
                f"{_one_line(str(exc))} (ACCELRT_DEBUG=1 shows the traceback)",
                file=sys.stderr,
            )
            return EXIT_USAGE
        return result
    except KeyboardInterrupt:
        print("accelrt: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED


if __name__ == "__main__":
    sys.exit(main())
