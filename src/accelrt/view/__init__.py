"""Memory pictures: active memory over time, OOMs and the allocator state, as HTML or PNG.

The picture of a trace has three parts:

- **active memory over time**: every allocation stacked in allocation order (older lower),
  x = event index (and time where the input has timestamps), y = live bytes. Allocations
  large enough to see are drawn one by one, coloured by stack frame or op; smaller ones are
  summed into one band per group (the top frame of their stack, or their op) at a coarse zoom
  and appear one by one when zoomed in. Hovering names the allocation under the cursor with its
  op and stack (Python frames first), or the band's group with its allocations and bytes;
- **OOM forensics**: recorded and replayed OOMs marked and listed (requested, free and
  reserved bytes, stack), and what was live at the peak and at each OOM grouped by stack
  frame and by op;
- **the allocator state** at any event chosen from a keyboard-navigable event list: the
  segment map of the replay, segments labelled with address and size, blocks with their state,
  size and stack.

The HTML page is self-contained (inline script, canvas, no network); :func:`render_pages` puts
several pictures (one per recorded device) in one page, a section each. Data comes from a trace
and optionally a replay that already ran (:func:`view_of_trace`, captured at
:func:`picture_moments`) or from a snapshot (:func:`view_of_snapshot`, which replays its
history once when it has one).
"""

from __future__ import annotations

from ._categories import CategoryRule as CategoryRule
from ._categories import add_categories as add_categories
from ._categories import category_bytes as category_bytes
from ._categories import folded_stacks as folded_stacks
from ._forensics import diff_text as diff_text
from ._forensics import end_state_text as end_state_text
from ._forensics import forensics_text as forensics_text
from ._model import Categories as Categories
from ._model import LiveGroup as LiveGroup
from ._model import View as View
from ._model import live_groups as live_groups
from ._moments import DEFAULT_MOMENTS as DEFAULT_MOMENTS
from ._moments import picture_moments as picture_moments
from ._picture import end_state_view as end_state_view
from ._picture import view_of_trace as view_of_trace
from ._recorded import RecordedDetails as RecordedDetails
from ._recorded import recorded_details as recorded_details
from ._recorded import snapshot_details as snapshot_details
from ._render import render_html as render_html
from ._render import render_pages as render_pages
from ._render import render_png as render_png
from ._render import segment_text as segment_text
from ._snapshot import SnapshotPicture as SnapshotPicture
from ._snapshot import view_of_snapshot as view_of_snapshot
from ._stacks import CleanStack as CleanStack
from ._stacks import clean_stack as clean_stack

__all__ = [
    "DEFAULT_MOMENTS",
    "Categories",
    "CategoryRule",
    "CleanStack",
    "LiveGroup",
    "RecordedDetails",
    "SnapshotPicture",
    "View",
    "add_categories",
    "category_bytes",
    "clean_stack",
    "diff_text",
    "end_state_text",
    "end_state_view",
    "folded_stacks",
    "forensics_text",
    "live_groups",
    "picture_moments",
    "recorded_details",
    "render_html",
    "render_pages",
    "render_png",
    "segment_text",
    "snapshot_details",
    "view_of_snapshot",
    "view_of_trace",
]
