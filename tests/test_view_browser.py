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

import numpy as np
import pytest

from accelrt.replay import replay
from accelrt.trace import Trace, TraceEvent, load, write
from accelrt.view import (
    View,
    clean_stack,
    picture_moments,
    render_html,
    view_of_snapshot,
    view_of_trace,
)
from test_view import MAPHSGE4, PY, _record_with_oom

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
    for band in test["bands"]:  # and a band names its group, its allocations and bytes
        if band["px"] >= 2:
            assert band["hovered"] == "band:" + band["name"], band
            assert band["tip"].split("\n")[0].endswith(": " + band["name"]), band
            assert re.search(r"\n\d+ allocations?, .* live, each too small", band["tip"]), band
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
        for j in range(6):  # 64 KiB each, never freed: well under 2 pixels at the whole run
            op = "aten::relu" if j < 2 else "aten::add"
            rows.append({"action": "alloc", "addr": 1000 + 10 * i + j, "size": 64 << 10,
                         "stream": 0, "t": t + 200, "op": op})  # fmt: skip
    write(path, rows, {"name": "ops"})
    trace = load(path)
    page = tmp_path / "ops.html"
    report = replay(trace, capture_at=picture_moments(trace))
    page.write_text(render_html(view_of_trace(trace, report)))
    result = _load(page)
    test = _check_page(result)
    ops = {h["tip"].split("op: ")[1].split("\n")[0] for h in test["hovers"]}
    assert ops == {"aten::mm", "aten::conv2d"}  # the big ones, one by one
    # at the whole run the 240 small ones are two bands, by op, each named when hovered
    bands = {b["name"]: b for b in test["bands"]}
    assert bands["aten::add"]["tip"].startswith(
        "op: aten::add\n160 allocations, 10.00 MiB (10485760 bytes) live, each too small to draw"
    )
    assert bands["aten::relu"]["tip"].startswith("op: aten::relu\n80 allocations, 5.00 MiB")
    assert bands["aten::add"]["px"] > bands["aten::relu"]["px"] > 2
    assert int(result["attrs"]["drawn"]) < 40  # zoomed in: fewer and larger on screen


def test_a_name_that_opens_an_html_comment_still_draws(tmp_path: Path) -> None:
    # "<!--<script>" in a trace name made the page's JSON open a comment in the HTML parser,
    # so the page never drew (issue 25); every "<" in the JSON is now written \u003c
    name = "evil <!--<script> </script> model"
    path = tmp_path / "evil.jsonl.gz"
    rows = [{"action": "alloc", "addr": i, "size": (i + 1) * MiB, "stream": 0, "t": i * 1000,
             "op": "aten::<!--"} for i in range(8)]  # fmt: skip
    write(path, rows, {"name": name})
    trace = load(path)
    page = tmp_path / "evil.html"
    report = replay(trace, capture_at=picture_moments(trace))
    page.write_text(render_html(view_of_trace(trace, report)))
    result = _load(page)
    _check_page(result)
    assert html.escape(name) in result["dom"]  # the title, as text


def _view_with_small_allocations() -> View:
    """Two big allocations freed early, then 300 of 1 MiB, each live for 40 events, under three
    stacks with two distinct top frames."""
    deep = [*PY, {"name": "main", "filename": "/work/run.py", "line": 3}]
    other = [{"name": "load", "filename": "/work/data.py", "line": 9}]
    stacks = [clean_stack(PY), clean_stack(deep), clean_stack(other)]
    sizes = [512 * MiB, 256 * MiB] + [MiB] * 300
    events = [("alloc", 0), ("alloc", 1), ("free", 0), ("free", 1)]
    for j in range(300):
        events.append(("alloc", 2 + j))
        if j >= 40:
            events.append(("free", 2 + j - 40))
    n, e = len(sizes), len(events)
    start = np.zeros(n, dtype=np.int64)
    end = np.full(n, e + 1, dtype=np.int64)
    kind = np.zeros(e, dtype=np.int64)
    alloc = np.zeros(e, dtype=np.int64)
    for event, (action, i) in enumerate(events):
        (start if action == "alloc" else end)[i] = event + 1
        kind[event], alloc[event] = int(action == "free"), i
    stack = np.asarray([0, 0] + [j % 3 for j in range(300)], dtype=np.int64)
    addr = np.arange(n, dtype=np.int64) << 30
    zero = np.zeros(n, dtype=np.int64)
    return View("small", e, start, end, np.asarray(sizes, dtype=np.int64), addr, zero, stack,
                np.full(n, -1, dtype=np.int64), kind, alloc, stacks=stacks)  # fmt: skip


def test_small_allocations_are_bands_by_stack_frame_at_the_whole_run(tmp_path: Path) -> None:
    page = tmp_path / "small.html"
    page.write_text(render_html(_view_with_small_allocations()))
    result = _load(page, "#selftest-all")
    test = _check_page(result)
    assert sorted(h["alloc"] for h in test["hovers"]) == [0, 1]  # only the big ones drawn
    bands = {b["name"]: b for b in test["bands"]}
    assert set(bands) == {"forward  /work/model.py:42", "load  /work/data.py:9"}
    # stacks 0 and 1 share their top frame: one band holds two thirds of the small ones
    tip = bands["forward  /work/model.py:42"]["tip"]
    found = re.match(r"stack frame: forward  /work/model.py:42\n(\d+) allocations, (\S+) MiB", tip)
    assert found and 26 <= int(found[1]) <= 28 and float(found[2]) == int(found[1]), tip
    assert bands["forward  /work/model.py:42"]["hovered"] == "band:forward  /work/model.py:42"
    assert re.search(r"\n1[34] allocations, 1[34]\.00 MiB", bands["load  /work/data.py:9"]["tip"])
    # zoomed in twice, away from the big ones: the small ones are drawn one by one
    assert int(result["attrs"]["drawn"]) > 40 and result["attrs"]["bands"] == "0"


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
    test = _check_page(result)
    [band] = [b for b in test["bands"] if b["px"] >= 2]  # no stacks: one band of small ones
    assert band["name"] == "(no stack)" and band["hovered"] == "band:(no stack)"
    assert time.perf_counter() - started < 60


@pytest.mark.skipif(not MAPHSGE4.exists(), reason="the shared real snapshots are not here")
def test_every_drawn_allocation_of_maphsge4_shows_its_python_frame(tmp_path: Path) -> None:
    view = view_of_snapshot(MAPHSGE4, moments=8)
    page = tmp_path / "m.html"
    page.write_text(render_html(view))
    test = _check_page(_load(page, "#selftest-all"))
    assert len(test["hovers"]) == test["drawn"] > 100
    # small allocations are bands named by their Python frame, not one grey area
    named = [b for b in test["bands"] if ".py:" in b["name"]]
    assert len(named) > 10 and any(b["px"] >= 2 for b in named), test["bands"]
    for hover in test["hovers"]:
        stack = view.stack[hover["alloc"]]
        if stack >= 0 and view.stacks[stack].python:
            assert view.stacks[stack].python[0] in hover["tip"], hover["tip"]
            assert ".py:" in hover["tip"].split("stack (Python frames first):\n")[1].split("\n")[0]


def test_kinds_of_memory_colour_and_group_the_page(tmp_path: Path) -> None:
    from accelrt.view import add_categories

    phases = [
        {"phase": "init", "first": 0, "end": 1},
        {"phase": "step0/fwd", "first": 1, "end": 4},
        {"phase": "step0/bwd", "first": 4, "end": 6},
        {"phase": "step0/opt", "first": 6, "end": 7},
    ]
    rows = [
        {"action": "alloc", "addr": 0x1000, "size": 100 * MiB, "stream": 0},  # parameter
        {"action": "alloc", "addr": 0x100000, "size": 30 * MiB, "stream": 0},  # activation
        {"action": "alloc", "addr": 0x200000, "size": 7 * MiB, "stream": 0},  # temporary
        {"action": "free", "addr": 0x200000, "size": 7 * MiB, "stream": 0},
        {"action": "alloc", "addr": 0x300000, "size": 100 * MiB, "stream": 0},  # gradient
        {"action": "free", "addr": 0x100000, "size": 30 * MiB, "stream": 0},
        {"action": "alloc", "addr": 0x400000, "size": 200 * MiB, "stream": 0},  # optimizer
    ]
    path = tmp_path / "step.jsonl"
    write(path, rows, {"name": "step", "phases": phases})
    trace = load(path)
    view = view_of_trace(trace, replay(trace, capture_at=picture_moments(trace)))
    add_categories(view)
    page = tmp_path / "step.html"
    page.write_text(render_html(view))
    result = _load(page)
    _check_page(result)
    kinds = re.search(r'<table id="live-kind">(.*?)</table>', result["dom"], re.S)
    assert kinds is not None
    cells = re.findall(r"<td>([a-z ]+)</td>", kinds.group(1))
    assert cells == ["optimizer state", "parameters", "gradients"]  # at the peak, largest first
    assert '<option value="kind">kind</option>' in result["dom"]
