"""The picture of a snapshot's device (:class:`SnapshotPicture`): taken from a snapshot that
was read already, drawn from a replay it is given; and :func:`view_of_snapshot`, the one call
that reads, replays and draws, for library users."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import TYPE_CHECKING

from .._gc import collector_paused
from ..trace._format import Trace
from ..trace._snapshot import device_segments, devices_with_history, trace_from_snapshot
from ..trace._snapshot_schema import CheckedSnapshot, FileSnapshot, read_checked_snapshot
from ._model import View
from ._moments import picture_moments
from ._picture import end_state_view, view_of_trace
from ._recorded import RecordedDetails, snapshot_details

if TYPE_CHECKING:
    from ..replay import ReplayReport


__all__ = ["SnapshotPicture", "view_of_snapshot"]


def view_of_snapshot(
    path: str | os.PathLike[str],
    *,
    device_index: int | None = None,
    moments: int | None = None,
    snapshot: FileSnapshot | CheckedSnapshot | None = None,
) -> View:
    """Build the picture of a snapshot pickle (PyTorch's or accelrt's): read, replayed, drawn.

    The one call for a library user; it composes what the ``snapshot view`` command does step
    by step (read and check the file once, :meth:`SnapshotPicture.take`, replay the history
    with :meth:`SnapshotPicture.capture_at`, :meth:`SnapshotPicture.draw`). With allocation
    history, the history is replayed exactly from its rewound start (so the segment map can be
    shown at any captured moment); without, the end state: its segment map, and the blocks
    allocated then (with their stacks) as what was live, nothing over time (``view.history``
    is False).

    Parameters
    ----------
    path : str or path-like
    device_index : int, optional
        The recorded device (default: the only one with history, else 0).
    moments : int, optional
        About how many segment maps to capture (see :meth:`SnapshotPicture.capture_at`).
    snapshot : dict or CheckedSnapshot, optional
        The snapshot of ``path``, already read (:func:`~accelrt.trace.read_snapshot`): the
        file is not read again.

    Returns
    -------
    View

    Raises
    ------
    TraceFormatError
        For a pickle that is not a plain-data snapshot (nothing in it runs).
    """
    from ..replay import replay

    with collector_paused():  # a container per entry, no cycle among them
        read = read_checked_snapshot(path) if snapshot is None else snapshot
        picture = SnapshotPicture.take(path, read, device_index)
        del read, snapshot  # (where this call read it) the picture holds what it shows
        report = None
        if picture.trace is not None:
            report = replay(picture.trace, capture_at=picture.capture_at(moments))
        return picture.draw(report)


@dataclass(frozen=True)
class SnapshotPicture:
    """The picture of one device of a snapshot: what it shows, taken from the snapshot.

    :meth:`take` takes it; the snapshot (its entries, a dict each, are most of its memory) can
    then go before the history is replayed (by the caller, capturing :meth:`capture_at`) and
    :meth:`draw` builds the picture from that replay. Nothing here reads a file or replays.

    Attributes
    ----------
    title : str
        The file's name without its last suffix.
    trace : Trace or None
        The device's trace; None for a device without allocation history.
    details : RecordedDetails or None
        What the picture takes from the device's entries and end segments.
    end_state : View or None
        For a device without history, its picture (:func:`end_state_view`), drawn already.
    """

    title: str
    trace: Trace | None = None
    details: RecordedDetails | None = None
    end_state: View | None = None

    @classmethod
    def take(
        cls,
        path: str | os.PathLike[str],
        snapshot: FileSnapshot | CheckedSnapshot,
        device_index: int | None = None,
    ) -> SnapshotPicture:
        """Take the picture of a device (default: the only one with history, else 0).

        ``snapshot`` as read (:func:`~accelrt.trace.read_snapshot`, or checked once already:
        ``read_checked_snapshot``); ``path`` names it.

        Raises
        ------
        TraceFormatError
            As :func:`~accelrt.trace._snapshot.trace_from_snapshot`.
        """
        title = os.path.basename(os.fspath(path)).rsplit(".", 1)[0]
        data = snapshot.data if isinstance(snapshot, CheckedSnapshot) else snapshot
        has_history = devices_with_history(data)
        if not has_history or (device_index is not None and device_index not in has_history):
            device = device_index or 0
            return cls(title, end_state=end_state_view(device_segments(data, device), title))
        trace = trace_from_snapshot(snapshot, device=device_index, path=os.fspath(path))
        return cls(title, trace, snapshot_details(data, trace))

    def capture_at(self, moments: int | None = None) -> list[int]:
        """The events after which the replay of :attr:`trace` captures the segment map for
        :meth:`draw` (``replay(trace, capture_at=...)``); none without history.

        Parameters
        ----------
        moments : int, optional
            About how many segment maps to capture; default: as :func:`picture_moments`
            spreads them (``DEFAULT_MOMENTS``, or fewer where the recording holds so many
            segments or allocations that the maps would hold more than ``CAPTURED_SEGMENTS``
            segments or ``CAPTURED_BLOCKS`` blocks together; at least ``MIN_MOMENTS``).
        """
        return [] if self.trace is None else picture_moments(self.trace, moments)

    def draw(self, report: ReplayReport | None = None) -> View:
        """Build the picture from the replay of :attr:`trace` that captured :meth:`capture_at`.

        Parameters
        ----------
        report : ReplayReport, optional
            That replay (on whichever device, with whichever settings); None: the timeline
            only. Not used for a device without history (its end state is drawn already).

        Returns
        -------
        View
        """
        if self.trace is None:
            assert self.end_state is not None
            return self.end_state
        return view_of_trace(self.trace, report, title=self.title, details=self.details)
