"""The compiled core and the Python reference are one policy: identical on every trace we have
and on generated operation sequences (docs/design.md, "Two cores").

Each check runs the same work through ``ReferenceCachingAllocator`` (the Python ``HitPath``,
memory/device/_hit_path.py, in front of ``SlowPath``) and the compiled ``CachingAllocator``
(memory/device/_native.pyx's ``HitPath`` in front of the same ``SlowPath``) on fresh simulated
devices and compares what a user can see: block addresses and sizes, ``memory_stats()``,
snapshots, and out-of-memory errors.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

import accelrt.replay as replay_module
from accelrt.backends.sim import SimBackend
from accelrt.memory import AllocatorConfig
from accelrt.memory.device import _core
from accelrt.trace import load

pytestmark = pytest.mark.skipif(
    _core.native is None, reason=f"compiled core not in use: {_core.CORE_REASON}"
)

ROOT = Path(__file__).resolve().parents[2]
TRACES = ROOT.parent / "shared" / "traces"
OWN_TRACES = [  # committed: the differential test runs on a fresh clone too
    ROOT / "tests" / "data" / "streams_midrun.pickle",
    ROOT / "tests" / "data" / "streams_expandable.pickle",
    ROOT / "examples" / "traces" / "transformer_train.jsonl.gz",
]
TRACE_FILES = (
    OWN_TRACES
    + sorted(TRACES.glob("cpu/*.jsonl.gz"))
    + sorted(TRACES.glob("gpu_snapshots/*.jsonl.gz"))
)
SETTINGS = [
    None,  # the trace's recorded settings, else the defaults
    "expandable_segments:True",
    "max_split_size_mb:128",
    "roundup_power2_divisions:4",
    "garbage_collection_threshold:0.6,per_process_memory_fraction:0.9",
    "policy:accelrt",
]


def _replay(cls: type[Any], path: Path, config: str | None) -> dict[str, Any]:
    """Replay ``path`` on a fresh sim device with allocator class ``cls``."""
    trace = load(path)
    original = replay_module.CachingAllocator
    replay_module.CachingAllocator = cls  # type: ignore[misc]
    try:
        last = max(len(trace.events) - 1, 0)
        report = replay_module.replay(trace, config=config, capture_at=(-1, last // 2, last))
    finally:
        replay_module.CachingAllocator = original  # type: ignore[misc]
    seen = report.to_dict()
    for timing in ("wall_seconds", "events_per_second"):
        del seen[timing]
    seen["memory_stats"] = report.memory_stats
    seen["segment_maps"] = report.segment_maps
    return seen


@pytest.mark.parametrize("path", TRACE_FILES, ids=lambda p: p.name.split(".")[0][:40])
def test_every_trace_replays_identically(path: Path) -> None:
    """Our committed traces, and where ../shared is here all 5 CPU and 40 GPU device traces,
    under their own settings and four others."""
    for config in SETTINGS:
        compiled = _replay(_core.CachingAllocator, path, config)
        reference = _replay(_core.ReferenceCachingAllocator, path, config)
        assert compiled == reference, f"{path.name} under {config}"


# ---------------------------------------------------------------------- generated sequences
MiB = 1 << 20
sizes = st.one_of(
    st.builds(lambda k, d: k * 512 - d, st.integers(1, 8), st.integers(0, 1)),
    st.integers(1, 4096),
    st.integers(1, 2 * MiB),
    st.integers(1, 40 * MiB),
    st.sampled_from([512, MiB, MiB + 1, 2 * MiB, 10 * MiB, 20 * MiB, 64 * MiB]),
)
operations = st.lists(
    st.one_of(
        st.tuples(st.just("malloc"), sizes, st.integers(0, 2)),
        st.tuples(st.just("free"), st.integers(0, 63), st.just(0)),
        st.tuples(st.just("free"), st.just(0), st.just(0)),  # the oldest: holes early on
        st.tuples(st.just("record_stream"), st.integers(0, 63), st.integers(0, 2)),
        st.tuples(st.just("empty_cache"), st.just(0), st.just(0)),
    ),
    max_size=120,
)
configs = st.sampled_from(
    [
        "",
        "expandable_segments:True",
        "max_split_size_mb:20",
        "max_split_size_mb:40,max_non_split_rounding_mb:30",
        "roundup_power2_divisions:[256:1,512:2,1024:4,>:8]",
        "garbage_collection_threshold:0.5,per_process_memory_fraction:0.5",
        "policy:accelrt",
        "policy:accelrt,per_process_memory_fraction:0.5",
    ]
)


def _run(cls: type[Any], config: str, ops: list[tuple[str, int, int]]) -> list[Any]:
    """Apply ``ops`` to a fresh allocator on a 256 MiB sim device; return what was seen."""
    backend = SimBackend(capacity=256 * MiB)
    streams = [0, backend.stream_create(0, 0), backend.stream_create(0, 0)]
    alloc = cls(backend, 0, AllocatorConfig.parse(config))
    live: list[Any] = []
    seen: list[Any] = []
    for op, a, b in ops:
        if op == "malloc":
            try:
                block = alloc.malloc(a, streams[b])
            except Exception as exc:  # out of memory: compare the whole message
                seen.append((type(exc).__name__, str(exc)))
            else:
                live.append(block)
                seen.append((block.address, block.size, block.stream))
        elif live and op == "free":
            alloc.free(live.pop(a % len(live)))
        elif live and op == "record_stream":
            alloc.record_stream(live[a % len(live)], streams[b])
        elif op == "empty_cache":
            alloc.empty_cache()
        seen.append(alloc.memory_stats())
    seen.append(alloc.snapshot()[0])
    for block in live:
        alloc.free(block)
    alloc.empty_cache()
    seen.append(alloc.memory_stats())
    return seen


@settings(
    max_examples=int(os.environ.get("ACCELRT_DIFF_EXAMPLES", "150")),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
@given(config=configs, ops=operations)
# a free block exactly 512 bytes larger than the request: split at the boundary
@example(
    config="", ops=[("malloc", 1536, 0), ("malloc", 1024, 0), ("free", 0, 0), ("malloc", 1024, 0)]
)
# an oversize block kept for oversize requests, and merging across a freed neighbour
@example(
    config="max_split_size_mb:20",
    ops=[("malloc", 30 << 20, 0), ("free", 0, 0), ("malloc", 5 << 20, 0), ("malloc", 25 << 20, 0)],
)
def test_generated_sequences_identical(config: str, ops: list[tuple[str, int, int]]) -> None:
    """Addresses, statistics after every step, the final snapshot and OOM messages agree."""
    assert _run(_core.CachingAllocator, config, ops) == _run(
        _core.ReferenceCachingAllocator, config, ops
    )


def test_compiled_core_is_selected_and_distinct() -> None:
    """The default CachingAllocator is the compiled HitPath in front of SlowPath; the
    reference is the Python HitPath in front of the same SlowPath."""
    assert _core.CORE == "compiled" and _core.native is not None
    assert _core.CachingAllocator.__bases__ == (_core.native.HitPath, _core.SlowPath)
    assert _core.ReferenceCachingAllocator.__bases__ == (_core.PythonHitPath, _core.SlowPath)
    backend = SimBackend(capacity=64 * MiB)
    block = _core.CachingAllocator(backend, 0).malloc(1000, 0)
    assert type(block).__module__ == "accelrt.memory.device._native"
    assert (block.size, block.requested_size) == (1024, 1000)


def test_both_hit_paths_have_one_layout() -> None:
    """The pair's twins have one layout: every name of the Python HitPath is one of the
    compiled HitPath's (but ``_expandable_candidate``: the compiled BlockPool.expandable_fit),
    neither defines a name that SlowPath or its bases define (nothing is shadowed), and each
    names its own block, pool and statistics types."""
    assert _core.native is not None
    python, compiled = _core.PythonHitPath, _core.native.HitPath

    def own(klass: type) -> set[str]:
        return {name for name in vars(klass) if not name.startswith("__")}

    assert own(python) - own(compiled) == {"_expandable_candidate"}
    slow = set().union(*(own(klass) for klass in _core.SlowPath.__mro__[:-1]))
    assert own(python) & slow == set()
    assert own(compiled) & slow == set()
    for name in ("_Block", "_BlockPool", "_Stat", "_StatArray", "_ActiveBlocks"):
        python_type, compiled_type = getattr(python, name), getattr(compiled, name)
        assert compiled_type is getattr(_core.native, name[1:])
        assert python_type.__name__ == ("dict" if name == "_ActiveBlocks" else name[1:])
        assert python_type.__module__ != compiled_type.__module__


def test_active_blocks_behave_as_the_dict_they_replace() -> None:
    # The compiled map of blocks by address stands in for a dict (the allocator's _active,
    # replay's live blocks): the same results and errors for what those do with it.
    assert _core.native is not None
    blocks = [_core.Block(0x1000 * i, 512, 0, None, None) for i in range(3)]
    compiled, reference = _core.native.ActiveBlocks(), {}
    for mapping in (compiled, reference):
        mapping.update([(10, blocks[0]), (20, blocks[1])])
        mapping[20] = blocks[2]  # filed again: replaced
        mapping[30] = blocks[1]  # any address, not only the block's own
    assert len(compiled) == len(reference) == 3
    assert sorted(map(id, compiled.values())) == sorted(map(id, reference.values()))
    for mapping in (compiled, reference):
        assert mapping.get(20) is blocks[2] and mapping.get(40, "none") == "none"
        assert mapping.pop(10) is blocks[0] and mapping.pop(10, None) is None
        with pytest.raises(KeyError, match="10"):
            mapping.pop(10)
        del mapping[30]
        with pytest.raises(KeyError, match="30"):
            del mapping[30]
        assert list(mapping.values()) == [blocks[2]]


def test_arena_lookups_agree_on_both_cores() -> None:
    # BlockPool.unmapped_at, first_run and blocks_from: the arenas' lookups (policy:accelrt's
    # miss path), checked on one hand-built segment against known answers on both cores.
    from accelrt.memory.device import _block

    assert _core.native is not None
    for block_type, pool_type in (
        (_core.native.Block, _core.native.BlockPool),
        (_block.Block, _block.BlockPool),
    ):
        pool = pool_type(False)
        # one segment, in address order: (name, address, size, stream, state)
        layout = [
            ("a", 0x1000, 0x800, 7, "free"),
            ("b", 0x1800, 0x800, 0, "unmapped"),
            ("c", 0x2000, 0x800, 7, "allocated"),
            ("d", 0x2800, 0x800, 0, "unmapped"),
            ("e", 0x3000, 0x800, 7, "free"),
            ("f", 0x3800, 0x1000, 0, "unmapped"),
        ]
        held = {}
        previous = None
        for name, address, size, stream, state in layout:
            block = held[name] = block_type(address, size, stream, pool, None)
            block.prev = previous
            if previous is not None:
                previous.next = block
            previous = block
            if state == "unmapped":
                block.mapped = False
                pool.insert_unmapped(block)
            elif state == "allocated":
                block.allocated = True
            else:
                pool.insert(block)
        small = block_type(0x9000, 0x200, 7, pool, None)  # alone in a segment of its own
        pool.insert(small)

        assert pool.unmapped_at(0, 0x1800) is held["b"]
        assert pool.unmapped_at(0, 0x47FF) is held["f"]
        for stream, address in ((0, 0x17FF), (0, 0x2000), (0, 0x4800), (7, 0x1800)):
            assert pool.unmapped_at(stream, address) is None, (stream, hex(address))

        # a free block of the stream just before an unmapped one starts the run
        assert pool.first_run(7, 0x1000, 0) is held["a"]
        # a..b stops at the allocated c; d, e (the stream's) and f hold 0x2000 bytes
        assert pool.first_run(7, 0x1800, 0) is held["d"]
        assert pool.first_run(7, 0x2001, 0) is None
        # another stream's free blocks end every run: only f is left
        assert pool.first_run(9, 0x1000, 0) is held["f"]
        assert pool.first_run(9, 0x1800, 0) is None
        assert pool.first_run(7, 0x800, 5) is None  # no unmapped block on that stream

        assert pool.blocks_from(0x800) == [held["a"], held["e"]]
        assert pool.blocks_from(0x200) == [small, held["a"], held["e"]]
        assert pool.blocks_from(0x801) == []
        pool.remove_unmapped(held["f"])
        assert pool.unmapped_at(0, 0x3800) is None


def test_compiled_buffer_adopts_the_most_derived_python_definitions() -> None:
    # Buffer's Python-level part overrides some of MemoryHandle's (CUDA-aware DLPack): the
    # compiled type must get the override, as a Python subclass would.
    from accelrt.memory.buffers._buffer import MemoryHandle, _BufferAPI, native

    assert native is not None  # the compiled fast path runs with the compiled core
    compiled = vars(native.Buffer)
    for name in ("__dlpack__", "__dlpack_device__", "_host_memory", "device", "__repr__"):
        assert compiled[name] is vars(_BufferAPI)[name]
    for name in ("freed", "numpy", "__enter__", "__exit__", "__reduce_ex__"):
        assert compiled[name] is vars(MemoryHandle)[name]
    assert native.Buffer.__doc__ == _BufferAPI.__doc__
