"""KeyboardInterrupts at random points of allocator calls never corrupt the allocator."""

from __future__ import annotations

import os
import random
from collections.abc import Callable
from typing import TYPE_CHECKING

import accelrt as acc
from accelrt.memory import CachingAllocator

if TYPE_CHECKING:
    from conftest import SigintAtRandomLines

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


def test_random_keyboard_interrupts_leave_the_allocator_consistent(
    sim: str,
    sigint_at_random_lines: type[SigintAtRandomLines],
    settle: Callable[[float], int],
) -> None:
    acc.set_allocator_settings("expandable_segments:True")
    acc.empty(1).free()
    allocator = acc.memory.get_allocator()
    rng = random.Random(2026)
    live: list[acc.Buffer] = []
    interrupts = 0
    injector = sigint_at_random_lines(_ALLOCATOR_FILES, 7)
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
        interrupts += settle(0.003)
    interrupts += settle(0.5)  # none may arrive while the books are checked
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
