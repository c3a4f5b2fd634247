"""Planning, in the caller's process: the traces and capacities checked, the work as tasks."""

from __future__ import annotations

import dataclasses
import math
import os
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from .._errors import InputError
from .._text import shown
from .._units import parse_bytes
from ..memory._config import RECORDED, Setting

if TYPE_CHECKING:
    from ._resume import _ResultsFile

ProgressCallback = Callable[[int, int], None]


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


def _check_traces(
    traces: str | os.PathLike[str] | Sequence[str | os.PathLike[str]],
) -> list[str]:
    if isinstance(traces, (str, os.PathLike)):
        traces = [traces]
    if isinstance(traces, (bytes, bytearray)) or not isinstance(traces, Iterable):
        raise TypeError(f"traces must be a path, a URL or a list of them, got {shown(traces)}")
    paths = []
    for t in traces:
        if not isinstance(t, (str, os.PathLike)):
            raise TypeError(f"a trace must be a path or a URL (str), got {shown(t)}")
        text = os.fspath(t)
        if not isinstance(text, str) or not text.strip():
            raise InputError(f"a trace name is empty ({shown(text)}); give a path or a URL")
        paths.append(text)
    if not paths:
        raise ValueError("no traces given; give at least one path or URL")
    return paths


def _check_capacities(
    capacities: Sequence[int | str | None] | int | str | None,
) -> list[int | None]:
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
    from ..backends.sim import ENV_CAPACITY

    text = os.environ.get(ENV_CAPACITY)
    return parse_bytes(text, name=ENV_CAPACITY) if text else None


def _is_url(source: str) -> bool:
    return "://" in source or "::" in source


def _local_kind(source: str) -> str | None:
    """What a local file is (``sniff``), or None for a URL or a file that cannot be read."""
    if _is_url(source):
        return None
    from ..trace._format import sniff

    try:
        return sniff(source)
    except OSError:
        return "missing"


def _size_of(path: str) -> int:
    try:
        return os.path.getsize(path) if not _is_url(path) else 0
    except OSError:
        return 0


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


def _plan_tasks(
    base: _Task,
    paths: Sequence[str],
    candidates: Sequence[Setting],
    recorded: bool,
    target: int,
    done: _ResultsFile | None,
) -> tuple[list[_Task], list[int]]:
    """The tasks (``base`` with a trace and some of its settings each) and their traces' sizes.

    A trace's settings are split into enough tasks to give ``target`` tasks in all; a
    snapshot's recorded settings go with its first task. The combinations a resumed results
    file holds are left out (a trace with none left has no task).
    """
    tasks, sizes = [], []
    per_trace = max(1, math.ceil(target / len(paths)))
    for path in paths:
        kind = _local_kind(path)
        rec: bool | None = (kind == "pickle") if kind is not None else None
        rec = rec if recorded else False
        todo = list(candidates)
        if done is not None:
            todo = [c for c in todo if not done.done(path, c.label)]
            seen = done.devices(path)
            if done.done(path, RECORDED):
                rec = False
            elif rec is None and seen:  # a URL read before: a snapshot if its rows have devices
                rec = seen != {None}
        for i, chunk in enumerate(_chunks(todo, per_trace)):
            with_rec = rec if i == 0 else False
            if chunk or with_rec is not False:
                planned = (len(chunk) + bool(with_rec)) * len(base.capacities)
                tasks.append(
                    dataclasses.replace(
                        base, source=path, candidates=chunk, recorded=with_rec, planned=planned
                    )
                )
                sizes.append(_size_of(path))
    return tasks, sizes


BATCHES_PER_WORKER = 4
"""Small local traces are batched into Dask tasks of at most 1/4 of a worker's share of the
traces' bytes, so that many short replays are not dominated by per-task overhead."""


def _batches(
    tasks: Sequence[_Task], sizes: Sequence[int], target: int
) -> tuple[list[tuple[_Task, ...]], list[int]]:
    """The tasks batched into Dask tasks, and each batch's bytes of traces.

    Tasks of local traces smaller than ``1 / (BATCHES_PER_WORKER * target)`` of all the traces'
    bytes go together (consecutive ones, up to that many bytes); the others, and URLs (whose
    size is not known here), are a batch each.
    """
    limit = sum(sizes) / (BATCHES_PER_WORKER * target)
    batches: list[list[_Task]] = []
    totals: list[int] = []
    joinable = False  # whether the last batch takes more small traces
    for task, size in zip(tasks, sizes, strict=True):
        small = not _is_url(task.source) and size < limit
        if small and joinable and totals[-1] + size <= limit:
            batches[-1].append(task)
            totals[-1] += size
        else:
            batches.append([task])
            totals.append(size)
        joinable = small
    return [tuple(b) for b in batches], totals
