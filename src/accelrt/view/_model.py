"""The data of a memory picture: every allocation as compact columns, OOMs, segment maps.

A trace of ``E`` events has ``E + 1`` *states*: state 0 is before the first event and state
``s`` is after event ``s - 1``. Each allocation is live from state ``start`` (the state after
its alloc event; 0 for a block live when recording began) up to, not including, state ``end``
(the state after its free; ``E + 1`` if never freed). Allocations are numbered in the order
they are stacked: older ones lower. Building it: :mod:`._picture`; what it takes from a
snapshot: :mod:`._recorded`; the segment maps it shows: :mod:`._moments`.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal, TypeAlias, TypedDict

import numpy as np
import numpy.typing as npt

from ..trace._columns import OP_ALLOC
from ..trace._format import Trace
from ..trace._phases import Phase
from ..trace._recording import FAILED_ADDR
from ._stacks import CleanStack

if TYPE_CHECKING:
    pass


__all__ = [
    "EVENT_ALLOC",
    "EVENT_EMPTY_CACHE",
    "EVENT_FREE",
    "EVENT_OOM",
    "LiveGroup",
    "View",
    "live_groups",
]

EVENT_ALLOC, EVENT_FREE, EVENT_EMPTY_CACHE, EVENT_OOM = 0, 1, 2, 3


SegmentRow: TypeAlias = list[Any]
"""A segment in a moment's map, a JSON array: ``[address, size, stream, expandable (0 or 1),
blocks]``, each block ``[bytes, state, allocation or -1]`` (a list of mixed items, which
typing cannot spell item by item)."""


class Moment(TypedDict):
    """A captured segment map (``View.moments``): the state it was taken at, its segments."""

    state: int
    segments: list[SegmentRow]


class RecordedOom(TypedDict):
    """A snapshot's ``oom`` entry as the picture takes it (``RecordedDetails.ooms``)."""

    size: int
    free: int | None
    reserved: int
    stack: int


class _ViewOomRequired(TypedDict):
    event: int
    size: int
    free: int | None
    reserved: int | None
    live: int
    stack: int
    source: Literal["recorded", "replay"]


class ViewOom(_ViewOomRequired, total=False):
    """An OOM of a picture (``View.ooms``); ``replayed``: whether the replay hit a recorded one
    too (recorded ones only)."""

    replayed: bool


Int64Array = npt.NDArray[np.int64]


@dataclass(frozen=True)
class LiveGroup:
    """Live bytes at one state that share a stack frame or an op.

    Attributes
    ----------
    key : str
        The innermost Python frame of the allocations' stacks (``"function  file:line"``),
        or their op name, or ``"(no stack)"`` / ``"(no op)"``.
    bytes : int
        Their requested bytes together.
    count : int
        How many allocations.
    """

    key: str
    bytes: int
    count: int


@dataclass(frozen=True)
class Categories:
    """Each allocation's category.

    Attributes
    ----------
    names : tuple of str
        The categories: the user's rules' names first (in rule order), then :data:`BUILT_IN`
        (a user name equal to a built-in one is that category).
    of : numpy.ndarray of int64
        Per allocation of the view: an index into ``names``.
    """

    names: tuple[str, ...]
    of: Int64Array


@dataclass
class View:
    """The data of one picture; see the module notes for states and allocation order.

    Attributes
    ----------
    title : str
    events : int
        Number of trace events ``E`` (states run from 0 to ``E``).
    start, end, size, addr, stream : numpy.ndarray of int64
        One entry per allocation: first live state, first state no longer live, requested
        bytes, the address the recorded program saw, its stream.
    stack, op : numpy.ndarray of int64
        Index into ``stacks`` / ``ops`` per allocation, -1 for none.
    event_kind : numpy.ndarray of int64
        Per event: ``EVENT_ALLOC``, ``EVENT_FREE``, ``EVENT_EMPTY_CACHE`` or ``EVENT_OOM``
        (a recorded allocation that failed).
    event_alloc : numpy.ndarray of int64
        Per event: the allocation it allocates or frees, -1 for none.
    times : numpy.ndarray of float64 or None
        Per event: microseconds since the first event, where the input has timestamps.
    stacks : list of CleanStack
    ops : list of str
    ooms : list of dict
        ``{"event", "size", "free" (bytes or None), "reserved" (bytes or None), "stack"
        (index or -1), "source" ("recorded" or "replay")}``.
    moments : list of dict
        ``{"state": s, "segments": [[address, size, stream, expandable, [[bytes, state,
        allocation or -1], ...]], ...]}``; block states 0 allocated, 1 pending free, 2 free,
        3 unmapped.
    source : str
        Where the segment maps come from (a replay and its settings), empty if none.
    notes : list of str
        Why the drawn segment maps may differ from what the recorded program had.
    history : bool
        False for a snapshot recorded without allocation history: no events, the end state's
        allocated blocks as allocations live at state 0 and its segment map as the one moment.
    phases : tuple of Phase
        The trace's named stretches (``Trace.phases``), in event indices.
    categories : Categories or None
        What kind of memory each allocation is, once :func:`~accelrt.view.add_categories`
        ran; None before.
    """

    title: str
    events: int
    start: Int64Array
    end: Int64Array
    size: Int64Array
    addr: Int64Array
    stream: Int64Array
    stack: Int64Array
    op: Int64Array
    event_kind: Int64Array
    event_alloc: Int64Array
    times: npt.NDArray[np.float64] | None = None
    stacks: list[CleanStack] = field(default_factory=list)
    ops: list[str] = field(default_factory=list)
    ooms: list[ViewOom] = field(default_factory=list)
    moments: list[Moment] = field(default_factory=list)
    source: str = ""
    notes: list[str] = field(default_factory=list)
    history: bool = True
    phases: tuple[Phase, ...] = ()
    categories: Categories | None = None

    def totals(self) -> Int64Array:
        """Live requested bytes at each state (``events + 1`` values)."""
        delta = np.zeros(self.events + 2, dtype=np.int64)
        np.add.at(delta, self.start, self.size)
        np.add.at(delta, self.end, -self.size)
        return np.cumsum(delta[: self.events + 1])

    @property
    def peak_state(self) -> int:
        """The first state where live bytes are at their peak."""
        return int(np.argmax(self.totals())) if self.events >= 0 else 0

    @property
    def peak_bytes(self) -> int:
        """The peak of live requested bytes."""
        return int(self.totals().max(initial=0))

    def frame_groups(self) -> tuple[Int64Array, list[str]]:
        """Group the allocations by the frame that names their stack.

        Returns
        -------
        ids : numpy.ndarray of int64
            Per allocation: an index into ``names``, -1 for an allocation with no stack.
        names : list of str
            Each group's frame (:attr:`CleanStack.top`: the innermost Python frame, else the
            innermost C++ frame left after noise filtering), in order of first use.

        Notes
        -----
        Stacks that differ only below their top frame share a group, so there are at most as
        many groups as ``stacks``. The page colours and aggregates allocations by these groups.
        """
        names: list[str] = []
        index: dict[str, int] = {}
        of_stack = np.empty(len(self.stacks) + 1, dtype=np.int64)
        of_stack[-1] = -1  # stack -1: no stack
        for n, stack in enumerate(self.stacks):
            top = stack.top
            if top == "(no stack)":
                of_stack[n] = -1
                continue
            if top not in index:
                index[top] = len(names)
                names.append(top)
            of_stack[n] = index[top]
        return of_stack[self.stack], names

    def live_at(self, state: int) -> npt.NDArray[np.int64]:
        """The indices of the allocations live at ``state``."""
        return np.flatnonzero((self.start <= state) & (self.end > state)).astype(np.int64)


def live_groups(view: View, state: int, by: str = "frame", limit: int = 20) -> list[LiveGroup]:
    """Group what was live at ``state`` by stack frame or by op, largest first.

    Parameters
    ----------
    view : View
    state : int
        A state in ``[0, view.events]`` (``view.peak_state``; an OOM's ``event + 1``).
    by : str
        ``"frame"`` (the innermost Python frame, else the innermost kept C++ frame) or
        ``"op"``.
    limit : int
        At most this many groups; the rest are summed in a last ``"(N other groups)"`` one.

    Returns
    -------
    list of LiveGroup

    Raises
    ------
    ValueError
        If ``by`` is neither ``"frame"`` nor ``"op"``, or ``state`` is out of range.
    """
    if by not in ("frame", "op"):
        raise ValueError(f"by must be 'frame' or 'op', got {by!r}")
    if not 0 <= state <= view.events:
        raise ValueError(f"state {state} is out of range [0, {view.events}]")
    live = view.live_at(state)
    ids = view.stack[live] if by == "frame" else view.op[live]
    sums: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    for ident, nbytes in zip(ids.tolist(), view.size[live].tolist(), strict=True):
        if by == "frame":
            key = view.stacks[ident].top if ident >= 0 else "(no stack)"
        else:
            key = view.ops[ident] if ident >= 0 else "(no op)"
        sums[key][0] += nbytes
        sums[key][1] += 1
    groups = sorted((LiveGroup(k, b, c) for k, (b, c) in sums.items()), key=lambda g: -g.bytes)
    if len(groups) > limit:
        rest = groups[limit - 1 :]
        other = LiveGroup(
            f"({len(rest)} other groups)", sum(g.bytes for g in rest), sum(g.count for g in rest)
        )
        groups = [*groups[: limit - 1], other]
    return groups


def _failed_events(trace: Trace) -> Int64Array:
    """Event indices of a recording's failed requests (its ``oom`` entries)."""
    if trace.recording is None or not trace.recording.num_ooms:
        return np.zeros(0, dtype=np.int64)
    events = trace.events
    return np.flatnonzero((events.op == OP_ALLOC) & (events.addr == FAILED_ADDR))


def _allocating(trace: Trace) -> npt.NDArray[np.bool_]:
    """Per event: whether it makes an allocation of the picture (an alloc of some bytes that
    did not fail)."""
    events = trace.events
    mask: npt.NDArray[np.bool_] = (events.op == OP_ALLOC) & (events.size != 0)
    mask[_failed_events(trace)] = False
    return mask


def _freed(addr: Int64Array, frees: npt.NDArray[np.bool_]) -> Int64Array:
    """Per item of a sequence of allocations and frees (``frees``) of addresses ``addr``: for a
    free, the position of the allocation it frees, the latest of its address before it if no
    free of that address came between (as a dict of live addresses has it); else -1."""
    order = np.argsort(addr, kind="stable")
    by_addr, is_free = addr[order], frees[order]
    hit = is_free[1:] & ~is_free[:-1] & (by_addr[1:] == by_addr[:-1])
    out = np.full(len(addr), -1, dtype=np.int64)
    out[order[1:][hit]] = order[:-1][hit]
    return out
