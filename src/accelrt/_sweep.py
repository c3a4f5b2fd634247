"""Sweep allocator settings and capacities over many traces, in parallel, on Dask.

``accelrt.sweep`` (and ``accelrt sweep``) replays every (trace, setting, capacity) combination
with :func:`accelrt.replay.replay` on the simulated device, exactly as ``accelrt replay --device
sim`` does, and optionally bisects for the smallest capacity at which each setting runs without
running out of memory. Replays are independent, so they run as Dask tasks: on a local scheduler
(processes by default, one per core) or on an existing ``dask.distributed`` cluster. Workers read
the traces themselves, from paths or fsspec URLs; only the results travel back.

Dask and fsspec are optional (``pip install 'accelrt[sweep]'``) and imported only when a sweep
runs, so ``import accelrt`` never imports them. docs/sweep.md describes the command.
"""

from __future__ import annotations

import contextlib
import csv
import dataclasses
import functools
import importlib.util
import itertools
import json
import math
import multiprocessing
import os
import re
import shutil
import signal
import socket
import tempfile
import threading
import uuid
from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ._errors import InputError
from ._start_state import check_start
from ._text import printable
from ._units import MAX_BYTES, format_bytes, parse_bytes
from ._verdict import oom_verdict
from .memory._config import RECORDED, AllocatorConfig, Setting, setting_text
from .replay import UNLIMITED_CAPACITY, ReplayReport, replay

if TYPE_CHECKING:
    from .trace import Trace

__all__ = [
    "GRANULARITY",
    "RECORDED",
    "SCHEDULERS",
    "SettingSummary",
    "SweepResult",
    "SweepResults",
    "sweep",
]

GRANULARITY = 2 * 1024 * 1024
"""The capacity search's step in bytes (2 MiB): the size large segments are rounded to
(docs/allocator.md section 2), so no capacity between two steps behaves differently."""
SCHEDULERS = ("processes", "threads", "synchronous")
"""The local Dask schedulers ``scheduler=`` names; anything else must be ``tcp://HOST:PORT``."""
CONNECT_TIMEOUT = 5.0
"""Seconds to wait for a ``dask.distributed`` scheduler before giving up."""
_ADDRESS_RE = re.compile(r"(tcp|tls)://(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9_.-]+):([0-9]{1,5})", re.ASCII)
_REPORT_KEYS = tuple(
    f.name
    for f in dataclasses.fields(ReplayReport)
    if f.name not in ("segment_maps", "memory_stats", "trace", "config")
)
ProgressCallback = Callable[[int, int], None]


# ---------------------------------------------------------------------------------------------
# results


@dataclass(frozen=True)
class SweepResult:
    """One (trace, setting, capacity) combination of a sweep: its replay report or its error.

    Attributes
    ----------
    trace : str
        The trace's path or URL, as given to :func:`sweep`.
    config : str
        The setting, in ``ACCELRT_ALLOC_CONF`` syntax as ``AllocatorConfig.describe`` writes it
        (``"defaults"`` for the defaults), or ``"recorded"``: a PyTorch snapshot's own settings.
    capacity : int or None
        The simulated device memory asked for, in bytes; None: the replay's default (the
        trace header's ``device_capacity_bytes``, a snapshot's recorded capacity,
        ``ACCELRT_SIM_CAPACITY`` as set where :func:`sweep` was called, else 80 GiB).
    report : ReplayReport or None
        What :func:`accelrt.replay.replay` measured; None when the combination failed.
    error : str or None
        One line naming the trace and what went wrong (a missing or malformed file, a
        capacity too small for a recording's start state); None on success.
    min_capacity_bytes : int or None
        With ``find_capacity``: the smallest capacity, a multiple of :data:`GRANULARITY`, at
        which this setting replays the trace without an OOM (one step less runs out). None
        when not asked for, when the replay failed, or when no capacity fits (a request larger
        than any device).
    config_source : str
        Where the setting came from (``Setting.source``): ``"recorded"``, ``"grid"``,
        ``"defaults"`` (nothing asked for), ``"configs"`` (given as a string, mapping or
        config), or what a :class:`~accelrt.memory.Setting` given says (the command's
        ``"--config"``, ``"environment ACCELRT_ALLOC_CONF"``...).
    recorded_device : int or None
        For a snapshot, the recorded device this row replays (each device with allocation
        history has its rows); None for a JSONL trace, or a file that could not be read.
    """

    trace: str
    config: str
    capacity: int | None
    report: ReplayReport | None = None
    error: str | None = None
    min_capacity_bytes: int | None = None
    config_source: str = ""
    recorded_device: int | None = None

    @property
    def ok(self) -> bool:
        """Whether the replay ran (it may still have run out of memory: see ``num_ooms``)."""
        return self.report is not None

    @property
    def name(self) -> str:
        """The trace's name (its header's, else its file name without suffixes)."""
        if self.report is not None:
            return self.report.trace
        return os.path.basename(self.trace.rstrip("/")).split(".")[0] or self.trace

    @property
    def peak_reserved_bytes(self) -> int | None:
        """Peak reserved bytes of the replay; None if it failed."""
        return self.report.peak_reserved_bytes if self.report is not None else None

    @property
    def fragmentation(self) -> float | None:
        """Peak reserved over peak requested bytes; None if the replay failed."""
        return self.report.fragmentation if self.report is not None else None

    @property
    def num_device_alloc(self) -> int | None:
        """Segments obtained from the device; None if the replay failed."""
        return self.report.num_device_alloc if self.report is not None else None

    @property
    def num_ooms(self) -> int | None:
        """Allocations that ran out of memory; None if the replay failed."""
        return self.report.num_ooms if self.report is not None else None

    def to_dict(self) -> dict[str, Any]:
        """Return the combination as JSON-serialisable data.

        Returns
        -------
        dict
            The replay report's keys (``ReplayReport.to_dict``; all None when the replay
            failed), with ``trace`` and ``config`` meaning this combination's path and setting;
            the report's own ``trace`` (the trace's name) and ``config`` (the settings that
            differ from the defaults) are kept as ``name`` and ``settings``. Also
            ``config_source``, ``capacity`` (asked for; None: the default), ``error``,
            ``min_capacity_bytes``, ``recorded_device`` and ``verdict`` (the OOM verdict on
            this replay alone, as ``accelrt replay --json`` gives it: ``accelrt._verdict``).
        """
        report = self.report.to_dict() if self.report is not None else {}
        data: dict[str, Any] = {
            "trace": self.trace,
            "config": self.config,
            "config_source": self.config_source,
            "capacity": self.capacity,
            "error": self.error,
            "min_capacity_bytes": self.min_capacity_bytes,
            "name": self.name,
            "recorded_device": self.recorded_device,
            "settings": report.get("config"),
        }
        data.update({key: report.get(key) for key in _REPORT_KEYS})
        data["verdict"] = oom_verdict([self.report]) if self.report is not None else None
        return data

    def to_record(self) -> dict[str, Any]:
        """Return :meth:`to_dict` with scalar values only, for CSV, Parquet and data frames.

        ``ooms`` (a list) is left out (``num_ooms`` counts them) and ``notes`` are joined
        with ``"; "``.
        """
        data = self.to_dict()
        del data["ooms"]
        notes = data["notes"]
        data["notes"] = "; ".join(notes) if notes is not None else None
        return data


@dataclass(frozen=True)
class SettingSummary:
    """One setting across all traces of a sweep (a row of the fleet summary).

    Attributes
    ----------
    rank : int
        1 for the best. Settings are ranked by the traces replayed without error (most
        first), then, with ``find_capacity``, by the traces no capacity fits and the total
        capacity needed (least first), then by the traces that ran without an OOM at the
        capacities asked for (most first), then by total OOMs, total peak reserved bytes and
        total device mallocs (least first).
    config : str
        The setting (``"defaults"``, a config string, or ``"recorded"``).
    traces : int
        Traces replayed without error under this setting (each recorded device of a snapshot
        counts as one).
    errors : int
        Combinations that failed.
    total_peak_reserved_bytes : int
        Sum over traces of the peak reserved bytes at the first capacity asked for (or the
        default capacity).
    total_device_mallocs : int
        Sum over traces of segments obtained from the device, at that same capacity.
    total_ooms : int
        Sum over traces of the allocations that ran out of memory, at that same capacity.
    fits : tuple of (int or None, int)
        For each capacity asked for (None: the default), how many traces ran without an OOM.
    total_min_capacity_bytes : int or None
        With ``find_capacity``: the sum of the smallest capacities over the traces that fit
        somewhere; None without it.
    max_min_capacity_bytes : int or None
        With ``find_capacity``: the largest of them, the device every trace fits on.
    unfit : int
        With ``find_capacity``: traces that no capacity fits.
    """

    rank: int
    config: str
    traces: int
    errors: int
    total_peak_reserved_bytes: int
    total_device_mallocs: int
    total_ooms: int
    fits: tuple[tuple[int | None, int], ...]
    total_min_capacity_bytes: int | None
    max_min_capacity_bytes: int | None
    unfit: int

    @property
    def env_value(self) -> str:
        """The setting as a ``PYTORCH_CUDA_ALLOC_CONF``/``ACCELRT_ALLOC_CONF`` value.

        ``""`` for the defaults (leave the variable unset).

        Raises
        ------
        ValueError
            For ``"recorded"``, which is each snapshot's own setting, not one string.
        """
        if self.config == RECORDED:
            raise ValueError(
                "the recorded settings differ from snapshot to snapshot; pick a named setting"
            )
        return "" if self.config == "defaults" else self.config

    def to_dict(self) -> dict[str, Any]:
        """Return the summary row as JSON-serialisable data (``fits`` as a list of objects)."""
        data = dataclasses.asdict(self)
        data["fits"] = [{"capacity": c, "traces": n} for c, n in self.fits]
        return data


class SweepResults(list[SweepResult]):
    """The results of :func:`sweep`: a list of :class:`SweepResult`, plus table helpers.

    Attributes
    ----------
    traces : list of str
        The traces, as given.
    configs : list of str
        The settings asked for, as labels (``"recorded"`` is added per snapshot trace).
    capacities : list of int or None
        The capacities asked for, in bytes (``[None]``: the default).
    find_capacity : bool
        Whether ``min_capacity_bytes`` was searched for.
    scheduler : str
        Where it ran (``"processes"``, ``"threads"``, ``"synchronous"`` or an address).

    Notes
    -----
    The list holds one entry per combination, in the order trace, recorded device (for a
    snapshot: every device with allocation history), setting (``"recorded"`` first for a
    snapshot), capacity.
    """

    def __init__(
        self,
        items: Iterable[SweepResult] = (),
        *,
        traces: Sequence[str] = (),
        configs: Sequence[str] = (),
        capacities: Sequence[int | None] = (None,),
        find_capacity: bool = False,
        scheduler: str = "synchronous",
    ) -> None:
        super().__init__(items)
        self.traces = list(traces)
        self.configs = list(configs)
        self.capacities = list(capacities)
        self.find_capacity = find_capacity
        self.scheduler = scheduler

    def to_dicts(self) -> list[dict[str, Any]]:
        """Return every combination's :meth:`SweepResult.to_dict`, in order."""
        return [r.to_dict() for r in self]

    def to_records(self) -> list[dict[str, Any]]:
        """Return every combination's :meth:`SweepResult.to_record` (scalars only)."""
        return [r.to_record() for r in self]

    def to_arrow(self) -> Any:
        """Return the results as a ``pyarrow.Table``, one row per combination.

        Raises
        ------
        ImportError
            If pyarrow is not installed (``pip install pyarrow``).
        """
        try:
            import pyarrow as pa
        except ImportError:
            raise ImportError("SweepResults.to_arrow needs pyarrow: pip install pyarrow") from None
        records = self.to_records()
        if not records:
            return pa.table({key: [] for key in SweepResult("", "", None).to_record()})
        return pa.Table.from_pylist(records)

    def to_pandas(self) -> Any:
        """Return the results as a ``pandas.DataFrame``, one row per combination.

        Raises
        ------
        ImportError
            If pandas is not installed (``pip install pandas``).
        """
        try:
            import pandas as pd
        except ImportError:
            raise ImportError("SweepResults.to_pandas needs pandas: pip install pandas") from None
        columns = list(SweepResult("", "", None).to_record())
        return pd.DataFrame.from_records(self.to_records(), columns=columns)

    def _first_capacity_rows(self) -> list[SweepResult]:
        first = self.capacities[0] if self.capacities else None
        return [r for r in self if r.capacity == first]

    def units(self) -> list[tuple[str, int | None]]:
        """Return ``(trace, recorded_device)`` of every trace the rows replay, in order: a
        snapshot's recorded devices each count (``recorded_device`` None: a JSONL trace, or a
        file that could not be read)."""
        return list(dict.fromkeys((r.trace, r.recorded_device) for r in self))

    def best(self, trace: str, recorded_device: int | None = None) -> SweepResult | None:
        """Return the best setting's result for one trace, at the first capacity asked for.

        The best runs out of memory the fewest times, then needs the least capacity (with
        ``find_capacity``), then reserves the least at its peak, then makes the fewest device
        mallocs.

        Parameters
        ----------
        trace : str
            The trace as given to :func:`sweep`.
        recorded_device : int, optional
            A snapshot's recorded device (see :meth:`units`); default: the best row of any.

        Returns
        -------
        SweepResult or None
            None when every combination of the trace (and device) failed.
        """
        rows = [
            r
            for r in self._first_capacity_rows()
            if r.trace == trace and r.report and recorded_device in (None, r.recorded_device)
        ]
        if not rows:
            return None
        return min(rows, key=_row_key)

    def summary(self) -> list[SettingSummary]:
        """Return the fleet summary: one :class:`SettingSummary` per setting, best first."""
        configs: list[str] = []
        for r in self:
            if r.config not in configs:
                configs.append(r.config)
        capacities = self.capacities or [None]
        first = capacities[0]
        rows: list[SettingSummary] = []
        for config in configs:
            mine = [r for r in self if r.config == config]
            at_first = [r for r in mine if r.capacity == first and r.report is not None]
            reports = [r.report for r in at_first if r.report is not None]
            needed = [r.min_capacity_bytes for r in at_first if r.min_capacity_bytes is not None]
            fits = tuple(
                (cap, sum(1 for r in mine if r.capacity == cap and r.num_ooms == 0))
                for cap in capacities
            )
            rows.append(
                SettingSummary(
                    rank=0,
                    config=config,
                    traces=len(at_first),
                    errors=sum(1 for r in mine if r.report is None),
                    total_peak_reserved_bytes=sum(r.peak_reserved_bytes for r in reports),
                    total_device_mallocs=sum(r.num_device_alloc for r in reports),
                    total_ooms=sum(r.num_ooms for r in reports),
                    fits=fits,
                    total_min_capacity_bytes=sum(needed) if self.find_capacity else None,
                    max_min_capacity_bytes=max(needed, default=0) if self.find_capacity else None,
                    unfit=len(at_first) - len(needed) if self.find_capacity else 0,
                )
            )

        def key(s: SettingSummary) -> tuple[int, ...]:
            fitting = sum(n for _, n in s.fits)
            tail = (-fitting, s.total_ooms, s.total_peak_reserved_bytes, s.total_device_mallocs)
            if self.find_capacity:
                return (-s.traces, s.unfit, s.total_min_capacity_bytes or 0, *tail)
            return (-s.traces, *tail)

        ranked = sorted(rows, key=key)  # stable: ties keep the order the settings were given
        return [dataclasses.replace(s, rank=i + 1) for i, s in enumerate(ranked)]

    def winner(self) -> SettingSummary | None:
        """Return the best-ranked named setting (``"recorded"`` is not one); None if none ran."""
        for s in self.summary():
            if s.config != RECORDED and s.traces:
                return s
        return None

    def to_json(self) -> dict[str, Any]:
        """Return what ``accelrt sweep --json`` prints.

        Returns
        -------
        dict
            ``traces``, ``configs``, ``capacities``, ``find_capacity``, ``scheduler``,
            ``results`` (one :meth:`SweepResult.to_dict` per combination), ``summary`` (the
            :meth:`summary` rows) and ``winner`` (``{"config", "PYTORCH_CUDA_ALLOC_CONF",
            "ACCELRT_ALLOC_CONF"}``, or None).
        """
        win = self.winner()
        return {
            "traces": self.traces,
            "configs": self.configs,
            "capacities": self.capacities,
            "find_capacity": self.find_capacity,
            "scheduler": self.scheduler,
            "results": self.to_dicts(),
            "summary": [s.to_dict() for s in self.summary()],
            "winner": None
            if win is None
            else {
                "config": win.config,
                "PYTORCH_CUDA_ALLOC_CONF": win.env_value,
                "ACCELRT_ALLOC_CONF": win.env_value,
            },
        }


def _row_key(r: SweepResult) -> tuple[int, int, int, int]:
    assert r.report is not None  # callers pass replayed rows only
    return (
        r.report.num_ooms,
        r.min_capacity_bytes if r.min_capacity_bytes is not None else MAX_BYTES,
        r.report.peak_reserved_bytes,
        r.report.num_device_alloc,
    )


# ---------------------------------------------------------------------------------------------
# planning (in the caller's process)


@dataclass(frozen=True)
class _Task:
    """One unit of work: some settings of one trace, replayed by one worker."""

    sweep_id: str
    source: str
    include_host: bool
    device_index: int | None
    candidates: tuple[Setting, ...]
    recorded: bool | None  # add the recording's settings: yes, no, or if the trace has one
    capacities: tuple[int | None, ...]
    find_capacity: bool
    env_capacity: int | None
    planned: int
    start: str = "modelled"


def _setting(value: Any, where: str, source: str) -> Setting:
    """A setting to try, from a :class:`Setting` (as it is) or what ``AllocatorConfig.coerce``
    takes (with ``source``); errors name ``where`` it was given."""
    if isinstance(value, Setting):
        if value.config is None:
            raise ValueError(
                f"a {where} without a config ({value!r}) would be each recording's own: "
                "pass recorded=True instead"
            )
        return value
    try:
        return Setting(AllocatorConfig.coerce(value), source)
    except (TypeError, ValueError) as exc:
        raise type(exc)(f"{exc} (in {where} {_shown(value)})") from None


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _split_values(text: str) -> list[str]:
    """Split ``V1,V2,...`` at the commas outside brackets (``[256:1,>:4]`` is one value)."""
    values, depth, start = [], 0, 0
    for i, ch in enumerate(text):
        if ch == "[":
            depth += 1
        elif ch == "]":
            depth -= 1
        elif ch == "," and depth == 0:
            values.append(text[start:i])
            start = i + 1
    values.append(text[start:])
    return [v.strip() for v in values]


def parse_grid(spec: str) -> tuple[str, list[str]]:
    """Parse one ``--grid KEY=V1,V2,...`` option.

    Parameters
    ----------
    spec : str
        E.g. ``"max_split_size_mb=128,256"`` or ``"roundup_power2_divisions=[256:1,>:4],8"``
        (commas inside brackets belong to the value).

    Returns
    -------
    (str, list of str)
        The key and its values.

    Raises
    ------
    ValueError
        If there is no ``=``, no key, or an empty value. Keys and values are checked later,
        as settings, by :func:`sweep`.
    """
    key, sep, rest = spec.partition("=")
    key = key.strip()
    if not sep or not key or not rest.strip():
        raise InputError(
            f"a grid is KEY=V1,V2,..., such as max_split_size_mb=128,256; got {_shown(spec)}"
        )
    values = _split_values(rest)
    if any(not v for v in values):
        raise InputError(f"grid {_shown(spec)} has an empty value; separate values with one comma")
    return key, values


def _candidates(configs: Sequence[Any], grid: Sequence[tuple[str, Sequence[Any]]]) -> list[Setting]:
    """The settings to try: every config, then every combination of the grid; no duplicates."""
    out: list[Setting] = []
    seen: set[AllocatorConfig | None] = set()

    def add(setting: Setting) -> None:
        if setting.config not in seen:
            seen.add(setting.config)
            out.append(setting)

    for value in configs:
        add(_setting(value, "setting", "configs"))
    checked: list[tuple[str, list[Any]]] = []
    for key, values in grid:
        if not isinstance(key, str) or not key.strip():
            raise ValueError(f"a grid key must be a setting's name, got {_shown(key)}")
        if isinstance(values, (str, bytes)) or not isinstance(values, Iterable):
            raise TypeError(
                f"grid {key!r}: give a list of values, such as [128, 256], got {_shown(values)}"
            )
        checked.append((key.strip(), list(values)))
        if not checked[-1][1]:
            raise ValueError(f"grid {key!r} has no values; give at least one")
    axes = [[(key, _grid_value(v)) for v in values] for key, values in checked]
    for combination in itertools.product(*axes) if axes else ():
        text = ",".join(f"{k}:{v}" for k, v in combination)
        add(_setting(text, "grid setting", "grid"))
    if not out:
        out.append(Setting(AllocatorConfig(), "defaults"))
    return out


def _grid_value(value: Any) -> str:
    return str(value).strip() if not isinstance(value, str) else value.strip()


def _check_scheduler(scheduler: Any) -> str | Any:
    if scheduler is None:  # Dask's convention, as Client() has it, else every local core
        from_env = os.environ.get("DASK_SCHEDULER_ADDRESS", "").strip()
        if not from_env:
            return "processes"
        try:
            return _check_scheduler(from_env)
        except InputError as exc:
            raise InputError(f"DASK_SCHEDULER_ADDRESS: {exc}") from None
    if not isinstance(scheduler, str):
        if type(scheduler).__name__ == "Client" and hasattr(scheduler, "submit"):
            return scheduler
        raise TypeError(
            f"scheduler must be a string or a dask.distributed Client, got {_shown(scheduler)}"
        )
    text = scheduler.strip()
    if text in SCHEDULERS:
        return text
    if "://" in text:
        match = _ADDRESS_RE.fullmatch(text)
        if match is None or not 0 < int(match.group(3)) < 65536:
            raise InputError(
                f"invalid scheduler address {_shown(scheduler)}: expected tcp://HOST:PORT with "
                "a port from 1 to 65535, such as tcp://127.0.0.1:8786"
            )
        return text
    raise InputError(
        f"unknown scheduler {_shown(scheduler)}: give processes, threads, synchronous or the "
        "address of a dask.distributed scheduler, tcp://HOST:PORT"
    )


def _is_url(source: str) -> bool:
    return "://" in source or "::" in source


def _local_kind(source: str) -> str | None:
    """What a local file is (``sniff``), or None for a URL or a file that cannot be read."""
    if _is_url(source):
        return None
    from .trace._format import sniff

    try:
        return sniff(source)
    except OSError:
        return "missing"


def _cpu_count() -> int:
    if hasattr(os, "sched_getaffinity"):
        return max(1, len(os.sched_getaffinity(0)))
    return max(1, os.cpu_count() or 1)


def _chunks(items: Sequence[Setting], k: int) -> list[tuple[Setting, ...]]:
    k = max(1, min(k, len(items)))
    size, extra = divmod(len(items), k)
    out, start = [], 0
    for i in range(k):
        end = start + size + (1 if i < extra else 0)
        out.append(tuple(items[start:end]))
        start = end
    return out


def sweep(
    traces: str | os.PathLike[str] | Sequence[str | os.PathLike[str]],
    configs: Sequence[str | AllocatorConfig | Mapping[str, Any]] | str | None = None,
    *,
    grid: Mapping[str, Sequence[Any]] | Sequence[tuple[str, Sequence[Any]]] | None = None,
    capacities: Sequence[int | str | None] | int | str | None = None,
    find_capacity: bool = False,
    scheduler: str | Any | None = None,
    num_workers: int | None = None,
    include_host: bool = False,
    device_index: int | None = None,
    recorded: bool = True,
    progress: ProgressCallback | None = None,
    connect_timeout: float = CONNECT_TIMEOUT,
    start: str = "modelled",
    scheduler_file: str | os.PathLike[str] | None = None,
    on_connect: Callable[[Any], None] | None = None,
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
        ``scheduler`` and ``scheduler_file`` are given.
    KeyboardInterrupt
        On Ctrl-C; pending work is cancelled and local worker processes are stopped.

    Notes
    -----
    A trace that is missing or malformed does not stop the others: its combinations carry
    the error. Each worker loads a trace once for all the settings it is given: a trace's
    settings are split into as many tasks as keep every worker busy. The capacity search
    assumes that more memory never makes a replay fail; its result fits, and one
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
        raise ValueError(f"num_workers must be a whole number >= 1, got {_shown(num_workers)}")
    if device_index is not None and (
        isinstance(device_index, bool) or not isinstance(device_index, int) or device_index < 0
    ):
        raise ValueError(f"device_index must be a whole number >= 0, got {_shown(device_index)}")
    if isinstance(connect_timeout, bool) or not (
        isinstance(connect_timeout, (int, float)) and 0 < connect_timeout < math.inf
    ):
        raise ValueError(f"connect_timeout must be seconds > 0, got {_shown(connect_timeout)}")
    check_start(start)  # here, before any worker starts
    env_capacity = _env_capacity()
    if importlib.util.find_spec("dask") is None:  # imported later, while workers start
        raise ImportError("accelrt sweep needs Dask: pip install 'accelrt[sweep]'", name="dask")

    client, owned = None, False
    if scheduler_file is not None:
        if scheduler is not None:
            raise InputError(
                f"give a scheduler or a scheduler file, not both (scheduler {_shown(scheduler)}, "
                f"scheduler_file {_shown(scheduler_file)})"
            )
        client, owned = _connect_file(os.fspath(scheduler_file), connect_timeout), True
    elif not isinstance(where, str):
        client = where
    elif "://" in where:
        client = _connect(where, connect_timeout)
        owned = True
    try:
        if owned:
            _check_versions(client)
            if on_connect is not None:
                on_connect(client)
        if client is not None:
            workers = max(1, sum(client.nthreads().values()))
        else:
            workers = 1 if where == "synchronous" else (num_workers or _cpu_count())
        sweep_id = uuid.uuid4().hex
        tasks, sizes = [], []
        target = workers * (2 if find_capacity else 1)
        per_trace = max(1, math.ceil(target / len(paths)))
        for path in paths:
            kind = _local_kind(path)
            rec: bool | None = (kind == "pickle") if kind is not None else None
            rec = rec if recorded else False
            for i, chunk in enumerate(_chunks(candidates, per_trace)):
                with_rec = rec if i == 0 else False
                tasks.append(
                    _Task(
                        sweep_id=sweep_id,
                        source=path,
                        include_host=include_host,
                        device_index=device_index,
                        candidates=chunk,
                        recorded=with_rec,
                        capacities=tuple(caps),
                        find_capacity=find_capacity,
                        env_capacity=env_capacity,
                        planned=(len(chunk) + bool(with_rec)) * len(caps),
                        start=start,
                    )
                )
                sizes.append(_size_of(path))
        if client is not None:
            named = isinstance(where, str) and scheduler_file is None
            name = where if named else str(client.scheduler.address)
            rows = _run_distributed(client, tasks, sizes, progress)
        else:
            name = where
            rows = _run_local(where, tasks, sizes, min(workers, len(tasks)), progress)
    finally:
        if owned and client is not None:
            with contextlib.suppress(Exception):
                client.close()
    labels = [c.label for c in candidates]
    if recorded and any(r.config == RECORDED for r in rows):
        labels.insert(0, RECORDED)
    return SweepResults(
        rows,
        traces=paths,
        configs=labels,
        capacities=caps,
        find_capacity=find_capacity,
        scheduler=name,
    )


def _check_traces(traces: Any) -> list[str]:
    if isinstance(traces, (str, os.PathLike)):
        traces = [traces]
    if isinstance(traces, (bytes, bytearray)) or not isinstance(traces, Iterable):
        raise TypeError(f"traces must be a path, a URL or a list of them, got {_shown(traces)}")
    paths = []
    for t in traces:
        if not isinstance(t, (str, os.PathLike)):
            raise TypeError(f"a trace must be a path or a URL (str), got {_shown(t)}")
        text = os.fspath(t)
        if not isinstance(text, str) or not text.strip():
            raise InputError(f"a trace name is empty ({_shown(text)}); give a path or a URL")
        paths.append(text)
    if not paths:
        raise ValueError("no traces given; give at least one path or URL")
    return paths


def _check_capacities(capacities: Any) -> list[int | None]:
    if capacities is None or isinstance(capacities, (int, str)):
        capacities = [capacities]
    caps: list[int | None] = []
    for c in capacities:
        value = None if c is None else parse_bytes(c, name="capacity")
        if value == 0:
            raise InputError("capacity 0 holds nothing; give a size such as 80GiB")
        if value not in caps:
            caps.append(value)
    return caps or [None]


def _env_capacity() -> int | None:
    """``ACCELRT_SIM_CAPACITY`` here, so that workers elsewhere replay under the same default."""
    from .backends.sim import ENV_CAPACITY

    text = os.environ.get(ENV_CAPACITY)
    return parse_bytes(text, name=ENV_CAPACITY) if text else None


def _size_of(path: str) -> int:
    try:
        return os.path.getsize(path) if not _is_url(path) else 0
    except OSError:
        return 0


def _connect(address: str, timeout: float) -> Any:
    try:
        from distributed import Client
    except ImportError:
        raise ImportError(
            f"--scheduler {address} needs dask.distributed: pip install 'accelrt[sweep]'",
            name="distributed",
        ) from None
    try:
        if address.startswith("tcp://"):
            _check_dask_answers(address, timeout)
        return Client(address, timeout=timeout, set_as_default=False)
    except _NotAScheduler:
        raise
    except (OSError, TimeoutError):
        raise ConnectionError(
            f"cannot reach the Dask scheduler at {address} within {timeout:g} s; check the "
            "address, or start one there with `dask scheduler`"
        ) from None


def _connect_file(path: str, timeout: float) -> Any:
    """A ``Client`` of the scheduler a ``--scheduler-file`` JSON names."""
    from distributed import Client

    if not os.path.isfile(path):
        raise FileNotFoundError(
            f"scheduler file {path!r} does not exist; `dask scheduler --scheduler-file PATH` "
            "writes it"
        )
    try:
        return Client(scheduler_file=path, timeout=timeout, set_as_default=False)
    except (OSError, TimeoutError):
        raise ConnectionError(
            f"cannot reach the Dask scheduler that {path!r} names within {timeout:g} s"
        ) from None


def _check_versions(client: Any) -> None:
    """Refuse a cluster whose scheduler or workers run other versions than this client."""
    try:
        client.get_versions(check=True, packages=["accelrt"])
    except ValueError as exc:
        raise InputError(
            f"the Dask scheduler or workers at {client.scheduler.address} run other versions "
            f"than this client; install the same ones there: {_one_line(str(exc))}"
        ) from None


class _NotAScheduler(ConnectionError):
    """Something answered at a scheduler address, but not a Dask scheduler."""


def _check_dask_answers(address: str, timeout: float) -> None:
    """Refuse, within ``timeout`` seconds, a ``tcp://`` address where no Dask scheduler listens.

    A Dask scheduler sends its handshake (a framed msgpack map naming ``pickle-protocol``) as
    soon as it accepts a connection; ``Client`` waits for it without a limit, so another server
    there (the dashboard's HTTP port, 8787, is the usual mistake) hung the sweep for ever.

    Raises
    ------
    OSError
        If nothing accepts the connection within ``timeout`` (the caller's message).
    _NotAScheduler
        A ``ConnectionError``: something answered but is not a Dask scheduler; the message
        names the address and what answered.
    """
    match = _ADDRESS_RE.fullmatch(address)
    assert match is not None  # checked by _check_scheduler
    host, port = match.group(2).strip("[]"), int(match.group(3))
    asking = min(1.0, timeout / 4)  # the end of the timeout: to ask a silent server what it is
    with socket.create_connection((host, port), timeout=timeout - asking) as probe:
        try:
            first = probe.recv(256)
        except TimeoutError:
            first = None
        if first is not None and b"pickle-protocol" in first:
            return
        if first is None:  # silent: ask it as an HTTP client would, to say what it is
            probe.settimeout(asking)
            with contextlib.suppress(OSError):
                probe.sendall(b"HEAD / HTTP/1.0\r\n\r\n")
                first = probe.recv(256)
    if first and first.startswith(b"HTTP/"):
        status = first.split(b"\r\n", 1)[0].decode("ascii", "backslashreplace")
        what = f"an HTTP server answered ({status!r}): the Dask dashboard listens on 8787"
    elif first:
        what = f"something answered with {first[:32]!r}, not Dask's handshake"
    else:
        what = f"something accepted the connection but sent nothing within {timeout:g} s"
    raise _NotAScheduler(
        f"{address} is not a Dask scheduler: {what}; give the scheduler's own address "
        "(tcp://HOST:8786 by default, printed by `dask scheduler`)"
    )


# ---------------------------------------------------------------------------------------------
# running the tasks


def _ignore_sigint() -> None:
    """Worker processes leave Ctrl-C to the caller, which stops them."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def _pool_context() -> Any:
    """The multiprocessing context for the workers, its fork server started if it has one.

    Workers are forked from a fork server that has imported accelrt once ("forkserver": no
    threads of this process are copied, and a pool starts in milliseconds once the server
    runs); where there is none (Windows), they are fresh interpreters ("spawn"). The server
    starts with Ctrl-C blocked, and so do the workers it forks (until they ignore it): Ctrl-C
    is this process's to handle, and it stops them.
    """
    if "forkserver" not in multiprocessing.get_all_start_methods():
        return multiprocessing.get_context("spawn")
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload([__name__])
    from multiprocessing import forkserver, resource_tracker

    resource_tracker.ensure_running()  # (it blocks Ctrl-C itself while it starts)
    # a blocked signal stays blocked in a new program; a Ctrl-C meanwhile waits, not lost
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    try:
        forkserver.ensure_running()
    finally:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
    return context


@contextlib.contextmanager
def _sigint_deferred() -> Iterator[list[int]]:
    """Hold back Ctrl-C inside the block; the list it gives says whether one came."""
    came: list[int] = []
    if threading.current_thread() is not threading.main_thread():
        yield came
        return
    previous = signal.signal(signal.SIGINT, lambda signum, frame: came.append(signum))
    try:
        yield came
    finally:
        signal.signal(signal.SIGINT, previous)


def _start_pool(context: Any, workers: int) -> Any:
    """Start the worker processes; a Ctrl-C meanwhile stops them once they are all known.

    (A worker left starting when this process exits would print a traceback.)
    """
    with _sigint_deferred() as interrupted:
        pool = context.Pool(workers, _ignore_sigint)
    if interrupted:
        pool.terminate()
        pool.join()
        raise KeyboardInterrupt
    return pool


def _run_local(
    scheduler: str,
    tasks: list[_Task],
    sizes: list[int],
    workers: int,
    progress: ProgressCallback | None,
) -> list[SweepResult]:
    sweep_id = tasks[0].sweep_id
    pool = None
    try:
        # the fork server imports accelrt while this process imports Dask
        context = _pool_context() if scheduler == "processes" else None
        import dask
        from dask.callbacks import Callback

        if context is not None:
            pool = _start_pool(context, workers)

        # the local schedulers run ready tasks by key, highest first: number them so that the
        # largest traces start first and the small ones fill in at the end
        order = sorted(range(len(tasks)), key=lambda i: (-sizes[i], i))
        keys = {i: f"accelrt-sweep-{len(tasks) - rank:06d}" for rank, i in enumerate(order)}
        delayed = [
            dask.delayed(_run_task, pure=False)(task, dask_key_name=keys[i])
            for i, task in enumerate(tasks)
        ]
        counter = _Counter(tasks, keys, progress)

        class _Progress(Callback):  # type: ignore[misc]
            def _posttask(self, key: Any, result: Any, dsk: Any, state: Any, worker: Any) -> None:
                counter.done(key, result)

        kwargs: dict[str, Any] = {"scheduler": scheduler}
        if pool is not None:
            kwargs.update(pool=pool, chunksize=1)
        elif scheduler == "threads":
            kwargs.update(num_workers=workers)
        counter.start()
        with _Progress():
            out = dask.compute(*delayed, **kwargs)
    except BaseException:
        _CANCELLED.add(sweep_id)  # threads: running replays stop at their next check
        if pool is not None:
            pool.terminate()
        raise
    finally:
        if pool is not None:
            pool.close()
            pool.join()
        _forget(sweep_id)
    return [row for rows in out for row in rows]


class _Counter:
    """Combinations done, for the progress callback."""

    def __init__(
        self, tasks: list[_Task], keys: Mapping[int, str], progress: ProgressCallback | None
    ) -> None:
        self.planned = {keys[i]: t.planned for i, t in enumerate(tasks)}
        self.total = sum(self.planned.values())
        self.count = 0
        self.progress = progress

    def start(self) -> None:
        if self.progress is not None:
            self.progress(0, self.total)

    def done(self, key: Any, rows: Sequence[SweepResult]) -> None:
        planned = self.planned.pop(key, None)
        if planned is None:
            return
        self.total += len(rows) - planned  # a URL's snapshot adds its recorded setting
        self.count += len(rows)
        if self.progress is not None:
            self.progress(self.count, self.total)


def _run_distributed(
    client: Any, tasks: list[_Task], sizes: list[int], progress: ProgressCallback | None
) -> list[SweepResult]:
    from distributed import as_completed

    keys = {i: f"accelrt-sweep-{t.sweep_id}-{i}" for i, t in enumerate(tasks)}
    counter = _Counter(tasks, keys, progress)
    counter.start()
    futures = [
        client.submit(_run_task, task, key=keys[i], pure=False, priority=sizes[i])
        for i, task in enumerate(tasks)
    ]
    try:
        for future in as_completed(futures, loop=client.loop):
            counter.done(future.key, future.result())
        results = [f.result() for f in futures]
    except BaseException:
        client.cancel(futures)
        raise
    finally:
        with contextlib.suppress(Exception):
            client.run(_forget, tasks[0].sweep_id)  # the traces the workers keep loaded
    return [row for rows in results for row in rows]


# ---------------------------------------------------------------------------------------------
# in the workers


class _Cancelled(BaseException):
    """Raised inside a replay running on a thread of a sweep that was interrupted."""


_CANCELLED: set[str] = set()
_CACHE: OrderedDict[tuple[str, str, bool, int | None], list[Trace]] = OrderedDict()
_CACHE_LOCK = threading.Lock()
_CACHE_SIZE = 2


class _TraceError(Exception):
    """A trace could not be read; the message is the row's error."""


def _one_line(text: str) -> str:
    return " ".join(text.split())


_WHAT = "an accelrt trace (.jsonl.gz) or a PyTorch snapshot pickle"


def _error_text(shown: str, exc: BaseException) -> str:
    """A sweep row's one-line error: the input's fault (``InputError``, ``OSError``) as its
    message; anything else said to be a bug in accelrt."""
    if isinstance(exc, FileNotFoundError):
        text = f"{shown}: No such file or directory; give {_WHAT}"
    elif isinstance(exc, OSError) and exc.strerror:
        text = f"{shown}: {exc.strerror}"
    elif isinstance(exc, (InputError, OSError)):
        text = str(exc)
        if shown not in text:
            text = f"{shown}: {text}"
    else:  # not the input's fault: say so, as the command does for its own bugs
        text = (
            f"{shown}: internal error {type(exc).__name__}: {exc} (a bug in accelrt, not a "
            "problem with this trace; please report it)"
        )
    return _one_line(text)


def _read(task: _Task) -> list[Trace]:
    """Load the task's trace (a path, or a URL copied to a temporary file first): a snapshot's
    every recorded device with allocation history, or the one ``device_index`` names."""
    from .trace import load, read_snapshot
    from .trace._snapshot import traces_from_snapshot

    source = task.source
    local = source.removeprefix("file://") if source.startswith("file://") else source
    tmpdir = None
    try:
        if _is_url(local):
            import fsspec

            tmpdir = tempfile.mkdtemp(prefix="accelrt-sweep-")
            base = os.path.basename(source.split("::")[-1].split("?")[0].rstrip("/")) or "trace"
            copy = os.path.join(tmpdir, base)
            with fsspec.open(source, "rb") as src, open(copy, "wb") as dst:
                shutil.copyfileobj(src, dst, 1 << 20)
            local = copy
        kind = _local_kind(local)
        index = task.device_index if kind == "pickle" else None  # snapshots only
        try:
            if kind == "pickle" and index is None:
                traces = traces_from_snapshot(read_snapshot(local), path=local)
            else:
                traces = [load(local, include_host=task.include_host, device_index=index)]
        except Exception as exc:
            raise _TraceError(_error_text(source, exc).replace(local, source)) from None
        for trace in traces:
            trace.path = source
        return traces
    except _TraceError:
        raise
    except ImportError:
        raise _TraceError(f"{source}: reading URLs needs fsspec: pip install fsspec") from None
    except Exception as exc:
        raise _TraceError(_error_text(source, exc)) from None
    finally:
        if tmpdir is not None:
            shutil.rmtree(tmpdir, ignore_errors=True)


def _load_cached(task: _Task) -> list[Trace]:
    key = (task.sweep_id, task.source, task.include_host, task.device_index)
    with _CACHE_LOCK:
        traces = _CACHE.get(key)
        if traces is not None:
            _CACHE.move_to_end(key)
            return traces
    traces = _read(task)
    with _CACHE_LOCK:
        _CACHE[key] = traces
        while len(_CACHE) > _CACHE_SIZE:
            _CACHE.popitem(last=False)
    return traces


def _forget(sweep_id: str) -> None:
    """Drop the traces a finished sweep loaded in this process (threads, synchronous)."""
    with _CACHE_LOCK:
        for key in [k for k in _CACHE if k[0] == sweep_id]:
            del _CACHE[key]


def _run_task(task: _Task) -> list[SweepResult]:
    """Replay one task's combinations; errors become rows, never exceptions."""
    sweep_id = task.sweep_id

    def check(done: int, total: int) -> None:
        if sweep_id in _CANCELLED:
            raise _Cancelled

    candidates = list(task.candidates)
    recorded = Setting(None, RECORDED)
    try:
        traces = _load_cached(task)
    except _TraceError as exc:
        if task.recorded:
            candidates.insert(0, recorded)
        return [
            SweepResult(task.source, c.label, cap, error=str(exc), config_source=c.source)
            for c in candidates
            for cap in task.capacities
        ]
    snapshot = traces[0].recording is not None
    if snapshot and task.recorded is not False:
        candidates.insert(0, recorded)
    rows = []
    for trace in traces:  # a snapshot's recorded devices, one after another
        device = trace.recording.device if trace.recording is not None else None
        # ACCELRT_SIM_CAPACITY where the caller is, unless the trace gives its own
        own = snapshot or "device_capacity_bytes" in trace.header
        default_capacity = None if own else task.env_capacity
        for candidate in candidates:
            config = candidate.config
            needed = None
            if task.find_capacity:
                with contextlib.suppress(Exception):
                    needed = _min_capacity(trace, config, check, task.start)
            row = functools.partial(
                SweepResult,
                task.source,
                candidate.label,
                config_source=candidate.source,
                recorded_device=device,
            )
            for cap in task.capacities:
                capacity = default_capacity if cap is None else cap
                try:
                    report = replay(
                        trace,
                        device="sim",
                        capacity=capacity,
                        config=config,
                        progress=check,
                        start=task.start,
                    )
                except Exception as exc:
                    rows.append(row(cap, error=_error_text(task.source, exc)))
                    continue
                rows.append(row(cap, report, min_capacity_bytes=needed))
    return rows


LARGEST_CAPACITY = 1 << 62
"""The largest simulated capacity ``--find-capacity`` tries (4 EiB) before it answers "never"."""


def _min_capacity(
    trace: Trace, config: AllocatorConfig | None, check: ProgressCallback, start: str
) -> int | None:
    """The smallest multiple of GRANULARITY at which ``trace`` replays without an OOM.

    Bisection between a capacity known to fail (a step below the trace's live peak, which no
    allocator can hold in less) and one that fits (the peak reserved without a limit).
    """
    step = GRANULARITY

    def fits(capacity: int) -> bool:
        try:
            report = replay(
                trace, device="sim", capacity=capacity, config=config, progress=check, start=start
            )
        except ValueError:  # the recording's start state alone needs more
            return False
        return report.num_ooms == 0

    ceiling = UNLIMITED_CAPACITY  # 1 PiB, else up to LARGEST_CAPACITY for huge traces
    while True:
        free = replay(
            trace, device="sim", capacity=ceiling, config=config, progress=check, start=start
        )
        if not free.num_ooms:
            break
        if ceiling >= LARGEST_CAPACITY:
            return None  # a request larger than any device
        ceiling = min(ceiling * 16, LARGEST_CAPACITY)
    if free.peak_reserved_bytes == 0:
        return 0
    hi = min(-(-free.peak_reserved_bytes // step) * step, ceiling)
    while hi < ceiling and not fits(hi):
        hi = min(hi * 2, ceiling)  # the ceiling fits: it was just replayed
    lo = max(0, -(-free.peak_requested_bytes // step) * step - step)
    while hi - lo > step:
        mid = lo + (hi - lo) // (2 * step) * step
        if fits(mid):
            hi = mid
        else:
            lo = mid
    return hi


# ---------------------------------------------------------------------------------------------
# output (the command's)


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


def print_results(results: SweepResults, console: Any) -> None:
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
        cells = [
            str(s.rank),
            escape(setting_text(s.config, sources[s.config])),
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
