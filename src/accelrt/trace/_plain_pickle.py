"""Plain-data pickles: decode a pickle from elsewhere without running anything in it.

PyTorch snapshots are pickles, and a pickle can run code. This module decodes one only after
walking its opcodes once without building anything, so that a file can neither run code
(globals and persistent ids are refused by name) nor claim more memory than its own length
backs (huge declared lengths, memo indices beyond the file, absurd nesting, sets and BUILD).
"""

from __future__ import annotations

import io
import pickle
import re
import struct
from collections.abc import Callable
from functools import cache
from typing import NoReturn

from .._gc import collector_paused
from ._format import TraceFormatError

__all__ = ["ByteProgress", "describe", "load_plain_pickle", "one_line"]

ByteProgress = Callable[[str, int, int], None]
"""``progress(phase, done, total)``: ``done`` of the file's ``total`` bytes are through
``phase`` (``"reading"``, ``"checking"`` or ``"decoding"``)."""
_REPORT_EVERY = 1 << 20
"""Bytes between two progress reports."""


class _Refused(pickle.UnpicklingError):
    """The pickle names code (a global or a persistent id)."""


class _PlainDataUnpickler(pickle.Unpickler):
    """Refuses every global and persistent id: what it builds is plain data only.

    Dicts, lists, flat tuples, strings, bytes, numbers, booleans and None (what
    :func:`_scan_pickle` lets through).
    """

    def find_class(self, module: str, name: str) -> NoReturn:
        raise _Refused(f"global '{module}.{name}'")

    def persistent_load(self, pid: object) -> NoReturn:
        raise _Refused(f"persistent id {describe(pid)}")


class _ReportingReader:
    """The unpickler's file over ``data``, telling ``progress`` how far it has read.

    It has ``peek``, so the unpickler reads ahead in pieces of 128 KiB and takes opcodes from
    its own buffer: two calls here per piece, framed pickle or not.
    """

    def __init__(self, data: bytes, progress: ByteProgress) -> None:
        self._data = data
        self._pos = 0
        self._next_report = _REPORT_EVERY
        self._progress = progress

    def peek(self, size: int = 1) -> bytes:
        return self._data[self._pos : self._pos + max(size, 1)]

    def read(self, size: int = -1) -> bytes:
        start, end = self._pos, len(self._data)
        self._pos = end if size < 0 else min(end, start + size)
        if self._pos >= self._next_report:
            self._progress("decoding", self._pos, end)
            self._next_report = self._pos + _REPORT_EVERY
        return self._data[start : self._pos]

    def readline(self) -> bytes:
        newline = self._data.find(b"\n", self._pos)
        return self.read(-1 if newline < 0 else newline + 1 - self._pos)


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


def _scan_pickle(data: bytes, progress: ByteProgress | None = None) -> str | int | None:
    """Walk the opcodes of ``data`` without building anything; return the first problem.

    The problem is a message, or the position of the first opcode that names or calls code
    (a global, a persistent id, a call): the unpickler, safe up to there, refuses it by name.

    Refused: an unknown opcode, no STOP, a claim the file's own bytes cannot back (a string,
    bytes or frame longer than what follows it, a memo index above the file's length: the
    unpickler sizes its memo by the largest index), an int of more than 9 bytes, a set, and a
    tuple holding anything but scalars (see :func:`_plain_run`). What is left builds at most
    a few objects per byte, none of them costly to hash. ``progress`` hears how far the walk
    is (``"checking"``) about every megabyte where the regex stops that often (at least at
    every frame of a pickle of protocol 4 or later).
    """
    end = len(data)
    run = _plain_run().match
    pos = 0
    next_report = _REPORT_EVERY
    while True:
        match = run(data, pos)
        pos = match.end() if match is not None else pos
        if progress is not None and pos >= next_report:
            progress("checking", min(pos, end), end)
            next_report = pos + _REPORT_EVERY
        if pos >= end:
            return "no STOP opcode: the data is truncated"
        op = data[pos]
        if op == _STOP:
            if progress is not None:
                progress("checking", end, end)
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
                return f"memo index {describe(text)} at byte {line_start - 1}"
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


def describe(value: object) -> str:
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


def one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split()) or type(exc).__name__
    return text if len(text) <= 160 else text[:157] + "..."


def load_plain_pickle(data: bytes, name: str, *, progress: ByteProgress | None = None) -> object:
    """Decode ``data``, a pickle read from file ``name``, admitting plain data only.

    Parameters
    ----------
    data : bytes
    name : str
        For messages.
    progress : callable, optional
        ``progress(phase, done, total)`` about every megabyte of the check (``"checking"``)
        and of the decoding (``"decoding"``) that follows it.

    Returns
    -------
    object
        Dicts, lists, tuples (of 1 to 16 plain values), strings, bytes, numbers, booleans and
        None.

    Raises
    ------
    TraceFormatError
        One line naming the file: the pickle names or calls code (nothing ran), is damaged,
        or claims more than its length can hold.
    """
    problem = _scan_pickle(data, progress)
    if isinstance(problem, str):
        raise TraceFormatError(f"{name}: not a readable pickle ({problem})")
    plain_only = "accelrt reads snapshots as plain data only and ran nothing from it"
    calls = f"{name}: refused: the pickle calls code (opcode at byte {problem}); {plain_only}"
    source = io.BytesIO(data) if progress is None else _ReportingReader(data, progress)
    try:
        # Where the walk stopped at code, the unpickler stops there too: it refuses globals
        # and persistent ids, and plain data cannot be called, so it never reads past it.
        with collector_paused():  # a container per entry, no cycle among them
            value = _PlainDataUnpickler(source).load()
        if progress is not None:
            progress("decoding", len(data), len(data))
    except _Refused as exc:
        raise TraceFormatError(
            f"{name}: refused: the pickle names {exc}, i.e. code; {plain_only}"
        ) from None
    except _DECODING_ERRORS as exc:
        if problem is not None:
            raise TraceFormatError(calls) from None
        reason = "out of memory" if isinstance(exc, MemoryError) else one_line(exc)
        raise TraceFormatError(f"{name}: not a readable pickle ({reason})") from None
    if problem is not None:  # code that neither failed nor was refused: never expected
        raise TraceFormatError(calls)
    return value
