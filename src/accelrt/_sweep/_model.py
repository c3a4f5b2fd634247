"""The results of a sweep: one row per combination, the fleet summary, the winner.

Plain data, picklable: workers build :class:`SweepResult` rows and send them back; the caller
gathers them into :class:`SweepResults`, which ranks the settings.
"""

from __future__ import annotations

import dataclasses
import importlib
import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from types import ModuleType
from typing import TYPE_CHECKING

from .._units import MAX_BYTES
from .._verdict import oom_verdict
from ..memory._config import RECORDED, AllocatorConfig
from ..replay import ReplayReport

if TYPE_CHECKING:
    import pandas
    import pyarrow

_REPORT_KEYS = tuple(
    f.name
    for f in dataclasses.fields(ReplayReport)
    if f.name not in ("segment_maps", "memory_stats", "trace", "config")
)


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

    def to_dict(self) -> dict[str, object]:
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
        data: dict[str, object] = {
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

    def to_record(self) -> dict[str, object]:
        """Return :meth:`to_dict` with scalar values only, for CSV, Parquet and data frames.

        ``ooms`` (a list) is left out (``num_ooms`` counts them) and ``notes`` are joined
        with ``"; "``.
        """
        data = self.to_dict()
        del data["ooms"]
        notes = data["notes"]
        data["notes"] = "; ".join(notes) if isinstance(notes, list) else None  # (or None)
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

    @property
    def accelrt_only(self) -> bool:
        """Whether only accelrt can use the setting: it names ``policy:accelrt``, which
        PyTorch's allocator does not have (docs/allocator.md section 16)."""
        if self.config == RECORDED:
            return False
        return AllocatorConfig.parse(self.config).accelrt_only

    def to_dict(self) -> dict[str, object]:
        """Return the summary row as JSON-serialisable data (``fits`` as a list of objects)."""
        data = dataclasses.asdict(self)
        data["fits"] = [{"capacity": c, "traces": n} for c, n in self.fits]
        data["accelrt_only"] = self.accelrt_only
        return data


def _optional(package: str, method: str) -> ModuleType:
    """Import ``package`` for ``SweepResults.<method>``, or raise an ``ImportError`` that says
    how to install it."""
    try:
        return importlib.import_module(package)
    except ImportError:
        raise ImportError(f"SweepResults.{method} needs {package}: pip install {package}") from None


def _record_columns() -> list[str]:
    """The columns of :meth:`SweepResult.to_record`, in order (those of an empty table)."""
    return list(SweepResult("", "", None).to_record())


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

    def to_dicts(self) -> list[dict[str, object]]:
        """Return every combination's :meth:`SweepResult.to_dict`, in order."""
        return [r.to_dict() for r in self]

    def to_records(self) -> list[dict[str, object]]:
        """Return every combination's :meth:`SweepResult.to_record` (scalars only)."""
        return [r.to_record() for r in self]

    def to_arrow(self) -> pyarrow.Table:
        """Return the results as a ``pyarrow.Table``, one row per combination.

        Raises
        ------
        ImportError
            If pyarrow is not installed (``pip install pyarrow``).
        """
        pa = _optional("pyarrow", "to_arrow")
        records = self.to_records()
        if not records:
            return pa.table({key: [] for key in _record_columns()})
        return pa.Table.from_pylist(records)

    def to_pandas(self) -> pandas.DataFrame:
        """Return the results as a ``pandas.DataFrame``, one row per combination.

        Raises
        ------
        ImportError
            If pandas is not installed (``pip install pandas``).
        """
        pd = _optional("pandas", "to_pandas")
        return pd.DataFrame.from_records(self.to_records(), columns=_record_columns())

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

    def winner(self, *, pytorch: bool = False) -> SettingSummary | None:
        """Return the best-ranked named setting (``"recorded"`` is not one); None if none ran.

        With ``pytorch``, the best one PyTorch can use too (not ``accelrt_only``).
        """
        for s in self.summary():
            if s.config != RECORDED and s.traces and not (pytorch and s.accelrt_only):
                return s
        return None

    def to_json(self) -> dict[str, object]:
        """Return what ``accelrt sweep --json`` prints.

        Returns
        -------
        dict
            ``traces``, ``configs``, ``capacities``, ``find_capacity``, ``scheduler``,
            ``results`` (one :meth:`SweepResult.to_dict` per combination), ``summary`` (the
            :meth:`summary` rows) and ``winner`` (``{"config", "PYTORCH_CUDA_ALLOC_CONF",
            "ACCELRT_ALLOC_CONF", "accelrt_only"}``, or None; ``PYTORCH_CUDA_ALLOC_CONF`` is the
            best setting PyTorch can use, which differs when the winner is accelrt only, and
            None when no such setting ran).
        """
        win = self.winner()
        for_torch = self.winner(pytorch=True)
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
                "PYTORCH_CUDA_ALLOC_CONF": None if for_torch is None else for_torch.env_value,
                "ACCELRT_ALLOC_CONF": win.env_value,
                "accelrt_only": win.accelrt_only,
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
