"""OOM forensics and run comparison as text: for ``accelrt snapshot summary`` and ``diff``."""

from __future__ import annotations

import textwrap
from typing import TYPE_CHECKING

import numpy as np

from .._units import format_bytes
from ..memory.history._summary import fit_frame, format_live_groups
from ._categories import category_bytes
from ._model import Categories, View, live_groups

if TYPE_CHECKING:
    from ..replay import ReplayReport

__all__ = ["diff_text", "end_state_text", "forensics_text"]


def _event(view: View, state: int) -> str:
    return "the start" if state == 0 else f"event {state - 1}"


def forensics_text(view: View, *, width: int = 100, limit: int = 10) -> str:
    """The OOMs of a picture and what was live at the peak and at each OOM, as text.

    Parameters
    ----------
    view : View
        From :func:`view_of_trace` or :func:`view_of_snapshot`.
    width : int
        The widest line (tables cut long frames from the left).
    limit : int
        Groups per table.

    Returns
    -------
    str
        Plain text (no markup), ending in a newline.
    """
    out: list[str] = []
    if view.notes:
        note = "Note: the allocator state is accelrt's replay of the recording: "
        out += textwrap.wrap(note + "; ".join(view.notes), width)
        out.append("")
    if view.ooms:
        out.append(f"Out-of-memory events: {len(view.ooms)}")
        for n, oom in enumerate(view.ooms, start=1):
            free = "unknown" if oom["free"] is None else format_bytes(oom["free"])
            reserved = "unknown" if oom["reserved"] is None else format_bytes(oom["reserved"])
            text = (
                f"{n}. {oom['source']} at event {oom['event']}: requested "
                f"{format_bytes(oom['size'])} ({oom['size']} bytes); free {free}, reserved "
                f"{reserved}, live {format_bytes(oom['live'])}"
            )
            out += textwrap.wrap(text, width, initial_indent="  ", subsequent_indent="     ")
            if oom["stack"] >= 0:
                for line in view.stacks[oom["stack"]].lines(native_shown=1)[:8]:
                    out.append("       " + fit_frame(line, width - 7))
        out.append("")
    else:
        out.append("Out-of-memory events: none")
        out.append("")
    moments = [(f"the peak ({_event(view, view.peak_state)})", view.peak_state)]
    moments += [(f"OOM {n} (event {o['event']})", o["event"]) for n, o in enumerate(view.ooms, 1)]
    totals = view.totals()
    for label, state in moments[: 1 + min(len(view.ooms), 3)]:
        for by, what in (("frame", "stack frame"), ("op", "op")):
            if by == "op" and not view.ops:
                continue
            groups = live_groups(view, state, by, limit)
            rows = [(g.key, g.bytes, g.count) for g in groups]
            title = (
                f"Live at {label}: {format_bytes(int(totals[state]))} in "
                f"{sum(g.count for g in groups)} allocations, by {what}"
            )
            out.append(format_live_groups(title, rows, int(totals[state]), width=width))
        if view.categories is not None:
            out.append(_kind_table(view, view.categories, state, f"Live at {label}", width))
    if view.categories is not None and view.phases:
        out.append(_phase_table(view, view.categories, width))
    return "\n".join(out).rstrip("\n") + "\n"


def _kind_table(view: View, categories: Categories, state: int, label: str, width: int) -> str:
    """What was live at ``state`` by kind, largest first."""
    per = category_bytes(view, categories, state)
    rows = sorted(((k, b, c) for k, (b, c) in per.items() if c), key=lambda r: -r[1])
    live = sum(b for _, b, _ in rows)
    title = f"{label}: {format_bytes(live)}, by kind (inferred; docs/viewer.md)"
    return format_live_groups(title, rows, live, width=width)


_PHASE_ROWS = 24
"""Phases shown in the per-phase table at most (the rest are counted)."""


def _phase_table(view: View, categories: Categories, width: int) -> str:
    """At each phase's own peak (its state with the most live bytes): live bytes by kind."""
    totals = view.totals()
    rows = []
    for phase in view.phases:
        states = totals[phase.first + 1 : phase.end + 1]
        state = phase.first + 1 + int(np.argmax(states))
        rows.append((phase.name, state, category_bytes(view, categories, state)))
    shown = [name for name in categories.names if any(per[name][1] for _, _, per in rows)]
    name_width = max(8, min(24, max(len(p.name) for p in view.phases)))
    columns = max(1, (width - name_width - 24) // 11)
    shown = shown[:columns]
    out = ["Live at each phase's peak, by kind (inferred; docs/viewer.md)"]
    head = f"{'phase':<{name_width}} {'event':>9} {'live':>11}"
    out.append(head + "".join(f" {name[:10]:>10}" for name in shown))
    for name, state, per in rows[:_PHASE_ROWS]:
        live = format_bytes(int(totals[state]))
        line = f"{name[:name_width]:<{name_width}} {state - 1:>9} {live:>11}"
        out.append(line + "".join(f" {format_bytes(per[k][0]):>10}" for k in shown))
    if len(rows) > _PHASE_ROWS:
        out.append(f"... {len(rows) - _PHASE_ROWS} more phases")
    return "\n".join(out) + "\n"


def end_state_text(view: View, *, width: int = 100, limit: int = 10) -> str:
    """What a snapshot recorded without allocation history holds, as text.

    Parameters
    ----------
    view : View
        Of such a snapshot (:func:`end_state_view`; ``view.history`` False).
    width : int
        The widest line.
    limit : int
        Groups in the table of what was live.

    Returns
    -------
    str
        Plain text ending in a newline: that nothing over time was recorded; the segments,
        reserved bytes and the allocated, pending-free and free (cached) blocks of the end
        state, with the free bytes that ``empty_cache()`` cannot release (in segments that
        also hold allocated blocks); what was allocated at the end by stack frame.
    """
    segments = view.moments[0]["segments"] if view.moments else []
    count, held = [0, 0, 0, 0], [0, 0, 0, 0]
    largest_free = split_free = split_count = 0
    for _address, _size, _stream, _expandable, blocks in segments:
        in_use = any(code in (0, 1) for _, code, _ in blocks)
        for nbytes, code, _owner in blocks:
            count[code] += 1
            held[code] += nbytes
            if code == 2:
                largest_free = max(largest_free, nbytes)
                split_free += nbytes if in_use else 0
                split_count += in_use
    reserved = sum(s[1] for s in segments)
    out = textwrap.wrap(
        "No allocation history was recorded (torch.cuda.memory._record_memory_history() was "
        "not running), so there are no events, peaks or OOMs: the snapshot holds the "
        "allocator's state at the end.",
        width,
    )
    out += ["", f"End state: {len(segments)} segments, {format_bytes(reserved)} reserved"]
    rows = [
        ("allocated", 0, f" (requested {format_bytes(int(view.size.sum()))})"),
        ("pending free", 1, ""),
        ("free (cached)", 2, f" (largest block {format_bytes(largest_free)})"),
    ]
    if count[3]:
        rows.append(("unmapped", 3, ""))
    for label, code, extra in rows:
        out.append(f"  {label:<14}{count[code]:>8} blocks {format_bytes(held[code]):>12}{extra}")
    if split_free:
        out += textwrap.wrap(
            f"{format_bytes(split_free)} of the free bytes are in {split_count} blocks of "
            "segments that also hold allocated blocks: empty_cache() cannot release them.",
            width,
            initial_indent="  ",
            subsequent_indent="  ",
        )
    out.append("")
    live = int(view.size.sum())
    rows_live = [(g.key, g.bytes, g.count) for g in live_groups(view, 0, "frame", limit)]
    title = f"Allocated at the end: {format_bytes(live)} in {len(view.size)} blocks, by stack frame"
    out.append(format_live_groups(title, rows_live, live, width=width))
    return "\n".join(out).rstrip("\n") + "\n"


def diff_text(
    a: tuple[str, View, ReplayReport],
    b: tuple[str, View, ReplayReport],
    *,
    width: int = 100,
    limit: int = 15,
) -> str:
    """Compare two runs: their peaks, and live bytes per stack frame at each run's peak.

    Parameters
    ----------
    a, b : tuple of (str, View, ReplayReport)
        A label, the picture and the replay of each run (snapshots or traces, or one trace
        under two settings).
    width : int
        The widest line.
    limit : int
        Rows of the per-frame table (largest differences first).

    Returns
    -------
    str
        Plain text ending in a newline.
    """
    (la, va, ra), (lb, vb, rb) = a, b
    rows = [
        ("peak live", va.peak_bytes, vb.peak_bytes),
        ("peak reserved (replay)", ra.peak_reserved_bytes, rb.peak_reserved_bytes),
        ("OOMs", len(va.ooms), len(vb.ooms)),
        ("events", va.events, vb.events),
    ]
    out = [f"A: {la} ({ra.config})", f"B: {lb} ({rb.config})", ""]
    out.append(f"{'':<24}{'A':>16}{'B':>16}{'B - A':>17}")
    for name, x, y in rows:
        if name == "OOMs" or name == "events":
            out.append(f"{name:<24}{x:>16}{y:>16}{y - x:>+17}")
        else:
            sign = "-" if y < x else "+"
            out.append(
                f"{name:<24}{format_bytes(x):>16}{format_bytes(y):>16}"
                f"{sign + format_bytes(abs(y - x)):>17}"
            )
    ga = {g.key: g.bytes for g in live_groups(va, va.peak_state, "frame", 10**9)}
    gb = {g.key: g.bytes for g in live_groups(vb, vb.peak_state, "frame", 10**9)}
    keys = sorted(
        set(ga) | set(gb),
        key=lambda k: (-abs(gb.get(k, 0) - ga.get(k, 0)), -max(ga.get(k, 0), gb.get(k, 0)), k),
    )
    out += ["", "Live bytes at each run's peak, by stack frame (largest differences first):"]
    out.append(f"{'A':>12} {'B':>12} {'B - A':>13}  where")
    key_width = max(20, width - 42)
    for key in keys[:limit]:
        x, y = ga.get(key, 0), gb.get(key, 0)
        shown = fit_frame(key, key_width)
        sign = "-" if y < x else "+"
        out.append(
            f"{format_bytes(x):>12} {format_bytes(y):>12} {sign + format_bytes(abs(y - x)):>13}"
            f"  {shown}"
        )
    if len(keys) > limit:
        out.append(f"... {len(keys) - limit} more frames")
    if va.categories is not None and vb.categories is not None:
        ka = category_bytes(va, va.categories, va.peak_state)
        kb = category_bytes(vb, vb.categories, vb.peak_state)
        out += ["", "Live bytes at each run's peak, by kind (inferred; docs/viewer.md):"]
        out.append(f"{'A':>12} {'B':>12} {'B - A':>13}  kind")
        for name in dict.fromkeys([*va.categories.names, *vb.categories.names]):
            x, y = ka.get(name, (0, 0))[0], kb.get(name, (0, 0))[0]
            if x or y:
                sign = "-" if y < x else "+"
                out.append(
                    f"{format_bytes(x):>12} {format_bytes(y):>12} "
                    f"{sign + format_bytes(abs(y - x)):>13}  {name}"
                )
    return "\n".join(out) + "\n"
