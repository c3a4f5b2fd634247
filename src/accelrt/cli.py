"""The ``accelrt`` command: ``info``, ``replay``, ``snapshot summary|segments|view``, ``sweep``.

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
import shutil
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
    """A ``--config``: accelrt's syntax, or a real PYTORCH_CUDA_ALLOC_CONF string verbatim
    (keys the allocator's policy does not depend on are set aside by :func:`_modelled`)."""
    from .memory._config import AllocatorConfig

    try:
        AllocatorConfig.parse_torch(text)
    except (TypeError, ValueError) as exc:
        raise argparse.ArgumentTypeError(f"{exc} (in {_shown(text)})") from None
    return text


def _modelled(text: str) -> str:
    """``text`` without the PyTorch keys accelrt does not model, saying on stderr which went."""
    from .memory._config import AllocatorConfig

    config, ignored = AllocatorConfig.parse_torch(text)
    if not ignored:
        return text
    print(
        f"accelrt: ignored in {_shown(text)}: {', '.join(ignored)} (the device allocator's "
        "policy does not depend on them)",
        file=sys.stderr,
    )
    return config.describe() if config.describe() != "defaults" else ""


def _default_config() -> str:
    """``ACCELRT_ALLOC_CONF`` (checked; the CLI error names the variable), else the defaults."""
    text = os.environ.get("ACCELRT_ALLOC_CONF", "")
    try:
        _config_arg(text)
    except argparse.ArgumentTypeError as exc:
        raise CliError(f"ACCELRT_ALLOC_CONF: {exc}") from None
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


def _write_png(view: Any, path: str, render: Callable[[Any, str], None] | None = None) -> None:
    draw: Callable[[Any, str], None]
    if render is None:
        from .view import render_png

        draw = render_png
    else:
        draw = render
    try:
        draw(view, path)
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
    from .memory import _core

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
        "unavailable_backends": {},  # name -> why it has no device, where the backend says
        "allocator_core": {"core": _core.CORE, "reason": _core.CORE_REASON},
        "devices": [],
    }
    for name in data["registered_backends"]:
        if name not in data["available_backends"]:
            try:
                reason = getattr(get_backend(name), "unavailable_reason", lambda: None)()
            except (ImportError, TypeError, ValueError) as exc:
                reason = f"cannot be loaded: {exc}"
            if reason:
                data["unavailable_backends"][name] = str(reason)
    for name in data["available_backends"]:  # the simulated devices too: replays use them
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
    for name, reason in data["unavailable_backends"].items():
        console.print(f"{name}: unavailable: {reason}", markup=False, highlight=False)
    core = data["allocator_core"]
    console.print(f"allocator core: {core['core']} ({core['reason']})", markup=False)
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
    if snapshot is not None:
        trace = _snapshot_trace(args.trace, args.device_index)
    else:
        trace = load(args.trace, include_host=args.include_host, device_index=args.device_index)
    # a PyTorch recording replays on the simulated device with its recorded settings
    device = args.device or ("sim" if trace.recording is not None else _default_device())
    if args.device is None:
        _check_device(device, args.capacity)
    # a recording replays with its own settings unless told; a trace with ACCELRT_ALLOC_CONF's
    configs: list[str | None] = [_modelled(c) for c in args.config or ()] or [
        None if trace.recording else _modelled(_default_config())
    ]
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


def _snapshot_trace(path: str, device_index: int | None) -> Any:
    """The trace of a snapshot pickle's recorded device (``--device-index``, default 0)."""
    from .trace._snapshot import trace_from_snapshot

    data = _read_snapshot_file(path)
    device = _snapshot_device(path, data, device_index)
    return _malformed_snapshot_guard(path, trace_from_snapshot, data, device=device, path=path)


def _snapshot_history(path: str, trace: Any) -> tuple[Any, list[dict[str, Any]]]:
    """A snapshot trace's recorded entries and end segments (stacks, times, OOMs)."""
    if getattr(trace, "recording", None) is None:
        return None, []
    from .trace._snapshot_schema import read_snapshot

    snapshot = read_snapshot(path)
    device = trace.recording.device
    segments = [s for s in snapshot["segments"] if s.get("device", 0) == device]
    return (snapshot.get("device_traces") or [])[device], segments


def _write_pictures(args: argparse.Namespace, trace: Any, report: Any) -> None:
    from .view import render_html, view_of_trace

    entries, segments = _malformed_snapshot_guard(
        args.trace if trace.recording is not None else None, _snapshot_history, args.trace, trace
    )
    view = view_of_trace(trace, report, entries=entries, end_segments=segments)
    if args.html:
        _write_text(args.html, render_html(view))
        print(f"wrote {args.html}", file=sys.stderr)
    if args.png:
        _write_png(view, args.png)
        print(f"wrote {args.png}", file=sys.stderr)


_SHORT_KEYS = {
    "max_split_size_mb": "max_split",
    "max_non_split_rounding_mb": "non_split_rounding",
    "garbage_collection_threshold": "gc",
    "per_process_memory_fraction": "fraction",
}
_SHORT_ITEM = 28
"""A setting item of an unknown key longer than this is cut (its full text is listed below)."""


def _setting_items(config: str) -> list[str]:
    """``key:value`` items of a setting string; commas inside brackets stay in their item."""
    items, depth, current = [], 0, ""
    for char in config:
        depth += (char == "[") - (char == "]")
        if char == "," and depth <= 0:
            items.append(current)
            current = ""
        else:
            current += char
    return [i for i in (*items, current) if i]


def _short_divisions(value: str) -> str:
    """``[1:1,2:1,...,512:2,...]`` as runs of equal divisions: ``[..256:1,512:2,1024..:8]``."""
    pairs = [p.split(":") for p in value.strip("[]").split(",")]
    if not all(len(p) == 2 and p[0].isdigit() and p[1].isdigit() for p in pairs):
        return value if len(value) <= _SHORT_ITEM else value[: _SHORT_ITEM - 3] + "..."
    runs: list[list[str]] = []  # [first size, last size, divisions]
    for size, divisions in pairs:
        if runs and runs[-1][2] == divisions:
            runs[-1][1] = size
        else:
            runs.append([size, size, divisions])
    if len(runs) == 1:
        return runs[0][2]
    shown = []
    for n, (lo, hi, divisions) in enumerate(runs):
        if lo == hi:
            shown.append(f"{lo}:{divisions}")
        elif n == 0:
            shown.append(f"..{hi}:{divisions}")
        elif n == len(runs) - 1:
            shown.append(f"{lo}..:{divisions}")
        else:
            shown.append(f"{lo}..{hi}:{divisions}")
    return "[" + ",".join(shown) + "]"


def _short_setting(config: str) -> str:
    """Return a setting string in the short form ``accelrt replay`` uses for column heads.

    Parameters
    ----------
    config : str
        A setting as ``ReplayReport.config`` has it (``AllocatorConfig.describe()``: items
        ``key:value`` joined by commas, or ``defaults``).

    Returns
    -------
    str
        The items joined by ``", "``: ``expandable_segments:True`` as ``expandable``,
        ``release_lock_on_malloc:True`` as ``release_lock``, ``max_split_size_mb:N`` as
        ``max_split:N`` (likewise ``non_split_rounding``, ``gc``, ``fraction``), and
        ``roundup_power2_divisions:[1:1,2:1,...]`` (per power-of-two size in MiB) as runs of
        equal divisions, e.g. ``roundup:[..256:1,512:2,1024:4,2048..:8]``, or ``roundup:4``
        when all are equal. Other items longer than 28 characters are cut with ``...``.
    """
    shown = []
    for item in _setting_items(config):
        key, _, value = item.partition(":")
        if key == "expandable_segments":
            shown.append("expandable" if value == "True" else "not expandable")
        elif key == "release_lock_on_malloc":
            shown.append("release_lock" if value == "True" else "no release_lock")
        elif key == "roundup_power2_divisions":
            shown.append(f"roundup:{_short_divisions(value)}")
        elif key in _SHORT_KEYS:
            shown.append(f"{_SHORT_KEYS[key]}:{value}")
        else:
            shown.append(item if len(item) <= _SHORT_ITEM else item[: _SHORT_ITEM - 3] + "...")
    return ", ".join(shown) or config


def _print_reports(name: str, skipped_host: int, reports: Sequence[Any]) -> None:
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    first = reports[0]
    # in a pipe or a CI log nothing is wrapped: the table at its own width, one line a sentence
    console = Console() if sys.stdout.isatty() else Console(width=100_000)
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
        f"[bold]{escape(name)}[/bold] on {first.device} ({capacity}): "
        f"{first.events} events ({view}); trace peak live {first.trace_peak_live_bytes} bytes "
        f"({format_bytes(first.trace_peak_live_bytes)})",
        soft_wrap=True,
    )
    table = Table()
    table.add_column("", style="bold")
    for r in reports:
        table.add_column(escape(_short_setting(r.config)), justify="right", overflow="fold")
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
    shortened = {_short_setting(r.config): r.config for r in reports}
    if any(short != full for short, full in shortened.items()):
        console.print("Column heads in full:", soft_wrap=True)
        for short, full in shortened.items():
            if short != full:
                console.print(f"  {short} = {full}", soft_wrap=True, markup=False)
    for r in reports:
        match = "equals" if r.peak_requested_bytes == r.trace_peak_live_bytes else "differs from"
        console.print(
            f"{escape('[' + r.config + ']')} peak requested {r.peak_requested_bytes} bytes "
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
            console.print(
                f"  PyTorch recorded: peak reserved {r.recorded_peak_reserved_bytes} bytes "
                f"({format_bytes(r.recorded_peak_reserved_bytes)}), "
                f"{r.recorded_num_device_alloc} device mallocs; accelrt: "
                f"{r.peak_reserved_bytes} bytes, {r.num_device_alloc} device mallocs; "
                f"difference {r.peak_reserved_difference:+.3%}",
                soft_wrap=True,
            )
        for note in r.notes:
            console.print(f"  note: {note}", soft_wrap=True, markup=False)


def _sweep_config_arg(text: str) -> str:
    """``--config`` of ``accelrt sweep``: as ``replay``'s, and ``defaults`` names the defaults."""
    return "" if text.strip() == "defaults" else _config_arg(text)


def _grid_arg(text: str) -> tuple[str, list[str]]:
    from ._sweep import parse_grid

    try:
        return parse_grid(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _workers_arg(text: str) -> int:
    value = text.strip()
    if not _INDEX_RE.fullmatch(value) or len(value) > 6 or int(value) < 1:
        raise argparse.ArgumentTypeError(
            f"the number of workers must be a whole number >= 1, got {_shown(text)}"
        )
    return int(value)


def _cmd_sweep(args: argparse.Namespace) -> int:
    import importlib.util

    if importlib.util.find_spec("dask") is None:
        raise CliError("accelrt sweep needs Dask: pip install 'accelrt[sweep]'")
    if args.parquet and importlib.util.find_spec("pyarrow") is None:
        raise CliError(f"--parquet {args.parquet} needs pyarrow: pip install pyarrow")
    for output in (args.csv, args.parquet, args.png):
        for trace in args.trace:
            if os.path.exists(trace):
                _not_the_input(output, trace)
    _check_png(args.png)
    from rich.console import Console

    from ._sweep import dumps_json, print_results, render_png, sweep, write_csv, write_parquet

    show_progress = not args.json and not args.no_progress and sys.stderr.isatty()
    with contextlib.ExitStack() as stack:
        progress: Callable[[int, int], None] | None = None
        if show_progress:
            from rich.progress import (
                BarColumn,
                MofNCompleteColumn,
                Progress,
                TextColumn,
                TimeElapsedColumn,
                TimeRemainingColumn,
            )

            bar = stack.enter_context(
                Progress(
                    TextColumn("combinations"),
                    BarColumn(),
                    MofNCompleteColumn(),
                    TimeElapsedColumn(),
                    TextColumn("left"),
                    TimeRemainingColumn(),
                    console=Console(stderr=True),
                    transient=True,
                )
            )
            task = bar.add_task("sweep", total=None)

            def progress(done: int, total: int) -> None:
                bar.update(task, completed=done, total=total)

        results = sweep(
            args.trace,
            [_modelled(c) for c in args.config or []],
            grid=args.grid or [],
            capacities=args.capacity or None,
            find_capacity=args.find_capacity,
            scheduler=args.scheduler,
            num_workers=args.workers,
            include_host=args.include_host,
            device_index=args.device_index,
            progress=progress,
        )
    if args.csv:
        write_csv(results, args.csv)
    if args.parquet:
        write_parquet(results, args.parquet)
    if args.png:
        _write_png(results, args.png, render_png)
    if args.json:
        print(dumps_json(results))
    else:  # wide enough for the tables when written to a file or a pipe
        print_results(results, Console() if sys.stdout.isatty() else Console(width=140))
    return 1 if any(r.error for r in results) else 0


def _add_sweep_parser(sub: Any) -> None:
    swp = sub.add_parser(
        "sweep",
        help="replay traces under many settings and capacities, in parallel (Dask)",
        description="Replay every (trace, setting, capacity) combination on the simulated "
        "device, in parallel on Dask, and rank the settings. Exit status 1 when a trace failed "
        "(its rows say why). See docs/sweep.md.",
    )
    swp.add_argument(
        "trace", nargs="+", help="accelrt traces or snapshot pickles: paths or fsspec URLs"
    )
    swp.add_argument(
        "--config",
        action="append",
        type=_sweep_config_arg,
        help="a setting in ACCELRT_ALLOC_CONF syntax ('defaults': the defaults); repeat",
    )
    swp.add_argument(
        "--grid",
        action="append",
        type=_grid_arg,
        metavar="KEY=V1,V2",
        help="also try every combination of these values, e.g. max_split_size_mb=128,256; repeat",
    )
    swp.add_argument(
        "--capacity",
        action="append",
        type=_capacity_arg,
        help="simulated device memory, e.g. 80GiB (default: each trace's); repeat",
    )
    swp.add_argument(
        "--find-capacity",
        action="store_true",
        help="bisect for the smallest capacity (to 2 MiB) each setting runs in without an OOM",
    )
    swp.add_argument(
        "--scheduler",
        default="processes",
        help="processes (default: every core), threads, synchronous, or tcp://HOST:PORT of a "
        "dask.distributed scheduler",
    )
    swp.add_argument(
        "--workers", type=_workers_arg, help="local processes or threads (default: every core)"
    )
    swp.add_argument(
        "--include-host", action="store_true", help="also replay events tagged host (CPU-only)"
    )
    swp.add_argument(
        "--device-index", type=_index_arg, help="snapshots: the recorded device to replay"
    )
    out = swp.add_mutually_exclusive_group()
    out.add_argument("--json", action="store_true", help="print one JSON object")
    out.add_argument("--csv", type=_output_arg("--csv"), help="also write the results as CSV")
    out.add_argument(
        "--parquet", type=_output_arg("--parquet"), help="also write the results as Parquet"
    )
    swp.add_argument(
        "--png", type=_output_arg("--png"), help="also draw peak reserved per setting and trace"
    )
    swp.add_argument("--no-progress", action="store_true", help="never show a progress bar")
    swp.set_defaults(func=_cmd_sweep)


def build_parser() -> argparse.ArgumentParser:
    """Return the argument parser of the ``accelrt`` command."""
    parser = _Parser(
        prog="accelrt",
        description="accelrt: a device-agnostic accelerator runtime with a caching allocator.",
    )
    from . import __version__

    parser.add_argument("--version", action="version", version=f"accelrt {__version__}")
    sub = parser.add_subparsers(
        dest="command", required=True, metavar="{info,replay,snapshot,sweep}"
    )
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
    rep.add_argument("--device-index", type=_index_arg, help=_DEVICE_INDEX_HELP)
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
        dest="snapshot_command", required=True, metavar="{summary,segments,view,diff}"
    )
    for name, func, text in (
        ("summary", _cmd_snapshot_summary, "the memory_summary table of the recorded run"),
        ("segments", _cmd_snapshot_segments, "a text map of the segments at the end"),
        ("view", _cmd_snapshot_view, "write the memory picture (HTML, and PNG with --png)"),
    ):
        cmd = snap_sub.add_parser(name, help=text)
        cmd.add_argument("file", help="a snapshot pickle (read as plain data; nothing in it runs)")
        cmd.add_argument("--device-index", type=_index_arg, help=_DEVICE_INDEX_HELP)
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
        help="allocator settings for A, then for B (default: each run's recorded settings)",
    )
    diff.add_argument("--device-index", type=_index_arg, help=_DEVICE_INDEX_HELP)
    diff.set_defaults(func=_cmd_snapshot_diff)
    _add_sweep_parser(sub)
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


_DEVICE_INDEX_HELP = "snapshots: the recorded device to read, N of device_traces[N] (default: 0)"
"""The help of ``--device-index``, the same in ``replay`` and every ``snapshot`` command."""


def _snapshot_device(
    path: str, snapshot: dict[str, Any], index: int | None, *, history: bool = True
) -> int:
    """The recorded device that ``--device-index`` names (default 0), checked the same way for
    every command: in range, and (``history``) with allocation history when another device has
    some."""
    device = 0 if index is None else index
    count = _malformed_snapshot_guard(path, _snapshot_devices, snapshot)
    if device >= count:
        raise CliError(
            f"--device-index {device} is out of range [0, {count}) for {path}; choose a device "
            "the snapshot recorded"
        )
    if history:
        from .trace._snapshot import devices_with_history

        recorded = devices_with_history(snapshot)
        if recorded and device not in recorded:
            raise CliError(
                f"device {device} of {path} recorded no allocation history; devices {recorded} "
                f"did: choose one with --device-index {recorded[0]}"
            )
    return device


def _cmd_snapshot_summary(args: argparse.Namespace) -> int:
    from .memory._summary import format_summary
    from .replay import replay
    from .trace._snapshot import trace_from_snapshot

    snapshot = _read_snapshot_file(args.file)
    device_index = _snapshot_device(args.file, snapshot, args.device_index)
    trace = _malformed_snapshot_guard(
        args.file, trace_from_snapshot, snapshot, device=device_index, path=args.file
    )
    report = _malformed_snapshot_guard(args.file, replay, trace, capture_at=[len(trace.events) - 1])
    device = trace.recording.device if trace.recording is not None else 0
    name = f"{trace.name} (recorded device {device})"
    print(format_summary(report.memory_stats, name), end="")
    print(
        "Figures from replaying the recorded history from its rewound start state; PyTorch "
        f"recorded a peak reserved of {report.recorded_peak_reserved_bytes} bytes "
        f"(replay: {report.peak_reserved_bytes})."
    )
    print()
    print(_malformed_snapshot_guard(args.file, _forensics, args.file, trace, report), end="")
    return 0


def _forensics(path: str, trace: Any, report: Any) -> str:
    from .view import forensics_text, view_of_trace

    entries, segments = _snapshot_history(path, trace)
    view = view_of_trace(trace, report, entries=entries, end_segments=segments)
    return forensics_text(view, width=max(60, min(160, shutil.get_terminal_size().columns)))


def _diff_run(path: str, config: str | None, device_index: int | None) -> tuple[str, Any, Any]:
    from .replay import replay
    from .trace import load
    from .trace._format import sniff
    from .view import view_of_trace

    _input_file(path, "a snapshot pickle or an accelrt trace (.jsonl.gz)")
    snapshot = path if sniff(path) == "pickle" else None
    trace = _snapshot_trace(path, device_index) if snapshot else load(path)
    report = _malformed_snapshot_guard(
        snapshot, replay, trace, config=config, capture_at=[len(trace.events) - 1]
    )
    entries, segments = _malformed_snapshot_guard(snapshot, _snapshot_history, path, trace)
    view = view_of_trace(trace, report, entries=entries, end_segments=segments)
    return os.path.basename(path), view, report


def _cmd_snapshot_diff(args: argparse.Namespace) -> int:
    from .view import diff_text

    files: list[str] = args.files
    configs: list[str | None] = [_modelled(c) for c in args.config or []]
    if len(files) > 2:
        raise CliError(f"snapshot diff compares two runs, got {len(files)} files; give A B")
    if len(files) == 1:
        if len(configs) != 2:
            raise CliError(
                "snapshot diff with one file compares it under two settings: give --config "
                "twice (e.g. --config '' --config expandable_segments:True), or give two files"
            )
        files = [files[0], files[0]]
    if len(configs) > 2:
        raise CliError(f"--config given {len(configs)} times; give it once for A and once for B")
    while len(configs) < 2:
        configs.append(configs[0] if configs else None)
    a = _diff_run(files[0], configs[0], args.device_index)
    b = _diff_run(files[1], configs[1], args.device_index)
    width = max(60, min(160, shutil.get_terminal_size().columns))
    print(diff_text(a, b, width=width), end="")
    return 0


def _cmd_snapshot_segments(args: argparse.Namespace) -> int:
    from .view import segment_text

    snapshot = _read_snapshot_file(args.file)
    device = _snapshot_device(args.file, snapshot, args.device_index, history=False)

    def text() -> str:
        return segment_text([s for s in snapshot["segments"] if s.get("device", 0) == device])

    print(_malformed_snapshot_guard(args.file, text))
    return 0


def _cmd_snapshot_view(args: argparse.Namespace) -> int:
    from .view import render_html, view_of_snapshot

    snapshot = _read_snapshot_file(args.file)  # a clear message for what is not a snapshot
    device_index = _snapshot_device(args.file, snapshot, args.device_index)
    for output in (args.output, args.png):
        _not_the_input(output, args.file)
    _check_png(args.png)
    view = _malformed_snapshot_guard(
        args.file, view_of_snapshot, args.file, device_index=device_index
    )
    page = render_html(view)
    _write_text(args.output, page)
    if args.png:
        _write_png(view, args.png)
    print(
        f"wrote {args.output} ({len(page.encode()) / 1e6:.1f} MB)"
        + (f" and {args.png}" if args.png else "")
    )
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
