"""Memory pictures: stacks, columns, OOM forensics, the page's data, summary and diff."""

from __future__ import annotations

import pickle
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import accelrt as acc
from accelrt import cli
from accelrt.replay import replay
from accelrt.trace import TraceEvent, load, write
from accelrt.view import (
    clean_stack,
    forensics_text,
    live_groups,
    picture_moments,
    render_html,
    view_of_snapshot,
    view_of_trace,
)

MiB = 1 << 20
NOISE = [
    {"name": "torch::unwind::unwind()", "filename": "??", "line": 0},
    {"name": "torch::cuda::(anonymous namespace)::gather_with_cpp()", "filename": "", "line": 0},
    {
        "name": "c10::cuda::CUDACachingAllocator::Native::DeviceCachingAllocator::malloc(int)",
        "filename": "CUDACachingAllocator.cpp",
        "line": 0,
    },
    {"name": "wrapper_CUDA__empty_strided", "filename": "RegisterCUDA.cpp", "line": 0},
    {"name": "at::native::_to_copy(at::Tensor const&)", "filename": "??", "line": 0},
    {"name": "_PyEval_EvalFrameDefault", "filename": "??", "line": 0},
]
PY = [
    {"name": "forward", "filename": "/work/model.py", "line": 42},
    {"name": "<module>", "filename": "/work/train.py", "line": 7},
]


def test_clean_stack_puts_python_first_and_folds_cpp() -> None:
    stack = clean_stack([*NOISE[:4], NOISE[4], NOISE[5], PY[0], NOISE[5], PY[1]])
    assert stack.python == ("forward  /work/model.py:42", "<module>  /work/train.py:7")
    assert stack.native == ("at::native::_to_copy(at::Tensor const&)",)
    assert stack.hidden == 6
    assert stack.top == "forward  /work/model.py:42"
    assert stack.lines(native_shown=0)[-1] == (
        "... 1 more C++ frames, 6 allocator/dispatcher frames"
    )
    assert clean_stack("not a list").top == "(no stack)"
    assert clean_stack([NOISE[4], "junk"]).top == "at::native::_to_copy(at::Tensor const&)"


def _record_with_oom(path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A recording on a 64 MiB simulated device that runs out of memory once."""
    monkeypatch.setenv("ACCELRT_SIM_CAPACITY", "64MiB")
    acc.backends.use("sim")
    early = acc.empty(3 * MiB)  # live before recording, never freed
    acc.record_memory_history()
    kept = acc.empty(8 * MiB)
    side = acc.empty(20 * MiB)
    side.free()
    with pytest.raises(acc.OutOfMemoryError):
        acc.empty(1 << 30)
    acc.dump_snapshot(path)
    with open(path, "rb") as f:
        snapshot: dict[str, Any] = pickle.load(f)
    for entry in snapshot["device_traces"][0]:  # as PyTorch records them: C++ noise around
        if entry["action"] in ("alloc", "oom"):
            entry["frames"] = [*NOISE, *PY]
    with open(path, "wb") as f:
        pickle.dump(snapshot, f)
    kept.free()
    early.free()


def test_view_of_a_snapshot_with_an_oom(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "oom.pickle"
    _record_with_oom(path, monkeypatch)
    view = view_of_snapshot(path)
    assert view.size.tolist() == [3 * MiB, 8 * MiB, 20 * MiB]
    assert view.start.tolist() == [0, 1, 2] and view.end.tolist() == [5, 5, 3]
    assert view.events == 4 and view.event_kind.tolist() == [0, 0, 1, 3]
    assert view.peak_bytes == 31 * MiB and view.peak_state == 2
    [oom] = view.ooms
    assert oom["source"] == "recorded" and oom["event"] == 3 and oom["size"] == 1 << 30
    assert oom["free"] == 64 * MiB - 40 * MiB + 20 * MiB  # the 20 MiB segment was released
    assert oom["reserved"] == 20 * MiB and oom["live"] == 11 * MiB
    assert view.stacks[oom["stack"]].python[0] == "forward  /work/model.py:42"
    assert view.stacks[view.stack[1]].hidden == len(NOISE) - 1
    assert view.stack[0] == -1  # the end state's block carries no recorded stack
    assert view.times is not None and view.times[0] == 0.0
    ids, names = view.frame_groups()  # what the page colours and aggregates by
    assert names == ["forward  /work/model.py:42"] and ids.tolist() == [-1, 0, 0]
    groups = live_groups(view, oom["event"], "frame")
    assert [(g.key, g.bytes, g.count) for g in groups] == [
        ("forward  /work/model.py:42", 8 * MiB, 1),
        ("(no stack)", 3 * MiB, 1),
    ]
    assert [m["state"] for m in view.moments][-1] == 4
    text = forensics_text(view)
    assert (
        "1. recorded at event 3: requested 1024.00 MiB (1073741824 bytes); free 44.00 MiB" in text
    )
    assert "Live at OOM 1 (event 3): 11.00 MiB in 2 allocations, by stack frame" in text
    page = render_html(view)
    assert page.count("<script") == 3 and "<script src" not in page
    with pytest.raises(ValueError, match="by must be 'frame' or 'op', got 'x'"):
        live_groups(view, 0, "x")
    with pytest.raises(ValueError, match=r"state 9 is out of range \[0, 4\]"):
        live_groups(view, 9)


def test_jsonl_ops_times_and_replayed_ooms(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl.gz"
    rows = [
        {"action": "alloc", "addr": 1, "size": 40 * MiB, "stream": 0, "t": 0, "op": "aten::mm"},
        {"action": "alloc", "addr": 2, "size": 30 * MiB, "stream": 0, "t": 2000, "op": "aten::add"},
        {"action": "free", "addr": 1, "size": 40 * MiB, "stream": 0, "t": 5000, "op": "aten::mm"},
        {"action": "alloc", "addr": 3, "size": 10, "stream": 0, "t": 9000},
    ]
    write(path, rows, {"name": "ops", "device_capacity_bytes": 64 * MiB})
    trace = load(path)
    report = replay(trace, capture_at=picture_moments(trace))
    view = view_of_trace(trace, report)
    assert view.ops == ["aten::mm", "aten::add"] and view.op.tolist() == [0, 1, -1]
    assert view.times is not None and view.times.tolist() == [0.0, 2.0, 5.0, 9.0]  # µs
    [oom] = view.ooms  # 40 + 30 MiB do not fit in 64 MiB
    assert oom["source"] == "replay" and oom["event"] == 1 and oom["size"] == 30 * MiB
    assert [(g.key, g.bytes) for g in live_groups(view, 2, "op")] == [
        ("aten::add", 30 * MiB),
        ("aten::mm", 40 * MiB),
    ][::-1]
    assert view.source.startswith("replay on sim:0")


def test_picture_moments_include_the_peak_and_spread() -> None:
    from accelrt.trace import Trace

    events = [TraceEvent("alloc", i, 100, 0) for i in range(1, 1001)]
    events += [TraceEvent("free", i, 100, 0) for i in range(1, 1001)]
    moments = picture_moments(Trace({"name": "x"}, events), 10)
    assert 999 in moments and moments[0] == -1 and moments[-1] == 1999 and len(moments) <= 13
    with pytest.raises(ValueError, match="moments must be at least 1, got 0"):
        picture_moments(Trace({"name": "x"}, events), 0)


def test_summary_diff_version_and_markup(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "oom.pickle"
    _record_with_oom(path, monkeypatch)
    assert cli.main(["snapshot", "summary", str(path)]) == 0
    out = capsys.readouterr().out
    assert "Out-of-memory events: 1" in out and "forward  /work/model.py:42" in out
    assert "Live at the peak (event 1): 31.00 MiB in 3 allocations, by stack frame" in out
    gc = "garbage_collection_threshold:0.5"
    assert cli.main(["snapshot", "diff", str(path), "--config", "", "--config", gc]) == 0
    out = capsys.readouterr().out
    assert (
        "peak live" in out
        and "B: oom.pickle, setting from --config (garbage_collection_threshold:0.5)" in out
    )
    assert cli.main(["snapshot", "diff", str(path)]) == 2
    assert "give --config twice" in capsys.readouterr().err
    page = tmp_path / "p.html"
    assert cli.main(["snapshot", "view", str(path), "-o", str(page)]) == 0
    assert capsys.readouterr().out.startswith(f"wrote {page} (")
    trace = tmp_path / "t.jsonl.gz"
    write(trace, [TraceEvent("alloc", 1, MiB, 0)], {"name": "t"})
    args = ["replay", str(trace), "--device", "sim", "--no-progress"]
    assert cli.main([*args, "--config", "max_split_size_mb:20"]) == 0
    out = capsys.readouterr().out
    assert "[max_split_size_mb:20] peak requested" in out  # not eaten as markup
    with pytest.raises(SystemExit):
        cli.build_parser().parse_args(["--version"])
    assert capsys.readouterr().out.strip() == f"accelrt {acc.__version__}"


def test_python_dash_m() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "accelrt", "--version"], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0 and done.stdout.startswith("accelrt ")


MAPHSGE4 = (
    Path(__file__).parents[2] / "shared/traces/gpu_snapshots/raw/Maphsge4__snapshot_ec5be11.pickle"
)


@pytest.mark.skipif(not MAPHSGE4.exists(), reason="the shared real snapshots are not here")
def test_every_recorded_python_frame_survives_cleaning() -> None:
    from accelrt.trace import read_snapshot

    view = view_of_snapshot(MAPHSGE4, moments=4)
    entries = [e for e in read_snapshot(MAPHSGE4)["device_traces"][0] if e["action"] == "alloc"]
    recorded = view.start > 0
    assert int(recorded.sum()) == len(entries)
    for index, entry in zip(np.flatnonzero(recorded), entries, strict=True):
        has_py = any(f["filename"].endswith(".py") and f["line"] > 0 for f in entry["frames"])
        stack = view.stacks[view.stack[index]]
        assert bool(stack.python) == has_py
        assert stack.lines()[0] == stack.python[0] if has_py else True
