"""Issue 23: allocation policies measured against PyTorch's on every real trace, in one run.

Every trace of ``--traces-dir`` (``cpu/*.jsonl.gz``, replayed from empty in the device view, and
the 40 GPU device traces ``gpu_snapshots/*.jsonl.gz``, replayed from empty with the blocks live
before recording first) is replayed

- by accelrt's real allocator on the simulated device: PyTorch-exact ``defaults`` and
  ``expandable_segments:True`` (the baselines), and ``policy:accelrt``, accelrt's own policy
  (docs/allocator.md section 16), all through ``accelrt.replay.replay``, and
- by the **design models** below: fast, page-level models of candidate policies, written for
  choosing the design by measurement. They are *models for design*, not the allocator: the
  winner, ``accelrt3``, is ``policy:accelrt`` in ``accelrt.memory`` (Python reference and
  compiled core). Two models check the models' bookkeeping against the real thing on every
  trace: ``model:expandable`` must land on the real ``expandable_segments:True`` peak and
  ``accelrt3`` on the real ``policy:accelrt`` peak and map calls.

Printed: a per-trace table of peak reserved / peak requested for each policy, with the lower
bounds (peak requested; the live peak with PyTorch's rounding and the offline plan from
``accelrt._bounds``; the 2 MiB page floor, below which no page-mapped policy can go), the
geometric mean and worst trace per set, and device map calls (``num_device_alloc``) against
expandable segments'. Targets (issue 23): geo mean <= 1.02 on each set, worst <= 1.10, never
above ``expandable_segments:True`` on a trace, map calls <= 2x expandable's on every trace.
Last, the replay speed of each CPU trace under each real setting (best of a few replays, the
settings interleaved) and ``policy:accelrt``'s against the defaults': target 3 M events/s.

    python bench/policy.py [--traces-dir ../shared/traces] [--cache /tmp/policy_cache]
                           [--policies NAME,...] [--only SUBSTRING] [--json FILE]

Parsed traces are cached as numpy arrays in ``--cache`` (keyed by file size and mtime).
"""

from __future__ import annotations

import argparse
import bisect
import dataclasses
import heapq
import json
import math
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
TRACES = ROOT.parent / "shared" / "traces"
CACHE = Path("/tmp/policy_cache")

KIB, MIB = 1 << 10, 1 << 20
PAGE = 2 * MIB  # the page of the new policy, both pools (CUDA's VMM granularity)
SMALL = 1 * MIB  # rounded sizes up to this go to the small pool (docs/allocator.md section 2)
LARGE_PAGE_EXPANDABLE = 20 * MIB  # PyTorch's expandable large-pool page
SIM_CAPACITY = 80 << 30  # the simulated device's default memory, as the baselines replay on
VA_SPAN = 5 << 44  # address space of one arena in the models: whole 2 and 20 MiB pages

ALLOC, FREE, EMPTY = 0, 1, 2  # event codes of the cached arrays
S_ALLOC, S_FREE, S_UNMAPPED = 0, 1, 2  # block states in the models


def round_size(n: int) -> int:
    """PyTorch's rounding with the default settings (docs/allocator.md section 2)."""
    return 512 if n < 512 else -(-n // 512) * 512


# --------------------------------------------------------------------------------------------
# Traces: parsed once with accelrt's reader, cached as numpy arrays
# --------------------------------------------------------------------------------------------


@dataclass
class TraceArrays:
    """One trace as the models read it: per event an op, a slot (the alloc's id, shared by its
    free), the requested bytes and the stream."""

    name: str
    group: str
    path: Path
    op: np.ndarray
    slot: np.ndarray
    size: np.ndarray
    stream: np.ndarray
    peak_live: int = 0
    streams: int = 1


def load_arrays(path: Path, group: str, cache: Path) -> TraceArrays:
    from accelrt.trace import OP_ALLOC, OP_EMPTY_CACHE, OP_FREE, load

    name = path.name.removesuffix(".jsonl.gz")
    st = path.stat()
    key = cache / f"{group}__{name}__{st.st_size}_{int(st.st_mtime)}.npz"
    if key.exists():
        z = np.load(key)
        arrays = TraceArrays(name, group, path, z["op"], z["slot"], z["size"], z["stream"])
    else:
        events = load(path).events
        op_in, addr, size_in = events.op, events.addr, events.size
        n = len(op_in)
        op = np.full(n, -1, dtype=np.int8)
        slot = np.full(n, -1, dtype=np.int64)
        live: dict[int, int] = {}
        next_slot = 0
        for i, (o, a, s) in enumerate(
            zip(op_in.tolist(), addr.tolist(), size_in.tolist(), strict=True)
        ):
            if o == OP_ALLOC:
                if s > 0:  # PyTorch hands out nothing for zero bytes
                    live[a] = next_slot
                    op[i], slot[i] = ALLOC, next_slot
                    next_slot += 1
            elif o == OP_FREE:
                k = live.pop(a, None)
                if k is not None:
                    op[i], slot[i] = FREE, k
            elif o == OP_EMPTY_CACHE:
                op[i] = EMPTY
        keep = op >= 0
        arrays = TraceArrays(
            name,
            group,
            path,
            op[keep],
            slot[keep],
            np.asarray(size_in)[keep].astype(np.int64),
            np.asarray(events.stream)[keep].astype(np.int64),
        )
        cache.mkdir(parents=True, exist_ok=True)
        np.savez(key, op=arrays.op, slot=arrays.slot, size=arrays.size, stream=arrays.stream)
    # the live peak of requested bytes and the streams used
    sign = np.where(arrays.op == ALLOC, 1, np.where(arrays.op == FREE, -1, 0))
    sizes = np.zeros(int(arrays.slot.max(initial=-1)) + 1, dtype=np.int64)
    allocs = arrays.op == ALLOC
    sizes[arrays.slot[allocs]] = arrays.size[allocs]
    delta = sign * sizes[np.maximum(arrays.slot, 0)]
    arrays.peak_live = int(np.cumsum(delta).max(initial=0))
    arrays.streams = len(np.unique(arrays.stream[allocs]))
    return arrays


def page_floor(t: TraceArrays, page: int = PAGE) -> tuple[int, int]:
    """Two floors for page-mapped policies: the peak of live rounded bytes with every pool's
    live bytes rounded up to whole pages, one pool per size class (small, large) and a single
    pool (no page holds bytes of two classes in the first)."""
    allocs = t.op == ALLOC
    sizes = np.zeros(int(t.slot.max(initial=-1)) + 1, dtype=np.int64)
    r = t.size[allocs]
    r = np.where(r < 512, 512, (r + 511) // 512 * 512)
    sizes[t.slot[allocs]] = r
    sign = np.where(t.op == ALLOC, 1, np.where(t.op == FREE, -1, 0))
    delta = sign * sizes[np.maximum(t.slot, 0)]
    small = sizes[np.maximum(t.slot, 0)] <= SMALL
    live_small = np.cumsum(np.where(small, delta, 0))
    live_large = np.cumsum(np.where(small, 0, delta))
    split = (-(-live_small // page) + -(-live_large // page)) * page
    single = -(-(live_small + live_large) // page) * page
    return int(split.max(initial=0)), int(single.max(initial=0))


# --------------------------------------------------------------------------------------------
# The design models (models for design; to move into accelrt.memory as policy:accelrt)
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Policy:
    """A candidate policy, as the model runs it.

    Attributes
    ----------
    name : str
    streams : str
        ``"arena"``: one arena per (stream, pool), blocks never change stream (PyTorch);
        ``"shared"``: one arena per pool, one free list for every stream (a free is reusable
        by any stream once it has happened); ``"adopt"``: one arena per pool, a free list per
        stream (the hit path, as today), and on a miss the best fit among other streams'
        free blocks before mapping.
    large_page, small_page : int
        Page size of the large and small arenas.
    size_classes : bool
        Small requests (<= 1 MiB) get their own arena (pages hold only small blocks); else
        every request shares the large arena.
    reclaim : str
        What a miss does when the device-wide pool of unmapped physical pages is short:
        ``"none"`` creates pages (expandable segments), ``"lru"`` first unmaps the whole free
        pages of cached blocks, least recently freed first, ``"largest"`` largest first.
    exact : bool
        Reclaim only the pages still wanted from a block (its highest ones), not all of them.
    chunk : int
        Map at least this many bytes when growing a large arena (fewer map calls; the excess
        stays cached, reclaimable).
    min_age : int
        Reclaim only blocks freed at least this many frees ago (younger ones are likely to be
        reused: unmapping them costs map calls).
    chunk_div : int
        With ``chunk``: map at least min(chunk, reserved / chunk_div) (whole pages) instead, so
        that what a chunk maps beyond the request stays a small share of reserved.
    budget : bool
        Reclaim for a map only while the maps that reclaimed are fewer than those that
        created pages (bounds map calls at about twice the growth maps).
    slack : float
        >= 0: reclaim only when creating the pages would take reserved above (1 + slack) x the
        peak of requested bytes so far (a fragmentation budget: below it, grow as expandable
        segments do and keep the cache intact; above it, move idle pages).
    adapt_div, max_slack : int, float
        With ``adapt_div`` > 0 the budget grows by 1/adapt_div of every map that had to reclaim
        (a trace that keeps moving pages gets more room, as expandable segments would take),
        up to ``max_slack`` x the peak of requested bytes.
    chunk_in_budget : bool
        Map beyond the request (``chunk``) only as far as reserved stays within
        (1 + ``chunk_slack``) x the peak of requested bytes.
    views : bool
        GMLake's stitching: a reclaim does not unmap the donor pages; they are mapped a
        second time where the request needs them, and each free block is usable only while
        none of its pages is held by an allocated block of another mapping (two views of the
        same physical pages, each usable while the other is free). Reserved counts physical
        pages once; one page size for both classes.
    reclaim_below_peak : bool
        Reclaim even while creating pages would keep reserved at or below its high-water mark
        (else create there: fewer map calls, same peak).
    growable_walk : bool
        PyTorch's walk to a candidate with a smaller growable size (docs/allocator.md
        section 3); else plain best fit.
    same_first : bool
        Reclaim from the requesting arena's free blocks first, then from every arena.
    align : bool
        With ``chunk``: grow a large arena up to the next multiple of ``chunk`` in its address
        space (expandable segments' 20 MiB pages) instead of ``max(exact, chunk)``.
    adapt_after : float
        With ``adapt_div``: grow the budget only once reclaiming maps outnumber
        ``adapt_after`` x the creating maps.
    reserve_pages : int
        Reclaim only above the budget plus this many pages.
    floor_budget, floor_slack, floor_or_slack : bool, float, bool
        The budget is the high-water mark of expandable segments' page floor of the live
        bytes (large in 20 MiB pages, small in 2 MiB) plus ``floor_slack`` x the peak of
        requested bytes; with ``floor_or_slack``, at least (1 + ``slack``) x that peak.
        ``chunk_in_budget`` then limits chunks to max(budget, (1 + ``chunk_slack``) x peak
        + ``chunk_abs``).
    keep_small : int
        A large arena's reclaim skips a small arena with fewer than ``keep_small + 1`` pages
        of idle bytes (mapped minus allocated).
    stop_after : float
        >= 0: stop reclaiming for good once reclaiming maps exceed this x creating maps.
    move_max_share, move_max_min, move_max_after : float, int, float
        Create instead of reclaiming for a map larger than ``move_max_share`` x reserved (and
        at least ``move_max_min`` bytes, once reclaiming maps reach ``move_max_after`` x
        creating maps).
    chunk_abs : int
        Added to the chunk's limit of ``chunk_in_budget`` with ``floor_budget``.
    adapt_min_share : float
        With ``adapt_div``: only maps of at least this share of reserved grow the budget.
    adapt_for_larger : bool
        With ``adapt_div``: the budget's growth applies only to requests at least as large as
        the smallest one whose map grew it (room for the large tensors that were stitched).
    restitch_min : int
        > 0: a request of a rounded size (at least this) that a reclaim has served before
        creates pages instead (GMLake: a size is stitched once, then reused).
    protect_request : bool
        A reclaim for a growth spares only what the request will hold (and the pages being
        mapped), not the whole run found for it: the run's last free block gives its whole
        pages above the request's end (else every block of the run is spared).
    join_owners : bool
        With ``streams="adopt"``: a miss that would take reserved above the budget first
        joins every run of neighbouring free blocks of different owners into one block (the
        lowest one's owner and free time).
    adopt_tail : bool
        With ``streams="adopt"``: where the run a growth found begins with an unmapped block
        whose predecessor is another stream's free block, that block changes owner (keeping
        its free time) and the run begins with it.
    """

    name: str
    streams: str = "arena"
    large_page: int = PAGE
    small_page: int = PAGE
    size_classes: bool = True
    reclaim: str = "lru"
    reclaim_below_peak: bool = True
    growable_walk: bool = False
    exact: bool = False
    chunk: int = 0
    min_age: int = 0
    chunk_div: int = 0
    budget: bool = False
    slack: float = -1.0
    adapt_div: int = 0
    chunk_in_budget: bool = False
    chunk_slack: float = 0.01
    views: bool = False
    max_slack: float = 0.10
    same_first: bool = False
    align: bool = False
    adapt_after: float = -1.0
    reserve_pages: int = 0
    floor_budget: bool = False
    floor_slack: float = 0.0
    keep_small: int = 0
    floor_or_slack: bool = False
    stop_after: float = -1.0
    move_max_share: float = 0.0
    restitch_min: int = 0
    chunk_abs: int = 0
    adapt_min_share: float = 0.0
    adapt_for_larger: bool = False
    move_max_min: int = 0
    move_max_after: float = 0.0
    floor_slack_mul: float = 1.0
    protect_request: bool = False
    join_owners: bool = False
    adopt_tail: bool = False


ACCELRT = Policy(
    "accelrt",
    streams="adopt",
    exact=True,
    chunk=LARGE_PAGE_EXPANDABLE,
    chunk_div=16,
    growable_walk=True,
    slack=0.01,
)
"""The first candidate for ``policy:accelrt`` (docs/policy-design.md, kept for comparison)."""

ACCELRT2 = dataclasses.replace(
    ACCELRT,
    name="accelrt2",
    same_first=True,
    floor_budget=True,
    floor_or_slack=True,
    slack=0.005,
    chunk_in_budget=True,
    chunk_slack=0.0,
    chunk_abs=LARGE_PAGE_EXPANDABLE,
    chunk_div=0,
    align=True,
    keep_small=1,
)
"""``accelrt`` with the budget max(expandable segments' page floor of live bytes, 1.005 x H),
growth as expandable segments (to the next 20 MiB boundary) only within max(that budget,
H + 20 MiB), reclaims from the requesting arena first, and a small arena's last idle page
kept from large arenas."""

ACCELRT3 = dataclasses.replace(
    ACCELRT2,
    name="accelrt3",
    adapt_div=1,
    adapt_min_share=1 / 3,
    adapt_for_larger=True,
    protect_request=True,
    join_owners=True,
    adopt_tail=True,
)
"""The candidate for ``policy:accelrt`` (docs/policy-design.md): ``accelrt2``, and a move for a
map of at least a third of reserved raises the budget by that map's bytes (up to 10% of H),
for requests at least as large as the smallest one whose map raised it: a trace whose largest
tensors have to be stitched anew keeps room for them as expandable segments would, instead of
stitching them every iteration, and smaller requests keep the budget B0 (``adapt_for_larger``);
a reclaim spares only what the request will hold (``protect_request``); above the budget, free
neighbours of different owners are joined first (``join_owners``)."""

POLICIES = {
    p.name: p
    for p in (
        # PyTorch's expandable segments, re-modelled: must match the real allocator's peak
        Policy(
            "model:expandable", large_page=LARGE_PAGE_EXPANDABLE, reclaim="none", growable_walk=True
        ),
        # ablations, one idea at a time
        Policy("pages2m", reclaim="none"),  # 2 MiB pages in the large pool too
        Policy("shared", streams="shared", reclaim="none"),  # + one arena for all streams
        Policy("reclaim", streams="arena"),  # 2 MiB, per stream, always move idle pages (LRU)
        Policy("shared+reclaim", streams="shared"),
        Policy("exact+chunk20", exact=True, chunk=LARGE_PAGE_EXPANDABLE),
        # the candidate (policy:accelrt) and its variants
        ACCELRT,
        ACCELRT2,
        ACCELRT3,
        dataclasses.replace(ACCELRT, name="accelrt/shared", streams="shared"),
        dataclasses.replace(ACCELRT, name="accelrt/arena", streams="arena"),
        dataclasses.replace(ACCELRT, name="accelrt/0.5%", slack=0.005),
        dataclasses.replace(ACCELRT, name="accelrt/adapt", adapt_div=16),
        dataclasses.replace(ACCELRT, name="accelrt/tight", chunk_in_budget=True, chunk_slack=0.03),
        dataclasses.replace(ACCELRT, name="accelrt/views", views=True, growable_walk=False),
    )
}
"""The policies ``--policies`` may name (``accelrt/views``, GMLake's two views of moved
pages, is slow: minutes on the CPU traces). Others measured while designing, by changing
fields (results in docs/policy-design.md): a 1000-free minimum age before reclaiming, a
reclaim budget of one reclaiming map per creating map, largest-, smallest- and
most-recent-first reclaim, 20 MiB large pages with reclaim, one arena for small and large
blocks."""
DEFAULT_POLICIES = ("model:expandable", "accelrt3")
"""The models run by default: the two that check the real allocator. The design variants
(``accelrt``, ``accelrt2``, ``pages2m``, ``shared+reclaim``, ``accelrt/arena``,
``accelrt/tight``, ``accelrt/adapt``, ...) run with ``--policies``."""
BASELINES = ("defaults", "expandable")


class Device:
    """The device-wide state of a model run: physical pages, counters, reclaim order."""

    def __init__(self, policy: Policy) -> None:
        self.policy = policy
        self.reserved = 0  # bytes of physical pages held (mapped or in the pool)
        self.peak = 0
        self.pool: dict[int, int] = {}  # page size -> bytes of unmapped physical pages held
        self.maps = 0  # map calls: one per contiguous run of pages mapped
        self.unmaps = 0
        self.grow_maps = 0  # maps that created pages
        self.reclaim_maps = 0  # maps that unmapped cached pages first
        self.created = 0  # bytes of physical pages created
        self.arenas: dict[Any, Arena] = {}
        self.lru: list[tuple[int, int, int, int]] = []  # (key, free time, arena, addr), lazy
        self.by_id: list[Arena] = []
        self.clock = 0
        self.requested = 0
        self.peak_requested = 0
        self.capacity = SIM_CAPACITY
        self.allow = 0  # the budget's growth (adapt_div)
        self.allow_from = 0  # adapt_for_larger: the smallest request that grew it
        self.retries = 0
        self.live_small = self.live_large = self.floor_peak = 0
        self.cur_s = 0  # the rounded size of the malloc being served
        self.stitched: set[int] = set()  # sizes a reclaim has served (restitch_min)
        self.adoptions = 0
        self.grows = 0  # mallocs that grew an arena (the slow path, besides adoptions)
        # views: physical page ids and their mappings
        self.next_phys = 0
        self.free_ids: list[int] = []
        self.maps_of: dict[int, list[tuple[int, int]]] = {}  # phys -> [(arena, page index)]
        self.claim: dict[tuple[int, int], int] = {}  # (arena, page index) -> allocated blocks
        self.taken: set[int] = set()  # phys ids donated during the current malloc

    def arena(self, stream: int, small: bool) -> Arena:
        p = self.policy
        small = small and p.size_classes
        key = (stream if p.streams == "arena" else 0, small)
        a = self.arenas.get(key)
        if a is None:
            page = p.small_page if small else p.large_page
            a = self.arenas[key] = Arena(self, len(self.by_id), page, p.growable_walk, small)
            self.by_id.append(a)
        return a

    def budget(self) -> int:
        """floor_budget: the high-water mark of the live rounded bytes in whole pages of
        expandable segments (large in 20 MiB, small in 2 MiB): expandable segments can never
        reserve less, so reserving up to it can never take a trace above them."""
        p = self.policy
        b = self.floor_peak + int(p.floor_slack * p.floor_slack_mul * self.peak_requested)
        if p.floor_or_slack:
            b = max(b, int((1.0 + p.slack) * self.peak_requested))
        return b

    def allowance(self) -> int:
        """The budget's growth (adapt_div) for the malloc being served."""
        if self.policy.adapt_for_larger and self.cur_s < self.allow_from:
            return 0
        return self.allow

    def note_live(self, s: int, sign: int) -> None:
        if s <= SMALL:
            self.live_small += sign * s
        else:
            self.live_large += sign * s
        if sign > 0:
            big = LARGE_PAGE_EXPANDABLE
            f = -(-self.live_large // big) * big + -(-self.live_small // PAGE) * PAGE
            if f > self.floor_peak:
                self.floor_peak = f

    def obtain(self, page: int, nbytes: int, exclude: Arena, lo: int, hi: int) -> None:
        """Provide ``nbytes`` of physical pages of size ``page`` for a map: from the pool,
        then (policy) by unmapping idle cached pages, then by creating pages."""
        have = self.pool.get(page, 0)
        p = self.policy
        if have < nbytes and p.reclaim != "none":
            over = self.reserved + nbytes - have
            if p.slack >= 0:
                budget = self.budget() if p.floor_budget else (1.0 + p.slack) * self.peak_requested
                budget += self.allowance()
                go = over > budget + p.reserve_pages * PAGE
            else:
                go = p.reclaim_below_peak or over > self.peak
            if p.stop_after >= 0 and self.reclaim_maps > p.stop_after * self.grow_maps:
                go = False
            if (
                p.move_max_share
                and nbytes > p.move_max_share * self.reserved
                and nbytes >= p.move_max_min
                and self.reclaim_maps >= p.move_max_after * self.grow_maps
            ):
                go = False
            if go and p.restitch_min and self.cur_s >= p.restitch_min:
                if self.cur_s in self.stitched:
                    go = False  # stitched for this size before: grow (the next one is a hit)
                else:
                    self.stitched.add(self.cur_s)
            if go and (not p.budget or self.reclaim_maps < self.grow_maps):
                self.reclaim(page, nbytes - have, exclude, lo, hi)
                if self.pool.get(page, 0) > have:
                    self.reclaim_maps += 1
                    if (
                        p.adapt_div
                        and self.reclaim_maps > p.adapt_after * self.grow_maps
                        and nbytes >= p.adapt_min_share * self.reserved
                    ):
                        cap = int(p.max_slack * self.peak_requested)
                        self.allow = min(self.allow + nbytes // p.adapt_div, cap)
                        if not self.allow_from or self.cur_s < self.allow_from:
                            self.allow_from = self.cur_s
                have = self.pool.get(page, 0)
        if self.reserved + nbytes - have > self.capacity:
            # the device is full: the last step of the malloc ladder (docs/allocator.md
            # section 6, step 6) releases every idle page, then this map is tried again
            self.retries += 1
            self.empty_cache(exclude, lo, hi, keep=(page, nbytes))
            have = self.pool.get(page, 0)
        take = min(have, nbytes)
        self.pool[page] = have - take
        create = nbytes - take
        if create:
            self.grow_maps += 1
            self.created += create
            self.reserved += create
            if self.reserved > self.peak:
                self.peak = self.reserved

    def page_busy(self, phys: int, but: tuple[int, int] | None = None) -> bool:
        """Whether an allocated block holds ``phys`` in some mapping (other than ``but``)."""
        return any(m != but and self.claim.get(m, 0) for m in self.maps_of[phys])

    def obtain_views(self, npages: int, exclude: Arena, lo: int, hi: int) -> list[int]:
        """Physical page ids for a map of ``npages`` pages (views): above the budget, idle
        pages of free blocks (oldest stamp first, highest pages first) that no allocated
        block holds, left mapped where they are; then new pages."""
        page = exclude.page
        p = self.policy
        ids: list[int] = []
        over = self.reserved + npages * page
        if over > (1.0 + p.slack) * self.peak_requested:
            lo_vp, hi_vp = lo // page, -(-hi // page)
            kept = []
            while len(ids) < npages and self.lru:
                entry = heapq.heappop(self.lru)
                _, t, aid, addr = entry
                a = self.by_id[aid]
                if a.state.get(addr) != S_FREE or a.ftime.get(addr) != t:
                    continue
                kept.append(entry)
                if a is exclude and addr < hi and addr + a.size[addr] > lo:
                    continue
                size = a.size[addr]
                first = -(-addr // page)
                for vp in range((addr + size) // page - 1, first - 1, -1):
                    phys = a.phys[vp]
                    if phys in self.taken or self.page_busy(phys):
                        continue
                    if any(  # mapped again inside the run about to be handed out
                        aid2 == exclude.aid and lo_vp <= vp2 < hi_vp
                        for aid2, vp2 in self.maps_of[phys]
                    ):
                        continue
                    ids.append(phys)
                    self.taken.add(phys)
                    if len(ids) == npages:
                        break
            for e in kept:
                heapq.heappush(self.lru, e)
            if ids:
                self.reclaim_maps += 1
        if self.reserved + (npages - len(ids)) * page > self.capacity:
            self.retries += 1
            self.empty_cache(exclude, lo, hi)
        while len(ids) < npages:
            phys = heapq.heappop(self.free_ids) if self.free_ids else self.next_phys
            if phys == self.next_phys:
                self.next_phys += 1
            self.maps_of[phys] = []
            ids.append(phys)
            self.created += page
            self.reserved += page
        if self.reserved > self.peak:
            self.peak = self.reserved
        return ids

    def reclaim(self, page: int, want: int, exclude: Arena, lo: int, hi: int) -> None:
        """Unmap whole free pages of cached blocks into the pool until ``want`` bytes are
        there, in the policy's order, never inside [lo, hi) of ``exclude`` (the range about to
        be mapped)."""
        got = 0
        if self.policy.reclaim in ("lru", "mru"):
            passes = (exclude.aid, None) if self.policy.same_first else (None,)
            for only in passes:
                kept = []
                while got < want and self.lru:
                    key, t, aid, addr = heapq.heappop(self.lru)
                    a = self.by_id[aid]
                    if a.page != page or a.state.get(addr) != S_FREE or a.ftime.get(addr) != t:
                        if a.page != page and a.state.get(addr) == S_FREE and a.ftime[addr] == t:
                            kept.append((key, t, aid, addr))
                        continue
                    above = 0
                    if a is exclude and addr < hi and addr + a.size[addr] > lo:
                        if self.policy.protect_request and addr + a.size[addr] > hi:
                            above = hi  # the run's last free block: its pages above hi
                        else:
                            kept.append((key, t, aid, addr))
                            continue
                    if (only is not None and aid != only) or (
                        self.policy.keep_small
                        and a.small
                        and not exclude.small
                        and a.mapped - a.live < (self.policy.keep_small + 1) * page
                    ):
                        kept.append((key, t, aid, addr))
                        continue
                    if self.clock - t < self.policy.min_age:
                        kept.append((key, t, aid, addr))
                        break
                    got += a.unmap_block(addr, want - got if self.policy.exact else 0, above)
                for e in kept:
                    heapq.heappush(self.lru, e)
        else:  # largest (or smallest) first, over every arena of this page size
            cands = []
            for a in self.by_id:
                if a.page == page:
                    for size, addr in a.free_blocks():
                        if size >= page and not (a is exclude and addr < hi and addr + size > lo):
                            if self.policy.reclaim == "top":  # highest address first
                                other = self.policy.same_first and a is not exclude
                                cands.append((other, -addr, a.aid, addr))
                            else:
                                cands.append((-size, a.aid, addr))
            cands.sort(reverse=self.policy.reclaim == "smallest")
            for *_, aid, addr in cands:
                if got >= want:
                    break
                if self.by_id[aid].state.get(addr) == S_FREE:
                    want_here = want - got if self.policy.exact else 0
                    got += self.by_id[aid].unmap_block(addr, want_here)

    def check(self) -> None:
        """Assert the model's invariants: blocks tile each arena; unmapped blocks are whole
        pages; every page under an allocated or free block is mapped and no other page is;
        reserved = mapped pages + idle pool; free lists hold exactly the free blocks."""
        mapped = 0
        for a in self.by_id:
            addr, pages = 0, set()
            while addr < VA_SPAN:
                size, state = a.size[addr], a.state[addr]
                assert size > 0 and a.end[addr + size] == addr
                if state == S_UNMAPPED:  # whole pages, so none is also under a block
                    assert addr % a.page == 0 and size % a.page == 0, (addr, size)
                else:
                    pages.update(range(addr // a.page, -(-(addr + size) // a.page)))
                addr += size
            assert addr == VA_SPAN
            assert len(pages) * a.page == a.mapped, (len(pages) * a.page, a.mapped)
            listed = sorted((size, addr) for blocks in a.free.values() for size, addr in blocks)
            free = sorted((a.size[x], x) for x, st in a.state.items() if st == S_FREE)
            assert listed == free
            mapped += a.mapped
        if self.policy.views:
            assert len(self.maps_of) * PAGE == self.reserved
            assert sum(len(a.phys) * a.page for a in self.by_id) == mapped
            for a in self.by_id:  # no two allocated blocks hold one physical page
                for vp, phys in a.phys.items():
                    if self.claim.get((a.aid, vp), 0):
                        assert not self.page_busy(phys, (a.aid, vp)), (a.aid, vp, phys)
        else:
            assert mapped + sum(self.pool.values()) == self.reserved, (mapped, self.reserved)

    def empty_cache(
        self,
        exclude: Arena | None = None,
        lo: int = 0,
        hi: int = 0,
        keep: tuple[int, int] = (0, 0),
    ) -> None:
        """Unmap every whole free page (not inside [lo, hi) of ``exclude``) and give the
        pages back to the device, but for ``keep`` (page size, bytes) wanted by a map."""
        for a in self.by_id:
            for size, addr in a.free_blocks():
                if a is exclude and addr < hi and addr + size > lo:
                    continue
                if a.state.get(addr) == S_FREE:
                    a.unmap_block(addr)
        for page, nbytes in self.pool.items():
            kept = min(nbytes, keep[1]) if page == keep[0] else 0
            self.reserved -= nbytes - kept
            self.pool[page] = kept


class Arena:
    """One virtual address range with blocks (allocated, free and mapped, unmapped); whole
    pages are mapped under allocated and free blocks, unmapped blocks are page-aligned.

    Allocated and free blocks have an owner stream (always 0 unless the policy adopts across
    streams in one arena); free blocks merge only with free neighbours of the same owner, and
    each owner has its own free list ordered by (size, address): the hit path.
    """

    def __init__(self, dev: Device, aid: int, page: int, growable_walk: bool, small: bool) -> None:
        self.dev, self.aid, self.page, self.walk = dev, aid, page, growable_walk
        self.chunk = 0 if small else dev.policy.chunk
        self.small = small
        self.live = 0  # bytes of allocated blocks
        self.mapped = 0  # bytes of pages mapped in this arena
        self.size: dict[int, int] = {0: VA_SPAN}
        self.state: dict[int, int] = {0: S_UNMAPPED}
        self.owner: dict[int, int] = {}
        self.end: dict[int, int] = {VA_SPAN: 0}
        self.ftime: dict[int, int] = {}
        self.free: dict[int, list[tuple[int, int]]] = {}  # owner -> [(size, addr)] sorted
        self.unmapped: list[int] = [0]  # addresses of unmapped blocks
        self.views = dev.policy.views
        self.phys: dict[int, int] = {}  # page index -> physical page id (views)
        self.multi: set[int] = set()  # page indices whose physical page has other mappings

    def available(self, addr: int, size: int) -> bool:
        """Views: whether no page of the free block at ``addr`` is held by an allocated block
        of another mapping."""
        if not self.multi:
            return True
        page, dev = self.page, self.dev
        for vp in range(addr // page, -(-(addr + size) // page)):
            if vp in self.multi and dev.page_busy(self.phys[vp], (self.aid, vp)):
                return False
        return True

    def _claim(self, addr: int, size: int, delta: int) -> None:
        claim, aid, page = self.dev.claim, self.aid, self.page
        for vp in range(addr // page, -(-(addr + size) // page)):
            claim[aid, vp] = claim.get((aid, vp), 0) + delta

    def _map_pages(self, vp0: int, ids: list[int]) -> None:
        dev = self.dev
        for k, phys in enumerate(ids):
            vp = vp0 + k
            self.phys[vp] = phys
            where = dev.maps_of[phys]
            where.append((self.aid, vp))
            if len(where) > 1:
                for aid, v in where:
                    dev.by_id[aid].multi.add(v)

    def _unmap_pages(self, vp0: int, vp1: int) -> None:
        dev = self.dev
        for vp in range(vp0, vp1):
            phys = self.phys.pop(vp)
            self.multi.discard(vp)
            where = dev.maps_of[phys]
            where.remove((self.aid, vp))
            if not where:
                del dev.maps_of[phys]
                heapq.heappush(dev.free_ids, phys)
                dev.reserved -= self.page
            elif len(where) == 1:
                aid, v = where[0]
                dev.by_id[aid].multi.discard(v)

    def free_blocks(self) -> list[tuple[int, int]]:
        """Every free mapped block as (size, address), in that order."""
        return sorted(x for blocks in self.free.values() for x in blocks)

    # block bookkeeping
    def _add(self, addr: int, size: int, state: int, owner: int = 0, when: int = 0) -> None:
        self.size[addr] = size
        self.state[addr] = state
        self.end[addr + size] = addr
        if state == S_FREE:
            self.owner[addr] = owner
            bisect.insort(self.free.setdefault(owner, []), (size, addr))
            dev = self.dev
            if not when:
                dev.clock += 1
                when = dev.clock
            self.ftime[addr] = when
            if size >= self.page and dev.policy.reclaim in ("lru", "mru"):
                key = when if dev.policy.reclaim == "lru" else -when
                heapq.heappush(dev.lru, (key, when, self.aid, addr))
        elif state == S_ALLOC:
            self.owner[addr] = owner
        else:
            bisect.insort(self.unmapped, addr)

    def _remove(self, addr: int) -> tuple[int, int, int]:
        size = self.size.pop(addr)
        state = self.state.pop(addr)
        del self.end[addr + size]
        owner = self.owner.pop(addr, 0)
        if state == S_FREE:
            free = self.free[owner]
            del free[bisect.bisect_left(free, (size, addr))]
            del self.ftime[addr]
        elif state == S_UNMAPPED:
            del self.unmapped[bisect.bisect_left(self.unmapped, addr)]
        return size, state, owner

    def _mergeable(self, addr: int | None, state: int, owner: int) -> bool:
        return (
            addr is not None
            and self.state.get(addr) == state
            and (
                state == S_UNMAPPED
                or (
                    self.owner[addr] == owner
                    and (not self.multi or self.available(addr, self.size[addr]))
                )
            )
        )

    def _put_merged(self, addr: int, size: int, state: int, owner: int = 0) -> None:
        """Insert a free or unmapped block, merged with neighbours of the same state (and,
        free, the same owner)."""
        prev = self.end.get(addr)
        if self._mergeable(prev, state, owner) and not self._twice(prev, addr + size, state):
            assert prev is not None
            psize = self._remove(prev)[0]
            addr, size = prev, size + psize
        nxt = addr + size
        if self._mergeable(nxt, state, owner) and not self._twice(
            addr, nxt + self.size[nxt], state
        ):
            size += self._remove(nxt)[0]
        self._add(addr, size, state, owner)

    def _twice(self, lo: int, hi: int, state: int) -> bool:
        """Views: whether [lo, hi) would hold one physical page at two places (a free block
        that could never be handed out)."""
        if state != S_FREE or not self.multi:
            return False
        seen = set()
        page = self.page
        for vp in range(lo // page, -(-hi // page)):
            if vp in self.multi:
                phys = self.phys[vp]
                if phys in seen:
                    return True
                seen.add(phys)
        return False

    # malloc / free
    def malloc(self, s: int, stream: int = 0) -> int:
        self.dev.cur_s = s
        addr = self._find(s, stream)
        if addr is None and self.dev.policy.streams == "adopt":
            dev = self.dev
            if dev.policy.join_owners and dev.reserved + s > dev.budget() + dev.allowance():
                self._join_owners()
            addr = self._adopt(s, stream)
        if addr is None:
            addr = self._grow(s, stream)
        size = self._remove(addr)[0]
        if size - s >= 512:
            self._put_merged(addr + s, size - s, S_FREE, stream)
            size = s
        self._add(addr, size, S_ALLOC, stream)
        self.live += size
        if self.views:
            self._claim(addr, size, 1)
            self.dev.taken.clear()
        return addr

    def _find(self, s: int, stream: int) -> int | None:
        free = self.free.get(stream)
        if not free:
            return None
        i = bisect.bisect_left(free, (s, -1))
        if self.multi:  # views: skip blocks whose pages another mapping holds
            while i < len(free) and not self.available(free[i][1], free[i][0]):
                i += 1
        if i == len(free):
            return None
        if self.walk:
            size, addr = free[i]
            g = self._growable(addr, size)
            while i + 1 < len(free):
                nsize, naddr = free[i + 1]
                ng = self._growable(naddr, nsize)
                if ng >= g:
                    break
                i, g = i + 1, ng
        return free[i][1]

    def _join_owners(self) -> None:
        """Make every run of neighbouring free blocks one block, owned by its lowest block's
        owner, with that block's free time."""
        runs: list[list[int]] = []
        for addr in sorted(a for a, state in self.state.items() if state == S_FREE):
            if runs and self.end.get(addr) == runs[-1][-1]:
                runs[-1].append(addr)
            else:
                runs.append([addr])
        for run in runs:
            if len(run) > 1:
                first = run[0]
                owner, when = self.owner[first], self.ftime[first]
                total = sum(self._remove(addr)[0] for addr in run)
                self._add(first, total, S_FREE, owner, when)

    def _adopt(self, s: int, stream: int) -> int | None:
        """Slow path: the best fit among other streams' free blocks (their frees have
        happened: in a real run, once the stream's release event completed), by (size,
        address); it changes owner."""
        best = None
        for owner, free in self.free.items():
            if owner != stream and free:
                i = bisect.bisect_left(free, (s, -1))
                while self.multi and i < len(free) and not self.available(*free[i][::-1]):
                    i += 1
                if i < len(free) and (best is None or free[i] < best):
                    best = free[i]
        if best is None:
            return None
        self.dev.adoptions += 1
        return best[1]

    def _growable(self, addr: int, size: int) -> int:
        nxt = addr + size
        return size + self.size[nxt] if self.state.get(nxt) == S_UNMAPPED else size

    def _grow(self, s: int, stream: int) -> int:
        """Expandable segments' growth rule (docs/allocator.md section 7): the first unmapped
        block in address order whose run of own free or unmapped blocks (starting at its own
        free predecessor if any) holds ``s`` bytes; map what it needs."""
        self.dev.grows += 1
        start = run_end = None
        state, owner = self.state, self.owner
        for u in self.unmapped:
            prev = self.end.get(u)
            st = prev if prev is not None and self._mergeable(prev, S_FREE, stream) else u
            if st != u and self.multi and not self.available(st, self.size[st]):
                st = u
            run, a = 0, st
            while run < s:
                here = state.get(a)
                if here is None or here == S_ALLOC or (here == S_FREE and owner[a] != stream):
                    break
                if here == S_FREE and self.multi and not self.available(a, self.size[a]):
                    break
                run += self.size[a]
                a += self.size[a]
            if run >= s:
                start, run_end = st, a
                break
        assert start is not None and run_end is not None, "arena address space exhausted"
        prev = self.end.get(start)
        if (
            self.dev.policy.adopt_tail
            and state[start] == S_UNMAPPED
            and prev is not None
            and state.get(prev) == S_FREE
            and owner[prev] != stream
        ):  # another stream's free block just below the run: adopted, the run starts there
            when = self.ftime[prev]
            self._add(prev, self._remove(prev)[0], S_FREE, stream, when)
            self.dev.adoptions += 1
            start = prev
        page = self.page
        # map the unmapped blocks of the run, up to the page holding the last byte
        while True:
            size = self.size[start] if state[start] == S_FREE else 0
            if size >= s:
                return start
            u = start + size
            assert state[u] == S_UNMAPPED
            chunk = self.chunk
            dev = self.dev
            exact = -(-(s - size) // page) * page
            if chunk and dev.policy.align:
                # expandable segments' growth: up to the next multiple of the chunk in the arena
                chunk = -(-(u + exact) // chunk) * chunk - u
            elif chunk and dev.policy.chunk_div:
                share = dev.reserved // dev.policy.chunk_div // page * page
                chunk = min(chunk, max(page, share))
            if chunk > exact and dev.policy.chunk_in_budget and dev.policy.slack >= 0:
                # map beyond the request only while reserved stays within the budget
                if dev.policy.floor_budget:
                    chunk_budget = int((1.0 + dev.policy.chunk_slack) * dev.peak_requested)
                    chunk_budget += dev.policy.chunk_abs
                    room = max(dev.budget(), chunk_budget) - dev.reserved
                else:
                    room = int((1.0 + dev.policy.chunk_slack) * dev.peak_requested) - dev.reserved
                room -= dev.pool.get(page, 0)
                chunk = min(chunk, max(exact, room // page * page))
            need = min(self.size[u], max(exact, chunk))
            spared = max(start + s if dev.policy.protect_request else run_end, u + need)
            if self.views:
                ids = self.dev.obtain_views(need // page, self, start, spared)
            else:
                self.dev.obtain(page, need, self, start, spared)
            # reclaiming may have merged unmapped pages of a neighbour into u's block
            ub = self.unmapped[bisect.bisect_right(self.unmapped, u) - 1]
            uend = ub + self.size[ub]
            self.dev.maps += 1
            self.mapped += need
            self._remove(ub)
            if ub < u:
                self._add(ub, u - ub, S_UNMAPPED)
            if uend > u + need:
                self._add(u + need, uend - u - need, S_UNMAPPED)
            if self.views:
                self._map_pages(u // page, ids)
            self._put_merged(u, need, S_FREE, stream)

    def free_block(self, addr: int) -> None:
        size, _, owner = self._remove(addr)
        self.live -= size
        if self.views:
            self._claim(addr, size, -1)
        self._put_merged(addr, size, S_FREE, owner)

    def unmap_block(self, addr: int, want: int = 0, above: int = 0) -> int:
        """Unmap the whole pages inside the free block at ``addr`` (with ``want``: only enough
        of its highest ones for that many bytes; none below ``above``); return their bytes."""
        size = self.size[addr]
        page = self.page
        lo = -(-addr // page) * page
        hi = (addr + size) // page * page
        if want:
            lo = max(lo, hi - -(-want // page) * page)
        lo = max(lo, -(-above // page) * page)
        if hi <= lo:
            return 0
        when = self.ftime[addr]
        owner = self._remove(addr)[2]
        if lo > addr:
            self._add(addr, lo - addr, S_FREE, owner, when)
        if addr + size > hi:
            self._add(hi, addr + size - hi, S_FREE, owner, when)
        self._put_merged(lo, hi - lo, S_UNMAPPED)
        dev = self.dev
        if self.views:
            self._unmap_pages(lo // page, hi // page)
        else:
            dev.pool[page] = dev.pool.get(page, 0) + (hi - lo)
        dev.unmaps += 1
        self.mapped -= hi - lo
        return hi - lo


@dataclass
class ModelResult:
    peak_reserved: int
    maps: int
    unmaps: int
    created: int
    seconds: float
    mallocs: int = 0
    slow: int = 0  # mallocs that missed their own free list (adopted or grew)


def run_model(t: TraceArrays, policy: Policy, check: int = 0) -> ModelResult:
    """Replay ``t`` through a model of ``policy``; with ``check`` > 0, assert the invariants
    every ``check`` events and at the end (slow)."""
    start = time.perf_counter()
    dev = Device(policy)
    where: dict[int, tuple[Arena, int]] = {}
    adopt = policy.streams == "adopt"
    arenas: dict[tuple[int, bool], Arena] = {}
    size = t.size.tolist()
    for i, (o, k, n, st) in enumerate(
        zip(t.op.tolist(), t.slot.tolist(), size, t.stream.tolist(), strict=True)
    ):
        if o == ALLOC:
            s = round_size(n)
            dev.requested += n
            if dev.requested > dev.peak_requested:
                dev.peak_requested = dev.requested
            key = (st, s <= SMALL)
            a = arenas.get(key)
            if a is None:
                a = arenas[key] = dev.arena(st, s <= SMALL)
            dev.note_live(s, 1)
            where[k] = (a, a.malloc(s, st if adopt else 0))
        elif o == FREE:
            a, addr = where.pop(k)
            a.free_block(addr)
            dev.requested -= size[i]
            dev.note_live(round_size(size[i]), -1)
        else:
            dev.empty_cache()
        if check and i % check == 0:
            dev.check()
    if check:
        dev.check()
    return ModelResult(
        dev.peak,
        dev.maps,
        dev.unmaps,
        dev.created,
        time.perf_counter() - start,
        int((t.op == ALLOC).sum()),
        dev.grows + dev.adoptions,
    )


# --------------------------------------------------------------------------------------------
# Baselines: the real allocator (PyTorch-exact) and the lower bounds
# --------------------------------------------------------------------------------------------


@dataclass
class Row:
    trace: TraceArrays
    peak_requested: int = 0
    floor_rounded: int = 0
    plan: int | None = None
    page_floor_split: int = 0
    page_floor_single: int = 0
    real: dict[str, dict[str, int]] = field(default_factory=dict)
    model: dict[str, ModelResult] = field(default_factory=dict)


REAL_SETTINGS = {
    "defaults": "",
    "expandable": "expandable_segments:True",
    "policy:accelrt": "policy:accelrt",
}
"""The settings the real allocator replays every trace under (column name -> config)."""


def _peak(row: Row, column: str) -> int:
    """Peak reserved bytes of a real setting or a model."""
    if column in row.real:
        return int(row.real[column]["peak_reserved"])
    return row.model[column].peak_reserved


def _maps(row: Row, column: str) -> int:
    """Map calls (``num_device_alloc``) of a real setting or a model."""
    if column in row.real:
        return int(row.real[column]["maps"])
    return row.model[column].maps


SPEED_ROUNDS = 5
"""Replays of a CPU trace per setting, for its replay speed (the best counts: noise only
slows); a GPU trace is replayed once."""


def baselines(row: Row) -> None:
    """Replay the trace under each real setting; a CPU trace ``SPEED_ROUNDS`` times, the
    settings interleaved round by round so that each speed is measured beside its peers, the
    best speed kept (issue 23: ``policy:accelrt`` at 3 M events/s or more)."""
    from accelrt.replay import replay
    from accelrt.trace import load

    trace = load(row.trace.path)
    for _ in range(SPEED_ROUNDS if row.trace.group == "cpu" else 1):
        for name, config in REAL_SETTINGS.items():
            r = replay(trace, config=config)
            speed = int(r.events_per_second)
            if name in row.real:  # a later round: the same figures, only the speed differs
                row.real[name]["events_per_second"] = max(
                    row.real[name]["events_per_second"], speed
                )
                continue
            row.real[name] = {
                "peak_reserved": r.peak_reserved_bytes,
                "peak_requested": r.peak_requested_bytes,
                "maps": r.num_device_alloc,
                "retries": r.num_alloc_retries,
                "ooms": r.num_ooms,
                "events_per_second": speed,
            }
            row.peak_requested = r.peak_requested_bytes
            row.floor_rounded = r.floor_rounded_bytes
            row.plan = r.plan_peak_bytes


def print_replay_speeds(rows: list[Row]) -> None:
    """The replay speed of each CPU trace under each real setting (from ``baselines``), and
    ``policy:accelrt``'s against the defaults' measured beside it."""
    cpu = [row for row in rows if row.trace.group == "cpu"]
    if not cpu:
        return
    print(
        f"\nreplay speed, CPU traces (M events/s, best of {SPEED_ROUNDS}, settings"
        " interleaved; target: policy:accelrt >= 3 M on every trace)"
    )
    heads = " ".join(f"{c:>15s}" for c in REAL_SETTINGS)
    print(f"{'trace':28s} {heads}  policy/defaults")
    for row in cpu:
        best = {c: row.real[c]["events_per_second"] for c in REAL_SETTINGS}
        ratio = best["policy:accelrt"] / best["defaults"]
        met = "met" if best["policy:accelrt"] >= 3e6 else "missed"
        cells = " ".join(f"{best[c] / 1e6:15.2f}" for c in REAL_SETTINGS)
        print(f"{short(row.trace.name, 28):28s} {cells}  {ratio:15.2f}x {met}")


# --------------------------------------------------------------------------------------------
# Report
# --------------------------------------------------------------------------------------------


def gmean(xs: list[float]) -> float:
    return math.exp(sum(math.log(x) for x in xs) / len(xs)) if xs else float("nan")


def short(name: str, width: int = 40) -> str:
    return name if len(name) <= width else name[: width - 11] + "~" + name[-10:]


def report(rows: list[Row], policies: list[str]) -> dict[str, Any]:
    cols = [*REAL_SETTINGS, *policies]
    summary: dict[str, Any] = {}
    for group in ("cpu", "gpu"):
        sel = [r for r in rows if r.trace.group == group]
        if not sel:
            continue
        title = "from empty, device view" if group == "cpu" else "from empty, live-at-start first"
        print(f"\n## {group.upper()} set ({len(sel)} traces, {title})")
        print("peak reserved / peak requested ('!': above expandable_segments:True's peak)")
        head = f"{'trace':<40} {'st':>2} {'peak req':>9}"
        head += "".join(f" {c[:13]:>13}" for c in cols)
        head += f" | {'rounded':>7} {'plan':>6} {'pages':>6}"
        print(head)
        ratios: dict[str, list[float]] = {c: [] for c in cols}
        for r in sel:
            req = r.peak_requested
            line = f"{short(r.trace.name):<40} {r.trace.streams:>2} {req / MIB:>8.0f}M"
            exp_peak = r.real["expandable"]["peak_reserved"]
            for c in cols:
                peak = _peak(r, c)
                ratios[c].append(peak / req)
                mark = "!" if c not in BASELINES and peak > exp_peak else " "
                if c in r.real and r.real[c]["ooms"]:
                    mark = "*"
                line += f" {peak / req:>12.4f}{mark}"
            plan = f"{r.plan / req:>6.3f}" if r.plan else f"{'-':>6}"
            line += f" | {r.floor_rounded / req:>7.4f} {plan} {r.page_floor_split / req:>6.4f}"
            print(line)
        print(f"{'geo mean':<53}" + "".join(f" {gmean(ratios[c]):>13.4f}" for c in cols))
        print(f"{'worst':<53}" + "".join(f" {max(ratios[c]):>13.4f}" for c in cols))
        print(
            "lower bounds: 'rounded' = live peak with PyTorch's rounding, 'plan' = offline plan"
            " (accelrt._bounds), 'pages' = live peak in whole 2 MiB pages, small and large apart"
            " (the floor of any page-mapped policy); '*' = that setting ran out of memory"
        )
        print("\nmap calls (num_device_alloc; the models: one per contiguous run mapped)")
        head = f"{'trace':<40}" + "".join(f" {c[:13]:>13}" for c in cols)
        print(head)
        for r in sel:
            exp_maps = max(r.real["expandable"]["maps"], 1)
            line = f"{short(r.trace.name):<40}"
            for c in cols:
                maps = _maps(r, c)
                mark = "!" if c not in BASELINES and maps > 2 * exp_maps else " "
                line += f" {maps:>12d}{mark}"
            print(line)
        print("('!': more than twice expandable_segments:True's)")
        summary[group] = {}
        print(f"\n{group.upper()} summary (targets: geo mean <= 1.02, worst <= 1.10, never above")
        print("expandable's peak, map calls <= 2x expandable's on every trace)")
        for c in cols:
            worst_i = int(np.argmax(ratios[c]))
            entry: dict[str, Any] = {
                "geo_mean": gmean(ratios[c]),
                "worst": max(ratios[c]),
                "worst_trace": sel[worst_i].trace.name,
            }
            text = (
                f"  {c:<18} geo mean {entry['geo_mean']:.4f}  worst {entry['worst']:.4f}"
                f" ({short(sel[worst_i].trace.name, 30)})"
            )
            if c not in BASELINES:
                above = [
                    (_peak(x, c) / x.real["expandable"]["peak_reserved"], x)
                    for x in sel
                    if _peak(x, c) > x.real["expandable"]["peak_reserved"]
                ]
                maps = [(_maps(x, c) / max(x.real["expandable"]["maps"], 1), x) for x in sel]
                over = [m for m in maps if m[0] > 2]
                entry.update(
                    above_expandable=[(x.trace.name, q) for q, x in above],
                    maps_over_2x=[(x.trace.name, q) for q, x in over],
                    max_map_ratio=max(q for q, _ in maps),
                )
                text += f"; above expandable on {len(above)}"
                if above:
                    q, x = max(above, key=lambda e: e[0])
                    text += f" (most {q - 1:+.2%}, {short(x.trace.name, 24)})"
                text += f"; maps > 2x on {len(over)}"
                if over:
                    q, x = max(over, key=lambda e: e[0])
                    text += f" (most {q:.2f}x, {short(x.trace.name, 24)})"
                text += f"; map ratio geo mean {gmean([q for q, _ in maps]):.2f}x"
            if c in policies:
                slow = [x.model[c].slow / max(x.model[c].mallocs, 1) for x in sel]
                entry["slow_path_share"] = (min(slow), max(slow))
                text += f"; slow path {min(slow):.2%}-{max(slow):.2%} of mallocs"
            elif c in r.real:
                speed = [x.real[c]["events_per_second"] for x in sel]
                entry["events_per_second"] = (min(speed), max(speed))
                text += f"; replay {min(speed) / 1e6:.2f}-{max(speed) / 1e6:.2f} M events/s"
            print(text)
            summary[group][c] = entry
        fl = [r.page_floor_split / r.peak_requested for r in sel]
        rounded = gmean([r.floor_rounded / r.peak_requested for r in sel])
        planned = gmean([r.plan / r.peak_requested for r in sel if r.plan])
        print(
            f"  lower bounds: rounded live {rounded:.4f}, plan {planned:.4f},"
            f" pages {gmean(fl):.4f} geo mean; pages worst {max(fl):.4f}"
            f" ({short(sel[int(np.argmax(fl))].trace.name, 30)})"
        )
        for model, real in (("model:expandable", "expandable"), ("accelrt3", "policy:accelrt")):
            if model in policies:
                same = sum(
                    _peak(r, model) == _peak(r, real) and _maps(r, model) == _maps(r, real)
                    for r in sel
                )
                print(
                    f"  model check: {model}'s peak and map calls equal the real allocator's"
                    f" ({real}) on {same} of {len(sel)} traces"
                )
    return summary


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--traces-dir", type=Path, default=TRACES)
    parser.add_argument("--cache", type=Path, default=CACHE)
    parser.add_argument(
        "--policies",
        default=",".join(DEFAULT_POLICIES),
        help="comma-separated, of: " + ", ".join(POLICIES).replace("%", "%%"),
    )
    parser.add_argument("--only", default="", help="only traces whose name contains this")
    parser.add_argument("--json", type=Path, help="also write the figures here")
    parser.add_argument(
        "--check",
        type=int,
        default=0,
        metavar="N",
        help="assert the models' invariants every N events (slow; 0: never)",
    )
    args = parser.parse_args()
    paths = [
        (group, p)
        for group, sub in (("cpu", "cpu"), ("gpu", "gpu_snapshots"))
        for p in sorted((args.traces_dir / sub).glob("*.jsonl.gz"))
        if args.only in p.name
    ]
    if not paths:
        print(f"no traces under {args.traces_dir} (cpu/, gpu_snapshots/): nothing to measure")
        return 0
    policies = [p for p in args.policies.split(",") if p]
    unknown = [p for p in policies if p not in POLICIES]
    if unknown:
        parser.error(f"unknown policies {unknown}; known: {', '.join(POLICIES)}")
    rows = []
    for group, path in paths:
        t = load_arrays(path, group, args.cache)
        row = Row(t)
        baselines(row)
        row.page_floor_split, row.page_floor_single = page_floor(t)
        for p in policies:
            row.model[p] = run_model(t, POLICIES[p], args.check)
        rows.append(row)
        print(
            f"  {group} {short(t.name)}: {len(t.op)} events, "
            + ", ".join(f"{p} {row.model[p].seconds:.1f}s" for p in policies),
            file=sys.stderr,
        )
    summary = report(rows, policies)
    print_replay_speeds(rows)
    if args.json:
        data = {
            "summary": summary,
            "traces": [
                {
                    "trace": r.trace.name,
                    "set": r.trace.group,
                    "streams": r.trace.streams,
                    "peak_requested": r.peak_requested,
                    "floor_rounded": r.floor_rounded,
                    "plan": r.plan,
                    "page_floor": r.page_floor_split,
                    "real": r.real,
                    "model": {k: vars(v) for k, v in r.model.items()},
                }
                for r in rows
            ],
        }
        args.json.write_text(json.dumps(data, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
