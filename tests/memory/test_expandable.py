"""Expandable segments: pages mapped on demand, exact to PyTorch's policy (docs/allocator.md 7)."""

from __future__ import annotations

import numpy as np
import pytest

import accelrt as acc
from accelrt.backends.sim import SimBackend
from accelrt.memory import AllocatorConfig, CachingAllocator

MiB = 1 << 20
GiB = 1 << 30


def expandable(capacity: int = GiB) -> tuple[SimBackend, CachingAllocator]:
    backend = SimBackend(device_count=1, capacity=capacity)
    return backend, CachingAllocator(backend, 0, AllocatorConfig.parse("expandable_segments:True"))


def test_one_segment_grows_page_by_page() -> None:
    backend, alloc = expandable()
    a = alloc.malloc(30 * MiB, 0)  # large pool: 20 MiB pages, two mapped
    b = alloc.malloc(30 * MiB, 0)  # the remainder (10 MiB) + one more page
    stats = alloc.memory_stats()
    assert b.address == a.address + 30 * MiB  # one growing range, no gap
    assert stats["reserved_bytes.large_pool.current"] == 60 * MiB
    assert stats["num_device_alloc"] == 2  # 40 MiB for a, then one more 20 MiB page for b
    assert stats["segment.all.current"] == 0
    assert stats["inactive_split.all.current"] == 0  # never counted for expandable segments
    assert backend.mem_get_info(0) == (GiB - 60 * MiB, GiB)
    [(segment, blocks)] = alloc.segments()
    assert segment.is_expandable and segment.size == 1160 * MiB  # 1.125 GiB in 20 MiB pages
    assert [(blk.size, blk.allocated, blk.mapped) for blk in blocks] == [
        (30 * MiB, True, True),
        (30 * MiB, True, True),
        (segment.size - 60 * MiB, False, False),
    ]


def test_split_rule_is_512_bytes_with_expandable_segments() -> None:
    _, alloc = expandable()
    block = alloc.malloc(11 * MiB, 0)  # ordinary segments would hand out 12 MiB whole
    assert block.size == 11 * MiB
    assert alloc.memory_stats()["allocated_bytes.all.current"] == 11 * MiB


def test_empty_cache_unmaps_whole_free_pages_and_releases_the_range() -> None:
    backend, alloc = expandable()
    a = alloc.malloc(30 * MiB, 0)
    b = alloc.malloc(5 * MiB, 0)
    alloc.free(a)
    alloc.empty_cache()  # [0, 30) free: page 0 unmapped, [20, 30) stays mapped (page 1 in use)
    stats = alloc.memory_stats()
    assert stats["reserved_bytes.all.current"] == 20 * MiB
    assert stats["num_device_free"] == 1
    alloc.free(b)
    alloc.empty_cache()
    stats = alloc.memory_stats()
    assert stats["reserved_bytes.all.current"] == 0
    assert stats["num_device_free"] == 2
    assert alloc.segments() == []  # the address range was given back
    assert backend.mem_get_info(0) == (GiB, GiB)


def test_snapshot_shows_mapped_ranges_and_history_has_map_entries() -> None:
    _, alloc = expandable()
    alloc.record_history("all", None, 100)
    a = alloc.malloc(30 * MiB, 0)
    b = alloc.malloc(30 * MiB, 0)
    alloc.free(a)
    alloc.empty_cache()
    segments, entries = alloc.snapshot()
    assert [(s["address"] - b.address, s["total_size"], s["is_expandable"]) for s in segments] == [
        (-10 * MiB, 40 * MiB, True)  # page 0 unmapped; pages 1-2 mapped
    ]
    assert [(e["action"], e["size"]) for e in entries if e["action"].startswith("segment")] == [
        ("segment_map", 40 * MiB),
        ("segment_map", 20 * MiB),
        ("segment_unmap", 20 * MiB),
    ]
    alloc.free(b)


def test_out_of_memory_maps_nothing_and_the_hint_is_honest() -> None:
    backend, alloc = expandable(capacity=64 * MiB)
    a = alloc.malloc(50 * MiB, 0)  # 60 MiB mapped
    with pytest.raises(acc.OutOfMemoryError) as info:
        alloc.malloc(30 * MiB, 0)
    assert "expandable segments are already on" in str(info.value)
    stats = alloc.memory_stats()
    assert stats["num_ooms"] == 1 and stats["num_alloc_retries"] == 1
    assert stats["reserved_bytes.all.current"] == 60 * MiB == backend.capacity - 4 * MiB
    alloc.free(a)
    b = alloc.malloc(60 * MiB, 0)  # reuses the mapped pages
    assert b.address == a.address and alloc.memory_stats()["num_device_alloc"] == 1
    alloc.free(b)


def test_switching_off_skips_expandable_blocks() -> None:
    _, alloc = expandable()
    block = alloc.malloc(MiB + 1, 0)
    alloc.free(block)  # a cached, mapped, free expandable block
    alloc.set_config(AllocatorConfig())
    other = alloc.malloc(MiB + 1, 0)
    assert not other.segment.is_expandable
    assert alloc.memory_stats()["segment.all.current"] == 1
    alloc.free(other)


def test_data_round_trips_across_pages() -> None:
    _, alloc = expandable()
    backend = alloc.backend
    block = alloc.malloc(45 * MiB, 0)
    data = np.random.default_rng(0).integers(0, 256, 45 * MiB, dtype=np.uint8)
    backend.memcpy_async(0, block.address, memoryview(data), data.nbytes, 0)
    out = np.empty_like(data)
    backend.memcpy_async(0, memoryview(out), block.address, data.nbytes, 0)
    assert np.array_equal(out, data)
    alloc.free(block)


def test_public_api_uses_them_on_sim(sim: str) -> None:
    acc.set_allocator_settings("expandable_segments:True")
    host = np.arange(3 << 20, dtype=np.uint8)
    buf = acc.empty(host.nbytes)
    acc.copy_(buf, host)
    assert np.array_equal(buf.numpy(), host)
    snapshot = acc.memory_snapshot()
    assert [s["is_expandable"] for s in snapshot["segments"]] == [True]
    assert snapshot["allocator_settings"]["expandable_segments"] is True
    buf.free()
