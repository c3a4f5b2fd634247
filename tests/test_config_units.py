"""ACCELRT_ALLOC_CONF parsing and byte sizes."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import accelrt as acc
from accelrt import AllocatorConfig, format_bytes, parse_bytes

MiB = 1 << 20


def test_parse_full_config() -> None:
    cfg = AllocatorConfig.parse(
        "max_split_size_mb:128, max_non_split_rounding_mb:40,"
        "roundup_power2_divisions:[256:1,512:2,>:4],"
        "garbage_collection_threshold:0.6,expandable_segments:False,per_process_memory_fraction:0.5,"
        "release_lock_on_malloc:True"
    )
    assert cfg.max_split_size == 128 * MiB
    assert cfg.max_non_split_rounding == 40 * MiB
    assert cfg.roundup_power2_divisions == (1,) * 9 + (2,) + (4,) * 6
    assert cfg.garbage_collection_threshold == 0.6
    assert cfg.per_process_memory_fraction == 0.5
    assert cfg.release_lock_on_malloc and not cfg.expandable_segments
    assert AllocatorConfig.parse("roundup_power2_divisions:8").roundup_power2_divisions == (8,) * 16
    assert AllocatorConfig.parse("").describe() == "defaults"


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("max_split_size_mb:10", "max_split_size_mb must be an integer >= 20 (MiB), got '10'"),
        ("max_split_size_mb:abc", "max_split_size_mb must be an integer >= 20"),
        (
            "garbage_collection_threshold:1.5",
            "garbage_collection_threshold must be a number with 0 < x < 1",
        ),
        (
            "per_process_memory_fraction:0",
            "per_process_memory_fraction must be a number with 0 < x <= 1",
        ),
        ("expandable_segments:yes", "expandable_segments must be True or False, got 'yes'"),
        ("roundup_power2_divisions:3", "must be 0 or a power of two, got '3'"),
        ("roundup_power2_divisions:[100:2]", "interval '100' must be a power of two in MiB"),
        ("colour:blue", "unknown allocator setting 'colour'; known settings: max_split_size_mb"),
        ("max_split_size_mb", "malformed allocator setting 'max_split_size_mb'"),
        ("roundup_power2_divisions:[1:2", "unbalanced '['"),
    ],
)
def test_bad_config_is_clear(text: str, message: str) -> None:
    with pytest.raises(ValueError) as info:
        AllocatorConfig.parse(text)
    assert message in str(info.value)


def test_bad_env_config_names_the_variable(monkeypatch: pytest.MonkeyPatch, sim: str) -> None:
    monkeypatch.setenv("ACCELRT_ALLOC_CONF", "max_split_size_mb:1")
    with pytest.raises(
        ValueError, match=r"ACCELRT_ALLOC_CONF='max_split_size_mb:1': max_split_size_mb"
    ):
        acc.empty(1)


def test_set_allocator_settings_keeps_state_on_error(sim: str) -> None:
    acc.set_allocator_settings("max_split_size_mb:64")
    with pytest.raises(ValueError):
        acc.set_allocator_settings("max_split_size_mb:64,bogus:1")
    acc.empty(1).free()
    assert acc.memory_stats()["max_split_size"] == 64 * MiB


def test_expandable_segments_on_opencl_warn_once_and_fall_back(opencl: str) -> None:
    acc.set_allocator_settings("expandable_segments:True")
    with pytest.warns(RuntimeWarning, match="expandable segments need virtual memory") as seen:
        buf = acc.empty(1)
    assert "'opencl' backend does not have" in str(seen[0].message)
    assert seen[0].filename == __file__  # located at the user's call
    assert acc.memory_reserved() == 2 * MiB  # an ordinary small segment
    assert acc.memory_stats()["segment.all.current"] == 1
    buf.free()
    acc.empty_cache()
    assert acc.memory_reserved() == 0


def test_expandable_segments_on_sim_map_pages(sim: str) -> None:
    acc.set_allocator_settings("expandable_segments:True")
    buf = acc.empty(1)
    stats = acc.memory_stats()
    assert stats["reserved_bytes.all.current"] == 2 * MiB  # one 2 MiB page mapped
    assert stats["segment.all.current"] == 0  # mapping adds no segment
    assert stats["num_device_alloc"] == 1
    buf.free()
    acc.empty_cache()
    stats = acc.memory_stats()
    assert stats["reserved_bytes.all.current"] == 0
    assert stats["num_device_free"] == 1


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("512MiB", 512 * MiB),
        ("80GiB", 80 << 30),
        ("1.5KiB", 1536),
        ("4096", 4096),
        ("2GB", 2_000_000_000),
        (" 3 m ", 3 * MiB),
        ("5PiB", 5 << 50),
        ("2pb", 2 * 10**15),
        ("7.5EiB", 15 << 59),
    ],
)
def test_parse_bytes(text: str, value: int) -> None:
    assert parse_bytes(text) == value


def test_large_segment_size_sets_mid_size_segments_and_large_pages(sim: str) -> None:
    # PyTorch 2.13's large_segment_size_mb: the segment of a 1-10 MiB request (a 2 MiB
    # tensor reserves 40 MiB under large_segment_size_mb:40), and the large pool's page
    config = AllocatorConfig.parse("large_segment_size_mb:40")
    assert config.large_segment_size == 40 * MiB and config.describe() == "large_segment_size_mb:40"
    acc.set_allocator_settings("large_segment_size_mb:40")
    mid = acc.empty(2 * MiB)
    assert (acc.memory_allocated(), acc.memory_reserved()) == (2 * MiB, 40 * MiB)
    mid.free()
    acc.empty_cache()
    acc.set_allocator_settings("expandable_segments:True,large_segment_size_mb:12")
    first = acc.empty(11 * MiB)
    assert acc.memory_reserved() == 12 * MiB  # one 12 MiB page
    second = acc.empty(3 * MiB)
    assert acc.memory_reserved() == 24 * MiB
    for buf in (first, second):
        buf.free()
    with pytest.raises(ValueError, match=r"large_segment_size_mb must be an integer >= 2 \(MiB\)"):
        AllocatorConfig.parse("large_segment_size_mb:1")


def test_format_bytes_refuses_what_is_not_a_number() -> None:
    # format_bytes('5') failed on a comparison between str and int (issue 25)
    with pytest.raises(TypeError) as info:
        format_bytes("5")  # type: ignore[arg-type]
    assert str(info.value) == (
        "format_bytes() takes a number of bytes, got str '5'; parse a size string with "
        "parse_bytes()"
    )
    assert format_bytes(np.int64(5 * MiB)) == "5.00 MiB"


@pytest.mark.parametrize(
    ("bad", "exc"),
    [("12 parsecs", ValueError), (-1, ValueError), (1.0, TypeError), (True, TypeError)],
)
def test_parse_bytes_errors(bad: object, exc: type) -> None:
    with pytest.raises(exc):
        parse_bytes(bad)  # type: ignore[arg-type]


@given(st.integers(0, 1 << 50))
def test_format_bytes_units(n: int) -> None:
    text = format_bytes(n)
    if n <= 1024:
        assert text == f"{n} bytes"
    else:
        number, unit = text.split()
        scale = {"KiB": 1024, "MiB": MiB, "GiB": 1 << 30}[unit]
        assert abs(float(number) * scale - n) <= 0.0051 * scale


def test_pytorch_2_14_keys_are_parsed() -> None:
    """2.14's ``throw_on_cudamalloc_oom`` is modelled; keys that change no device placement
    are reported as ignored, by name, instead of refused."""
    conf = (
        "throw_on_cudamalloc_oom:True,per_process_memory_fraction:0.5,pinned_free_catch_all:True,"
        "release_lock_on_hipmalloc:True,expandable_segments_reserve:True,"
        "expandable_segments_reserve_by_class:[large:4096,small:512]"
    )
    config, ignored = AllocatorConfig.parse_torch(conf)
    assert config.throw_on_cudamalloc_oom and config.per_process_memory_fraction == 0.5
    assert config.describe() == "per_process_memory_fraction:0.5,throw_on_cudamalloc_oom:True"
    assert ignored == [
        "pinned_free_catch_all:True",
        "release_lock_on_hipmalloc:True",
        "expandable_segments_reserve:True",
        "expandable_segments_reserve_by_class:[large:4096,small:512]",
    ]
    settings = config.to_torch_settings()
    assert settings["throw_on_cudamalloc_oom"] is True
    assert AllocatorConfig.from_torch_settings(settings).throw_on_cudamalloc_oom
    with pytest.raises(
        ValueError, match="throw_on_cudamalloc_oom must be True or False, got 'maybe'"
    ):
        AllocatorConfig.parse("throw_on_cudamalloc_oom:maybe")


@pytest.mark.parametrize("extra", ["", ",expandable_segments:True"])
def test_throw_on_cudamalloc_oom_rejects_past_the_fraction_without_retrying(extra: str) -> None:
    """PyTorch 2.14: past the fraction, ``OutOfMemoryError`` at once (no cache release and
    retry), counted in ``num_oom_rejections`` and ``num_ooms``; here the cache stays as it was."""
    from accelrt.backends.sim import SimBackend
    from accelrt.memory import CachingAllocator

    for throw in (True, False):
        conf = f"per_process_memory_fraction:0.5,throw_on_cudamalloc_oom:{throw}{extra}"
        alloc = CachingAllocator(SimBackend(capacity=1 << 30), 0, AllocatorConfig.parse(conf))
        alloc.free(alloc.malloc(300 * MiB, 0))
        if throw:
            with pytest.raises(acc.OutOfMemoryError, match=r"accelrt may use 512\.00 MiB of it"):
                alloc.malloc(400 * MiB, 0)
        else:  # the ladder releases the cached 300 MiB and retries
            alloc.free(alloc.malloc(400 * MiB, 0))
        stats = alloc.memory_stats()
        expected = (1, 1, 0, 300 * MiB) if throw else (0, 0, 1, 400 * MiB)
        assert (
            stats["num_oom_rejections"],
            stats["num_ooms"],
            stats["num_alloc_retries"],
            stats["reserved_bytes.all.current"],
        ) == expected
        alloc.reset_accumulated_memory_stats()
        assert alloc.memory_stats()["num_oom_rejections"] == 0


def test_throw_on_cudamalloc_oom_under_policy_accelrt_moves_idle_pages_first() -> None:
    """policy:accelrt maps idle cached pages again before it would create any: no rejection."""
    from accelrt.backends.sim import SimBackend
    from accelrt.memory import CachingAllocator

    conf = "per_process_memory_fraction:0.5,throw_on_cudamalloc_oom:True,policy:accelrt"
    alloc = CachingAllocator(SimBackend(capacity=1 << 30), 0, AllocatorConfig.parse(conf))
    alloc.free(alloc.malloc(300 * MiB, 0))
    alloc.malloc(400 * MiB, 0)
    stats = alloc.memory_stats()
    assert (stats["num_oom_rejections"], stats["reserved_bytes.all.current"]) == (0, 400 * MiB)
    with pytest.raises(acc.OutOfMemoryError):
        alloc.malloc(200 * MiB, 0)  # 600 MiB > 512 MiB: no idle page left to move
    assert alloc.memory_stats()["num_oom_rejections"] == 1
