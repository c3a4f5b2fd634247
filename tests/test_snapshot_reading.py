"""Reading snapshots: progress over bytes, one read per command, the picture's parts taken
before the replay, pages that send unchanged segments once, and snapshots without history."""

from __future__ import annotations

import base64
import gc
import json
import pickle
import re
import shutil
import zlib
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import accelrt as acc
from accelrt._gc import collector_paused
from accelrt.cli import main
from accelrt.trace import TraceFormatError, read_snapshot
from accelrt.trace._plain_pickle import load_plain_pickle
from accelrt.view import (
    SnapshotPicture,
    end_state_text,
    render_html,
    view_of_snapshot,
    view_of_trace,
)

MiB = 1 << 20
FRAMES = [
    {"name": "torch::unwind::unwind()", "filename": "??", "line": 0},
    {"name": "forward", "filename": "/work/model.py", "line": 42},
    {"name": "<module>", "filename": "/work/train.py", "line": 7},
]
MAPHSGE4 = (
    Path(__file__).parents[2] / "shared/traces/gpu_snapshots/raw/Maphsge4__snapshot_ec5be11.pickle"
)
EXAMPLE = Path(__file__).parents[1] / "examples" / "traces" / "two_device_midrun.pickle"
# (file, device): the committed two-device example on every clone, and a real 9-stream recording
# of many segments where the shared snapshots lie beside the repository
PICTURED = [(EXAMPLE, 0), (EXAMPLE, 1)] + [(MAPHSGE4, 0)] * MAPHSGE4.exists()


def _without_history(path: Path) -> Path:
    """A snapshot dumped with no history recorded: a 20 MiB segment holding a 3 MiB block
    (with a recorded stack, as PyTorch keeps for live blocks) and a 2 MiB small segment
    holding 1000 bytes."""
    acc.backends.use("sim")
    kept = [acc.empty(3 * MiB), acc.empty(1000)]
    acc.dump_snapshot(path)
    snapshot = pickle.loads(path.read_bytes())
    assert snapshot["device_traces"] == [[], []]
    for seg in snapshot["segments"]:
        for block in seg["blocks"]:
            if block["size"] == 3 * MiB:
                block["frames"] = FRAMES
    path.write_bytes(pickle.dumps(snapshot))
    for buffer in kept:
        buffer.free()
    return path


def _page_data(page: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """The head and the decoded ``meta`` part of a page's blob."""
    head_match = re.search(r'<script id="head"[^>]*>(.*?)</script>', page, re.S)
    blob_match = re.search(r'<script id="blob"[^>]*>(.*?)</script>', page, re.S)
    assert head_match is not None and blob_match is not None
    head, blob = json.loads(head_match[1]), blob_match[1]
    raw = zlib.decompress(base64.b64decode(blob))
    offset = sum(nbytes for *_, nbytes in head["layout"][:-1])
    return head, json.loads(raw[offset:])


def test_summary_of_a_snapshot_without_history(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = _without_history(tmp_path / "end.pickle")
    assert main(["snapshot", "summary", str(path)]) == 0
    out = capsys.readouterr().out
    assert out.startswith("end (recorded device 0)\nNo allocation history was recorded")
    assert "End state: 2 segments, 22.00 MiB reserved" in out
    assert re.search(r"allocated +2 blocks +3.00 MiB \(requested 3.00 MiB\)", out)
    assert re.search(r"pending free +0 blocks", out)
    assert re.search(r"free \(cached\) +2 blocks +19.00 MiB \(largest block 17.00 MiB\)", out)
    # both free blocks share a segment with an allocated block: empty_cache() keeps them
    assert "19.00 MiB of the free bytes are in 2 blocks of segments" in out
    assert "Allocated at the end: 3.00 MiB in 2 blocks, by stack frame" in out
    assert re.search(r"3.00 MiB +100.0% +1 +forward  /work/model.py:42", out)
    assert main(["snapshot", "summary", str(path), "--device-index", "1", "--no-progress"]) == 0
    assert "End state: 0 segments, 0 bytes reserved" in capsys.readouterr().out


def test_view_of_a_snapshot_without_history(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = _without_history(tmp_path / "end.pickle")
    view = view_of_snapshot(path)
    assert not view.history and view.events == 0
    assert view.size.tolist() == [3 * MiB, 1000]  # the allocated blocks, live at state 0
    assert view.start.tolist() == [0, 0] and view.end.tolist() == [1, 1]
    assert view.stacks[view.stack[0]].top == "forward  /work/model.py:42" and view.stack[1] == -1
    [moment] = view.moments
    assert [[b[:2] for b in row[4]] for row in moment["segments"]] == [
        [[3 * MiB, 0], [17 * MiB, 2]],
        [[1024, 0], [2 * MiB - 1024, 2]],
    ]
    assert [row[4][0][2] for row in moment["segments"]] == [0, 1]  # each block's allocation
    assert "End state: 2 segments" in end_state_text(view)
    page_path = tmp_path / "end.html"
    assert main(["snapshot", "view", str(path), "-o", str(page_path), "--no-progress"]) == 0
    assert capsys.readouterr().out.startswith(f"wrote {page_path}")
    head, meta = _page_data(page_path.read_text())
    assert head["history"] is False and head["events"] == 0 and head["n"] == 2
    segments = [meta["rows"][r] for r in meta["moments"][0]["segments"]]
    assert segments == moment["segments"]


@pytest.mark.skipif(
    shutil.which("chromium") is None and shutil.which("chromium-browser") is None,
    reason="headless Chromium not installed (apt chromium)",
)
def test_page_without_history_says_so_in_chromium(tmp_path: Path) -> None:
    from test_view_browser import _load

    page = tmp_path / "end.html"
    page.write_text(render_html(view_of_snapshot(_without_history(tmp_path / "end.pickle"))))
    result = _load(page, fragment="")
    assert result["attrs"].get("ready") == "1" and result["errors"] == []
    dom = result["dom"]
    assert re.search(r'<div id="banner" class="banner">This snapshot was recorded without', dom)
    assert '<div id="over-time" hidden="">' in dom  # no chart over time
    assert "The allocator's state at the end: 2 segments, 22.00 MiB reserved" in dom
    assert '<option value="0">at the end</option>' in dom
    assert re.search(r"<td>forward  /work/model.py:42</td><td[^>]*>3.00 MiB</td>", dom)


def test_read_snapshot_reports_progress_over_bytes(tmp_path: Path) -> None:
    snapshot = {
        "segments": [],
        "device_traces": [
            [
                {
                    "action": "alloc",
                    "addr": 512 * i,
                    "size": 512,
                    "frames": [dict(f) for f in FRAMES],
                }
                for i in range(40_000)
            ]
        ],
    }
    path = tmp_path / "big.pickle"
    path.write_bytes(pickle.dumps(snapshot, protocol=4))
    size = path.stat().st_size
    calls: list[tuple[str, int, int]] = []
    assert read_snapshot(path, progress=lambda *call: calls.append(call)) == read_snapshot(path)
    phases = [phase for phase, _, _ in calls]
    assert phases == sorted(phases, key=["reading", "checking", "decoding"].index)
    for phase in ("reading", "checking", "decoding"):
        done = [d for p, d, total in calls if p == phase and total == size]
        assert done and done == sorted(done) and done[-1] >= size - (1 << 20), (phase, done)
    assert calls[-1] == ("decoding", size, size)


@pytest.mark.parametrize("protocol", range(pickle.HIGHEST_PROTOCOL + 1))
def test_decoding_with_progress_decodes_alike(protocol: int) -> None:
    value = {
        "segments": [{"address": 0, "blocks": [{"state": "inactive"}] * 3}],
        "device_traces": [[{"action": "alloc", "addr": i, "size": 2**40 + i} for i in range(5000)]],
        "text": "x" * 300_000 + "\n",
        "nested": [[1.5, None, True, "\n"], {"k": -7}],
    }
    if protocol >= 3:  # (before 3, bytes are pickled through a global: refused)
        value["bytes"] = b"\x00\n" * 70_000
    data = pickle.dumps(value, protocol=protocol)
    calls: list[tuple[str, int, int]] = []
    decoded = load_plain_pickle(data, "x", progress=lambda *call: calls.append(call))
    assert decoded == load_plain_pickle(data, "x") == value
    assert calls[-1] == ("decoding", len(data), len(data))


@pytest.mark.parametrize(
    "data",
    [
        pickle.dumps({"p": Path("/")}),  # names a global
        pickle.dumps([1, 2, 3])[:-3],  # truncated
        b"\x80\x04\x95\xff\xff\xff\xff\x00\x00\x00\x00.",  # a frame longer than the file
        b"\x80\x02]q\x00(K\x01h\x00e.",  # a list holding itself: fine
    ],
)
def test_decoding_with_progress_refuses_alike(data: bytes) -> None:
    def outcome(**kw: Any) -> str:
        try:
            return repr(load_plain_pickle(data, "f.pickle", **kw))
        except TraceFormatError as exc:
            return str(exc)

    assert outcome() == outcome(progress=lambda *_: None)


def test_the_collector_is_paused_inside_only() -> None:
    assert gc.isenabled()
    with collector_paused():
        assert not gc.isenabled()
        with collector_paused():
            assert not gc.isenabled()
        assert not gc.isenabled()
    assert gc.isenabled()
    gc.disable()
    try:
        with collector_paused():
            pass
        assert not gc.isenabled()  # it was off: it stays off
    finally:
        gc.enable()


@pytest.mark.parametrize(("path", "device"), PICTURED, ids=lambda v: getattr(v, "stem", v))
def test_a_picture_taken_before_the_replay_is_the_same_picture(path: Path, device: int) -> None:
    snapshot = read_snapshot(path)
    picture = SnapshotPicture.take(path, snapshot, device)
    assert picture.trace is not None
    from accelrt.replay import replay
    from accelrt.view import picture_moments

    report = replay(picture.trace, capture_at=picture_moments(picture.trace, 16))
    whole = view_of_trace(
        picture.trace,
        report,
        title=picture.title,
        entries=snapshot["device_traces"][device],
        end_segments=[s for s in snapshot["segments"] if s.get("device", 0) == device],
    )
    del snapshot  # the picture does not need it
    drawn = picture.draw(replay(picture.trace, capture_at=picture.capture_at(16)))
    for name in ("start", "end", "size", "addr", "stack", "event_kind", "event_alloc", "times"):
        assert np.array_equal(getattr(drawn, name), getattr(whole, name)), name
    assert drawn.stacks == whole.stacks and drawn.moments == whole.moments
    assert drawn.ooms == whole.ooms and drawn.title == path.stem
    # the page sends a segment unchanged since the moment before once
    _, meta = _page_data(render_html(drawn))
    rows = sum(len(m["segments"]) for m in drawn.moments)
    assert len(meta["rows"]) < rows / 2
    assert [[meta["rows"][r] for r in m["segments"]] for m in meta["moments"]] == [
        m["segments"] for m in drawn.moments
    ]


@pytest.mark.parametrize(("path", "device"), PICTURED, ids=lambda v: getattr(v, "stem", v))
def test_a_recording_of_many_segments_captures_fewer_moments(
    path: Path, device: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    from accelrt.replay import replay
    from accelrt.view import _moments, picture_moments

    picture = SnapshotPicture.take(path, read_snapshot(path), device)
    trace = picture.trace
    assert trace is not None and trace.recording is not None
    segments = max(len(trace.recording.start_segments), trace.recording.segments_at_end)

    def drawn() -> int:
        return len(picture.draw(replay(trace, capture_at=picture.capture_at())).moments)

    assert drawn() == len(picture_moments(trace, 240))
    monkeypatch.setattr(_moments, "CAPTURED_SEGMENTS", 30 * segments)
    assert drawn() == len(picture_moments(trace, 30))
    monkeypatch.setattr(_moments, "CAPTURED_SEGMENTS", segments)  # never fewer than 24
    assert drawn() == len(picture_moments(trace, 24))


@pytest.mark.parametrize(
    "argv",
    [
        ["snapshot", "view", "{file}", "-o", "{out}/page.html"],
        ["snapshot", "summary", "{file}"],
        ["snapshot", "segments", "{file}"],
        ["replay", "{file}"],
    ],
)
def test_a_command_opens_reads_and_checks_a_snapshot_once(
    argv: list[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from accelrt.trace import _snapshot, _snapshot_schema

    snapshot = Path(__file__).parent.parent / "examples" / "traces" / "two_device_midrun.pickle"
    opened: list[str] = []
    real_open = open

    def counted_open(file: Any, *args: Any, **kwargs: Any) -> Any:
        if isinstance(file, (str, Path)) and Path(file).resolve() == snapshot.resolve():
            opened.append(str(file))
        return real_open(file, *args, **kwargs)

    checked: list[str] = []
    real_check = _snapshot_schema.check_entries

    def counted_check(entries: list[Any], path: str) -> Any:
        checked.append(path)
        return real_check(entries, path)

    monkeypatch.setattr("builtins.open", counted_open)
    monkeypatch.setattr(_snapshot_schema, "check_entries", counted_check)
    monkeypatch.setattr(_snapshot, "check_entries", counted_check)
    args = [a.format(file=snapshot, out=tmp_path) for a in argv]
    assert main([*args, "--no-progress"]) == 0
    assert len(opened) == (2 if argv[0] == "replay" else 1)  # replay asks what the file is first
    assert sorted(checked) == ["device_traces[0]", "device_traces[1]"]  # each device once
