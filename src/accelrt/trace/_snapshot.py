"""PyTorch memory snapshot pickles as traces: safe reading, the start state, the recorded figures.

A snapshot (``torch.cuda.memory._dump_snapshot``) holds the allocator's end state (segments and
their blocks) and, when history was recorded, a ring buffer of events per device. To replay it
exactly (docs/allocator.md section 13) this module

- reads the pickle with an unpickler that admits only plain data (no globals: nothing runs),
  after walking its opcodes once without building anything, so that a file cannot claim more
  memory than its own length backs (huge declared lengths, memo bombs);
- checks the decoded snapshot against PyTorch's schema, as far as accelrt uses it, naming the
  place inside the file of anything wrong (``segments[3].blocks[2].size: ...``);
- rewinds the device's events from the end state to get the segments and blocks that existed
  when recording began (:class:`SegmentState`), leaving out what could not be restored;
- keeps the addresses PyTorch's device returned for new segments, in order;
- marks where the program called ``empty_cache()`` (a run of ``segment_free`` entries);
- measures what PyTorch's allocator reserved (:class:`Recording`).
"""

from __future__ import annotations

import io
import os
import pickle
import re
import struct
from bisect import bisect_right, insort
from dataclasses import dataclass
from functools import cache
from typing import Any, NamedTuple

from ..memory._config import AllocatorConfig
from ..memory._policy import (
    K_MIN_BLOCK_SIZE,
    K_SMALL_BUFFER,
    MAX_REQUEST_BYTES,
    UNLIMITED,
    expandable_address_space,
    page_size,
    round_size,
    should_split,
)
from ._format import Trace, TraceEvent, TraceFormatError

__all__ = [
    "MAX_FILE_VALUE",
    "BlockState",
    "Recording",
    "SegmentState",
    "UNMAPPED",
    "devices_with_history",
    "read_snapshot",
    "trace_from_snapshot",
]

MAX_FILE_VALUE = 1 << 63
"""Sizes and addresses in a snapshot are below this (a larger one is a damaged file)."""

_ALLOCATED_STATES = ("active_allocated", "active_pending_free")
_FAILED_ADDR = 0
"""The address of a request that ran out of memory (it never got one)."""
_SEGMENT_ENTRIES = ("segment_alloc", "segment_free", "segment_map", "segment_unmap")
_ADDR_ACTIONS = frozenset(("alloc", "free_requested", "free_completed", *_SEGMENT_ENTRIES))
"""Trace entries with an ``addr`` and a ``size``; of the others only ``oom`` is read."""


# --------------------------------------------------------------------------- reading the pickle


class _Refused(pickle.UnpicklingError):
    """The pickle names code (a global or a persistent id)."""


class _PlainDataUnpickler(pickle.Unpickler):
    """Refuses every global and persistent id: what it builds is plain data only.

    Dicts, lists, flat tuples, strings, bytes, numbers, booleans and None (what
    :func:`_scan_pickle` lets through).
    """

    def find_class(self, module: str, name: str) -> Any:
        raise _Refused(f"global '{module}.{name}'")

    def persistent_load(self, pid: Any) -> Any:
        raise _Refused(f"persistent id {_describe(pid)}")


# The pickle opcodes (pickletools.opcodes, protocols 0 to 5) by what follows them.
_NO_ARGUMENT = b"(012NQRabdelostu})]\x81\x85\x86\x87\x88\x89\x8f\x90\x91\x92\x93\x94\x97\x98"
_FIXED_ARGUMENT = {
    **dict.fromkeys(b"Khq\x80\x82", 1),
    **dict.fromkeys(b"M\x83", 2),
    **dict.fromkeys(b"Jjr\x84", 4),
    **dict.fromkeys(b"G\x95", 8),
}
_COUNTED = {  # opcode: struct format of the byte count that follows it
    **dict.fromkeys(b"\x8aUC\x8c", "<B"),
    **dict.fromkeys(b"T\x8b", "<i"),
    **dict.fromkeys(b"XB", "<I"),
    **dict.fromkeys(b"\x8d\x8e\x96", "<Q"),
}
_TO_NEWLINE = {**dict.fromkeys(b"ILSVFgpP", 1), **dict.fromkeys(b"ci", 2)}  # lines of argument
_STOP, _FRAME, _PUT, _LONG_BINPUT = 0x2E, 0x95, 0x70, 0x72
_LONGS = (0x8A, 0x8B)  # LONG1, LONG4: an int of that many bytes
_TEXT_INTS = b"IL"
_TUPLES = b"t\x85\x86\x87"
_SETS = b"\x8f\x90\x91"
_CODE = b"ciPQRo\x81\x82\x83\x84\x92\x93"
"""Globals, calls and persistent ids: the unpickler refuses or fails on each (plain data is
not callable), so it never reads past one. BUILD, which passes on plain data with a None
state, is refused outright: no snapshot has one."""
_BUILD = 0x62
_LARGEST_INT_BYTES = 9
"""Ints take at most 9 bytes (a stream pointer below 2**64): hashing one stays cheap."""


def _counted_alternatives(openers: bytes, longest: int) -> bytes:
    """A regex for an opcode of ``openers``, a 1-byte count n <= ``longest`` and n bytes."""
    counts = b"|".join(re.escape(bytes([n])) + b".{%d}" % n for n in range(longest + 1))
    return b"[" + re.escape(openers) + b"](?:" + counts + b")"


@cache
def _plain_run() -> re.Pattern[bytes]:
    """A regex for a run of opcodes that claim no memory and build no nested tuple.

    It is matched at C speed. Left out, for :func:`_scan_pickle` to walk one by one: STOP,
    FRAME, opcodes with a longer count or a text argument, ``LONG_BINPUT`` to a memo index of
    65536 or more, sets, and any tuple but one of 1 to 16 scalars (ints, floats, short
    strings, None, booleans) pushed right before it. Hashing a tuple (as a dict key) walks it
    recursively, so a deeply nested one crashes Python and a shared one takes forever.
    """
    memo_put = b"(?:\x94|q.|r..\x00\x00)?"  # a string is memoized after it is pushed
    scalar = (
        b"(?:"
        + b"|".join(
            [
                _counted_alternatives(b"\x8a", 8),
                b"K.",
                b"J....",
                _counted_alternatives(b"\x8cCU", 255),
                b"M..",
                b"[N\x88\x89]",
                b"G.{8}",
            ]
        )
        + b")"
        + memo_put
    )
    first = b"(?=[\x8aKJ\x8cCUMN\x88\x89G])"  # what a scalar starts with
    # A scalar, and the TUPLE1/2/3 of it and the scalars right after it, if there is one.
    scalars = scalar + b"(?:\x85|" + first + scalar + b"(?:\x86|" + first + scalar + b"\x87)|)"
    # MARK, and the TUPLE of up to 16 scalars after it, if there is one.
    mark = b"\\((?:(?=[\x8aKJ\x8cCUMN\x88\x89Gt])(?:" + scalar + b"){0,16}+t|)"
    left_out = b"(bN\x88\x89" + _TUPLES + _SETS + _CODE
    plain = bytes(c for c in _NO_ARGUMENT if c not in left_out)
    alternatives = [  # the most frequent in PyTorch's snapshots first
        b"h.",
        b"j....",
        mark,
        b"[" + re.escape(plain) + b"]",
        scalars,
        b"[q\x80].",
        b"r..\x00\x00",
    ]
    return re.compile(b"(?:" + b"|".join(alternatives) + b")*+", re.DOTALL)


def _scan_pickle(data: bytes) -> str | int | None:
    """Walk the opcodes of ``data`` without building anything; return the first problem.

    The problem is a message, or the position of the first opcode that names or calls code
    (a global, a persistent id, a call): the unpickler, safe up to there, refuses it by name.

    Refused: an unknown opcode, no STOP, a claim the file's own bytes cannot back (a string,
    bytes or frame longer than what follows it, a memo index above the file's length: the
    unpickler sizes its memo by the largest index), an int of more than 9 bytes, a set, and a
    tuple holding anything but scalars (see :func:`_plain_run`). What is left builds at most
    a few objects per byte, none of them costly to hash.
    """
    end = len(data)
    run = _plain_run().match
    pos = 0
    while True:
        match = run(data, pos)
        pos = match.end() if match is not None else pos
        if pos >= end:
            return "no STOP opcode: the data is truncated"
        op = data[pos]
        if op == _STOP:
            return None
        if op in _CODE:
            return pos
        if op in _COUNTED:
            fmt = _COUNTED[op]
            head = struct.calcsize(fmt)
            if pos + 1 + head > end:
                return f"truncated at byte {pos}"
            (count,) = struct.unpack_from(fmt, data, pos + 1)
            if not 0 <= count <= end - pos - 1 - head:
                return (
                    f"opcode at byte {pos} declares {count} bytes, more than the "
                    f"{end - pos - 1 - head} that follow"
                )
            if op in _LONGS and count > _LARGEST_INT_BYTES:
                return f"an int of {count} bytes at byte {pos}"
            pos += 1 + head + count
        elif op in _FIXED_ARGUMENT:
            size = _FIXED_ARGUMENT[op]
            if pos + 1 + size > end:
                return f"truncated at byte {pos}"
            if op == _FRAME:
                (count,) = struct.unpack_from("<Q", data, pos + 1)
                if count > end - pos - 9:
                    return (
                        f"frame at byte {pos} declares {count} bytes, more than the "
                        f"{end - pos - 9} that follow"
                    )
            elif op == _LONG_BINPUT:
                (index,) = struct.unpack_from("<I", data, pos + 1)
                if index > end:
                    return f"memo index {index} at byte {pos} in a file of {end} bytes"
            pos += 1 + size
        elif op in _TO_NEWLINE:
            line_start = pos + 1
            for _ in range(_TO_NEWLINE[op]):
                newline = data.find(b"\n", pos + 1)
                if newline < 0:
                    return f"truncated at byte {pos}"
                pos = newline
            text = data[line_start:pos]
            if op == _PUT and (not text.isdigit() or len(text) > 20 or int(text) > end):
                return f"memo index {_describe(text)} at byte {line_start - 1}"
            if op in _TEXT_INTS and len(text) > 24:
                return f"an int of {len(text)} digits at byte {line_start - 1}"
            pos += 1
        elif op in _TUPLES:
            return (
                f"a tuple of containers or shared values at byte {pos}: hashing one can "
                "crash or hang Python"
            )
        elif op in _SETS:
            return f"a set at byte {pos}"
        elif op == _BUILD:
            return f"BUILD at byte {pos}: the state of an object, not plain data"
        else:
            return f"unknown opcode {op:#04x} at byte {pos}"


_DECODING_ERRORS = (
    pickle.UnpicklingError,
    EOFError,
    ValueError,
    TypeError,
    LookupError,
    AttributeError,
    ArithmeticError,
    MemoryError,
    RecursionError,
    struct.error,
)
"""What the unpickler raises for damaged data (it stops: nothing half-built is kept)."""


def _one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split()) or type(exc).__name__
    return text if len(text) <= 160 else text[:157] + "..."


def read_snapshot(path: str | os.PathLike[str]) -> dict[str, Any]:
    """Read a PyTorch memory snapshot pickle without running any code, and check it.

    Parameters
    ----------
    path : str or path-like
        A file written by ``torch.cuda.memory._dump_snapshot`` or ``accelrt.dump_snapshot``.

    Returns
    -------
    dict
        The snapshot: ``segments``, ``device_traces`` and maybe ``allocator_settings``, checked
        against PyTorch's schema as far as accelrt reads it.

    Raises
    ------
    TraceFormatError
        If the pickle names any global (a class or function: code), is damaged, claims more
        than its length can hold (a string or frame longer than the file, a memo bomb, more
        entries than bytes), or is not a snapshot: one line naming the file and, for a bad
        value, where it is inside the file (``segments[3].blocks[2].size: ...``). Nothing in
        the file is executed either way.
    """
    name = os.fspath(path)
    with open(path, "rb") as f:
        data = f.read()
    problem = _scan_pickle(data)
    if isinstance(problem, str):
        raise TraceFormatError(f"{name}: not a readable pickle ({problem})")
    plain_only = "accelrt reads snapshots as plain data only and ran nothing from it"
    calls = f"{name}: refused: the pickle calls code (opcode at byte {problem}); {plain_only}"
    try:
        # Where the walk stopped at code, the unpickler stops there too: it refuses globals
        # and persistent ids, and plain data cannot be called, so it never reads past it.
        snapshot = _PlainDataUnpickler(io.BytesIO(data)).load()
    except _Refused as exc:
        raise TraceFormatError(
            f"{name}: refused: the pickle names {exc}, i.e. code; {plain_only}"
        ) from None
    except _DECODING_ERRORS as exc:
        if problem is not None:
            raise TraceFormatError(calls) from None
        reason = "out of memory" if isinstance(exc, MemoryError) else _one_line(exc)
        raise TraceFormatError(f"{name}: not a readable pickle ({reason})") from None
    if problem is not None:  # code that neither failed nor was refused: never expected
        raise TraceFormatError(calls)
    if not isinstance(snapshot, dict) or "segments" not in snapshot:
        raise TraceFormatError(
            f"{name}: not a PyTorch memory snapshot (expected a dict with 'segments' and "
            f"'device_traces'; got {type(snapshot).__name__})"
        )
    _check_snapshot(snapshot, name, budget=len(data))
    snapshot.setdefault("device_traces", [])
    return snapshot


# --------------------------------------------------------------------------- the schema


def _describe(value: Any) -> str:
    """A short, one-line description of a decoded value for a message (bounded work)."""
    if value is None or isinstance(value, (bool, float)):
        return repr(value)
    if isinstance(value, int):
        bits = value.bit_length()
        return repr(value) if bits <= 128 else f"an int of {bits} bits"
    if isinstance(value, (str, bytes)):
        text = repr(value[:40])
        return text + "..." if len(value) > 40 else text
    if isinstance(value, (list, tuple, dict, set, frozenset)):
        return f"a {type(value).__name__} of {len(value)} items"
    return f"a {type(value).__name__}"


class _Problem(Exception):
    """Something in a snapshot does not fit its schema; the message starts with its path."""


def _is_int(value: Any) -> bool:
    return type(value) is int or (isinstance(value, int) and not isinstance(value, bool))


_NON_NEGATIVE = "a non-negative int below 2**63"
_POSITIVE = "a positive int below 2**63"
_INT64 = "an int in [-2**63, 2**64)"
_FIELDS: dict[str, tuple[str, Any]] = {  # what a field holds, and a test of its value
    "non-negative": (_NON_NEGATIVE, lambda v: _is_int(v) and 0 <= v < MAX_FILE_VALUE),
    "positive": (_POSITIVE, lambda v: _is_int(v) and 0 < v < MAX_FILE_VALUE),
    "int64": (_INT64, lambda v: _is_int(v) and -MAX_FILE_VALUE <= v < 2 * MAX_FILE_VALUE),
    "str": ("a str", lambda v: isinstance(v, str)),
    "bool": ("a bool", lambda v: isinstance(v, bool)),
    "list": ("a list", lambda v: isinstance(v, list)),
    "segment_type": ("'small' or 'large'", lambda v: v in ("small", "large")),
}


def _field(obj: dict[str, Any], key: str, path: str, kind: str, *, optional: bool = False) -> Any:
    """Return ``obj[key]`` if it is a ``kind`` (None if optional and absent), else raise."""
    if key not in obj:
        if optional:
            return None
        raise _Problem(f"{path}: missing {key!r}")
    value = obj[key]
    what, test = _FIELDS[kind]
    if not test(value):
        raise _Problem(f"{path}.{key}: expected {what}, got {_describe(value)}")
    return value


def _dict_at(value: Any, path: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise _Problem(f"{path}: expected a dict, got {_describe(value)}")
    return value


def _check_segment(seg: Any, path: str) -> None:
    """Check one segment and its blocks (the slow, precise way)."""
    seg = _dict_at(seg, path)
    _field(seg, "device", path, "non-negative", optional=True)
    _field(seg, "address", path, "non-negative")
    _field(seg, "total_size", path, "positive")
    _field(seg, "stream", path, "int64", optional=True)
    _field(seg, "segment_type", path, "segment_type", optional=True)
    _field(seg, "is_expandable", path, "bool", optional=True)
    blocks = _field(seg, "blocks", path, "list")
    for k, block in enumerate(blocks):
        where = f"{path}.blocks[{k}]"
        block = _dict_at(block, where)
        _field(block, "address", where, "non-negative")
        _field(block, "size", where, "positive")
        _field(block, "requested_size", where, "non-negative", optional=True)
        _field(block, "state", where, "str")


def _check_entry(entry: Any, path: str) -> None:
    """Check one trace entry (the slow, precise way: on a problem the fast loop found)."""
    entry = _dict_at(entry, path)
    action = _field(entry, "action", path, "str")
    if action in _ADDR_ACTIONS:
        _field(entry, "addr", path, "non-negative")
        _field(entry, "size", path, "non-negative")
        _field(entry, "stream", path, "int64", optional=True)
    elif action == "oom":
        _field(entry, "size", path, "non-negative")
        _field(entry, "device_free", path, "non-negative", optional=True)
        _field(entry, "stream", path, "int64", optional=True)
    if action == "alloc" and entry.get("frames") is not None:
        _field(entry, "frames", path, "list")


class _Totals(NamedTuple):
    """What one pass over a device's trace entries adds up, besides checking them."""

    frames: int
    """Frames of the ``alloc`` entries."""
    grown: int
    """Bytes of ``segment_alloc`` and ``segment_map`` entries."""
    shrunk: int
    """Bytes of ``segment_free`` and ``segment_unmap`` entries."""
    at_oom: int | None
    """At the last ``oom`` entry: ``grown - shrunk`` so far plus its ``device_free``."""
    too_large: int | None
    """The index of the first ``alloc`` of more than 2**60 bytes (no device has that)."""


_GROW, _SHRINK = ("segment_alloc", "segment_map"), ("segment_free", "segment_unmap")


def _check_entries(entries: list[Any], path: str) -> _Totals:
    """Check a device's trace entries in one pass, adding up what a trace needs."""
    limit, stream_limit, largest = MAX_FILE_VALUE, 2 * MAX_FILE_VALUE, MAX_REQUEST_BYTES
    addr_actions = _ADDR_ACTIONS
    frames_count = grown = shrunk = 0
    at_oom = too_large = None
    for j, entry in enumerate(entries):
        try:
            action = entry["action"]
            if type(action) is not str:  # (before hashing it)
                raise ValueError
            if action in addr_actions:
                addr, size = entry["addr"], entry["size"]
                stream = entry.get("stream", 0)
                if not (
                    type(addr) is int
                    and type(size) is int
                    and type(stream) is int
                    and 0 <= addr < limit
                    and 0 <= size < limit
                    and -limit <= stream < stream_limit
                ):
                    raise ValueError
                if action == "alloc":
                    frames = entry.get("frames")
                    if type(frames) is list:
                        frames_count += len(frames)
                    elif frames is not None:
                        raise ValueError
                    if size > largest and too_large is None:
                        too_large = j
                elif action in _GROW:
                    grown += size
                elif action in _SHRINK:
                    shrunk += size
            elif action == "oom":
                size = entry["size"]
                free = entry.get("device_free", 0)
                stream = entry.get("stream", 0)
                if not (
                    type(size) is int
                    and type(free) is int
                    and type(stream) is int
                    and 0 <= size < limit
                    and 0 <= free < limit
                    and -limit <= stream < stream_limit
                ):
                    raise ValueError
                at_oom = grown - shrunk + free
        except (ValueError, KeyError, TypeError, AttributeError):
            # the precise check: raises _Problem unless only the types were odd (an int subclass)
            _check_entry(entry, f"{path}[{j}]")
            action, size = entry["action"], entry.get("size", 0)
            frames = entry.get("frames") if action == "alloc" else None
            frames_count += len(frames) if isinstance(frames, list) else 0
            grown += size if action in _GROW else 0
            shrunk += size if action in _SHRINK else 0
            if action == "oom":
                at_oom = grown - shrunk + entry.get("device_free", 0)
            if action == "alloc" and size > largest and too_large is None:
                too_large = j
    return _Totals(frames_count, grown, shrunk, at_oom, too_large)


def _check_segments(segments: list[Any]) -> None:
    """Check the segments and their blocks in one pass."""
    limit, stream_limit = MAX_FILE_VALUE, 2 * MAX_FILE_VALUE
    for i, seg in enumerate(segments):
        try:
            address, total, blocks = seg["address"], seg["total_size"], seg["blocks"]
            device, stream = seg.get("device", 0), seg.get("stream", 0)
            if not (
                type(address) is int
                and type(total) is int
                and type(device) is int
                and type(stream) is int
                and type(blocks) is list
                and 0 <= address < limit
                and 0 < total < limit
                and 0 <= device < limit
                and -limit <= stream < stream_limit
                and seg.get("segment_type", "large") in ("small", "large")
                and type(seg.get("is_expandable", False)) is bool
            ):
                raise ValueError
            for block in blocks:
                address, size = block["address"], block["size"]
                requested = block.get("requested_size", 0)
                if not (
                    type(address) is int
                    and type(size) is int
                    and type(requested) is int
                    and type(block["state"]) is str
                    and 0 <= address < limit
                    and 0 < size < limit
                    and 0 <= requested < limit
                ):
                    raise ValueError
        except (ValueError, KeyError, TypeError, AttributeError):
            _check_segment(seg, f"segments[{i}]")  # raises _Problem unless the types were odd


def _check_snapshot(
    snapshot: dict[str, Any], where: str, *, budget: int | None = None, entries: bool = True
) -> None:
    """Check a decoded snapshot against PyTorch's schema, as far as accelrt reads it.

    One pass over segments, blocks and (with ``entries``) trace entries. ``budget`` (the
    file's bytes) bounds how many segments, blocks, entries and alloc frames it may hold: each
    costs at least a byte of pickle, so more means lists repeated by reference (a memo bomb).

    Raises
    ------
    TraceFormatError
        ``"<where>: <path inside the snapshot>: <problem>"``.
    """
    count = 0

    def spend(n: int) -> None:
        nonlocal count
        count += n
        if budget is not None and count > budget:
            raise TraceFormatError(
                f"{where}: refused: at least {count} segments, blocks, trace entries and frames "
                f"in a file of {budget} bytes (lists repeated by reference: a memo bomb)"
            )

    try:
        segments = snapshot.get("segments")
        if not isinstance(segments, list):
            raise _Problem(f"segments: expected a list, got {_describe(segments)}")
        traces = snapshot.get("device_traces")
        if traces is not None and not isinstance(traces, list):
            raise _Problem(f"device_traces: expected a list, got {_describe(traces)}")
        traces = traces or []
        spend(len(segments) + len(traces))  # what the lists claim, before walking them
        for seg in segments:
            blocks = seg.get("blocks") if type(seg) is dict else None
            spend(len(blocks) if type(blocks) is list else 0)
        for d, device_entries in enumerate(traces):
            if not isinstance(device_entries, list):
                raise _Problem(
                    f"device_traces[{d}]: expected a list, got {_describe(device_entries)}"
                )
            spend(len(device_entries))
        _check_segments(segments)
        if entries:
            for d, device_entries in enumerate(traces):
                spend(_check_entries(device_entries, f"device_traces[{d}]").frames)
        settings = snapshot.get("allocator_settings")
        if settings is not None and not isinstance(settings, dict):
            raise _Problem(f"allocator_settings: expected a dict, got {_describe(settings)}")
    except _Problem as exc:
        raise TraceFormatError(f"{where}: {exc}") from None
    _settings_of(snapshot, where)


def _settings_of(snapshot: dict[str, Any], where: str) -> AllocatorConfig:
    try:
        return AllocatorConfig.from_torch_settings(snapshot.get("allocator_settings"))
    except (ValueError, TypeError, ArithmeticError, LookupError, AttributeError) as exc:
        raise TraceFormatError(f"{where}: allocator_settings: {_one_line(exc)}") from None


# --------------------------------------------------------------------------- the start state

UNMAPPED = -1
"""``BlockState.requested_size`` of an unmapped block of an expandable segment."""


@dataclass(frozen=True)
class BlockState:
    """A block of a segment at one moment: its bytes and what it holds.

    ``requested_size`` is the requested bytes of an allocated block, 0 for a free block and
    ``UNMAPPED`` (-1) for address space of an expandable segment with no memory behind it.
    """

    address: int
    size: int
    requested_size: int


@dataclass(frozen=True)
class SegmentState:
    """A segment at one moment: its address, bytes, owning stream and blocks (address order).

    For an expandable segment (``is_expandable``) the blocks tile the part of its reserved
    range the recording touched, unmapped stretches included; ``is_small`` says its pool.
    """

    address: int
    size: int
    stream: int
    blocks: tuple[BlockState, ...]
    is_small: bool
    is_expandable: bool = False


@dataclass(frozen=True)
class Recording:
    """What a snapshot recorded beyond the allocation events: enough to replay it exactly.

    Attributes
    ----------
    device : int
        The device index the trace is of.
    start_segments : tuple of SegmentState
        The segments and blocks when recording began (rewound from the end state); each one
        can be restored by ``CachingAllocator.restore_segment`` on the simulated device.
    segment_addresses : tuple of (int, int)
        ``(address, bytes)`` of each ``segment_alloc`` in order: where the device put new
        segments.
    settings : AllocatorConfig
        The recorded ``allocator_settings`` (defaults when the snapshot has none).
    reserved_at_start_bytes, reserved_at_end_bytes, peak_reserved_bytes : int
        PyTorch's reserved bytes when recording began, at the end, and at the peak.
    num_device_alloc, num_device_free : int
        ``segment_alloc``/``segment_map`` and ``segment_free``/``segment_unmap`` entries.
    segments_at_end : int
        Segments in the end state.
    num_ooms : int
        ``oom`` entries.
    capacity_bytes : int or None
        The device's memory where the recording shows it (an ``oom`` entry's free bytes plus
        what was reserved then), else None; None too where that would not hold the start state.
    inconsistent_events : int
        Events the rewind could not place (the ring buffer dropped their context), plus
        segments left out of the start state because their blocks do not tile them, they
        overlap another segment, or the allocator could not restore them as they are.
    """

    device: int
    start_segments: tuple[SegmentState, ...]
    segment_addresses: tuple[tuple[int, int], ...]
    settings: AllocatorConfig
    reserved_at_start_bytes: int
    reserved_at_end_bytes: int
    peak_reserved_bytes: int
    num_device_alloc: int
    num_device_free: int
    segments_at_end: int
    num_ooms: int
    capacity_bytes: int | None
    inconsistent_events: int


class _Rewind:
    """The segments of one device, walked backwards from the end state.

    Each segment is ``[size, stream, sorted block starts, {start: [size, state]}, is_small,
    is_expandable]`` where state is the requested bytes (allocated), 0 (free) or ``UNMAPPED``.
    All of an expandable segment's mapped ranges of one (stream, pool) form one segment here.
    Segments never overlap, and their blocks always tile them: what would break that is
    counted in ``inconsistent`` instead.
    """

    def __init__(self, settings: AllocatorConfig) -> None:
        self.settings = settings
        self.segments: dict[int, list[Any]] = {}
        self.starts: list[int] = []
        self.inconsistent = 0

    def add_segment(
        self,
        address: int,
        size: int,
        stream: int,
        blocks: list[BlockState],
        is_small: bool,
        is_expandable: bool = False,
    ) -> None:
        """Add a segment whose blocks tile it and that overlaps no other; else count it."""
        cursor = address
        for b in blocks:
            if b.address != cursor or b.size <= 0:
                break
            cursor += b.size
        else:
            pos = bisect_right(self.starts, address)
            before_ok = pos == 0 or self._end(self.starts[pos - 1]) <= address
            after_ok = pos == len(self.starts) or address + size <= self.starts[pos]
            if blocks and cursor == address + size and before_ok and after_ok:
                starts = [b.address for b in blocks]
                table = {b.address: [b.size, b.requested_size] for b in blocks}
                self.segments[address] = [size, stream, starts, table, is_small, is_expandable]
                self.starts.insert(pos, address)
                return
        self.inconsistent += 1

    def _end(self, start: int) -> int:
        return start + int(self.segments[start][0])

    def _segment_of(self, addr: int) -> list[Any] | None:
        pos = bisect_right(self.starts, addr) - 1
        if pos < 0:
            return None
        seg = self.segments[self.starts[pos]]
        return seg if addr < self.starts[pos] + seg[0] else None

    @staticmethod
    def _merge_around(seg: list[Any], addr: int) -> None:
        """Merge the block at ``addr`` with neighbours in the same free or unmapped state."""
        starts, table = seg[2], seg[3]
        state = table[addr][1]
        i = starts.index(addr)
        if i + 1 < len(starts) and table[starts[i + 1]][1] == state:
            table[addr][0] += table.pop(starts.pop(i + 1))[0]
        if i > 0 and table[starts[i - 1]][1] == state:
            table[starts[i - 1]][0] += table.pop(starts.pop(i))[0]

    def _carve(self, addr: int, size: int, before: int, after: int) -> list[Any] | None:
        """Turn ``[addr, addr + size)`` of one block in state ``before`` into ``after``."""
        seg = self._segment_of(addr)
        if seg is None or size <= 0:
            return None
        starts, table = seg[2], seg[3]
        i = bisect_right(starts, addr) - 1
        start = starts[i]
        block_size, state = table[start]
        end = start + block_size
        if state != before or addr + size > end:
            return None
        if start < addr:
            table[start][0] = addr - start
            starts.insert(i + 1, addr)
        table[addr] = [size, after]
        if addr + size < end:
            insort(starts, addr + size)
            table[addr + size] = [end - addr - size, before]
        return seg

    def undo_alloc(self, addr: int) -> None:
        """The block at ``addr`` was allocated here: before, it was free (merged)."""
        seg = self._segment_of(addr)
        if seg is None or addr not in seg[3] or seg[3][addr][1] <= 0:
            self.inconsistent += 1
            return
        seg[3][addr][1] = 0
        self._merge_around(seg, addr)

    def undo_free(self, addr: int, requested: int) -> None:
        """The block at ``addr`` was freed here: before, it was allocated (split it out)."""
        seg = self._segment_of(addr)
        if seg is None or requested <= 0:
            self.inconsistent += 1
            return
        starts, table = seg[2], seg[3]
        start = starts[bisect_right(starts, addr) - 1]
        free_end = start + table[start][0]
        size = round_size(requested, self.settings)
        fits = table[start][1] == 0 and addr + size <= free_end
        max_split = self.settings.max_split_size or UNLIMITED
        expandable = bool(seg[5]) or self.settings.expandable_segments
        if fits and not should_split(free_end - addr, size, seg[4], max_split, expandable):
            size = free_end - addr  # handed out whole: the remainder was not worth a split
        if not fits or self._carve(addr, size, 0, requested) is None:
            self.inconsistent += 1

    def undo_segment_alloc(self, addr: int, size: int) -> None:
        seg = self.segments.get(addr)
        if seg is None or seg[0] != size or len(seg[2]) != 1 or seg[3][addr][1] or seg[5]:
            self.inconsistent += 1
            return
        del self.segments[addr]
        self.starts.remove(addr)

    def undo_segment_free(self, addr: int, size: int, stream: int) -> None:
        if self._segment_of(addr) is not None:
            self.inconsistent += 1
            return
        self.add_segment(addr, size, stream, [BlockState(addr, size, 0)], size == K_SMALL_BUFFER)

    def _expandable_at(self, addr: int) -> bool:
        seg = self._segment_of(addr)
        return seg is not None and bool(seg[5])

    def undo_segment_map(self, addr: int, size: int) -> None:
        """Pages were mapped here: before, they were unmapped."""
        seg = self._carve(addr, size, 0, UNMAPPED) if self._expandable_at(addr) else None
        if seg is None:
            self.inconsistent += 1
            return
        self._merge_around(seg, addr)

    def undo_segment_unmap(self, addr: int, size: int) -> None:
        """Pages were unmapped here: before, they were mapped and free."""
        seg = self._carve(addr, size, UNMAPPED, 0) if self._expandable_at(addr) else None
        if seg is None:
            self.inconsistent += 1
            return
        self._merge_around(seg, addr)

    def state(self) -> tuple[SegmentState, ...]:
        out = []
        for address in self.starts:
            size, stream, starts, table, is_small, is_expandable = self.segments[address]
            blocks = tuple(BlockState(s, table[s][0], table[s][1]) for s in starts)
            if is_expandable and all(b.requested_size == UNMAPPED for b in blocks):
                continue  # nothing mapped when recording began
            out.append(SegmentState(address, size, stream, blocks, is_small, is_expandable))
        return tuple(out)


def _mapped_bytes(segment: SegmentState) -> int:
    """The device memory a start segment holds (an expandable one: its mapped blocks)."""
    if not segment.is_expandable:
        return segment.size
    return sum(b.size for b in segment.blocks if b.requested_size != UNMAPPED)


def _restorable(segment: SegmentState) -> bool:
    """Whether ``CachingAllocator.restore_segment`` takes the segment as it is.

    Blocks of positive multiples of 512 bytes, no two free or two unmapped blocks side by
    side, unmapped blocks only in an expandable segment and there in whole pages, and an
    expandable segment a whole number of pages (so its mapped runs are too).
    """
    previous = 1
    page = page_size(segment.is_small) if segment.is_expandable else 0
    offset = 0
    for b in segment.blocks:
        state = min(b.requested_size, 1)
        if b.size <= 0 or b.size % K_MIN_BLOCK_SIZE or state == previous < 1:
            return False
        if state == UNMAPPED and (not page or offset % page or b.size % page):
            return False
        previous = state
        offset += b.size
    return offset == segment.size and (not page or segment.size % page == 0)


def _expandable_groups(
    end_segments: list[dict[str, Any]], entries: list[dict[str, Any]]
) -> list[tuple[int, int, int, bool, list[BlockState]]]:
    """Join the mapped ranges of each (stream, pool) into one span of an expandable segment.

    Returns ``(address, size, stream, is_small, blocks)`` per span: the span runs from the
    lowest to the highest address the end state or a ``segment_map``/``segment_unmap`` entry
    shows for it, and the stretches between mapped ranges are unmapped blocks.
    """
    groups: dict[tuple[int, bool], list[dict[str, Any]]] = {}
    for seg in end_segments:
        key = (seg.get("stream", 0), seg.get("segment_type") == "small")
        groups.setdefault(key, []).append(seg)
    spans = []
    for (stream, is_small), ranges in groups.items():
        ranges.sort(key=lambda r: r["address"])
        low = ranges[0]["address"]
        high = ranges[-1]["address"] + ranges[-1]["total_size"]
        spans.append([low, high, stream, is_small, ranges])
    spans.sort(key=lambda s: s[:4])
    for entry in entries:  # pages touched during the recording belong to the span above them
        if entry["action"] not in ("segment_map", "segment_unmap"):
            continue
        addr, end = entry["addr"], entry["addr"] + entry["size"]
        same_stream = [s for s in spans if s[2] == entry.get("stream", 0)]
        target = next((s for s in same_stream if addr < s[1]), None)
        if target is None and same_stream:
            target = same_stream[-1]
        if target is not None:
            target[0], target[1] = min(target[0], addr), max(target[1], end)
    out = []
    for low, high, stream, is_small, ranges in spans:
        blocks: list[BlockState] = []
        cursor = low
        for seg in ranges:
            if seg["address"] > cursor:
                blocks.append(BlockState(cursor, seg["address"] - cursor, UNMAPPED))
            blocks.extend(_blocks_of(seg))
            cursor = seg["address"] + seg["total_size"]
        if high > cursor:
            blocks.append(BlockState(cursor, high - cursor, UNMAPPED))
        out.append((low, high - low, stream, is_small, blocks))
    return out


def _blocks_of(segment: dict[str, Any]) -> list[BlockState]:
    """A segment's blocks; an allocated block's requested bytes are kept in ``[1, size]``."""
    return [
        BlockState(
            b["address"],
            b["size"],
            min(max(b.get("requested_size", b["size"]), 1), b["size"])
            if b["state"] in _ALLOCATED_STATES
            else 0,
        )
        for b in segment["blocks"]
    ]


def devices_with_history(snapshot: dict[str, Any]) -> list[int]:
    """Return the device indices whose ``device_traces`` record at least one allocation.

    Entries that are not dicts are passed over (:func:`read_snapshot` refuses them).
    """
    traces = snapshot.get("device_traces") if isinstance(snapshot, dict) else None
    if not isinstance(traces, list):
        return []
    return [
        i
        for i, t in enumerate(traces)
        if isinstance(t, list) and any(type(e) is dict and e.get("action") == "alloc" for e in t)
    ]


def trace_from_snapshot(
    snapshot: dict[str, Any], *, device: int | None = None, path: str | None = None
) -> Trace:
    """Turn one device of a snapshot into a replayable trace with its :class:`Recording`.

    Parameters
    ----------
    snapshot : dict
        From :func:`read_snapshot` (a dict made otherwise is checked the same way).
    device : int, optional
        Which device; default the only device with events (an error if several have some).
    path : str, optional
        The file it came from (for the trace's name and messages).

    Returns
    -------
    Trace
        Events ``alloc`` (from ``alloc``), ``free`` (from ``free_requested``) and
        ``empty_cache`` (where a run of ``segment_free`` entries shows the program released
        its cache); ``trace.recording`` holds the start state and PyTorch's figures. Start
        segments the allocator could not restore as rewound (blocks that do not tile their
        segment, overlapping segments, sizes not multiples of 512...) are left out and counted
        in ``recording.inconsistent_events``, so the trace replays on the simulated device.

    Raises
    ------
    TraceFormatError
        If the snapshot does not fit PyTorch's schema (the message names the place inside
        it), recorded no history, the device is out of range or not given where several
        devices have events, an allocation is larger than any device (2**60 bytes), or the
        start state holds more memory than the simulated device can have.
    """
    where = path or "snapshot"
    if not isinstance(snapshot, dict):
        raise TraceFormatError(f"{where}: expected a snapshot dict, got {_describe(snapshot)}")
    _check_snapshot(snapshot, where, entries=False)
    traces = snapshot.get("device_traces") or []
    with_events = devices_with_history(snapshot)
    if not with_events:
        raise TraceFormatError(
            f"{where}: the snapshot has no allocation history (record it with "
            "torch.cuda.memory._record_memory_history() before the run)"
        )
    if device is None:
        if len(with_events) > 1:
            raise TraceFormatError(
                f"{where}: devices {with_events} all have events; choose one "
                "(accelrt replay --device-index N)"
            )
        device = with_events[0]
    if not 0 <= device < len(traces):
        raise TraceFormatError(f"{where}: device index {device} is out of range [0, {len(traces)})")
    entries = traces[device]
    try:
        totals = _check_entries(entries, f"device_traces[{device}]")
    except _Problem as exc:
        raise TraceFormatError(f"{where}: {exc}") from None
    if totals.too_large is not None:
        size = entries[totals.too_large]["size"]
        raise TraceFormatError(
            f"{where}: device_traces[{device}][{totals.too_large}].size: an allocation of "
            f"{size} bytes, more than any device has (at most 2**60)"
        )
    settings = _settings_of(snapshot, where)
    end_segments = [s for s in snapshot["segments"] if s.get("device", 0) == device]
    reserved_end = sum(s["total_size"] for s in end_segments)
    grown, shrunk = totals.grown, totals.shrunk
    reserved_start = reserved_end - grown + shrunk
    rewind = _Rewind(settings)
    for seg in end_segments:
        if not seg.get("is_expandable"):
            rewind.add_segment(
                seg["address"],
                seg["total_size"],
                seg.get("stream", 0),
                _blocks_of(seg),
                seg["total_size"] == K_SMALL_BUFFER,
            )
    expandable = [s for s in end_segments if s.get("is_expandable")]
    for address, size, stream, is_small, blocks in _expandable_groups(expandable, entries):
        rewind.add_segment(address, size, stream, blocks, is_small, is_expandable=True)
    for entry in reversed(entries):
        action = entry["action"]
        if action == "alloc":
            rewind.undo_alloc(entry["addr"])
        elif action == "free_requested":
            rewind.undo_free(entry["addr"], entry["size"])
        elif action == "segment_alloc":
            rewind.undo_segment_alloc(entry["addr"], entry["size"])
        elif action == "segment_free":
            rewind.undo_segment_free(entry["addr"], entry["size"], entry.get("stream", 0))
        elif action == "segment_map":
            rewind.undo_segment_map(entry["addr"], entry["size"])
        elif action == "segment_unmap":
            rewind.undo_segment_unmap(entry["addr"], entry["size"])

    capacity = None if totals.at_oom is None else reserved_start + totals.at_oom
    start, capacity, dropped = _start_state(rewind.state(), capacity, where)

    events: list[TraceEvent] = []
    live = {b.address: b.requested_size for s in start for b in s.blocks if b.requested_size > 0}
    live_bytes = peak_live = sum(live.values())
    reserved = peak_reserved = reserved_start
    n_alloc = n_free = n_oom = 0
    previous = ""
    release_run: int | None = None  # events index of the latest release run's empty_cache
    for entry in entries:
        action = entry["action"]
        if action == "alloc":
            events.append(TraceEvent("alloc", entry["addr"], entry["size"], entry.get("stream", 0)))
            live[entry["addr"]] = entry["size"]
            live_bytes += entry["size"]
            peak_live = max(peak_live, live_bytes)
            release_run = None
        elif action == "free_requested":
            events.append(TraceEvent("free", entry["addr"], entry["size"], entry.get("stream", 0)))
            live_bytes -= live.pop(entry["addr"], 0)
            release_run = None
        elif action in ("segment_alloc", "segment_map"):
            n_alloc += 1
            reserved += entry["size"]
            peak_reserved = max(peak_reserved, reserved)
        elif action in ("segment_free", "segment_unmap"):
            n_free += 1
            reserved -= entry["size"]
            if previous not in ("segment_free", "segment_unmap"):
                release_run = len(events)
                events.append(TraceEvent("empty_cache", 0, 0, 0))
        elif action == "oom":
            n_oom += 1
            # The request that failed: PyTorch records no alloc for it. A release run right
            # before it (with no alloc or free between) was its last retry, not empty_cache().
            # (One beyond 2**60 bytes, which no allocator takes, fails as a 2**60-byte one.)
            size = min(entry["size"], MAX_REQUEST_BYTES)
            failed = TraceEvent("alloc", _FAILED_ADDR, size, entry.get("stream", 0))
            if release_run is not None:
                events[release_run] = failed
            else:
                events.append(failed)
            release_run = None
        previous = action
    recording = Recording(
        device=device,
        start_segments=start,
        segment_addresses=tuple(
            (e["addr"], e["size"]) for e in entries if e["action"] == "segment_alloc"
        ),
        settings=settings,
        reserved_at_start_bytes=reserved_start,
        reserved_at_end_bytes=reserved_end,
        peak_reserved_bytes=peak_reserved,
        num_device_alloc=n_alloc,
        num_device_free=n_free,
        segments_at_end=len(end_segments),
        num_ooms=n_oom,
        capacity_bytes=capacity,
        inconsistent_events=rewind.inconsistent + dropped,
    )
    name = os.path.basename(path or "snapshot").rsplit(".", 1)[0]
    header = {"name": name if len(with_events) == 1 else f"{name}_dev{device}"}
    return Trace(
        header=header,
        events=events,
        path=path,
        include_host=True,
        peak_live_bytes=peak_live,
        live_at_end_bytes=live_bytes,
        recording=recording,
    )


def _start_state(
    rewound: tuple[SegmentState, ...], capacity: int | None, where: str
) -> tuple[tuple[SegmentState, ...], int | None, int]:
    """Keep the rewound segments a replay on the simulated device can restore.

    Returns the segments kept, the device capacity to replay with (the recorded one, or None
    where it does not hold what the start state holds) and how many segments were left out.
    """
    from ..replay import UNLIMITED_CAPACITY

    kept = [s for s in rewound if _restorable(s)]
    held = sum(_mapped_bytes(s) for s in kept)
    if capacity is not None and not (0 < capacity < MAX_FILE_VALUE and capacity >= held):
        capacity = None  # an oom entry that cannot be right: the device held more, or no memory
    device_bytes = capacity or UNLIMITED_CAPACITY
    if held > device_bytes:
        raise TraceFormatError(
            f"{where}: the recording's start state holds {held} bytes, more than the "
            f"simulated device's {device_bytes} (a damaged file)"
        )
    kept = [  # an expandable segment reserves 1.125 x the device, in whole pages
        s
        for s in kept
        if not s.is_expandable
        or s.size <= expandable_address_space(device_bytes, page_size(s.is_small))
    ]
    return tuple(kept), capacity, len(rewound) - len(kept)
