"""Soak test: random memory API operations on sim, faults included: python bench/soak.py.

Runs ``--operations`` random operations (default a million), shared out between ``--threads``
threads, through accelrt's public memory API on a simulated device of ``--capacity``: allocations
of every size class (some bigger than the device), frees, ``record_stream`` on other threads'
streams and frees after it, streams destroyed while blocks were recorded on them, data round
trips through ``copy_``, two ``MemPool`` s (replaced while their blocks live), ``empty_cache``,
settings and memory-fraction changes at run time, statistics resets, and faults: at a low rate
the next call of one of the backend functions the allocator uses raises
``RuntimeError("injected")`` or a ``MemoryError``. Every ``--check-every`` operations the threads
meet and the books are checked: each allocator's statistics recomputed from the live buffers and
its segments, blocks tiling their segments, no two live blocks overlapping, written bytes
unchanged, dropped pools forgotten. At the end everything is freed and the cache emptied, and
nothing may stay reserved.

The workers, the faulty backend and the checks are tests/test_public_state_machine.py's. Prints
the operations by kind, out-of-memory errors, faults armed, fired and raised, warnings,
invariant checks and broken invariants; exits 1 if any invariant broke or a thread failed.

    python bench/soak.py [--operations 1000000] [--threads 4] [--seed 0] [--capacity 256MiB]
        [--check-every 20000]
"""

from __future__ import annotations

import argparse
import importlib
import sys
import threading
import time
import traceback
import warnings
from collections import Counter
from pathlib import Path
from types import ModuleType
from typing import Any, TextIO

import accelrt as acc

MIX = {  # operation -> relative frequency
    "alloc": 30.0,
    "pool_alloc": 4.0,
    "free": 28.0,
    "record_stream": 8.0,
    "record_free": 14.0,
    "round_trip": 2.0,
    "empty_cache": 0.5,
    "cycle_stream": 0.3,
    "replace_pool": 0.05,
    "reset_stats": 0.05,
    "settings": 0.05,
    "fraction": 0.03,
    "fault": 0.1,
}
SHOWN_PROBLEMS = 20


def load_harness() -> ModuleType:
    """Import tests/test_public_state_machine.py (its workers, backend and checks)."""
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
    return importlib.import_module("test_public_state_machine")


class Tally:
    """What the run saw: broken invariants and warnings, from every thread."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.checks = 0
        self.problems: list[str] = []
        self.warnings: Counter[str] = Counter()

    def on_check(self, problems: list[str]) -> None:
        with self.lock:
            self.checks += 1
            self.problems += problems

    def on_warning(
        self,
        message: Warning | str,
        category: type[Warning],
        filename: str,
        lineno: int,
        file: TextIO | None = None,
        line: str | None = None,
    ) -> None:
        with self.lock:
            self.warnings[category.__name__] += 1


def print_counts(title: str, counts: dict[str, int] | Counter[str]) -> None:
    print(title)
    for name, value in sorted(counts.items(), key=lambda item: -item[1]):
        print(f"  {name:<28} {value:>12,}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--operations", type=int, default=1_000_000)
    parser.add_argument("--threads", type=int, default=4)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--capacity", default="256MiB", help="per device, e.g. 256MiB")
    parser.add_argument("--check-every", type=int, default=20_000, help="operations, all threads")
    args = parser.parse_args()
    if args.operations < 1 or args.threads < 1 or args.check_every < 1:
        parser.error("--operations, --threads and --check-every must be at least 1")
    capacity = acc.parse_bytes(args.capacity, name="--capacity")
    each = max(1, args.operations // args.threads)
    check_every = max(1, args.check_every // args.threads)

    harness: Any = load_harness()
    tally = Tally()
    warnings.simplefilter("always")
    warnings.showwarning = tally.on_warning
    rig = harness.Rig(capacity)
    workers = [harness.Worker(rig, args.seed * 1000 + i, MIX) for i in range(args.threads)]
    start = time.perf_counter()
    failure = None
    try:
        harness.run_workers(rig, workers, each, check_every, tally.on_check)
    except BaseException:
        failure = traceback.format_exc()
    seconds = time.perf_counter() - start
    unfired = len(rig.backend.armed)  # armed at the end, never called since
    rig.backend.disarm()
    held = [h for w in workers for h in w.held]
    tally.on_check(rig.check(held) + [p for w in workers for p in w.problems])
    peak_reserved = acc.max_memory_reserved(0)
    tally.on_check(rig.release_all(held))

    counts: Counter[str] = sum((w.counts for w in workers), Counter())
    operations = {kind: counts.pop(kind) for kind in MIX if kind in counts}
    done = sum(operations.values())
    fired = rig.backend.fired
    print(
        f"soak: {done:,} operations in {args.threads} threads on sim "
        f"({acc.format_bytes(capacity)} devices), seed {args.seed}: {seconds:.1f} s, "
        f"{done / seconds:,.0f} operations/s"
    )
    print_counts("operations by kind:", operations)
    print_counts("outcomes:", counts)
    print(
        f"injected faults: armed {operations.get('fault', 0):,}, fired {sum(fired.values()):,} "
        f"({', '.join(f'{k} {v}' for k, v in sorted(fired.items()))}), raised to the caller "
        f"{counts.get('injected fault raised', 0):,}, still armed at the end {unfired}"
    )
    print(f"warnings: {dict(tally.warnings) or 'none'}")
    print(f"peak reserved on sim:0: {acc.format_bytes(peak_reserved)}")
    distinct = Counter(tally.problems)
    print(
        f"invariant checks: {tally.checks:,}, broken invariants: {len(tally.problems):,} "
        f"({len(distinct):,} distinct)"
    )
    for problem, times in distinct.most_common(SHOWN_PROBLEMS):
        print(f"  {times:>6,} x {problem}")
    rig.close()
    if failure is not None:
        print(f"a thread failed:\n{failure}")
    return 1 if tally.problems or failure is not None else 0


if __name__ == "__main__":
    sys.exit(main())
