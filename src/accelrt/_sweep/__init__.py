"""Sweep allocator settings and capacities over many traces, in parallel, on Dask.

``accelrt.sweep`` (and ``accelrt sweep``) replays every (trace, setting, capacity) combination
with :func:`accelrt.replay.replay` on the simulated device, exactly as ``accelrt replay --device
sim`` does, and optionally bisects for the smallest capacity at which each setting runs without
running out of memory. Replays are independent, so they run as Dask tasks: on a local scheduler
(processes by default, one per core) or on an existing ``dask.distributed`` cluster. Workers read
the traces themselves, from paths or fsspec URLs; only the results travel back.

Dask and fsspec are optional (``pip install 'accelrt[sweep]'``) and imported only when a sweep
runs, so ``import accelrt`` never imports them. docs/sweep.md describes the command.

The package, by concept: ``_model`` (the results: rows, the fleet summary, the winner),
``_grid`` (the settings to try), ``_plan`` (the arguments checked, the work cut into tasks),
``_cluster`` (choosing and reaching a Dask scheduler), ``_schedule`` (running the tasks, with
progress and Ctrl-C), ``_worker`` (what a worker does: load a trace once, replay it),
``_capacity`` (the bisection of ``find_capacity``) and ``_output`` (the command's table, CSV,
Parquet, PNG and JSON). :func:`sweep` itself is here.
"""

from __future__ import annotations

import contextlib
import importlib.util
import math
import os
import uuid
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING

from .._errors import InputError
from .._start_state import check_start
from .._text import shown
from ..memory._config import RECORDED, AllocatorConfig
from ._capacity import GRANULARITY as GRANULARITY
from ._capacity import LARGEST_CAPACITY as LARGEST_CAPACITY
from ._cluster import CONNECT_TIMEOUT as CONNECT_TIMEOUT
from ._cluster import SCHEDULERS as SCHEDULERS
from ._cluster import _check_scheduler, _check_versions, _connect, _connect_file
from ._grid import _candidates
from ._grid import parse_grid as parse_grid
from ._model import SettingSummary as SettingSummary
from ._model import SweepResult as SweepResult
from ._model import SweepResults as SweepResults
from ._output import dumps_json as dumps_json
from ._output import print_results as print_results
from ._output import render_png as render_png
from ._output import write_csv as write_csv
from ._output import write_parquet as write_parquet
from ._plan import ProgressCallback as ProgressCallback
from ._plan import (
    _batches,
    _check_capacities,
    _check_traces,
    _cpu_count,
    _env_capacity,
    _plan_tasks,
    _Task,
)
from ._resume import _ResultsFile
from ._schedule import _Counter, _run_distributed, _run_local

if TYPE_CHECKING:
    from distributed import Client

__all__ = [
    "GRANULARITY",
    "RECORDED",
    "SCHEDULERS",
    "SettingSummary",
    "SweepResult",
    "SweepResults",
    "sweep",
]


def sweep(
    traces: str | os.PathLike[str] | Sequence[str | os.PathLike[str]],
    configs: Sequence[str | AllocatorConfig | Mapping[str, object]] | str | None = None,
    *,
    grid: Mapping[str, Sequence[object]] | Sequence[tuple[str, Sequence[object]]] | None = None,
    capacities: Sequence[int | str | None] | int | str | None = None,
    find_capacity: bool = False,
    scheduler: str | Client | None = None,
    num_workers: int | None = None,
    include_host: bool = False,
    device_index: int | None = None,
    recorded: bool = True,
    progress: ProgressCallback | None = None,
    connect_timeout: float = CONNECT_TIMEOUT,
    start: str = "modelled",
    scheduler_file: str | os.PathLike[str] | None = None,
    on_connect: Callable[[Client], None] | None = None,
    results_file: str | os.PathLike[str] | None = None,
    resume: bool = False,
) -> SweepResults:
    """Replay every (trace, setting, capacity) combination, in parallel on Dask.

    Each combination is one :func:`accelrt.replay.replay` on the simulated device, so its
    report equals ``accelrt replay TRACE --device sim --config SETTING [--capacity SIZE]``.

    Parameters
    ----------
    traces : str, path-like, or sequence of them
        accelrt JSONL traces or PyTorch snapshot pickles: local paths or fsspec URLs
        (``s3://...``, ``https://...``), read by the workers, so they must reach them.
    configs : sequence of str, AllocatorConfig, mapping or Setting, or one of them, optional
        Settings in ``ACCELRT_ALLOC_CONF`` syntax (``""`` or ``"defaults"``: the defaults); a
        :class:`~accelrt.memory.Setting` also names where it came from (the rows'
        ``config_source``; else ``"configs"``).
    grid : mapping of str to sequence, or sequence of (str, sequence), optional
        Every combination of these settings' values is tried too, e.g.
        ``{"max_split_size_mb": [128, 256], "expandable_segments": [True, False]}``. With
        neither ``configs`` nor ``grid``, the defaults alone are tried.
    capacities : sequence of int, str or None, or int or str, optional
        Simulated device memory to replay under, in bytes or as ``"80GiB"``; None (the
        default) is the replay's own default (the trace header's ``device_capacity_bytes``, a
        snapshot's recorded capacity, else ``ACCELRT_SIM_CAPACITY`` as set here, else 80 GiB).
    find_capacity : bool
        Also bisect, per trace and setting, for the smallest capacity (a multiple of
        :data:`GRANULARITY`, 2 MiB) at which the replay runs without an OOM.
    scheduler : str or distributed.Client, optional
        ``"processes"`` (a local pool of processes), ``"threads"``, ``"synchronous"`` (in this
        thread, for debugging), ``"tcp://HOST:PORT"`` or ``"tls://HOST:PORT"`` (an existing
        ``dask.distributed`` scheduler; its workers need accelrt installed; TLS takes its
        certificates from Dask's configuration, ``distributed.comm.tls``), or a ``Client``.
        None (the default): ``DASK_SCHEDULER_ADDRESS`` where it is set, as ``Client()``
        reads it, else ``"processes"``.
    num_workers : int, optional
        Local schedulers only: processes or threads to use; default every core here.
    include_host : bool
        JSONL traces: also replay events tagged ``"host": 1``.
    device_index : int, optional
        Snapshots: only this recorded device (default: every device with allocation history,
        each with rows of its own, ranked together with all other traces).
    recorded : bool
        Also replay each snapshot under its own recorded settings (setting ``"recorded"``).
    progress : callable, optional
        Called as ``progress(done, total)`` with combinations done, as work completes.
    connect_timeout : float
        Seconds to wait for a ``tcp://`` scheduler (default 5).
    scheduler_file : str or path-like, optional
        The JSON file ``dask scheduler --scheduler-file`` writes: connect to the scheduler it
        names (instead of ``scheduler``).
    on_connect : callable, optional
        Called with the ``distributed.Client`` once connected to a scheduler (and its versions
        checked), e.g. to show its ``dashboard_link``.
    start : {"modelled", "recorded"}
        For a recording that began mid-run, under settings other than the recorded one: its
        start state rebuilt under each setting (default) or kept as recorded
        (``accelrt.replay.replay``'s ``start``).
    results_file : str or path-like, optional
        A JSON Lines file (a local path) to append every row to as its task finishes: a
        header line naming the sweep, then one :class:`SweepResult` a line (its report in
        full). A sweep killed or interrupted leaves every finished task's rows in it.
    resume : bool
        With ``results_file``: keep the (trace, setting) combinations the file already holds
        whole (replayed without error, at every capacity and recorded device) and replay only
        the rest; a truncated last line is dropped, and rows with an error are replayed again.
        A missing or empty file starts afresh. The results equal an uninterrupted sweep's.

    Returns
    -------
    SweepResults
        One :class:`SweepResult` per combination, trace by trace (a snapshot recorded device
        by recorded device), setting by setting.

    Raises
    ------
    ValueError
        Before any work: for an unknown or out-of-range setting (the message names it), an
        empty trace name, a bad capacity, scheduler, worker count, device index or timeout.
    TypeError
        For arguments of the wrong type.
    ImportError
        If Dask (or, for a ``tcp://`` address, dask.distributed) is not installed:
        ``pip install 'accelrt[sweep]'``.
    ConnectionError
        If no scheduler answers at the ``tcp://`` address within ``connect_timeout``, or what
        answers there is not a Dask scheduler.
    InputError
        A ``ValueError``: if the scheduler or its workers run other versions of accelrt,
        Dask or the packages Dask checks than this client (``Client.get_versions``), or both
        ``scheduler`` and ``scheduler_file`` are given; if ``results_file`` holds results
        and ``resume`` is False, is not a sweep's results file, or holds the results of a
        sweep with other traces, settings, capacities or options (``resume`` needs the same
        arguments), or ``resume`` is given without ``results_file``.
    OSError
        If ``results_file`` cannot be read or written.
    KeyboardInterrupt
        On Ctrl-C; pending work is cancelled and local worker processes are stopped.

    Notes
    -----
    A trace that is missing or malformed does not stop the others: its combinations carry
    the error. Each worker loads a trace once for all the settings it is given: a trace's
    settings are split into as many tasks as keep every worker busy, and small local traces are
    batched into one Dask task (up to a quarter of a worker's share of the bytes). The capacity
    search assumes that more memory never makes a replay fail; its result fits, and one
    :data:`GRANULARITY` less runs out of memory.

    Examples
    --------
    >>> import accelrt
    >>> results = accelrt.sweep(
    ...     "examples/traces/transformer_train.jsonl.gz",
    ...     ["defaults", "expandable_segments:True"],
    ...     scheduler="synchronous",
    ... )  # doctest: +SKIP
    >>> results.winner().config  # doctest: +SKIP
    'expandable_segments:True'
    """
    paths = _check_traces(traces)
    if configs is None:
        configs = []
    elif isinstance(configs, (str, AllocatorConfig, Mapping)):
        configs = [configs]
    grid_items = list(grid.items()) if isinstance(grid, Mapping) else list(grid or [])
    candidates = _candidates(list(configs), grid_items)
    caps = _check_capacities(capacities)
    where = _check_scheduler(scheduler)
    if num_workers is not None and (
        isinstance(num_workers, bool) or not isinstance(num_workers, int) or num_workers < 1
    ):
        raise ValueError(f"num_workers must be a whole number >= 1, got {shown(num_workers)}")
    if device_index is not None and (
        isinstance(device_index, bool) or not isinstance(device_index, int) or device_index < 0
    ):
        raise ValueError(f"device_index must be a whole number >= 0, got {shown(device_index)}")
    if isinstance(connect_timeout, bool) or not (
        isinstance(connect_timeout, (int, float)) and 0 < connect_timeout < math.inf
    ):
        raise ValueError(f"connect_timeout must be seconds > 0, got {shown(connect_timeout)}")
    check_start(start)  # here, before any worker starts
    env_capacity = _env_capacity()
    if importlib.util.find_spec("dask") is None:  # imported later, while workers start
        raise ImportError("accelrt sweep needs Dask: pip install 'accelrt[sweep]'", name="dask")
    if scheduler_file is not None and scheduler is not None:
        raise InputError(
            f"give a scheduler or a scheduler file, not both (scheduler {shown(scheduler)}, "
            f"scheduler_file {shown(scheduler_file)})"
        )
    if resume and results_file is None:
        raise InputError("resume needs a results file to continue (results_file, --results-file)")
    labels = [c.label for c in candidates]
    store = None
    if results_file is not None:  # before any work: a file that cannot be resumed is refused
        header = {
            "traces": paths,
            "configs": labels,
            "capacities": caps,
            "find_capacity": find_capacity,
            "include_host": include_host,
            "device_index": device_index,
            "recorded": recorded,
            "start": start,
            "env_capacity": env_capacity,
        }
        store = _ResultsFile(os.fspath(results_file), header, resume)
    kept = store.rows if store is not None else []

    client, owned = None, False
    try:
        if scheduler_file is not None:
            client, owned = _connect_file(os.fspath(scheduler_file), connect_timeout), True
        elif not isinstance(where, str):
            client = where
        elif "://" in where:
            client = _connect(where, connect_timeout)
            owned = True
        if owned:
            _check_versions(client)
            if on_connect is not None:
                on_connect(client)
        if client is not None:
            workers = max(1, sum(client.nthreads().values()))
        else:
            workers = 1 if where == "synchronous" else (num_workers or _cpu_count())
        base = _Task(
            sweep_id=uuid.uuid4().hex,
            source="",
            include_host=include_host,
            device_index=device_index,
            candidates=(),
            recorded=False,
            capacities=tuple(caps),
            find_capacity=find_capacity,
            env_capacity=env_capacity,
            planned=0,
            start=start,
        )
        target = workers * (2 if find_capacity else 1)
        batches, sizes = _batches(
            *_plan_tasks(base, paths, candidates, recorded, target, store), target
        )
        counter = _Counter(progress, store.append if store else None, len(kept))
        if client is not None:
            named = isinstance(where, str) and scheduler_file is None
            name = where if named else str(client.scheduler.address)
        else:
            name = where
        if not batches:  # a resumed sweep that was done
            counter.expect([], {})
            rows = []
        elif client is not None:
            rows = _run_distributed(client, batches, sizes, counter)
        else:
            rows = _run_local(where, batches, sizes, min(workers, len(batches)), counter)
    finally:
        if store is not None:
            store.close()
        if owned and client is not None:
            with contextlib.suppress(Exception):
                client.close()
    rows += kept
    if recorded and any(r.config == RECORDED for r in rows):
        labels.insert(0, RECORDED)
    # trace, recorded device, setting, capacity: as the tasks give them, resumed rows included
    column = {label: i for i, label in enumerate(labels)}
    first = {path: i for i, path in reversed(list(enumerate(paths)))}
    rows.sort(
        key=lambda r: (
            first[r.trace],
            -1 if r.recorded_device is None else r.recorded_device,
            column[r.config],
            caps.index(r.capacity),
        )
    )
    return SweepResults(
        rows,
        traces=paths,
        configs=labels,
        capacities=caps,
        find_capacity=find_capacity,
        scheduler=name,
    )
