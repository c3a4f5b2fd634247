"""Reader and writer of accelrt allocation traces (gzip'd or plain JSON Lines)."""

from __future__ import annotations

import array
import gzip
import io
import itertools
import json
import os
import zlib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import IO, TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt

from ._columns import (
    OP_ALLOC,
    OP_EMPTY_CACHE,
    OP_FREE,
    TraceEvent,
    TraceEvents,
    check_live,
    scan_lines,
)

if TYPE_CHECKING:
    from ._columns import ScannedLines, _Shape
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
    """

    header: dict[str, Any]
    events: TraceEvents = field(default_factory=lambda: TraceEvents.from_events(()))
    path: str | None = None
    include_host: bool = False
    skipped_host_events: int = 0
    peak_live_bytes: int = 0
    live_at_end_bytes: int = 0
    recording: Recording | None = None

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


def _json_line(line: str, where: str) -> dict[str, Any] | None:
    """Parse one line as the reference reader does: None for a blank line, else a JSON object."""
    if not line.strip():
        return None
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
    return obj


def _event_fields(obj: dict[str, Any], where: str) -> tuple[int, int, int, int, bool]:
    """Check one event object; return its (op, addr, size, stream, host tag)."""
    action = obj.get("action")
    if action not in _ACTIONS:
        raise TraceFormatError(
            f"{where}: unknown action {_shown(action)}; expected one of {', '.join(_ACTIONS)}"
        )
    if action == "empty_cache":
        return OP_EMPTY_CACHE, 0, 0, 0, False
    addr = _int_field(obj, "addr", where)
    size = _int_field(obj, "size", where)
    stream = _int_field(obj, "stream", where, minimum=None) if "stream" in obj else 0
    return (OP_ALLOC if action == "alloc" else OP_FREE), addr, size, stream, bool(obj.get("host"))


def _load_jsonl_reference(path: str | os.PathLike[str], *, include_host: bool = False) -> Trace:
    """Read a JSONL trace line by line: the reference reader (one ``json.loads`` an event).

    :func:`load_jsonl` gives the same result and the same errors faster; it hands files it
    cannot read (I/O errors, invalid UTF-8) to this reader so that those errors, and the
    lines refused before them, are reported exactly as this reader reports them.
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
                obj = _json_line(line, where)
                if obj is None:
                    continue
                if header is None:
                    header = _check_header(obj, where)
                    continue
                op, addr, size, stream, host = _event_fields(obj, where)
                if op == OP_EMPTY_CACHE:
                    events.append(TraceEvent("empty_cache", 0, 0, 0))
                    continue
                keep = include_host or not host
                if op == OP_ALLOC:
                    live.alloc(addr, size, where, counted=keep)
                else:
                    size, keep = live.free(addr, where)
                if keep:
                    events.append(TraceEvent(_ACTIONS[op], addr, size, stream))
                else:
                    skipped += 1
    except (OSError, EOFError, UnicodeDecodeError, zlib.error) as exc:
        _raise_read_error(name, exc)
    if header is None:
        raise TraceFormatError(f"{name}: empty file, expected a header line")
    return Trace(
        header=header,
        events=TraceEvents.from_events(events),
        path=name,
        include_host=include_host,
        skipped_host_events=skipped,
        peak_live_bytes=live.peak,
        live_at_end_bytes=live.live_bytes,
    )


def _raise_read_error(name: str, exc: BaseException) -> None:
    if isinstance(exc, FileNotFoundError):
        raise exc
    if isinstance(exc, IsADirectoryError):
        raise TraceFormatError(f"{name} is a directory, not a trace file") from None
    raise TraceFormatError(f"{name}: cannot read trace ({exc})") from None


class _ReadFailed(Exception):
    """The fast reader met an I/O or decoding error: the reference reader reports it."""


_CHUNK_BYTES = 1 << 20
"""Bytes of text the fast reader scans at a time (its scratch memory is about 20 times this)."""


def _open_binary(path: str | os.PathLike[str]) -> io.BufferedIOBase:
    with open(path, "rb") as raw:
        magic = raw.read(2)
    if magic == _GZIP_MAGIC:
        return gzip.open(path, "rb")
    return open(path, "rb")


def _text_chunks(path: str | os.PathLike[str]) -> Iterable[bytes]:
    """Yield the file's text as whole lines, newlines normalised to ``\\n``, UTF-8 checked.

    Raises
    ------
    _ReadFailed
        For any I/O, decompression or decoding error.
    """
    try:
        with _open_binary(path) as raw:
            carry = b""
            while True:
                block = raw.read(_CHUNK_BYTES)
                if block:
                    data = carry + block
                    cut = data.rfind(b"\n") + 1
                    if not cut:
                        carry = data
                        continue
                    data, carry = data[:cut], data[cut:]
                else:
                    data, carry = carry, b""
                    if not data:
                        return
                if b"\r" in data:  # universal newlines, as the text reader has them
                    data = data.replace(b"\r\n", b"\n").replace(b"\r", b"\n")
                if not data.isascii():
                    data.decode("utf-8")
                yield data
    except (OSError, EOFError, UnicodeDecodeError, zlib.error):
        raise _ReadFailed from None


class _Columns:
    """Event columns gathered chunk by chunk, and the lines each chunk's events came from.

    The columns grow as ``array.array`` objects: their over-allocation is never touched and
    a large one grows in place (``realloc``), so reading holds about 26 bytes an event and
    does not leave the freed copies of a grown array behind in the heap.
    """

    _TYPES = (("b", np.int8), ("q", np.int64), ("q", np.int64), ("q", np.int64), ("B", np.bool_))

    def __init__(self) -> None:
        self.arrays: list[array.array[Any]] = [array.array(code) for code, _ in self._TYPES]
        """Per column (op, addr, size, stream, host)."""
        self.count = 0
        self.origins: list[tuple[int, int, npt.NDArray[np.intp] | None]] = []
        """Per chunk: its first event, the number of its first line, and each event's line
        index in the chunk (None where that is the event's index in the chunk)."""

    def add(self, scanned: ScannedLines, first_line: int, n: int) -> None:
        lines = scanned.lines[:n]
        identity = not len(lines) or int(lines[-1]) == len(lines) - 1
        self.origins.append((self.count, first_line, None if identity else lines.copy()))
        columns: tuple[npt.NDArray[Any], ...] = (
            scanned.op,
            scanned.addr,
            scanned.size,
            scanned.stream,
            scanned.host,
        )
        for store, column in zip(self.arrays, columns, strict=True):
            store.frombytes(column[:n].tobytes())
        self.count += n

    def line_of(self, event: int) -> int:
        """The line number of event ``event``."""
        for first, first_line, lines in reversed(self.origins):
            if event >= first:
                offset = event - first
                return first_line + (offset if lines is None else int(lines[offset]))
        raise IndexError(event)  # not reached: every event came from a chunk

    def columns(self) -> list[Any]:
        """Return the five columns (op, addr, size, stream, host) as numpy arrays (no copy)."""
        return [
            np.frombuffer(store, dtype=dtype)
            for store, (_, dtype) in zip(self.arrays, self._TYPES, strict=True)
        ]


def _read_slow_lines(
    scanned: ScannedLines, data: bytes, name: str, first_line: int
) -> tuple[int, TraceFormatError | None]:
    """Parse the lines the scanner left, one by one, into their rows of ``scanned``.

    Returns how many rows are good and the error of the first bad line (None: none).
    """
    dropped: list[int] = []
    for row in scanned.slow.tolist():
        index = int(scanned.lines[row])
        start, end = int(scanned.starts[index]), int(scanned.ends[index])
        line = data[start:end].decode("utf-8") + ("\n" if end < len(data) else "")
        where = f"{name}:{first_line + index}"
        try:
            obj = _json_line(line, where)
            if obj is None:  # not reached: the scanner's blank lines are the reference's
                dropped.append(row)
                continue
            fields = _event_fields(obj, where)
        except TraceFormatError as exc:
            return row, exc
        (
            scanned.op[row],
            scanned.addr[row],
            scanned.size[row],
            scanned.stream[row],
            scanned.host[row],
        ) = fields
    if dropped:
        keep = np.ones(len(scanned.lines), dtype=np.bool_)
        keep[dropped] = False
        for attr in ("lines", "op", "addr", "size", "stream", "host"):
            setattr(scanned, attr, getattr(scanned, attr)[keep])
    return len(scanned.lines), None


def _live_bytes(op: Any, size: Any) -> tuple[int, int]:
    """The peak and final live bytes over kept events (exact, whatever the sizes)."""
    n_allocs = int(np.count_nonzero(op == OP_ALLOC))
    if not n_allocs:
        return 0, 0
    if int(size.max()) < (1 << 62) // n_allocs:  # the running sum fits in int64
        live = np.where(op == OP_ALLOC, size, 0)
        np.subtract(live, size, out=live, where=op == OP_FREE)
        np.cumsum(live, out=live)
        return max(0, int(live.max())), int(live[-1])
    signs = {OP_ALLOC: 1, OP_FREE: -1, OP_EMPTY_CACHE: 0}
    running = itertools.accumulate(
        signs[o] * s for o, s in zip(op.tolist(), size.tolist(), strict=True)
    )
    peak = end = 0
    for end in running:
        peak = max(peak, end)
    return peak, end


def load_jsonl(path: str | os.PathLike[str], *, include_host: bool = False) -> Trace:
    """Read and validate a JSONL trace file into columns.

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
        ``trace.events`` is a :class:`TraceEvents` (25 bytes an event).

    Raises
    ------
    FileNotFoundError
        If the file does not exist.
    TraceFormatError
        If any line is not valid: not JSON, not an object, a wrong header (or a header
        ``device_capacity_bytes`` that is not an integer in [0, 2**63)), an unknown action, a
        missing field, an ``addr`` or ``size`` that is not an integer in [0, 2**63) (a
        ``stream`` in [-2**63, 2**63)), an alloc of a live address, or a free of an address
        that is not live. The message names the file and the first bad line.

    Notes
    -----
    Lines are read a few MiB at a time and turned into numpy columns without a Python object
    per event (``accelrt.trace._columns``); the few lines that are not plain events (escapes,
    huge numbers, errors) are read one by one by the reference code, so results and messages
    are those of the line-by-line reader. Memory: about 26 bytes an event while reading, 25
    after.
    """
    try:
        return _load_columns(path, include_host)
    except _ReadFailed:
        return _load_jsonl_reference(path, include_host=include_host)


def _load_columns(path: str | os.PathLike[str], include_host: bool) -> Trace:
    name = os.fspath(path)
    header: dict[str, Any] | None = None
    columns = _Columns()
    shapes: dict[bytes, _Shape] = {}
    error: TraceFormatError | None = None
    lines_read = 0
    for chunk in _text_chunks(path):
        data = chunk
        while header is None and data:  # the header: the first line that is not blank
            end = data.find(b"\n") + 1 or len(data)
            lines_read += 1
            where = f"{name}:{lines_read}"
            obj = _json_line(data[:end].decode("utf-8"), where)
            data = data[end:]
            if obj is not None:
                header = _check_header(obj, where)
        if not data:
            continue
        scanned = scan_lines(data, shapes)
        good, error = _read_slow_lines(scanned, data, name, lines_read + 1)
        columns.add(scanned, lines_read + 1, good)
        lines_read += len(scanned.starts)
        if error is not None:
            break
    if header is None:
        raise TraceFormatError(f"{name}: empty file, expected a header line")
    if not columns.count:
        if error is not None:
            raise error
        return Trace(header=header, path=name, include_host=include_host)
    op, addr, size, stream, host = columns.columns()
    del columns.arrays
    first_bad = check_live(op, addr, size, host).first_bad
    if first_bad >= 0:
        where = f"{name}:{columns.line_of(first_bad)}"
        if op[first_bad] == OP_ALLOC:
            raise TraceFormatError(
                f"{where}: alloc of address {int(addr[first_bad]):#x}, which is already live"
            )
        raise TraceFormatError(
            f"{where}: free of address {int(addr[first_bad]):#x}, which is not live"
        )
    if error is not None:
        raise error
    skipped = 0
    if not include_host and host.any():
        keep = ~host
        skipped = len(keep) - int(np.count_nonzero(keep))
        op = op[keep]  # one column at a time: a copy of one beside the others at most
        addr = addr[keep]
        size = size[keep]
        stream = stream[keep]
    del host
    peak, live_at_end = _live_bytes(op, size)
    return Trace(
        header=header,
        events=TraceEvents(op, addr, size, stream),
        path=name,
        include_host=include_host,
        skipped_host_events=skipped,
        peak_live_bytes=peak,
        live_at_end_bytes=live_at_end,
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
