"""The results file: every finished row appended to a JSON Lines file as its task completes, and
read back to resume an interrupted sweep with only the combinations it lacks.

The file's first line is a header naming the sweep (its traces, settings, capacities and the
options that change a row); every other line is one :class:`SweepResult`, its replay report in
full (but for ``segment_maps``, which a sweep never captures). A task's rows are appended with
one ``write`` to a file opened for appending, so a kill leaves whole tasks and at most one
truncated last line, which a resume drops.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import tempfile
from collections import defaultdict
from collections.abc import Iterable, Sequence
from typing import Any

from .._errors import InputError
from .._text import shown
from ..replay import OomRecord, ReplayReport
from ._model import SweepResult

_FORMAT = "accelrt sweep results"
_VERSION = 1


def _row_line(row: SweepResult) -> str:
    data = dataclasses.asdict(row)
    if data["report"] is not None:
        del data["report"]["segment_maps"]
    return json.dumps(data, separators=(",", ":")) + "\n"


def _row_from(data: Any) -> SweepResult:
    """The row a line holds; TypeError, KeyError or ValueError for one that holds none."""
    report = data["report"]
    if report is not None:
        ooms = [OomRecord(**o) for o in report.pop("ooms")]
        report = ReplayReport(**report, ooms=ooms)
    return SweepResult(**{**data, "report": report})


class _ResultsFile:
    """A sweep's results file, open for appending.

    Parameters
    ----------
    path : str
        The file.
    header : dict
        What identifies the sweep (JSON data); a resumed file must hold the same.
    resume : bool
        Keep the rows of whole (trace, setting) combinations the file already holds (in
        :attr:`rows`); else the file must be missing or empty.

    Raises
    ------
    InputError
        If the file is not a sweep's results file, belongs to a sweep with other arguments,
        holds results and ``resume`` is False, or has a line (not the last) that is not a row.
    OSError
        If the file cannot be read or written.
    """

    def __init__(self, path: str, header: dict[str, Any], resume: bool) -> None:
        self.path = path
        self.header = {"format": _FORMAT, "version": _VERSION, **header}
        self.rows: list[SweepResult] = []
        lines = self._read_lines()
        if lines:
            self._check_header(lines[0])
            if not resume:
                raise InputError(
                    f"{path} already holds sweep results; resume it (--resume, resume=True) or "
                    "give a new file"
                )
            self.rows = self._whole(self._parse(lines[1:]))
        self._done = {(r.trace, r.config) for r in self.rows}
        self._rewrite()  # the header and the rows kept, nothing else (a truncated line)
        self._fd = os.open(path, os.O_WRONLY | os.O_APPEND)

    def _read_lines(self) -> list[str]:
        """The file's complete lines (a last one without its newline was cut by a kill)."""
        try:
            with open(self.path, encoding="utf-8", errors="surrogateescape") as f:
                text = f.read()
        except FileNotFoundError:
            return []
        return text.split("\n")[:-1]

    def _check_header(self, line: str) -> None:
        try:
            theirs = json.loads(line)
        except ValueError:
            theirs = None
        if not isinstance(theirs, dict) or theirs.get("format") != _FORMAT:
            raise InputError(f"{self.path} is not an accelrt sweep results file; give another")
        for key, ours in self.header.items():
            if theirs.get(key) != json.loads(json.dumps(ours)):
                raise InputError(
                    f"{self.path} holds another sweep's results ({key} {shown(theirs.get(key))}"
                    f", this sweep's {shown(ours)}); resume with the same arguments, or give a "
                    "new file"
                )

    def _parse(self, lines: Sequence[str]) -> list[SweepResult]:
        rows = []
        for number, line in enumerate(lines, start=2):
            try:
                rows.append(_row_from(json.loads(line)))
            except (ValueError, TypeError, KeyError, AttributeError):
                raise InputError(
                    f"{self.path} line {number} is not a sweep result ({shown(line)}); give "
                    "another file"
                ) from None
        return rows

    def _whole(self, rows: Iterable[SweepResult]) -> list[SweepResult]:
        """The rows of (trace, setting) combinations done: replayed without error, at every
        capacity, on every recorded device the trace's rows show (a task's rows are written
        together, so the devices of one setting are all there or none)."""
        capacities = self.header["capacities"]
        devices: dict[str, set[int | None]] = defaultdict(set)
        groups: dict[tuple[str, str], list[SweepResult]] = defaultdict(list)
        for row in rows:
            groups[row.trace, row.config].append(row)
            if row.error is None:
                devices[row.trace].add(row.recorded_device)
        kept = []
        for (trace, _), group in groups.items():
            have = {(r.recorded_device, r.capacity) for r in group if r.error is None}
            if len(have) == len(group) and have == {
                (d, c) for d in devices[trace] for c in capacities
            }:
                kept += group
        return kept

    def _rewrite(self) -> None:
        """Replace the file with the header and the rows kept, at once (os.replace)."""
        text = json.dumps(self.header) + "\n" + "".join(_row_line(r) for r in self.rows)
        folder = os.path.dirname(os.path.abspath(self.path))
        fd, tmp = tempfile.mkstemp(prefix=".accelrt-sweep-", dir=folder)
        try:
            with open(fd, "w", encoding="utf-8", errors="surrogateescape") as f:
                f.write(text)
            os.replace(tmp, self.path)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise

    def done(self, trace: str, config: str) -> bool:
        """Whether the file holds every row of ``trace`` under the setting labelled ``config``."""
        return (trace, config) in self._done

    def devices(self, trace: str) -> set[int | None]:
        """The recorded devices of the rows kept for ``trace`` (``{None}``: a JSONL trace)."""
        return {r.recorded_device for r in self.rows if r.trace == trace}

    def append(self, rows: Sequence[SweepResult]) -> None:
        """Append a finished task's rows, with one write."""
        data = "".join(_row_line(r) for r in rows).encode("utf-8", "surrogateescape")
        while data:
            data = data[os.write(self._fd, data) :]

    def close(self) -> None:
        """Close the file (every row appended is already in it)."""
        os.close(self._fd)
