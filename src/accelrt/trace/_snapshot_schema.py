"""Reading a PyTorch memory snapshot file and checking it against the snapshot schema.

:func:`read_snapshot` decodes the pickle as plain data (``_plain_pickle``) and checks the
result as far as accelrt reads it, naming the place inside the file of anything wrong
(``segments[3].blocks[2].size: ...``) and bounding what the file may claim by its length.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, NamedTuple, TypedDict, TypeGuard, cast

from ..memory._config import AllocatorConfig
from ..memory._policy import MAX_REQUEST_BYTES
from ._format import TraceFormatError, sniff_file
from ._plain_pickle import ByteProgress, describe, load_plain_pickle, one_line

__all__ = [
    "ADDR_ACTIONS",
    "ALLOCATED_STATES",
    "CheckedSnapshot",
    "FileBlock",
    "FileEntry",
    "FileSegment",
    "FileSnapshot",
    "MAX_FILE_VALUE",
    "SEGMENT_ENTRIES",
    "Problem",
    "check_entries",
    "check_snapshot",
    "read_checked_snapshot",
    "read_snapshot",
    "settings_of",
]

MAX_FILE_VALUE = 1 << 63
"""Sizes and addresses in a snapshot are below this (a larger one is a damaged file)."""

ALLOCATED_STATES = ("active_allocated", "active_pending_free")
SEGMENT_ENTRIES = ("segment_alloc", "segment_free", "segment_map", "segment_unmap")
ADDR_ACTIONS = frozenset(("alloc", "free_requested", "free_completed", *SEGMENT_ENTRIES))
"""Trace entries with an ``addr`` and a ``size``; of the others only ``oom`` is read."""


class _FileBlockRequired(TypedDict):
    address: int
    size: int
    state: str


class FileBlock(_FileBlockRequired, total=False):
    """A block of a segment in a snapshot file, as :func:`check_snapshot` checked it; the
    frames are not checked (a reader takes what it can of them)."""

    requested_size: int
    frames: object


class _FileSegmentRequired(TypedDict):
    address: int
    total_size: int
    blocks: list[FileBlock]


class FileSegment(_FileSegmentRequired, total=False):
    """A segment in a snapshot file, as :func:`check_snapshot` checked it (a segment without
    ``device`` is on device 0, one without ``stream`` on stream 0)."""

    device: int
    stream: int
    segment_type: str
    is_expandable: bool
    frames: object


class _FileEntryRequired(TypedDict):
    action: str


class FileEntry(_FileEntryRequired, total=False):
    """A trace entry in a snapshot file, as :func:`check_entries` checked it: an entry of
    :data:`ADDR_ACTIONS` has ``addr`` and ``size``, an ``oom`` entry ``size`` and maybe
    ``device_free``; an ``alloc`` entry's ``frames`` is a list or None (its frames are not
    checked), ``time_us`` is not checked."""

    addr: int
    size: int
    stream: int
    device_free: int
    frames: object
    time_us: object


class _FileSnapshotRequired(TypedDict):
    segments: list[FileSegment]


class FileSnapshot(_FileSnapshotRequired, total=False):
    """A PyTorch memory snapshot as :func:`read_snapshot` returns it (there ``device_traces``
    is always present: ``device_traces[i]`` is device i's entries)."""

    device_traces: list[list[FileEntry]]
    allocator_settings: dict[str, object] | None


_READ_PIECE = 16 << 20
"""Bytes read at a time where progress is reported."""


def read_snapshot(
    path: str | os.PathLike[str], *, progress: ByteProgress | None = None
) -> FileSnapshot:
    """Read a PyTorch memory snapshot pickle without running any code, and check it.

    Parameters
    ----------
    path : str or path-like
        A file written by ``torch.cuda.memory._dump_snapshot`` or ``accelrt.dump_snapshot``.
    progress : callable, optional
        ``progress(phase, done, total)`` as the file's bytes are read (``"reading"``),
        checked (``"checking"``) and decoded (``"decoding"``), about every megabyte.

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
    return read_checked_snapshot(path, progress=progress).data


@dataclass(frozen=True)
class CheckedSnapshot:
    """A snapshot as :func:`read_checked_snapshot` read and checked it, with what the check
    added up, so that :func:`~accelrt.trace._snapshot.trace_from_snapshot` need not check it
    again. The snapshot is not to be changed after it was checked.

    Attributes
    ----------
    data : dict
        The snapshot (what :func:`read_snapshot` returns).
    totals : tuple of _Totals
        Per ``device_traces`` entry, what the check of its entries added up.
    settings : AllocatorConfig
        The recorded ``allocator_settings`` (defaults when the snapshot has none).
    """

    data: FileSnapshot
    totals: tuple[_Totals, ...]
    settings: AllocatorConfig


def read_checked_snapshot(
    path: str | os.PathLike[str],
    *,
    progress: ByteProgress | None = None,
    expect: Callable[[str], None] | None = None,
) -> CheckedSnapshot:
    """:func:`read_snapshot`, opening the file once, with what the check added up.

    Parameters
    ----------
    expect : callable, optional
        Called with what the file is (:func:`~accelrt.trace._format.sniff`: ``"pickle"``,
        ``"jsonl"``...) before the rest of it is read; it raises to refuse the file.
    """
    name = os.fspath(path)
    with open(path, "rb") as f:
        if expect is not None:
            expect(sniff_file(f))
            f.seek(0)
        if progress is None:
            data = f.read()
        else:
            total = os.fstat(f.fileno()).st_size
            pieces, done = [], 0
            while piece := f.read(_READ_PIECE):
                pieces.append(piece)
                done += len(piece)
                progress("reading", done, max(total, done))
            data = b"".join(pieces)
            del pieces
    loaded = load_plain_pickle(data, name, progress=progress)
    if not isinstance(loaded, dict) or "segments" not in loaded:
        raise TraceFormatError(
            f"{name}: not a PyTorch memory snapshot (expected a dict with 'segments' and "
            f"'device_traces'; got {type(loaded).__name__})"
        )
    snapshot = cast(FileSnapshot, loaded)  # decoded plain data: check_snapshot checks it
    budget = len(data)
    del data  # the decoded snapshot is what is kept
    totals, settings = check_snapshot(snapshot, name, budget=budget)
    snapshot.setdefault("device_traces", [])
    return CheckedSnapshot(snapshot, totals, settings)


class Problem(Exception):
    """Something in a snapshot does not fit its schema; the message starts with its path."""


def _is_int(value: object) -> TypeGuard[int]:
    return type(value) is int or (isinstance(value, int) and not isinstance(value, bool))


_NON_NEGATIVE = "a non-negative int below 2**63"
_POSITIVE = "a positive int below 2**63"
_INT64 = "an int in [-2**63, 2**64)"
_FIELDS: dict[
    str, tuple[str, Callable[[object], bool]]
] = {  # what a field holds, and a test of its value
    "non-negative": (_NON_NEGATIVE, lambda v: _is_int(v) and 0 <= v < MAX_FILE_VALUE),
    "positive": (_POSITIVE, lambda v: _is_int(v) and 0 < v < MAX_FILE_VALUE),
    "int64": (_INT64, lambda v: _is_int(v) and -MAX_FILE_VALUE <= v < 2 * MAX_FILE_VALUE),
    "str": ("a str", lambda v: isinstance(v, str)),
    "bool": ("a bool", lambda v: isinstance(v, bool)),
    "list": ("a list", lambda v: isinstance(v, list)),
    "segment_type": ("'small' or 'large'", lambda v: v in ("small", "large")),
}


def _field(
    obj: dict[str, object], key: str, path: str, kind: str, *, optional: bool = False
) -> Any:
    """Return ``obj[key]`` if it is a ``kind`` (None if optional and absent), else raise."""
    if key not in obj:
        if optional:
            return None
        raise Problem(f"{path}: missing {key!r}")
    value = obj[key]
    what, test = _FIELDS[kind]
    if not test(value):
        raise Problem(f"{path}.{key}: expected {what}, got {describe(value)}")
    return value


def _dict_at(value: object, path: str) -> dict[str, object]:
    if not isinstance(value, dict):
        raise Problem(f"{path}: expected a dict, got {describe(value)}")
    return value


def _check_segment(seg: object, path: str) -> None:
    """Check one segment and its blocks (the slow, precise way)."""
    checked = _dict_at(seg, path)
    _field(checked, "device", path, "non-negative", optional=True)
    _field(checked, "address", path, "non-negative")
    _field(checked, "total_size", path, "positive")
    _field(checked, "stream", path, "int64", optional=True)
    _field(checked, "segment_type", path, "segment_type", optional=True)
    _field(checked, "is_expandable", path, "bool", optional=True)
    blocks = _field(checked, "blocks", path, "list")
    for k, block in enumerate(blocks):
        where = f"{path}.blocks[{k}]"
        fields = _dict_at(block, where)
        _field(fields, "address", where, "non-negative")
        _field(fields, "size", where, "positive")
        _field(fields, "requested_size", where, "non-negative", optional=True)
        _field(fields, "state", where, "str")


def _check_entry(entry: object, path: str) -> None:
    """Check one trace entry (the slow, precise way: on a problem the fast loop found)."""
    fields = _dict_at(entry, path)
    action = _field(fields, "action", path, "str")
    if action in ADDR_ACTIONS:
        _field(fields, "addr", path, "non-negative")
        _field(fields, "size", path, "non-negative")
        _field(fields, "stream", path, "int64", optional=True)
    elif action == "oom":
        _field(fields, "size", path, "non-negative")
        _field(fields, "device_free", path, "non-negative", optional=True)
        _field(fields, "stream", path, "int64", optional=True)
    if action == "alloc" and fields.get("frames") is not None:
        _field(fields, "frames", path, "list")


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


def check_entries(entries: list[FileEntry], path: str) -> _Totals:
    """Check a device's trace entries in one pass, adding up what a trace needs."""
    limit, stream_limit, largest = MAX_FILE_VALUE, 2 * MAX_FILE_VALUE, MAX_REQUEST_BYTES
    addr_actions = ADDR_ACTIONS
    frames_count = grown = shrunk = 0
    at_oom = too_large = None
    for j, entry in enumerate(entries):
        try:
            action = entry["action"]
            if type(action) is not str:  # (before hashing it)
                raise ValueError
            if action in addr_actions:
                other, size = entry["addr"], entry["size"]
            elif action == "oom":
                other, size = entry.get("device_free", 0), entry["size"]
            else:
                continue
            # the address, or the oom's device_free: both bytes within the file's range
            stream = entry.get("stream", 0)
            if not (
                type(other) is int
                and type(size) is int
                and type(stream) is int
                and 0 <= other < limit
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
                at_oom = grown - shrunk + other
        except (ValueError, KeyError, TypeError, AttributeError):
            # the precise check: raises Problem unless only the types were odd (an int subclass)
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


def _check_segments(segments: list[FileSegment]) -> None:
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
            _check_segment(seg, f"segments[{i}]")  # raises Problem unless the types were odd


def check_snapshot(
    snapshot: FileSnapshot, where: str, *, budget: int | None = None, entries: bool = True
) -> tuple[tuple[_Totals, ...], AllocatorConfig]:
    """Check a decoded snapshot against PyTorch's schema, as far as accelrt reads it.

    One pass over segments, blocks and (with ``entries``) trace entries. ``budget`` (the
    file's bytes) bounds how many segments, blocks, entries and alloc frames it may hold: each
    costs at least a byte of pickle, so more means lists repeated by reference (a memo bomb).

    Returns
    -------
    (tuple of _Totals, AllocatorConfig)
        Per device's entries what their check added up (none without ``entries``), and the
        recorded settings.

    Raises
    ------
    TraceFormatError
        ``"<where>: <path inside the snapshot>: <problem>"``.
    """
    count = 0
    totals: list[_Totals] = []

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
            raise Problem(f"segments: expected a list, got {describe(segments)}")
        traces = snapshot.get("device_traces")
        if traces is not None and not isinstance(traces, list):
            raise Problem(f"device_traces: expected a list, got {describe(traces)}")
        traces = traces or []
        spend(len(segments) + len(traces))  # what the lists claim, before walking them
        for seg in segments:
            blocks = seg.get("blocks") if type(seg) is dict else None
            spend(len(blocks) if type(blocks) is list else 0)
        for d, device_entries in enumerate(traces):
            if not isinstance(device_entries, list):
                raise Problem(
                    f"device_traces[{d}]: expected a list, got {describe(device_entries)}"
                )
            spend(len(device_entries))
        _check_segments(segments)
        if entries:
            for d, device_entries in enumerate(traces):
                totals.append(check_entries(device_entries, f"device_traces[{d}]"))
                spend(totals[-1].frames)
        settings = snapshot.get("allocator_settings")
        if settings is not None and not isinstance(settings, dict):
            raise Problem(f"allocator_settings: expected a dict, got {describe(settings)}")
    except Problem as exc:
        raise TraceFormatError(f"{where}: {exc}") from None
    return tuple(totals), settings_of(snapshot, where)


def settings_of(snapshot: FileSnapshot, where: str) -> AllocatorConfig:
    try:
        return AllocatorConfig.from_torch_settings(snapshot.get("allocator_settings"))
    except (ValueError, TypeError, ArithmeticError, LookupError, AttributeError) as exc:
        raise TraceFormatError(f"{where}: allocator_settings: {one_line(exc)}") from None
