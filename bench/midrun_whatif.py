"""Mid-run what-if: how far a snapshot's answer for another setting is from the whole run's.

The experiment of issue 21, on every CPU trace in ``--traces``:

1. Run the trace (device view) through a fresh caching allocator on the simulated device with
   the default settings; start recording history at the first phase boundary past a quarter of
   its events (``record_memory_history()`` mid-run) and take a snapshot at the end, exactly as
   ``accelrt.dump_snapshot`` would write it.
2. For each setting: replay that snapshot with ``--config SETTING`` (the estimate) and replay the
   whole trace from an empty start with the same setting (the truth, the peer measured in the
   same run). Print both peaks and the relative error.

The recorded setting (the defaults) must be exact; every other answer within ``--tolerance``
(1%). Exit status 1 when an answer misses. ``--settings held-out`` runs the five settings the
start-state model was not chosen on (docs/snapshot-replay.md, "What a recording cannot tell");
``--fraction`` moves the cut.

    python bench/midrun_whatif.py [--traces DIR] [--start modelled|recorded] [--json]
                                  [--settings issue|held-out] [--fraction 0.25]
"""

from __future__ import annotations

import argparse
import gzip
import json
import pickle
import sys
import tempfile
from pathlib import Path
from typing import Any

from accelrt.backends.sim import SimBackend
from accelrt.memory import AllocatorConfig, CachingAllocator
from accelrt.replay import replay
from accelrt.trace import load

ROOT = Path(__file__).resolve().parent.parent
TRACES = ROOT.parent / "shared" / "traces" / "cpu"
SETTINGS = {
    "issue": (
        "expandable_segments:True",
        "max_split_size_mb:128",
        "roundup_power2_divisions:4",
    ),
    "held-out": (
        "max_split_size_mb:256",
        "roundup_power2_divisions:2",
        "max_split_size_mb:64",
        "roundup_power2_divisions:8",
        "expandable_segments:True,max_split_size_mb:128",
    ),
}


def cut_index(path: Path, fraction: float = 0.25) -> tuple[int, str]:
    """The device-view event index of the first phase boundary past ``fraction`` of the events.

    Phases in the header count every event of the file; host-only events are dropped from the
    device view, so the boundary is re-counted over the device events before it.
    """
    header_path = path.with_name(path.name.replace(".jsonl.gz", ".header.json"))
    phases = json.loads(header_path.read_text())["phases"]
    total = phases[-1]["end"]
    phase = next(p for p in phases if p["first"] >= fraction * total)
    device_events = 0
    with gzip.open(path, "rt") as f:
        next(f)  # the header line
        for i, line in enumerate(f):
            if i == phase["first"]:
                break
            if '"host"' not in line or not json.loads(line).get("host"):
                device_events += 1
    return device_events, phase["phase"]


def record_mid_run(path: Path, cut: int, out: Path) -> int:
    """Run ``path`` on ``sim`` with the defaults, history from event ``cut``; write a snapshot.

    Returns the bytes reserved when recording began.
    """
    trace = load(path)
    allocator = CachingAllocator(SimBackend(device_count=1, capacity=1 << 50), 0, AllocatorConfig())
    live: dict[int, Any] = {}
    reserved_at_cut = 0
    for i, (action, addr, size, _) in enumerate(trace.events):
        if i == cut:
            reserved_at_cut = allocator.reserved_bytes
            allocator.record_history("all", None, sys.maxsize)
        if action == "alloc" and size > 0:
            live[addr] = allocator.malloc(size, 0)
        elif action == "free" and addr in live:
            allocator.free(live.pop(addr))
        elif action == "empty_cache":
            allocator.empty_cache()
    segments, entries = allocator.snapshot()
    snapshot = {
        "segments": segments,
        "device_traces": [entries],
        "allocator_settings": AllocatorConfig().to_torch_settings(),
    }
    with open(out, "wb") as f:
        pickle.dump(snapshot, f, protocol=4)
    return reserved_at_cut


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--traces", type=Path, default=TRACES)
    parser.add_argument("--tolerance", type=float, default=0.01)
    parser.add_argument("--json", action="store_true", help="print the rows as JSON")
    parser.add_argument("--settings", choices=sorted(SETTINGS), default="issue")
    parser.add_argument("--fraction", type=float, default=0.25, help="cut past this share")
    parser.add_argument(
        "--start",
        choices=("modelled", "recorded"),
        default="modelled",
        help="how the snapshot's replays build their start state (recorded: as before issue 21)",
    )
    args = parser.parse_args()
    paths = sorted(args.traces.glob("*.jsonl.gz"))
    if not paths:
        print(f"no traces in {args.traces}", file=sys.stderr)
        return 2
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for path in paths:
            name = path.name.removesuffix(".jsonl.gz")
            cut, phase = cut_index(path, args.fraction)
            snap = Path(tmp) / f"{name}.pickle"
            reserved_at_cut = record_mid_run(path, cut, snap)
            whole, window = load(path), load(snap)
            for setting in ("defaults", *SETTINGS[args.settings]):
                config = "" if setting == "defaults" else setting
                truth = replay(whole, config=config).peak_reserved_bytes
                report = replay(window, config=config, start=args.start)
                estimate = report.peak_reserved_bytes
                low = report.peak_reserved_low_bytes
                high = report.peak_reserved_high_bytes
                rows.append(
                    {
                        "trace": name,
                        "cut_phase": phase,
                        "cut_event": cut,
                        "reserved_at_cut_bytes": reserved_at_cut,
                        "setting": setting,
                        "truth_bytes": truth,
                        "estimate_bytes": estimate,
                        "error": estimate / truth - 1.0,
                        "low_bytes": low,
                        "high_bytes": high,
                        "in_range": None if low is None else low <= truth <= (high or 0),
                    }
                )
    if args.json:
        print(json.dumps(rows, indent=1))
    else:
        head = f"{'trace':<24} {'cut':<12} {'setting':<46} {'truth':>14} {'estimate':>14}"
        print(f"{head} {'error':>8}  range (start state)")
        for r in rows:
            span = (
                f"{r['low_bytes'] / r['truth_bytes'] - 1:+.1%} .. "
                f"{r['high_bytes'] / r['truth_bytes'] - 1:+.1%}"
                f"{'' if r['in_range'] else '  (truth outside)'}"
                if r["low_bytes"] is not None
                else "exact"
            )
            print(
                f"{r['trace']:<24} {r['cut_phase']:<12} {r['setting']:<46} "
                f"{r['truth_bytes']:>14,} {r['estimate_bytes']:>14,} {r['error']:>+8.2%}  {span}"
            )
    misses = [
        r
        for r in rows
        if (r["error"] != 0.0 if r["setting"] == "defaults" else abs(r["error"]) > args.tolerance)
    ]
    within = sum(
        1 for r in rows if r["setting"] != "defaults" and abs(r["error"]) <= args.tolerance
    )
    others = [r for r in rows if r["setting"] != "defaults"]
    print(
        f"\n{within} of {len(others)} other-setting answers within {args.tolerance:.0%} "
        f"(largest error {max(abs(r['error']) for r in others):.2%}); truth inside the reported "
        f"range on {sum(bool(r['in_range']) for r in others)} of "
        f"{sum(r['in_range'] is not None for r in others)} modelled; recorded setting "
        f"exact on {sum(r['setting'] == 'defaults' and r['error'] == 0 for r in rows)} of "
        f"{len(paths)}"
    )
    return 1 if misses else 0


if __name__ == "__main__":
    sys.exit(main())
