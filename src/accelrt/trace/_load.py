"""Reading any trace file: accelrt's JSONL format or a PyTorch memory snapshot pickle."""

from __future__ import annotations

import os

from ._format import Trace, TraceFormatError, sniff
from ._jsonl import load_jsonl
from ._snapshot import trace_from_snapshot
from ._snapshot_schema import read_checked_snapshot

__all__ = ["load", "load_sniffed"]


def load(
    path: str | os.PathLike[str], *, include_host: bool = False, device_index: int | None = None
) -> Trace:
    """Read a trace: accelrt's JSONL format or a PyTorch memory snapshot pickle.

    Parameters
    ----------
    path : str or path-like
        A ``.jsonl.gz``/``.jsonl`` trace, or a pickle from ``torch.cuda.memory._dump_snapshot``
        (told apart by content, not name).
    include_host : bool
        JSONL only: keep events tagged ``"host": 1``.
    device_index : int, optional
        Snapshots only: the device to take (default: the only one with events).

    Returns
    -------
    Trace
        For a snapshot, ``trace.recording`` has the start state and PyTorch's figures.

    Raises
    ------
    FileNotFoundError
        If the file does not exist.
    TraceFormatError
        For a malformed trace, a file that is neither a trace nor a snapshot pickle, a
        directory, or a pickle that names any code (refused unread: nothing runs).
    """
    name = os.fspath(path)
    try:
        kind = sniff(path)
    except (IsADirectoryError, PermissionError) as exc:
        what = "is a directory" if isinstance(exc, IsADirectoryError) else "cannot be read"
        raise TraceFormatError(
            f"{name} {what}; give an accelrt trace (.jsonl.gz) or a snapshot pickle"
        ) from None
    return load_sniffed(path, kind, include_host=include_host, device_index=device_index)


def load_sniffed(
    path: str | os.PathLike[str],
    kind: str,
    *,
    include_host: bool = False,
    device_index: int | None = None,
) -> Trace:
    """:func:`load` of a file already told apart (``kind``: what ``sniff`` said), so that it
    is not opened again to ask."""
    name = os.fspath(path)
    if kind == "pickle":
        return trace_from_snapshot(read_checked_snapshot(name), device=device_index, path=name)
    if kind in ("gzip", "unknown"):
        raise TraceFormatError(
            f"{name} is neither an accelrt trace (JSON Lines, maybe gzip'd, whose first line is "
            "a header object) nor a PyTorch snapshot pickle (protocol 2 or later)"
            + ("; it is gzip'd but not JSON" if kind == "gzip" else "")
        )
    if device_index is not None:
        raise TraceFormatError(f"{name}: device_index applies to snapshots only")
    return load_jsonl(path, include_host=include_host)
