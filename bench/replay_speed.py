"""Replay speed: the columnar loader and loop against the per-event ones, same run.

Three measurements, each printed with its ratio against the peer:

1. **The replay loop**, events per second, on every CPU trace in ``--traces`` (target: 3 M/s
   or more). The peer is the replay loop as first written (``replay._run_events_reference``,
   a ``TraceEvent`` tuple per event), run through the same allocator in the same process.
   Wall-clock rates are what ``ReplayReport.events_per_second`` says; process CPU rates are
   printed beside them because wall clocks on a shared 2-core box are noisy.
2. **A whole ``accelrt replay`` process** of ``llama_generate_kvcache`` on the simulated device
   (target: at most half the peer's time). The peer is the same command at
   ``--baseline-rev`` (default b50b1ed, the commit before the columnar trace path), run from a
   temporary ``git worktree`` with ``PYTHONPATH`` pointing at its ``src``; best of
   ``--repeats`` each, interleaved.
3. **Peak memory per event** of loading and replaying a trace of 3 M device events made by
   repeating ``llama_generate_kvcache`` (each copy frees what it leaves live, so every copy
   replays like the first) in a temporary directory (target: 60 bytes an event or less).
   Measured in a fresh process as peak RSS minus RSS before loading. The peer is the
   reference loader (``trace._jsonl._load_jsonl_reference``) with the reference loop.

    python bench/replay_speed.py [--traces DIR] [--repeats 3] [--baseline-rev REV]
                                 [--events 3000000] [--quick]

``--quick`` leaves out the slow peers of 2 and 3 (minutes on a busy machine).
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from accelrt import replay as replay_module
from accelrt.trace import OP_ALLOC, OP_FREE, load

ROOT = Path(__file__).resolve().parent.parent
TRACES = ROOT.parent / "shared" / "traces" / "cpu"
TARGET_EVENTS_PER_SECOND = 3e6
WHOLE = "llama_generate_kvcache"

_MEMORY_CHILD = """
import os, resource, sys, time
from accelrt import replay as R
from accelrt.trace import _jsonl as F
reference = sys.argv[2] == "reference"
page = os.sysconf("SC_PAGE_SIZE")
def rss():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * page
before = rss()
start = time.perf_counter()
trace = (F._load_jsonl_reference if reference else F.load_jsonl)(sys.argv[1])
loaded = time.perf_counter()
if reference:
    R._run_events = R._run_events_reference
report = R.replay(trace, device="sim")
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
print(report.events, before, peak, loaded - start, report.wall_seconds)
"""


def loop_rates(trace: Any, loop: Any, repeats: int) -> tuple[float, float]:
    """Best wall-clock and CPU events/s of ``replay`` with ``loop`` as its replay loop."""
    fast = replay_module._run_events
    replay_module._run_events = loop
    try:
        best_wall = best_cpu = 0.0
        for _ in range(repeats):
            cpu = time.process_time()
            report = replay_module.replay(trace, device="sim")
            cpu = time.process_time() - cpu
            best_wall = max(best_wall, report.events_per_second)
            best_cpu = max(best_cpu, report.events / cpu if cpu > 0 else 0.0)
        return best_wall, best_cpu
    finally:
        replay_module._run_events = fast


def bench_loop(traces: Path, repeats: int) -> None:
    print("1. replay loop, events/s (sim device, default settings)")
    row = "{:<26} {:>9} {:>11} {:>11} {:>11} {:>11} {:>7} {:>7}"
    print(
        row.format("trace", "events", "new wall", "new cpu", "old wall", "old cpu", "x old", "3M/s")
    )
    for path in sorted(traces.glob("*.jsonl.gz")):
        trace = load(path)
        new_wall, new_cpu = loop_rates(trace, replay_module._run_events, repeats)
        old_wall, old_cpu = loop_rates(trace, replay_module._run_events_reference, 1)
        print(
            row.format(
                trace.name[:26],
                len(trace.events),
                f"{new_wall / 1e6:.2f} M",
                f"{new_cpu / 1e6:.2f} M",
                f"{old_wall / 1e6:.2f} M",
                f"{old_cpu / 1e6:.2f} M",
                f"{new_wall / old_wall:.2f}",
                "met" if new_wall >= TARGET_EVENTS_PER_SECOND else "no",
            )
        )


def _time_process(argv: list[str], env: dict[str, str]) -> float:
    start = time.perf_counter()
    subprocess.run(argv, env=env, check=True, stdout=subprocess.DEVNULL)
    return time.perf_counter() - start


def bench_whole(traces: Path, repeats: int, baseline_rev: str | None) -> None:
    path = traces / f"{WHOLE}.jsonl.gz"
    argv = [sys.executable, "-m", "accelrt.cli", "replay", str(path), "--device", "sim"]
    argv += ["--no-progress", "--json"]
    env = dict(os.environ)
    print(f"\n2. whole `accelrt replay {WHOLE} --device sim` process, seconds (best of {repeats})")
    worktree = None
    if baseline_rev:
        worktree = Path(tempfile.mkdtemp(prefix="accelrt_base_")) / "tree"
        made = subprocess.run(
            ["git", "-C", str(ROOT), "worktree", "add", "--detach", str(worktree), baseline_rev],
            capture_output=True,
            text=True,
        )
        if made.returncode != 0:
            print(f"   (no peer: cannot check out {baseline_rev}: {made.stderr.strip()})")
            worktree = None
    try:
        new_times: list[float] = []
        old_times: list[float] = []
        for _ in range(repeats):
            new_times.append(_time_process(argv, env))
            if worktree is not None:
                old_env = {**env, "PYTHONPATH": str(worktree / "src")}
                old_times.append(_time_process(argv, old_env))
        new = min(new_times)
        if old_times:
            old = min(old_times)
            verdict = "met" if new <= old / 2 else "no"
            print(
                f"   new {new:.2f} s   old ({baseline_rev}) {old:.2f} s   "
                f"x old {new / old:.2f}   target <= 0.50: {verdict}"
            )
        else:
            print(f"   new {new:.2f} s")
    finally:
        if worktree is not None:
            subprocess.run(
                ["git", "-C", str(ROOT), "worktree", "remove", "--force", str(worktree)],
                capture_output=True,
            )


def repeated_trace(source: Path, out: Path, device_events: int) -> int:
    """Write ``source`` repeated until it has ``device_events`` device events; return copies.

    Each copy ends with frees of what it leaves live, so the next one starts empty.
    """
    every = load(source, include_host=True)
    device = len(load(source).events)
    ev = every.events
    alive: dict[int, tuple[int, int]] = {}
    for op, addr, size, stream in zip(
        ev.op.tolist(), ev.addr.tolist(), ev.size.tolist(), ev.stream.tolist(), strict=True
    ):
        if op == OP_ALLOC:
            alive[addr] = (size, stream)
        elif op == OP_FREE:
            alive.pop(addr, None)
    closing = "".join(
        json.dumps({"action": "free", "addr": a, "size": s, "stream": st}, separators=(",", ":"))
        + "\n"
        for a, (s, st) in alive.items()
    )
    copies = -(-device_events // (device + len(alive)))
    with gzip.open(source, "rt", encoding="utf-8") as f:
        header = f.readline()
        body = f.read()
    if not body.endswith("\n"):
        body += "\n"
    with gzip.open(out, "wt", encoding="utf-8", compresslevel=1) as f:
        f.write(header)
        for _ in range(copies):
            f.write(body)
            f.write(closing)
    return copies


def _memory_run(path: Path, which: str) -> tuple[int, float, float, float]:
    done = subprocess.run(
        [sys.executable, "-c", _MEMORY_CHILD, str(path), which],
        check=True,
        capture_output=True,
        text=True,
    )
    events, before, peak, load_s, replay_s = done.stdout.split()
    per_event = (int(peak) - int(before)) / int(events)
    return int(events), per_event, float(load_s), float(replay_s)


def bench_memory(traces: Path, device_events: int, peer: bool) -> None:
    print(f"\n3. peak memory of load + replay, {device_events / 1e6:.0f} M device events")
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "repeated.jsonl.gz"
        copies = repeated_trace(traces / f"{WHOLE}.jsonl.gz", path, device_events)
        events, new, load_s, replay_s = _memory_run(path, "columns")
        print(f"   {WHOLE} x {copies}: {events} events replayed")
        print(
            f"   new: {new:.1f} bytes/event (load {load_s:.1f} s, replay {replay_s:.1f} s)"
            f"   target <= 60: {'met' if new <= 60 else 'no'}"
        )
        if peer:
            _, old, old_load, old_replay = _memory_run(path, "reference")
            print(
                f"   old: {old:.1f} bytes/event (load {old_load:.1f} s, replay "
                f"{old_replay:.1f} s)   x old {new / old:.2f}"
            )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--traces", type=Path, default=TRACES)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--baseline-rev", default="b50b1ed")
    parser.add_argument("--events", type=int, default=3_000_000)
    parser.add_argument("--quick", action="store_true", help="leave out the slow peers")
    args = parser.parse_args()
    from accelrt.memory.device import _core

    print(f"allocator core: {_core.CORE} ({_core.CORE_REASON}); numpy {np.__version__}")
    bench_loop(args.traces, args.repeats)
    bench_whole(args.traces, args.repeats, None if args.quick else args.baseline_rev)
    bench_memory(args.traces, args.events, peer=not args.quick)


if __name__ == "__main__":
    main()
