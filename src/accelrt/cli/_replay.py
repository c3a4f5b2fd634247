"""``accelrt replay``: a trace or a snapshot's recorded devices replayed through a fresh
caching allocator under one setting or several, as tables, JSON and pictures."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING

from .._errors import InputError
from .._text import one_line, printable
from ._args import (
    _DEVICE_INDEX_HELP,
    MAX_DEVICE_INDEX,
    SubParsers,
    _add_category_option,
    _add_start_option,
    _capacity_arg,
    _check_png,
    _config_arg,
    _device_arg,
    _index_arg,
    _input_file,
    _not_the_input,
    _note_ignored,
    _output_arg,
    _settings,
    _show_progress,
)
from ._output import _view, _write_views
from ._replay_tables import _print_reports, _print_totals
from ._runs import _read_snapshot_file, _recorded_device, _replay_shown, _snapshot_traces, _totals

if TYPE_CHECKING:
    from ..memory._config import AllocatorConfig, Setting
    from ..replay import ReplayReport
    from ..trace import Trace
    from ..trace._snapshot_schema import FileSnapshot


def _default_device() -> str:
    from .. import _runtime

    backend = _runtime.accelerator()
    return f"{backend.name}:0" if backend is not None and backend.device_count() else "sim"


def _check_device(device: str, capacity: int | None) -> None:
    """Refuse, before any work, a device that does not exist or a capacity it cannot take."""
    from .._device import Device
    from ..backends import get_backend

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
    from .._verdict import oom_verdict
    from ..replay import replay_settings
    from ..trace._format import sniff
    from ..trace._load import load_sniffed
    from ..trace._snapshot import snapshot_name
    from ..view import picture_moments

    _input_file(args.trace, "an accelrt trace (.jsonl.gz) or a PyTorch snapshot pickle")
    for output in (args.html, args.png):
        _not_the_input(output, args.trace)
    _check_png(args.png)
    if args.device is not None:
        _check_device(args.device, args.capacity)
    # the readers refuse a malformed file with an InputError naming it (one line)
    snapshot: FileSnapshot | None = None
    show_progress = _show_progress(args)
    kind = sniff(args.trace)
    if kind == "pickle":
        checked = _read_snapshot_file(args.trace, progress=show_progress)
        traces = _snapshot_traces(args.trace, checked, args.device_index)
        snapshot = checked.data
    else:
        index, host = args.device_index, args.include_host
        traces = [load_sniffed(args.trace, kind, include_host=host, device_index=index)]
    recording = traces[0].recording is not None
    # a PyTorch recording replays on the simulated device with its recorded settings
    device = args.device or ("sim" if recording else _default_device())
    if args.device is None:
        _check_device(device, args.capacity)
    settings = _settings(args.config, recording=recording)
    _note_ignored(settings)
    pictures = bool(args.html or args.png)
    from .._start_state import StartStateError

    runs: list[list[ReplayReport | None]] = []  # device by device, setting by setting
    configs: list[list[AllocatorConfig]] = []  # what each replay ran under (recorded: its own)
    failed: set[int] = set()  # settings that cannot hold a recording's start: dropped
    for trace in traces:
        runs.append([])
        configs.append([replay_settings(trace, s.config) for s in settings])
        for k, config in enumerate(configs[-1]):
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
                    config=config,
                    capture_at=capture,
                    start=args.start,
                )
            except StartStateError as exc:  # one line; the other settings are still reported
                print(f"error: {printable(one_line(f'{trace.name}: {exc}'))}", file=sys.stderr)
                failed.add(k)
                report = None
            runs[-1].append(report)
    kept = [k for k in range(len(settings)) if k not in failed]
    if not kept:
        return 2
    settings = [settings[k] for k in kept]
    done = [[_replayed(run[k]) for k in kept] for run in runs]
    configs = [[used[k] for k in kept] for used in configs]
    if pictures:
        views = [_view(snapshot, t, r[0], args.category) for t, r in zip(traces, done, strict=True)]
        devices = [_recorded_device(t) for t in traces]
        title = snapshot_name(args.trace)
        _write_views(views, devices, args.html, args.png, title=title, stream=sys.stderr)
    if args.json:
        print(json.dumps(_replay_json(args.trace, traces, settings, configs, done), indent=2))
        return 2 if failed else 0
    sources = [s.source for s in settings]
    for n, (trace, used, reports) in enumerate(zip(traces, configs, done, strict=True)):
        if n:
            print()
        _print_reports(trace.name, trace.skipped_host_events, reports, used, sources)
        verdict = oom_verdict(reports, used) or _interaction_warning(used)
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


def _interaction_warning(configs: Sequence[AllocatorConfig]) -> str | None:
    """``warning: ...`` where a setting tried combines options known to interact (the OOM
    verdict says it too)."""
    from .._verdict import interaction_warning

    warning = interaction_warning(configs)
    return None if warning is None else f"warning: {warning}"


def _report_dict(report: ReplayReport, setting: Setting, trace: Trace) -> dict[str, object]:
    """``report.to_dict()`` with ``recorded_device`` after ``trace`` and ``config_source``
    (where the setting came from) after ``config``."""
    extra: dict[str, dict[str, object]] = {
        "trace": {"recorded_device": _recorded_device(trace)},
        "config": {"config_source": setting.source},
    }
    data: dict[str, object] = {}
    for key, value in report.to_dict().items():
        data[key] = value
        data.update(extra.get(key, {}))
    return data


def _replay_json(
    path: str,
    traces: Sequence[Trace],
    settings: Sequence[Setting],
    configs: Sequence[Sequence[AllocatorConfig]],
    runs: Sequence[Sequence[ReplayReport]],
) -> object:
    """What ``replay --json`` prints: one trace's report (a list of them with several settings);
    for several recorded devices, ``{"trace", "recorded_devices", "reports", "totals"}``. Each
    report has the OOM ``verdict`` on its trace's replays (None where nothing ran out)."""
    from .._verdict import oom_verdict
    from ..trace._snapshot import snapshot_name

    reports = []
    for t, used, run in zip(traces, configs, runs, strict=True):
        verdict = oom_verdict(run, used)  # over the settings replayed together
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


def _add_replay_parser(sub: SubParsers) -> None:
    """The ``replay`` command's options."""
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
    _add_category_option(rep)
    rep.set_defaults(func=_cmd_replay)
