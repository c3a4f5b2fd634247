"""How much faster ``accelrt.sweep`` on the local process scheduler is than the same replays one
after the other.

The sequential baseline is what ``accelrt replay TRACE --device sim --config A --config B ...``
does for each trace: load the trace once, then replay it under each setting, in one process.
A second, looser one is what separate ``accelrt replay TRACE --config S`` runs do: load the trace
for every replay (their process start-up left out).
The sweep runs the same (trace, setting) combinations as Dask tasks on a local pool of processes
(every core by default), loading and replaying in the workers. Both must give the same figures.

Usage::

    python bench/sweep_scaling.py [TRACE_OR_FOLDER ...] [--workers N] [--repeat N]

Without arguments it looks for the real CPU traces in ``$ACCELRT_TRACES/cpu``, then in
``../shared/traces/cpu`` next to the checkout; with none found it says so and exits 0.
Target (issue 15): on a 2-core machine, 5 traces x 5 settings, sweep time <= 0.6 x sequential.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

SETTINGS = [
    "defaults",
    "expandable_segments:True",
    "max_split_size_mb:128",
    "garbage_collection_threshold:0.8",
    "roundup_power2_divisions:4",
]
ROOT = Path(__file__).resolve().parents[1]


def find_traces(given: list[str]) -> list[str]:
    """The traces to use: the ones given (files, or folders of ``*.jsonl.gz``), else the CPU set."""
    candidates = [Path(p) for p in given]
    if not candidates:
        env = os.environ.get("ACCELRT_TRACES")
        if env:
            candidates.append(Path(env) / "cpu")
        candidates += [
            ROOT.parent / "shared" / "traces" / "cpu",
            ROOT / "shared" / "traces" / "cpu",
        ]
        candidates = [next((c for c in candidates if c.is_dir()), Path("/nonexistent"))]
    found: list[str] = []
    for c in candidates:
        if c.is_dir():
            found += sorted(str(p) for p in c.glob("*.jsonl.gz"))
        elif c.is_file():
            found.append(str(c))
    return found


def sequential(traces: list[str]) -> tuple[float, list[int]]:
    """Load each trace once and replay it under each setting, one replay after the other."""
    from accelrt.replay import replay
    from accelrt.trace import load

    peaks = []
    start = time.perf_counter()
    for path in traces:
        trace = load(path)
        for setting in SETTINGS:
            config = "" if setting == "defaults" else setting
            peaks.append(replay(trace, device="sim", config=config).peak_reserved_bytes)
    return time.perf_counter() - start, peaks


def one_by_one(traces: list[str]) -> float:
    """Each combination on its own, as separate ``accelrt replay --config S`` runs do: load the
    trace, replay it once (without the start-up of a new process each time)."""
    from accelrt.replay import replay
    from accelrt.trace import load

    start = time.perf_counter()
    for path in traces:
        for setting in SETTINGS:
            config = "" if setting == "defaults" else setting
            replay(load(path), device="sim", config=config)
    return time.perf_counter() - start


def swept(traces: list[str], workers: int | None) -> tuple[float, list[int]]:
    """The same combinations through ``accelrt.sweep`` on the local process scheduler."""
    import accelrt

    start = time.perf_counter()
    results = accelrt.sweep(traces, SETTINGS, scheduler="processes", num_workers=workers)
    elapsed = time.perf_counter() - start
    errors = [r.error for r in results if r.error]
    if errors:
        raise SystemExit(f"sweep failed: {errors[0]}")
    return elapsed, [r.peak_reserved_bytes or 0 for r in results]  # trace by trace, in order


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("traces", nargs="*", help="trace files or folders (default: the CPU set)")
    parser.add_argument("--workers", type=int, help="processes (default: every core)")
    parser.add_argument("--repeat", type=int, default=1, help="runs of each; the best counts")
    args = parser.parse_args()
    traces = find_traces(args.traces)
    if not traces:
        print(
            "no traces found: pass trace files or a folder, or set ACCELRT_TRACES to a folder "
            "with a cpu/ subfolder (the real traces are not shipped with accelrt)"
        )
        return 0
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    print(f"{len(traces)} traces x {len(SETTINGS)} settings on {cores} cores")
    for t in traces:
        print(f"  {Path(t).name} ({os.path.getsize(t) / 2**20:.1f} MiB)")
    ratios, single_ratios = [], []
    for _ in range(max(1, args.repeat)):
        seq_time, seq_peaks = sequential(traces)
        sweep_time, sweep_peaks = swept(traces, args.workers)
        single_time = one_by_one(traces)
        if seq_peaks != sweep_peaks:
            raise SystemExit("the sweep's peak reserved bytes differ from the sequential replays")
        ratios.append(sweep_time / seq_time)
        single_ratios.append(sweep_time / single_time)
        print(
            f"  run: sequential {seq_time:.2f} s (one load per trace), {single_time:.2f} s (one "
            f"load per replay); sweep {sweep_time:.2f} s: {ratios[-1]:.2f}x, "
            f"{single_ratios[-1]:.2f}x"
        )
    print(
        f"sweep / sequential (one load per trace): median {statistics.median(ratios):.2f}x, "
        f"best {min(ratios):.2f}x (target <= 0.60x on 2 cores); same results: yes"
    )
    print(
        f"sweep / one replay per load (as {len(traces) * len(SETTINGS)} accelrt replay runs, "
        f"without their start-up): median {statistics.median(single_ratios):.2f}x"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
