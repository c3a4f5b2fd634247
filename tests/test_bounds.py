"""Lower bounds (floor, rounded floor, offline plan) and the one-line OOM verdict."""

from __future__ import annotations

import hashlib
import json
import pickle
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from accelrt._bounds import lower_bounds
from accelrt._offline_plan import BEST_FIT, GREEDY_BY_SIZE, _placements, plan
from accelrt._verdict import (
    EXPANDABLE_WITH_MAX_SPLIT,
    fragmentation_summary,
    interaction_warning,
    oom_verdict,
)
from accelrt.cli import main
from accelrt.memory import AllocatorConfig
from accelrt.replay import replay
from accelrt.trace import Trace, TraceEvent, load, write

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "traces" / "transformer_train.jsonl.gz"
MiB = 1 << 20


def _trace(tmp_path: Path, events: list[TraceEvent], name: str = "t") -> Trace:
    path = tmp_path / f"{name}.jsonl.gz"
    write(path, events, {"name": name})
    return load(path)


def _fragmenting(tmp_path: Path) -> Trace:
    """28 MiB live at most, but under the defaults a 12 MiB and a 10 MiB block find no room
    in the 20 MiB segment two freed 6 MiB blocks leave holes in: 42 MiB reserved."""
    return _trace(
        tmp_path,
        [
            TraceEvent("alloc", 0x1000, 6 * MiB, 0),
            TraceEvent("alloc", 0x2000, 6 * MiB, 0),
            TraceEvent("alloc", 0x3000, 6 * MiB, 0),
            TraceEvent("free", 0x1000, 6 * MiB, 0),
            TraceEvent("free", 0x3000, 6 * MiB, 0),
            TraceEvent("alloc", 0x4000, 12 * MiB, 0),
            TraceEvent("alloc", 0x5000, 10 * MiB, 0),
            TraceEvent("free", 0x2000, 6 * MiB, 0),
            TraceEvent("free", 0x4000, 12 * MiB, 0),
            TraceEvent("free", 0x5000, 10 * MiB, 0),
        ],
        "frag",
    )


# --------------------------------------------------------------------------- exact bounds


def test_bounds_of_a_small_trace(tmp_path: Path) -> None:
    trace = _trace(
        tmp_path,
        [
            TraceEvent("alloc", 0x1000, 500, 0),  # A: [0, 2), 512 rounded
            TraceEvent("alloc", 0x2000, 512, 0),  # B: [1, 4)
            TraceEvent("free", 0x1000, 500, 0),
            TraceEvent("alloc", 0x3000, 1000, 0),  # C: [3, 5), 1024 rounded
            TraceEvent("free", 0x2000, 512, 0),
            TraceEvent("free", 0x3000, 1000, 0),
            TraceEvent("alloc", 0x4000, 0, 0),  # zero bytes: PyTorch hands out nothing
        ],
    )
    bounds = lower_bounds(trace, AllocatorConfig())
    assert bounds.peak_live_bytes == trace.peak_live_bytes == 512 + 1000
    assert bounds.peak_live_rounded_bytes == 512 + 1024
    # best fit in start order puts B above A, and C finds only A's 512-byte hole: 2048;
    # greedy by size puts C first, A under it, B above both: 1536, the rounded floor
    assert bounds.planned_peak_bytes == 1536 and bounds.algorithm == GREEDY_BY_SIZE
    start, end, size = [0, 1, 3], [2, 4, 5], [512, 512, 1024]
    peaks = [p.peak_bytes for p in _placements(*map(np.array, (start, end, size)), 8)]
    assert peaks == [2048, 1536]


def test_rounding_follows_the_setting(tmp_path: Path) -> None:
    trace = _trace(
        tmp_path,
        [
            TraceEvent("alloc", 0x1000, 4500, 0),
            TraceEvent("alloc", 0x2000, 3000, 0),
            TraceEvent("free", 0x1000, 4500, 0),
        ],
    )
    plain = lower_bounds(trace, AllocatorConfig())
    assert (plain.peak_live_bytes, plain.peak_live_rounded_bytes) == (7500, 4608 + 3072)
    # four divisions: 4500 rounds up to 5120 (steps of 1024 above 4096); 3000 stays 3072
    coarse = lower_bounds(trace, AllocatorConfig.parse("roundup_power2_divisions:4"))
    assert (coarse.peak_live_bytes, coarse.peak_live_rounded_bytes) == (7500, 5120 + 3072)
    assert coarse.planned_peak_bytes == 5120 + 3072
    # computed once per rounding: another setting that rounds alike shares the result
    assert lower_bounds(trace, AllocatorConfig.parse("expandable_segments:True")) is plain


def test_a_block_never_freed_lives_to_the_end(tmp_path: Path) -> None:
    trace = _trace(
        tmp_path,
        [
            TraceEvent("alloc", 0x1000, 2048, 0),
            TraceEvent("alloc", 0x2000, 1024, 0),
            TraceEvent("free", 0x2000, 1024, 0),
            TraceEvent("alloc", 0x2000, 4096, 0),  # the address again, after its free
        ],
    )
    bounds = lower_bounds(trace, AllocatorConfig())
    assert bounds.peak_live_bytes == bounds.planned_peak_bytes == 2048 + 4096


def _block(addr: int, size: int, requested: int, state: str) -> dict[str, Any]:
    return {"address": addr, "size": size, "requested_size": requested, "state": state}


def _segment(addr: int, blocks: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "device": 0,
        "address": addr,
        "total_size": sum(b["size"] for b in blocks),
        "stream": 0,
        "segment_type": "large",
        "is_expandable": False,
        "blocks": blocks,
    }


def test_a_recordings_starting_blocks_are_live_from_its_start(tmp_path: Path) -> None:
    base, other = 0x7F0000000000, 0x7F0010000000
    snapshot = {  # the end state; a 3 MiB block at base and one of 1000000 bytes predate it
        "segments": [
            _segment(
                base,
                [
                    _block(base, 4 * MiB, 0, "inactive"),
                    _block(base + 4 * MiB, 2 * MiB, 2 * MiB, "active_allocated"),
                    _block(base + 6 * MiB, 14 * MiB, 0, "inactive"),
                ],
            ),
            _segment(
                other,
                [
                    _block(other, MiB, 1_000_000, "active_allocated"),
                    _block(other + MiB, 19 * MiB, 0, "inactive"),
                ],
            ),
        ],
        "device_traces": [
            [
                {"action": "alloc", "addr": base + 4 * MiB, "size": 2 * MiB, "stream": 0},
                {"action": "free_requested", "addr": base, "size": 3 * MiB, "stream": 0},
                {"action": "free_completed", "addr": base, "size": 3 * MiB, "stream": 0},
            ]
        ],
    }
    path = tmp_path / "mid.pickle"
    path.write_bytes(pickle.dumps(snapshot))
    trace = load(path)
    assert trace.recording is not None and len(trace.recording.start_segments) == 2
    bounds = lower_bounds(trace, AllocatorConfig())
    # at the first event: the two starting blocks and the new 2 MiB one
    assert bounds.peak_live_bytes == trace.peak_live_bytes == 3 * MiB + 1_000_000 + 2 * MiB
    assert bounds.peak_live_rounded_bytes == 3 * MiB + 1_000_448 + 2 * MiB
    assert bounds.planned_peak_bytes == bounds.peak_live_rounded_bytes


def _oom_snapshot() -> dict[str, Any]:
    """4 MiB and 2 MiB live in a 20 MiB segment when a 40 MiB request runs out of memory
    with 10 MiB free: a 30 MiB device."""
    base = 0x7F3A00000000
    return {
        "segments": [
            _segment(
                base,
                [
                    _block(base, 4 * MiB, 4 * MiB, "active_allocated"),
                    _block(base + 4 * MiB, 16 * MiB, 0, "inactive"),
                ],
            )
        ],
        "device_traces": [
            [
                {"action": "segment_alloc", "addr": base, "size": 20 * MiB, "stream": 0},
                {"action": "alloc", "addr": base, "size": 4 * MiB, "stream": 0},
                {"action": "alloc", "addr": base + 4 * MiB, "size": 2 * MiB, "stream": 0},
                {"action": "oom", "device_free": 10 * MiB, "size": 40 * MiB, "stream": 0},
                {"action": "free_requested", "addr": base + 4 * MiB, "size": 2 * MiB},
                {"action": "free_completed", "addr": base + 4 * MiB, "size": 2 * MiB},
            ]
        ],
    }


def test_a_request_that_ran_out_counts_at_its_moment(tmp_path: Path) -> None:
    path = tmp_path / "oom.pickle"
    path.write_bytes(pickle.dumps(_oom_snapshot()))
    trace = load(path)
    assert trace.recording is not None and trace.recording.num_ooms == 1
    assert trace.peak_live_bytes == 6 * MiB  # the failed request never held memory
    bounds = lower_bounds(trace, trace.recording.settings)
    assert bounds.peak_live_bytes == bounds.peak_live_rounded_bytes == 46 * MiB
    assert bounds.planned_peak_bytes == 46 * MiB
    report = replay(trace)
    assert report.num_ooms == 1 and report.capacity_bytes == 30 * MiB
    assert report.recorded_num_ooms == 1
    assert oom_verdict([report]) == (
        "verdict: live memory: 48234496 bytes (46.00 MiB) are live at the peak, more than the "
        "31457280 bytes (30.00 MiB) device holds; no allocator setting helps: reduce memory "
        "by at least 16777216 bytes (16.00 MiB)"
    )


# --------------------------------------------------------------------------- the verdict


def test_verdict_live_memory(tmp_path: Path) -> None:
    trace = _fragmenting(tmp_path)
    reports = [replay(trace, capacity="20MiB", config=c) for c in ("", "expandable_segments:True")]
    assert all(r.num_ooms for r in reports)
    assert oom_verdict(reports) == (
        "verdict: live memory: 29360128 bytes (28.00 MiB) are live at the peak, more than the "
        "20971520 bytes (20.00 MiB) device holds; no allocator setting helps: reduce memory "
        "by at least 8388608 bytes (8.00 MiB)"
    )


def test_verdict_fragmentation_names_the_setting_that_fits(tmp_path: Path) -> None:
    trace = _fragmenting(tmp_path)
    defaults, expandable = (
        replay(trace, capacity="41MiB", config=c) for c in ("", "expandable_segments:True")
    )
    assert (defaults.num_ooms, expandable.num_ooms) == (1, 0)
    assert expandable.peak_reserved_bytes == 40 * MiB
    assert oom_verdict([defaults, expandable]) == (
        "verdict: fragmentation: live bytes peak at 29360128 bytes (28.00 MiB), within the "
        "42991616 bytes (41.00 MiB) device, yet defaults ran out of memory; "
        "expandable_segments:True fits with 1048576 bytes (1024.00 KiB) to spare"
    )
    assert oom_verdict([expandable]) is None  # nothing ran out


def test_verdict_fragmentation_when_no_setting_tried_fits(tmp_path: Path) -> None:
    trace = _fragmenting(tmp_path)
    combined = "expandable_segments:True,max_split_size_mb:20"
    reports = [replay(trace, capacity="30MiB", config=c) for c in ("", combined)]
    assert all(r.num_ooms for r in reports)
    assert oom_verdict(reports) == (
        "verdict: fragmentation: live bytes peak at 29360128 bytes (28.00 MiB) and a plan "
        "knowing every lifetime needs 29360128 bytes (28.00 MiB), within the 31457280 bytes "
        "(30.00 MiB) device, but no setting tried fits: the layout runs out, not the live "
        "bytes; try other settings or reduce memory; warning: max_split_size_mb:20,"
        f"expandable_segments:True: {EXPANDABLE_WITH_MAX_SPLIT}"
    )


def test_interaction_warning_only_for_both_options_together() -> None:
    assert interaction_warning(["expandable_segments:True", "max_split_size_mb:128"]) is None
    assert interaction_warning(["max_split_size_mb:128,expandable_segments:True"]) == (
        "max_split_size_mb:128,expandable_segments:True: expandable_segments:True with "
        "max_split_size_mb can reserve more than either alone (examples/traces/"
        "transformer_train.jsonl.gz reserves 346 MiB under each of expandable_segments:True "
        "and max_split_size_mb:128, 506 MiB under both)"
    )


def test_the_shipped_example_shows_the_interaction() -> None:
    trace = load(EXAMPLE)
    peaks = [
        replay(trace, device="sim", config=c).peak_reserved_bytes // MiB
        for c in (
            "expandable_segments:True",
            "max_split_size_mb:128",
            "expandable_segments:True,max_split_size_mb:128",
        )
    ]
    assert peaks == [346, 346, 506]


def test_fragmentation_summary(tmp_path: Path) -> None:
    trace = _fragmenting(tmp_path)
    reports = [replay(trace, config=c) for c in ("", "expandable_segments:True")]
    assert [r.peak_reserved_bytes // MiB for r in reports] == [42, 40]
    assert fragmentation_summary(reports) == (
        "fragmentation costs 14.00 MiB under defaults (peak reserved 42.00 MiB over the "
        "rounded live peak 28.00 MiB); the best setting tried, expandable_segments:True, "
        "recovers 2.00 MiB; perfect foresight needs 28.00 MiB (an offline plan)"
    )
    assert fragmentation_summary(reports[:1]) is None


# --------------------------------------------------------------------------- reports, CLI


def test_replay_report_and_json_carry_the_bounds(capsys: pytest.CaptureFixture[str]) -> None:
    report = replay(load(EXAMPLE), device="sim")
    assert report.floor_live_bytes == report.trace_peak_live_bytes == 341293844
    assert report.floor_rounded_bytes is not None and report.plan_peak_bytes is not None
    assert report.floor_live_bytes <= report.floor_rounded_bytes <= report.plan_peak_bytes
    assert report.plan_peak_bytes < report.peak_reserved_bytes
    assert main(["replay", str(EXAMPLE), "--device", "sim", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["floor_live_bytes"] == 341293844 and data["verdict"] is None
    assert data["plan_peak_bytes"] == report.plan_peak_bytes
    assert data["plan_algorithm"] == report.plan_algorithm


def test_cli_prints_bounds_and_verdict(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    trace = _fragmenting(tmp_path)
    argv = ["replay", str(trace.path), "--device", "sim", "--capacity", "41MiB"]
    argv += ["--config", "defaults", "--config", "expandable_segments:True"]
    assert main(argv) == 0
    out = capsys.readouterr().out
    for row in ("live floor", "rounded floor", "offline plan"):
        assert row in out
    verdict = [line for line in out.splitlines() if line.startswith("verdict: ")]
    assert verdict == [
        oom_verdict(
            [replay(trace, capacity="41MiB", config=c) for c in ("", "expandable_segments:True")]
        )
    ]
    assert main([*argv, "--json"]) == 0
    assert {r["verdict"] for r in json.loads(capsys.readouterr().out)} == set(verdict)


# --------------------------------------------------------------------------- the plan


@st.composite
def _lifetimes(draw: st.DrawFn) -> tuple[list[int], list[int], list[int]]:
    """Blocks from a random run of allocs and frees (some live from before it, some never
    freed), as ``(start, end, size)`` lists."""
    sizes = st.one_of(st.integers(1, 5000), st.sampled_from([512, 1024, 4096, 3 << 20]))
    start: list[int] = []
    end: list[int | None] = []
    size: list[int] = []
    for _ in range(draw(st.integers(0, 3))):
        start.append(-1)
        end.append(None)
        size.append(draw(sizes))
    steps = draw(st.integers(1, 50))
    for t in range(steps):
        live = [i for i, e in enumerate(end) if e is None and start[i] < t]
        if live and draw(st.booleans()):
            end[draw(st.sampled_from(live))] = t
        else:
            start.append(t)
            end.append(None)
            size.append(draw(sizes))
    return start, [steps if e is None else e for e in end], size


@settings(max_examples=200, deadline=None)
@given(blocks=_lifetimes(), greedy_blocks=st.integers(0, 12))
def test_every_placement_is_real_and_above_the_live_peak(
    blocks: tuple[list[int], list[int], list[int]], greedy_blocks: int
) -> None:
    start, end, size = blocks
    arrays = [np.array(a, dtype=np.int64) for a in blocks]
    live_peak = max(
        sum(z for s, e, z in zip(start, end, size, strict=True) if s <= t < e) for t in start
    )
    placements = _placements(*arrays, greedy_blocks)
    for placed in placements:
        offsets = placed.offsets.tolist()
        assert placed.peak_bytes == max(o + z for o, z in zip(offsets, size, strict=True))
        assert placed.peak_bytes >= live_peak
        for i in range(len(size)):
            for j in range(i):
                if start[i] < end[j] and start[j] < end[i]:  # alive at once: apart in memory
                    assert offsets[i] + size[i] <= offsets[j] or offsets[j] + size[j] <= offsets[i]
    best = plan(*arrays, greedy_blocks=greedy_blocks)
    assert best.peak_bytes == min(p.peak_bytes for p in placements)
    assert best.algorithm in (BEST_FIT, GREEDY_BY_SIZE)


def _seeded_blocks(
    seed: int, n: int, long_share: float
) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64], npt.NDArray[np.int64]]:
    """``n`` blocks in start order, most living under 20 moments, ``long_share`` of them up
    to ``n``, of sizes from 512 bytes to 160 MiB."""
    rng = np.random.default_rng(seed)
    start = np.sort(rng.integers(0, n, n))
    life = np.where(rng.random(n) < long_share, rng.integers(1, n, n), rng.integers(1, 20, n))
    size = rng.choice([512, 1024, 4096, 3 << 20, 20 << 20], n) * rng.integers(1, 9, n)
    return start, start + life, size


@pytest.mark.parametrize(
    ("seed", "n", "long_share", "greedy_blocks", "expected"),
    [  # the peak and the offsets' sha256 of best fit, then of greedy by size
        (1, 3000, 0.05, 300, "2962243584 98dc8f1551de 2888099328 ef6edc0b8720"),
        (2, 3000, 0.3, 1000, "11222949376 36ba3f1e65e4 11030862336 e6df3ce8fb7b"),
        (3, 6000, 0.01, 2000, "1628490752 8c2f00f7412c 1510243328 393bb36072c9"),
        (4, 2000, 0.5, 50, "11739995648 ca86df1dabc7 11911834624 ffb0c0b5df7a"),
    ],
)
def test_placements_stay_the_same(
    seed: int, n: int, long_share: float, greedy_blocks: int, expected: str
) -> None:
    """The offsets of both heuristics on seeded blocks, pinned: making the plan faster must
    not move a block (many blocks keep clear of hundreds of large ones still to come, and
    some of them go above the top)."""
    placements = _placements(*_seeded_blocks(seed, n, long_share), greedy_blocks)
    found = [
        f"{p.peak_bytes} {hashlib.sha256(p.offsets.tobytes()).hexdigest()[:12]}" for p in placements
    ]
    assert " ".join(found) == expected


def test_plan_refuses_what_it_cannot_place() -> None:
    with pytest.raises(ValueError, match="differ in length"):
        plan([0], [1, 2], [1])
    with pytest.raises(ValueError, match="positive size"):
        plan([0], [1], [0])
    with pytest.raises(ValueError, match="end > start"):
        plan([3], [3], [1])
    with pytest.raises(ValueError, match="2\\*\\*63"):
        plan([0, 0], [1, 1], [1 << 62, 1 << 62])
    with pytest.raises(ValueError, match="greedy_blocks"):
        plan([0], [1], [1], greedy_blocks=-1)
    with pytest.raises(ValueError, match="integers"):
        plan([0.5], [1], [1])
    assert plan([], [], []).peak_bytes == 0
