"""Stateful and threaded tests of the public memory API on the simulated device, under faults.

A hypothesis ``RuleBasedStateMachine`` drives what a program does with device memory:
``accelrt.empty`` (every size class, some bigger than the device), ``Buffer.free``, buffers
dropped to the garbage collector, ``record_stream`` on other streams, streams made and destroyed
(a free whose recorded stream is gone completes with a ``RuntimeWarning``), ``empty_cache``,
settings and memory-fraction changes at run time, statistics resets, two ``MemPool`` s (also
replaced while their blocks live), data round trips through ``copy_``, allocations on the second
device, and faults: :class:`FaultySim` makes the next call of one of the backend functions the
allocator uses (``malloc``, ``free``, ``vm_map``, ``vm_unmap``, ``event_create``,
``event_record``) raise ``RuntimeError("injected")`` or a ``MemoryError``. After every step
:func:`check_books` recomputes each allocator's books from the live buffers and the segments.

:class:`Worker` threads run random operations on one device at once; ``bench/soak.py`` runs the
same workers, faults and settings changes included, for a million operations.
"""

from __future__ import annotations

import gc
import itertools
import random
import sys
import threading
import warnings
import weakref
from collections import Counter
from collections.abc import Callable, Collection, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, currently_in_test_context, event, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

import accelrt as acc
from accelrt.backends.sim import SimBackend
from accelrt.memory import AllocatorConfig, Block, CachingAllocator, MemPool, use_mem_pool
from accelrt.testing import install_backend, replace_allocator_settings, reset_runtime

KiB, MiB = 1 << 10, 1 << 20
CAPACITY = 256 * MiB
PoolId = tuple[int, int]
DEFAULT_POOL: PoolId = (0, 0)
FAULTY = ("malloc", "free", "vm_map", "vm_unmap", "event_create", "event_record")
STATS = (
    "allocation",
    "allocated_bytes",
    "requested_bytes",
    "active",
    "active_bytes",
    "reserved_bytes",
    "segment",
    "inactive_split",
    "inactive_split_bytes",
)
SIZE_CLASSES = ((1, 4 * KiB), (4 * KiB, 2 * MiB), (2 * MiB, 64 * MiB))
# the machine sets policy:accelrt on top of settings it ignores: said once an allocator
pytestmark = pytest.mark.filterwarnings("ignore:.*accelrt ignores:RuntimeWarning")
# (text, fresh): set_allocator_settings(text) changes only the keys it names; fresh replaces
# the whole settings by text, the only way back to no max_split_size
SETTINGS = (
    ("expandable_segments:True", False),
    ("expandable_segments:False", False),
    ("max_split_size_mb:20", False),
    ("max_split_size_mb:64", False),
    ("roundup_power2_divisions:4", False),
    ("garbage_collection_threshold:0.8", False),
    ("", True),
    ("expandable_segments:True", True),
    ("policy:accelrt", False),
    ("policy:pytorch", False),
)
FRACTIONS = (0.25, 0.5, 0.75, 1.0)


def let_go() -> None:
    """Collect what ``del`` left: CPython destroys an object without reference cycles at once,
    and a young cycle goes here (a full ``gc.collect()`` would cost 30 ms a call)."""
    gc.collect(0)


def note(what: str) -> None:
    """Count ``what`` in hypothesis' statistics (``--hypothesis-show-statistics``)."""
    if currently_in_test_context():
        event(what)


# ---------------------------------------------------------------------- faults
class InjectedFault(RuntimeError):
    """What an armed backend call raises: a ``RuntimeError("injected")``."""


class InjectedMemoryError(MemoryError):
    """The variant: a ``MemoryError("injected")``, as a host out of memory raises."""


INJECTED = (InjectedFault, InjectedMemoryError)


class FaultySim(SimBackend):
    """The simulated backend (2 devices) with faults on demand, and streams that really die.

    ``arm(method, error)`` makes the next call of ``method`` (one of ``FAULTY``), from any
    thread, raise ``error("injected")`` before it does anything. A destroyed stream takes no
    more events and cannot be synchronized, as a released OpenCL queue (the plain simulator
    accepts any handle).
    """

    def __init__(self, capacity: int) -> None:
        super().__init__(device_count=2, capacity=capacity)
        self.armed: dict[str, type[Exception]] = {}
        self.fired: Counter[str] = Counter()
        self.destroyed: set[int] = set()
        self._faults = threading.Lock()

    def arm(self, method: str, error: type[Exception]) -> None:
        with self._faults:
            self.armed[method] = error

    def disarm(self) -> None:
        with self._faults:
            self.armed.clear()

    def _trip(self, method: str) -> None:
        if not self.armed:
            return
        with self._faults:
            error = self.armed.pop(method, None)
            if error is not None:
                self.fired[method] += 1
        if error is not None:
            raise error("injected")

    def _check_alive(self, stream: int) -> None:
        if stream in self.destroyed:
            raise ValueError(f"stream {stream:#x} was destroyed")

    def malloc(self, index: int, nbytes: int) -> int:
        self._trip("malloc")
        return super().malloc(index, nbytes)

    def free(self, index: int, ptr: int) -> None:
        self._trip("free")
        super().free(index, ptr)

    def vm_map(self, index: int, address: int, nbytes: int) -> None:
        self._trip("vm_map")
        super().vm_map(index, address, nbytes)

    def vm_unmap(self, index: int, address: int, nbytes: int) -> None:
        self._trip("vm_unmap")
        super().vm_unmap(index, address, nbytes)

    def event_create(self, index: int, timing: bool) -> Any:
        self._trip("event_create")
        return super().event_create(index, timing)

    def event_record(self, event: Any, index: int, stream: int) -> None:
        self._trip("event_record")
        self._check_alive(stream)
        super().event_record(event, index, stream)

    def stream_synchronize(self, index: int, stream: int) -> None:
        self._check_alive(stream)
        super().stream_synchronize(index, stream)

    def stream_destroy(self, index: int, stream: int) -> None:
        self.destroyed.add(stream)
        super().stream_destroy(index, stream)


# ---------------------------------------------------------------------- the books
@dataclass(eq=False)
class Held:
    """A live buffer as the program sees it: its pool, streams it was used on, its bytes."""

    buffer: acc.Buffer
    pool: PoolId = DEFAULT_POOL
    uses: set[int] = field(default_factory=set)  # record_stream handles, not its own stream
    data: bytes | None = None  # what was written into it, when it was


def check_books(
    backend: FaultySim,
    held: Sequence[Held],
    baselines: dict[int, dict[str, int]],
    pools: Collection[PoolId],
) -> list[str]:
    """Return what is wrong with every device's allocator, given the buffers the program holds.

    ``baselines`` holds each device's statistics at its last ``reset_accumulated_memory_stats``;
    ``pools`` the ids of the ``MemPool`` s still alive. Call it when no thread is inside the
    allocator.
    """
    problems: list[str] = []
    for index in range(backend.device_count()):
        mine = [h for h in held if h.buffer.device.index == index]
        alloc = acc.memory.get_allocator(index)
        found = _check_device(alloc, mine, baselines.get(index, {}), pools)
        problems += [f"sim:{index}: {problem}" for problem in found]
    return problems


def _check_device(
    alloc: CachingAllocator,
    held: Sequence[Held],
    baseline: dict[str, int],
    pools: Collection[PoolId],
) -> Iterator[str]:
    """Yield the device's broken invariants (see :func:`check_books`)."""
    expect: Counter[str] = Counter()  # "<stat>.small_pool" / "<stat>.large_pool" -> value

    def count(name: str, block: Block, amount: int = 1) -> None:
        expect[f"{name}.{'small_pool' if block.pool.is_small else 'large_pool'}"] += amount

    holders: dict[int, Held] = {}
    for h in held:
        buf, block = h.buffer, h.buffer.block
        if id(block) in holders:
            yield f"two buffers share {block!r}"
        holders[id(block)] = h
        if not block.allocated or block.requested_size != buf.nbytes or buf.ptr != block.address:
            yield f"{buf!r} holds {block!r} (requested {block.requested_size})"
        if block.size < buf.nbytes or block.pool.pool_id != h.pool:
            yield f"{buf!r} got {block!r} of pool {block.pool.pool_id}, not {h.pool}"
        if h.data is not None:
            out = bytearray(buf.nbytes)
            acc.copy_(out, buf)
            if out != h.data:
                yield f"the bytes of {buf!r} changed"
        for name, amount in (("allocation", 1), ("allocated_bytes", block.size)):
            count(name, block, amount)
    spans = sorted((h.buffer.block.address, h.buffer.block.size) for h in held)
    for (start, size), (following, _) in itertools.pairwise(spans):
        if start + size > following:
            yield f"live blocks at {start:#x} (+{size}) and {following:#x} overlap"
    allocated = 0
    end = 0
    for segment, blocks in alloc.segments():
        if segment.address < end:
            yield f"{segment!r} overlaps the segment before it"
        address, mapped = segment.address, 0
        for block in blocks:
            if block.address != address or block.segment is not segment or block.size <= 0:
                yield f"{block!r} does not follow on at {address:#x} in {segment!r}"
            address = block.address + block.size
            mapped += block.size if block.mapped else 0
            # held, or freed and waiting for streams (or, set aside while a pool routing was
            # underway, for their events to be recorded)
            if block.allocated or block.event_count or block.stream_uses:
                allocated += block.allocated
                if block.allocated and id(block) not in holders:
                    yield f"{block!r} is allocated but no buffer holds it"
                if not block.mapped or block.pool.get(block.address) is block:
                    yield f"active {block!r} is unmapped or in its pool"
                for name, amount in (
                    ("active", 1),
                    ("active_bytes", block.size),
                    ("requested_bytes", block.requested_size),
                ):
                    count(name, block, amount)
            elif block.pool.get(block.address) is not block:
                yield f"{block!r} is stranded: neither allocated, pending nor in its pool"
            elif not segment.is_expandable and len(blocks) > 1:
                count("inactive_split", block)
                count("inactive_split_bytes", block, block.size)
        for left, right in itertools.pairwise(blocks):
            same_owner = left.stream == right.stream  # policy:accelrt: owners never merge
            if left.is_free() and right.is_free() and left.mapped is right.mapped and same_owner:
                yield f"free neighbours {left!r} and {right!r} were not merged"
        if address != segment.address + segment.size:
            yield f"the blocks of {segment!r} end at {address:#x}"
        end = address
        first = blocks[0]
        if segment.is_expandable:
            count("reserved_bytes", first, mapped)
            if mapped != segment.mapped_bytes:
                yield f"{segment!r} has {mapped} bytes in mapped blocks"
        else:
            count("reserved_bytes", first, segment.size)
            count("segment", first)
    if allocated != len(held):
        yield f"{len(held)} buffers are live but {allocated} blocks allocated"
    in_use = {segment.pool.pool_id for segment, _ in alloc.segments()}
    for pool_id in set(alloc.pool_ids()) - set(pools) - in_use:
        yield f"the dropped MemPool {pool_id} holds no segment but is not forgotten"
    stats = alloc.memory_stats()
    for name in STATS:
        small, large = expect[f"{name}.small_pool"], expect[f"{name}.large_pool"]
        for pool, value in (("small_pool", small), ("large_pool", large), ("all", small + large)):
            key = f"{name}.{pool}"
            current = stats[f"{key}.current"]
            if current != value or stats[f"{key}.peak"] < current:
                yield f"{key}.current is {current} (peak {stats[key + '.peak']}), books: {value}"
            since_reset = current - baseline.get(f"{key}.current", 0)
            if stats[f"{key}.allocated"] - stats[f"{key}.freed"] != since_reset:
                yield f"{key}.allocated - freed != the change of current since the reset"
    negative = sorted(k for k, v in stats.items() if v < 0 and k != "max_split_size")  # -1: none
    if negative:
        yield f"negative statistics: {negative}"
    free, total = alloc.backend.mem_get_info(alloc.device_index)
    if not stats["reserved_bytes.all.current"] == alloc.reserved_bytes == total - free:
        yield f"reserved {alloc.reserved_bytes} but the device holds {total - free}"


def pending_blocks(alloc: CachingAllocator) -> list[Block]:
    """The freed blocks that still wait for events of other streams."""
    return [b for _, blocks in alloc.segments() for b in blocks if b.event_count]


# ---------------------------------------------------------------------- the runtime
class Rig:
    """A fresh runtime whose accelerator is a :class:`FaultySim`: what workers share."""

    def __init__(self, capacity: int) -> None:
        reset_runtime()
        self.capacity = capacity
        self.backend = FaultySim(capacity)
        install_backend("sim", self.backend)
        acc.backends.use("sim")
        self.streams: list[acc.Stream] = []  # every worker's streams, for record_stream
        self.pools = [MemPool(), MemPool()]
        self.baselines: dict[int, dict[str, int]] = {}

    def reset_accumulated(self, device: int = 0) -> None:
        """``reset_accumulated_memory_stats`` and note the statistics it left, atomically."""
        alloc = acc.memory.get_allocator(device)
        with alloc._lock:
            acc.reset_accumulated_memory_stats(device)
            self.baselines[device] = alloc.memory_stats()

    def check(self, held: Sequence[Held]) -> list[str]:
        return check_books(self.backend, held, self.baselines, [p.id for p in self.pools])

    def release_all(self, held: list[Held]) -> list[str]:
        """Free every buffer and empty every cache; return what is wrong (memory left included)."""
        self.backend.disarm()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)  # streams gone since record_stream
            while held:
                held.pop().buffer.free()
        for index in range(self.backend.device_count()):
            acc.empty_cache(index)
        problems = self.check([])
        for index in range(self.backend.device_count()):
            alloc = acc.memory.get_allocator(index)
            if alloc.reserved_bytes or alloc.segments():
                problems.append(f"sim:{index}: {alloc.reserved_bytes} bytes reserved at the end")
        return problems

    def close(self) -> None:
        self.backend.disarm()
        reset_runtime()


def apply_settings(text: str, fresh: bool) -> None:
    """``set_allocator_settings(text)``; ``fresh``: the settings become ``text`` alone."""
    if fresh:
        replace_allocator_settings(AllocatorConfig.parse(text))
    else:
        acc.set_allocator_settings(text)


# ---------------------------------------------------------------------- workers
class Worker:
    """One thread's random operations through the public API, and the buffers it holds.

    ``weights`` maps operation names (the methods below) to how often they run. Out of memory
    and injected faults are expected; anything else raised is a bug.
    """

    MAX_HELD = 48

    def __init__(self, rig: Rig, seed: int, weights: dict[str, float]) -> None:
        self.rig = rig
        self.rng = random.Random(seed)
        self.kinds = list(weights)
        self.cumulative = list(itertools.accumulate(weights.values()))
        self.stream = acc.Stream()
        self.side: acc.Stream | None = None  # a stream this worker makes and destroys
        rig.streams.append(self.stream)
        self.held: list[Held] = []
        self.counts: Counter[str] = Counter()
        self.problems: list[str] = []

    def step(self) -> None:
        kind = self.rng.choices(self.kinds, cum_weights=self.cumulative)[0]
        self.counts[kind] += 1
        try:
            getattr(self, kind)()
        except acc.OutOfMemoryError:
            self.counts["out of memory"] += 1
        except INJECTED:
            self.counts["injected fault raised"] += 1

    def _size(self) -> int:
        roll = self.rng.random()
        if roll < 0.01:
            return self.rig.capacity + self.rng.randint(1, 64 * MiB)  # more than the device
        low, high = SIZE_CLASSES[0 if roll < 0.5 else 1 if roll < 0.93 else 2]
        return self.rng.randint(low, high)

    def _alloc(self, nbytes: int, pool: MemPool | None = None) -> Held:
        if len(self.held) >= self.MAX_HELD:
            self.free()
        if pool is None:
            held = Held(acc.empty(nbytes, stream=self.stream))
        else:
            with use_mem_pool(pool):
                held = Held(acc.empty(nbytes, stream=self.stream), pool.id)
        self.held.append(held)
        return held

    def _pick(self) -> Held | None:
        return self.held[self.rng.randrange(len(self.held))] if self.held else None

    def alloc(self) -> None:
        self._alloc(self._size())

    def pool_alloc(self) -> None:
        self._alloc(self._size(), self.rng.choice(self.rig.pools))

    def free(self) -> None:
        if self.held:
            self.held.pop(self.rng.randrange(len(self.held))).buffer.free()

    def record_stream(self) -> Held | None:
        held = self._pick()
        if held is not None:
            stream = self.rng.choice(self.rig.streams)
            acc.record_stream(held.buffer, stream)
            if stream != held.buffer.stream:
                held.uses.add(stream.handle)
        return held

    def record_free(self) -> None:
        held = self.record_stream()
        if held is not None:
            self.held.remove(held)
            held.buffer.free()

    def empty_cache(self) -> None:
        acc.empty_cache()

    def round_trip(self) -> None:
        data = self.rng.randbytes(self.rng.randint(1, 64 * KiB))
        held = self._alloc(len(data))
        acc.copy_(held.buffer, data, stream=self.stream)
        out = np.empty(len(data), dtype=np.uint8)
        acc.copy_(out, held.buffer, stream=self.stream)
        self.stream.synchronize()
        if out.tobytes() != data:
            self.problems.append(f"{held.buffer!r} read back other bytes than written")
        held.data = data

    def cycle_stream(self) -> None:
        """Destroy this worker's side stream (others may have recorded uses on it), make one."""
        old, self.side = self.side, acc.Stream()
        # a new list, not an edit: other threads pick from the list they read
        self.rig.streams = [s for s in self.rig.streams if s is not old] + [self.side]
        del old  # destroyed now, unless a buffer was allocated on it
        let_go()

    def replace_pool(self) -> None:
        """Drop a shared ``MemPool`` (its blocks may be live in any thread), make a new one."""
        pools = list(self.rig.pools)
        pools[self.rng.randrange(len(pools))] = MemPool()
        self.rig.pools = pools  # a new list: other threads pick from the list they read

    def settings(self) -> None:
        apply_settings(*self.rng.choice(SETTINGS))

    def fraction(self) -> None:
        acc.set_per_process_memory_fraction(self.rng.choice((0.5, 0.75, 1.0, 1.0, 1.0)))

    def reset_stats(self) -> None:
        if self.rng.random() < 0.5:
            acc.reset_peak_memory_stats()
        else:
            self.rig.reset_accumulated()

    def fault(self) -> None:
        self.rig.backend.arm(self.rng.choice(FAULTY), self.rng.choice(INJECTED))


def run_workers(
    rig: Rig,
    workers: Sequence[Worker],
    operations_each: int,
    check_every: int,
    on_check: Callable[[list[str]], None],
) -> None:
    """Run each worker in a thread of its own for ``operations_each`` steps.

    Every ``check_every`` steps the threads meet and one of them checks the books
    (``on_check`` gets the problems found). Re-raises the first error of a thread.
    """

    def check() -> None:
        try:
            problems = rig.check([h for w in workers for h in w.held])
        except Exception as exc:  # a check that cannot run is a broken invariant too
            problems = [f"the check raised {exc!r}"]
        on_check(problems)

    barrier = threading.Barrier(len(workers), action=check)
    errors: list[BaseException] = []

    def loop(worker: Worker) -> None:
        try:
            for done in range(1, operations_each + 1):
                worker.step()
                if done % check_every == 0:
                    barrier.wait()
        except BaseException as exc:
            errors.append(exc)
            barrier.abort()

    threads = [threading.Thread(target=loop, args=(w,), daemon=True) for w in workers]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    real = [e for e in errors if not isinstance(e, threading.BrokenBarrierError)]
    if errors:
        raise (real or errors)[0]


# ---------------------------------------------------------------------- the state machine
SIZES = st.one_of(*(st.integers(low, high) for low, high in SIZE_CLASSES))
PICK = st.integers(0, 1 << 16)  # an index, modulo the number of things to pick from
AIMED_AT = {  # the operation most likely to call each backend function
    "malloc": "alloc",
    "vm_map": "alloc",
    "free": "empty_cache",
    "vm_unmap": "empty_cache",
    "event_create": "record_free",
    "event_record": "record_free",
}


@contextmanager
def caught_warnings() -> Iterator[list[warnings.WarningMessage]]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        yield caught


class PublicMemoryMachine(RuleBasedStateMachine):
    """Random programs over the public memory API; the books are checked after every step."""

    def __init__(self) -> None:
        super().__init__()
        self.rig = Rig(CAPACITY)
        self.held: list[Held] = []
        self.streams = [acc.current_stream(0), acc.Stream(), acc.Stream()]
        self.allowed: int | None = None  # device 0's memory fraction x capacity, once set
        self.faulty = False  # a fault is armed: fewer exact expectations
        self.failed = False

    @property
    def backend(self) -> FaultySim:
        return self.rig.backend

    # ------------------------------------------------------------------ helpers
    def _alloc(self, nbytes: int, stream: acc.Stream, pool: MemPool | None = None) -> Held | None:
        alloc = acc.memory.get_allocator(stream.device_index)
        before = alloc.memory_stats()
        try:
            if pool is None:
                buf = acc.empty(nbytes, stream=stream)
            else:
                with use_mem_pool(pool):
                    buf = acc.empty(nbytes, stream=stream)
        except acc.OutOfMemoryError as error:
            note("out of memory")
            self._check_out_of_memory(alloc, error, nbytes, before)
            return None
        finally:  # but inside a pool routing (a capture) no event is queried
            if pool is None:
                assert not pending_blocks(alloc), "sim events are complete: processed at malloc"
        block = buf.block
        rounded = acc.memory.round_size(nbytes, alloc.config)
        assert block.pool.is_small == (rounded <= MiB) and block.size >= rounded
        assert block.stream == stream.handle
        held = Held(buf, DEFAULT_POOL if pool is None else pool.id)
        self.held.append(held)
        return held

    def _check_out_of_memory(
        self,
        alloc: CachingAllocator,
        error: acc.OutOfMemoryError,
        nbytes: int,
        before: dict[str, int],
    ) -> None:
        """An out of memory changes no allocation and is real: the device had no room."""
        stats = alloc.memory_stats()
        assert error.requested_bytes == nbytes
        assert stats["num_ooms"] == before["num_ooms"] + 1
        for key in ("allocation.all.current", "allocated_bytes.all.current"):
            assert stats[key] == before[key], key
        rounded = acc.memory.round_size(nbytes, alloc.config)
        if alloc.expandable_segments:  # the pages it could not map (arenas: 2 MiB ones)
            arenas = alloc.config.policy == "accelrt"
            page = 2 * MiB if rounded <= MiB or arenas else 20 * MiB
            need = -(-rounded // page) * page
        else:
            need = error.allocation_bytes
        allowed = self.allowed if alloc.device_index == 0 else None
        refused = allowed is not None and alloc.reserved_bytes + error.allocation_bytes > allowed
        assert refused or error.free_bytes < need, f"{error}: {error.free_bytes} bytes free"

    def _pick(self, pick: int, device: int | None = 0) -> Held | None:
        mine = [h for h in self.held if device is None or h.buffer.device.index == device]
        return mine[pick % len(mine)] if mine else None

    def _record(self, held: Held, stream: acc.Stream) -> None:
        acc.record_stream(held.buffer, stream)
        if stream != held.buffer.stream:
            held.uses.add(stream.handle)

    def _free(self, held: Held) -> None:
        """Free a buffer: its block is free at once, or waits for each live stream it used."""
        self.held.remove(held)
        block = held.buffer.block
        gone = {s for s in held.uses if s in self.backend.destroyed}
        with caught_warnings() as caught:
            held.buffer.free()
        assert held.buffer.freed and not block.allocated
        if self.faulty:
            return
        warned = [w for w in caught if issubclass(w.category, RuntimeWarning)]
        assert len(warned) == len(gone), [str(w.message) for w in warned]
        assert block.event_count == len(held.uses - gone), "one event per live stream used"
        if gone:
            note("free: a stream it was used on is gone (warned)")
        if block.event_count:
            note("free: waits for other streams")

    def _orphans(self) -> list[Held]:
        """The live buffers of dropped ``MemPool`` s."""
        alive = {pool.id for pool in self.rig.pools}
        return [h for h in self.held if h.pool != DEFAULT_POOL and h.pool not in alive]

    def _stream(self, index: int) -> acc.Stream:
        return self.streams[index % len(self.streams)]

    # ------------------------------------------------------------------ allocation
    @rule(nbytes=SIZES, stream=PICK)
    def alloc(self, nbytes: int, stream: int) -> None:
        self._alloc(nbytes, self._stream(stream))

    @rule(nbytes=SIZES)
    def alloc_on_device_1(self, nbytes: int) -> None:
        self._alloc(nbytes, acc.current_stream(1))

    @rule(which=st.integers(0, 1), nbytes=SIZES, stream=PICK)
    def alloc_in_pool(self, which: int, nbytes: int, stream: int) -> None:
        self._alloc(nbytes, self._stream(stream), self.rig.pools[which])

    @rule(times=st.integers(1, 3), extra=st.integers(1, 64 * MiB))
    def alloc_bigger_than_device(self, times: int, extra: int) -> None:
        assert self._alloc(CAPACITY * times + extra, self.streams[0]) is None

    @rule(nbytes=st.integers(1, 256 * KiB), seed=st.integers(0, 2**32 - 1), stream=PICK)
    def round_trip(self, nbytes: int, seed: int, stream: int) -> None:
        """Write random bytes, read them back; the invariant re-reads them after every step."""
        s = self._stream(stream)
        held = self._alloc(nbytes, s)
        if held is None:
            return
        data = np.random.default_rng(seed).integers(0, 256, nbytes, dtype=np.uint8)
        acc.copy_(held.buffer, data, stream=s)
        out = np.zeros_like(data)
        acc.copy_(out, held.buffer, stream=s)
        s.synchronize()
        assert np.array_equal(out, data)
        held.data = data.tobytes()

    # ------------------------------------------------------------------ frees and streams
    @precondition(lambda self: bool(self.held))
    @rule(pick=PICK)
    def free(self, pick: int) -> None:
        held = self._pick(pick, device=None)
        assert held is not None
        self._free(held)

    @precondition(lambda self: bool(self.held))
    @rule(pick=PICK, stream=PICK)
    def record_stream(self, pick: int, stream: int) -> None:
        held = self._pick(pick)
        if held is not None:
            self._record(held, self._stream(stream))

    @precondition(lambda self: bool(self.held))
    @rule(pick=PICK, stream=PICK)
    def record_stream_and_free(self, pick: int, stream: int) -> None:
        held = self._pick(pick)
        if held is not None:
            self._record(held, self._stream(stream))
            self._free(held)

    @precondition(lambda self: bool(self.held))
    @rule(pick=PICK)
    def free_after_recorded_stream_dies(self, pick: int) -> None:
        held = self._pick(pick)
        if held is None:
            return
        doomed = acc.Stream()
        self._record(held, doomed)
        handle = doomed.handle
        del doomed
        let_go()
        assert handle in self.backend.destroyed
        self._free(held)

    @precondition(lambda self: bool(self.held))
    @rule(pick=PICK)
    def drop_buffer(self, pick: int) -> None:
        """Let go of a buffer without freeing it: the garbage collector frees it."""
        held = self._pick(pick, device=None)
        assert held is not None
        self.held.remove(held)
        block = held.buffer.block
        with caught_warnings():
            del held
            let_go()
        assert not block.allocated

    @precondition(lambda self: len(self.streams) < 6)
    @rule()
    def new_stream(self) -> None:
        self.streams.append(acc.Stream())

    @precondition(lambda self: len(self.streams) > 1)
    @rule(pick=PICK)
    def destroy_stream(self, pick: int) -> None:
        stream = self.streams.pop(1 + pick % (len(self.streams) - 1))
        handle = stream.handle
        del stream
        let_go()
        allocated_on = any(h.buffer.stream.handle == handle for h in self.held)
        assert (handle in self.backend.destroyed) is not allocated_on  # buffers keep it alive

    # ------------------------------------------------------------------ cache and settings
    @rule()
    def empty_cache(self) -> None:
        acc.empty_cache()
        alloc = acc.memory.get_allocator(0)
        assert not pending_blocks(alloc)
        for segment, blocks in alloc.segments():
            assert segment.is_expandable or len(blocks) > 1 or not blocks[0].is_free(), segment

    @rule(choice=st.sampled_from(SETTINGS))
    def change_settings(self, choice: tuple[str, bool]) -> None:
        apply_settings(*choice)
        note(f"settings {'fresh ' if choice[1] else ''}{choice[0] or 'defaults'}")

    @rule(fraction=st.sampled_from(FRACTIONS))
    def set_memory_fraction(self, fraction: float) -> None:
        acc.set_per_process_memory_fraction(fraction)
        self.allowed = int(fraction * CAPACITY)

    @rule()
    def reset_peaks(self) -> None:
        acc.reset_peak_memory_stats()
        stats = acc.memory_stats()
        for name in STATS:
            assert stats[f"{name}.all.peak"] == stats[f"{name}.all.current"], name

    @rule()
    def reset_accumulated(self) -> None:
        self.rig.reset_accumulated()
        assert acc.memory_stats()["num_device_alloc"] == 0

    @rule(which=st.integers(0, 1))
    def replace_pool(self, which: int) -> None:
        """Drop a ``MemPool`` (its blocks may still be live) and make a new one."""
        old = weakref.ref(self.rig.pools[which])
        self.rig.pools[which] = MemPool()
        let_go()
        assert old() is None, "the MemPool outlived its last reference"

    # ------------------------------------------------------------------ faults
    def _aim(self, method: str, nbytes: int, stream: acc.Stream) -> None:
        """Make the state in which the operation ``AIMED_AT[method]`` calls ``method``."""
        if method in ("malloc", "vm_map", "free", "vm_unmap"):
            expandable = method.startswith("vm_")
            apply_settings(f"expandable_segments:{expandable}", False)
        if method in ("malloc", "vm_map"):
            acc.empty_cache()  # nothing cached: the allocation needs new memory
        elif method in ("free", "vm_unmap"):  # something cached for empty_cache to give back
            held = self._alloc(nbytes, stream)
            if held is not None:
                self._free(held)
        else:
            if method == "event_create":
                acc.empty_cache()  # no idle event left to reuse: the free must create one
            if self._pick(0) is None:
                self._alloc(nbytes, stream)

    def _record_and_free(self, pick: int, stream: int) -> None:
        held = self._pick(pick, device=None)
        if held is None:
            return
        if held.buffer.device.index == 0:
            others = [s for s in self.streams if s != held.buffer.stream]
            if not others:
                others.append(acc.Stream())
                self.streams.append(others[0])
            self._record(held, others[stream % len(others)])
        self._free(held)

    def _with_fault(
        self, method: str, error: type[Exception], op: str, nbytes: int, pick: int, stream: int
    ) -> None:
        """Arm a fault in one backend call, run ``op``, which may hit it, and disarm."""
        fired = self.backend.fired[method]
        self.faulty = True
        self.backend.arm(method, error)
        try:
            with caught_warnings() as caught:
                if op == "alloc":
                    self._alloc(nbytes, self._stream(stream))
                elif op == "empty_cache":
                    acc.empty_cache()
                elif op == "free_orphan":
                    self._free(self._orphans()[pick % len(self._orphans())])
                else:
                    self._record_and_free(pick, stream)
        except INJECTED:
            note(f"fault: {method} raised out of {op}")
        finally:
            self.backend.disarm()
            self.faulty = False
        # what the run may warn of: the injected fault (a release that failed, an event
        # not recorded), or a freed buffer's stream that is gone (no event recorded on it)
        for w in caught:
            text = str(w.message)
            assert issubclass(w.category, RuntimeWarning), text
            assert "injected" in text or "no event could be recorded" in text, text
        if self.backend.fired[method] > fired:
            note(f"fault: {method} fired in {op}")

    @rule(
        method=st.sampled_from(FAULTY),
        error=st.sampled_from(INJECTED),
        nbytes=SIZES,
        pick=PICK,
        stream=PICK,
    )
    def aimed_fault(
        self, method: str, error: type[Exception], nbytes: int, pick: int, stream: int
    ) -> None:
        """A fault in the backend call an operation is set up to make."""
        op = AIMED_AT[method]
        if method == "free" and pick % 2 and self._orphans():
            op = "free_orphan"  # a dropped pool's memory is released as its blocks are freed
        else:
            self._aim(method, nbytes, self._stream(stream))
        self._with_fault(method, error, op, nbytes, pick, stream)

    @rule(
        method=st.sampled_from(FAULTY),
        error=st.sampled_from(INJECTED),
        op=st.sampled_from(("alloc", "empty_cache", "record_free")),
        nbytes=SIZES,
        pick=PICK,
        stream=PICK,
    )
    def fault(
        self, method: str, error: type[Exception], op: str, nbytes: int, pick: int, stream: int
    ) -> None:
        """A fault in whatever backend call the operation makes first, in any state."""
        self._with_fault(method, error, op, nbytes, pick, stream)

    # ------------------------------------------------------------------ checks
    @invariant()
    def books_balance(self) -> None:
        self.failed = True  # until the check passes: teardown then only cleans up
        problems = self.rig.check(self.held)
        assert not problems, "\n".join(problems)
        self.failed = False

    def teardown(self) -> None:
        try:
            if not self.failed:
                problems = self.rig.release_all(self.held)
                assert not problems, "\n".join(problems)
        finally:
            self.rig.close()


PublicMemoryMachine.TestCase.settings = settings(
    max_examples=200,
    stateful_step_count=60,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
TestPublicMemoryMachine = PublicMemoryMachine.TestCase


# ---------------------------------------------------------------------- threads
THREAD_MIX = {
    "alloc": 30.0,
    "pool_alloc": 5.0,
    "free": 30.0,
    "record_stream": 10.0,
    "record_free": 15.0,
    "round_trip": 2.0,
    "empty_cache": 1.0,
}


@pytest.mark.parametrize("config", ["defaults", "policy:accelrt"])
def test_threads_share_one_device(config: str) -> None:
    """4 threads, each with its own stream, allocate, free, record_stream and empty the cache
    on device 0 at once, switching threads often; the books balance at each meeting point,
    after the join, and once all is freed nothing stays reserved. Under PyTorch's policy and
    accelrt's (whose streams adopt each other's free blocks and move idle pages)."""
    rig = Rig(CAPACITY)
    acc.set_allocator_settings(config)
    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-5)
    try:
        workers = [Worker(rig, seed, THREAD_MIX) for seed in range(4)]
        problems: list[str] = []
        checks: list[int] = []

        def on_check(found: list[str]) -> None:
            checks.append(len(found))
            problems.extend(found)

        run_workers(rig, workers, operations_each=5000, check_every=1250, on_check=on_check)
        sys.setswitchinterval(interval)
        assert len(checks) == 4 and not problems, "\n".join(problems)
        assert not [p for w in workers for p in w.problems]
        held = [h for w in workers for h in w.held]
        assert not rig.check(held)
        counts = sum((w.counts for w in workers), Counter[str]())
        assert sum(counts[kind] for kind in THREAD_MIX) == 4 * 5000
        assert counts["record_free"] > 2000 and counts["empty_cache"] > 100
        problems = rig.release_all(held)
        assert not problems, "\n".join(problems)
    finally:
        sys.setswitchinterval(interval)
        rig.close()
