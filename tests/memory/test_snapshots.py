"""History, snapshots, dump_snapshot (read by PyTorch's own viewer code) and memory_summary."""

from __future__ import annotations

import pickle
from pathlib import Path

import pytest

import accelrt as acc
from accelrt.trace import TraceFormatError, read_snapshot

MiB = 1 << 20


def _actions(entries: list[dict[str, object]]) -> list[tuple[object, ...]]:
    return [(e["action"], e.get("size")) for e in entries]


def test_history_records_every_allocator_action(device: str) -> None:
    acc.record_memory_history(max_entries=100)
    a = acc.empty(100)
    b = acc.empty(3 * MiB)
    a.free()
    b.free()
    acc.empty_cache()
    entries = acc.memory_snapshot()["device_traces"][0]
    assert _actions(entries) == [  # type: ignore[arg-type]
        ("segment_alloc", 2 * MiB),
        ("alloc", 100),
        ("segment_alloc", 20 * MiB),
        ("alloc", 3 * MiB),
        ("free_requested", 100),
        ("free_completed", 100),
        ("free_requested", 3 * MiB),
        ("free_completed", 3 * MiB),
        ("segment_free", 20 * MiB),
        ("segment_free", 2 * MiB),
    ]
    assert entries[1]["addr"] == entries[0]["addr"]  # the block starts its segment
    assert all(e["stream"] == 0 and e["time_us"] > 0 for e in entries)
    here = entries[1]["frames"][0]
    assert here["name"] == "test_history_records_every_allocator_action"
    assert here["filename"] == __file__
    assert entries[5]["frames"] == []  # completions carry no stack


def test_history_modes_and_ring_buffer(sim: str) -> None:
    acc.record_memory_history(context="alloc", max_entries=3)
    for _ in range(3):
        acc.empty(10).free()
    entries = acc.memory_snapshot()["device_traces"][0]
    assert [e["action"] for e in entries] == ["alloc", "free_requested", "free_completed"]
    assert entries[0]["frames"] and entries[1]["frames"] == []  # 'alloc': no stacks on frees
    acc.record_memory_history(enabled="state", context=None)
    kept = acc.empty(10)
    again = acc.memory_snapshot()["device_traces"][0]
    assert again == entries  # "state" records no entry; what was recorded stays (PyTorch)
    acc.record_memory_history(enabled="state", context=None, clear_history=True)
    assert acc.memory_snapshot()["device_traces"][0] == []
    block = acc.memory_snapshot()["segments"][0]["blocks"][0]
    assert block["state"] == "active_allocated" and block["frames"] == []
    acc.record_memory_history(enabled=None)
    kept.free()
    assert acc.memory_snapshot()["device_traces"][0] == []
    for bad, match in (
        ({"enabled": "yes"}, "enabled must be 'all', 'state' or None, got 'yes'"),
        ({"context": "x"}, "context must be 'all', 'alloc', 'state' or None"),
        ({"stacks": "cpp"}, "stacks must be 'python' or 'all'"),
        ({"max_entries": 0}, "max_entries must be an int >= 1, got 0"),
        (
            {"skip_actions": ["alloc", "mallocs"]},
            "skip_actions: unknown action 'mallocs'; the "
            "actions are alloc, annotate, free_completed, free_requested, oom, segment_alloc, "
            "segment_free, "
            "segment_map, segment_unmap",
        ),
    ):
        with pytest.raises(ValueError, match=match):
            acc.record_memory_history(**bad)  # type: ignore[arg-type]


def test_skip_actions_clear_history_and_a_pool_of_its_own(sim: str) -> None:
    # record_memory_history's skip_actions and clear_history, memory_snapshot's mempool_id
    # and include_traces, as PyTorch 2.13 has them (issue 25)
    acc.record_memory_history(skip_actions=["free_requested", "segment_alloc"])
    a = acc.empty(100)
    a.free()
    entries = acc.memory_snapshot()["device_traces"][0]
    assert _actions(entries) == [("alloc", 100), ("free_completed", 100)]  # type: ignore[arg-type]
    acc.record_memory_history()  # again: keeps what was recorded, records everything now
    b = acc.empty(100)
    assert [e["action"] for e in acc.memory_snapshot()["device_traces"][0]] == [
        "alloc", "free_completed", "alloc",
    ]  # fmt: skip
    acc.record_memory_history(clear_history=True)
    assert acc.memory_snapshot()["device_traces"][0] == []
    pool = acc.memory.MemPool()
    with acc.memory.use_mem_pool(pool):
        c = acc.empty(3 * MiB)
    mine = acc.memory_snapshot(mempool_id=pool.id, include_traces=False)
    assert [s["segment_pool_id"] for s in mine["segments"]] == [pool.id]
    assert mine["segments"][0]["allocated_size"] == 3 * MiB
    assert mine["device_traces"] == [[], []]
    default = acc.memory_snapshot(mempool_id=(0, 0))
    assert {s["segment_pool_id"] for s in default["segments"]} == {(0, 0)}
    assert [e["action"] for e in default["device_traces"][0]][-1] == "alloc"
    with pytest.raises(TypeError, match="skip_actions must be a list of actions"):
        acc.record_memory_history(skip_actions="alloc")  # type: ignore[arg-type]
    b.free()
    c.free()


def test_snapshot_segments_and_block_states(sim: str) -> None:
    acc.record_memory_history()
    a = acc.empty(100)
    b = acc.empty(1000)
    other = acc.Stream()
    acc.record_stream(b, other)
    b.free()  # pending: waits for an event on ``other``
    snapshot = acc.memory_snapshot()
    assert snapshot["accelrt_schema_version"] == 2
    assert snapshot["allocator_settings"]["max_split_size"] == -1
    assert len(snapshot["device_traces"]) == 2 and snapshot["device_traces"][1] == []
    (segment,) = snapshot["segments"]
    assert segment["device"] == 0 and segment["total_size"] == 2 * MiB
    assert segment["segment_type"] == "small" and segment["is_expandable"] is False
    states = [(blk["size"], blk["requested_size"], blk["state"]) for blk in segment["blocks"]]
    assert states == [
        (512, 100, "active_allocated"),
        (1024, 1000, "active_pending_free"),
        (2 * MiB - 1536, 0, "inactive"),
    ]
    assert segment["allocated_size"] == 512 and segment["active_size"] == 1536
    assert segment["requested_size"] == 1100
    a.free()


def test_dump_snapshot_opens_in_pytorchs_viewer(sim: str, tmp_path: Path) -> None:
    viz = pytest.importorskip("torch.cuda._memory_viz")
    acc.record_memory_history()
    small = acc.empty(100)
    big = acc.empty(30 * MiB)
    acc.empty(3 * MiB).free()
    path = tmp_path / "snap.pickle"
    acc.dump_snapshot(path)
    with open(path, "rb") as f:
        snapshot = pickle.load(f)
    assert read_snapshot(path) == snapshot  # plain data: our restricted reader takes it too
    summary = viz.segsum(snapshot)
    assert "segments: 3" in summary and "total_reserved: 52.0MiB" in summary
    trace = viz.trace(snapshot)
    assert "b = a[0:100.0B]" in trace and "cudaMalloc" in trace
    for plot in (viz.trace_plot(snapshot), viz.segment_plot(snapshot)):
        assert plot.startswith("<!DOCTYPE html>") or "<html" in plot
    small.free()
    big.free()


def test_memory_summary_matches_pytorchs_table(sim: str, monkeypatch: pytest.MonkeyPatch) -> None:
    memory = pytest.importorskip("torch.cuda.memory")
    buffers = [acc.empty(n) for n in (100, 3 * MiB, 900 * 1024, 40 * MiB)]
    buffers[1].free()
    stats = acc.memory_stats()
    monkeypatch.setattr(memory, "memory_stats", lambda device=None: stats)
    for abbreviated in (False, True):
        theirs = memory.memory_summary(0, abbreviated=abbreviated).splitlines()
        ours = acc.memory_summary(abbreviated=abbreviated).splitlines()
        assert "accelrt memory summary, device sim:0" in ours[1]
        assert len(ours) == len(theirs)
        renamed = {"GPU reserved memory": "Reserved memory", "GPU reserved segments": "Reserved"
                   " segments", "Oversize GPU segments": "Oversize segments"}  # fmt: skip
        for mine, reference in zip(ours[5:], theirs[5:], strict=True):
            for old, new in renamed.items():
                reference = reference.replace(old, new.ljust(len(old)))
            assert mine == reference
    assert "|  40960 KiB |" in acc.memory_summary()  # unit chosen from the row's value
    for b in buffers[:1] + buffers[2:]:
        b.free()


def test_memory_summary_before_first_use(sim: str) -> None:
    text = acc.memory_summary()
    assert text.count("\n") == 47 and "|      0 B   |" in text
    assert acc.memory_summary(abbreviated=True).count("\n") == 29


def test_restricted_unpickler_runs_nothing(tmp_path: Path) -> None:
    marker = tmp_path / "ran"

    class Evil:
        def __reduce__(self) -> tuple[object, tuple[str]]:
            return (Path.touch, (str(marker),))

    path = tmp_path / "evil.pickle"
    path.write_bytes(pickle.dumps({"segments": [], "device_traces": [Evil()]}))
    with pytest.raises(TraceFormatError, match=r"refused: the pickle names global 'pathlib"):
        acc.trace.load(path)
    assert not marker.exists()
    path.write_bytes(pickle.dumps([1, 2]))
    with pytest.raises(TraceFormatError, match="not a PyTorch memory snapshot"):
        read_snapshot(path)
    path.write_bytes(pickle.dumps({"segments": [], "device_traces": [[]]}))
    with pytest.raises(TraceFormatError, match="has no allocation history"):
        acc.trace.load(path)


def test_named_stages_are_the_snapshots_external_annotations(sim: str) -> None:
    # PyTorch's snapshots carry torch.profiler.record_function ranges as external_annotations
    # entries {"name", "stage": "START"/"END", "device", "time_us"} (issue 25)
    with acc.memory.record_function("before history"):  # no history: nothing, no error
        pass
    acc.record_memory_history(max_entries=3)
    with acc.memory.record_function("forward"):
        a = acc.empty(100)

    @acc.memory.record_function("step")
    def step() -> None:
        acc.empty(100).free()

    step()
    snapshot = acc.memory_snapshot()
    stages = [(e["name"], e["stage"], e["device"]) for e in snapshot["external_annotations"]]
    # a ring of max_entries: the oldest edge ("forward" START) is gone
    assert stages == [("forward", "END", 0), ("step", "START", 0), ("step", "END", 0)]
    times = [e["time_us"] for e in snapshot["external_annotations"]]
    entries = snapshot["device_traces"][0]
    assert [e["action"] for e in entries] == ["alloc", "free_requested", "free_completed"]
    assert times[1] <= entries[0]["time_us"] <= entries[-1]["time_us"] <= times[2]  # in step
    with pytest.raises(ValueError, match="boom"), acc.memory.record_function("fails"):
        raise ValueError("boom")
    assert [e["stage"] for e in acc.memory_snapshot()["external_annotations"]][-2:] == [
        "START", "END",
    ]  # fmt: skip
    assert acc.memory_snapshot(include_traces=False)["external_annotations"] == []
    with (
        pytest.raises(TypeError, match=r"takes a stage name \(str\), got 3"),
        acc.memory.record_function(3),  # type: ignore[arg-type]
    ):
        pass
    acc.record_memory_history(enabled=None)
    acc.record_memory_history(enabled="state")  # "state" keeps no entries, nor stages
    with acc.memory.record_function("kept nowhere"):
        pass
    assert acc.memory_snapshot()["external_annotations"] == []
    a.free()


def test_named_stages_of_other_threads_need_global_record_annotations(sim: str) -> None:
    import threading

    def in_a_thread(name: str) -> None:
        thread = threading.Thread(target=lambda: acc.memory.record_function(name).__enter__())
        thread.start()
        thread.join()

    acc.record_memory_history()
    in_a_thread("other thread")
    with acc.memory.record_function("main"):
        pass
    names = {e["name"] for e in acc.memory_snapshot()["external_annotations"]}
    assert names == {"main"}
    acc.record_memory_history(global_record_annotations=True, compile_context=True)
    in_a_thread("other thread")
    names = {e["name"] for e in acc.memory_snapshot()["external_annotations"]}
    assert names == {"main", "other thread"}  # kept across the restart, and the new one
    with pytest.raises(TypeError, match="global_record_annotations must be a bool, got 1"):
        acc.record_memory_history(global_record_annotations=1)  # type: ignore[arg-type]


def test_set_memory_metadata_stamps_the_threads_entries(sim: str) -> None:
    # torch.cuda.memory._set_memory_metadata: each entry the thread records carries
    # "user_metadata"; thread-local; "" stops it (issue 25)
    import threading

    acc.record_memory_history()
    assert acc.memory.get_memory_metadata() == ""
    plain = acc.empty(100)
    acc.memory.set_memory_metadata("forward")
    stamped = acc.empty(100)
    seen: list[str] = []
    thread = threading.Thread(target=lambda: seen.append(acc.memory.get_memory_metadata()))
    thread.start()
    thread.join()
    assert seen == [""] and acc.memory.get_memory_metadata() == "forward"
    acc.memory.set_memory_metadata("")
    plain.free()
    stamped.free()
    entries = acc.memory_snapshot()["device_traces"][0]
    assert [(e["action"], e.get("user_metadata")) for e in entries] == [
        ("segment_alloc", None), ("alloc", None),
        ("alloc", "forward"),  # in the segment the first made
        ("free_requested", None), ("free_completed", None),
        ("free_requested", None), ("free_completed", None),
    ]  # fmt: skip
    with pytest.raises(TypeError, match="set_memory_metadata\\(\\) takes a string, got 1"):
        acc.memory.set_memory_metadata(1)  # type: ignore[arg-type]


def test_annotate_buffer_adds_an_entry_for_the_live_allocation(sim: str, tmp_path: Path) -> None:
    # torch.cuda.memory._annotate_tensor (2.14): an "annotate" entry at the allocation's
    # address, its text as user_metadata, the caller's stack; the alloc entry unchanged
    acc.memory.annotate_buffer(acc.empty(100), "before recording")  # no history: no effect
    acc.record_memory_history()
    buf = acc.empty(3 * MiB)
    acc.memory.annotate_buffer(buf, "saved for backward")
    acc.memory.annotate_buffer(buf, "packed")  # annotations pile up
    snapshot = acc.memory_snapshot()
    entries = snapshot["device_traces"][0]
    assert [(e["action"], e["addr"], e["size"], e.get("user_metadata")) for e in entries] == [
        ("segment_alloc", buf.ptr, 20 * MiB, None),
        ("alloc", buf.ptr, 3 * MiB, None),
        ("annotate", buf.ptr, 3 * MiB, "saved for backward"),
        ("annotate", buf.ptr, 3 * MiB, "packed"),
    ]
    assert any(
        f["name"] == "test_annotate_buffer_adds_an_entry_for_the_live_allocation"
        for f in entries[2]["frames"]
    )
    path = tmp_path / "annotated.pickle"
    acc.memory.dump_snapshot(str(path))
    read_snapshot(path)  # accelrt's reader takes the new action
    acc.record_memory_history(skip_actions=["annotate"], clear_history=True)
    acc.memory.annotate_buffer(buf, "skipped")
    assert acc.memory_snapshot()["device_traces"][0] == []
    buf.free()
    with pytest.raises(ValueError):
        acc.memory.annotate_buffer(buf, "freed")
    with pytest.raises(TypeError, match="annotate_buffer\\(\\) takes a Buffer, got int"):
        acc.memory.annotate_buffer(1, "x")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="takes a string as metadata, got 2"):
        acc.memory.annotate_buffer(acc.empty(8), 2)  # type: ignore[arg-type]
