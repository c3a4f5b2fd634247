"""Render a :class:`View`: one self-contained HTML page, a PNG, or a text segment map.

The page embeds its data as a small JSON head and one zlib-compressed blob of byte-shuffled
columns (about 10 bytes per event after compression), which the browser inflates with
``DecompressionStream``; its script and style are this package's ``page.js`` and ``page.css``,
inlined. Nothing is fetched from the network.
"""

from __future__ import annotations

import base64
import html
import json
import os
import zlib
from collections.abc import Iterator, Sequence
from importlib import resources

import numpy as np
import numpy.typing as npt

from .._text import printable
from .._units import format_bytes
from ..memory.history._history import SegmentInfo
from ..trace._snapshot_schema import FileSegment
from ._model import Moment, SegmentRow, View
from ._stacks import CleanStack

__all__ = ["render_html", "render_pages", "render_png", "segment_text"]

_PAGE = """<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>%(title)s: memory</title>
<meta name="viewport" content="width=device-width">
<style>%(css)s</style></head><body>
<h1>%(title)s</h1>
<p id="summary" class="muted"></p>
<div id="banner" class="banner" hidden></div>
<div id="over-time"><h2>Active memory over time</h2>
<div class="controls"><button id="zoom-in" title="zoom in">+</button>
<button id="zoom-out" title="zoom out">&minus;</button><button id="reset">whole run</button>
<label>colour by <select id="color-by"><option value="stack">stack</option>
<option value="op">op</option><option value="kind">kind</option></select></label>
<span id="range" class="muted"></span></div>
<canvas id="timeline"></canvas>
<canvas id="minimap" title="the whole run: drag to zoom to a range"></canvas>
<p class="muted">Wheel: zoom; drag: pan; double-click: whole run; click: pin the details below
and show the allocator state at that event.</p>
<div id="details"></div>
<h2>Out-of-memory events</h2>
<p id="no-ooms" class="muted" hidden>No allocation ran out of memory, in the recording or in
the replay.</p>
<table id="ooms"><tr><th>#</th><th>source</th><th class="num">event</th>
<th class="num">requested</th><th class="num">free</th><th class="num">reserved</th>
<th class="num">live</th><th>stack of the request</th></tr></table></div>
<h2>What was live <select id="live-at"></select></h2>
<div class="split"><table id="live-frame"></table><table id="live-op"></table></div>
<table id="live-kind"></table>
<h2>Allocator state at <span id="state-label"></span></h2>
<div id="seg-banner" class="banner" hidden></div>
<div class="split"><div id="events" tabindex="0" title="arrow keys, Page Up/Down, Home, End">
<div id="events-spacer"></div></div>
<div class="segwrap"><div id="seg-note" class="muted"></div>
<div class="legend"><span class="sw" style="background:#d62728"></span>allocated (coloured
by stack)<span class="sw" style="background:#ff7f0e"></span>pending free
<span class="sw" style="background:#ddd"></span>free<span class="sw"
style="background:#f7f7f7;border:1px solid #ccc"></span>unmapped</div>
<canvas id="segments"></canvas></div></div>
<pre id="selftest" hidden></pre>
<div id="tip"></div>
<script id="head" type="application/json">%(head)s</script>
<script id="blob" type="text/plain">%(blob)s</script>
<script>%(js)s</script>
</body></html>
"""


def _asset(name: str) -> str:
    return resources.files(__package__).joinpath(name).read_text(encoding="utf-8")


def _shuffled(values: npt.NDArray[np.generic], dtype: str) -> bytes:
    """The values as little-endian ``dtype``, byte planes one after another (compresses well)."""
    array = np.ascontiguousarray(values, dtype=np.dtype(dtype).newbyteorder("<"))
    width = array.dtype.itemsize
    planes: bytes = array.view(np.uint8).reshape(-1, width).T.tobytes()
    return planes


def _moment_rows(moments: list[Moment]) -> tuple[list[SegmentRow], list[dict[str, object]]]:
    """The segment rows of ``moments`` once each, and the moments as indices into them.

    A row shared by several moments (:func:`view_of_trace` shares the rows of segments that
    did not change since the moment before) is written once: most segments of a long run sit
    unchanged through most moments.
    """
    index: dict[int, int] = {}
    rows: list[SegmentRow] = []
    out = []
    for moment in moments:
        at = []
        for row in moment["segments"]:
            n = index.get(id(row))
            if n is None:
                n = index[id(row)] = len(rows)
                rows.append(row)
            at.append(n)
        out.append({**moment, "segments": at})
    return rows, out


_STACKS_AT_ONCE = 4096
"""Stacks turned into JSON text at a time: the page's data is compressed as it is made."""


def _meta_json(stacks: Sequence[CleanStack], rest: dict[str, object]) -> Iterator[str]:
    """The text of ``json.dumps({"stacks": [[python, native, hidden], ...], **rest})`` (no
    spaces), in pieces: a few thousand stacks at a time, so that the text of every stack is
    never held at once."""
    yield '{"stacks":['
    for first in range(0, len(stacks), _STACKS_AT_ONCE):
        some = stacks[first : first + _STACKS_AT_ONCE]
        rows = [[list(s.python), list(s.native), s.hidden] for s in some]
        text = json.dumps(rows, separators=(",", ":"))
        yield ("," if first else "") + text[1:-1]
    yield "]," + json.dumps(rest, separators=(",", ":"))[1:]


def _payload(view: View) -> tuple[dict[str, object], str]:
    """The page's JSON head and its base64 blob."""
    streams = sorted(set(view.stream.tolist()))
    stream_ids = {s: i for i, s in enumerate(streams)}
    start_delta = np.diff(view.start, prepend=0)
    group, group_names = view.frame_groups()
    columns: list[tuple[str, npt.NDArray[np.generic], str, str]] = [
        ("start", start_delta, "<i4", "i32"),
        ("dur", view.end - view.start, "<i4", "i32"),
        ("size", view.size.astype(np.float64), "<f8", "f64"),
        ("addr", view.addr.astype(np.float64), "<f8", "f64"),
        (
            "stream",
            np.asarray([stream_ids[s] for s in view.stream.tolist()], dtype=np.int64),
            "<i4",
            "i32",
        ),
        ("stack", view.stack, "<i4", "i32"),
        ("op", view.op, "<i4", "i32"),
        ("group", group, "<i4", "i32"),
        ("kind", view.event_kind, "<u1", "u8"),
    ]
    if view.times is not None:
        columns.append(("times", np.diff(view.times, prepend=0.0), "<f8", "f64"))
    if view.categories is not None:
        columns.append(("cat", view.categories.of, "<i4", "i32"))
    rows, moments = _moment_rows(view.moments)
    meta = {  # after the stacks
        "ops": view.ops,
        "groups": group_names,
        "categories": list(view.categories.names) if view.categories is not None else [],
        "streams": [str(s) for s in streams],
        "ooms": view.ooms,
        "rows": rows,
        "moments": moments,
    }
    compressor = zlib.compressobj(6)
    compressed: list[bytes] = []
    layout: list[list[str | int]] = []
    for name, values, dtype, code in columns:
        data = _shuffled(values, dtype)
        compressed.append(compressor.compress(data))
        layout.append([name, code, len(values), len(data)])
    meta_length = 0
    for text in _meta_json(view.stacks, meta):
        data = text.encode()
        compressed.append(compressor.compress(data))
        meta_length += len(data)
    compressed.append(compressor.flush())
    layout.append(["meta", "json", 0, meta_length])
    blob = base64.b64encode(b"".join(compressed)).decode("ascii")
    head = {
        "title": view.title,
        "events": view.events,
        "n": len(view.start),
        "layout": layout,
        "source": view.source,
        "notes": view.notes,
        "history": view.history,
    }
    return head, blob


def render_html(view: View) -> str:
    """Return the picture as one self-contained HTML page (no network access needed).

    Parameters
    ----------
    view : View
        From :func:`view_of_trace` or :func:`view_of_snapshot`.

    Returns
    -------
    str
        The page: active memory over time (zoom, pan, minimap; every allocation reachable by
        hovering), OOMs, what was live at the peak and at each OOM, and the allocator state at
        any event. About 10 bytes per event; the same view gives the same text.
    """
    head, blob = _payload(view)
    head_text = json.dumps(head, separators=(",", ":")).replace("<", "\\u003c")
    return _PAGE % {
        "title": html.escape(printable(view.title)),
        "css": _asset("page.css"),
        "js": _asset("page.js"),
        "head": head_text,
        "blob": blob,
    }


_PAGES = """<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>%(title)s: memory</title>
<meta name="viewport" content="width=device-width">
<style>body { font: 13px system-ui, sans-serif; margin: 16px; color: #222; }
h1 { font-size: 18px; margin: 0 0 4px; } h2 { font-size: 16px; margin: 24px 0 6px; }
iframe { width: 100%%; height: 92vh; border: 1px solid #ccc; }</style></head><body>
<h1>%(title)s</h1>
<p>%(count)d sections, one after another: %(contents)s</p>
%(sections)s
</body></html>
"""


def render_pages(views: Sequence[View], title: str) -> str:
    """Return several pictures (e.g. one per recorded device) as one self-contained HTML page.

    Parameters
    ----------
    views : sequence of View
    title : str
        The page's heading (each section is headed by its view's title).

    Returns
    -------
    str
        A page with a section per view, one after another, each holding the :func:`render_html`
        page of its view in an ``<iframe srcdoc>`` (so that each keeps its own script and
        element ids), and links to the sections at the top. No network access needed.
    """
    sections, contents = [], []
    for n, view in enumerate(views):
        name = html.escape(printable(view.title))
        contents.append(f'<a href="#view-{n}">{name}</a>')
        sections.append(
            f'<section id="view-{n}"><h2>{name}</h2><iframe title="{name}" '
            f'srcdoc="{html.escape(render_html(view))}"></iframe></section>'
        )
    return _PAGES % {
        "title": html.escape(printable(title)),
        "count": len(views),
        "contents": ", ".join(contents),
        "sections": "\n".join(sections),
    }


def render_png(view: View, path: str | os.PathLike[str]) -> None:
    """Draw live memory over time, the peak and the OOMs, to a PNG with matplotlib.

    Parameters
    ----------
    view : View
    path : str or path-like
        The file to write (its suffix picks the format).

    Raises
    ------
    ImportError
        If matplotlib is not installed (``pip install 'accelrt[view]'``).
    OSError
        If the file cannot be written.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    totals = view.totals()
    states = np.arange(len(totals))
    if len(totals) > 20_000:  # the maximum per bucket keeps every peak
        buckets = np.array_split(np.arange(len(totals)), 20_000)
        states = np.asarray([b[np.argmax(totals[b])] for b in buckets])
        totals = totals[states]
    fig, ax = plt.subplots(figsize=(12, 5), dpi=100)
    ax.fill_between(states, totals, step="post", color="#9aa7c0", label="live bytes")
    peak_state = view.peak_state
    ax.axvline(
        peak_state, color="#555", linestyle=":", label=f"peak {format_bytes(view.peak_bytes)}"
    )
    for n, oom in enumerate(view.ooms):
        ax.axvline(
            oom["event"] + 1,
            color="#d00",
            linewidth=1.5,
            label=f"OOM: {format_bytes(oom['size'])} requested" if n == 0 else None,
        )
    ax.set_xlim(0, max(view.events, 1))
    ax.set_ylim(0, max(view.peak_bytes, 1) * 1.05)
    ax.set_xlabel("events")
    ax.set_ylabel("live bytes")
    ticks = ax.get_yticks()
    ax.set_yticks(ticks, [format_bytes(int(t)) for t in ticks])
    ax.set_title(  # as text: a "$" in a name is not mathtext
        f"{printable(view.title)}: active memory, peak {format_bytes(view.peak_bytes)}",
        parse_math=False,
    )
    ax.legend(loc="upper left")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def segment_text(segments: Sequence[SegmentInfo | FileSegment], width: int = 48) -> str:
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
