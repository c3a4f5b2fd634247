"""Big snapshots at the speed of decoding: whole ``accelrt`` commands against ``pickle``.

Builds, in a temporary directory, a PyTorch memory snapshot of about 90 MB and 450,000 trace
entries from a shared recording (``--source``, default notHanmin's 19,464-entry snapshot in
``../shared/traces/gpu_snapshots/raw``): the recording's entries, then copies of its last
*closed window* until ``--entries``. The window is the longest stretch at the end that leaves
the live blocks as they were at its start, with no segment event in it, so every copy replays
like the first and the rewound start state stays exact (the line about the file says how
many events the rewind could not place: 0). Each copy is made of distinct objects as
PyTorch writes them: a new dict and a new frame list per entry (the frame dicts themselves
are shared, as in PyTorch's pickles), ``time_us`` shifted past the copy before.

Then, as separate processes (best of ``--repeats``, interleaved, after a round that compiles
the bytecode into a temporary ``PYTHONPYCACHEPREFIX``, as an installed package has it; wall
time and peak RSS from ``os.wait4``):

- **the peer**: pickle's C ``Unpickler`` with a ``find_class`` that refuses every global (the
  least a reader of untrusted snapshots must do), with the garbage collector as Python starts
  (on); the same with the collector paused is printed beside it;
- ``accelrt snapshot view FILE -o OUT.html``: target at most 2.5x the peer's time, peak RSS
  at most 6x the file's size;
- ``accelrt replay FILE`` and ``accelrt snapshot summary FILE``: printed as ratios to the peer
  (target: no slower than before; ``--baseline-src`` runs another checkout's ``src`` the same
  way, in the same rounds, for the before/after).

    python bench/big_snapshot.py [--source PICKLE] [--entries 446640] [--repeats 3]
                                 [--baseline-src DIR] [--keep DIR]

``--baseline-src`` takes a ``src`` directory of another accelrt (for instance
``git archive HEAD src | tar -x -C /tmp/base`` plus that checkout's compiled modules) and runs
it with ``PYTHONPATH`` pointing there. ``--keep DIR`` writes the snapshot there instead of a
temporary directory (and keeps it).
"""

from __future__ import annotations

import argparse
import os
import pickle
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
SOURCE = (
    ROOT.parent
    / "shared"
    / "traces"
    / "gpu_snapshots"
    / "raw"
    / "notHanmin__memory_snapshot_96f7f9d.pickle"
)
TARGET_VIEW_RATIO = 2.5
TARGET_RSS_RATIO = 6.0

_PEER = """
import gc, io, pickle, sys
class Refusing(pickle.Unpickler):
    def find_class(self, module, name):
        raise pickle.UnpicklingError(f"global {module}.{name} refused")
if sys.argv[2] == "paused":
    gc.disable()
with open(sys.argv[1], "rb") as f:
    data = f.read()
Refusing(io.BytesIO(data)).load()
"""
_SEGMENT_ACTIONS = ("segment_alloc", "segment_free", "segment_map", "segment_unmap", "oom")


def _closed_window(entries: list[dict[str, Any]]) -> int:
    """The start of the longest stretch at the end of ``entries`` that leaves the live blocks
    as they were at its start (its allocs and frees cancel out, both the frees requested and
    those completed, where a block goes back to its pool) and has no segment event."""
    requested = completed = 0  # the XOR of the (address, bytes) of allocs and frees from i on
    start = len(entries)
    for i in range(len(entries) - 1, -1, -1):
        action = entries[i].get("action")
        if action in _SEGMENT_ACTIONS:
            break
        block = hash((entries[i].get("addr"), entries[i].get("size")))
        if action in ("alloc", "free_requested"):
            requested ^= block
        if action in ("alloc", "free_completed"):
            completed ^= block
        if requested == completed == 0:
            start = i
    return start


def build(source: Path, entries: int, out: Path) -> dict[str, Any]:
    """Write the big snapshot to ``out``; return what it holds."""
    with open(source, "rb") as f:
        snapshot = pickle.load(f)  # a shared recording of plain data
    [device] = [d for d, t in enumerate(snapshot["device_traces"]) if t]
    recorded = snapshot["device_traces"][device]
    first = _closed_window(recorded)
    window = recorded[first:]
    if not window:
        raise SystemExit(f"{source}: no closed window at the end of device {device}'s entries")
    times = [e["time_us"] for e in window if "time_us" in e]
    span = (max(times) - min(times) + 1) if times else 0
    grown = list(recorded)
    copies = 0
    while len(grown) < entries:
        copies += 1
        for entry in window:
            copy = dict(entry)
            if isinstance(entry.get("frames"), list):
                copy["frames"] = list(entry["frames"])
            if "time_us" in entry:
                copy["time_us"] = entry["time_us"] + copies * span
            grown.append(copy)
    snapshot["device_traces"][device] = grown
    with open(out, "wb") as f:
        pickle.dump(snapshot, f, protocol=4)
    from accelrt.trace import trace_from_snapshot

    trace = trace_from_snapshot(snapshot, device=device, path=str(out))
    assert trace.recording is not None
    return {
        "entries": len(grown),
        "window": (first, len(recorded)),
        "copies": copies,
        "bytes": out.stat().st_size,
        "unplaced": trace.recording.inconsistent_events,
        "events": len(trace.events),
    }


def _run(argv: list[str], pythonpath: str | None, pycache: str) -> tuple[float, int]:
    """Run ``argv``; return its wall seconds and peak RSS in bytes (it must succeed).

    Compiled bytecode goes to ``pycache`` (and is used from there), as an installed package
    has it, whatever ``PYTHONDONTWRITEBYTECODE`` says here.
    """
    env = dict(os.environ, PYTHONPYCACHEPREFIX=pycache)
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    if pythonpath is not None:
        env["PYTHONPATH"] = pythonpath
    with tempfile.TemporaryFile() as errors:
        started = time.perf_counter()
        child = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=errors, env=env)
        _, status, usage = os.wait4(child.pid, 0)  # reaped here: its own peak RSS
        seconds = time.perf_counter() - started
        child.returncode = os.waitstatus_to_exitcode(status)
        if child.returncode != 0:
            errors.seek(0)
            text = errors.read().decode(errors="replace")
            raise SystemExit(f"{' '.join(argv)} failed ({child.returncode}):\n{text}")
    return seconds, usage.ru_maxrss * 1024  # KiB on Linux


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--source", type=Path, default=SOURCE)
    parser.add_argument("--entries", type=int, default=446_640)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--baseline-src", help="another accelrt's src directory, run alike")
    parser.add_argument("--keep", type=Path, help="write the snapshot in this directory")
    args = parser.parse_args()
    if not args.source.is_file():
        print(f"no recording at {args.source}: nothing to measure (give --source)")
        return 0
    with tempfile.TemporaryDirectory() as tmp:
        where = args.keep or Path(tmp)
        where.mkdir(parents=True, exist_ok=True)
        path = where / "big_snapshot.pickle"
        made = build(args.source, args.entries, path)
        size = made["bytes"]
        print(
            f"{path}: {size / 1e6:.1f} MB, {made['entries']:,} entries ({args.source.name}'s "
            f"{made['window'][1]:,}, then {made['copies']} copies of entries "
            f"{made['window'][0]:,} to {made['window'][1] - 1:,}); {made['events']:,} events, "
            f"{made['unplaced']} the rewind could not place"
        )
        python = sys.executable
        out = str(Path(tmp) / "view.html")
        file = str(path)
        commands: dict[str, list[str]] = {
            "snapshot view": ["snapshot", "view", file, "-o", out, "--no-progress"],
            "replay": ["replay", file, "--no-progress"],
            "snapshot summary": ["snapshot", "summary", file, "--no-progress"],
        }
        runs: dict[str, tuple[list[str], str | None]] = {
            "peer": ([python, "-c", _PEER, file, "on"], None),
            "peer, collector paused": ([python, "-c", _PEER, file, "paused"], None),
        }
        for name, command in commands.items():
            runs[name] = ([python, "-m", "accelrt", *command], None)
            if args.baseline_src:
                # an older accelrt may not know --no-progress: without a terminal it shows none
                old = [c for c in command if c != "--no-progress"]
                runs[f"{name} (baseline)"] = ([python, "-m", "accelrt", *old], args.baseline_src)
        fastest = dict.fromkeys(runs, float("inf"))
        peaks = dict.fromkeys(runs, 0)
        pycache = str(Path(tmp) / "pycache")
        for argv, pythonpath in runs.values():  # a round to compile the bytecode
            _run(argv, pythonpath, pycache)
        for _ in range(args.repeats):
            for name, (argv, pythonpath) in runs.items():
                seconds, rss = _run(argv, pythonpath, pycache)
                fastest[name] = min(fastest[name], seconds)
                peaks[name] = max(peaks[name], rss)
        peer = fastest["peer"]
        print(f"best of {args.repeats} (peak RSS: the largest), each a fresh process\n")
        print(f"{'':<30}{'seconds':>9}{'x peer':>9}{'peak RSS':>11}{'x file':>9}  target")
        for name, seconds in fastest.items():
            rss = peaks[name]
            target = ""
            if name == "snapshot view":
                ok = seconds / peer <= TARGET_VIEW_RATIO and rss / size <= TARGET_RSS_RATIO
                target = f"<= {TARGET_VIEW_RATIO}x peer, <= {TARGET_RSS_RATIO:.0f}x file: " + (
                    "met" if ok else "NOT met"
                )
            print(
                f"{name:<30}{seconds:>9.2f}{seconds / peer:>9.2f}{rss / 1e6:>8.0f} MB"
                f"{rss / size:>9.2f}  {target}"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
