"""Damaged and hostile snapshot pickles: a clean one-line error or a trace that replays.

Small snapshots (hand-made in PyTorch's shape, and recorded with the public API) are mutated
with a seeded mutator, as data (dropped keys, wrong types, huge or negative numbers, unknown
states, duplicated, removed and reordered entries) and as bytes (truncated, flipped,
inserted, repeated). Every outcome must be a ``TraceFormatError`` of one line naming the file,
or a snapshot whose segment map prints and whose trace replays without an exception. (Frame
lists are mutated whole, not frame by frame: the replay does not read frames.)
"""

from __future__ import annotations

import collections
import copy
import io
import itertools
import pickle
import random
import struct
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import accelrt as acc
from accelrt.replay import replay
from accelrt.trace import (
    TraceFormatError,
    devices_with_history,
    read_snapshot,
    trace_from_snapshot,
)
from accelrt.view import segment_text

MiB = 1 << 20
MUTATIONS = 2400
SEED = 20240611
STREAM = 94_000_000_000_000


def _block(address: int, size: int, state: str, requested: int | None = None) -> dict[str, Any]:
    frames = [{"name": "forward", "filename": "model.py", "line": 7}]
    return {
        "address": address,
        "size": size,
        "requested_size": size if requested is None else requested,
        "state": state,
        "frames": frames if state != "inactive" else [],
    }


def _entry(action: str, addr: int, size: int, stream: int = STREAM) -> dict[str, Any]:
    frames = [{"name": "c10::cuda::malloc", "filename": "??", "line": 0},
              {"name": "forward", "filename": "model.py", "line": 7}]  # fmt: skip
    return {"action": action, "addr": addr, "size": size, "stream": stream, "time_us": 1,
            "frames": frames}  # fmt: skip


def _hand_made() -> dict[str, Any]:
    """Two devices in PyTorch's shape: a large and a small segment, history with an OOM."""
    base, small, other = 0x7F3A00000000, 0x7F3B00000000, 0x7F4A00000000
    return {
        "segments": [
            {"device": 0, "address": base, "total_size": 20 * MiB, "stream": STREAM,
             "segment_type": "large", "segment_pool_id": (0, 0), "is_expandable": False,
             "blocks": [_block(base, 4 * MiB, "active_allocated", 4 * MiB - 100),
                        _block(base + 4 * MiB, 6 * MiB, "active_pending_free"),
                        _block(base + 10 * MiB, 10 * MiB, "inactive", 0)]},
            {"device": 0, "address": small, "total_size": 2 * MiB, "stream": 0,
             "segment_type": "small", "segment_pool_id": (0, 0), "is_expandable": False,
             "blocks": [_block(small, 512, "active_allocated", 300),
                        _block(small + 512, 2 * MiB - 512, "inactive", 0)]},
            {"device": 1, "address": other, "total_size": 2 * MiB, "stream": 0,
             "segment_type": "small", "is_expandable": False,
             "blocks": [_block(other, 2 * MiB, "active_allocated", 2 * MiB)]},
        ],
        "device_traces": [
            [_entry("segment_alloc", base, 20 * MiB),
             _entry("alloc", base, 4 * MiB - 100),
             _entry("alloc", base + 4 * MiB, 6 * MiB),
             _entry("alloc", base + 10 * MiB, 3 * MiB),
             {"action": "oom", "device_free": 10 * MiB, "size": 40 * MiB, "stream": STREAM,
              "time_us": 4, "frames": []},
             _entry("free_requested", base + 10 * MiB, 3 * MiB),
             _entry("free_completed", base + 10 * MiB, 3 * MiB),
             _entry("free_requested", base + 4 * MiB, 6 * MiB),
             _entry("segment_alloc", small, 2 * MiB, 0),
             _entry("alloc", small, 300, 0),
             {"action": "snapshot", "addr": 0, "size": 0, "stream": 0, "time_us": 9},
             {"action": "user_defined", "time_us": 10}],
            [_entry("alloc", other, 2 * MiB, 0)],
        ],
        "allocator_settings": {"PYTORCH_CUDA_ALLOC_CONF": "", "max_split_size": -1,
                               "garbage_collection_threshold": 0.0, "expandable_segments": False,
                               "roundup_power2_divisions": {"1": 0, "2": 0}},
    }  # fmt: skip


def _recorded(tmp_path: Path, settings: str, seed: int) -> dict[str, Any]:
    """A small run recorded mid-way with the public API (sim backend), as PyTorch dumps it."""
    acc.backends.use("sim")
    acc.set_allocator_settings(settings)
    rng = random.Random(seed)
    streams = [acc.current_stream(), acc.Stream()]
    live: list[Any] = []

    def run(steps: int) -> None:
        for _ in range(steps):
            roll = rng.random()
            if roll < 0.5 or not live:
                size = rng.choice([rng.randint(1, 1 << 20), rng.randint(1 << 20, 30 * MiB)])
                live.append(acc.empty(size, stream=rng.choice(streams)))
            elif roll < 0.96:
                live.pop(rng.randrange(len(live))).free()
            else:
                acc.empty_cache()

    run(30)
    acc.record_memory_history()
    run(50)
    path = tmp_path / f"recorded_{seed}.pickle"
    acc.dump_snapshot(path)
    for buf in live:
        buf.free()
    snapshot: dict[str, Any] = pickle.loads(path.read_bytes())
    for seg in snapshot["segments"]:  # short stacks: the same size however deep pytest runs
        for item in [seg, *seg["blocks"]]:
            item["frames"] = item.get("frames", [])[:2]
    for entries in snapshot["device_traces"]:
        for entry in entries:
            entry["frames"] = entry.get("frames", [])[:2]
    return snapshot


# ------------------------------------------------------------------------------- the mutator

_JUNK: list[Any] = [None, True, False, -1, 0, 1, 511, 513, 2**62, 2**63 - 1, 2**63, 2**64,
                    -(2**63), 10**30, 1.5, float("nan"), "x", "", b"x", [], {}, [[[]]],
                    {"a": 1}, ("t", 1), [{"address": 1}]]  # fmt: skip
_STATES = ["active_allocated", "active_pending_free", "inactive", "unknown_state"]
_ACTIONS = ["alloc", "free_requested", "free_completed", "segment_alloc", "segment_free",
            "segment_map", "segment_unmap", "oom", "snapshot", "user_defined"]  # fmt: skip


def _slots(snapshot: Any) -> tuple[list[tuple[Any, Any]], list[list[Any]]]:
    """Every (container, key) of the snapshot's tree, and every list in it (frames: whole)."""
    slots: list[tuple[Any, Any]] = []
    lists: list[list[Any]] = []
    stack = [snapshot]
    while stack:
        node = stack.pop()
        if isinstance(node, dict):
            for key, value in node.items():
                slots.append((node, key))
                if key != "frames":
                    stack.append(value)
        elif isinstance(node, list):
            lists.append(node)
            for i, value in enumerate(node):
                slots.append((node, i))
                stack.append(value)
    return slots, lists


def _number(rng: random.Random, value: int) -> int:
    return rng.choice([value + 1, value - 1, -value, value * 512 + 1, value // 3, value + 256,
                       2**62, 2**63 - 1, 2**63, 2**60 + 1, 0, -1, 512, 2 * MiB])  # fmt: skip


_PLACES = ("addr", "size", "address", "total_size", "requested_size", "device_free")


def _move(rng: random.Random, slots: list[tuple[Any, Any]]) -> None:
    """Schema-valid but odd: a size or address moved next to (or onto) another one."""
    places = [(c, k) for c, k in slots if k in _PLACES and isinstance(c, dict)]
    places = [(c, k) for c, k in places if type(c[k]) is int]
    if not places:
        return
    addresses = [c[k] for c, k in places if k in ("addr", "address")] or [0]
    container, key = rng.choice(places)
    base = rng.choice(addresses) if key in ("addr", "address") else container[key]
    step = rng.choice([1, 300, 512, 2 * MiB, 20 * MiB]) * rng.choice([-1, 1])
    container[key] = max(0, rng.choice([base + step, base * 2, base // 2, base]))


def _mutate_data(rng: random.Random, snapshot: dict[str, Any]) -> None:
    slots, lists = _slots(snapshot)
    kind = rng.choice(["drop", "junk", "number", "number", "move", "move", "word", "word",
                       "dup", "dup_ref", "shuffle", "remove", "swap"])  # fmt: skip
    container, key = rng.choice(slots)
    value = container[key]
    if kind == "move":
        _move(rng, slots)
    elif kind == "drop" and isinstance(container, dict):
        del container[key]
    elif kind == "junk":
        container[key] = copy.deepcopy(rng.choice(_JUNK))
    elif kind == "number" and isinstance(value, int) and not isinstance(value, bool):
        container[key] = _number(rng, value)
    elif kind == "word" and isinstance(value, str):
        container[key] = rng.choice(_STATES + _ACTIONS)
    elif kind in ("dup", "dup_ref", "shuffle", "remove", "swap"):
        target = rng.choice(lists)
        if not target:
            return
        i = rng.randrange(len(target))
        if kind == "dup":
            target.insert(rng.randrange(len(target) + 1), copy.deepcopy(target[i]))
        elif kind == "dup_ref":  # the same object twice: a memo reference in the pickle
            target.insert(rng.randrange(len(target) + 1), target[i])
        elif kind == "shuffle":
            rng.shuffle(target)
        elif kind == "remove":
            del target[i]
        else:
            j = rng.randrange(len(target))
            target[i], target[j] = target[j], target[i]


def _mutate_bytes(rng: random.Random, data: bytes) -> bytes:
    buf = bytearray(data)
    kind = rng.choice(["truncate", "flip", "flip", "insert", "repeat", "length"])
    if kind == "truncate":
        return bytes(buf[: rng.randrange(len(buf))])
    if kind == "flip":
        for _ in range(rng.randint(1, 4)):
            buf[rng.randrange(len(buf))] = rng.randrange(256)
    elif kind == "insert":
        at = rng.randrange(len(buf))
        buf[at:at] = bytes(rng.randrange(256) for _ in range(rng.randint(1, 9)))
    elif kind == "repeat":
        at = rng.randrange(len(buf))
        buf[at:at] = buf[at : at + rng.randint(1, 64)] * rng.randint(2, 50)
    else:  # a huge length or memo index after an opcode byte
        at = rng.randrange(2, len(buf))
        buf[at : at + 9] = bytes([rng.choice(b"\x8e\x8d\x96\x95BXr")]) + struct.pack(
            "<Q", rng.choice([2**62, 2**40, 2**31 - 1, 2**32 - 1])
        )
    return bytes(buf)


def _write(path: Path, data: bytes) -> None:
    """Overwrite ``path`` in place (much cheaper than truncating it first on some disks)."""
    with open(path, "ab") as f:
        f.truncate(len(data))
    with open(path, "r+b") as f:
        f.write(data)


def _check_outcome(path: Path) -> str:
    """Read, print and replay one file; return what happened (raise on anything unclean)."""
    try:
        snapshot = read_snapshot(path)
    except TraceFormatError as exc:
        _assert_clean(exc, path)
        return "refused when read"
    assert isinstance(segment_text(snapshot["segments"]), str)
    assert isinstance(segment_text([s for s in snapshot["segments"] if s.get("device") == 0]), str)
    outcomes = []
    for device in devices_with_history(snapshot):
        try:
            trace = trace_from_snapshot(snapshot, device=device, path=str(path))
        except TraceFormatError as exc:
            _assert_clean(exc, path)
            outcomes.append("refused by trace_from_snapshot")
            continue
        report = replay(trace)
        assert report.events == len(trace.events)
        outcomes.append("replayed")
    return min(outcomes, default="read, no history")  # "refused..." before "replayed"


def _assert_clean(exc: TraceFormatError, path: Path) -> None:
    text = str(exc)
    assert "\n" not in text and text.startswith(str(path)), text
    assert len(text) < 400, text


def test_mutated_snapshots_fail_cleanly_or_replay(tmp_path: Path) -> None:
    bases = [
        _hand_made(),
        _recorded(tmp_path, "", 1),
        _recorded(tmp_path, "expandable_segments:True", 2),
        _recorded(tmp_path, "max_split_size_mb:20,roundup_power2_divisions:4", 3),
    ]
    acc.set_allocator_settings("")
    for base in bases:  # every base itself replays
        path = tmp_path / "base.pickle"
        path.write_bytes(pickle.dumps(base))
        assert _check_outcome(path) == "replayed"
    pickled = [pickle.dumps(base) for base in bases]
    rng = random.Random(SEED)
    outcomes: collections.Counter[str] = collections.Counter()
    path = tmp_path / "run.pickle"
    start = time.perf_counter()
    for n in range(MUTATIONS):
        snapshot = pickle.loads(rng.choice(pickled))
        for _ in range(rng.choice([1, 1, 2, 3])):
            _mutate_data(rng, snapshot)
        try:
            data = pickle.dumps(snapshot, protocol=rng.choice([2, 4, 5]))
        except (RecursionError, ValueError):
            continue
        if rng.random() < 0.3:
            data = _mutate_bytes(rng, data)
        _write(path, data)
        try:
            outcomes[_check_outcome(path)] += 1
        except BaseException:
            print(f"mutation {n} (seed {SEED}) failed; its file is {path}")
            raise
    elapsed = time.perf_counter() - start
    print(f"{sum(outcomes.values())} mutations in {elapsed:.1f} s: {dict(outcomes)}")
    assert sum(outcomes.values()) >= 2000
    assert outcomes["replayed"] > 300 and outcomes["refused when read"] > 300


# ---------------------------------------------------------------------- hostile pickles


def _refusal(path: Path, data: bytes) -> str:
    path.write_bytes(data)
    start = time.perf_counter()
    with pytest.raises(TraceFormatError) as info:
        read_snapshot(path)
    assert time.perf_counter() - start < 10  # refused before decoding: no hang, no huge allocation
    _assert_clean(info.value, path)
    return str(info.value)


def test_fourteen_bytes_claiming_2_62_bytes_fail_fast(tmp_path: Path) -> None:
    path = tmp_path / "tiny.pickle"
    for opcode in b"\x8e\x8d\x96\x95":  # BINBYTES8, BINUNICODE8, BYTEARRAY8, FRAME
        data = b"\x80\x04" + bytes([opcode]) + struct.pack("<Q", 2**62) + b"ab."
        assert len(data) == 14
        message = _refusal(path, data)
        assert "declares 4611686018427387904 bytes, more than the 3 that follow" in message
    message = _refusal(path, b"\x80\x03B" + struct.pack("<I", 2**32 - 1) + b"ab.")
    assert "declares 4294967295 bytes" in message


def test_memo_bombs_are_refused(tmp_path: Path) -> None:
    path = tmp_path / "bomb.pickle"
    entry = {"action": "alloc", "addr": 4096, "size": 512, "stream": 0}
    many = [entry] * 1_000_000  # one dict, a million references: 2 bytes each
    data = pickle.dumps({"segments": [], "device_traces": [many] * 1_000_000})
    assert len(data) < 5_000_000
    assert "a memo bomb" in _refusal(path, data)
    segment = {"device": 0, "address": 0, "total_size": 512, "stream": 0,
               "blocks": [{"address": 0, "size": 512, "state": "inactive"}] * 500_000}  # fmt: skip
    assert "a memo bomb" in _refusal(path, pickle.dumps({"segments": [segment] * 500_000}))
    # a memo index far beyond the file: the unpickler would size its memo by it
    message = _refusal(path, b"\x80\x02N" + b"r" + struct.pack("<I", 2**31 - 1) + b".")
    assert "memo index 2147483647" in message
    assert "memo index" in _refusal(path, b"\x80\x02Np99999999999\n.")


def _side_effect(marker: str) -> None:  # pragma: no cover - must never run
    Path(marker).write_text("ran")


class _Payload:
    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[Callable[[str], None], tuple[str]]:
        return _side_effect, (str(self.marker),)


def test_pickles_naming_globals_are_refused_and_nothing_runs(tmp_path: Path) -> None:
    path, marker = tmp_path / "evil.pickle", tmp_path / "marker"
    for protocol in (0, 2, 4, 5):
        data = pickle.dumps({"segments": [], "x": _Payload(marker)}, protocol=protocol)
        message = _refusal(path, data)
        assert "refused: the pickle names global" in message and "_side_effect" in message
        assert not marker.exists()
    message = _refusal(path, pickle.dumps({"segments": [], "device_traces": [], "p": Path("/")}))
    assert "refused: the pickle names global 'pathlib" in message


def test_deep_nesting(tmp_path: Path) -> None:
    path = tmp_path / "deep.pickle"
    depth = 1_000_000
    # a dict key a million tuples deep: hashing it would overflow the C stack
    key = b"\x80\x04}" + b"N" + b"\x85" * depth + b"K\x01s."
    assert "a tuple of containers or shared values" in _refusal(path, key)
    # tuples sharing their items: hashing the last would take 2**100 steps
    shared = b"\x80\x04)\x94"
    for i in range(100):
        shared += b"h" + bytes([i]) + b"h" + bytes([i]) + b"\x86\x94"
    assert "a tuple of containers" in _refusal(path, shared + b"}\x94(h\x64K\x01u.")
    # a million nested lists where a segment should be: named, not recursed into
    nested = b"\x80\x04}\x8c\x08segments" + b"]" * depth + b"a" * (depth - 1) + b"s."
    message = _refusal(path, nested)
    assert message == f"{path}: segments[0]: expected a dict, got a list of 1 items"
    # deep nesting where accelrt does not look is harmless: the snapshot replays
    snapshot = _hand_made()
    data = pickle.dumps(snapshot)
    assert data.endswith(b"u.")
    extra = b"\x8c\x05extra" + b"]" * 100_000 + b"a" * 99_999 + b"s."
    path.write_bytes(data[:-1] + extra)  # set one more key after the last SETITEMS
    read = read_snapshot(path)
    assert isinstance(read["extra"], list)
    replay(trace_from_snapshot(read, device=0, path=str(path)))
    # flat tuples of scalars written in place (segment_pool_id) are fine, however many
    snapshot["tuples"] = [(i, f"pool {i}", 1.5) for i in range(1000)] + [tuple(range(16))]
    path.write_bytes(pickle.dumps(snapshot))
    assert len(read_snapshot(path)["tuples"]) == 1001


def _message_for(tmp_path: Path, change: Callable[[dict[str, Any]], object]) -> str:
    snapshot = _hand_made()
    change(snapshot)
    path = tmp_path / "run.pickle"
    path.write_bytes(pickle.dumps(snapshot))
    with pytest.raises(TraceFormatError) as info:
        read_snapshot(path)
    return str(info.value).replace(str(path), "run.pickle")


def test_messages_name_the_place_inside_the_file(tmp_path: Path) -> None:
    traces: Any = lambda s: s["device_traces"]  # noqa: E731
    blocks: Any = lambda s: s["segments"][1]["blocks"]  # noqa: E731
    cases: list[tuple[Callable[[dict[str, Any]], object], str]] = [
        (lambda s: traces(s)[0][1].pop("addr"), "device_traces[0][1]: missing 'addr'"),
        (
            lambda s: blocks(s)[1].update(size="x"),
            "segments[1].blocks[1].size: expected a positive int below 2**63, got 'x'",
        ),
        (
            lambda s: s["segments"][0].update(address=-5),
            "segments[0].address: expected a non-negative int below 2**63, got -5",
        ),
        (
            lambda s: s["segments"][2].update(total_size=2**63),
            "segments[2].total_size: expected a positive int below 2**63, got 9223372036854775808",
        ),
        (
            lambda s: traces(s)[1][0].update(size=True),
            "device_traces[1][0].size: expected a non-negative int below 2**63, got True",
        ),
        (
            lambda s: traces(s)[0].__setitem__(3, "alloc"),
            "device_traces[0][3]: expected a dict, got 'alloc'",
        ),
        (lambda s: traces(s)[0][4].pop("size"), "device_traces[0][4]: missing 'size'"),
        (
            lambda s: traces(s)[0][2].update(action=["alloc"]),
            "device_traces[0][2].action: expected a str, got a list of 1 items",
        ),
        (
            lambda s: traces(s)[0][0].update(stream=2**70),
            "device_traces[0][0].stream: expected an int in [-2**63, 2**64), got "
            "1180591620717411303424",
        ),
        (
            lambda s: s["segments"][0].update(segment_type="huge"),
            "segments[0].segment_type: expected 'small' or 'large', got 'huge'",
        ),
        (
            lambda s: s["segments"][0].update(blocks=None),
            "segments[0].blocks: expected a list, got None",
        ),
        (lambda s: blocks(s)[0].pop("state"), "segments[1].blocks[0]: missing 'state'"),
        (
            lambda s: s.update(device_traces={"0": []}),
            "device_traces: expected a list, got a dict of 1 items",
        ),
        (lambda s: traces(s).append(5), "device_traces[2]: expected a list, got 5"),
        (
            lambda s: traces(s)[0][1].update(frames="x"),
            "device_traces[0][1].frames: expected a list, got 'x'",
        ),
        (
            lambda s: s.update(allocator_settings=[]),
            "allocator_settings: expected a dict, got a list of 0 items",
        ),
    ]
    for change, expected in cases:
        assert _message_for(tmp_path, change) == f"run.pickle: {expected}"
    message = _message_for(
        tmp_path, lambda s: s["allocator_settings"].update(roundup_power2_divisions={"x": 1})
    )
    assert message.startswith("run.pickle: allocator_settings: ") and "\n" not in message


def _replayed(snapshot: dict[str, Any], device: int = 0) -> tuple[Any, Any]:
    trace = trace_from_snapshot(snapshot, device=device, path="odd.pickle")
    return trace, replay(trace)


def test_odd_but_well_formed_snapshots_replay(tmp_path: Path) -> None:
    # blocks that do not tile their segment: the segment is left out of the start state
    snapshot = _hand_made()
    snapshot["segments"][0]["blocks"][1]["size"] += 512
    trace, report = _replayed(snapshot)
    assert trace.recording.inconsistent_events > 0
    assert report.notes and "could not be placed" in report.notes[-1]
    # overlapping segments, and a segment at the same address twice
    snapshot = _hand_made()
    twin = copy.deepcopy(snapshot["segments"][1])
    snapshot["segments"].append(twin)
    shifted = copy.deepcopy(snapshot["segments"][0])
    shifted["address"] += 4 * MiB
    for block in shifted["blocks"]:
        block["address"] += 4 * MiB
    snapshot["segments"].append(shifted)
    trace, report = _replayed(snapshot)
    starts = sorted((s.address, s.address + s.size) for s in trace.recording.start_segments)
    assert all(a[1] <= b[0] for a, b in itertools.pairwise(starts))
    # frees of unknown addresses, sizes that are not multiples of 512, an empty segment list
    snapshot = _hand_made()
    snapshot["device_traces"][0].append(_entry("free_requested", 12345, 777))
    snapshot["device_traces"][0].append(_entry("segment_free", 0x1000, 1000))
    snapshot["segments"][1]["blocks"][0]["size"] = 500
    snapshot["segments"][1]["blocks"][1]["size"] = 2 * MiB - 500
    snapshot["segments"][1]["blocks"][1]["address"] -= 12
    _replayed(snapshot)
    # negative reserved totals (frees of segments never allocated)
    snapshot = _hand_made()
    snapshot["segments"] = []
    snapshot["device_traces"][0].insert(0, _entry("segment_free", 0x5000000, 80 * MiB))
    trace, report = _replayed(snapshot)
    assert trace.recording.reserved_at_end_bytes == 0
    # an OOM entry whose device would not hold the start state: no capacity from it
    snapshot = _hand_made()
    snapshot["device_traces"][0][4]["device_free"] = 0
    snapshot["device_traces"][0].insert(4, _entry("segment_free", 0x7F3A00000000, 20 * MiB))
    trace, report = _replayed(snapshot)
    assert report.capacity_bytes > 0
    # a failed request beyond what any allocator takes fails as one of 2**60 bytes
    snapshot = _hand_made()
    snapshot["device_traces"][0][4]["size"] = 2**62
    trace, report = _replayed(snapshot)
    assert [o.requested_bytes for o in report.ooms] == [2**60]
    # an expandable segment whose blocks are not whole pages is left out, not crashed on
    snapshot = _hand_made()
    snapshot["segments"][0]["is_expandable"] = True
    snapshot["device_traces"][0].append(_entry("segment_unmap", 0x7F3A00000000 + 512, 512))
    _replayed(snapshot)


def test_impossible_sizes_are_refused(tmp_path: Path) -> None:
    snapshot = _hand_made()
    snapshot["device_traces"][0][1]["size"] = 2**61
    with pytest.raises(TraceFormatError, match=r"device_traces\[0\]\[1\]\.size: an allocation"):
        trace_from_snapshot(snapshot, device=0, path="big.pickle")
    snapshot = _hand_made()
    snapshot["segments"][0]["total_size"] = 2**63
    with pytest.raises(TraceFormatError, match=r"segments\[0\]\.total_size"):
        trace_from_snapshot(snapshot, device=0)
    # a start state larger than the simulated device can be
    snapshot = _hand_made()
    size = 2**62
    snapshot["segments"][0]["total_size"] = size
    snapshot["segments"][0]["blocks"][2]["size"] = size - 10 * MiB
    snapshot["device_traces"][0] = snapshot["device_traces"][0][1:4]  # no segment_alloc, no oom
    with pytest.raises(TraceFormatError, match="start state holds"):
        trace_from_snapshot(snapshot, device=0, path="huge.pickle")


def test_a_snapshot_of_15k_entries_reads(tmp_path: Path) -> None:
    """A snapshot of ~15k entries (with their stacks) is read and turned into a trace."""
    snapshot = _hand_made()
    entries = snapshot["device_traces"][0]
    base = 0x7F3A00000000 + 10 * MiB
    for i in range(7500):
        entries.append(_entry("alloc", base, 512 + i))
        entries.append(_entry("free_requested", base, 512 + i))
    path = tmp_path / "big.pickle"
    buffer = io.BytesIO()
    pickle.dump(snapshot, buffer, protocol=4)
    path.write_bytes(buffer.getvalue())
    read = read_snapshot(path)
    trace = trace_from_snapshot(read, device=0, path=str(path))
    assert len(trace.events) > 15_000
