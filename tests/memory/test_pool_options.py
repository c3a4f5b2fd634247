"""MemPool(allocator=, use_on_oom=, no_split=) and PluggableAllocator (torch.cuda.MemPool's)."""

from __future__ import annotations

import numpy as np
import pytest

import accelrt as acc
from accelrt.memory import MemPool, PluggableAllocator, use_mem_pool

MiB = 1 << 20


def test_no_split_hands_out_whole_blocks(device: str) -> None:
    pool = MemPool(no_split=True)
    with use_mem_pool(pool):
        a = acc.empty(1000)
        b = acc.empty(1000)  # a's segment is not split: a segment of its own
        large = acc.empty(5 * MiB)  # the whole 20 MiB segment of a mid-size request
    assert (a.block.size, b.block.size, large.block.size) == (2 * MiB, 2 * MiB, 20 * MiB)
    assert b.ptr != a.ptr + 1024
    assert pool.memory_reserved() == pool.memory_allocated() == 24 * MiB
    stats = acc.memory_stats()
    assert stats["allocated_bytes.small_pool.current"] == 4 * MiB
    assert stats["requested_bytes.all.current"] == 2000 + 5 * MiB
    assert stats["inactive_split.all.current"] == 0
    address = a.ptr
    a.free()
    with use_mem_pool(pool):
        again = acc.empty(MiB)  # the whole free 2 MiB block
    assert (again.ptr, again.block.size) == (address, 2 * MiB)
    for buf in (b, large, again):
        buf.free()


def test_a_pool_without_no_split_splits_as_the_default_pools_do(sim: str) -> None:
    pool = MemPool()
    with use_mem_pool(pool):
        a = acc.empty(1000)
        b = acc.empty(1000)
    assert b.ptr == a.ptr + 1024 and a.block.size == 1024
    assert pool.memory_reserved() == 2 * MiB and pool.memory_allocated() == 2048
    a.free()
    b.free()


def _cap_at_what_is_held() -> None:
    """Let the device reserve nothing more than the 2 MiB segment the tests hold."""
    total = acc.get_memory_info()[1]
    acc.set_per_process_memory_fraction((2 * MiB + 4096) / total)


def test_use_on_oom_lends_a_free_block_to_a_request_that_ran_out(device: str) -> None:
    lender = MemPool(use_on_oom=True)
    with use_mem_pool(lender):
        first = acc.empty(512)
        kept = acc.empty(512)  # keeps the segment split: the retry cannot release it
    first.free()
    _cap_at_what_is_held()
    borrowed = acc.empty(100_000)  # outside any pool: no segment can be made
    assert borrowed.block.pool.pool_id == lender.id
    assert borrowed.ptr == kept.ptr + 512 and borrowed.block.size == 100_352
    assert acc.memory_stats()["num_ooms"] == 0 and acc.memory_reserved() == 2 * MiB
    assert lender.memory_allocated() == 512 + 100_352
    borrowed.free()  # back to the lender
    assert lender.memory_allocated() == 512
    with pytest.raises(acc.OutOfMemoryError):  # the lender has no free block this big
        acc.empty(3 * MiB)
    with use_mem_pool(MemPool()), pytest.raises(acc.OutOfMemoryError):
        acc.empty(1000)  # a request inside another pool never borrows
    assert acc.memory_stats()["num_ooms"] == 2
    kept.free()


def test_a_pool_without_use_on_oom_lends_nothing(sim: str) -> None:
    pool = MemPool()
    with use_mem_pool(pool):
        first = acc.empty(512)
        kept = acc.empty(512)
    first.free()
    _cap_at_what_is_held()
    with pytest.raises(acc.OutOfMemoryError):
        acc.empty(100_000)
    assert acc.memory_stats()["num_ooms"] == 1
    kept.free()


def test_a_pluggable_allocator_gives_the_pool_its_segments(device: str) -> None:
    backend = acc.memory.get_allocator().backend
    calls: list[tuple[object, ...]] = []

    def alloc(size: int, device: int, stream: int) -> int:
        calls.append(("alloc", size, device, stream))
        return backend.malloc(device, size)

    def free(address: int, size: int, device: int, stream: int) -> None:
        calls.append(("free", address, size, device, stream))
        backend.free(device, address)

    custom = PluggableAllocator(alloc, free)
    pool = MemPool(custom)
    assert pool.allocator is custom and not pool.use_on_oom and not pool.no_split
    handle = acc.current_stream().handle
    with use_mem_pool(pool):
        small = acc.empty(1000)
        large = acc.empty(3 * MiB)
    outside = acc.empty(1000)  # the default pool: the device's own memory
    assert calls == [("alloc", 2 * MiB, 0, handle), ("alloc", 20 * MiB, 0, handle)]
    data = np.arange(1000, dtype=np.uint8)
    acc.copy_(small, data)
    back = np.zeros(1000, dtype=np.uint8)
    acc.copy_(back, small)
    acc.synchronize()
    assert (back == data).all()
    small_address, large_address = small.ptr, large.ptr
    for buf in (small, large, outside):
        buf.free()
    acc.empty_cache()
    assert calls[2:] == [
        ("free", large_address, 20 * MiB, 0, handle),
        ("free", small_address, 2 * MiB, 0, handle),
    ]
    assert acc.memory_reserved() == 0


def test_a_pluggable_allocator_that_returns_0_is_out_of_memory(sim: str) -> None:
    pool = MemPool(PluggableAllocator(lambda size, device, stream: 0, lambda *args: None))
    with use_mem_pool(pool), pytest.raises(acc.OutOfMemoryError):
        acc.empty(1000)
    assert acc.memory_stats()["num_ooms"] == 1 and acc.memory_reserved() == 0


def test_a_pool_with_an_allocator_never_uses_expandable_segments(sim: str) -> None:
    backend = acc.memory.get_allocator().backend
    acc.set_allocator_settings("expandable_segments:True")
    pool = MemPool(
        PluggableAllocator(
            lambda size, device, stream: backend.malloc(device, size),
            lambda address, size, device, stream: backend.free(device, address),
        )
    )
    with use_mem_pool(pool):
        mine = acc.empty(1000)
    other = acc.empty(1000)
    expandable = {
        s["segment_pool_id"]: s["is_expandable"] for s in acc.memory_snapshot()["segments"]
    }
    assert expandable == {pool.id: False, (0, 0): True}
    mine.free()
    other.free()


def test_bad_pool_options_and_allocators(sim: str) -> None:
    with pytest.raises(TypeError, match=r"MemPool allocator must be an accelrt\.memory"):
        MemPool(allocator=object())  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="MemPool use_on_oom must be a bool, got 1"):
        MemPool(use_on_oom=1)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="MemPool no_split must be a bool, got 'yes'"):
        MemPool(no_split="yes")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"alloc_fn must be callable, got 1; pass a function"):
        PluggableAllocator(1, print)  # type: ignore[arg-type]
    pool = MemPool(PluggableAllocator(lambda size, device, stream: "0x10", lambda *args: None))
    with (
        use_mem_pool(pool),
        pytest.raises(TypeError, match=r"alloc_fn returned '0x10' for 2097152 bytes"),
    ):
        acc.empty(1000)
    assert acc.memory_reserved() == 0
    with pytest.raises(TypeError, match="include_traces must be a bool, got 'no'"):
        pool.snapshot(include_traces="no")  # type: ignore[arg-type]
    assert pool.snapshot(include_traces=False) == pool.snapshot() == []
    assert repr(MemPool(use_on_oom=True, no_split=True)).endswith(
        ", device=None, use_on_oom=True, no_split=True)"
    )
