"""What the replay and snapshot commands share: reading a snapshot file (with a progress bar
where it is large), checking ``--device-index`` against it, the traces of its devices, a replay
with a progress bar, and the peaks summed over the recorded devices."""

from __future__ import annotations

import contextlib
import functools
import os
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any, TypedDict

from .._errors import InputError
from .._text import printable
from ._args import _input_file

if TYPE_CHECKING:
    from ..memory._config import Setting
    from ..replay import ReplayReport
    from ..trace import Trace
    from ..trace._plain_pickle import ByteProgress
    from ..trace._snapshot_schema import CheckedSnapshot, FileSnapshot


_SNAPSHOT = "a PyTorch memory snapshot pickle (torch.cuda.memory._dump_snapshot)"


_PROGRESS_BYTES = 8 << 20
"""Files from this size on show a progress bar while they are read (where one is shown)."""


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


def _read_snapshot_file(path: str, *, progress: bool = False) -> CheckedSnapshot:
    """Read and check a snapshot pickle, opening it once: first telling the user plainly when
    the file is something else; with ``progress``, show a progress bar over its bytes
    (:func:`_reading_progress`)."""
    from ..trace._snapshot_schema import read_checked_snapshot

    _input_file(path, _SNAPSHOT)
    with _reading_progress(path, progress) as report:
        return read_checked_snapshot(
            path, progress=report, expect=functools.partial(_refuse_other_kinds, path)
        )


def _refuse_other_kinds(path: str, kind: str) -> None:
    """Refuse a file that is not a snapshot pickle (``kind``: what ``sniff`` says it is)."""
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


def _check_device_index(
    path: str, snapshot: FileSnapshot, index: int | None, *, history: bool = True
) -> None:
    """Refuse a ``--device-index`` the same way in every command: a device the snapshot does not
    have (the message names those it has) or, where ``history`` matters and another device has
    some, one without allocation history."""
    from ..trace._snapshot import devices_text, devices_with_history, snapshot_devices

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


def _snapshot_traces(path: str, snapshot: CheckedSnapshot, index: int | None) -> list[Trace]:
    """The trace of every recorded device of a snapshot with allocation history, or of the one
    ``--device-index`` names (checked: :func:`_check_device_index`)."""
    from ..trace._snapshot import trace_from_snapshot, traces_from_snapshot

    _check_device_index(path, snapshot.data, index)
    if index is None:
        return traces_from_snapshot(snapshot, path=path)
    return [trace_from_snapshot(snapshot, device=index, path=path)]


def _replay_shown(trace: Trace, show_progress: bool, **kw: Any) -> ReplayReport:
    """:func:`accelrt.replay.replay` of ``trace``, with a progress bar on stderr when asked for
    and the trace is long (more than 50,000 events)."""
    from ..replay import replay

    if not show_progress or len(trace.events) <= 50_000:
        return replay(trace, **kw)
    from rich.console import Console
    from rich.markup import escape
    from rich.progress import Progress

    with Progress(transient=True, console=Console(stderr=True)) as bar:
        task = bar.add_task(f"replaying {escape(printable(trace.name))}", total=len(trace.events))
        return replay(trace, progress=lambda done, _total: bar.update(task, completed=done), **kw)


def _recorded_device(trace: Trace) -> int | None:
    return trace.recording.device if trace.recording is not None else None


class SettingTotals(TypedDict):
    """One setting's peaks summed over a snapshot's devices (``replay --json``'s ``totals``)."""

    config: str
    config_source: str
    devices: int
    peak_requested_bytes: int
    peak_reserved_bytes: int
    recorded_peak_reserved_bytes: int | None


def _totals(
    settings: Sequence[Setting], runs: Sequence[Sequence[ReplayReport]]
) -> list[SettingTotals]:
    """Per setting, the peaks summed over the devices (``runs``: reports device by device)."""
    totals: list[SettingTotals] = []
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
