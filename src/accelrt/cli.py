"""The ``accelrt`` command: ``info``, ``replay``, ``snapshot summary|segments|view|diff``,
``sweep``.

Exit statuses (:func:`main`): 0 done; 1 ``sweep`` with a trace that failed (its rows say why),
or the reader of the output went away (a broken pipe); 2 an error in the input (a missing or
malformed file, a bad option or setting: an :class:`~accelrt._errors.InputError`, an
``OSError``, or a device that failed, ``AcceleratorError``): one line on stderr; 70
(``EX_SOFTWARE`` of sysexits.h) a bug in accelrt: the traceback and a line asking for a report;
130 an interrupt (Ctrl-C): one line. ``ACCELRT_DEBUG=1`` adds the traceback to an input error.

Text from input files (trace names, stack frames, file names) is shown through
:func:`accelrt._text.printable` (control characters and bidirectional overrides escaped) and
printed without rich's markup or highlighting.

The setting a command replays under is ``--config`` (the same syntax everywhere, ``defaults``
included), else the environment (``ACCELRT_ALLOC_CONF``, else PyTorch's ``PYTORCH_ALLOC_CONF``,
else ``PYTORCH_CUDA_ALLOC_CONF``: the first set), else a snapshot's recorded settings or, for a
JSONL trace, the defaults; every output says which (``Setting.source``). A snapshot is read for
every recorded device with allocation history (a section each and a total), unless
``--device-index`` names one.
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
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Any, NoReturn

from ._errors import AcceleratorError, InputError
from ._gc import collector_paused
from ._text import printable
from ._units import format_bytes, parse_bytes

if TYPE_CHECKING:
    from rich.console import Console

    from .memory._config import Setting
    from .replay import ReplayReport
    from .trace import Trace
    from .trace._plain_pickle import ByteProgress
    from .view import View

__all__ = ["main"]

MAX_DEVICE_INDEX = 1023
"""The largest device index the command accepts (``--device TYPE:N``, ``--device-index``).

The simulated backend creates every device up to the one asked for, so an unbounded index
would make ``--device sim:99999999`` build a hundred million devices."""
_DEVICE_RE = re.compile(r"([a-z_][a-z0-9_]*)(?::([0-9]+))?", re.ASCII)
_INDEX_RE = re.compile(r"[0-9]+", re.ASCII)
EXIT_USAGE = 2
"""The exit status of an error in the input (and of argparse's usage errors)."""
EXIT_BUG = 70
"""The exit status of a bug in accelrt: ``EX_SOFTWARE`` ("internal software error") of BSD's
sysexits.h, distinct from the input errors' 2 and ``sweep``'s 1."""
EXIT_INTERRUPTED = 130
"""The exit status after Ctrl-C: 128 + SIGINT, as shells report it."""


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
    except InputError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _parsed_setting(text: str, source: str) -> Setting:
    """A setting string (accelrt's syntax, ``defaults``, or a real PYTORCH_CUDA_ALLOC_CONF string
    verbatim: keys the allocator's policy does not depend on are set aside) read once."""
    from .memory._config import AllocatorConfig, Setting

    config, ignored = AllocatorConfig.parse_torch(text)
    return Setting(config, source, tuple(ignored))


def _config_arg(text: str) -> Setting:
    """A ``--config``, the same in every command; see :func:`_parsed_setting`."""
    try:
        return _parsed_setting(text, "--config")
    except InputError as exc:
        raise argparse.ArgumentTypeError(f"{exc} (in {_shown(text)})") from None


def _env_setting() -> Setting | None:
    """The setting of the first of ``ENV_VARS`` set and not empty (ACCELRT_ALLOC_CONF, then
    PyTorch's PYTORCH_ALLOC_CONF and PYTORCH_CUDA_ALLOC_CONF, in PyTorch's order), else None.

    Raises
    ------
    InputError
        For a variable set to a bad setting; the message names the variable.
    """
    from .memory._config import ENV_VARS

    for var in ENV_VARS:
        text = os.environ.get(var, "")
        if text.strip():
            try:
                return _parsed_setting(text, f"environment {var}")
            except InputError as exc:
                raise InputError(f"{var}: {exc} (in {_shown(text)}); fix or unset it") from None
    return None


def _settings(given: Sequence[Setting] | None, *, recording: bool) -> list[Setting]:
    """The settings to replay under: ``--config`` (each one given), else the environment
    (:func:`_env_setting`), else a recording's own settings (``recording``) or the defaults."""
    from .memory._config import RECORDED, AllocatorConfig, Setting

    if given:
        return list(given)
    default = Setting(None, RECORDED) if recording else Setting(AllocatorConfig(), "defaults")
    return [_env_setting() or default]


def _note_ignored(settings: Sequence[Setting]) -> None:
    """Say on stderr, once per setting, which PyTorch keys it set aside (not modelled)."""
    for setting in dict.fromkeys(settings):
        if setting.ignored:
            keys = printable(", ".join(setting.ignored))  # from the environment, as given
            print(
                f"accelrt: ignored in {setting.source}: {keys} (the device allocator's policy "
                "does not depend on them)",
                file=sys.stderr,
            )


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
        raise InputError(f"no file given (an empty name); give {what}")
    if os.path.isdir(path):
        raise InputError(f"{path} is a directory; give {what}")
    if not os.path.exists(path):
        raise InputError(f"{path}: No such file or directory; give {what}")
    if not os.path.isfile(path):
        raise InputError(f"{path} is not a regular file (a pipe or a device); save it to a file")
    if not os.access(path, os.R_OK):
        raise InputError(f"{path}: permission denied; make it readable")


def _not_the_input(output: str | None, source: str) -> None:
    if output and os.path.exists(output) and os.path.samefile(output, source):
        raise InputError(f"{output} is the input file; writing it would destroy it")


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
        raise InputError(f"cannot write {path}: {exc.strerror or exc}") from None


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
        raise InputError(f"writing {path} needs matplotlib: pip install 'accelrt[view]'") from None
    except OSError as exc:
        raise InputError(f"cannot write {path}: {exc.strerror or exc}") from None


def _check_png(path: str | None) -> None:
    """Refuse ``--png`` up front when matplotlib is missing or cannot write that format."""
    if not path:
        return
    import importlib.util

    if importlib.util.find_spec("matplotlib") is None:
        raise InputError(f"--png {path} needs matplotlib: pip install 'accelrt[view]'")
    suffix = os.path.splitext(path)[1].lower().lstrip(".")
    if suffix:
        from matplotlib.backend_bases import FigureCanvasBase

        formats = FigureCanvasBase.get_supported_filetypes()
        if suffix not in formats:
            raise InputError(
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
    except InputError as exc:  # ACCELRT_BACKEND names no backend
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


def _console() -> Console:
    """A rich console on stdout that prints text as given: no markup, no highlighting (rich's
    highlighter takes time quadratic in a string's length), styles only where a ``Text`` gives
    them. On a terminal as wide as it; in a pipe or a CI log never wrapped (each table at its
    own width, one line a sentence)."""
    from rich.console import Console

    width = None if sys.stdout.isatty() else 100_000
    return Console(width=width, markup=False, highlight=False)


def _cmd_info(args: argparse.Namespace) -> int:
    data = _info_data()
    if args.json:
        print(json.dumps(data, indent=2))
        return 0
    from rich.table import Table
    from rich.text import Text

    console = _console()
    console.print(
        Text.assemble("accelerator: ", (printable(data["accelerator"] or "none"), "bold"))
    )
    console.print(
        f"backends: {', '.join(data['registered_backends'])} "
        f"(available: {', '.join(data['available_backends']) or 'none'})"
    )
    for name, reason in data["unavailable_backends"].items():  # the drivers' words
        console.print(f"{name}: unavailable: {printable(reason)}")
    core = data["allocator_core"]
    console.print(f"allocator core: {core['core']} ({core['reason']})")
    for dev in data["devices"]:  # names, vendors and versions as the drivers report them
        table = Table(title=dev["device"], show_header=False)
        table.add_column("property", style="bold")
        table.add_column("value")
        table.add_row("name", printable(dev["name"]))
        table.add_row("vendor", printable(dev["vendor"]))
        table.add_row("total memory", format_bytes(dev["total_memory_bytes"]))
        table.add_row("free memory", format_bytes(dev["free_memory_bytes"]))
        table.add_row("max allocation", format_bytes(dev["max_allocation_bytes"]))
        table.add_row("compute units", str(dev["compute_units"]))
        table.add_row("driver", printable(dev["driver_version"]))
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
        raise InputError(
            f"--capacity applies to the simulated device only; on {dev} cap memory with "
            "--config per_process_memory_fraction:X instead, or use --device sim"
        )
    try:
        backend = get_backend(dev.type)
    except ImportError as exc:
        raise InputError(
            f"--device {dev}: the {dev.type!r} backend cannot be loaded ({exc}); install it, "
            "or use --device sim"
        ) from None
    count = backend.device_count()
    index = dev.index or 0
    if index >= count:
        raise InputError(
            f"--device {dev}: device index {index} is out of range [0, {count}) for "
            f"{dev.type}" + ("; use --device sim" if count == 0 else "")
        )


def _cmd_replay(args: argparse.Namespace) -> int:
    from ._verdict import oom_verdict
    from .trace import load
    from .trace._format import sniff
    from .trace._snapshot import snapshot_name
    from .view import picture_moments

    _input_file(args.trace, "an accelrt trace (.jsonl.gz) or a PyTorch snapshot pickle")
    for output in (args.html, args.png):
        _not_the_input(output, args.trace)
    _check_png(args.png)
    if args.device is not None:
        _check_device(args.device, args.capacity)
    # the readers refuse a malformed file with an InputError naming it (one line)
    snapshot: dict[str, Any] | None = None
    show_progress = _show_progress(args)
    if sniff(args.trace) == "pickle":
        snapshot = _read_snapshot_file(args.trace, progress=show_progress)
        traces = _snapshot_traces(args.trace, snapshot, args.device_index)
    else:
        traces = [load(args.trace, include_host=args.include_host, device_index=args.device_index)]
    recording = traces[0].recording is not None
    # a PyTorch recording replays on the simulated device with its recorded settings
    device = args.device or ("sim" if recording else _default_device())
    if args.device is None:
        _check_device(device, args.capacity)
    settings = _settings(args.config, recording=recording)
    _note_ignored(settings)
    pictures = bool(args.html or args.png)
    from ._start_state import StartStateError

    runs: list[list[ReplayReport | None]] = []  # device by device, setting by setting
    failed: set[int] = set()  # settings that cannot hold a recording's start: dropped
    for trace in traces:
        runs.append([])
        for k, setting in enumerate(settings):
            if k in failed:  # dropped on an earlier device: not replayed again
                runs[-1].append(None)
                continue
            # the first setting's replay also captures what the pictures draw
            capture = picture_moments(trace) if pictures and not any(runs[-1]) else ()
            try:
                report = _replay_shown(
                    trace,
                    show_progress,
                    device=device,
                    capacity=args.capacity,
                    config=setting.config,
                    capture_at=capture,
                    start=args.start,
                )
            except StartStateError as exc:  # one line; the other settings are still reported
                print(f"error: {printable(_one_line(f'{trace.name}: {exc}'))}", file=sys.stderr)
                failed.add(k)
                report = None
            runs[-1].append(report)
    kept = [k for k in range(len(settings)) if k not in failed]
    if not kept:
        return 2
    settings = [settings[k] for k in kept]
    done = [[_replayed(run[k]) for k in kept] for run in runs]
    if pictures:
        views = [_view(snapshot, t, r[0]) for t, r in zip(traces, done, strict=True)]
        devices = [_recorded_device(t) for t in traces]
        title = snapshot_name(args.trace)
        _write_views(views, devices, args.html, args.png, title=title, stream=sys.stderr)
    if args.json:
        print(json.dumps(_replay_json(args.trace, traces, settings, done), indent=2))
        return 2 if failed else 0
    for n, (trace, reports) in enumerate(zip(traces, done, strict=True)):
        if n:
            print()
        _print_reports(trace.name, trace.skipped_host_events, reports, [s.source for s in settings])
        verdict = oom_verdict(reports) or _interaction_warning(reports)
        if verdict is not None:
            print(verdict)
    if len(traces) > 1:
        print()
        _print_totals(snapshot_name(args.trace), traces, settings, done)
    return 2 if failed else 0


def _replayed(report: ReplayReport | None) -> ReplayReport:
    """A kept setting's report (a setting is dropped for every device if one fails)."""
    assert report is not None
    return report


def _replay_shown(trace: Trace, show_progress: bool, **kw: Any) -> ReplayReport:
    """:func:`accelrt.replay.replay` of ``trace``, with a progress bar on stderr when asked for
    and the trace is long (more than 50,000 events)."""
    from .replay import replay

    if not show_progress or len(trace.events) <= 50_000:
        return replay(trace, **kw)
    from rich.console import Console
    from rich.markup import escape
    from rich.progress import Progress

    with Progress(transient=True, console=Console(stderr=True)) as bar:
        task = bar.add_task(f"replaying {escape(printable(trace.name))}", total=len(trace.events))
        return replay(trace, progress=lambda done, _total: bar.update(task, completed=done), **kw)


def _interaction_warning(reports: Sequence[ReplayReport]) -> str | None:
    """``warning: ...`` where a setting tried combines options known to interact (the OOM
    verdict says it too)."""
    from ._verdict import interaction_warning

    warning = interaction_warning(r.config for r in reports)
    return None if warning is None else f"warning: {warning}"


def _bytes_or_dash(n: int | None) -> str:
    return "-" if n is None else format_bytes(n)


def _recorded_device(trace: Trace) -> int | None:
    return trace.recording.device if trace.recording is not None else None


def _report_dict(report: ReplayReport, setting: Setting, trace: Trace) -> dict[str, Any]:
    """``report.to_dict()`` with ``recorded_device`` after ``trace`` and ``config_source``
    (where the setting came from) after ``config``."""
    extra: dict[str, dict[str, Any]] = {
        "trace": {"recorded_device": _recorded_device(trace)},
        "config": {"config_source": setting.source},
    }
    data: dict[str, Any] = {}
    for key, value in report.to_dict().items():
        data[key] = value
        data.update(extra.get(key, {}))
    return data


def _totals(
    settings: Sequence[Setting], runs: Sequence[Sequence[ReplayReport]]
) -> list[dict[str, Any]]:
    """Per setting, the peaks summed over the devices (``runs``: reports device by device)."""
    totals = []
    for i, setting in enumerate(settings):
        reports = [r[i] for r in runs]
        recorded = [r.recorded_peak_reserved_bytes for r in reports]
        totals.append(
            {
                "config": setting.label,
                "config_source": setting.source,
                "devices": len(reports),
                "peak_requested_bytes": sum(r.peak_requested_bytes for r in reports),
                "peak_reserved_bytes": sum(r.peak_reserved_bytes for r in reports),
                "recorded_peak_reserved_bytes": (
                    None if None in recorded else sum(x or 0 for x in recorded)
                ),
            }
        )
    return totals


def _replay_json(
    path: str,
    traces: Sequence[Trace],
    settings: Sequence[Setting],
    runs: Sequence[Sequence[ReplayReport]],
) -> Any:
    """What ``replay --json`` prints: one trace's report (a list of them with several settings);
    for several recorded devices, ``{"trace", "recorded_devices", "reports", "totals"}``. Each
    report has the OOM ``verdict`` on its trace's replays (None where nothing ran out)."""
    from ._verdict import oom_verdict
    from .trace._snapshot import snapshot_name

    reports = []
    for t, run in zip(traces, runs, strict=True):
        verdict = oom_verdict(run)  # over the settings replayed together
        pairs = zip(run, settings, strict=True)
        reports += [{**_report_dict(r, s, t), "verdict": verdict} for r, s in pairs]
    if len(traces) == 1:
        return reports[0] if len(reports) == 1 else reports
    return {
        "trace": snapshot_name(path),
        "recorded_devices": [_recorded_device(t) for t in traces],
        "reports": reports,
        "totals": _totals(settings, runs),
    }


def _snapshot_traces(path: str, snapshot: dict[str, Any], index: int | None) -> list[Trace]:
    """The trace of every recorded device of a snapshot with allocation history, or of the one
    ``--device-index`` names (checked: :func:`_check_device_index`)."""
    from .trace._snapshot import trace_from_snapshot, traces_from_snapshot

    _check_device_index(path, snapshot, index)
    if index is None:
        return traces_from_snapshot(snapshot, path=path)
    return [trace_from_snapshot(snapshot, device=index, path=path)]


def _view(snapshot: dict[str, Any] | None, trace: Trace, report: ReplayReport | None) -> View:
    """The picture of ``trace`` and its replay; a snapshot's device's with its recorded stacks,
    times and OOMs (``device_traces[N]``) and end segments."""
    from .view import view_of_trace

    if snapshot is None or trace.recording is None:
        return view_of_trace(trace, report)
    device = trace.recording.device
    return view_of_trace(
        trace,
        report,
        entries=snapshot["device_traces"][device],
        end_segments=[s for s in snapshot["segments"] if s.get("device", 0) == device],
    )


def _numbered(path: str, device: int) -> str:
    """``out.png`` as ``out_dev1.png``: a file per recorded device."""
    root, ext = os.path.splitext(path)
    return f"{root}_dev{device}{ext}"


def _write_views(
    views: Sequence[View],
    devices: Sequence[int | None],
    html_path: str | None,
    png_path: str | None,
    *,
    title: str,
    stream: Any,
) -> None:
    """Write the pictures, one per recorded device: one HTML file (headed ``title``) with a
    section each, and a PNG each (``out_devN.png`` when there are several); say what was
    written on ``stream``."""
    from .view import render_html, render_pages

    several = len(views) > 1
    written = []
    if html_path:
        page = render_pages(views, title) if several else render_html(views[0])
        _write_text(html_path, page)
        shown = f"devices {', '.join(str(d) for d in devices)}; " if several else ""
        written.append(f"{html_path} ({shown}{len(page.encode()) / 1e6:.1f} MB)")
    if png_path:
        for view, device in zip(views, devices, strict=True):
            name = _numbered(png_path, device) if several and device is not None else png_path
            _write_png(view, name)
            written.append(name)
    print(printable("wrote " + ", ".join(written)), file=stream)


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
    name: str, skipped_host: int, reports: Sequence[Any], sources: Sequence[str]
) -> None:
    """Print one trace's replays, a column per setting; ``sources`` says where each setting
    came from (``Setting.source``: ``--config``, ``environment VAR``, ``recorded``...). The
    trace's ``name`` is shown escaped (:func:`accelrt._text.printable`)."""
    from rich.table import Table
    from rich.text import Text

    first = reports[0]
    console = _console()
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
    for r in reports:
        table.add_column(_short_setting(r.config), justify="right", overflow="fold")
    rows: list[tuple[str, Any]] = [
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
    shortened = {_short_setting(r.config): r.config for r in reports}
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
    from ._verdict import fragmentation_summary

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

    from .memory._config import setting_text

    console = _console()
    console.print(
        Text.assemble((printable(name), "bold"), f": {len(traces)} recorded devices"),
        soft_wrap=True,
    )
    table = Table()
    table.add_column("device", style="bold")
    for setting in settings:
        head = _short_setting(setting.label)
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


def _grid_arg(text: str) -> tuple[str, list[str]]:
    from ._sweep import parse_grid

    try:
        return parse_grid(text)
    except InputError as exc:
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
        raise InputError("accelrt sweep needs Dask: pip install 'accelrt[sweep]'")
    if args.parquet and importlib.util.find_spec("pyarrow") is None:
        raise InputError(f"--parquet {args.parquet} needs pyarrow: pip install pyarrow")
    for output in (args.csv, args.parquet, args.png):
        for trace in args.trace:
            if os.path.exists(trace):
                _not_the_input(output, trace)
    _check_png(args.png)
    from rich.console import Console

    from ._sweep import dumps_json, print_results, render_png, sweep, write_csv, write_parquet

    show_progress = _show_progress(args)
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

        # --config, else (without --grid) the environment's setting, else the defaults
        settings = args.config or ([] if args.grid else [s for s in [_env_setting()] if s])
        _note_ignored(settings)
        results = sweep(
            args.trace,
            settings,
            grid=args.grid or [],
            capacities=args.capacity or None,
            find_capacity=args.find_capacity,
            scheduler=args.scheduler,
            num_workers=args.workers,
            include_host=args.include_host,
            device_index=args.device_index,
            progress=progress,
            start=args.start,
            scheduler_file=args.scheduler_file,
            on_connect=_print_dashboard,
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


def _print_dashboard(client: Any) -> None:
    """Say where the connected cluster's dashboard is, on stderr."""
    link = getattr(client, "dashboard_link", None)
    if link:
        print(f"accelrt sweep: Dask dashboard at {printable(str(link))}", file=sys.stderr)


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
        type=_config_arg,
        help="a setting in ACCELRT_ALLOC_CONF syntax ('defaults': the defaults); repeat "
        "(default: ACCELRT_ALLOC_CONF, PYTORCH_ALLOC_CONF or PYTORCH_CUDA_ALLOC_CONF, else the "
        "defaults; snapshots also under their recorded settings)",
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
    where = swp.add_mutually_exclusive_group()
    where.add_argument(
        "--scheduler",
        help="processes (every core), threads, synchronous, or tcp:// or tls://HOST:PORT of a "
        "dask.distributed scheduler (default: DASK_SCHEDULER_ADDRESS where set, else processes)",
    )
    where.add_argument(
        "--scheduler-file",
        metavar="PATH",
        help="connect to the scheduler this file names (dask scheduler --scheduler-file PATH)",
    )
    swp.add_argument(
        "--workers", type=_workers_arg, help="local processes or threads (default: every core)"
    )
    swp.add_argument(
        "--include-host", action="store_true", help="also replay events tagged host (CPU-only)"
    )
    swp.add_argument("--device-index", type=_index_arg, help=_DEVICE_INDEX_HELP)
    _add_start_option(swp)
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


def _add_start_option(parser: argparse.ArgumentParser) -> None:
    """``--start``: how a recording that began mid-run starts under another setting."""
    from ._start_state import STARTS

    parser.add_argument(
        "--start",
        choices=STARTS,
        default="modelled",
        help="for a recording that began mid-run, replayed with another setting than the "
        "recorded one: rebuild its start state under that setting (modelled, the default) or "
        "keep the recorded segments and blocks (recorded); docs/snapshot-replay.md",
    )


def build_parser() -> argparse.ArgumentParser:
    """Return the argument parser of the ``accelrt`` command."""
    parser = _Parser(
        prog="accelrt",
        description="accelrt: a device-agnostic accelerator runtime with a caching allocator.",
        epilog="Exit status: 0 done; 1 a sweep's trace failed; 2 an error in the input (one line "
        f"on stderr; ACCELRT_DEBUG=1 adds the traceback); {EXIT_BUG} a bug in accelrt (the "
        f"traceback: please report it); {EXIT_INTERRUPTED} interrupted.",
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
        help="allocator settings in ACCELRT_ALLOC_CONF syntax, e.g. max_split_size_mb:128 "
        "('defaults': the defaults); repeat to compare settings (default: ACCELRT_ALLOC_CONF, "
        "PYTORCH_ALLOC_CONF or PYTORCH_CUDA_ALLOC_CONF, else a snapshot's recorded settings or "
        "the defaults)",
    )
    rep.add_argument(
        "--include-host", action="store_true", help="also replay events tagged host (CPU-only)"
    )
    rep.add_argument("--json", action="store_true", help="print the report as JSON")
    rep.add_argument("--no-progress", action="store_true", help="never show a progress bar")
    rep.add_argument("--device-index", type=_index_arg, help=_DEVICE_INDEX_HELP)
    _add_start_option(rep)
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
        cmd.add_argument("--no-progress", action="store_true", help="never show a progress bar")
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
    diff.set_defaults(func=_cmd_snapshot_diff)
    _add_sweep_parser(sub)
    return parser


_SNAPSHOT = "a PyTorch memory snapshot pickle (torch.cuda.memory._dump_snapshot)"


_PROGRESS_BYTES = 8 << 20
"""Files from this size on show a progress bar while they are read (where one is shown)."""


def _show_progress(args: argparse.Namespace) -> bool:
    """Whether a command shows progress bars: on a terminal (stderr), unless told not to."""
    return not getattr(args, "json", False) and not args.no_progress and sys.stderr.isatty()


@contextlib.contextmanager
def _reading_progress(path: str, show: bool) -> Iterator[ByteProgress | None]:
    """A progress bar over the bytes of ``path`` on stderr (read, checked, decoded), if ``show``
    and the file is large; yields what ``read_snapshot(progress=...)`` takes, else None."""
    if not show or os.path.getsize(path) < _PROGRESS_BYTES:
        yield None
        return
    from rich.console import Console
    from rich.markup import escape
    from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TimeRemainingColumn

    name = escape(printable(os.path.basename(path)))  # the description is rich markup
    columns = (TextColumn("{task.description}"), BarColumn(), DownloadColumn())
    stderr = Console(stderr=True)
    with Progress(*columns, TimeRemainingColumn(), console=stderr, transient=True) as bar:
        task = bar.add_task(f"reading {name}", total=os.path.getsize(path))

        def progress(phase: str, done: int, total: int) -> None:
            bar.update(task, description=f"{phase} {name}", completed=done, total=total)

        yield progress


def _read_snapshot_file(path: str, *, progress: bool = False) -> dict[str, Any]:
    """Read a snapshot pickle, first telling the user plainly when the file is something else;
    with ``progress``, show a progress bar over its bytes (:func:`_reading_progress`)."""
    from .trace._format import sniff
    from .trace._snapshot_schema import read_snapshot

    _input_file(path, _SNAPSHOT)
    kind = sniff(path)
    if kind == "jsonl":
        raise InputError(
            f"{path} is a JSONL trace, not a snapshot pickle; use accelrt replay {path}"
        )
    if kind == "empty":
        raise InputError(f"{path} is empty, not a snapshot pickle; give {_SNAPSHOT}")
    if kind == "gzip":
        raise InputError(
            f"{path} is gzip'd data, neither a snapshot pickle nor a JSONL trace; if it is a "
            "gzip'd snapshot, decompress it first (gunzip)"
        )
    if kind != "pickle":
        raise InputError(
            f"{path} is not a snapshot pickle (a pickle of protocol 2 or later, starting with "
            f"byte 0x80) nor a JSONL trace; give {_SNAPSHOT}"
        )
    with _reading_progress(path, progress) as report:
        return read_snapshot(path, progress=report)


_DEVICE_INDEX_HELP = (
    "snapshots: only the recorded device N, of device_traces[N] (default: every recorded device)"
)
"""The help of ``--device-index``, the same in ``replay``, ``sweep`` and every ``snapshot``
command."""


def _check_device_index(
    path: str, snapshot: dict[str, Any], index: int | None, *, history: bool = True
) -> None:
    """Refuse a ``--device-index`` the same way in every command: a device the snapshot does not
    have (the message names those it has) or, where ``history`` matters and another device has
    some, one without allocation history."""
    from .trace._snapshot import devices_text, devices_with_history, snapshot_devices

    if index is None:
        return
    present = snapshot_devices(snapshot)
    if index not in present:
        raise InputError(
            f"--device-index {index} is out of range for {path}: it has devices "
            f"{devices_text(present)}; choose one of them, or leave --device-index out for all"
        )
    recorded = devices_with_history(snapshot) if history else []
    if recorded and index not in recorded:
        raise InputError(
            f"device {index} of {path} recorded no allocation history; devices "
            f"{devices_text(recorded)} did: choose one with --device-index {recorded[0]}"
        )


def _cmd_snapshot_summary(args: argparse.Namespace) -> int:
    from .memory._summary import format_summary
    from .replay import replay
    from .trace._snapshot import devices_with_history
    from .view import forensics_text

    snapshot = _read_snapshot_file(args.file, progress=_show_progress(args))
    if not devices_with_history(snapshot):  # the end state only: say what it holds
        _check_device_index(args.file, snapshot, args.device_index)
        text = _end_state_summary(args.file, snapshot, args.device_index)
        print(printable(text, keep_newlines=True), end="")
        return 0
    traces = _snapshot_traces(args.file, snapshot, args.device_index)
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
        view = _view(snapshot, trace, report)
        print(printable(forensics_text(view, width=width), keep_newlines=True), end="")
    if len(traces) > 1:
        from .memory._config import RECORDED, Setting

        [total] = _totals([Setting(None, RECORDED)], [[r] for r in reports])
        print(
            f"\nTotal of {total['devices']} recorded devices: peak requested "
            f"{total['peak_requested_bytes']} bytes, peak reserved {total['peak_reserved_bytes']}"
            f" bytes (PyTorch recorded {total['recorded_peak_reserved_bytes']} bytes)."
        )
    return 0


def _end_state_summary(path: str, snapshot: dict[str, Any], device_index: int | None) -> str:
    """What ``snapshot summary`` prints for a snapshot without allocation history: per device
    with segments (or the one ``--device-index`` names), the end state it holds."""
    from .trace._snapshot import snapshot_devices, snapshot_name
    from .view import end_state_text, end_state_view

    if device_index is not None:
        devices = [device_index]
    else:
        devices = snapshot_devices(snapshot, in_use=True) or [0]
    width = max(60, min(160, shutil.get_terminal_size().columns))
    parts = []
    for device in devices:
        segments = [s for s in snapshot["segments"] if s.get("device", 0) == device]
        view = end_state_view(segments, snapshot_name(path))
        text = end_state_text(view, width=width)
        parts.append(f"{view.title} (recorded device {device})\n{text}")
    return "\n".join(parts)


def _diff_side(path: str, device_index: int | None) -> tuple[dict[str, Any] | None, list[Trace]]:
    """One side of a diff: the snapshot it read (None for a JSONL trace) and its traces."""
    from .trace import load
    from .trace._format import sniff

    _input_file(path, "a snapshot pickle or an accelrt trace (.jsonl.gz)")
    if sniff(path) != "pickle":
        return None, [load(path)]
    snapshot = _read_snapshot_file(path)
    return snapshot, _snapshot_traces(path, snapshot, device_index)


def _diff_run(
    path: str, snapshot: dict[str, Any] | None, trace: Trace, setting: Setting, several: bool
) -> tuple[str, View, ReplayReport]:
    """A label, the picture and the replay of one device of one side of a diff."""
    from .replay import replay

    report = replay(trace, config=setting.config, capture_at=[len(trace.events) - 1])
    view = _view(snapshot, trace, report)
    device = f" device {_recorded_device(trace)}" if several else ""
    return f"{os.path.basename(path)}{device}, setting from {setting.source}", view, report


def _cmd_snapshot_diff(args: argparse.Namespace) -> int:
    from .trace._snapshot import devices_text
    from .view import diff_text

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
        a = _diff_run(files[0], snap_a, trace_a, settings[0], several)
        b = _diff_run(files[1], snap_b, trace_b, settings[1], several)
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
    from .trace._snapshot import snapshot_devices
    from .view import segment_text

    snapshot = _read_snapshot_file(args.file, progress=_show_progress(args))
    _check_device_index(args.file, snapshot, args.device_index, history=False)
    if args.device_index is not None:
        devices = [args.device_index]
    else:  # every device with segments or history (device 0 of an empty snapshot)
        in_use = snapshot_devices(snapshot, in_use=True)
        devices = in_use or [0]
    mine = [[s for s in snapshot["segments"] if s.get("device", 0) == d] for d in devices]
    if len(devices) == 1:
        print(segment_text(mine[0]))
        return 0
    parts = [f"recorded device {d}:\n{segment_text(s)}" for d, s in zip(devices, mine, strict=True)]
    total = segment_text([s for segments in mine for s in segments]).splitlines()[-1]
    print("\n\n".join([*parts, f"total of {len(devices)} recorded devices: {total}"]))
    return 0


def _cmd_snapshot_view(args: argparse.Namespace) -> int:
    from .trace._snapshot import devices_with_history, snapshot_devices, snapshot_name
    from .view import SnapshotPicture

    show_progress = _show_progress(args)
    # a clear message for what is not a snapshot
    snapshot = _read_snapshot_file(args.file, progress=show_progress)
    _check_device_index(args.file, snapshot, args.device_index)
    for output in (args.output, args.png):
        _not_the_input(output, args.file)
    _check_png(args.png)
    # every device with history, else (the end state) every one with segments
    in_use = snapshot_devices(snapshot, in_use=True)
    recorded = devices_with_history(snapshot) or in_use
    devices = [args.device_index] if args.device_index is not None else recorded or [0]
    # what each picture shows first, so that the snapshot's entries go before the replays
    pictures = [SnapshotPicture.take(args.file, snapshot, device) for device in devices]
    del snapshot
    replay_shown = functools.partial(_replay_shown, show_progress=show_progress)
    views = []
    for device, picture in zip(devices, pictures, strict=True):
        view = picture.draw(run=replay_shown)
        if len(recorded) > 1:  # the page says which device it shows
            view.title = snapshot_name(args.file, device)
        views.append(view)
    title = snapshot_name(args.file)
    _write_views(views, devices, args.output, args.png, title=title, stream=sys.stdout)
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


def _print_traceback(exc: BaseException) -> None:
    """Print the traceback of ``exc`` on stderr, its input-derived text escaped (printable)."""
    import traceback

    text = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    sys.stderr.write(printable(text, keep_newlines=True))


def _input_error_text(exc: Exception) -> str:
    """The one line an input error prints after ``error:`` (an ``OSError`` as ``FILE: why``)."""
    message = str(exc)
    if isinstance(exc, OSError) and exc.strerror and exc.filename is not None:
        message = f"{exc.filename}: {exc.strerror}"
    return printable(_one_line(message))


def _is_input_problem(exc: Exception) -> bool:
    """Whether ``exc`` is about the user's input or environment (one ``error:`` line, status
    2) rather than a bug in accelrt: an :class:`~accelrt._errors.InputError`, an ``OSError``
    (a file, a connection), an ``AcceleratorError`` (a device failed or ran out of memory),
    or an ``ImportError`` of a package that is not installed (not one of accelrt's modules).
    """
    if isinstance(exc, (InputError, OSError, AcceleratorError)):
        return True
    return isinstance(exc, ImportError) and (exc.name or "accelrt").partition(".")[0] != "accelrt"


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``accelrt`` command; return its exit status.

    An error in the input, raised on purpose where it is found (an
    :class:`~accelrt._errors.InputError`: a malformed trace or snapshot, a bad option or
    setting; an ``OSError``: a file that cannot be read or written, a scheduler that cannot be
    reached; an ``AcceleratorError``: a device that failed, ``OutOfMemoryError`` included),
    prints one line to stderr, ``accelrt CMD: error: MESSAGE``, and returns 2 (with
    ``ACCELRT_DEBUG=1`` set, its traceback first). Any other exception is a bug in accelrt:
    its traceback, then a line asking for a report with the version, and 70 (``EX_SOFTWARE``).
    Ctrl-C (``KeyboardInterrupt``) prints one line and returns 130. Everything printed is
    escaped by :func:`accelrt._text.printable` (keeping the traceback's line breaks).
    """
    try:
        parser = build_parser()
        try:
            args = parser.parse_args(argv)
        except SystemExit as exc:  # --help (0), or a usage error already printed (2)
            return exc.code if isinstance(exc.code, int) else EXIT_USAGE
        command = _command_name(args)
        try:
            # a snapshot (these commands read them) decodes to a container per entry, none in
            # a cycle: each collection of the cyclic collector would walk them all (accelrt._gc)
            heavy = args.command in ("snapshot", "replay")
            paused = collector_paused() if heavy else contextlib.nullcontext()
            with paused:
                result: int = args.func(args)
        except BrokenPipeError:  # the reader of our output went away (e.g. `| head`)
            _quiet_stdout()
            return 1
        except Exception as exc:
            if _is_input_problem(exc):
                if os.environ.get("ACCELRT_DEBUG"):
                    _print_traceback(exc)
                print(f"accelrt {command}: error: {_input_error_text(exc)}", file=sys.stderr)
                return EXIT_USAGE
            # a bug, or input that no check foresaw (a bug in the check)
            from . import __version__

            _print_traceback(exc)
            print(
                f"accelrt {command}: internal error: this is a bug in accelrt {__version__}, not "
                "a problem with your input; please report it with the command you ran and the "
                "traceback above",
                file=sys.stderr,
            )
            return EXIT_BUG
        return result
    except KeyboardInterrupt:
        print("accelrt: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED


if __name__ == "__main__":
    sys.exit(main())
