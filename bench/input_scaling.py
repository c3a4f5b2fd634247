"""Cost that grows with the input, not with its square: each case at n and at 10n (issue 26).

Each run is a fresh ``accelrt`` process (wall time and peak RSS from ``os.wait4``); the inputs
are built in a temporary directory:

- **matching**: ``accelrt replay TRACE --html OUT --device sim`` of a trace of n allocations of
  2 MiB, all live at the end (a paged KV cache), n = 10,000 and 100,000. The replay places
  them elsewhere than the recording did, so the page matches every drawn block to an
  allocation by its size. Target: 100,000 in under 10 s and 1 GB.
- **blank lines**: ``accelrt replay TRACE`` of a trace of 128 MiB and 1.25 GiB: an event then
  blank lines, each MiB (one gzip member each, so the files are written at once).
- **one line**: ``accelrt replay TRACE`` of a header and one line of 256 MiB and of 2 GiB
  without a newline: refused once 16 MiB of it is read (exit status 2). Target: under 10 s.
- **stacks**: ``accelrt snapshot summary`` and ``snapshot view`` of a snapshot of n allocations
  with n distinct stacks of 20 frames (4 of their own, 16 shared with every other stack, as
  PyTorch's pickles share frame dicts), n = 30,000 and 300,000.

Target: from n to 10n, time and peak RSS grow at most about 10x. Prints one line per run and
the growth of each case.

    python bench/input_scaling.py [--cases matching,blank,line,stacks] [--baseline-src DIR]
                                  [--timeout 120]

``--baseline-src`` runs another accelrt's ``src`` directory the same way (``git archive HEAD
src | tar -x -C DIR`` plus the compiled modules), each run stopped after ``--timeout`` seconds.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import pickle
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

MiB = 1 << 20
HEADER = {"type": "header", "format": "alloc-trace-jsonl", "format_version": 1}
CASES = ("matching", "blank", "line", "stacks")


def _run(argv: list[str], pythonpath: str | None, timeout: float) -> tuple[float | None, int, int]:
    """Run ``python -m accelrt *argv``; return its wall seconds (None: stopped at ``timeout``),
    peak RSS in bytes and exit status (0 or 2, else the run fails)."""
    env = dict(os.environ)
    if pythonpath is not None:
        env["PYTHONPATH"] = pythonpath
    with tempfile.TemporaryFile() as errors:
        started = time.perf_counter()
        child = subprocess.Popen(
            [sys.executable, "-m", "accelrt", *argv],
            stdout=subprocess.DEVNULL,
            stderr=errors,
            env=env,
        )
        while not (done := os.wait4(child.pid, os.WNOHANG))[0]:
            if time.perf_counter() - started > timeout:
                child.kill()
                _, _, usage = os.wait4(child.pid, 0)
                return None, usage.ru_maxrss * 1024, -9
            time.sleep(0.01)
        seconds = time.perf_counter() - started
        _, status, usage = done
        code = os.waitstatus_to_exitcode(status)
        child.returncode = code
        if code not in (0, 2):
            errors.seek(0)
            raise SystemExit(f"accelrt {' '.join(argv)} failed ({code}):\n{errors.read()!r}")
    return seconds, usage.ru_maxrss * 1024, code


def _kv_trace(path: Path, n: int) -> None:
    size = 2 * MiB
    lines = [json.dumps({**HEADER, "name": "kv", "device_capacity_bytes": 1 << 50})]
    lines += [
        f'{{"action":"alloc","addr":{(1 << 40) + 3 * size * i},"size":{size},"stream":0}}'
        for i in range(n)
    ]
    path.write_bytes(gzip.compress(("\n".join(lines) + "\n").encode(), 1))


def _blank_trace(path: Path, mib: int) -> None:
    event = b'{"action":"empty_cache"}\n'
    member = gzip.compress(event + b"\n" * (MiB - len(event)), 9)
    with open(path, "wb") as out:
        out.write(gzip.compress(json.dumps(HEADER).encode() + b"\n"))
        for _ in range(mib):
            out.write(member)


def _one_line_trace(path: Path, mib: int) -> None:
    member = gzip.compress(b"a" * MiB, 9)
    with open(path, "wb") as out:
        out.write(gzip.compress(json.dumps(HEADER).encode() + b"\n"))
        for _ in range(mib):
            out.write(member)


def _stacks_snapshot(path: Path, n: int) -> None:
    """n allocations of 512 bytes, 64 live at a time in one 2 MiB segment, each with a stack
    of its own; every 64 the live ones are freed."""
    shared = [{"name": f"c10::frame_{j}", "filename": "??", "line": 0} for j in range(16)]
    base, entries = 1 << 40, []
    for i in range(n):
        own = [
            {"name": f"fn_{i}_{j}", "filename": f"/work/model/layer_{i % 977}.py", "line": j + 1}
            for j in range(4)
        ]
        slot = base + (i % 64) * 512
        entries.append(
            {"action": "alloc", "addr": slot, "size": 512, "stream": 0, "frames": own + shared}
        )
        if i % 64 == 63:
            for k in range(64):
                for action in ("free_requested", "free_completed"):
                    entry = {"addr": base + k * 512, "size": 512, "stream": 0, "frames": []}
                    entries.append({"action": action, **entry})
    live = n % 64
    blocks: list[dict[str, Any]] = [
        {"address": base + k * 512, "size": 512, "requested_size": 512, "state": "active_allocated"}
        for k in range(live)
    ]
    free = {"address": base + live * 512, "size": 2 * MiB - live * 512, "requested_size": 0}
    blocks.append({**free, "state": "inactive"})
    segment = {
        "device": 0,
        "address": base,
        "total_size": 2 * MiB,
        "allocated_size": live * 512,
        "active_size": live * 512,
        "requested_size": live * 512,
        "stream": 0,
        "segment_type": "small",
        "segment_pool_id": (0, 0),
        "is_expandable": False,
        "frames": [],
        "blocks": blocks,
    }
    with open(path, "wb") as out:
        pickle.dump({"segments": [segment], "device_traces": [entries]}, out, protocol=4)


def _cases(
    tmp: Path, chosen: set[str], *, write: bool
) -> list[tuple[str, list[tuple[str, list[str]]]]]:
    """Per case: its name and its (size, accelrt arguments) runs, small then 10x; with
    ``write``, the inputs are written."""
    out = tmp / "out.html"
    cases = []
    if "matching" in chosen:
        runs = []
        for n in (10_000, 100_000):
            path = tmp / f"kv_{n}.jsonl.gz"
            if write:
                _kv_trace(path, n)
            runs.append(
                (f"{n:,} live", ["replay", str(path), "--html", str(out), "--device", "sim"])
            )
        cases.append(("matching", runs))
    for key, label, sizes_mib, make in (
        ("blank", "blank lines", (128, 1280), _blank_trace),
        ("line", "one line", (256, 2048), _one_line_trace),
    ):
        if key not in chosen:
            continue
        runs = []
        for mib in sizes_mib:
            path = tmp / f"{key}_{mib}.jsonl.gz"
            if write:
                make(path, mib)
            runs.append((f"{mib} MiB", ["replay", str(path), "--device", "sim"]))
        cases.append((label, runs))
    if "stacks" in chosen:
        summary, view = [], []
        for n in (30_000, 300_000):
            path = tmp / f"stacks_{n}.pickle"
            if write:
                _stacks_snapshot(path, n)
            summary.append((f"{n:,} stacks", ["snapshot", "summary", str(path)]))
            view.append((f"{n:,} stacks", ["snapshot", "view", str(path), "-o", str(out)]))
        cases += [("stacks: summary", summary), ("stacks: view", view)]
    return cases


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cases", default=",".join(CASES), help=f"of {', '.join(CASES)}")
    parser.add_argument("--baseline-src", help="another accelrt's src directory, run alike")
    parser.add_argument("--timeout", type=float, default=120.0, help="seconds a run may take")
    parser.add_argument("--write", type=Path, help=argparse.SUPPRESS)  # (the inputs, into DIR)
    args = parser.parse_args()
    chosen = set(args.cases.split(","))
    if chosen - set(CASES):
        parser.error(f"unknown cases: {', '.join(sorted(chosen - set(CASES)))}")
    if args.write:
        _cases(args.write, chosen, write=True)
        return 0
    sources: list[tuple[str, str | None]] = [("", None)]
    if args.baseline_src:
        sources.append((" (baseline)", args.baseline_src))
    with tempfile.TemporaryDirectory() as tmp:
        # written by another process: a child's peak RSS starts from its parent's (fork)
        started = time.perf_counter()
        subprocess.run(
            [sys.executable, __file__, "--write", tmp, "--cases", args.cases], check=True
        )
        cases = _cases(Path(tmp), chosen, write=False)
        print(f"inputs written in {time.perf_counter() - started:.1f} s\n")
        print(f"{'case':<28}{'input':>16}{'seconds':>10}{'peak RSS':>11}{'exit':>6}")
        for name, runs in cases:
            for label, pythonpath in sources:
                measured = []
                for size, argv in runs:
                    seconds, rss, code = _run(argv, pythonpath, args.timeout)
                    measured.append((seconds, rss))
                    shown = f"> {args.timeout:.0f}" if seconds is None else f"{seconds:.2f}"
                    print(f"{name + label:<28}{size:>16}{shown:>10}{rss / 1e6:>8.0f} MB{code:>6}")
                (small_s, small_rss), (big_s, big_rss) = measured
                if small_s is not None and big_s is not None:
                    print(
                        f"{'':<28}{'growth, x10':>16}{big_s / small_s:>9.1f}x"
                        f"{big_rss / small_rss:>9.1f}x"
                    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
