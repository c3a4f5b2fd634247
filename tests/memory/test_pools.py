"""Private memory pools: MemPool and use_mem_pool (mirror torch.cuda.MemPool)."""

from __future__ import annotations

import asyncio
import gc
import threading

import pytest

import accelrt as acc
from accelrt.memory import MemPool, use_mem_pool

MiB = 1 << 20


def test_allocations_inside_go_to_the_pool_and_are_reused_only_there(device: str) -> None:
    pool = MemPool()
    with use_mem_pool(pool):
        inside = acc.empty(MiB)
    outside = acc.empty(MiB)  # a segment of its own: the pool's cached block is not used
    assert pool.memory_reserved() == 2 * MiB and pool.memory_allocated() == MiB
    assert acc.memory_reserved() == 4 * MiB  # device-wide stats count every pool
    address = inside.ptr
    inside.free()  # after the context: back to its own pool
    again = acc.empty(MiB)
    assert again.ptr != address
    with use_mem_pool(pool):
        reused = acc.empty(MiB)
    assert reused.ptr == address
    snapshot_ids = {s["segment_pool_id"] for s in acc.memory_snapshot()["segments"]}
    assert snapshot_ids == {(0, 0), pool.id}
    assert [s["segment_pool_id"] for s in pool.snapshot()] == [pool.id]
    for buf in (outside, again, reused):
        buf.free()


def test_memory_stats_count_each_private_pools_reserved_bytes(device: str) -> None:
    pool = MemPool()
    key = "reserved_bytes_by_private_pools.{}_{}".format(*pool.id)
    assert not any(k.startswith("reserved_bytes_by_private_pools") for k in acc.memory_stats())
    with use_mem_pool(pool):
        small = acc.empty(MiB)  # a 2 MiB small segment
        large = acc.empty(3 * MiB)  # a 20 MiB large one
    outside = acc.empty(MiB)  # the default pool's: not the private pool's
    stats = acc.memory_stats()
    assert stats[f"{key}.all.current"] == 22 * MiB
    assert stats[f"{key}.small_pool.current"] == 2 * MiB
    assert stats[f"{key}.large_pool.current"] == 20 * MiB
    assert stats["reserved_bytes.all.current"] == 24 * MiB
    for buf in (small, large, outside):
        buf.free()
    acc.empty_cache()
    stats = acc.memory_stats()
    assert (stats[f"{key}.all.current"], stats[f"{key}.all.peak"]) == (0, 22 * MiB)
    assert (stats[f"{key}.all.allocated"], stats[f"{key}.all.freed"]) == (22 * MiB, 22 * MiB)
    acc.reset_peak_memory_stats()
    acc.reset_accumulated_memory_stats()
    stats = acc.memory_stats()
    assert [stats[f"{key}.all.{m}"] for m in ("current", "peak", "allocated", "freed")] == [0] * 4


def test_empty_cache_releases_what_a_pool_caches(device: str) -> None:
    pool = MemPool()
    with use_mem_pool(pool):
        acc.empty(3 * MiB).free()
    assert pool.memory_reserved() == 20 * MiB
    acc.empty_cache()
    assert pool.memory_reserved() == 0 and acc.memory_reserved() == 0


def test_pool_memory_is_released_when_the_pool_and_its_blocks_are_gone(device: str) -> None:
    pool = MemPool()
    with use_mem_pool(pool):
        kept = acc.empty(5 * MiB)
        acc.empty(MiB).free()
    assert acc.memory_reserved() == 22 * MiB
    del pool
    gc.collect()
    assert acc.memory_reserved() == 20 * MiB  # the free small segment went at once
    kept.free()  # works: the block keeps its pool alive until now
    assert acc.memory_reserved() == 0
    assert acc.memory_stats()["num_device_free"] == 2


def test_pools_are_per_thread(sim: str) -> None:
    pool = MemPool()
    seen: list[tuple[int, int]] = []
    blocks: list[acc.Buffer] = []

    def other_thread() -> None:
        buf = acc.empty(MiB, device=0)
        blocks.append(buf)
        seen.append(buf.block.pool.pool_id)

    with use_mem_pool(pool):
        thread = threading.Thread(target=other_thread)
        thread.start()
        thread.join()
        mine = acc.empty(MiB)
    assert seen == [(0, 0)] and mine.block.pool.pool_id == pool.id
    for buf in (*blocks, mine):
        buf.free()


def test_nested_pools(sim: str) -> None:
    outer, inner = MemPool(), MemPool()
    with use_mem_pool(outer):
        a = acc.empty(100)
        with use_mem_pool(inner):
            b = acc.empty(100)
        c = acc.empty(100)
    assert [x.block.pool.pool_id for x in (a, b, c)] == [outer.id, inner.id, outer.id]
    assert inner.id[0] == 0 and inner.id[1] == outer.id[1] + 1
    for buf in (a, b, c):
        buf.free()


def test_pools_exited_out_of_order_leave_the_routing_consistent(sim: str) -> None:
    # Two asyncio tasks on one thread: task 1 enters p1, task 2 enters p2, task 1 exits p1
    # while p2 is still entered. The exit used to raise ValueError and leave p1 routed, so
    # after p2's exit the thread still allocated into p1 (issue 26).
    p1, p2 = MemPool(), MemPool()
    owners: dict[str, tuple[int, int]] = {}
    step = [asyncio.Event() for _ in range(3)]

    async def task_one() -> None:
        with use_mem_pool(p1):
            step[0].set()
            await step[1].wait()
        buf = acc.empty(100)  # p2 is still entered by task two
        owners["after p1 exit"] = buf.block.pool.pool_id
        buf.free()
        step[2].set()

    async def task_two() -> None:
        await step[0].wait()
        with use_mem_pool(p2):
            step[1].set()
            await step[2].wait()
        buf = acc.empty(100)
        owners["after both exits"] = buf.block.pool.pool_id
        buf.free()

    async def main() -> None:
        await asyncio.gather(task_one(), task_two())

    asyncio.run(main())
    assert owners == {"after p1 exit": p2.id, "after both exits": (0, 0)}


def test_use_count_counts_the_object_and_its_contexts(sim: str) -> None:
    pool = MemPool()
    assert pool.use_count() == 1
    seen: list[int] = []
    with use_mem_pool(pool):
        seen.append(pool.use_count())
        with use_mem_pool(pool):
            seen.append(pool.use_count())
            thread = threading.Thread(target=lambda: seen.append(pool.use_count()))
            thread.start()
            thread.join()
        seen.append(pool.use_count())
    assert seen == [2, 3, 3, 2] and pool.use_count() == 1


def test_a_pool_belongs_to_one_device(sim: str) -> None:
    pool = MemPool()
    with use_mem_pool(pool, device=0):
        buf = acc.empty(100, device=0)
        other = acc.empty(100, device=1)  # other devices keep their default pool
    assert pool.device == acc.Device("sim", 0) and other.block.pool.pool_id == (0, 0)
    with (
        pytest.raises(ValueError, match=r"belongs to device sim:0; it cannot be used on sim:1"),
        use_mem_pool(pool, device=1),
    ):
        pass
    with use_mem_pool(pool, device=0):  # still usable on its device afterwards
        again = acc.empty(100, device=0)
    assert again.block.pool.pool_id == pool.id
    for b in (buf, other, again):
        b.free()


def test_bad_arguments(sim: str) -> None:
    with (
        pytest.raises(TypeError, match=r"takes an accelrt\.memory\.MemPool"),
        use_mem_pool("pool"),  # type: ignore[arg-type]
    ):
        pass
    assert MemPool().snapshot() == [] and MemPool().device is None


def test_expandable_segments_in_a_pool(sim: str) -> None:
    acc.set_allocator_settings("expandable_segments:True")
    pool = MemPool()
    with use_mem_pool(pool):
        buf = acc.empty(30 * MiB)
    plain = acc.empty(30 * MiB)
    [segment] = pool.snapshot()
    assert segment["is_expandable"] and segment["total_size"] == 40 * MiB
    assert plain.ptr - buf.ptr != 30 * MiB  # two expandable segments, one per pool
    buf.free()
    plain.free()


def test_empty_cache_releases_two_dropped_pools_whose_release_failed(
    sim: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Forgetting the first dropped pool once its segment is gone must not lose the second one
    # (the loop over the pools once raised KeyError there).
    backend = acc.backends.get_backend("sim")
    pools = [MemPool(), MemPool()]
    held = []
    for pool in pools:
        with use_mem_pool(pool):
            held.append(acc.empty(MiB))
    del pools, pool
    gc.collect()  # the owners are gone; their live blocks keep the segments

    def failing_free(index: int, ptr: int) -> None:
        raise RuntimeError("injected: the driver cannot free now")

    with monkeypatch.context() as patch:
        patch.setattr(backend, "free", failing_free)
        for buf in held:
            with pytest.warns(RuntimeWarning, match="injected"):
                buf.free()
    assert acc.memory_reserved() == 4 * MiB  # both segments still held, by dropped pools
    acc.empty_cache()
    assert acc.memory_reserved() == 0
    assert acc.memory_stats()["num_device_free"] == 2
