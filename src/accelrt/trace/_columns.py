"""Trace events in compact columns, and the numpy machinery that reads them from JSON Lines.

A trace of N events is four numpy arrays (``op`` int8, ``addr``/``size``/``stream`` int64): 25
bytes an event, against about 190 for a list of :class:`TraceEvent` tuples. :class:`TraceEvents`
is those columns behind the ``Sequence[TraceEvent]`` interface that callers have always used
(``len``, indexing, iteration, ``==`` against a list of events); code that wants speed reads the
arrays.

:func:`scan_lines` is the vectorised half of the JSONL reader (``_jsonl.load_jsonl`` is the
other half, and owns every error message). It reads the lines of a text chunk without a
``json.loads`` per line: each line is reduced to its *shape*, the line with every run of
digits collapsed to one character (``"addr":139744882716736`` becomes ``"addr":1``). A real
trace has a few hundred distinct shapes; each is parsed once with ``json.loads`` and the
reference rules, which tell whether its lines are plain alloc/free/empty_cache events and which
digit runs hold ``addr``, ``size`` and ``stream``. The values are then read from the digit runs
with numpy. A line whose shape is not plain (escapes, nested values, a number of more than 18
digits, an unknown action, a missing or negative field...) is returned as *slow*: the caller
parses it alone with the reference code, which also names its error.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import NamedTuple, TypeVar, overload

import numpy as np
import numpy.typing as npt

__all__ = [
    "ACTIONS",
    "OP_ALLOC",
    "OP_EMPTY_CACHE",
    "OP_FREE",
    "LiveCheck",
    "ScannedLines",
    "TraceEvent",
    "TraceEvents",
    "check_live",
    "scan_lines",
]

OP_ALLOC = 0
OP_FREE = 1
OP_EMPTY_CACHE = 2
ACTIONS = ("alloc", "free", "empty_cache")
"""``ACTIONS[op]`` is the action of op code ``op``."""
_OP_OF = {action: op for op, action in enumerate(ACTIONS)}

Int64Array = npt.NDArray[np.int64]
Int8Array = npt.NDArray[np.int8]
BoolArray = npt.NDArray[np.bool_]

_ITER_CHUNK = 8192
_BLOCK = 1 << 20
"""Events handled at a time by the blockwise steps of :func:`check_live`."""
_MAX_DIGITS = 18
"""Digit runs up to this long are read by numpy (10**18 - 1 < 2**63); longer ones go slow."""


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


_G = TypeVar("_G", bound=np.generic)


def _column(values: npt.ArrayLike, dtype: type[_G], name: str) -> npt.NDArray[_G]:
    array = np.ascontiguousarray(values, dtype=dtype)
    if array.ndim != 1:
        raise ValueError(f"column {name!r} must be one-dimensional, got shape {array.shape}")
    array.setflags(write=False)
    return array


class TraceEvents(Sequence[TraceEvent]):
    """The events of a trace as columns; a read-only ``Sequence[TraceEvent]``.

    Parameters
    ----------
    op : array-like of int8
        Op codes: ``OP_ALLOC`` (0), ``OP_FREE`` (1), ``OP_EMPTY_CACHE`` (2).
    addr, size, stream : array-like of int64
        Address, requested bytes and stream of each event (0 for ``empty_cache``).

    Raises
    ------
    ValueError
        If the columns are not one-dimensional, differ in length, or ``op`` holds a code
        outside [0, 2].

    Notes
    -----
    The arrays are copied only where needed to make them contiguous of the right dtype, and
    are made read-only. Indexing returns a :class:`TraceEvent`, a slice another
    ``TraceEvents``; iteration builds the tuples a chunk at a time. Equality holds against
    another ``TraceEvents`` with equal columns or any sequence of equal events.
    """

    __slots__ = ("addr", "op", "size", "stream")
    __hash__ = None  # type: ignore[assignment]  # compared by value, like a list

    op: Int8Array
    addr: Int64Array
    size: Int64Array
    stream: Int64Array

    def __init__(
        self, op: npt.ArrayLike, addr: npt.ArrayLike, size: npt.ArrayLike, stream: npt.ArrayLike
    ) -> None:
        self.op = _column(op, np.int8, "op")
        self.addr = _column(addr, np.int64, "addr")
        self.size = _column(size, np.int64, "size")
        self.stream = _column(stream, np.int64, "stream")
        n = len(self.op)
        if not len(self.addr) == len(self.size) == len(self.stream) == n:
            raise ValueError(
                f"columns differ in length: op {n}, addr {len(self.addr)}, "
                f"size {len(self.size)}, stream {len(self.stream)}"
            )
        if n and not (int(self.op.min()) >= 0 and int(self.op.max()) < len(ACTIONS)):
            raise ValueError(f"op codes must be in [0, {len(ACTIONS)}), got {np.unique(self.op)}")

    @classmethod
    def from_events(cls, events: Iterable[TraceEvent | tuple[str, int, int, int]]) -> TraceEvents:
        """Build the columns from ``(action, addr, size, stream)`` tuples.

        A stream handle in [2**63, 2**64) (an unsigned native handle, as snapshots may give)
        is stored as the int64 with the same bits, as a C cast would.

        Raises
        ------
        ValueError
            For an unknown action.
        OverflowError
            For an address, size or stream outside int64 (streams: outside [-2**63, 2**64)).
        """
        rows = list(events)
        try:
            op = [_OP_OF[row[0]] for row in rows]
        except KeyError as exc:
            raise ValueError(f"unknown action {exc.args[0]!r}; expected one of {ACTIONS}") from None
        return cls.from_columns(
            op, [row[1] for row in rows], [row[2] for row in rows], [row[3] for row in rows]
        )

    @classmethod
    def from_columns(
        cls,
        op: Sequence[int],
        addr: Sequence[int],
        size: Sequence[int],
        stream: Sequence[int],
    ) -> TraceEvents:
        """Build the columns from four sequences of ints: op codes (``OP_ALLOC``...),
        addresses, sizes and streams, as :meth:`from_events` stores them.

        Raises
        ------
        OverflowError
            For an address, size or stream outside int64 (streams: outside [-2**63, 2**64)).
        """
        try:
            streams = np.array(stream, dtype=np.int64)
        except OverflowError:  # an unsigned native handle: the int64 with the same bits
            streams = np.array([_signed(s) for s in stream], dtype=np.int64)
        return cls(
            np.array(op, dtype=np.int8),
            np.array(addr, dtype=np.int64),
            np.array(size, dtype=np.int64),
            streams,
        )

    @property
    def nbytes(self) -> int:
        """Bytes held by the four columns."""
        return int(self.op.nbytes + self.addr.nbytes + self.size.nbytes + self.stream.nbytes)

    def __len__(self) -> int:
        return len(self.op)

    @overload
    def __getitem__(self, index: int) -> TraceEvent: ...

    @overload
    def __getitem__(self, index: slice) -> TraceEvents: ...

    def __getitem__(self, index: int | slice) -> TraceEvent | TraceEvents:
        if isinstance(index, slice):
            return TraceEvents(
                self.op[index], self.addr[index], self.size[index], self.stream[index]
            )
        i = range(len(self))[index]  # IndexError and negative indices as a list has them
        return TraceEvent(
            ACTIONS[int(self.op[i])], int(self.addr[i]), int(self.size[i]), int(self.stream[i])
        )

    def __iter__(self) -> Iterator[TraceEvent]:
        for lo in range(0, len(self), _ITER_CHUNK):
            hi = lo + _ITER_CHUNK
            rows = zip(
                self.op[lo:hi].tolist(),
                self.addr[lo:hi].tolist(),
                self.size[lo:hi].tolist(),
                self.stream[lo:hi].tolist(),
                strict=True,
            )
            for op, addr, size, stream in rows:
                yield TraceEvent(ACTIONS[op], addr, size, stream)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, TraceEvents):
            return (
                np.array_equal(self.op, other.op)
                and np.array_equal(self.addr, other.addr)
                and np.array_equal(self.size, other.size)
                and np.array_equal(self.stream, other.stream)
            )
        if isinstance(other, Sequence) and not isinstance(other, (str, bytes)):
            return len(other) == len(self) and all(a == b for a, b in zip(self, other, strict=True))
        return NotImplemented

    def __repr__(self) -> str:
        return f"TraceEvents({len(self)} events, {self.nbytes} bytes)"


# --- the vectorised reader ------------------------------------------------------------------

KIND_BLANK = 0
KIND_EVENT = 1
KIND_SLOW = 2

_DIGIT_RUN = re.compile(r"[0-9]+")
_STRING = re.compile(r'"[^"]*"')
_PAIR = re.compile(r'"([^"]*)"\s*:\s*("[^"]*"|[^,"}]+)')
_FIELDS = ("addr", "size", "stream")
_PLAIN_HOST = (int, bool, str, type(None))  # truthiness survives digit collapsing; floats'
# does not (0.05 collapses to 0.00)


@dataclass(frozen=True)
class _Shape:
    """What one line shape is: blank, slow, or an event whose fields sit in known digit runs."""

    kind: int
    op: int = OP_EMPTY_CACHE
    runs: tuple[int, int, int] = (-1, -1, -1)
    """Index, among the line's digit runs, of the addr, size and stream values (-1: absent)."""
    negative_stream: bool = False
    host: bool = False


_SLOW = _Shape(KIND_SLOW)


def _shape_of(shape: bytes) -> _Shape:
    """Classify one line shape with the reference rules (json.loads, the field checks)."""
    text = shape.decode("utf-8", "replace")
    if not text.strip():
        return _Shape(KIND_BLANK)
    if "\\" in text:
        return _SLOW  # escapes could spell a key or change a value: read the line alone
    try:
        obj = json.loads(text)
    except (ValueError, RecursionError):
        return _SLOW
    if not isinstance(obj, dict):
        return _SLOW
    action = obj.get("action")
    if action == "empty_cache":
        return _Shape(KIND_EVENT, OP_EMPTY_CACHE)  # the reference reads nothing else
    if action not in ("alloc", "free"):
        return _SLOW
    values = {key: obj.get(key) for key in _FIELDS}
    for key, value in values.items():
        if value is None and key == "stream" and "stream" not in obj:
            continue
        if type(value) is not int or (key != "stream" and value < 0):
            return _SLOW
    if type(obj.get("host")) not in _PLAIN_HOST:
        return _SLOW
    outside_strings = _STRING.sub('""', text)
    if outside_strings.count("{") != 1 or "[" in outside_strings:
        return _SLOW  # only flat objects: positions below are then unambiguous
    runs = {}
    inner = text.index("{") + 1
    for match in _PAIR.finditer(text, inner):
        key = match.group(1)
        if key in _FIELDS:  # the last of duplicate keys wins, as in json.loads
            runs[key] = (len(_DIGIT_RUN.findall(text, 0, match.start(2))), match.group(2))
    if set(runs) != {key for key in _FIELDS if key in obj}:
        return _SLOW
    for _, token in runs.values():
        if not re.fullmatch(r"-?[01]0?\s*", token):
            return _SLOW
    stream_run, stream_token = runs.get("stream", (-1, ""))
    return _Shape(
        KIND_EVENT,
        _OP_OF[action],
        (runs["addr"][0], runs["size"][0], stream_run),
        stream_token.startswith("-"),
        bool(obj.get("host")),
    )


@dataclass
class ScannedLines:
    """The lines of one chunk, read by :func:`scan_lines`.

    Attributes
    ----------
    starts, ends : ndarray of int64
        Byte offsets of each line in the chunk (``ends`` excludes the newline).
    lines : ndarray of intp
        Index (among the chunk's lines) of each non-blank line: one event each, in order.
    slow : ndarray of intp
        Positions in ``lines`` (and the columns) of the lines to be read one by one.
    op, addr, size, stream : ndarray
        The event columns, one row per non-blank line; the rows of slow lines hold zeros.
    host : ndarray of bool
        Whether the line's ``host`` field is truthy (False for empty_cache).
    """

    starts: Int64Array
    ends: Int64Array
    lines: npt.NDArray[np.intp]
    slow: npt.NDArray[np.intp]
    op: Int8Array
    addr: Int64Array
    size: Int64Array
    stream: Int64Array
    host: BoolArray


_DIGITS_TO_FF = bytes(0xFF if 48 <= b <= 57 else b for b in range(256))
"""Every ASCII digit becomes 0xFF, a byte that valid UTF-8 never holds."""


def _read_runs(buf: npt.NDArray[np.uint8], starts: Int64Array, ends: Int64Array) -> Int64Array:
    """The values of the decimal digit runs ``buf[starts:ends]`` (each at most 18 digits)."""
    values = np.zeros(len(starts), dtype=np.int64)
    lengths = ends - starts
    for j in range(int(lengths.max(initial=0))):
        rows = np.flatnonzero(lengths > j)
        values[rows] = values[rows] * 10 + (buf[starts[rows] + j] - 48)
    return values


def scan_lines(data: bytes, shapes: dict[bytes, _Shape]) -> ScannedLines:
    """Read the event lines of a chunk of a trace's body (after its header) into columns.

    Parameters
    ----------
    data : bytes
        Whole lines of valid UTF-8, newlines ``\\n`` only (the last line may lack its
        newline).
    shapes : dict
        The cache of classified line shapes, kept by the caller across chunks.

    Returns
    -------
    ScannedLines
    """
    if not data.endswith(b"\n"):
        data += b"\n"  # (the caller knows whether the last line had one)
    buf = np.frombuffer(data, dtype=np.uint8)
    ends = np.flatnonzero(buf == 10).astype(np.int64)
    starts = np.empty_like(ends)
    starts[:1] = 0
    starts[1:] = ends[:-1] + 1
    # The shape of a line: each digit run becomes "0" (the number 0), "1" (starts with 1-9)
    # or "00" (a leading zero: invalid as a JSON number, as the original is); the rest of the
    # run is marked 0xFF and deleted.
    marked = bytearray(data.translate(_DIGITS_TO_FF))
    shape = np.frombuffer(marked, dtype=np.uint8)
    is_digit = shape == 0xFF
    edges = np.flatnonzero(is_digit[1:] != is_digit[:-1]).astype(np.int64) + 1
    del is_digit
    if data[:1].isdigit():
        edges = np.concatenate(([0], edges))
    run_starts, run_ends = edges[0::2], edges[1::2]  # the last byte is a newline: runs close
    del edges
    leading_zero = buf[run_starts] == 48
    shape[run_starts] = np.where(leading_zero, 48, 49).astype(np.uint8)
    shape[run_starts[leading_zero & (run_ends - run_starts > 1)] + 1] = 48
    line_shapes = bytes(marked).translate(None, b"\xff").split(b"\n")
    del marked, shape, leading_zero
    line_shapes.pop()  # after the last newline
    index = dict.fromkeys(line_shapes, 0)
    table: list[_Shape] = []
    for position, key in enumerate(index):
        index[key] = position
        known = shapes.get(key)
        if known is None:
            known = shapes[key] = _shape_of(key)
        table.append(known)
    shape_ids = np.fromiter(map(index.__getitem__, line_shapes), dtype=np.intp)
    del line_shapes, index
    kinds = np.array([s.kind for s in table], dtype=np.int8)[shape_ids]
    # lines that must be read alone whatever their shape: escapes, numbers too long for int64
    odd = run_starts[run_ends - run_starts > _MAX_DIGITS]
    if b"\\" in data:
        odd = np.concatenate((odd, np.flatnonzero(buf == 92)))
    if len(odd):
        odd_lines = np.searchsorted(ends, odd, side="right")
        kinds[odd_lines[kinds[odd_lines] == KIND_EVENT]] = KIND_SLOW
    lines = np.flatnonzero(kinds != KIND_BLANK)
    ids = shape_ids[lines]
    line_kinds = kinds[lines]
    del shape_ids, kinds
    slow = np.flatnonzero(line_kinds == KIND_SLOW)
    op = np.array([s.op for s in table], dtype=np.int8)[ids]
    host = np.array([s.host for s in table], dtype=np.bool_)[ids]
    n = len(lines)
    addr = np.zeros(n, dtype=np.int64)
    size = np.zeros(n, dtype=np.int64)
    stream = np.zeros(n, dtype=np.int64)
    rows = np.flatnonzero((line_kinds == KIND_EVENT) & (op != OP_EMPTY_CACHE))
    if len(rows):
        row_ids = ids[rows]
        first_run = np.searchsorted(run_starts, starts[lines[rows]])
        for k, column in enumerate((addr, size, stream)):
            which = np.array([s.runs[k] for s in table], dtype=np.int64)[row_ids]
            present = which >= 0
            run = (first_run + which)[present]
            column[rows[present]] = _read_runs(buf, run_starts[run], run_ends[run])
        negative = np.array([s.negative_stream for s in table], dtype=np.bool_)[row_ids]
        stream[rows[negative]] *= -1
    host[slow] = False
    op[slow] = OP_EMPTY_CACHE
    return ScannedLines(starts, ends, lines, slow, op, addr, size, stream, host)


# --- the live set, checked over whole columns -----------------------------------------------


class LiveCheck(NamedTuple):
    """What :func:`check_live` found.

    Attributes
    ----------
    first_bad : int
        Index of the first event that allocates a live address or frees one that is not
        live (-1: none).
    """

    first_bad: int


def check_live(op: Int8Array, addr: Int64Array, size: Int64Array, host: BoolArray) -> LiveCheck:
    """Check alloc/free consistency over whole columns; give each free its alloc's size and tag.

    An address's events, in order, must go alloc, free, alloc, free... The first event that
    breaks this (in event order) is the one a sequential reader would refuse. ``size`` and
    ``host`` of each free before that event are overwritten in place with its alloc's (a free
    reports the allocation's size, and is a host event exactly when its alloc was).

    Returns
    -------
    LiveCheck
    """
    # Memory matters here (a 3 M-event trace must stay under 60 bytes an event): beside the
    # columns, one index array of 8 bytes an event and a few of one byte; the rest is done a
    # block at a time. empty_cache events are left out only where the trace has any.
    if np.any(op == OP_EMPTY_CACHE):
        pairs = np.flatnonzero(op != OP_EMPTY_CACHE)
        order = pairs[np.argsort(addr[pairs], kind="stable")]
        del pairs
    else:
        order = np.argsort(addr, kind="stable")
    # order: event indices grouped by address, in event order within each address
    n = len(order)
    new_address = np.ones(n, dtype=np.bool_)
    for lo in range(1, n, _BLOCK):
        hi = min(n, lo + _BLOCK)
        np.not_equal(addr[order[lo:hi]], addr[order[lo - 1 : hi - 1]], out=new_address[lo:hi])
    is_alloc = op[order] == OP_ALLOC
    # an address's first event must be an alloc; after that each must differ from the one before
    bad = ~is_alloc & new_address
    bad[1:] |= ~new_address[1:] & (is_alloc[1:] == is_alloc[:-1])
    first_bad = int(order[bad].min()) if bad.any() else -1
    del bad
    freeing = ~new_address & ~is_alloc  # a free, and the event before it its alloc
    del new_address, is_alloc
    for lo in range(1, n, _BLOCK):
        frees = np.flatnonzero(freeing[lo : lo + _BLOCK]) + lo
        freed, allocated = order[frees], order[frees - 1]
        if first_bad >= 0:
            before = freed < first_bad
            freed, allocated = freed[before], allocated[before]
        size[freed] = size[allocated]
        host[freed] = host[allocated]
    return LiveCheck(first_bad)


def _signed(handle: int) -> int:
    """An unsigned 64-bit stream handle as the int64 with the same bits (others unchanged)."""
    return handle - (1 << 64) if handle >= 1 << 63 else handle
