"""Reader and writer of accelrt allocation traces (gzip'd or plain JSON Lines)."""

from __future__ import annotations

import gzip
import io
import json
import os
import zlib
from collections.abc import Iterable
from dataclasses import dataclass
from typing import IO, TYPE_CHECKING, Any, NamedTuple

if TYPE_CHECKING:
    from ._snapshot import Recording

__all__ = [
    "FORMAT",
    "FORMAT_VERSION",
    "Trace",
    "TraceEvent",
    "TraceFormatError",
    "load",
    "load_jsonl",
    "write",
]

FORMAT = "alloc-trace-jsonl"
FORMAT_VERSION = 1
_ACTIONS = ("alloc", "free", "empty_cache")
_LIMIT = 1 << 63
"""Sizes and addresses are integers in [0, 2**63); streams in [-2**63, 2**63)."""
_GZIP_MAGIC = b"\x1f\x8b"
_PICKLE_MAGIC = b"\x80"  # pickle protocol 2 and later


class TraceFormatError(ValueError):
    """A trace file is malformed; the message names the file, the line and the problem."""


class TraceEvent(NamedTuple):
    """One allocator call of a trace.

    Attributes
    ----------
    action : str
        ``"alloc"``, ``"free"`` or ``"empty_cache"``.
    addr : int
        The address the recorded program saw (0 for ``empty_cache``).
    size : int
        Requested bytes (the size of the matching alloc for a free).
    stream : int
        The stream the recorded program used.
    """

    action: str
    addr: int
    size: int
    stream: int


@dataclass
class Trace:
    """An allocation trace in memory.

    Attributes
    ----------
    header : dict
        The header line (workload, capture method, stats...).
    events : list of TraceEvent
        The events in call order (host-only events dropped unless ``include_host``).
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
    """

    header: dict[str, Any]
    events: list[TraceEvent]
    path: str | None = None
    include_host: bool = False
    skipped_host_events: int = 0
    peak_live_bytes: int = 0
    live_at_end_bytes: int = 0
    recording: Recording | None = None

    @property
    def name(self) -> str:
        """The trace's name from its header, else its file name."""
        name = self.header.get("name")
        if isinstance(name, str) and name:
            return name
        return os.path.basename(self.path or "trace").split(".")[0]


def _open_text(path: str | os.PathLike[str]) -> IO[str]:
    with open(path, "rb") as raw:
        magic = raw.read(2)
    if magic == _GZIP_MAGIC:
        return io.TextIOWrapper(gzip.open(path, "rb"), encoding="utf-8")
    return open(path, encoding="utf-8")


def _shown(value: Any) -> str:
    """``repr(value)``, cut short for messages."""
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _int_field(obj: dict[str, Any], key: str, where: str, *, minimum: int | None = 0) -> int:
    value = obj.get(key)
    if isinstance(value, bool) or not isinstance(value, int):
        raise TraceFormatError(f"{where}: field {key!r} must be an integer, got {_shown(value)}")
    if minimum is not None and value < minimum:
        raise TraceFormatError(f"{where}: field {key!r} must be >= {minimum}, got {_shown(value)}")
    if not -_LIMIT <= value < _LIMIT:
        low = "0" if minimum == 0 else "-2**63"
        raise TraceFormatError(
            f"{where}: field {key!r} must be an integer in [{low}, 2**63), got {_shown(value)}"
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
        head = f.read(64)
    if head.startswith(_GZIP_MAGIC):
        try:
            with gzip.open(path, "rb") as z:
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


def load_jsonl(path: str | os.PathLike[str], *, include_host: bool = False) -> Trace:
    """Read and validate a JSONL trace file.

    Parameters
    ----------
    path : str or path-like
        A ``.jsonl.gz`` or ``.jsonl`` trace (gzip is detected by content).
    include_host : bool
        Keep events tagged ``"host": 1`` (allocations a GPU run keeps on the host). Default
        False: the device view.

    Returns
    -------
    Trace

    Raises
    ------
    FileNotFoundError
        If the file does not exist.
    TraceFormatError
        If any line is not valid: not JSON, not an object, a wrong header (or a header
        ``device_capacity_bytes`` that is not an integer in [0, 2**63)), an unknown action, a
        missing field, an ``addr`` or ``size`` that is not an integer in [0, 2**63) (a
        ``stream`` in [-2**63, 2**63)), an alloc of a live address, or a free of an address
        that is not live. The message names the file and the line.
    """
    name = os.fspath(path)
    events: list[TraceEvent] = []
    live = _LiveSet()
    skipped = 0
    try:
        with _open_text(path) as lines:
            header: dict[str, Any] | None = None
            for number, line in enumerate(lines, start=1):
                where = f"{name}:{number}"
                if not line.strip():
                    continue
                try:
                    obj = json.loads(line)
                except json.JSONDecodeError as exc:
                    raise TraceFormatError(f"{where}: not valid JSON ({exc.msg})") from None
                except ValueError:  # an integer of more digits than Python converts (4300)
                    raise TraceFormatError(
                        f"{where}: a number with too many digits; sizes and addresses must be "
                        "integers in [0, 2**63)"
                    ) from None
                except RecursionError:
                    raise TraceFormatError(
                        f"{where}: JSON nested too deeply; expected a flat event object"
                    ) from None
                if not isinstance(obj, dict):
                    raise TraceFormatError(f"{where}: expected a JSON object, got {line[:60]!r}")
                if header is None:
                    header = _check_header(obj, where)
                    continue
                action = obj.get("action")
                if action not in _ACTIONS:
                    raise TraceFormatError(
                        f"{where}: unknown action {_shown(action)}; expected one of "
                        f"{', '.join(_ACTIONS)}"
                    )
                if action == "empty_cache":
                    events.append(TraceEvent("empty_cache", 0, 0, 0))
                    continue
                addr = _int_field(obj, "addr", where)
                size = _int_field(obj, "size", where)
                stream = _int_field(obj, "stream", where, minimum=None) if "stream" in obj else 0
                keep = include_host or not obj.get("host")
                if action == "alloc":
                    live.alloc(addr, size, where, counted=keep)
                else:
                    size, keep = live.free(addr, where)
                if keep:
                    events.append(TraceEvent(action, addr, size, stream))
                else:
                    skipped += 1
    except (OSError, EOFError, UnicodeDecodeError, zlib.error) as exc:
        if isinstance(exc, FileNotFoundError):
            raise
        if isinstance(exc, IsADirectoryError):
            raise TraceFormatError(f"{name} is a directory, not a trace file") from None
        raise TraceFormatError(f"{name}: cannot read trace ({exc})") from None
    if header is None:
        raise TraceFormatError(f"{name}: empty file, expected a header line")
    return Trace(
        header=header,
        events=events,
        path=name,
        include_host=include_host,
        skipped_host_events=skipped,
        peak_live_bytes=live.peak,
        live_at_end_bytes=live.live_bytes,
    )


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
    if kind == "pickle":
        from ._snapshot import trace_from_snapshot
        from ._snapshot_schema import read_snapshot

        return trace_from_snapshot(read_snapshot(name), device=device_index, path=name)
    if kind in ("gzip", "unknown"):
        raise TraceFormatError(
            f"{name} is neither an accelrt trace (JSON Lines, maybe gzip'd, whose first line is "
            "a header object) nor a PyTorch snapshot pickle (protocol 2 or later)"
            + ("; it is gzip'd but not JSON" if kind == "gzip" else "")
        )
    if device_index is not None:
        raise TraceFormatError(f"{name}: device_index applies to snapshots only")
    return load_jsonl(path, include_host=include_host)


def _check_header(obj: dict[str, Any], where: str) -> dict[str, Any]:
    if obj.get("type") != "header" or obj.get("format") != FORMAT:
        raise TraceFormatError(
            f'{where}: expected a header with "type": "header" and "format": '
            f'"{FORMAT}", got {json.dumps(obj)[:80]}'
        )
    version = obj.get("format_version")
    if version != FORMAT_VERSION:
        raise TraceFormatError(
            f"{where}: unsupported format_version {_shown(version)}; this accelrt reads "
            f"{FORMAT_VERSION}"
        )
    if "device_capacity_bytes" in obj:
        _int_field(obj, "device_capacity_bytes", f"{where}: header")
    return obj


def write(
    path: str | os.PathLike[str],
    events: Iterable[TraceEvent | dict[str, Any]],
    header: dict[str, Any] | None = None,
) -> dict[str, Any]:
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
        integer in [0, 2**63); a header ``device_capacity_bytes`` out of that range).
    """
    rows = [e._asdict() if isinstance(e, TraceEvent) else dict(e) for e in events]
    live = _LiveSet()
    allocs = frees = 0
    for line, row in enumerate(rows, start=2):
        where = f"event on line {line}"
        action = row.get("action")
        if action not in _ACTIONS:  # what load would refuse is not written
            raise TraceFormatError(
                f"{where}: unknown action {_shown(action)}; expected one of {', '.join(_ACTIONS)}"
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
    full_header: dict[str, Any] = {"type": "header", "format": FORMAT, "format_version": 1}
    full_header.update(header or {})
    if "device_capacity_bytes" in full_header:
        _int_field(full_header, "device_capacity_bytes", "header")
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
