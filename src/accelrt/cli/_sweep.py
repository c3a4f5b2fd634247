"""``accelrt sweep``: every (trace, setting, capacity) combination replayed in parallel on
Dask (:func:`accelrt.sweep`), ranked; tables, JSON, CSV, Parquet and a PNG."""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
from collections.abc import Callable

from .._errors import InputError
from .._text import printable
from ._args import (
    _DEVICE_INDEX_HELP,
    SubParsers,
    _add_start_option,
    _capacity_arg,
    _check_png,
    _config_arg,
    _env_setting,
    _grid_arg,
    _index_arg,
    _not_the_input,
    _note_ignored,
    _output_arg,
    _show_progress,
    _workers_arg,
)
from ._output import _write_png


def _cmd_sweep(args: argparse.Namespace) -> int:
    import importlib.util

    if importlib.util.find_spec("dask") is None:
        raise InputError("accelrt sweep needs Dask: pip install 'accelrt[sweep]'")
    if args.parquet and importlib.util.find_spec("pyarrow") is None:
        raise InputError(f"--parquet {args.parquet} needs pyarrow: pip install pyarrow")
    for output in (args.csv, args.parquet, args.png, args.results_file):
        for trace in args.trace:
            if os.path.exists(trace):
                _not_the_input(output, trace)
    _check_png(args.png)
    from rich.console import Console

    from .._sweep import dumps_json, print_results, render_png, sweep, write_csv, write_parquet

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
            results_file=args.results_file,
            resume=args.resume,
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


def _print_dashboard(client: object) -> None:
    """Say where the connected cluster's dashboard is, on stderr."""
    link = getattr(client, "dashboard_link", None)
    if link:
        print(f"accelrt sweep: Dask dashboard at {printable(str(link))}", file=sys.stderr)


def _add_sweep_parser(sub: SubParsers) -> None:
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
    swp.add_argument(
        "--results-file",
        type=_output_arg("--results-file"),
        metavar="PATH",
        help="also append each combination's row to this JSON Lines file as its task finishes "
        "(a header line, then one row a line), so that an interrupted sweep can be resumed; "
        "refused if PATH already holds results, without --resume",
    )
    swp.add_argument(
        "--resume",
        action="store_true",
        help="with --results-file: replay only the combinations PATH does not hold yet (it must "
        "come from the same traces, settings, capacities and options; a missing PATH starts "
        "afresh); the output is the whole sweep's",
    )
    swp.add_argument("--no-progress", action="store_true", help="never show a progress bar")
    swp.set_defaults(func=_cmd_sweep)
