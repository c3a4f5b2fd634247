"""Reading accelrt's JSONL traces: the line-by-line reference reader and the fast one
(columns read by line shape, :mod:`._columns`), which gives the reference's results and
messages; both share the line assembly and its limit (:func:`_text_chunks`)."""

from __future__ import annotations

import array
import gzip
import io
import itertools
import json
import os
import re
import zlib
from collections.abc import Iterator
from typing import TYPE_CHECKING, NamedTuple

import numpy as np
import numpy.typing as npt

from .._text import shown
from .._units import format_bytes
from ._columns import (
    OP_ALLOC,
    OP_EMPTY_CACHE,
    OP_FREE,
    BoolArray,
    Int8Array,
    Int64Array,
    TraceEvent,
    TraceEvents,
    check_live,
    scan_lines,
)
from ._format import (
    _ACTIONS,
    _GZIP_MAGIC,
    Trace,
    TraceFormatError,
    _check_header,
    _int_field,
    _LiveSet,
)
from ._phases import header_phases

if TYPE_CHECKING:
    from ._columns import ScannedLines, _Shape

__all__ = ["MAX_LINE_BYTES", "load_jsonl"]


def _json_line(line: str, where: str) -> dict[str, object] | None:
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


def _event_fields(obj: dict[str, object], where: str) -> tuple[int, int, int, int, bool]:
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
    kept: list[bool] = []  # per event line: whether the trace keeps it
    live = _LiveSet()
    skipped = 0
    header: dict[str, object] | None = None
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
                kept.append(True)
                continue
            keep = include_host or not host
            if op == OP_ALLOC:
                live.alloc(addr, size, where, counted=keep)
            else:
                size, keep = live.free(addr, where)
            kept.append(keep)
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
        phases=header_phases(header, np.array(kept) if skipped else None, len(events)),
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
        self.arrays: list[array.array[int]] = [array.array(code) for code, _ in self._TYPES]
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
        columns: tuple[npt.NDArray[np.generic], ...] = (
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

    def columns(self) -> tuple[Int8Array, Int64Array, Int64Array, Int64Array, BoolArray]:
        """Return the five columns (op, addr, size, stream, host) as numpy arrays (no copy)."""
        op, addr, size, stream, host = self.arrays  # of the dtypes of _TYPES
        return (
            np.frombuffer(op, dtype=np.int8),
            np.frombuffer(addr, dtype=np.int64),
            np.frombuffer(size, dtype=np.int64),
            np.frombuffer(stream, dtype=np.int64),
            np.frombuffer(host, dtype=np.bool_),
        )


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


def _live_bytes(op: Int8Array, size: Int64Array) -> tuple[int, int]:
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


def _header_of(chunk: _Chunk, name: str) -> tuple[dict[str, object] | None, _Chunk]:
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
    header: dict[str, object] | None = None
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
    keep = None
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
        phases=header_phases(header, keep, len(op)),
    )
