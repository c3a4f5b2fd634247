"""The memory picture in a real headless Chromium: it draws, hovers, zooms, and scales.

Each test loads a page with ``#selftest``: the page then dispatches real mouse and wheel
events on its own canvas (hovering the middle of drawn allocations, zooming in twice) and
writes what it saw into ``<pre id="selftest">``, which ``--dump-dom`` hands back.
"""

from __future__ import annotations

import html
import json
import random
import re
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from accelrt.replay import replay
from accelrt.trace import Trace, TraceEvent, load, write
from accelrt.view import picture_moments, render_html, view_of_snapshot, view_of_trace
from test_view import MAPHSGE4, _record_with_oom

MiB = 1 << 20
_CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
pytestmark = pytest.mark.skipif(
    _CHROMIUM is None, reason="headless Chromium not installed (apt chromium)"
)


def _load(page: Path, fragment: str = "#selftest", budget_ms: int = 20_000) -> dict[str, Any]:
    """Open ``page`` headless; return its body's data attributes, self-test and errors."""
    assert _CHROMIUM is not None
    args = [_CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--window-size=1280,900"]
    started = time.perf_counter()
    done = subprocess.run(
        [*args, f"--virtual-time-budget={budget_ms}", "--enable-logging=stderr", "--v=0",
         "--dump-dom", page.as_uri() + fragment],
        capture_output=True, text=True, timeout=240,
    )  # fmt: skip
    body = re.search(r"<body([^>]*)>", done.stdout)
    attrs = dict(re.findall(r'data-([a-z-]+)="([^"]*)"', body.group(1) if body else ""))
    test = re.search(r'<pre id="selftest"[^>]*>(.*?)</pre>', done.stdout, re.S)
    errors = [
        line
        for line in done.stderr.splitlines()
        if ("CONSOLE" in line and "ERROR" in line.upper()) or "Uncaught" in line
    ]
    return {
        "attrs": attrs,
        "selftest": json.loads(html.unescape(test.group(1))) if test and test.group(1) else None,
        "errors": errors,
        "dom": done.stdout,
        "seconds": time.perf_counter() - started,
        "stderr": done.stderr[-3000:],
    }


def _check_page(result: dict[str, Any]) -> dict[str, Any]:
    attrs = result["attrs"]
    assert attrs.get("ready") == "1", result["stderr"]
    assert "error" not in attrs and result["errors"] == []
    test = result["selftest"]
    assert test is not None and test["drawn"] > 0
    for hover in test["hovers"]:  # the tooltip names the allocation under the cursor
        assert hover["hovered"] == str(hover["alloc"]), hover
    before, after = test["zoom"]["before"], test["zoom"]["after"]
    assert before.split("/")[0] != after.split("/")[0]  # the window shown changed
    return test


def test_snapshot_with_an_oom_in_chromium(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "oom.pickle"
    _record_with_oom(path, monkeypatch)
    page = tmp_path / "oom.html"
    page.write_text(render_html(view_of_snapshot(path)))
    result = _load(page)
    test = _check_page(result)
    assert test["drawn"] == 3  # every allocation, one by one
    tips = {h["alloc"]: h["tip"] for h in test["hovers"]}
    assert "forward  /work/model.py:42" in tips[1] and "<module>  /work/train.py:7" in tips[1]
    assert tips[1].index("forward") < tips[1].index("[C++] at::native::_to_copy")
    assert "allocator/dispatcher/interpreter frames hidden" in tips[1]
    assert "CUDACachingAllocator" not in tips[1] and "RegisterCUDA" not in tips[1]
    assert result["dom"].count('class="clickable oom-row"') == 1  # the OOM is listed
    assert '<td class="num">1.00 GiB</td>' in result["dom"]  # its requested size


def test_record_torch_style_trace_shows_op_names(tmp_path: Path) -> None:
    path = tmp_path / "ops.jsonl.gz"
    rows, t = [], 0
    for i in range(1, 41):
        t += 1500
        rows.append({"action": "alloc", "addr": i, "size": i * MiB, "stream": 0, "t": t,
                     "op": "aten::mm" if i % 2 else "aten::conv2d"})  # fmt: skip
        if i > 5:
            rows.append({"action": "free", "addr": i - 5, "size": (i - 5) * MiB, "stream": 0,
                         "t": t + 100, "op": "aten::mm"})  # fmt: skip
    write(path, rows, {"name": "ops"})
    trace = load(path)
    page = tmp_path / "ops.html"
    report = replay(trace, capture_at=picture_moments(trace))
    page.write_text(render_html(view_of_trace(trace, report)))
    test = _check_page(_load(page))
    ops = {h["tip"].split("op: ")[1].split("\n")[0] for h in test["hovers"]}
    assert ops == {"aten::mm", "aten::conv2d"}


def _synthetic(n: int, seed: int = 1) -> Trace:
    """About ``n`` alloc/free events with at most 3000 live allocations, sizes 512 B to 1 GiB."""
    rng = random.Random(seed)
    events: list[TraceEvent] = []
    live: list[tuple[int, int]] = []
    next_addr = 1 << 40
    for _ in range(n):
        if live and (len(live) > 3000 or rng.random() < 0.5):
            addr, size = live.pop(rng.randrange(len(live)))
            events.append(TraceEvent("free", addr, size, 0))
        else:
            size = 512 << rng.randrange(21)
            next_addr += 1 << 31
            live.append((next_addr, size))
            events.append(TraceEvent("alloc", next_addr, size, 0))
    return Trace({"name": f"synthetic_{n}"}, events)


@pytest.mark.slow
def test_a_million_events_stay_small_and_draw(tmp_path: Path) -> None:
    started = time.perf_counter()
    view = view_of_trace(_synthetic(1_000_000))
    text = render_html(view)
    assert len(text.encode()) <= 15_000_000
    page = tmp_path / "big.html"
    page.write_text(text)
    result = _load(page, budget_ms=60_000)
    _check_page(result)
    assert time.perf_counter() - started < 60


@pytest.mark.skipif(not MAPHSGE4.exists(), reason="the shared real snapshots are not here")
def test_every_drawn_allocation_of_maphsge4_shows_its_python_frame(tmp_path: Path) -> None:
    view = view_of_snapshot(MAPHSGE4, moments=8)
    page = tmp_path / "m.html"
    page.write_text(render_html(view))
    test = _check_page(_load(page, "#selftest-all"))
    assert len(test["hovers"]) == test["drawn"] > 100
    for hover in test["hovers"]:
        stack = view.stack[hover["alloc"]]
        if stack >= 0 and view.stacks[stack].python:
            assert view.stacks[stack].python[0] in hover["tip"], hover["tip"]
            assert ".py:" in hover["tip"].split("stack (Python frames first):\n")[1].split("\n")[0]
