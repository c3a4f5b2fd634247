"""Reader and writer of accelrt allocation traces (gzip'd or plain JSON Lines)."""

from __future__ import annotations

import array
import gzip
import io
import itertools
import json
import os
import re
import zlib
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, BinaryIO, NamedTuple

import numpy as np
import numpy.typing as npt

from .._errors import InputError
from .._text import shown
from .._units import format_bytes
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


def _int_field(obj: dict[str, Any], key: str, where: str, *, minimum: int | None = 0) -> int:
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
            f"{where}: unknown action {shown(action)}; expected one of {', '.join(_ACTIONS)}"
        )
    if action == "empty_cache":
        return OP_EMPTY_CACHE, 0, 0, 0, False
    addr = _int_field(obj, "addr", where)
    size = _int_field(obj, "size", where)
    stream = _int_field(obj, "stream", where, minimum=None) if "stream" in obj else 0
    return (OP_ALLOC if action == "alloc" else OP_FREE), addr, size, stream, bool(obj.get("host"))


def _load_jsonl_reference(path: str | os.PathLike[str], *, include_host: bool = False) -> Trace:
    """Read a JSONL trace line by line: the reference reader (one ``json.loads`` an event).

    :func:`load_jsonl` gives the same result and the same errors faster. Both take their
    lines from :func:`_text_chunks` (which refuses a line longer than ``MAX_LINE_BYTES`` and
    leaves out blank lines without a step per line where they are many).
    """
    name = os.fspath(path)
    events: list[TraceEvent] = []
    live = _LiveSet()
    skipped = 0
    header: dict[str, Any] | None = None
    for chunk in _text_chunks(path):
        for index, line in enumerate(_lines_of(chunk.data)):
            where = f"{name}:{chunk.number(index)}"
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


_CHUNK_BYTES = 1 << 20
"""Bytes of text the readers take from the file at a time (the fast reader's scratch memory is
about 20 times what it scans at once); less than ``MAX_LINE_BYTES``, so that only a line that
spans reads can be too long."""
MAX_LINE_BYTES = 16 << 20
"""The longest line a trace may have, in bytes of UTF-8 without its newline: 16 MiB. An event
line is about 100 bytes and a header a few hundred; a longer line is refused with a
:class:`TraceFormatError` naming the file, the line and this limit as soon as that much of it
has been read, so that reading holds at most this much of a line whatever the file (and,
scanning the longest line there can be, about 350 MB)."""
_BLANK = b"\t\n\x0b\x0c\r\x1c\x1d\x1e\x1f "
"""The ASCII bytes ``str.strip`` strips: text of these only is blank lines only (a line of other
Unicode spaces is blank too, but is found blank line by line)."""
_NOT_BLANK = re.compile(b"[^" + re.escape(_BLANK) + b"]")
_TEXT_BYTE = np.ones(256, dtype=np.bool_)
_TEXT_BYTE[list(_BLANK)] = False
"""Per byte value: whether a line holding it is not blank."""
_SHORT_LINE = 16
"""A chunk of lines shorter than this many bytes on average (an event line is about 50) has
its blank lines left out before it is scanned (:func:`_chunk_of`)."""


def _open_binary(path: str | os.PathLike[str]) -> io.BufferedIOBase:
    with open(path, "rb") as raw:
        magic = raw.read(2)
    if magic == _GZIP_MAGIC:
        return gzip.open(path, "rb")
    return open(path, "rb")


class _Chunk(NamedTuple):
    """Whole lines of a trace's text (:func:`_text_chunks`) and the numbers of those lines."""

    data: bytes
    """Lines, newlines ``\\n`` only (the file's last line may have none), valid UTF-8."""
    first_line: int
    """The number of the first line of ``data``."""
    numbers: npt.NDArray[np.int64] | None = None
    """The number of each line of ``data``, where blank lines were left out from between them;
    None: ``first_line``, ``first_line + 1``..."""

    def number(self, index: int) -> int:
        """The number of line ``index`` of ``data`` (0: the first)."""
        return self.first_line + index if self.numbers is None else int(self.numbers[index])

    def after(self, index: int, offset: int) -> _Chunk:
        """The lines from line ``index`` on, which begins at byte ``offset`` of ``data``."""
        numbers = None if self.numbers is None else self.numbers[index:]
        return _Chunk(self.data[offset:], self.first_line + index, numbers)


def _chunk_of(data: bytes, first_line: int, lines: int) -> _Chunk:
    """The chunk of ``data``, ``lines`` whole lines from line ``first_line`` on: without its
    blank lines (of ``_BLANK`` bytes) where they are many (the lines shorter than
    ``_SHORT_LINE`` bytes on average), left out by numpy passes over the bytes, not a step a
    line as the scanner takes."""
    if lines * _SHORT_LINE <= len(data):
        return _Chunk(data, first_line)
    buf = np.frombuffer(data, dtype=np.uint8)
    ends = np.flatnonzero(buf == 10)
    if len(ends) < lines:  # the file's last line, without its newline
        ends = np.append(ends, len(data))
    starts = np.empty_like(ends)
    starts[0], starts[1:] = 0, ends[:-1] + 1
    kept = np.logical_or.reduceat(_TEXT_BYTE[buf], starts)  # (each line has a byte: its newline)
    keep_bytes = np.repeat(kept, ends - starts + 1)[: len(data)]
    return _Chunk(buf[keep_bytes].tobytes(), first_line, first_line + np.flatnonzero(kept))


def _text_chunks(path: str | os.PathLike[str]) -> Iterator[_Chunk]:
    """Yield the file's text as whole lines, newlines normalised to ``\\n``, UTF-8 checked.

    Each chunk holds one or more whole lines (the last line of the file may lack its
    newline) and their numbers. Text that is blank lines only is counted and not yielded, and
    so are the blank lines of a chunk where they are many (:func:`_chunk_of`); a line cut
    across reads is joined once, when its end is read.

    Raises
    ------
    FileNotFoundError
        If the file does not exist.
    TraceFormatError
        For a line longer than ``MAX_LINE_BYTES`` (``FILE:LINE: line ...``), raised once that
        much of it is read; for any I/O, decompression or decoding error (``FILE: cannot read
        trace (...)``), or a directory; all once the lines before them were yielded.
    """
    name = os.fspath(path)
    line = 1  # the number of the next line
    try:
        with _open_binary(path) as raw:
            begun: list[bytes] = []  # the pieces of a line not ended yet
            begun_bytes = 0
            after_cr = False  # the last read ended with "\r": a "\n" first ends no line
            while True:
                block = raw.read(_CHUNK_BYTES)
                at_end = not block
                if after_cr and block.startswith(b"\n"):
                    block = block[1:]
                after_cr = block.endswith(b"\r")
                if b"\r" in block:  # universal newlines, as the text reader has them
                    block = block.replace(b"\r\n", b"\n").replace(b"\r", b"\n")
                first_end = block.find(b"\n")
                if begun_bytes + (len(block) if first_end < 0 else first_end) > MAX_LINE_BYTES:
                    raise TraceFormatError(
                        f"{name}:{line}: line longer than {MAX_LINE_BYTES} bytes "
                        f"({format_bytes(MAX_LINE_BYTES)}), the most a trace line may have (an "
                        "event is a line of about 100 bytes)"
                    )
                if not at_end and first_end < 0:
                    begun.append(block)
                    begun_bytes += len(block)
                    continue
                cut = block.rfind(b"\n") + 1
                data = b"".join([*begun, block[:cut]]) if begun_bytes else block[:cut]
                begun, begun_bytes = [block[cut:]], len(block) - cut
                if at_end and not data:
                    return
                lines = data.count(b"\n") + at_end  # at the end, a line with no newline
                blank = data.isspace() or not data.lstrip(_BLANK)  # isspace: 6x as fast
                if not blank:
                    if not data.isascii():
                        data.decode("utf-8")
                    yield _chunk_of(data, line, lines)
                line += lines
    except (OSError, EOFError, UnicodeDecodeError, zlib.error) as exc:
        _raise_read_error(name, exc)


def _lines_of(data: bytes) -> list[str]:
    """The lines of a chunk of :func:`_text_chunks`, each with its newline (the file's last one
    may have none)."""
    lines = [line + "\n" for line in data.decode("utf-8").split("\n")]
    lines[-1] = lines[-1][:-1]  # after the last newline: nothing, or a line without one
    if not lines[-1]:
        lines.pop()
    return lines


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
        self.origins: list[tuple[int, int, npt.NDArray[np.int64] | None]] = []
        """Per chunk: its first event, the number of its first line, and what each event's
        line number is more than that (None where that is the event's index in the chunk)."""

    def add(self, scanned: ScannedLines, chunk: _Chunk, n: int) -> None:
        """Add the first ``n`` rows of ``scanned``, read from the lines of ``chunk``."""
        lines = scanned.lines[:n]
        if chunk.numbers is not None:
            self.origins.append((self.count, 0, chunk.numbers[lines]))
        else:
            identity = not len(lines) or int(lines[-1]) == len(lines) - 1
            offsets = None if identity else lines.astype(np.int64)
            self.origins.append((self.count, chunk.first_line, offsets))
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
    scanned: ScannedLines, chunk: _Chunk, name: str
) -> tuple[int, TraceFormatError | None]:
    """Parse the lines the scanner left in ``chunk``, one by one, into their rows of
    ``scanned``.

    Returns how many rows are good and the error of the first bad line (None: none).
    """
    dropped: list[int] = []
    data = chunk.data
    for row in scanned.slow.tolist():
        index = int(scanned.lines[row])
        start, end = int(scanned.starts[index]), int(scanned.ends[index])
        line = data[start:end].decode("utf-8") + ("\n" if end < len(data) else "")
        where = f"{name}:{chunk.number(index)}"
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


def _header_of(chunk: _Chunk, name: str) -> tuple[dict[str, Any] | None, _Chunk]:
    """Find the header in the first chunk of :func:`_text_chunks`: its first line that is not
    blank, checked (:func:`_check_header`).

    Returns the header (None: the chunk is blank lines) and the chunk's lines after it. Blank
    lines of ASCII spaces are passed over in one search.
    """
    data = chunk.data
    at = index = 0  # a line's first byte, and its index in the chunk
    while (found := _NOT_BLANK.search(data, at)) is not None:
        start = data.rfind(b"\n", at, found.start()) + 1
        index += data.count(b"\n", at, start)
        at = data.find(b"\n", start) + 1 or len(data)
        where = f"{name}:{chunk.number(index)}"
        obj = _json_line(data[start:at].decode("utf-8"), where)
        index += 1
        if obj is not None:
            return _check_header(obj, where), chunk.after(index, at)
    return None, chunk.after(index, len(data))


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
        ``device_capacity_bytes`` that is not an integer in [0, 2**63), or a ``name`` longer
        than :data:`MAX_NAME_CHARS`), an unknown action, a missing field, an ``addr`` or
        ``size`` that is not an integer in [0, 2**63) (a ``stream`` in [-2**63, 2**63)), an
        alloc of a live address, or a free of an address that is not live, a line longer than
        :data:`MAX_LINE_BYTES`. The message names the file and the first bad line. Also for a
        file that cannot be read (``FILE: cannot read trace (...)``: I/O, decompression or
        UTF-8 errors; a directory), once the lines before the error were checked.

    Notes
    -----
    Lines are read a MiB at a time and turned into numpy columns without a Python object
    per event (``accelrt.trace._columns``); the few lines that are not plain events (escapes,
    huge numbers, errors) are read one by one by the reference code, so results and messages
    are those of the line-by-line reader. A line cut across reads is joined once; a MiB of
    blank lines is counted in one pass and not scanned. Memory: about 26 bytes an event while
    reading, 25 after; about 20 times the longest line (at most ``MAX_LINE_BYTES``) while it
    is scanned.
    """
    name = os.fspath(path)
    header: dict[str, Any] | None = None
    columns = _Columns()
    shapes: dict[bytes, _Shape] = {}
    error: TraceFormatError | None = None
    chunks = _text_chunks(path)
    while error is None:
        try:
            chunk = next(chunks)
        except StopIteration:
            break
        except TraceFormatError as exc:  # reported after the bad lines before it, if any
            error = exc
            break
        if header is None:
            header, chunk = _header_of(chunk, name)
        if not chunk.data:
            continue
        scanned = scan_lines(chunk.data, shapes)
        good, error = _read_slow_lines(scanned, chunk, name)
        columns.add(scanned, chunk, good)
    if header is None:
        if error is not None:
            raise error
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


MAX_NAME_CHARS = 4096
"""The longest header ``name`` a trace may have, in characters. The name heads every output of
``accelrt replay`` (and the picture's title); a longer one is refused, naming its length and
this limit, rather than cut short (a trace without a name goes by its file's name)."""


def _check_header_fields(obj: dict[str, Any], where: str) -> None:
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


def _check_header(obj: dict[str, Any], where: str) -> dict[str, Any]:
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
    full_header: dict[str, Any] = {"type": "header", "format": FORMAT, "format_version": 1}
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
