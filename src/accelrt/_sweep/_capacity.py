"""``find_capacity``: the smallest capacity, to :data:`GRANULARITY`, a setting replays a
trace in without an OOM, found by bisection."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..replay import replay
from ..trace._recording import UNLIMITED_CAPACITY

if TYPE_CHECKING:
    from ..memory._config import AllocatorConfig
    from ..trace import Trace
    from ._plan import ProgressCallback


GRANULARITY = 2 * 1024 * 1024
"""The capacity search's step in bytes (2 MiB): the size large segments are rounded to
(docs/allocator.md section 2), so no capacity between two steps behaves differently."""


LARGEST_CAPACITY = 1 << 62
"""The largest simulated capacity ``--find-capacity`` tries (4 EiB) before it answers "never"."""


def _min_capacity(
    trace: Trace, config: AllocatorConfig | None, check: ProgressCallback, start: str
) -> int | None:
    """The smallest multiple of GRANULARITY at which ``trace`` replays without an OOM.

    Bisection between a capacity known to fail (a step below the trace's live peak, which no
    allocator can hold in less) and one that fits (the peak reserved without a limit).
    """
    step = GRANULARITY

    def fits(capacity: int) -> bool:
        try:
            report = replay(
                trace, device="sim", capacity=capacity, config=config, progress=check, start=start
            )
        except ValueError:  # the recording's start state alone needs more
            return False
        return report.num_ooms == 0

    ceiling = UNLIMITED_CAPACITY  # 1 PiB, else up to LARGEST_CAPACITY for huge traces
    while True:
        free = replay(
            trace, device="sim", capacity=ceiling, config=config, progress=check, start=start
        )
        if not free.num_ooms:
            break
        if ceiling >= LARGEST_CAPACITY:
            return None  # a request larger than any device
        ceiling = min(ceiling * 16, LARGEST_CAPACITY)
    if free.peak_reserved_bytes == 0:
        return 0
    hi = min(-(-free.peak_reserved_bytes // step) * step, ceiling)
    while hi < ceiling and not fits(hi):
        hi = min(hi * 2, ceiling)  # the ceiling fits: it was just replayed
    lo = max(0, -(-free.peak_requested_bytes // step) * step - step)
    while hi - lo > step:
        mid = lo + (hi - lo) // (2 * step) * step
        if fits(mid):
            hi = mid
        else:
            lo = mid
    return hi
