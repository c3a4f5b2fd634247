"""What a worker does: load a task's trace (once for all its settings, kept in a small
cache), replay every combination and turn every error into a row's one-line message."""

from __future__ import annotations

import contextlib
import functools
import os
import shutil
import tempfile
import threading
from collections import OrderedDict
from typing import TYPE_CHECKING

from .._errors import InputError
from .._text import one_line
from ..memory._config import RECORDED, Setting
from ..replay import replay
from ._capacity import _min_capacity
from ._model import SweepResult
from ._plan import _is_url, _local_kind, _Task

if TYPE_CHECKING:
    from ..trace import Trace


class _Cancelled(BaseException):
    """Raised inside a replay running on a thread of a sweep that was interrupted."""


_CANCELLED: set[str] = set()
_CACHE: OrderedDict[tuple[str, str, bool, int | None], list[Trace]] = OrderedDict()
_CACHE_LOCK = threading.Lock()
_CACHE_SIZE = 2


class _TraceError(Exception):
    """A trace could not be read; the message is the row's error."""


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
    return one_line(text)


def _read(task: _Task) -> list[Trace]:
    """Load the task's trace (a path, or a URL copied to a temporary file first): a snapshot's
    every recorded device with allocation history, or the one ``device_index`` names."""
    from ..trace import load
    from ..trace._snapshot import traces_from_snapshot
    from ..trace._snapshot_schema import read_checked_snapshot

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
                traces = traces_from_snapshot(read_checked_snapshot(local), path=local)
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


def _run_batch(batch: tuple[_Task, ...]) -> list[SweepResult]:
    """Run a batch of tasks (one Dask task: small traces together), one after the other."""
    return [row for task in batch for row in _run_task(task)]
