"""KeyboardInterrupts at random points of allocator calls never corrupt the allocator."""

from __future__ import annotations

import _thread
import os
import random
import sys
import time
from types import FrameType

import accelrt as acc
from accelrt.memory import CachingAllocator

MiB = 1 << 20
_ALLOCATOR_FILES = {
    os.path.join(os.path.dirname(acc.memory.__file__), name)
    for name in ("_allocator.py", "_block.py", "_stats.py", "_segments.py", "_policy.py")
}


def _check_books(allocator: CachingAllocator, live: list[acc.Buffer]) -> None:
    stats = allocator.memory_stats()
    blocks = [b for _, segment_blocks in allocator.segments() for b in segment_blocks]
    assert stats["allocation.all.current"] == len(live) == sum(b.allocated for b in blocks)
    assert stats["requested_bytes.all.current"] == sum(b.nbytes for b in live)
    assert stats["allocated_bytes.all.current"] == sum(b.size for b in blocks if b.allocated)
    assert stats["reserved_bytes.all.current"] == allocator.reserved_bytes
    assert all(value >= 0 for key, value in stats.items() if key.endswith(".current"))


class _SigintAtRandomLines:
    """While active, simulates a SIGINT arriving at a random line of accelrt's own code.

    A trace function counts the lines executed in the allocator's modules and, every few dozen
    lines (at random), calls ``_thread.interrupt_main()``: the signal handler then runs
    at the next point where Python checks for signals, in the middle of an allocator call.
    """

    def __init__(self, seed: int) -> None:
        self._rng = random.Random(seed)
        self._countdown = self._rng.randint(1, 60)
        self.sent = 0

    def _local(self, frame: FrameType, event: str, arg: object) -> object:
        if event == "line":
            self._countdown -= 1
            if self._countdown <= 0:
                self._countdown = self._rng.randint(1, 60)
                self.sent += 1
                _thread.interrupt_main()
        return self._local

    def _global(self, frame: FrameType, event: str, arg: object) -> object:
        return self._local if frame.f_code.co_filename in _ALLOCATOR_FILES else None

    def __enter__(self) -> _SigintAtRandomLines:
        sys.settrace(self._global)
        return self

    def __exit__(self, *exc_info: object) -> None:
        sys.settrace(None)


def _settle(seconds: float = 0.003) -> int:
    """Let interrupts still on their way arrive here; return how many did."""
    caught = 0
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            time.sleep(0.001)
        except KeyboardInterrupt:
            caught += 1
    return caught


def test_random_keyboard_interrupts_leave_the_allocator_consistent(sim: str) -> None:
    acc.set_allocator_settings("expandable_segments:True")
    acc.empty(1).free()
    allocator = acc.memory.get_allocator()
    rng = random.Random(2026)
    live: list[acc.Buffer] = []
    interrupts = 0
    injector = _SigintAtRandomLines(7)
    for _ in range(1500):
        try:
            with injector:
                roll = rng.random()
                if roll < 0.55 or not live:
                    size = rng.choice([rng.randint(1, MiB), rng.randint(MiB, 48 * MiB)])
                    live.append(acc.empty(size))
                elif roll < 0.98:
                    live.pop(rng.randrange(len(live))).free()
                else:
                    acc.empty_cache()
        except KeyboardInterrupt:
            interrupts += 1
        interrupts += _settle()
    interrupts += _settle(0.5)  # none may arrive while the books are checked
    # allocator calls were interrupted (fewer land with the compiled core: its hit path has no
    # Python lines, so only the slow paths' lines count)
    assert injector.sent >= 1500 and interrupts > 100
    _check_books(allocator, live)
    for buf in live:
        buf.free()
    live.clear()
    acc.empty_cache()
    stats = allocator.memory_stats()
    assert stats["reserved_bytes.all.current"] == 0 and allocator.segments() == []
