"""policy:accelrt: arenas shared by every stream, 2 MiB pages, idle pages moved on a miss
(docs/allocator.md section 16). Exact byte counts, against expandable segments' on the same
calls."""

from __future__ import annotations

import warnings

import pytest

import accelrt as acc
from accelrt.backends.sim import SimBackend
from accelrt.memory import AllocatorConfig, CachingAllocator

MiB = 1 << 20
GiB = 1 << 30


def allocator(config: str, capacity: int = GiB) -> tuple[SimBackend, CachingAllocator]:
    backend = SimBackend(device_count=1, capacity=capacity)
    return backend, CachingAllocator(backend, 0, AllocatorConfig.parse(config))


def test_idle_pages_move_to_a_request_above_the_budget() -> None:
    """60 + 60 MiB, free the first, ask for 100 MiB: the freed 60 MiB of pages are unmapped
    and mapped again under the new block (reserved 160 MiB); expandable segments grow to
    220 MiB."""
    peaks = {}
    for config in ("expandable_segments:True", "policy:accelrt"):
        _, alloc = allocator(config)
        a = alloc.malloc(60 * MiB, 0)
        b = alloc.malloc(60 * MiB, 0)
        alloc.free(a)
        c = alloc.malloc(100 * MiB, 0)
        assert c.address == a.address + 120 * MiB
        assert b.allocated and c.allocated
        peaks[config] = alloc.memory_stats()
    accelrt = peaks["policy:accelrt"]
    assert peaks["expandable_segments:True"]["reserved_bytes.all.peak"] == 220 * MiB
    assert accelrt["reserved_bytes.all.peak"] == 160 * MiB
    assert accelrt["reserved_bytes.large_pool.current"] == 160 * MiB
    assert accelrt["num_device_alloc"] == 3  # a, b, then c's 100 MiB in one map
    assert accelrt["num_device_free"] == 1  # a's 30 pages, unmapped in one call
    assert accelrt["segment.all.current"] == 0  # arenas count as expandable segments do
    assert accelrt["max_split_size"] == -1


def test_a_stream_adopts_another_streams_free_block() -> None:
    backend, alloc = allocator("policy:accelrt")
    side = backend.stream_create(0, 0)
    a = alloc.malloc(10 * MiB, 0)  # maps 20 MiB: up to the next 20 MiB boundary
    address = a.address
    alloc.free(a)
    b = alloc.malloc(10 * MiB, side)
    assert b.address == address and b.stream == side
    stats = alloc.memory_stats()
    assert stats["num_device_alloc"] == 1 and stats["reserved_bytes.all.current"] == 20 * MiB
    # the rest of the adopted block stays free, owned by the side stream
    c = alloc.malloc(10 * MiB, side)
    assert c.address == address + 10 * MiB and alloc.memory_stats()["num_device_alloc"] == 1
    # PyTorch's expandable segments: one segment per stream, so the side stream maps its own
    backend2, pytorch = allocator("expandable_segments:True")
    side2 = backend2.stream_create(0, 0)
    pytorch.free(pytorch.malloc(10 * MiB, 0))
    pytorch.malloc(10 * MiB, side2)
    assert pytorch.memory_stats()["num_device_alloc"] == 2


def test_a_growth_starts_at_another_streams_free_block_below_the_unmapped_pages() -> None:
    """Stream 0's 4 MiB maps 20 MiB, leaving 16 MiB free above it; the side stream's 30 MiB
    fits no free block, so the arena grows, and the run starts at stream 0's free 16 MiB
    (adopted: one event) instead of leaving it as a hole below the side's pages (16.2 step
    4): 20 MiB more mapped, 40 in all, where starting above it would have mapped 34."""
    backend, alloc = allocator("policy:accelrt")
    side = backend.stream_create(0, 0)
    a = alloc.malloc(4 * MiB, 0)
    waits: list[tuple[int, int]] = []
    wait_event = backend.stream_wait_event

    def spy(index: int, stream: int, event: object) -> None:
        waits.append((index, stream))
        wait_event(index, stream, event)

    backend.stream_wait_event = spy  # type: ignore[method-assign]
    b = alloc.malloc(30 * MiB, side)
    assert b.address == a.address + 4 * MiB and b.stream == side
    assert alloc.policy_counters["adoptions"] == 1
    assert waits == [(0, side)]  # the side stream waits for stream 0's work on the device
    stats = alloc.memory_stats()
    assert stats["num_device_alloc"] == 2 and stats["reserved_bytes.all.current"] == 40 * MiB
    [(_, blocks)] = alloc.segments()
    assert [(blk.size, blk.stream, blk.allocated, blk.mapped) for blk in blocks[:3]] == [
        (4 * MiB, 0, True, True),
        (30 * MiB, side, True, True),
        (6 * MiB, side, False, True),  # the rest of the adopted block and the new pages
    ]


def test_one_arena_holds_blocks_of_several_streams() -> None:
    backend, alloc = allocator("policy:accelrt")
    side = backend.stream_create(0, 0)
    alloc.malloc(4 * MiB, 0)
    alloc.malloc(4 * MiB, side)
    [(segment, blocks)] = alloc.segments()
    assert segment.is_expandable and segment.page_size == 2 * MiB
    assert [(blk.size, blk.stream, blk.allocated, blk.mapped) for blk in blocks[:3]] == [
        (4 * MiB, 0, True, True),
        (4 * MiB, side, True, True),
        (12 * MiB, side, False, True),  # mapped up to the 20 MiB boundary, the side's
    ]
    [info] = alloc.snapshot()[0]
    assert info["is_expandable"] and info["stream"] == 0  # its lowest block's stream
    assert info["total_size"] == 20 * MiB
    assert [(b["size"], b["state"], b.get("stream")) for b in info["blocks"]] == [
        (4 * MiB, "active_allocated", 0),  # each block names its owner
        (4 * MiB, "active_allocated", side),
        (12 * MiB, "inactive", side),
    ]


def test_snapshot_blocks_name_no_stream_outside_arenas() -> None:
    for config in ("", "expandable_segments:True"):  # PyTorch's keys exactly
        _, alloc = allocator(config)
        alloc.malloc(4 * MiB, 0)
        [info] = alloc.snapshot()[0]
        assert all(
            set(b) == {"address", "size", "requested_size", "state", "frames"}
            for b in info["blocks"]
        )


def test_free_blocks_of_different_owners_do_not_merge_until_the_cache_is_emptied() -> None:
    backend, alloc = allocator("policy:accelrt")
    side = backend.stream_create(0, 0)
    a = alloc.malloc(768 * 1024, 0)  # small arena: one 2 MiB page
    b = alloc.malloc(512 * 1024, side)  # from the rest of that page, adopted by the side
    assert b.address == a.address + 768 * 1024
    alloc.free(a)
    alloc.free(b)
    [(_, blocks)] = alloc.segments()
    assert [(blk.size, blk.stream) for blk in blocks[:2]] == [(768 * 1024, 0), (1280 * 1024, side)]
    assert alloc.memory_stats()["reserved_bytes.small_pool.current"] == 2 * MiB
    alloc.empty_cache()  # the owners' work is done: the shared page goes
    assert alloc.memory_stats()["reserved_bytes.all.current"] == 0
    assert alloc.segments() == []


def test_reset_peak_memory_stats_changes_no_decision() -> None:
    """The budget keeps its own high-water mark of requested bytes."""
    results = []
    for reset in (False, True):
        _, alloc = allocator("policy:accelrt")
        a = alloc.malloc(60 * MiB, 0)
        alloc.malloc(60 * MiB, 0)
        alloc.free(a)
        if reset:
            alloc.reset_peak_memory_stats()
        c = alloc.malloc(100 * MiB, 0)
        results.append((c.address, alloc.memory_stats()["reserved_bytes.all.current"]))
    assert results[0] == results[1]


def test_the_memory_fraction_caps_the_budget_and_refuses_past_it() -> None:
    _, alloc = allocator("policy:accelrt,per_process_memory_fraction:0.25")  # 256 MiB
    a = alloc.malloc(200 * MiB, 0)
    with pytest.raises(acc.OutOfMemoryError, match="policy:accelrt already maps idle"):
        alloc.malloc(100 * MiB, 0)
    assert alloc.memory_stats()["reserved_bytes.all.current"] <= 256 * MiB
    alloc.free(a)
    b = alloc.malloc(240 * MiB, 0)  # the freed pages move under it: within the fraction
    assert alloc.memory_stats()["reserved_bytes.all.current"] == 240 * MiB
    alloc.free(b)


def test_a_chunk_the_device_refuses_falls_back_to_the_pages_needed() -> None:
    """On a 22 MiB device, 20 MiB can be mapped though growth would round up to 40 MiB."""
    _, alloc = allocator("policy:accelrt", capacity=22 * MiB)
    alloc.malloc(2 * MiB + 1, 0)  # large pool: 4 MiB mapped (growth capped by the budget)
    block = alloc.malloc(18 * MiB, 0)
    assert block.size == 18 * MiB
    assert alloc.memory_stats()["reserved_bytes.all.current"] <= 22 * MiB


def test_the_policy_names_itself_in_settings_and_snapshots() -> None:
    config = AllocatorConfig.parse("policy:accelrt")
    assert config.policy == "accelrt"
    assert config.describe() == "policy:accelrt"
    assert config.short_label == "policy:accelrt"
    assert config.to_torch_settings()["policy"] == "accelrt"
    assert AllocatorConfig.from_torch_settings(config.to_torch_settings()) == config
    assert AllocatorConfig.parse("policy:pytorch") == AllocatorConfig()


def test_an_unknown_policy_is_refused_by_name() -> None:
    with pytest.raises(ValueError, match=r"policy must be one of pytorch, accelrt, got 'gmlake'"):
        AllocatorConfig.parse("policy:gmlake")


def test_ignored_settings_are_said_once() -> None:
    backend = SimBackend(device_count=1, capacity=GiB)
    config = AllocatorConfig.parse("policy:accelrt,max_split_size_mb:128")
    with pytest.warns(RuntimeWarning, match="policy:accelrt ignores max_split_size_mb") as seen:
        alloc = CachingAllocator(backend, 0, config)
    assert seen[0].filename == __file__  # the caller's line, not accelrt's
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        alloc.set_config(config)  # said once
    assert alloc.memory_stats()["max_split_size"] == -1


def test_without_virtual_memory_pytorchs_policy_is_used(opencl: str) -> None:
    acc.set_allocator_settings("policy:accelrt")
    with pytest.warns(RuntimeWarning, match="policy:accelrt maps pages") as seen:
        buffer = acc.empty(4 * MiB)
    assert "the 'opencl' backend has none, so PyTorch's policy" in str(seen[0].message)
    assert seen[0].filename == __file__
    assert acc.memory_stats()["segment.all.current"] == 1  # an ordinary 20 MiB segment
    assert acc.memory_reserved() == 20 * MiB
    buffer.free()


def test_accelrt_empty_uses_the_policy_on_sim(sim: str) -> None:
    acc.set_allocator_settings("policy:accelrt")
    side = acc.Stream()
    first = acc.empty(10 * MiB)
    address = first.ptr
    first.free()
    second = acc.empty(10 * MiB, stream=side)
    assert second.ptr == address  # adopted by the side stream
    assert acc.memory_stats()["num_device_alloc"] == 1
    second.free()
    settings = acc.memory.memory_snapshot()["allocator_settings"]
    assert settings["policy"] == "accelrt"
    assert settings["accelrt_policy"] == [
        {"device": 0, "adoptions": 1, "reclaims": 0, "pages_moved": 0}
    ]


def test_a_private_pools_free_pages_are_never_moved() -> None:
    """A captured graph may still use a private pool's freed addresses: its pages stay."""
    _, alloc = allocator("policy:accelrt")
    alloc.begin_allocate_to_pool((0, 1))
    kept = alloc.malloc(60 * MiB, 0)
    alloc.end_allocate_to_pool((0, 1))
    alloc.free(kept)
    alloc.malloc(100 * MiB, 0)  # above the budget (100.5 MiB), but nothing may move
    stats = alloc.memory_stats()
    assert stats["reserved_bytes.all.current"] == 160 * MiB
    assert stats["num_device_free"] == 0


def test_a_reclaim_takes_the_pages_of_the_runs_last_block_above_the_request() -> None:
    """Section 16.2 step 5.2: a reclaim spares what the request will hold, not the whole run
    found for it. Driven through the reclaim step itself (a state where the budget forces it
    takes a long trace; bench/policy_synthetic.py's kv family is one)."""
    _, alloc = allocator("policy:accelrt")
    head = alloc.malloc(20 * MiB, 0)
    free_block = alloc.malloc(60 * MiB, 0)
    tail = alloc.malloc(20 * MiB, 0)
    base = head.address
    alloc.free(free_block)  # free and mapped: [20, 80) MiB of the arena
    pool = free_block.pool
    assert alloc.memory_stats()["reserved_bytes.all.current"] == 100 * MiB
    # a request about to hold [20, 50) MiB: the block reaches past it, so its whole pages
    # above 50 MiB may go (highest first, as many as wanted), never those below
    assert alloc._reclaim(pool, 20 * MiB, base + 20 * MiB, base + 50 * MiB) == 20 * MiB
    assert alloc._reclaim(pool, 40 * MiB, base + 20 * MiB, base + 50 * MiB) == 10 * MiB
    stats = alloc.memory_stats()
    assert stats["reserved_bytes.all.current"] == 70 * MiB
    assert stats["num_device_free"] == 2
    assert [(b.address - base, b.size) for b in pool.blocks()] == [(20 * MiB, 30 * MiB)]
    # a block wholly inside what the request will hold gives nothing
    assert alloc._reclaim(pool, 20 * MiB, base + 20 * MiB, base + 50 * MiB) == 0
    assert head.allocated and tail.allocated


def test_the_allowance_is_room_for_requests_as_large_as_the_stitched_one() -> None:
    """Section 16.1: a map of a third of reserved or more that took moved pages raises A, for
    requests at least as large as that one (S); a smaller request keeps the budget B0, so it
    moves idle pages instead of growing into room kept for the large tensors."""
    _, alloc = allocator("policy:accelrt")
    alloc.malloc(20 * MiB, 0)
    a = alloc.malloc(40 * MiB, 0)
    alloc.malloc(40 * MiB, 0)
    alloc.free(a)
    assert alloc._budget(60 * MiB) == alloc._base_budget()  # no allowance yet
    alloc.malloc(60 * MiB, 0)  # above the budget: a's 40 MiB of pages are moved into it
    assert alloc.policy_counters == {"adoptions": 0, "reclaims": 1, "pages_moved": 20}
    assert alloc.memory_stats()["reserved_bytes.all.current"] == 120 * MiB
    assert alloc._allowance == 12 * MiB  # min(60 MiB, H // 10), H = 120 MiB
    assert alloc._budget(60 * MiB) == alloc._base_budget() + 12 * MiB
    assert alloc._budget(80 * MiB) == alloc._base_budget() + 12 * MiB
    assert alloc._budget(60 * MiB - 512) == alloc._base_budget()
    assert alloc._budget(2 * MiB) == alloc._base_budget()


def test_above_the_budget_free_neighbours_of_other_streams_are_joined() -> None:
    """Section 16.2 step 3: a miss that would take reserved above the budget first joins
    neighbouring free blocks of different owners (after both streams' work), so the request
    fits where they were: no page is mapped or moved."""
    backend, alloc = allocator("policy:accelrt")
    side = backend.stream_create(0, 0)
    a = alloc.malloc(10 * MiB, 0)  # maps 20 MiB: up to the next 20 MiB boundary
    b = alloc.malloc(10 * MiB, side)  # adopts the rest, owned by the side stream
    assert b.address == a.address + 10 * MiB
    base = a.address
    alloc.free(a)
    alloc.free(b)  # two free neighbours, owned by two streams: not merged by a free
    c = alloc.malloc(20 * MiB, 0)
    assert c.address == base and c.size == 20 * MiB
    stats = alloc.memory_stats()
    assert stats["reserved_bytes.all.current"] == 20 * MiB
    assert (stats["num_device_alloc"], stats["num_device_free"]) == (1, 0)
