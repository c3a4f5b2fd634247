"""Memory pictures: active memory over time and the segment map, as one HTML file or a PNG.

The picture of a trace has two parts:

- **active memory over time**: every live allocation stacked in allocation order, x = event
  index (allocs and frees), y = bytes. The ``top`` largest allocations are drawn one by one
  (hover one for its size, address, stream and stack); the rest are one band on top;
- **the segment map** at a chosen moment: each segment a bar, its blocks coloured by state
  (allocated, pending free, free), with a slider over the captured moments.

The HTML page is self-contained (inline script and SVG, no network). Data comes from a replay
that already ran (``view_of_trace`` draws its report, captured at ``picture_moments``) or from
a snapshot (``view_of_snapshot``, which replays its history once when it has one).
"""

from __future__ import annotations

import html
import json
import os
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ._units import format_bytes
from .memory._history import SegmentInfo
from .trace._format import Trace
from .trace._snapshot import devices_with_history, trace_from_snapshot
from .trace._snapshot_schema import read_snapshot

if TYPE_CHECKING:
    from .replay import ReplayReport

__all__ = [
    "View",
    "picture_moments",
    "render_html",
    "render_png",
    "segment_text",
    "view_of_snapshot",
    "view_of_trace",
]

DEFAULT_TOP = 200
DEFAULT_MOMENTS = 12
_STATE_CODES = {"active_allocated": 0, "active_pending_free": 1, "inactive": 2}


@dataclass
class View:
    """The data of one picture (JSON-serialisable; see the module notes).

    Attributes
    ----------
    title : str
    events : int
        Number of alloc/free events (the x axis).
    total : list of (int, int)
        ``(event, live bytes)`` after each event where the total changed.
    allocations : list of dict
        The largest allocations: ``size``, ``addr``, ``stream``, ``start``, ``end`` (event
        indices; ``end`` = ``events`` if never freed), ``frames`` (strings) and ``points``,
        the lower edge as ``[event, offset]`` pairs.
    moments : list of dict
        ``{"event": i, "segments": [[address, total_size, [[size, state], ...]], ...]}``;
        states 0 allocated, 1 pending free, 2 free.
    """

    title: str
    events: int
    total: list[tuple[int, int]]
    allocations: list[dict[str, Any]]
    moments: list[dict[str, Any]] = field(default_factory=list)

    @property
    def peak_bytes(self) -> int:
        """The peak of live bytes."""
        return max((b for _, b in self.total), default=0)


def _frame_text(frames: Any) -> list[str]:
    """The first 12 frames as ``name file:line``; anything that is not a frame is skipped."""
    out: list[str] = []
    for f in frames if isinstance(frames, list) else []:
        if not isinstance(f, dict):
            continue
        name, filename, line = (f.get(k) for k in ("name", "filename", "line"))
        name = name if isinstance(name, str) else "?"
        filename = filename if isinstance(filename, str) else "?"
        line = line if isinstance(line, int) and not isinstance(line, bool) else 0
        if filename in ("??", "") and "::" in name:
            continue  # C++ frames of PyTorch's allocator: noise here
        out.append(f"{name[:200]} {filename[:300]}:{line}")
        if len(out) == 12:
            break
    return out


def _timeline(entries: list[dict[str, Any]], top: int) -> tuple[int, list[Any], list[Any]]:
    """Stack the allocations of ``entries`` (alloc / free_requested dicts) over time."""
    records: list[dict[str, Any]] = []
    live: dict[int, dict[str, Any]] = {}
    t = 0
    for e in entries:
        action = e.get("action")
        if action in ("alloc", "live"):  # "live": live when recording began
            rec = {
                "addr": e["addr"],
                "size": e["size"],
                "stream": e.get("stream", 0),
                "start": t,
                "end": None,
                "frames": _frame_text(e.get("frames")),
            }
            live[e["addr"]] = rec
            records.append(rec)
            t += action == "alloc"
        elif action in ("free_requested", "free"):
            found = live.pop(e["addr"], None)
            if found is not None:
                rec = found
            else:  # live before recording began: alive from the start
                rec = {"addr": e["addr"], "size": e["size"], "stream": e.get("stream", 0)}
                rec.update(start=0, end=None, frames=[])
                records.insert(0, rec)
            rec["end"] = t
            t += 1
    events = t
    for rec in records:
        if rec["end"] is None:
            rec["end"] = events
    chosen = sorted(records, key=lambda r: -r["size"])[:top]
    chosen_ids = {id(r) for r in chosen}
    # walk time: total bytes and the lower edge of each chosen allocation
    changes: list[tuple[int, int, dict[str, Any]]] = []  # (time, +1 alloc / -1 free, record)
    for rec in records:
        changes.append((rec["start"], 1, rec))
        changes.append((rec["end"], -1, rec))
    # at one moment frees come first, except the free of a block that is born and dies then
    # (live before recording, freed by the first event): its alloc must precede its free
    changes.sort(key=lambda c: (c[0], c[1] if c[2]["start"] < c[2]["end"] else -c[1]))
    total: list[tuple[int, int]] = [(0, 0)]
    stack: list[dict[str, Any]] = []  # chosen allocations live now, in stacking order
    live_bytes = 0
    for when, kind, rec in changes:
        live_bytes += kind * rec["size"]
        if total[-1][0] == when:
            total[-1] = (when, live_bytes)
        else:
            total.append((when, live_bytes))
        if id(rec) not in chosen_ids:
            continue
        if kind == 1:
            offset = sum(r["size"] for r in stack)
            rec["points"] = [[when, offset]]
            stack.append(rec)
        else:
            position = stack.index(rec)
            stack.pop(position)
            for above in stack[position:]:
                old = above["points"][-1][1]
                above["points"].append([when, old])
                above["points"].append([when, old - rec["size"]])
    allocations = []
    for rec in chosen:
        rec["points"].append([rec["end"], rec["points"][-1][1]])
        allocations.append({k: rec[k] for k in ("addr", "size", "stream", "start", "end")})
        allocations[-1].update(frames=rec["frames"], points=rec["points"])
    return events, total, allocations


def _moment(event: int, segments: list[SegmentInfo] | list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "event": event,
        "segments": [
            [
                s["address"],
                s["total_size"],
                [[b["size"], _STATE_CODES.get(b["state"], 2)] for b in s["blocks"]],
            ]
            for s in segments
        ],
    }


def picture_moments(trace: Trace, moments: int = DEFAULT_MOMENTS) -> list[int]:
    """Return the event indices whose segment maps a picture of ``trace`` shows.

    Pass them to ``accelrt.replay.replay(..., capture_at=...)``; the report then has what
    :func:`view_of_trace` draws. About ``moments`` indices, evenly spread, the last event
    included (``[-1]``, before the first event, for an empty trace).
    """
    n_events = len(trace.events)
    if n_events == 0:
        return [-1]
    step = max(1, n_events // moments)
    return sorted({*range(step - 1, n_events, step), n_events - 1})


def view_of_trace(
    trace: Trace,
    report: ReplayReport,
    *,
    title: str | None = None,
    top: int = DEFAULT_TOP,
    entries: list[dict[str, Any]] | None = None,
) -> View:
    """Build the picture of a replay that has already run.

    Parameters
    ----------
    trace : Trace
        The trace that was replayed (a PyTorch snapshot's: from its recorded start).
    report : ReplayReport
        Its replay, run with ``capture_at=picture_moments(trace)`` on whichever device, with
        whichever capacity and settings the user chose: the segment maps come from it.
    title : str, optional
        Default: the trace's name.
    top : int
        How many of the largest allocations to draw one by one.
    entries : list of dict, optional
        The trace's alloc/free entries with ``frames`` (a snapshot's ``device_traces[i]``),
        for stacks in the hover details; default: from ``trace.events``, without stacks.

    Returns
    -------
    View

    Raises
    ------
    ValueError
        If the report captured no segment map.
    """
    if not report.segment_maps:
        raise ValueError(
            "the replay captured no segment map: run it with capture_at=picture_moments(trace)"
        )
    if entries is None:
        entries = [
            {"action": a, "addr": addr, "size": size, "stream": stream}
            for a, addr, size, stream in trace.events
            if a != "empty_cache"
        ]
    if trace.recording is not None:  # blocks live when recording began, from the start
        entries = [
            {"action": "live", "addr": b.address, "size": b.requested_size, "stream": s.stream}
            for s in trace.recording.start_segments
            for b in s.blocks
            if b.requested_size > 0
        ] + entries
    events, total, allocations = _timeline(entries, top)
    # x is counted in alloc/free events: map trace event indices onto it
    x_of, x = {}, 0
    for i, event in enumerate(trace.events):
        if event.action != "empty_cache":
            x += 1
        x_of[i] = x
    view_moments = [
        _moment(x_of.get(i, 0), maps) for i, maps in sorted(report.segment_maps.items())
    ]
    return View(title or trace.name, events, total, allocations, view_moments)


def view_of_snapshot(
    path: str | os.PathLike[str], *, device_index: int | None = None, top: int = DEFAULT_TOP
) -> View:
    """Build the picture of a snapshot pickle (PyTorch's or accelrt's).

    With allocation history, the history is replayed exactly from its rewound start (so the
    segment map can be shown at any moment); without, only the end state's segment map and
    nothing over time.

    Raises
    ------
    TraceFormatError
        For a pickle that is not a plain-data snapshot (nothing in it runs).
    """
    snapshot = read_snapshot(path)
    name = os.path.basename(os.fspath(path)).rsplit(".", 1)[0]
    traces = snapshot.get("device_traces") or []
    has_history = devices_with_history(snapshot)
    if has_history and (device_index is None or device_index in has_history):
        from .replay import replay

        trace = trace_from_snapshot(snapshot, device=device_index, path=os.fspath(path))
        device = trace.recording.device if trace.recording is not None else 0
        report = replay(trace, capture_at=picture_moments(trace))
        return view_of_trace(trace, report, title=name, top=top, entries=traces[device])
    device = device_index or 0
    segments = [s for s in snapshot["segments"] if s.get("device", 0) == device]
    return View(name, 0, [(0, 0)], [], [_moment(0, segments)])


_PAGE = """<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>%(title)s</title>
<style>
body { font: 13px system-ui, sans-serif; margin: 16px; color: #222; }
h1 { font-size: 18px; } h2 { font-size: 15px; margin-top: 24px; }
svg { background: #fafafa; border: 1px solid #ddd; }
#tip { position: fixed; pointer-events: none; background: #fff; border: 1px solid #999;
       padding: 6px; font: 12px monospace; white-space: pre; display: none; max-width: 720px; }
.legend span { display: inline-block; width: 12px; height: 12px; margin: 0 4px 0 12px; }
</style></head><body>
<h1>%(title)s</h1>
<p id="summary"></p>
<h2>Active memory over time</h2>
<svg id="timeline" width="1100" height="420"></svg>
<h2>Segment map at event <span id="moment-label"></span></h2>
<input id="moment" type="range" min="0" value="0" style="width: 1100px">
<div class="legend"><span style="background:#d62728"></span>allocated
<span style="background:#ff7f0e"></span>pending free<span style="background:#c7c7c7"></span>free
</div>
<svg id="segments" width="1100" height="40"></svg>
<div id="tip"></div>
<script>
"use strict";
const DATA = %(data)s;
const NS = "http://www.w3.org/2000/svg";
const tip = document.getElementById("tip");
function el(name, attrs, parent) {
  const e = document.createElementNS(NS, name);
  for (const k in attrs) e.setAttribute(k, attrs[k]);
  parent.appendChild(e);
  return e;
}
function fmt(n) {
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let i = 0, v = n;
  while (v >= 1024 && i < units.length - 1) { v /= 1024; i++; }
  return i === 0 ? n + " B" : v.toFixed(2) + " " + units[i] + " (" + n + " bytes)";
}
function hover(e, text) {
  tip.textContent = text; tip.style.display = "block";
  tip.style.left = (e.clientX + 12) + "px"; tip.style.top = (e.clientY + 12) + "px";
}
function unhover() { tip.style.display = "none"; }
const W = 1100, H = 420, PAD = 60;
const svg = document.getElementById("timeline");
const peak = Math.max(1, ...DATA.total.map(p => p[1]));
const n = Math.max(1, DATA.events);
const X = t => PAD + (W - PAD - 10) * t / n;
const Y = b => H - 30 - (H - 50) * b / peak;
el("line", {x1: PAD, y1: Y(0), x2: W - 10, y2: Y(0), stroke: "#888"}, svg);
for (let k = 0; k <= 4; k++) {
  const b = peak * k / 4;
  const label = el("text", {x: 4, y: Y(b) + 4, "font-size": 10}, svg);
  label.textContent = fmt(Math.round(b)).split(" (")[0];
}
let d = "M" + X(0) + "," + Y(0);
let last = 0;
for (const [t, b] of DATA.total) {
  d += "L" + X(t) + "," + Y(last) + "L" + X(t) + "," + Y(b);
  last = b;
}
d += "L" + X(n) + "," + Y(last) + "L" + X(n) + "," + Y(0) + "Z";
const others = el("path", {d: d, fill: "#c7c7c7", class: "others"}, svg);
others.addEventListener("mousemove", e => hover(e, "smaller allocations (not drawn one by one)"));
others.addEventListener("mouseleave", unhover);
let drawn = 0;
DATA.allocations.forEach((a, i) => {
  const lower = a.points.map(p => X(p[0]) + "," + Y(p[1]));
  const upper = a.points.slice().reverse().map(p => X(p[0]) + "," + Y(p[1] + a.size));
  const hue = (i * 137.508) %% 360;
  const poly = el("polygon", {points: lower.concat(upper).join(" "), class: "alloc",
    fill: "hsl(" + hue + ",65%%,55%%)", stroke: "none"}, svg);
  const text = fmt(a.size) + "\\naddress 0x" + a.addr.toString(16) + "\\nstream " + a.stream +
    "\\nevents " + a.start + " to " + a.end +
    (a.frames.length ? "\\n\\n" + a.frames.join("\\n") : "");
  poly.addEventListener("mousemove", e => hover(e, text));
  poly.addEventListener("mouseleave", unhover);
  drawn++;
});
const marker = el("line",
  {x1: 0, y1: 10, x2: 0, y2: H - 30, stroke: "#000", "stroke-dasharray": "4 3"}, svg);
document.getElementById("summary").textContent = DATA.events + " alloc/free events; peak " +
  fmt(peak) + "; the " + drawn + " largest allocations are drawn one by one (hover for details), " +
  "the rest as one grey band.";
const segSvg = document.getElementById("segments");
const slider = document.getElementById("moment");
slider.max = Math.max(0, DATA.moments.length - 1);
const COLORS = ["#d62728", "#ff7f0e", "#c7c7c7"];
const STATES = ["allocated", "pending free", "free"];
function showMoment(k) {
  while (segSvg.firstChild) segSvg.removeChild(segSvg.firstChild);
  const m = DATA.moments[k];
  if (!m) return;
  document.getElementById("moment-label").textContent =
    m.event + " (" + m.segments.length + " segments)";
  marker.setAttribute("x1", X(m.event)); marker.setAttribute("x2", X(m.event));
  const biggest = Math.max(1, ...m.segments.map(s => s[1]));
  const rowH = 14;
  segSvg.setAttribute("height", Math.max(40, m.segments.length * rowH + 10));
  m.segments.forEach((s, r) => {
    let x = 0;
    s[2].forEach(([size, state]) => {
      const w = (W - 20) * size / biggest;
      const rect = el("rect", {x: 10 + (W - 20) * x / biggest, y: 5 + r * rowH,
        width: Math.max(w, 0.5), height: rowH - 3, fill: COLORS[state], class: "block"}, segSvg);
      const text = "segment 0x" + s[0].toString(16) + " (" + fmt(s[1]) + ")\\nblock " +
        STATES[state] + ": " + fmt(size);
      rect.addEventListener("mousemove", e => hover(e, text));
      rect.addEventListener("mouseleave", unhover);
      x += size;
    });
  });
}
slider.addEventListener("input", () => showMoment(+slider.value));
slider.value = slider.max;
showMoment(+slider.max);
document.body.dataset.drawn = String(drawn);
document.body.dataset.ready = "1";
</script></body></html>
"""


def render_html(view: View) -> str:
    """Return the picture as one self-contained HTML page (no network access needed)."""
    data = json.dumps(
        {
            "events": view.events,
            "total": view.total,
            "allocations": view.allocations,
            "moments": view.moments,
        },
        separators=(",", ":"),
    ).replace("</", "<\\/")
    return _PAGE % {"title": html.escape(view.title), "data": data}


def render_png(view: View, path: str | os.PathLike[str]) -> None:
    """Draw active memory over time (the largest allocations stacked) to a PNG with matplotlib.

    Raises
    ------
    ImportError
        If matplotlib is not installed (``pip install 'accelrt[view]'``).
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(12, 5), dpi=100)
    xs = [t for t, _ in view.total] + [view.events]
    ys = [b for _, b in view.total] + [view.total[-1][1] if view.total else 0]
    ax.fill_between(xs, ys, step="post", color="#c7c7c7", label="smaller allocations")
    cmap = plt.get_cmap("tab20")
    for i, a in enumerate(view.allocations):
        px = [p[0] for p in a["points"]]
        lower = [p[1] for p in a["points"]]
        upper = [p[1] + a["size"] for p in a["points"]]
        ax.fill_between(px, lower, upper, color=cmap(i % 20), linewidth=0)
    ax.set_xlim(0, max(view.events, 1))
    ax.set_ylim(0, max(view.peak_bytes, 1) * 1.05)
    ax.set_xlabel("alloc/free event")
    ax.set_ylabel("bytes")
    ticks = ax.get_yticks()
    ax.set_yticks(ticks, [format_bytes(int(t)) for t in ticks])
    ax.set_title(f"{view.title}: active memory, peak {format_bytes(view.peak_bytes)}")
    ax.legend(loc="upper left")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def segment_text(segments: list[SegmentInfo] | list[dict[str, Any]], width: int = 48) -> str:
    """A text map of segments (like ``torch.cuda._memory_viz.segsum``).

    One line per segment: address, size, allocated and free bytes, and a bar of ``width``
    cells where a letter is a cell filled by one allocated block (a new letter per block),
    ``*`` a cell shared by several blocks that are all allocated, a digit a partly allocated
    cell (tens of percent), ``~`` pending free, and a space a free cell. Totals at the end.
    """
    lines = []
    reserved = allocated = 0
    for seg in sorted(segments, key=lambda s: s["address"]):
        size = seg["total_size"]
        cells_used = [0.0] * width
        owners: list[set[int]] = [set() for _ in range(width)]
        pending = [False] * width
        offset = 0
        for n, block in enumerate(seg["blocks"]):
            start, end = offset, offset + block["size"]
            offset = end
            if block["state"] == "inactive":
                continue
            first, last = start * width // size, min(width - 1, (end - 1) * width // size)
            for c in range(first, last + 1):
                lo, hi = max(start, c * size / width), min(end, (c + 1) * size / width)
                cells_used[c] += max(0.0, hi - lo) / (size / width)
                owners[c].add(n)
                pending[c] |= block["state"] == "active_pending_free"
        bar = ""
        letters: dict[int, str] = {}
        for c in range(width):
            if pending[c]:
                bar += "~"
            elif cells_used[c] >= 0.999 and len(owners[c]) == 1:
                owner = next(iter(owners[c]))
                letters.setdefault(owner, chr(ord("a") + len(letters) % 26))
                bar += letters[owner]
            elif cells_used[c] >= 0.999:
                bar += "*"
            elif cells_used[c] > 0:
                bar += str(min(9, int(cells_used[c] * 10)))
            else:
                bar += " "
        used = sum(b["size"] for b in seg["blocks"] if b["state"] != "inactive")
        reserved += size
        allocated += used
        lines.append(
            f"{seg['address']:#x} {format_bytes(size):>11} stream {seg.get('stream', 0)}: "
            f"{format_bytes(used):>11} allocated, {format_bytes(size - used):>11} free [{bar}]"
        )
    lines.append(
        f"segments: {len(lines)}, reserved {format_bytes(reserved)}, allocated "
        f"{format_bytes(allocated)}, free {format_bytes(reserved - allocated)}"
    )
    return "\n".join(lines)
