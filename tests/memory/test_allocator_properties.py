"""Property tests: any sequence of requests keeps the allocator's books exact."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from accelrt.backends.sim import SimBackend
from accelrt.memory import AllocatorConfig, Block, CachingAllocator

MiB = 1 << 20
SIZES = st.one_of(st.integers(1, 4096), st.integers(1, 2 * MiB), st.integers(MiB, 64 * MiB))
OPS = st.lists(
    st.tuples(st.sampled_from(["alloc", "alloc", "free", "empty_cache"]), SIZES, st.integers(0, 2)),
    max_size=80,
)
CONFIGS = st.sampled_from(
    [
        "",
        "max_split_size_mb:32",
        "roundup_power2_divisions:4",
        "max_split_size_mb:20,roundup_power2_divisions:[1:2,>:8]",
    ]
)


def check_books(alloc: CachingAllocator, live: list[Block]) -> None:
    stats = alloc.memory_stats()
    segments = alloc.segments()
    reserved = 0
    inactive_split = inactive_split_bytes = active_bytes = 0
    for segment, blocks in segments:
        reserved += segment.size
        address = segment.address
        for block in blocks:
            assert block.address == address, "blocks must tile their segment"
            assert block.segment is segment
            address += block.size
            if len(blocks) > 1 and not block.allocated:
                inactive_split += 1
                inactive_split_bytes += block.size
            if block.allocated:
                active_bytes += block.size
        assert address == segment.address + segment.size
    assert stats["reserved_bytes.all.current"] == reserved == alloc.reserved_bytes
    assert stats["segment.all.current"] == len(segments)
    assert stats["allocated_bytes.all.current"] == sum(b.size for b in live)
    assert stats["requested_bytes.all.current"] == sum(b.requested_size for b in live)
    assert stats["active_bytes.all.current"] == active_bytes
    assert stats["allocation.all.current"] == len(live)
    assert stats["inactive_split.all.current"] == inactive_split
    assert stats["inactive_split_bytes.all.current"] == inactive_split_bytes
    for name in ("allocated_bytes", "reserved_bytes", "segment", "requested_bytes"):
        total = stats[f"{name}.small_pool.current"] + stats[f"{name}.large_pool.current"]
        assert stats[f"{name}.all.current"] == total
        assert stats[f"{name}.all.peak"] >= stats[f"{name}.all.current"]
        assert stats[f"{name}.all.allocated"] - stats[f"{name}.all.freed"] == total


@settings(max_examples=150, deadline=None)
@given(ops=OPS, config=CONFIGS)
def test_books_stay_exact(ops: list[tuple[str, int, int]], config: str) -> None:
    backend = SimBackend(device_count=1, capacity=256 * MiB)
    alloc = CachingAllocator(backend, 0, AllocatorConfig.parse(config))
    streams = [0, backend.stream_create(0, 0), backend.stream_create(0, 0)]
    live: list[Block] = []
    for action, size, stream in ops:
        if action == "alloc":
            try:
                block = alloc.malloc(size, streams[stream])
            except MemoryError:
                continue
            assert block.size >= size and block.requested_size == size
            live.append(block)
        elif action == "free" and live:
            alloc.free(live.pop(size % len(live)))
        elif action == "empty_cache":
            alloc.empty_cache()
        check_books(alloc, live)
    for block in live:
        alloc.free(block)
    alloc.empty_cache()
    assert alloc.memory_stats()["reserved_bytes.all.current"] == 0
    assert backend.mem_get_info(0) == (256 * MiB, 256 * MiB)
