"""Lower bounds on what a trace needs: its live peak, that peak after rounding, an offline plan.

Three numbers frame every replay's peak reserved bytes:

- **the floor**, the peak of live requested bytes: no allocator holds the trace in less;
- **the rounded floor**, the same peak with every request rounded as PyTorch rounds it under the
  setting replayed (``memory._policy.round_size``, docs/allocator.md section 2): no PyTorch
  allocator with that setting holds it in less;
- **the offline plan**, the peak of a placement of the rounded blocks made knowing every
  lifetime in advance (``_offline_plan.plan``: greedy by size, Pisarchyk & Lee 2020, or best fit
  in start order, whichever is lower): an allocator with perfect foresight needs no more.

So for a setting, ``peak reserved - rounded floor`` is what fragmentation (segments, pools,
caching) costs, and ``plan - rounded floor`` bounds what perfect foresight would still cost.
The numbers are computed from the trace's columns once per trace and rounding setting.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import numpy.typing as npt

from ._offline_plan import Times, plan, plannable
from .memory._config import AllocatorConfig
from .memory._policy import MAX_REQUEST_BYTES, round_size
from .trace._columns import OP_ALLOC, OP_EMPTY_CACHE, OP_FREE
from .trace._recording import FAILED_ADDR

if TYPE_CHECKING:
    from .trace._columns import TraceEvents
    from .trace._format import Trace
    from .trace._recording import Recording

__all__ = ["LowerBounds", "lower_bounds"]

Int64Array = npt.NDArray[np.int64]

_BLOCK = 1 << 16
"""Events compared at a time when pairing allocs with frees."""


@dataclass(frozen=True)
class LowerBounds:
    """What a trace needs whatever the allocator does. Bytes.

    Attributes
    ----------
    peak_live_bytes : int
        The floor: the peak of live requested bytes over the trace (``Trace.peak_live_bytes``).
        For a recording, blocks live when it began count from its start, and a request that
        ran out of memory counts at its moment (so the floor can exceed the trace's).
    peak_live_rounded_bytes : int
        The same peak with each request rounded under the setting (requests above
        ``MAX_REQUEST_BYTES``, which no device grants, as they are).
    planned_peak_bytes : int or None
        The peak of the offline plan of the rounded blocks; at least
        ``peak_live_rounded_bytes``. None if the rounded sizes add up to 2**63 or more.
    algorithm : str or None
        The heuristic whose plan that is (``_offline_plan.BEST_FIT`` or ``GREEDY_BY_SIZE``);
        None without a plan.
    """

    peak_live_bytes: int
    peak_live_rounded_bytes: int
    planned_peak_bytes: int | None
    algorithm: str | None


_cache: dict[tuple[int, tuple[int, ...] | None], LowerBounds] = {}


def lower_bounds(trace: Trace, config: AllocatorConfig) -> LowerBounds:
    """Compute (or recall) the lower bounds of ``trace`` under ``config``'s rounding.

    Parameters
    ----------
    trace : Trace
        From ``accelrt.trace.load``; its events are not changed.
    config : AllocatorConfig
        Only ``roundup_power2_divisions`` matters: traces replayed under settings that round
        alike share one computation, kept while ``trace`` lives.

    Returns
    -------
    LowerBounds

    Notes
    -----
    Lifetimes are event indices: an alloc lives from its event to its free's, or past the
    last event if never freed; a recording's starting blocks from before the first event;
    a request that ran out of memory for one event. Zero-byte allocs (PyTorch hands out
    nothing) are left out. Cost: a few sorts of the columns and the plan's sweeps (about 1 s
    for 258,055 allocations; docs/snapshot-replay.md).
    """
    rounding = config.roundup_power2_divisions if config.rounds_to_divisions else None
    key = (id(trace), rounding)
    found = _cache.get(key)
    if found is None:
        found = _cache[key] = _compute(trace, config)
        weakref.finalize(trace, _cache.pop, key, None)
    return found


def _compute(trace: Trace, config: AllocatorConfig) -> LowerBounds:
    start, end, size = _lifetimes(trace)
    span = len(trace.events)
    floor = _peak(start, end, size, span)
    values = np.unique(size)
    rounded_values = [
        round_size(v, config) if v <= MAX_REQUEST_BYTES else v for v in values.tolist()
    ]
    rounded = np.array(rounded_values, dtype=np.int64)[np.searchsorted(values, size)]
    del size
    planned = algorithm = None
    if plannable(rounded):
        placement = plan(start, end, rounded)
        planned, algorithm = placement.peak_bytes, placement.algorithm
    return LowerBounds(floor, _peak(start, end, rounded, span), planned, algorithm)


def _lifetimes(trace: Trace) -> tuple[Times, Times, Int64Array]:
    """Each allocation's ``[start, end)`` in event indices (int32 where they fit) and its
    requested bytes (> 0), in order of start.

    Memory: besides the result, about 21 bytes an event at most (a sort of the events by
    address, walked a block at a time).
    """
    events = trace.events
    n = len(events)
    times = np.int32 if n < np.iinfo(np.int32).max - 1 else np.int64  # -1 to n fit
    op = events.op
    key = np.where(op == OP_EMPTY_CACHE, -1, events.addr)  # (addresses are >= 0)
    order = np.argsort(key, kind="stable")  # by address, then event order
    same_next = np.zeros(n, dtype=np.bool_)  # the next event in ``order`` has the same key
    for lo in range(0, n - 1, _BLOCK):
        hi = min(n - 1, lo + _BLOCK)
        np.equal(key[order[lo + 1 : hi + 1]], key[order[lo:hi]], out=same_next[lo:hi])
    starting = None
    if trace.recording is not None:
        first = np.ones(n, dtype=np.bool_)  # the first event of each address
        first[1:] = ~same_next[:-1]
        starting = _starting_blocks(trace.recording, events, order[first], key[order[first]])
        del first
    del key
    end_of = np.full(n, n, dtype=times)  # an alloc's free, else past the last event
    for lo in range(0, n - 1, _BLOCK):
        hi = min(n - 1, lo + _BLOCK)
        here, following = order[lo:hi], order[lo + 1 : hi + 1]
        freed = same_next[lo:hi] & (op[here] == OP_ALLOC) & (op[following] == OP_FREE)
        end_of[here[freed]] = following[freed]
    del order, same_next
    start = np.flatnonzero((op == OP_ALLOC) & (events.size > 0)).astype(times)
    end = end_of[start]
    del end_of
    size = events.size[start]
    if trace.recording is not None:  # a request that ran out of memory: one event long
        failed = events.addr[start] == FAILED_ADDR
        end[failed] = start[failed] + 1
    if starting is not None:  # first, so that the blocks stay in order of start
        start = np.concatenate((starting[0].astype(times), start))
        end = np.concatenate((starting[1].astype(times), end))
        size = np.concatenate((starting[2], size))
    return start, end, size


def _starting_blocks(
    recording: Recording, events: TraceEvents, first_event: Int64Array, first_addr: Int64Array
) -> tuple[Int64Array, Int64Array, Int64Array]:
    """A recording's blocks live when it began: from before its first event (-1) to their
    address's first event if that frees them, else past the last event.

    ``first_event`` and ``first_addr`` are the first event of each address, by address.
    """
    live = [
        (b.address, b.requested_size)
        for segment in recording.start_segments
        for b in segment.blocks
        if b.requested_size > 0
    ]
    where = np.array([a for a, _ in live], dtype=np.int64)
    end = np.full(len(live), len(events), dtype=np.int64)
    if len(first_addr):
        k = np.minimum(np.searchsorted(first_addr, where), len(first_addr) - 1)
        event = first_event[k]
        gone = (first_addr[k] == where) & (events.op[event] == OP_FREE)
        end[gone] = event[gone]
    nbytes = np.array([r for _, r in live], dtype=np.int64)
    return np.full(len(live), -1, dtype=np.int64), end, nbytes


def _peak(start: Times, end: Times, size: Int64Array, span: int) -> int:
    """The peak of the summed sizes of the blocks alive at once, lifetimes in [-1, ``span``]
    (a block ending as another starts is not counted with it); exact whatever the sizes."""
    if not len(size):
        return 0
    fits = int(size.max()) < (1 << 62) // len(size)  # the running sum fits in int64
    delta = np.zeros(span + 2, dtype=np.int64 if fits else object)  # moment t at t + 1
    np.add.at(delta, start + 1, size)
    np.subtract.at(delta, end + 1, size)
    return int(np.cumsum(delta, out=delta).max())
