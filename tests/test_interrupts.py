"""KeyboardInterrupts at random points of allocator calls never corrupt the allocator."""

from __future__ import annotations

import os
import random
import subprocess
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING

import pytest

import accelrt as acc
from accelrt.memory import CachingAllocator

if TYPE_CHECKING:
    from conftest import SigintAtRandomLines

MiB = 1 << 20
_ALLOCATOR_FILES = {
    os.path.join(os.path.dirname(acc.memory.__file__), name)
    for name in (  # noqa: SIM905 (one line, not one a name)
        "device/_hit_path.py device/_allocator.py device/_private_pools.py device/_release.py "
        "device/_recordings.py device/_events.py device/_block.py device/_stats.py "
        "device/_source.py device/_arenas.py _policy.py"
    ).split()
}


def _check_books(allocator: CachingAllocator, live: list[acc.Buffer]) -> None:
    stats = allocator.memory_stats()
    blocks = [b for _, segment_blocks in allocator.segments() for b in segment_blocks]
    assert stats["allocation.all.current"] == len(live) == sum(b.allocated for b in blocks)
    assert stats["requested_bytes.all.current"] == sum(b.nbytes for b in live)
    assert stats["allocated_bytes.all.current"] == sum(b.size for b in blocks if b.allocated)
    assert stats["reserved_bytes.all.current"] == allocator.reserved_bytes
    assert all(value >= 0 for key, value in stats.items() if key.endswith(".current"))


@pytest.mark.parametrize("settings", ["expandable_segments:True", "policy:accelrt"])
def test_random_keyboard_interrupts_leave_the_allocator_consistent(
    sim: str,
    sigint_at_random_lines: type[SigintAtRandomLines],
    settle: Callable[[float], int],
    settings: str,
) -> None:
    acc.set_allocator_settings(settings)
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
    # Python lines, so only the slow paths' lines count: about 1,500 signals, 1,486 once)
    assert injector.sent >= 1200 and interrupts > 100
    _check_books(allocator, live)
    for buf in live:
        buf.free()
    live.clear()
    acc.empty_cache()
    stats = allocator.memory_stats()
    assert stats["reserved_bytes.all.current"] == 0 and allocator.segments() == []


# A module-level loop of public calls (no function of its own): Ctrl-C, sent from a thread
# 300 ms in, must arrive, although almost every bytecode of the loop runs inside an allocator
# call. Re-sending a deferred signal let it land at the start of the next call, where CPython
# handles signals, so it was deferred again and again and never arrived (issue 25).
_LOOP = """
import os, random, signal, sys, threading, time
import accelrt as acc
acc.backends.use(sys.argv[1])
s2 = acc.Stream()
live, dev, sent = [], [], []
rng = random.Random(0)

def ctrl_c():
    time.sleep(0.3)
    sent.append(time.perf_counter())
    os.kill(os.getpid(), signal.SIGINT)

threading.Thread(target=ctrl_c, daemon=True).start()
t0 = time.perf_counter()
try:
    while time.perf_counter() - t0 < 5:
        r = rng.random()
{body}
    print("lost")
except KeyboardInterrupt:
    print("arrived after", round((time.perf_counter() - sent[0]) * 1000, 2), "ms")
"""
_BODIES = {
    "host allocator mix": """
        if r < 0.4:
            live.append(acc.empty_host(rng.choice((512, 4096, 1 << 20))))
        elif r < 0.55 and live:
            acc.record_stream(live[-1], s2)
        elif r < 0.9 and live:
            live.pop(rng.randrange(len(live))).free()
        else:
            acc.empty_host_cache()
""",
    "empty_cache alone": """
        acc.empty_cache()
""",
    "runtime mix": """
        if r < 0.2:
            s2 = acc.Stream()
        elif r < 0.4:
            s2.record_event().synchronize()
        elif r < 0.55:
            buf = acc.empty(4096, stream=s2)
            acc.copy_(buf, bytes(4096), stream=s2)
            buf.free()
        elif r < 0.7:
            acc.synchronize()
        elif r < 0.85:
            acc.memory_stats()
            acc.host_memory_stats()
        else:
            acc.reset_peak_memory_stats()
""",
    "device allocator mix": """
        if r < 0.5 and len(dev) < 16:
            dev.append(acc.empty(rng.choice((512, 1 << 20, 30 << 20)), stream=s2))
        elif r < 0.95 and dev:
            dev.pop(rng.randrange(len(dev))).free()
        else:
            acc.empty_cache()
""",
}


def _run(script: str, backend: str) -> subprocess.CompletedProcess[str]:
    """Run ``script`` in a fresh interpreter with ``backend`` as its argument (signals go to
    that process alone)."""
    return subprocess.run(
        [sys.executable, "-W", "ignore", "-c", script, backend],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip


@pytest.mark.parametrize("body", sorted(_BODIES))
@pytest.mark.parametrize("backend", ["sim", "opencl"])
def test_ctrl_c_arrives_in_a_loop_of_public_calls(
    backend: str, body: str, request: pytest.FixtureRequest
) -> None:
    request.getfixturevalue(backend)  # skips without an OpenCL device
    done = _run(_LOOP.format(body=_BODIES[body]), backend)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("arrived after"), (done.stdout, done.stderr[-2000:])


# Ctrl-C inside a finaliser: CPython drops an exception raised in one ("Exception ignored in"),
# so a SIGINT landing in Stream.__del__ (an OpenCL queue finishing) or in a MemPool's
# weakref.finalize callback was lost. Here the finaliser's work sends the SIGINT itself; it
# must finish that work and the KeyboardInterrupt arrive at the statement after the `del`.
_FINALISER = """
import signal, sys
import accelrt as acc
acc.backends.use(sys.argv[1])
acc.empty(1).free()  # the first allocator wraps the SIGINT handler
done = []

def ctrl_c_inside(owner, name):
    original = getattr(owner, name)

    def call(*args, **kwargs):
        signal.raise_signal(signal.SIGINT)  # the handler runs before this returns
        result = original(*args, **kwargs)
        done.append(name)
        return result

    setattr(owner, name, call)
{setup}
try:
    del victim
    print("lost", done)
except KeyboardInterrupt:
    print("arrived", done)
"""
_FINALISERS = {
    "Stream.__del__": """
victim = acc.Stream()
ctrl_c_inside(victim._backend, "stream_destroy")
""",
    "MemPool weakref.finalize": """
victim = acc.memory.MemPool()
with acc.memory.use_mem_pool(victim):
    acc.empty(1 << 20).free()
ctrl_c_inside(type(acc.memory.get_allocator()), "_release_dropped_pool_cache")
""",
}


@pytest.mark.parametrize("finaliser", sorted(_FINALISERS))
@pytest.mark.parametrize("backend", ["sim", "opencl"])
def test_ctrl_c_inside_a_finaliser_arrives_after_it(
    backend: str, finaliser: str, request: pytest.FixtureRequest
) -> None:
    request.getfixturevalue(backend)  # skips without an OpenCL device
    done = _run(_FINALISER.format(setup=_FINALISERS[finaliser]), backend)
    assert done.returncode == 0, done.stderr
    finished = "stream_destroy" if finaliser.startswith("Stream") else "_release_dropped_pool_cache"
    assert done.stdout == f"arrived [{finished!r}]\n", (done.stdout, done.stderr[-2000:])
    assert "Exception ignored" not in done.stderr
