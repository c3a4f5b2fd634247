"""What the replays of one trace mean, in a sentence: fragmentation's cost and the OOM verdict.

Both read the reports of one trace replayed under several settings against its lower bounds
(``ReplayReport.floor_live_bytes``, ``floor_rounded_bytes``, ``plan_peak_bytes``; accelrt._bounds):

- :func:`fragmentation_summary`: what fragmentation costs under the first setting, what the
  best setting tried recovers, what perfect foresight needs;
- :func:`oom_verdict`: where something ran out of memory, whether the live bytes alone exceed
  the device (no setting helps) or fragmentation did it (and which tried setting fits);
- :func:`interaction_warning`: settings known to work against each other.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING

from ._units import format_bytes
from .memory._config import AllocatorConfig
from .trace._recording import UNLIMITED_CAPACITY

if TYPE_CHECKING:
    from .replay import ReplayReport

__all__ = ["fragmentation_summary", "interaction_warning", "oom_verdict"]

EXPANDABLE_WITH_MAX_SPLIT = (
    "expandable_segments:True with max_split_size_mb can reserve more than either alone "
    "(examples/traces/transformer_train.jsonl.gz reserves 346 MiB under each of "
    "expandable_segments:True and max_split_size_mb:128, 506 MiB under both)"
)
"""The known interaction :func:`interaction_warning` names (measured with ``accelrt replay``)."""


def _bytes(n: int) -> str:
    """``"N bytes (X MiB)"``; ``"N bytes"`` up to 1 KiB."""
    shown = format_bytes(n)
    return shown if shown.endswith(" bytes") else f"{n} bytes ({shown})"


def fragmentation_summary(reports: Sequence[ReplayReport]) -> str | None:
    """One sentence on what fragmentation costs and how much of it the settings tried recover.

    Parameters
    ----------
    reports : sequence of ReplayReport
        One trace under several settings, the first the one in force (recorded or default).

    Returns
    -------
    str or None
        E.g. ``"fragmentation costs 919.70 MiB under defaults (peak reserved 5.12 GiB over
        the rounded live peak 4.23 GiB); the best setting tried, expandable_segments:True,
        recovers 506.00 MiB; perfect foresight needs 4.23 GiB (an offline plan)"``: the
        first setting's peak reserved over its rounded floor, its peak reserved less the
        lowest of those that ran without an OOM, the lowest offline plan. None for fewer than
        two reports, reports without bounds, or a first setting that ran out of memory
        (:func:`oom_verdict` speaks then).
    """
    if len(reports) < 2 or reports[0].num_ooms:
        return None
    first = reports[0]
    best = min((r for r in reports if not r.num_ooms), key=lambda r: r.peak_reserved_bytes)
    plans = [r.plan_peak_bytes for r in reports if r.plan_peak_bytes is not None]
    rounded = first.floor_rounded_bytes
    if rounded is None or not plans:
        return None
    if best is first:
        tried = "no other setting tried reserves less"
    else:
        recovered = first.peak_reserved_bytes - best.peak_reserved_bytes
        tried = f"the best setting tried, {best.config}, recovers {format_bytes(recovered)}"
        if AllocatorConfig.parse(best.config).accelrt_only:
            tried += " (accelrt only: PyTorch's allocator has no such policy)"
    return (
        f"fragmentation costs {format_bytes(first.peak_reserved_bytes - rounded)} under "
        f"{first.config} (peak reserved {format_bytes(first.peak_reserved_bytes)} over the "
        f"rounded live peak {format_bytes(rounded)}); {tried}; perfect foresight needs "
        f"{format_bytes(min(plans))} (an offline plan)"
    )


def oom_verdict(
    reports: Sequence[ReplayReport], configs: Sequence[AllocatorConfig] | None = None
) -> str | None:
    """Say in one line why memory ran out, and what would help.

    Parameters
    ----------
    reports : sequence of ReplayReport
        One trace under each setting tried, on one device (its ``capacity_bytes``); a
        recording's own OOMs count too (``recorded_num_ooms``).
    configs : sequence of AllocatorConfig, optional
        The settings the reports ran under, in order (default: read from each report's
        ``config``), for :func:`interaction_warning`.

    Returns
    -------
    str or None
        ``"verdict: ..."``, one line: *live memory* when the live bytes at the peak (or, for
        every setting tried, after PyTorch's rounding, or for an offline plan) exceed the
        capacity, with the bytes to cut; else *fragmentation*, naming the tried setting that
        fits with the most to spare, or saying that a plan with perfect foresight fits where
        none tried does. Known interactions between the settings tried are appended. None
        when nothing ran out of memory, or the reports have no bounds.
    """
    ran_out = [r for r in reports if r.num_ooms]
    floor = reports[0].floor_live_bytes if reports else None
    recorded_ooms = any(r.recorded_num_ooms for r in reports)
    if not (ran_out or recorded_ooms) or floor is None:
        return None
    capacity = reports[0].capacity_bytes
    rounded = min(r.floor_rounded_bytes or floor for r in reports)
    plans = [r.plan_peak_bytes for r in reports if r.plan_peak_bytes is not None]
    fitting = [r for r in reports if not r.num_ooms]
    if capacity >= UNLIMITED_CAPACITY:  # a recording that shows no capacity
        text = (
            "the recording ran out of memory but shows no device capacity; give one "
            "(--capacity) to tell live memory from fragmentation"
        )
    elif floor > capacity:
        text = (
            f"live memory: {_bytes(floor)} are live at the peak, more than the "
            f"{_bytes(capacity)} device holds; no allocator setting helps: reduce memory by "
            f"at least {_bytes(floor - capacity)}"
        )
    elif fitting:
        best = min(fitting, key=lambda r: r.peak_reserved_bytes)
        failed = ", ".join(r.config for r in ran_out) if ran_out else "the recorded run"
        text = (
            f"fragmentation: live bytes peak at {_bytes(floor)}, within the "
            f"{_bytes(capacity)} device, yet {failed} ran out of memory; {best.config} fits "
            f"with {_bytes(capacity - best.peak_reserved_bytes)} to spare"
        )
    elif rounded > capacity:
        text = (
            f"live memory: {_bytes(floor)} are live at the peak, {_bytes(rounded)} after "
            f"PyTorch's rounding under every setting tried, more than the {_bytes(capacity)} "
            f"device holds; reduce memory by at least {_bytes(rounded - capacity)}"
        )
    elif plans and min(plans) <= capacity:
        text = (
            f"fragmentation: live bytes peak at {_bytes(floor)} and a plan knowing every "
            f"lifetime needs {_bytes(min(plans))}, within the {_bytes(capacity)} device, but "
            "no setting tried fits: the layout runs out, not the live bytes; try other "
            "settings or reduce memory"
        )
    else:
        needed = min(plans, default=rounded)
        text = (
            f"live memory: {_bytes(floor)} are live at the peak, but even a plan knowing "
            f"every lifetime needs {_bytes(needed)}, more than the {_bytes(capacity)} device "
            f"holds; no setting tried fits: reduce memory by about {_bytes(needed - capacity)}"
        )
    warning = interaction_warning([r.config for r in reports] if configs is None else configs)
    return f"verdict: {text}" + (f"; warning: {warning}" if warning else "")


def interaction_warning(configs: Iterable[AllocatorConfig | str]) -> str | None:
    """Name the settings tried that combine options known to work against each other.

    Parameters
    ----------
    configs : iterable of AllocatorConfig or str
        Settings, or their text as ``ReplayReport.config`` gives it
        (``AllocatorConfig.describe()``).

    Returns
    -------
    str or None
        E.g. ``"max_split_size_mb:128,expandable_segments:True: expandable_segments:True
        with max_split_size_mb can reserve more than either alone (...)"``; None if no
        setting tried combines them.
    """
    combined = [
        c if isinstance(c, str) else c.describe() for c in configs if _expandable_with_max_split(c)
    ]
    if not combined:
        return None
    return f"{'; '.join(combined)}: {EXPANDABLE_WITH_MAX_SPLIT}"


def _expandable_with_max_split(config: AllocatorConfig | str) -> bool:
    """Whether a setting (or its ``describe()`` text, read by the one parser) combines the two."""
    parsed = AllocatorConfig.coerce(config)
    return parsed.expandable_segments and parsed.max_split_size is not None
