"""Long text fields in input files: how the ``accelrt`` commands' time grows with their length.

A 100 KB trace ``name`` made ``accelrt replay`` take 45 s (1 MB: about 75 minutes) in rich's
highlighter, whose time is quadratic in a string's length, while ``--json`` took 0.17 s (issue
26). Now a trace name longer than ``MAX_NAME_CHARS`` (4096) is refused when the header is read,
stack frames are cut to a bound before they are shown, and the text output is printed without
rich's markup or highlighting. For each field, at a length n and at 10n, this prints the best
wall time of the command (run by ``accelrt.cli.main`` in this process, its output captured, so
without the interpreter's start, about 0.25 s a process), the growth from n to 10n
(target: at most 10x, the growth of reading the bytes), and the ratio to the peer: the same
file through ``accelrt replay --json``, which never highlighted anything.

- **trace name, refused**: a JSONL trace whose header ``name`` has 100,000 and 1,000,000
  characters; ``accelrt replay`` (target: the 1 MB name under 1 s);
- **trace name, shown**: 409 and 4,090 characters (within the limit), ``accelrt replay``;
- **frame name and file name**: a snapshot pickle whose allocation's stack frame has a name and
  a file name of 100,000 and 1,000,000 characters each; ``accelrt replay`` and ``accelrt
  snapshot summary`` (which shows the stacks).

    python bench/long_fields.py [--repeats 5]
"""

from __future__ import annotations

import argparse
import contextlib
import gzip
import io
import json
import pickle
import tempfile
import time
from pathlib import Path

from accelrt.cli import main

TARGET_GROWTH = 10.0
TARGET_SECONDS_1MB = 1.0
_EVENTS = [{"action": "alloc", "addr": 4096, "size": 1 << 20, "stream": 0},
           {"action": "free", "addr": 4096, "size": 1 << 20, "stream": 0}]  # fmt: skip


def trace_with_name(path: Path, length: int) -> Path:
    """A two-event JSONL trace whose header ``name`` is ``length`` characters long."""
    header = {"type": "header", "format": "alloc-trace-jsonl", "format_version": 1}
    with gzip.open(path, "wt", compresslevel=1) as f:
        f.write(json.dumps({**header, "name": "n" * length}) + "\n")
        f.writelines(json.dumps(event) + "\n" for event in _EVENTS)
    return path


def snapshot_with_frame(path: Path, length: int) -> Path:
    """A snapshot pickle whose one allocation's frame has a name and a file name of ``length``
    characters each."""
    frames = [{"name": "f" * length, "filename": "/d/" + "d" * length + ".py", "line": 7}]
    entries = [
        {"action": "segment_alloc", "addr": 0, "size": 2 << 20, "stream": 0},
        {"action": "alloc", "addr": 0, "size": 1024, "stream": 0, "frames": frames},
        {"action": "free_requested", "addr": 0, "size": 1024, "stream": 0},
        {"action": "free_completed", "addr": 0, "size": 1024, "stream": 0},
    ]
    segment = {"device": 0, "address": 0, "total_size": 2 << 20, "stream": 0,
               "segment_type": "small", "blocks": [{"address": 0, "size": 2 << 20,
                                                    "state": "inactive"}]}  # fmt: skip
    path.write_bytes(pickle.dumps({"segments": [segment], "device_traces": [entries]}))
    return path


def best_seconds(argv: list[str], repeats: int, status: int) -> float:
    """The best wall time of ``accelrt ARGV`` run in this process, its output captured.

    Raises
    ------
    SystemExit
        If the command's exit status is not ``status`` (what was measured is not the case).
    """
    best = float("inf")
    for _ in range(repeats):
        out, err = io.StringIO(), io.StringIO()
        start = time.perf_counter()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            got = main(argv)
        best = min(best, time.perf_counter() - start)
        if got != status:
            raise SystemExit(
                f"accelrt {' '.join(argv)}: status {got}, not {status}\n{err.getvalue()}"
            )
    return best


def command_argv(command: str, path: Path) -> list[str]:
    """``accelrt COMMAND FILE`` (``replay`` on the simulated device)."""
    words = command.split()
    return [*words, str(path), *(["--device", "sim"] if words[0] == "replay" else [])]


def report(
    label: str,
    files: tuple[Path, Path],
    lengths: tuple[int, int],
    commands: list[str],
    repeats: int,
    status: int,
) -> list[str]:
    """Time each command on both files (the field ``lengths`` long) against ``replay --json``,
    each ending with exit ``status``; print a row each; return the targets missed."""
    peer = best_seconds([*command_argv("replay", files[1]), "--json"], repeats, status)
    missed = []
    for command in commands:
        small, large = (best_seconds(command_argv(command, f), repeats, status) for f in files)
        growth = large / small
        print(
            f"{label:<26} {command:<17} {lengths[0]:>9,} {small:>7.3f} s {lengths[1]:>9,} "
            f"{large:>7.3f} s {growth:>7.2f}x {large / peer:>7.2f}x"
        )
        if growth > TARGET_GROWTH:
            missed.append(f"{label}, {command}: grows {growth:.1f}x from n to 10n")
        if lengths[1] >= 1_000_000 and large > TARGET_SECONDS_1MB:
            missed.append(f"{label}, {command}: {large:.2f} s at {lengths[1]:,} characters")
    return missed


def main_bench() -> None:
    """Run the measurements and print a table; say which targets were missed."""
    parser = argparse.ArgumentParser(description="how time grows with long text fields")
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    print(
        f"{'field':<26} {'command':<17} {'n':>9} {'time':>9} {'10n':>9} {'time':>9} "
        f"{'growth':>8} {'vs json':>8}"
    )
    cases = [
        ("trace name, refused", trace_with_name, ".jsonl.gz", (100_000, 1_000_000), ["replay"], 2),
        ("trace name, shown", trace_with_name, ".jsonl.gz", (409, 4090), ["replay"], 0),
        ("frame name and file name", snapshot_with_frame, ".pickle", (100_000, 1_000_000),
         ["replay", "snapshot summary"], 0),
    ]  # fmt: skip
    missed: list[str] = []
    with tempfile.TemporaryDirectory(prefix="accelrt-long-") as tmp:
        for n, (label, make, suffix, lengths, commands, status) in enumerate(cases):
            small, large = (make(Path(tmp) / f"case{n}_{length}{suffix}", length)
                            for length in lengths)  # fmt: skip
            missed += report(label, (small, large), lengths, commands, args.repeats, status)
    print(
        f"targets: growth from n to 10n at most {TARGET_GROWTH:.0f}x; 1,000,000 characters in "
        f"under {TARGET_SECONDS_1MB:.0f} s; vs json: the time over replay --json of the 10n file"
    )
    print("all met" if not missed else "missed: " + "; ".join(missed))


if __name__ == "__main__":
    main_bench()
