"""What-ifs on recordings that began mid-run: the start state under another setting."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

import accelrt as acc
from accelrt import cli
from accelrt._start_state import (
    cached_free_blocks,
    calibrated_share,
    decides_alike,
    largest_size,
)
from accelrt.memory import AllocatorConfig
from accelrt.replay import replay
from accelrt.trace import Trace, load

MiB = 1 << 20


def _periodic_run(steps: int, record_from: int, seed: int = 7) -> None:
    """A training-like loop on ``sim``: weights, then steps of activations; history from a step."""
    rng = random.Random(seed)
    acc.backends.use("sim")
    if record_from < 0:
        acc.record_memory_history()
    weights = [acc.empty(rng.randint(1, 40) * MiB + rng.randint(0, 4096)) for _ in range(12)]
    for step in range(steps):
        if step == record_from:
            acc.record_memory_history()
        acts = [acc.empty(rng.randint(1, 90) * MiB + rng.randint(0, 9999)) for _ in range(25)]
        temps = [acc.empty(rng.randint(100, 600_000)) for _ in range(30)]
        for t in temps:
            t.free()
        while acts:
            acts.pop(rng.randrange(len(acts))).free()
    assert weights  # live to the end


def _recording(tmp_path: Path, record_from: int = 2) -> Trace:
    _periodic_run(6, record_from)
    path = tmp_path / "run.pickle"
    acc.dump_snapshot(path)
    return load(path)


def test_recorded_setting_replays_the_recorded_start_exactly(tmp_path: Path) -> None:
    trace = _recording(tmp_path)
    assert trace.recording is not None and trace.recording.reserved_at_start_bytes > 0
    report = replay(trace)
    assert report.start_state == "recorded"
    assert report.peak_reserved_bytes == trace.recording.peak_reserved_bytes
    assert report.reserved_before_recording_bytes == trace.recording.reserved_at_start_bytes
    assert report.peak_reserved_low_bytes is None and report.start_transient_share is None
    # an explicit setting equal to the recorded one is the recorded setting
    assert replay(trace, config="defaults").start_state == "recorded"


def test_another_setting_starts_from_a_modelled_state_with_its_range(tmp_path: Path) -> None:
    trace = _recording(tmp_path)
    recording = trace.recording
    assert recording is not None
    report = replay(trace, config="expandable_segments:True")
    assert report.start_state == "modelled"
    assert report.start_transient_share is not None and 0 <= report.start_transient_share <= 1
    low, high = report.peak_reserved_low_bytes, report.peak_reserved_high_bytes
    assert low is not None and high is not None
    assert low <= report.peak_reserved_bytes <= high
    assert report.start_cached_bytes == sum(size for size, _, _ in cached_free_blocks(recording))
    assert "cached bytes taken as live" in report.describe_start()
    # the range's ends are the model with none and with every cached byte held
    none = replay(trace, config="expandable_segments:True")
    assert (none.peak_reserved_low_bytes, none.peak_reserved_high_bytes) == (low, high)
    # --start recorded keeps the recorded layout: today's answer, no range
    kept = replay(trace, config="expandable_segments:True", start="recorded")
    assert kept.start_state == "recorded" and kept.peak_reserved_low_bytes is None


def test_the_model_is_calibrated_on_the_recorded_peak(tmp_path: Path) -> None:
    """Under the recorded setting, the calibrated model reaches the recorded peak, and a share
    one step smaller does not (the smallest share that does)."""
    from accelrt.backends.sim import SimBackend
    from accelrt.replay import _Run

    trace = _recording(tmp_path)
    recording = trace.recording
    assert recording is not None
    replay(trace, config="expandable_segments:True")  # calibrates

    def peak(share: float) -> int:
        run = _Run(trace, SimBackend(device_count=1), 0, recording.settings, share)
        return run.execute()["reserved_bytes.all.peak"]

    share = calibrated_share(recording, peak)  # kept: no run
    assert peak(share) >= recording.peak_reserved_bytes
    if share > 0:
        assert peak(share - 1 / 4096) < recording.peak_reserved_bytes


def test_a_recording_from_an_empty_start_is_exact_under_every_setting(tmp_path: Path) -> None:
    trace = _recording(tmp_path, record_from=-1)
    assert trace.recording is not None and trace.recording.start_segments == ()
    report = replay(trace, config="roundup_power2_divisions:4")
    assert report.start_state == "empty" and report.reserved_before_recording_bytes == 0
    assert report.peak_reserved_low_bytes is None


def test_settings_that_decide_alike_keep_the_recorded_start(tmp_path: Path) -> None:
    defaults = AllocatorConfig()
    assert decides_alike(defaults, AllocatorConfig.coerce("release_lock_on_malloc:True"), 1 << 40)
    split = AllocatorConfig.coerce("max_split_size_mb:128")
    assert decides_alike(defaults, split, 128 * MiB - 1)
    assert not decides_alike(defaults, split, 128 * MiB)
    rounding = AllocatorConfig.coerce("roundup_power2_divisions:[256:1,>:4]")
    assert decides_alike(defaults, rounding, 512 * MiB - 1)  # slots up to 256 MiB unchanged
    assert not decides_alike(defaults, rounding, 512 * MiB)
    assert not decides_alike(defaults, AllocatorConfig.coerce("expandable_segments:True"), 0)
    trace = _recording(tmp_path)
    assert trace.recording is not None
    largest = largest_size(trace.recording, int(trace.events.size.max()))
    assert largest < 128 * MiB  # the run's segments and requests are all below 128 MiB
    report = replay(trace, config="max_split_size_mb:128")
    assert report.start_state == "recorded"
    assert report.peak_reserved_bytes == trace.recording.peak_reserved_bytes


def test_a_start_the_setting_cannot_hold_is_a_clear_error(tmp_path: Path) -> None:
    trace = _recording(tmp_path)
    recording = trace.recording
    assert recording is not None
    live = sum(
        b.requested_size for s in recording.start_segments for b in s.blocks if b.requested_size > 0
    )
    capacity = (live // (2 * MiB)) * 2 * MiB  # below the live bytes
    with pytest.raises(
        ValueError,
        match=rf"began with {live:,} bytes live; sim:0 ran out after placing [0-9,]+ of them .*"
        r"under setting 'expandable_segments:True'; give a larger capacity",
    ):
        replay(trace, config="expandable_segments:True", capacity=capacity)


def test_cli_says_the_recording_started_mid_run(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    trace = _recording(tmp_path)
    assert trace.recording is not None
    path = str(tmp_path / "run.pickle")
    argv = ["replay", path, "--config", "defaults", "--config", "expandable_segments:True"]
    assert cli.main(argv) == 0
    out = capsys.readouterr().out
    before = trace.recording.reserved_at_start_bytes
    assert f"The recording started mid-run: {before} bytes" in out
    assert "[defaults] start state recorded" in out
    assert "[expandable_segments:True] start state modelled" in out
    assert "start-state range" in out
    assert out.count("; accelrt: ") == 1  # the recorded setting: a replay, its difference
    assert out.count("; this setting (a what-if): ") == 1  # the other: a change
    assert cli.main([*argv, "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    reports = data if isinstance(data, list) else data["reports"]
    assert [r["start_state"] for r in reports] == ["recorded", "modelled"]
    assert reports[1]["peak_reserved_low_bytes"] <= reports[1]["peak_reserved_bytes"]
    diff = [
        "snapshot",
        "diff",
        path,
        "--config",
        "defaults",
        "--config",
        "expandable_segments:True",
    ]
    assert cli.main(diff) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[-2:] == [
        "A start state: recorded (the recording's own segments and blocks)",
        f"B start state: {reports[1]['start_state']} (live blocks re-placed; "
        f"{reports[1]['start_transient_share']:.1%} of the {reports[1]['start_cached_bytes']:,} "
        "cached bytes taken as live before the first event)",
    ]
    assert (
        cli.main(["replay", path, "--config", "expandable_segments:True", "--start", "recorded"])
        == 0
    )
    assert "start state recorded" in capsys.readouterr().out


def test_cli_reports_the_settings_that_can_hold_the_start(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A setting whose start cannot be rebuilt within the capacity is one error line naming it;
    the settings that can are still reported; the exit status is 2."""
    trace = _recording(tmp_path)
    recording = trace.recording
    assert recording is not None
    path = str(tmp_path / "run.pickle")
    recorded = replay(trace, config="defaults", start="recorded", capacity=1 << 40)
    modelled = replay(trace, config="expandable_segments:True", capacity=1 << 40)
    # between what the modelled start needs and what the recorded layout holds
    assert modelled.peak_reserved_low_bytes is not None
    live = sum(
        b.requested_size for s in recording.start_segments for b in s.blocks if b.requested_size > 0
    )
    capacity = recording.reserved_at_start_bytes - 2 * MiB
    assert live < capacity < recorded.reserved_before_recording_bytes
    argv = ["replay", path, "--capacity", str(capacity), "--config", "defaults",
            "--config", "expandable_segments:True"]  # fmt: skip
    assert cli.main(argv) == 2
    captured = capsys.readouterr()
    assert captured.err.count("error: ") == 1
    assert "under setting 'defaults'; give a larger capacity" in captured.err
    assert "start state modelled" in captured.out and "[defaults]" not in captured.out


def test_readme_midrun_example_prints_what_the_readme_shows(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Every line the README shows of the two-device mid-run example is in the real output."""
    root = Path(__file__).resolve().parents[1]
    text = (root / "README.md").read_text()
    block = text.split("$ accelrt replay examples/traces/two_device_midrun.pickle", 1)[1]
    shown = block.split("```", 1)[0].splitlines()[2:]  # after the command's two lines
    example = str(root / "examples" / "traces" / "two_device_midrun.pickle")
    argv = ["replay", example, "--capacity", "340MiB", "--config", "defaults",
            "--config", "expandable_segments:True"]  # fmt: skip
    assert cli.main(argv) == 0
    out = capsys.readouterr().out.splitlines()
    kept = [line.strip() for line in shown if line.strip() not in ("...", "")]
    kept = [line for line in kept if not line.startswith("(device 1")]
    assert len(kept) == 15
    assert all(line in (o.strip() for o in out) for line in kept), [
        line for line in kept if line not in (o.strip() for o in out)
    ]


def test_the_page_says_the_recording_started_mid_run(tmp_path: Path) -> None:
    from accelrt.view import view_of_snapshot

    trace = _recording(tmp_path)
    assert trace.recording is not None
    view = view_of_snapshot(tmp_path / "run.pickle")
    before = acc.format_bytes(trace.recording.reserved_at_start_bytes)
    assert any(
        note.startswith(f"the recording started mid-run, with {before} reserved before its")
        and "start state recorded" in note
        for note in view.notes
    ), view.notes


def test_sweep_takes_the_start_too(tmp_path: Path) -> None:
    pytest.importorskip("dask.distributed", reason="the sweep needs Dask (the test extra has it)")
    from accelrt import sweep

    trace = _recording(tmp_path)
    assert trace.recording is not None
    path = str(tmp_path / "run.pickle")
    kw = {"scheduler": "synchronous", "recorded": False}
    modelled = sweep(path, ["expandable_segments:True"], **kw)
    kept = sweep(path, ["expandable_segments:True"], start="recorded", **kw)
    [m], [k] = modelled, kept
    assert m.report is not None and k.report is not None
    assert m.report.start_state == "modelled" and k.report.start_state == "recorded"
    expected = replay(trace, config="expandable_segments:True", start="recorded")
    assert k.report.peak_reserved_bytes == expected.peak_reserved_bytes
    with pytest.raises(ValueError, match="start must be 'modelled' or 'recorded', got 'x'"):
        sweep(path, start="x", **kw)


def _run_program(program: list[tuple[str, ...]], config: str, path: Path | None = None) -> int:
    """Run ``program`` through a fresh allocator on ``sim`` under ``config``; return its peak
    reserved bytes. Steps: ``("alloc", name, bytes)``, ``("free", name)``, ``("record",)``
    (history from here on). With ``path``, the run's snapshot is written there, as
    ``dump_snapshot`` writes one."""
    import pickle

    from accelrt.backends.sim import SimBackend
    from accelrt.memory import CachingAllocator

    settings = AllocatorConfig.coerce(config)
    allocator = CachingAllocator(SimBackend(device_count=1), 0, settings)
    live = {}
    for step in program:
        if step[0] == "alloc":
            live[step[1]] = allocator.malloc(int(step[2]), 0)
        elif step[0] == "free":
            allocator.free(live.pop(step[1]))
        else:
            allocator.record_history("all", None, 1 << 20)
    peak = allocator.memory_stats()["reserved_bytes.all.peak"]
    if path is not None:
        segments, entries = allocator.snapshot()
        snapshot = {
            "segments": segments,
            "device_traces": [entries],
            "allocator_settings": settings.to_torch_settings(),
        }
        path.write_bytes(pickle.dumps(snapshot, protocol=4))
    return peak


_WINDOW = [("record",), ("alloc", "w", MiB), ("free", "w")]
_TWINS = {  # setting: (first prefix, second prefix, their peaks reserved under the setting)
    # under the defaults both leave a cached 100 MiB and a cached 200 MiB segment; expandable
    # segments map both at once in the first, but grow one range from 100 to 200 in the second
    "expandable_segments:True": (
        [("alloc", "a", 100 * MiB), ("alloc", "b", 200 * MiB), ("free", "a"), ("free", "b")],
        [("alloc", "a", 100 * MiB), ("free", "a"), ("alloc", "b", 200 * MiB), ("free", "b")],
        (302 * MiB, 202 * MiB),  # the window's 1 MiB takes a 2 MiB small segment
    ),
    # under the defaults both leave one cached 100 MiB segment; with a 64 MiB split limit the
    # 40 MiB requests of the second cannot use the oversize segment and get segments of their own
    "max_split_size_mb:64": (
        [("alloc", "a", 100 * MiB), ("free", "a")],
        [
            ("alloc", "a", 100 * MiB),
            ("free", "a"),
            ("alloc", "b", 40 * MiB),
            ("alloc", "c", 40 * MiB),
            ("free", "b"),
            ("free", "c"),
        ],
        (102 * MiB, 182 * MiB),
    ),
}


@pytest.mark.parametrize("setting", sorted(_TWINS))
def test_one_recording_can_come_from_runs_that_differ_under_another_setting(
    tmp_path: Path, setting: str
) -> None:
    """Why a mid-run what-if cannot be exact (docs/snapshot-replay.md, "What a recording cannot
    tell"): two programs whose unrecorded parts differ leave byte-identical recordings under the
    defaults, yet need different memory under ``setting``. Any answer computed from the
    recording is the same for both, so it is wrong for at least one."""
    *prefixes, peaks = _TWINS[setting]
    first, second = (prefix + _WINDOW for prefix in prefixes)
    for program, name in ((first, "first"), (second, "second")):
        _run_program(program, "", tmp_path / f"{name}.pickle")
    a, b = load(tmp_path / "first.pickle"), load(tmp_path / "second.pickle")
    assert a.recording is not None and b.recording is not None
    assert a.recording.start_segments == b.recording.start_segments
    assert a.recording.start_segments  # started mid-run, with cached segments
    assert a.events == b.events
    estimate = replay(a, config=setting)
    assert replay(b, config=setting).peak_reserved_bytes == estimate.peak_reserved_bytes
    # the recording cannot tell which of the two it was: one answer, two truths far apart
    assert (_run_program(first, setting), _run_program(second, setting)) == peaks
