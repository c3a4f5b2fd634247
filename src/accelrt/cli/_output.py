"""What the commands write: the console (no markup, no highlighting), text and PNG files, and
the memory pictures of replays, one per recorded device."""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, TextIO

from .._errors import InputError
from .._text import printable

if TYPE_CHECKING:
    from rich.console import Console

    from ..replay import ReplayReport
    from ..trace import Trace
    from ..trace._snapshot_schema import FileSnapshot
    from ..view import View
    from ..view._categories import CategoryRule


def _console() -> Console:
    """A rich console on stdout that prints text as given: no markup, no highlighting (rich's
    highlighter takes time quadratic in a string's length), styles only where a ``Text`` gives
    them. On a terminal as wide as it; in a pipe or a CI log never wrapped (each table at its
    own width, one line a sentence)."""
    from rich.console import Console

    width = None if sys.stdout.isatty() else 100_000
    return Console(width=width, markup=False, highlight=False)


def _write_text(path: str, text: str) -> None:
    """Write ``text`` to ``path``; on failure remove what was started, if the file is new."""
    existed = os.path.exists(path)
    try:
        with open(path, "w", encoding="utf-8") as f:
            f.write(text)
    except OSError as exc:
        if not existed:
            with contextlib.suppress(OSError):
                os.remove(path)
        raise InputError(f"cannot write {path}: {exc.strerror or exc}") from None


def _write_png(view: Any, path: str, render: Callable[[Any, str], None] | None = None) -> None:
    draw: Callable[[Any, str], None]
    if render is None:
        from ..view import render_png

        draw = render_png
    else:
        draw = render
    try:
        draw(view, path)
    except ImportError:
        raise InputError(f"writing {path} needs matplotlib: pip install 'accelrt[view]'") from None
    except OSError as exc:
        raise InputError(f"cannot write {path}: {exc.strerror or exc}") from None


def _view(
    snapshot: FileSnapshot | None,
    trace: Trace,
    report: ReplayReport | None,
    rules: Sequence[CategoryRule] = (),
) -> View:
    """The picture of ``trace`` and its replay, with the kinds of memory (the user's
    ``--category`` rules first); a snapshot's device's with its recorded stacks, times and OOMs
    (``device_traces[N]``) and end segments."""
    from ..trace._snapshot import device_segments
    from ..view import add_categories, view_of_trace

    if snapshot is None or trace.recording is None:
        view = view_of_trace(trace, report)
    else:
        device = trace.recording.device
        view = view_of_trace(
            trace,
            report,
            entries=snapshot["device_traces"][device],
            end_segments=device_segments(snapshot, device),
        )
    add_categories(view, rules)
    return view


def _numbered(path: str, device: int) -> str:
    """``out.png`` as ``out_dev1.png``: a file per recorded device."""
    root, ext = os.path.splitext(path)
    return f"{root}_dev{device}{ext}"


def _write_views(
    views: Sequence[View],
    devices: Sequence[int | None],
    html_path: str | None,
    png_path: str | None,
    *,
    title: str,
    stream: TextIO,
) -> None:
    """Write the pictures, one per recorded device: one HTML file (headed ``title``) with a
    section each, and a PNG each (``out_devN.png`` when there are several); say what was
    written on ``stream``."""
    from ..view import render_html, render_pages

    several = len(views) > 1
    written = []
    if html_path:
        page = render_pages(views, title) if several else render_html(views[0])
        _write_text(html_path, page)
        shown = f"devices {', '.join(str(d) for d in devices)}; " if several else ""
        written.append(f"{html_path} ({shown}{len(page.encode()) / 1e6:.1f} MB)")
    if png_path:
        for view, device in zip(views, devices, strict=True):
            name = _numbered(png_path, device) if several and device is not None else png_path
            _write_png(view, name)
            written.append(name)
    print(printable("wrote " + ", ".join(written)), file=stream)
