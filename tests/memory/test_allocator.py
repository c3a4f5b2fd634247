"""The caching allocator against docs/allocator.md, byte for byte, through the public API."""

from __future__ import annotations

import pickle

import pytest

import accelrt as acc
from accelrt.backends import get_backend
from accelrt.backends.sim import SimBackend
from accelrt.memory import (
    AllocatorConfig,
    CachingAllocator,
    MemPool,
    round_size,
    segment_size,
    use_mem_pool,
)

MiB = 1 << 20

# docs/allocator.md section 9: request -> (allocated, reserved, requested, inactive_split)
WORKED_EXAMPLES = [
    (100, 512, 2 * MiB, 100, 1),
    (MiB, MiB, 2 * MiB, MiB, 1),
    (MiB + 1, 1049088, 20 * MiB, MiB + 1, 1),
    (11 * MiB, 12 * MiB, 12 * MiB, 11 * MiB, 0),
    (int(19.5 * MiB), 20 * MiB, 20 * MiB, 20447232, 0),
]


@pytest.mark.parametrize(
    ("nbytes", "allocated", "reserved", "requested", "splits"), WORKED_EXAMPLES
)
def test_worked_examples(
    device: str, nbytes: int, allocated: int, reserved: int, requested: int, splits: int
) -> None:
    buf = acc.empty(nbytes)
    stats = acc.memory_stats()
    assert stats["allocated_bytes.all.current"] == allocated
    assert stats["reserved_bytes.all.current"] == reserved
    assert stats["requested_bytes.all.current"] == requested
    assert stats["inactive_split.all.current"] == splits
    assert stats["inactive_split_bytes.all.current"] == (reserved - allocated if splits else 0)
    assert stats["segment.all.current"] == 1
    pool = "small_pool" if allocated <= MiB else "large_pool"
    assert stats[f"allocated_bytes.{pool}.current"] == allocated
    buf.free()


def test_free_merges_and_empty_cache_releases(device: str) -> None:
    buf = acc.empty(100)
    buf.free()
    stats = acc.memory_stats()
    assert stats["inactive_split.all.current"] == 0
    assert stats["allocated_bytes.all.current"] == 0
    assert stats["reserved_bytes.all.current"] == 2 * MiB
    acc.empty_cache()
    stats = acc.memory_stats()
    assert stats["reserved_bytes.all.current"] == 0
    assert stats["num_device_free"] == 1
    assert stats["num_sync_all_streams"] == 1


def test_pytorch_memory_stats_sequence(device: str) -> None:
    # as PyTorch's test_memory_stats: 400 B, free, empty_cache; then 1024 B
    buf = acc.empty(400)
    buf.free()
    acc.empty_cache()
    before = acc.memory_stats()
    buf = acc.empty(1024)
    after = acc.memory_stats()
    assert after["active_bytes.all.current"] - before["active_bytes.all.current"] == 1024
    assert after["requested_bytes.all.current"] - before["requested_bytes.all.current"] == 1024
    buf.free()
    freed = acc.memory_stats()
    assert freed["active_bytes.all.freed"] - after["active_bytes.all.freed"] == 1024
    assert freed["allocated_bytes.all.peak"] == 1024
    assert acc.max_memory_allocated() == 1024
    acc.reset_peak_memory_stats()
    assert acc.max_memory_allocated() == 0
    assert acc.max_memory_reserved() == 2 * MiB
    acc.reset_accumulated_memory_stats()
    stats = acc.memory_stats()
    assert stats["allocated_bytes.all.allocated"] == 0
    assert stats["num_device_alloc"] == 0
    assert stats["reserved_bytes.all.current"] == 2 * MiB


def test_memory_stats_keys(sim: str) -> None:
    assert acc.memory_stats() == {}
    assert acc.memory_allocated() == 0
    acc.empty(1).free()
    keys = list(acc.memory_stats())
    assert keys == sorted(keys)
    expected = {
        f"{name}.{pool}.{metric}"
        for name in (
            "allocation",
            "segment",
            "active",
            "inactive_split",
            "allocated_bytes",
            "reserved_bytes",
            "active_bytes",
            "inactive_split_bytes",
            "requested_bytes",
        )
        for pool in ("all", "small_pool", "large_pool")
        for metric in ("current", "peak", "allocated", "freed")
    }
    expected |= {
        f"oversize_{k}.{m}"
        for k in ("allocations", "segments")
        for m in ("current", "peak", "allocated", "freed")
    }
    expected |= {
        "num_alloc_retries",
        "num_ooms",
        "num_sync_all_streams",
        "num_device_alloc",
        "num_device_free",
        "num_oom_rejections",  # PyTorch 2.14
        "max_split_size",
    }
    assert set(keys) == expected
    assert acc.memory_stats()["max_split_size"] == -1


def test_same_stream_reuse_is_best_fit_lowest_address(sim: str) -> None:
    a = acc.empty(4 * 512)
    b = acc.empty(512)
    c = acc.empty(4 * 512)
    a_ptr, c_ptr = a.ptr, c.ptr
    a.free()
    c.free()  # c merges with the tail remainder, a stays a 2048-byte hole
    d = acc.empty(2048)
    assert d.ptr == a_ptr  # the smallest block that fits
    e = acc.empty(2048)
    assert e.ptr == c_ptr
    b.free(), d.free(), e.free()


def test_other_stream_never_reuses_directly(sim: str) -> None:
    s1 = acc.Stream()
    buf = acc.empty(512, stream=s1)
    ptr = buf.ptr
    buf.free()
    other = acc.empty(512)  # default stream: a new segment
    assert other.ptr != ptr
    assert acc.memory_stats()["segment.all.current"] == 2
    again = acc.empty(512, stream=s1)
    assert again.ptr == ptr


def test_record_stream_defers_reuse_until_event(sim: str) -> None:
    # On sim events complete at once: the block is reusable at the next malloc.
    s1, s2 = acc.Stream(), acc.Stream()
    buf = acc.empty(1000, stream=s1)
    acc.record_stream(buf, s2)
    ptr = buf.ptr
    buf.free()
    stats = acc.memory_stats()
    assert stats["allocated_bytes.all.current"] == 0
    assert stats["active_bytes.all.current"] == 1024  # pending free
    again = acc.empty(1000, stream=s1)
    assert again.ptr == ptr
    assert acc.memory_stats()["active_bytes.all.current"] == 1024


def test_a_free_during_a_pool_routing_records_its_events_once_none_is_underway(
    sim: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A use_mem_pool context is a capture in PyTorch's terms: no event is recorded or queried
    # until an operation finds no routing (docs/allocator.md section 14).
    backend = get_backend("sim")
    recorded: list[int] = []
    record = backend.event_record
    monkeypatch.setattr(
        backend, "event_record", lambda e, i, s: (recorded.append(s), record(e, i, s))
    )
    s1, s2 = acc.Stream(), acc.Stream()
    buf = acc.empty(1000, stream=s1)
    acc.record_stream(buf, s2)
    ptr = buf.ptr
    pool = MemPool()
    with use_mem_pool(pool):
        buf.free()  # set aside: still active, no event
        inside = acc.empty(1000, stream=s1)  # the pool's own segment
        assert inside.ptr != ptr and recorded == []
        stats = acc.memory_stats()
        assert (stats["allocated_bytes.all.current"], stats["active_bytes.all.current"]) == (
            1024,
            2048,
        )
        inside.free()
    assert recorded == [] and acc.memory_stats()["active_bytes.all.current"] == 1024
    again = acc.empty(1000, stream=s1)  # no routing: the event, complete at once on sim
    assert recorded == [s2.handle] and again.ptr == ptr
    assert acc.memory_stats()["active_bytes.all.current"] == 1024
    again.free()


def test_large_remainder_rule(sim: str) -> None:
    # a large block whose remainder is <= 1 MiB is handed out whole
    big = acc.empty(11 * MiB)
    assert acc.memory_allocated() == 12 * MiB
    assert acc.memory_stats()["requested_bytes.all.current"] == 11 * MiB
    big.free()
    reuse = acc.empty(10 * MiB + 512)  # fits the cached 12 MiB block; remainder > 1 MiB: split
    stats = acc.memory_stats()
    assert stats["segment.all.current"] == 1
    assert stats["allocated_bytes.all.current"] == 10 * MiB + 512
    assert stats["inactive_split_bytes.all.current"] == 2 * MiB - 512
    reuse.free()


def test_max_split_size_keeps_oversize_blocks(sim: str) -> None:
    acc.set_allocator_settings("max_split_size_mb:40")
    assert acc.memory_stats() == {}
    big = acc.empty(50 * MiB)
    stats = acc.memory_stats()
    assert stats["max_split_size"] == 40 * MiB
    assert stats["oversize_allocations.current"] == 1
    assert stats["oversize_segments.current"] == 1
    big.free()
    small = acc.empty(30 * MiB)  # may not take the 50 MiB oversize block
    assert acc.memory_stats()["segment.all.current"] == 2
    fits = acc.empty(50 * MiB - 512)  # oversize request: takes it (within 20 MiB rounding)
    assert acc.memory_stats()["segment.all.current"] == 2
    assert acc.memory_stats()["inactive_split.all.current"] == 0  # oversize blocks never split
    small.free(), fits.free()


def test_roundup_power2_divisions(sim: str) -> None:
    acc.set_allocator_settings("roundup_power2_divisions:4")
    buf = acc.empty(5_000_000)
    assert acc.memory_allocated() == 5_242_880
    buf.free()


def test_memory_fraction_refuses_without_asking_device(small_sim: str) -> None:
    acc.set_per_process_memory_fraction(0.5)  # 32 MiB of 64
    held = acc.empty(20 * MiB)
    with pytest.raises(acc.OutOfMemoryError) as info:
        acc.empty(20 * MiB)
    assert "may use 32.00 MiB of it (memory fraction)" in str(info.value)
    stats = acc.memory_stats()
    assert stats["num_ooms"] == 1
    assert stats["num_device_alloc"] == 1
    held.free()


def test_oom_message_state_and_recovery(small_sim: str) -> None:
    first = acc.empty(40 * MiB)
    before = acc.memory_stats()
    with pytest.raises(acc.OutOfMemoryError) as info:
        acc.empty(30 * MiB)
    err = info.value
    assert str(err) == (
        "Out of memory on sim:0. Tried to allocate 30.00 MiB (a 30.00 MiB request). The device "
        "has a total capacity of 64.00 MiB of which 24.00 MiB is free. Of the allocated memory "
        "40.00 MiB is allocated by accelrt, and 0 bytes is reserved by accelrt but unallocated. "
        "If reserved but unallocated memory is large, try "
        "ACCELRT_ALLOC_CONF=expandable_segments:True to avoid fragmentation."
    )
    assert isinstance(err, MemoryError)
    assert (err.requested_bytes, err.allocation_bytes) == (30 * MiB, 30 * MiB)
    assert (err.allocated_bytes, err.reserved_bytes) == (40 * MiB, 40 * MiB)
    assert (err.free_bytes, err.total_bytes) == (24 * MiB, 64 * MiB)
    copy = pickle.loads(pickle.dumps(err))
    assert str(copy) == str(err) and copy.free_bytes == err.free_bytes
    after = acc.memory_stats()
    assert after["num_ooms"] == 1
    assert after["num_alloc_retries"] == 1
    assert after["allocated_bytes.all.current"] == before["allocated_bytes.all.current"]
    # usable afterwards
    ok = acc.empty(20 * MiB)
    assert acc.memory_allocated() == 60 * MiB
    ok.free(), first.free()


def test_oom_retry_releases_cache(small_sim: str) -> None:
    cached = acc.empty(40 * MiB)
    cached.free()  # 40 MiB cached
    buf = acc.empty(50 * MiB)  # needs the cache released: one retry, no OOM
    stats = acc.memory_stats()
    assert stats["num_alloc_retries"] == 1
    assert stats["num_ooms"] == 0
    assert stats["num_device_free"] == 1
    assert stats["reserved_bytes.all.current"] == 50 * MiB
    buf.free()


def test_garbage_collection_threshold_frees_old_blocks() -> None:
    backend = SimBackend(device_count=1, capacity=100 * MiB)
    config = AllocatorConfig.parse(
        "garbage_collection_threshold:0.5,per_process_memory_fraction:1.0"
    )
    alloc = CachingAllocator(backend, 0, config)
    a = alloc.malloc(30 * MiB, 0)
    b = alloc.malloc(30 * MiB, 0)
    alloc.free(a)
    alloc.free(b)  # 60 MiB reserved, all cached, > 50 MiB threshold
    c = alloc.malloc(40 * MiB, 0)  # no fit -> gc releases both old 30 MiB blocks
    stats = alloc.memory_stats()
    assert stats["num_device_free"] == 2
    assert stats["reserved_bytes.all.current"] == 40 * MiB
    alloc.free(c)


def test_rounding_and_segment_sizes() -> None:
    cfg = AllocatorConfig()
    assert [round_size(n, cfg) for n in (0, 1, 511, 512, 513, 1200)] == [512] * 4 + [1024, 1536]
    four = AllocatorConfig.parse("roundup_power2_divisions:4")
    assert round_size(1200, four) == 1536  # not > 2048: plain rounding
    assert round_size(5_000_000, four) == 5_242_880
    assert round_size(1 << 22, four) == 1 << 22
    assert [segment_size(n) for n in (512, MiB, MiB + 512, 10 * MiB - 512, 10 * MiB, 11 * MiB)] == [
        2 * MiB,
        2 * MiB,
        20 * MiB,
        20 * MiB,
        10 * MiB,
        12 * MiB,
    ]


def test_double_free_and_foreign_block_rejected(sim: str) -> None:
    buf = acc.empty(512)
    block = buf.block
    allocator = buf.allocator
    buf.free()
    buf.free()  # Buffer.free twice is a no-op
    before = allocator.memory_stats()
    with pytest.raises(ValueError, match="not allocated by this allocator"):
        allocator.free(block)
    assert allocator.memory_stats() == before


@pytest.mark.parametrize(
    ("size", "exc", "match"),
    [
        (-1, ValueError, "must be >= 0 bytes, got -1"),
        (1.5, TypeError, "must be an int number of bytes, got float 1.5"),
        ("10", TypeError, "must be an int number of bytes, got str '10'"),
        (True, TypeError, "must be an int number of bytes, got True"),
        ((1 << 60) + 1, ValueError, "no device has that much memory"),
    ],
)
def test_bad_sizes_raise_and_change_nothing(sim: str, size: object, exc: type, match: str) -> None:
    acc.empty(512).free()
    before = acc.memory_stats()
    with pytest.raises(exc, match=match):
        acc.empty(size)  # type: ignore[arg-type]
    assert acc.memory_stats() == before


def test_zero_bytes_touches_nothing(sim: str) -> None:
    buf = acc.empty(0)
    assert (buf.ptr, buf.nbytes) == (0, 0)
    assert acc.memory_stats() == {}
    buf.free()


class _CountingSim(SimBackend):
    """A simulated backend that counts the events it creates and destroys."""

    def __init__(self) -> None:
        super().__init__(device_count=1)
        self.created = self.destroyed = 0

    def event_create(self, index: int, timing: bool) -> object:
        self.created += 1
        return super().event_create(index, timing)

    def event_destroy(self, event: object) -> None:
        self.destroyed += 1


def test_allocator_events_are_reused_then_destroyed() -> None:
    backend = _CountingSim()
    alloc = CachingAllocator(backend, 0)
    side = backend.stream_create(0, 0)
    for _ in range(5):  # each cross-stream free records an event on the side stream
        block = alloc.malloc(MiB, 0)
        alloc.record_stream(block, side)
        alloc.free(block)
        assert alloc.memory_stats()["active_bytes.all.current"] == MiB  # pending until next malloc
    alloc.malloc(100, 0)  # completes the last pending free
    assert backend.created == 1  # one event, reused by every later free
    alloc.empty_cache()
    assert backend.destroyed == 1
