"""Named stretches of a recording (``step0/fwd``, ``step0/bwd``...), from the ``phases`` table
of an accelrt trace header, in the trace's own event indices."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

__all__ = ["Phase", "header_phases"]


@dataclass(frozen=True)
class Phase:
    """A named stretch of a trace: events ``first`` up to, not including, ``end``.

    What ``Trace.phases`` holds, read from the ``phases`` table of an accelrt trace header
    (``{"phase": "step0/fwd", "first": 1, "end": 4}``; docs/viewer.md). Phases name where in
    a step memory was allocated, for ``accelrt.view``'s categories.

    Attributes
    ----------
    name : str
        The phase's name as the header gives it (``"step0/bwd"``).
    first : int
        Index of its first event in the trace's events (0-based; host-only events the trace
        dropped are not counted).
    end : int
        Index one past its last event: ``first < end <= len(trace.events)`` for the phases
        ``load`` reads.

    Notes
    -----
    A frozen dataclass: compared and hashed by value; making one checks nothing and raises
    nothing. ``load`` leaves out damaged or empty entries of a header's table rather than
    refusing the file.
    """

    name: str
    first: int
    end: int


def header_phases(
    header: object, kept: npt.NDArray[np.bool_] | None, events: int
) -> tuple[Phase, ...]:
    """The phases of a trace header (``"phases": [{"phase", "first", "end"}, ...]``, indices
    of the file's event lines), in the indices of the events the trace kept.

    Parameters
    ----------
    header : object
        The header; anything but a dict with a list under ``"phases"`` gives no phases.
    kept : numpy.ndarray of bool or None
        Per event line of the file, whether the trace kept it (host-only events are dropped);
        None when it kept every one.
    events : int
        The trace's events: phases are clipped to them.

    Returns
    -------
    tuple of Phase
        By ``first``. Entries that are not well formed (a name that is not a string, bounds
        that are not integers) and phases left empty are left out: a damaged header gives
        fewer phases rather than an error.
    """
    if not isinstance(header, dict) or not isinstance(header.get("phases"), list):
        return ()
    before = None if kept is None else np.concatenate(([0], np.cumsum(kept)))
    out = []
    for entry in header["phases"]:
        if not isinstance(entry, dict):
            continue
        name, first, end = entry.get("phase"), entry.get("first"), entry.get("end")
        if not isinstance(name, str) or type(first) is not int or type(end) is not int:
            continue
        if before is not None:
            first = int(before[min(max(first, 0), len(before) - 1)])
            end = int(before[min(max(end, 0), len(before) - 1)])
        first, end = max(0, first), min(events, end)
        if first < end:
            out.append(Phase(name, first, end))
    return tuple(sorted(out, key=lambda p: p.first))
