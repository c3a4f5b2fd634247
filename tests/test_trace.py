"""Trace files: round trips, the device view, and a clear error for every malformed line."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from accelrt.trace import (
    OP_ALLOC,
    OP_EMPTY_CACHE,
    OP_FREE,
    TraceEvent,
    TraceEvents,
    TraceFormatError,
    load,
    write,
)

HEADER = {"type": "header", "format": "alloc-trace-jsonl", "format_version": 1, "name": "t"}


def _write_lines(path: Path, lines: list[object]) -> Path:
    with gzip.open(path, "wt") as out:
        for line in lines:
            out.write((line if isinstance(line, str) else json.dumps(line)) + "\n")
    return path


def test_write_and_load_round_trip(tmp_path: Path) -> None:
    events = [
        TraceEvent("alloc", 4096, 100, 0),
        TraceEvent("alloc", 8192, 300, 1),
        TraceEvent("free", 4096, 100, 0),
        TraceEvent("empty_cache", 0, 0, 0),
        TraceEvent("free", 8192, 300, 1),
    ]
    header = write(tmp_path / "t.jsonl.gz", events, {"name": "mini"})
    assert header["stats"]["peak_live_bytes"] == 400
    trace = load(tmp_path / "t.jsonl.gz")
    assert trace.events == events
    assert trace.name == "mini"
    assert trace.peak_live_bytes == 400 and trace.live_at_end_bytes == 0


def test_events_built_from_the_public_op_codes() -> None:
    events = TraceEvents(
        [OP_ALLOC, OP_FREE, OP_EMPTY_CACHE], [4096, 4096, 0], [512, 512, 0], [7, 7, 0]
    )
    assert list(events) == [
        TraceEvent("alloc", 4096, 512, 7),
        TraceEvent("free", 4096, 512, 7),
        TraceEvent("empty_cache", 0, 0, 0),
    ]
    with pytest.raises(ValueError, match=r"op codes must be in \[0, 3\), got \[3\]"):
        TraceEvents([OP_EMPTY_CACHE + 1], [0], [0], [0])


def test_host_events_skipped_by_default(tmp_path: Path) -> None:
    path = _write_lines(
        tmp_path / "h.jsonl.gz",
        [
            HEADER,
            {"action": "alloc", "addr": 1, "size": 10, "stream": 0, "t": 0},
            {"action": "alloc", "addr": 2, "size": 5, "stream": 0, "t": 1, "host": 1},
            {"action": "free", "addr": 2, "size": 5, "stream": 0, "t": 2, "host": 1},
        ],
    )
    device_view = load(path)
    assert [e.addr for e in device_view.events] == [1]
    assert device_view.skipped_host_events == 2 and device_view.peak_live_bytes == 10
    everything = load(path, include_host=True)
    assert len(everything.events) == 3 and everything.peak_live_bytes == 15


def test_plain_jsonl_is_read(tmp_path: Path) -> None:
    path = tmp_path / "plain.jsonl"
    path.write_text(
        json.dumps(HEADER)
        + "\n"
        + json.dumps({"action": "alloc", "addr": 1, "size": 3, "stream": 0, "t": 0})
        + "\n"
    )
    assert load(path).events == [TraceEvent("alloc", 1, 3, 0)]


ALLOC = {"action": "alloc", "addr": 16, "size": 8, "stream": 0, "t": 0}


@pytest.mark.parametrize(
    ("lines", "message"),
    [
        ([], "empty file, expected a header line"),
        (["{not json"], ":1: not valid JSON"),
        (["[1, 2]"], ":1: expected a JSON object"),
        ([{"type": "header", "format": "other"}], ':1: expected a header with "type"'),
        ([{**HEADER, "format_version": 2}], ":1: unsupported format_version 2"),
        ([HEADER, {"action": "resize"}], ":2: unknown action 'resize'"),
        ([HEADER, {**ALLOC, "size": -1}], ":2: field 'size' must be >= 0, got -1"),
        ([HEADER, {**ALLOC, "addr": "16"}], ":2: field 'addr' must be an integer, got '16'"),
        ([HEADER, ALLOC, ALLOC], ":3: alloc of address 0x10, which is already live"),
        ([HEADER, {**ALLOC, "action": "free"}], ":2: free of address 0x10, which is not live"),
    ],
)
def test_malformed_traces_name_the_line(tmp_path: Path, lines: list[object], message: str) -> None:
    path = _write_lines(tmp_path / "bad.jsonl.gz", lines)
    with pytest.raises(TraceFormatError) as info:
        load(path)
    assert message in str(info.value)
    assert str(info.value).startswith(str(path))


def test_truncated_gzip_is_a_format_error(tmp_path: Path) -> None:
    good = _write_lines(tmp_path / "g.jsonl.gz", [HEADER, ALLOC])
    cut = tmp_path / "cut.jsonl.gz"
    cut.write_bytes(good.read_bytes()[:-12])
    with pytest.raises(TraceFormatError, match="cannot read trace"):
        load(cut)


def test_record_torch(tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    from accelrt.trace import record_torch

    layer = torch.nn.Linear(64, 32)

    def step() -> None:
        layer(torch.randn(16, 64)).sum().backward()

    trace = record_torch(step, tmp_path / "rec.jsonl.gz", name="linear")
    allocs = [e for e in trace.events if e.action == "alloc"]
    assert trace.name == "linear"
    assert any(e.size == 16 * 32 * 4 for e in allocs)  # the output activation
    assert trace.peak_live_bytes >= 16 * 64 * 4


def test_write_refuses_inconsistent_events(tmp_path: Path) -> None:
    with pytest.raises(
        TraceFormatError, match="event on line 3: free of address 0x20, which is not live"
    ):
        write(
            tmp_path / "w.jsonl.gz", [TraceEvent("alloc", 16, 8, 0), TraceEvent("free", 32, 8, 0)]
        )
    with pytest.raises(
        TraceFormatError, match="event on line 3: alloc of address 0x10, which is already"
    ):
        write(
            tmp_path / "w.jsonl.gz", [TraceEvent("alloc", 16, 8, 0), TraceEvent("alloc", 16, 8, 0)]
        )
