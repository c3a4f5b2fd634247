"""accelrt's allocation trace format: the :class:`Trace` in memory, telling files apart
(:func:`sniff`), the header's checks and the writer; reading is :mod:`._jsonl`'s (JSON Lines)
and :mod:`._snapshot`'s (PyTorch snapshots), :func:`~._load.load` picks between them."""

from __future__ import annotations

import gzip
import json
import os
import zlib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, BinaryIO

from .._errors import InputError
from .._text import shown
from ._columns import (
    TraceEvent,
    TraceEvents,
)
from ._phases import Phase

if TYPE_CHECKING:
    from ._recording import Recording

__all__ = [
    "FORMAT",
    "FORMAT_VERSION",
    "Trace",
    "TraceEvent",
    "TraceFormatError",
    "write",
]

FORMAT = "alloc-trace-jsonl"
FORMAT_VERSION = 1
_ACTIONS = ("alloc", "free", "empty_cache")
_LIMIT = 1 << 63
"""Sizes and addresses are integers in [0, 2**63); streams in [-2**63, 2**63)."""
_GZIP_MAGIC = b"\x1f\x8b"
_PICKLE_MAGIC = b"\x80"  # pickle protocol 2 and later


class TraceFormatError(InputError):
    """A trace file is malformed; the message names the file, the line and the problem.

    An :class:`accelrt._errors.InputError` (so a ``ValueError``): bad input, not a bug.
    """


@dataclass
class Trace:
    """An allocation trace in memory.

    Attributes
    ----------
    header : dict
        The header line (workload, capture method, stats...).
    events : TraceEvents
        The events in call order (host-only events dropped unless ``include_host``): a
        ``Sequence[TraceEvent]`` over numpy columns (``events.op``, ``.addr``, ``.size``,
        ``.stream``). A list of :class:`TraceEvent` given here is converted.
    path : str or None
        Where the trace was read from.
    include_host : bool
        Whether events tagged ``"host": 1`` were kept.
    skipped_host_events : int
        How many host-tagged events were dropped.
    peak_live_bytes : int
        The peak of live requested bytes over ``events``.
    live_at_end_bytes : int
        Live requested bytes after the last event.
    recording : Recording or None
        For a PyTorch snapshot: the start state and what PyTorch's allocator did.
    phases : tuple of Phase
        Named stretches of the run (the header's ``phases`` table), in ``events`` indices.
    """

    header: dict[str, Any]
    events: TraceEvents = field(default_factory=lambda: TraceEvents.from_events(()))
    path: str | None = None
    include_host: bool = False
    skipped_host_events: int = 0
    peak_live_bytes: int = 0
    live_at_end_bytes: int = 0
    recording: Recording | None = None
    phases: tuple[Phase, ...] = ()

    def __post_init__(self) -> None:
        if not isinstance(self.events, TraceEvents):
            events: Sequence[TraceEvent] = self.events
            self.events = TraceEvents.from_events(events)

    @property
    def name(self) -> str:
        """The trace's name from its header, else its file name."""
        name = self.header.get("name")
        if isinstance(name, str) and name:
            return name
        return os.path.basename(self.path or "trace").split(".")[0]


def _int_field(obj: dict[str, object], key: str, where: str, *, minimum: int | None = 0) -> int:
    value = obj.get(key)
    if isinstance(value, bool) or not isinstance(value, int):
        raise TraceFormatError(f"{where}: field {key!r} must be an integer, got {shown(value)}")
    if minimum is not None and value < minimum:
        raise TraceFormatError(f"{where}: field {key!r} must be >= {minimum}, got {shown(value)}")
    if not -_LIMIT <= value < _LIMIT:
        low = "0" if minimum == 0 else "-2**63"
        raise TraceFormatError(
            f"{where}: field {key!r} must be an integer in [{low}, 2**63), got {shown(value)}"
        )
    return value


def sniff(path: str | os.PathLike[str]) -> str:
    """Tell what a file is from its first bytes, without reading it all.

    Returns
    -------
    str
        ``"jsonl"`` (JSON text, maybe gzip'd: an accelrt trace or something like it),
        ``"pickle"`` (protocol 2 or later, as snapshots are), ``"gzip"`` (gzip'd, not JSON),
        ``"empty"``, or ``"unknown"``.

    Raises
    ------
    OSError
        If the file cannot be opened (missing, a directory, no permission).
    """
    with open(path, "rb") as f:
        return sniff_file(f)


def sniff_file(f: BinaryIO) -> str:
    """:func:`sniff` of a file open for binary reading, from its start; it is left at some
    position after its first bytes (seek back to read it)."""
    head = f.read(64)
    if head.startswith(_GZIP_MAGIC):
        f.seek(0)
        try:
            with gzip.GzipFile(fileobj=f, mode="rb") as z:
                head = z.read(64)
        except (OSError, EOFError, zlib.error):
            return "gzip"
        return "jsonl" if head.lstrip()[:1] in (b"{", b"[", b"") else "gzip"
    if not head:
        return "empty"
    if head.startswith(_PICKLE_MAGIC):
        return "pickle"
    first = head.removeprefix(b"\xef\xbb\xbf").lstrip()[:1]  # a UTF-8 BOM: load names it
    if first in (b"{", b"[") or not first:  # not first: blank lines, JSON may follow
        return "jsonl"
    return "unknown"


class _LiveSet:
    """The live allocations of a trace as it is read or written: consistency and peak bytes.

    Allocations with ``counted=False`` (host-only events left out of the device view) are
    tracked for consistency but not counted in the live bytes.
    """

    __slots__ = ("live", "live_bytes", "peak")

    def __init__(self) -> None:
        self.live: dict[int, tuple[int, bool]] = {}
        self.live_bytes = 0
        self.peak = 0

    def alloc(self, addr: int, size: int, where: str, counted: bool = True) -> None:
        if addr in self.live:
            raise TraceFormatError(f"{where}: alloc of address {addr:#x}, which is already live")
        self.live[addr] = (size, counted)
        if counted:
            self.live_bytes += size
            self.peak = max(self.peak, self.live_bytes)

    def free(self, addr: int, where: str) -> tuple[int, bool]:
        """Return the freed allocation's (size, counted)."""
        entry = self.live.pop(addr, None)
        if entry is None:
            raise TraceFormatError(f"{where}: free of address {addr:#x}, which is not live")
        if entry[1]:
            self.live_bytes -= entry[0]
        return entry


MAX_NAME_CHARS = 4096
"""The longest header ``name`` a trace may have, in characters. The name heads every output of
``accelrt replay`` (and the picture's title); a longer one is refused, naming its length and
this limit, rather than cut short (a trace without a name goes by its file's name)."""


def _check_header_fields(obj: dict[str, object], where: str) -> None:
    """Check the header fields accelrt reads, as :func:`load` and :func:`write` both do: an
    integer ``device_capacity_bytes`` in [0, 2**63), a ``name`` of at most
    :data:`MAX_NAME_CHARS` characters; ``where`` begins the message (``FILE:1: header``)."""
    if "device_capacity_bytes" in obj:
        _int_field(obj, "device_capacity_bytes", where)
    name = obj.get("name")
    if isinstance(name, str) and len(name) > MAX_NAME_CHARS:
        raise TraceFormatError(
            f"{where}: field 'name' is {len(name)} characters long, more than the limit of "
            f"{MAX_NAME_CHARS}; shorten it"
        )


def _check_header(obj: dict[str, object], where: str) -> dict[str, object]:
    if obj.get("type") != "header" or obj.get("format") != FORMAT:
        raise TraceFormatError(
            f'{where}: expected a header with "type": "header" and "format": '
            f'"{FORMAT}", got {json.dumps(obj)[:80]}'
        )
    version = obj.get("format_version")
    if version != FORMAT_VERSION:
        raise TraceFormatError(
            f"{where}: unsupported format_version {shown(version)}; this accelrt reads "
            f"{FORMAT_VERSION}"
        )
    _check_header_fields(obj, f"{where}: header")
    return obj


def write(
    path: str | os.PathLike[str],
    events: Iterable[TraceEvent | dict[str, object]],
    header: dict[str, object] | None = None,
) -> dict[str, object]:
    """Write a gzip'd JSONL trace, computing the header's ``stats``.

    Parameters
    ----------
    path : str or path-like
        The output file (written gzip'd whatever its name).
    events : iterable of TraceEvent or dict
        Events in call order; dicts may carry extra keys (``op``, ``t``, ``synthetic``...).
    header : dict, optional
        Extra header fields (``name``, ``workload``...).

    Returns
    -------
    dict
        The header as written.

    Raises
    ------
    TraceFormatError
        If the events are inconsistent (a free of an address that is not live, ...) or hold
        what :func:`load` refuses (an unknown action; an ``addr`` or ``size`` that is not an
        integer in [0, 2**63); a header ``device_capacity_bytes`` out of that range, or a
        header ``name`` longer than :data:`MAX_NAME_CHARS`).
    """
    rows = [e._asdict() if isinstance(e, TraceEvent) else dict(e) for e in events]
    live = _LiveSet()
    allocs = frees = 0
    for line, row in enumerate(rows, start=2):
        where = f"event on line {line}"
        action = row.get("action")
        if action not in _ACTIONS:  # what load would refuse is not written
            raise TraceFormatError(
                f"{where}: unknown action {shown(action)}; expected one of {', '.join(_ACTIONS)}"
            )
        if action == "empty_cache":
            continue
        addr = _int_field(row, "addr", where)
        size = _int_field(row, "size", where)
        if "stream" in row:
            _int_field(row, "stream", where, minimum=None)
        if action == "alloc":
            live.alloc(addr, size, where)
            allocs += 1
        else:
            live.free(addr, where)
            frees += 1
    full_header: dict[str, object] = {"type": "header", "format": FORMAT, "format_version": 1}
    full_header.update(header or {})
    _check_header_fields(full_header, "header")
    full_header["stats"] = {
        "events": len(rows),
        "allocs": allocs,
        "frees": frees,
        "peak_live_bytes": live.peak,
        "live_at_end_bytes": live.live_bytes,
    }
    with gzip.open(path, "wt", encoding="utf-8", compresslevel=9) as out:
        out.write(json.dumps(full_header) + "\n")
        for row in rows:
            out.write(json.dumps(row, separators=(",", ":")) + "\n")
    return full_header
