"""PyTorch snapshot pickles as traces: exact replay from a rewound start, CLI, pictures."""

from __future__ import annotations

import json
import pickle
import random
from pathlib import Path

import pytest

import accelrt as acc
from accelrt import cli
from accelrt.memory import SegmentInfo
from accelrt.replay import replay
from accelrt.trace import load
from accelrt.view import segment_text, view_of_snapshot

MiB = 1 << 20


def _record_mid_run(path: Path) -> dict[str, object]:
    """A run whose recording starts mid-way: blocks and cached segments exist before it."""
    acc.backends.use("sim")
    early = [acc.empty(n) for n in (5 * MiB, 700, 25 * MiB, 3 * MiB)]
    early[1].free()  # a cached free block inside a split segment
    cached = acc.empty(40 * MiB)
    cached.free()  # a whole cached segment
    acc.record_memory_history()
    side = acc.Stream()
    late = [acc.empty(n) for n in (2 * MiB, 600, 7 * MiB)]
    early[0].free()  # frees of blocks allocated before recording
    early[2].free()
    late.append(acc.empty(12 * MiB, stream=side))
    late[0].free()
    acc.empty_cache()  # the program releases its cache
    late.append(acc.empty(30 * MiB))
    late[1].free()
    acc.dump_snapshot(path)
    with open(path, "rb") as f:
        snapshot: dict[str, object] = pickle.load(f)
    return snapshot


def test_snapshot_replays_exactly_from_its_rewound_start(tmp_path: Path) -> None:
    path = tmp_path / "run.pickle"
    snapshot = _record_mid_run(path)
    recorded_peak = acc.max_memory_reserved()
    trace = load(path)
    recording = trace.recording
    assert recording is not None
    assert [e.action for e in trace.events].count("empty_cache") == 1
    assert recording.reserved_at_start_bytes == 2 * MiB + 20 * MiB + 26 * MiB + 40 * MiB
    assert recording.peak_reserved_bytes == recorded_peak
    assert recording.inconsistent_events == 0
    start_live = sorted(
        (b.address, b.requested_size) for s in recording.start_segments for b in s.blocks
        if b.requested_size
    )  # fmt: skip
    assert [size for _, size in start_live] == [5 * MiB, 3 * MiB, 25 * MiB]
    report = replay(trace, capture_at=[len(trace.events) - 1])
    assert report.peak_reserved_bytes == report.recorded_peak_reserved_bytes == recorded_peak
    assert report.peak_reserved_difference == 0.0
    assert report.num_device_alloc == report.recorded_num_device_alloc == 2
    assert report.notes == []
    end = report.segment_maps[len(trace.events) - 1]
    layout = [(s["address"], [(b["size"], b["state"]) for b in s["blocks"]]) for s in end]
    expected = [
        (s["address"], [(b["size"], b["state"]) for b in s["blocks"]])
        for s in sorted(snapshot["segments"], key=lambda s: s["address"])  # type: ignore
    ]
    assert layout == expected  # every segment and block where PyTorch-format history put it


@pytest.mark.parametrize(
    "settings",
    ["expandable_segments:True", "expandable_segments:True,max_split_size_mb:40", ""],
)
def test_random_mid_run_recordings_replay_exactly(tmp_path: Path, settings: str) -> None:
    acc.backends.use("sim")
    acc.set_allocator_settings(settings)
    rng = random.Random(settings)
    streams = [acc.current_stream(), acc.Stream()]
    live: list[acc.Buffer] = []

    def run(steps: int) -> None:
        for _ in range(steps):
            roll = rng.random()
            if roll < 0.5 or not live:
                size = rng.choice([rng.randint(1, 1 << 20), rng.randint(1 << 20, 80 * MiB)])
                live.append(acc.empty(size, stream=rng.choice(streams)))
            elif roll < 0.6:  # used on the other stream too: its free completes later
                acc.record_stream(live[rng.randrange(len(live))], rng.choice(streams))
            elif roll < 0.97:
                live.pop(rng.randrange(len(live))).free()
            else:
                acc.empty_cache()

    run(400)  # state before recording: live blocks, cached and unmapped pages
    acc.reset_peak_memory_stats()
    acc.record_memory_history()
    run(600)
    path = tmp_path / "run.pickle"
    acc.dump_snapshot(path)
    recorded_peak = acc.max_memory_reserved()
    trace = load(path)
    assert trace.recording is not None and trace.recording.inconsistent_events == 0
    assert trace.recording.reserved_at_start_bytes > 0
    last = len(trace.events) - 1
    report = replay(trace, capture_at=[last])
    assert report.peak_reserved_bytes == report.recorded_peak_reserved_bytes == recorded_peak
    assert report.num_device_alloc == report.recorded_num_device_alloc

    def layout(segments: list[SegmentInfo]) -> list[tuple[object, ...]]:
        # per (stream, pool): each range's offset from the first, bytes and blocks
        first: dict[tuple[int, str], int] = {}
        for s in sorted(segments, key=lambda s: s["address"]):
            first.setdefault((s["stream"], s["segment_type"]), s["address"])
        return sorted(
            (
                s["stream"],
                s["segment_type"],
                s["address"] - first[(s["stream"], s["segment_type"])],
                s["total_size"],
                [(b["size"], b["state"]) for b in s["blocks"]],
            )
            for s in segments
        )

    # every range and block where the recording had it (the ranges' base addresses may
    # differ: an unlimited simulated device reserves more address space than the GPU did)
    assert layout(report.segment_maps[last]) == layout(acc.memory_snapshot()["segments"])
    for buf in live:
        buf.free()


def _pytorch_style_snapshot() -> dict[str, object]:
    """A tiny hand-made snapshot in PyTorch's own shape: CUDA stream pointers, C++ frames,
    PyTorch's settings keys, and an OOM entry that gives the device's capacity."""
    stream = 94_000_000_000_000
    frames = [{"name": "c10::cuda::malloc", "filename": "??", "line": 0},
              {"name": "forward", "filename": "model.py", "line": 7}]  # fmt: skip
    base = 0x7F3A00000000
    return {
        "segments": [
            {"device": 0, "address": base, "total_size": 20 * MiB, "allocated_size": 4 * MiB,
             "active_size": 4 * MiB, "requested_size": 4 * MiB, "stream": stream,
             "segment_type": "large", "segment_pool_id": (0, 0), "is_expandable": False,
             "frames": frames,
             "blocks": [
                 {"address": base, "size": 4 * MiB, "requested_size": 4 * MiB,
                  "state": "active_allocated", "frames": frames},
                 {"address": base + 4 * MiB, "size": 16 * MiB, "requested_size": 0,
                  "state": "inactive", "frames": []},
             ]},
        ],
        "device_traces": [[
            {"action": "segment_alloc", "addr": base, "size": 20 * MiB, "stream": stream,
             "time_us": 1, "frames": frames},
            {"action": "alloc", "addr": base, "size": 4 * MiB, "stream": stream, "time_us": 2,
             "frames": frames},
            {"action": "alloc", "addr": base + 4 * MiB, "size": 2 * MiB, "stream": stream,
             "time_us": 3, "frames": frames},
            {"action": "oom", "device_free": 10 * MiB, "size": 40 * MiB, "stream": stream,
             "time_us": 4, "frames": frames},
            {"action": "free_requested", "addr": base + 4 * MiB, "size": 2 * MiB,
             "stream": stream, "time_us": 5, "frames": []},
            {"action": "free_completed", "addr": base + 4 * MiB, "size": 2 * MiB,
             "stream": stream, "time_us": 5, "frames": []},
        ]],
        "allocator_settings": {"PYTORCH_CUDA_ALLOC_CONF": "", "max_split_size": -1,
                               "garbage_collection_threshold": 0.0, "expandable_segments": False,
                               "roundup_power2_divisions": {"1": 0, "2": 0}},
    }  # fmt: skip


def test_pytorch_style_snapshot(tmp_path: Path) -> None:
    path = tmp_path / "torch.pickle"
    path.write_bytes(pickle.dumps(_pytorch_style_snapshot()))
    trace = load(path)
    assert trace.recording is not None
    assert trace.recording.capacity_bytes == 30 * MiB  # 20 MiB reserved + 10 MiB free at OOM
    assert trace.recording.start_segments == ()  # started empty
    # the request that ran out of memory is replayed too (PyTorch records no alloc for it)
    assert [(e.action, e.size) for e in trace.events] == [
        ("alloc", 4 * MiB),
        ("alloc", 2 * MiB),
        ("alloc", 40 * MiB),
        ("free", 2 * MiB),
    ]
    report = replay(trace)
    assert report.capacity_bytes == 30 * MiB
    assert [(o.event, o.requested_bytes) for o in report.ooms] == [(2, 40 * MiB)]
    assert report.num_alloc_retries == 1
    assert report.peak_reserved_bytes == report.recorded_peak_reserved_bytes == 20 * MiB
    text = segment_text(_pytorch_style_snapshot()["segments"])  # type: ignore[arg-type]
    assert text.splitlines()[0].endswith("[" + "a" * 9 + "6" + " " * 38 + "]")
    assert text.splitlines()[-1] == (
        "segments: 1, reserved 20.00 MiB, allocated 4.00 MiB, free 16.00 MiB"
    )


def test_cli_replay_and_snapshot_commands(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "run.pickle"
    _record_mid_run(path)
    peak = acc.max_memory_reserved()
    assert cli.main(["replay", str(path), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["recorded_peak_reserved_bytes"] == report["peak_reserved_bytes"] == peak
    assert report["device"] == "sim:0" and report["peak_reserved_difference"] == 0.0
    assert cli.main(["replay", str(path), "--no-progress"]) == 0
    assert f"PyTorch recorded: peak reserved {peak} bytes" in capsys.readouterr().out
    assert cli.main(["snapshot", "summary", str(path)]) == 0
    out = capsys.readouterr().out
    assert "| Reserved memory       |" in out and f"peak reserved of {peak} bytes" in out
    assert cli.main(["snapshot", "segments", str(path)]) == 0
    assert capsys.readouterr().out.splitlines()[-1].startswith("segments: 4, reserved")
    html, png = tmp_path / "v.html", tmp_path / "v.png"
    assert cli.main(["snapshot", "view", str(path), "-o", str(html), "--png", str(png)]) == 0
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "<script src" not in html.read_text() and "http" not in html.read_text().split(
        "<script>"
    )[1].replace("http://www.w3.org/2000/svg", "")
    evil = tmp_path / "evil.pickle"
    evil.write_bytes(pickle.dumps({"segments": [], "device_traces": [], "x": Path("/")}))
    assert cli.main(["snapshot", "view", str(evil), "-o", str(html)]) == 2
    assert "refused: the pickle names global 'pathlib" in capsys.readouterr().err


def test_picture_of_a_recording_whose_first_event_frees_an_older_block(
    tmp_path: Path,
) -> None:
    acc.backends.use("sim")
    older = acc.empty(MiB)
    acc.record_memory_history()
    older.free()
    newer = acc.empty(4096)
    path = tmp_path / "r.pickle"
    acc.dump_snapshot(path)
    view = view_of_snapshot(path)
    assert sorted(view.size.tolist(), reverse=True) == [MiB, 4096]
    assert view.peak_bytes == load(path).peak_live_bytes == MiB  # live before event 0
    assert view.totals().tolist() == [MiB, 0, 4096]  # gone after event 0
    newer.free()


def test_capacity_too_small_for_the_start_state_is_a_clear_error(tmp_path: Path) -> None:
    path = tmp_path / "run.pickle"
    _record_mid_run(path)
    with pytest.raises(ValueError, match=r"the recording began with \d+ bytes reserved, more"):
        replay(load(path), capacity="16MiB")


@pytest.mark.parametrize(
    ("name", "peak", "mallocs"),
    [("streams_midrun", 1_293_942_784, 18), ("streams_expandable", 1_033_895_936, 20)],
)
def test_committed_stream_recordings_replay_exactly(name: str, peak: int, mallocs: int) -> None:
    """tests/data/make_streams_midrun.py: blocks used on other streams go back to their pool
    at free_completed (one requested before the recording began, one still pending at its
    end), and under expandable segments an empty_cache releases whole address ranges that
    other (stream, pool) pairs reserve again; the rewound start is exact either way."""
    path = Path(__file__).parent / "data" / f"{name}.pickle"
    snapshot = pickle.loads(path.read_bytes())
    actions = [e["action"] for e in snapshot["device_traces"][0]]
    assert actions.count("free_completed") > actions.count("free_requested")  # one from before
    assert any(
        b["state"] == "active_pending_free" for s in snapshot["segments"] for b in s["blocks"]
    )
    trace = load(path)
    assert trace.recording is not None and trace.recording.inconsistent_events == 0
    report = replay(trace)
    assert report.peak_reserved_bytes == report.recorded_peak_reserved_bytes == peak
    assert report.num_device_alloc == report.recorded_num_device_alloc == mallocs
    assert report.notes == []


@pytest.mark.parametrize("name", ["streams_midrun.pickle", "streams_expandable.pickle"])
def test_the_rewound_start_is_the_state_recording_began_with(tmp_path: Path, name: str) -> None:
    """The recordings of tests/data made again: the start state rewound from each snapshot is,
    segment by segment and block by block, what the allocator held when history began. Under
    expandable segments the window's empty_cache released ranges that other (stream, pool)
    pairs reserved again; each range goes back to the pair that held it."""
    import sys

    sys.path.insert(0, str(Path(__file__).parent / "data"))
    try:
        import make_streams_midrun as maker
    finally:
        sys.path.pop(0)
    truth = maker.record(tmp_path / name, maker.RECORDINGS[name])
    trace = load(tmp_path / name)
    assert trace.recording is not None and trace.recording.inconsistent_events == 0

    def mapped(blocks: list[tuple[int, int, int]]) -> list[tuple[int, int, int]]:
        return [b for b in blocks if b[2] >= 0]  # (the rewind adds unmapped stretches)

    expected = sorted(
        (s["address"], s["stream"], s["segment_type"] == "small",
         [(b["address"], b["size"], b["requested_size"] if b["state"] != "inactive" else 0)
          for b in s["blocks"]])
        for s in truth
    )  # fmt: skip
    rewound = sorted(
        (s.address, s.stream, s.is_small,
         mapped([(b.address, b.size, b.requested_size) for b in s.blocks]))
        for s in trace.recording.start_segments
    )  # fmt: skip
    assert [row[:3] for row in rewound] == [row[:3] for row in expected]
    assert [row[3] for row in rewound] == [row[3] for row in expected]
