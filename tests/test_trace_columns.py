"""The columnar trace path: the fast reader and replay loop against the reference ones.

The reference reader (``_load_jsonl_reference``, a ``json.loads`` and a ``TraceEvent`` per line)
and the reference loop (``replay._run_events_reference``) are the spec: on every shipped trace,
on malformed files and on generated lines the fast path must give the same events, figures,
reports and error messages.
"""

from __future__ import annotations

import gzip
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from accelrt import replay as replay_module
from accelrt.replay import replay
from accelrt.trace import Trace, TraceEvent, TraceEvents, TraceFormatError, _jsonl, load, write

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = sorted((ROOT / "examples" / "traces").glob("*.jsonl.gz"))
SHARED = sorted((ROOT.parent / "shared" / "traces" / "cpu").glob("*.jsonl.gz"))
# the committed example traces on every clone, and the real CPU traces where they lie beside
# the repository (slow): nothing here skips on a fresh clone
TRACES = [*EXAMPLES, *(pytest.param(p, id=p.name, marks=pytest.mark.slow) for p in SHARED)]
HEADER = {"type": "header", "format": "alloc-trace-jsonl", "format_version": 1, "name": "t"}


def _outcome(read: Callable[..., Trace], path: Path, include_host: bool) -> Any:
    """What reading gives: the trace's figures and events, or the error's type and message."""
    try:
        trace = read(path, include_host=include_host)
    except (TraceFormatError, FileNotFoundError) as exc:
        return type(exc), str(exc)
    events = trace.events
    assert isinstance(events, TraceEvents)
    return (
        trace.header,
        [events.op.tolist(), events.addr.tolist(), events.size.tolist(), events.stream.tolist()],
        trace.skipped_host_events,
        trace.peak_live_bytes,
        trace.live_at_end_bytes,
        trace.include_host,
    )


def _same_as_reference(path: Path) -> None:
    for include_host in (False, True):
        fast = _outcome(_jsonl.load_jsonl, path, include_host)
        assert fast == _outcome(_jsonl._load_jsonl_reference, path, include_host)


def _write_raw(path: Path, text: str | bytes, *, gz: bool = True) -> Path:
    data = text.encode() if isinstance(text, str) else text
    path.write_bytes(gzip.compress(data) if gz else data)
    return path


@pytest.mark.parametrize("path", TRACES, ids=lambda p: p.name)
def test_traces_read_as_the_reference_reads_them(path: Path) -> None:
    _same_as_reference(path)


EV = '{"action":"alloc","addr":16,"size":8,"stream":0}'
FREE = '{"action":"free","addr":16,"size":8,"stream":0}'
H = json.dumps(HEADER)

MALFORMED_AND_ODD = {
    "good": [H, EV, FREE],
    "blank lines and unicode spaces": ["", H, "  ", EV, "\u2028\x1c", FREE, "\t"],
    "spaces in lines": [
        H,
        '{ "action" : "alloc", "addr" : 16 , "size": 8 }',
        '  {"action": "free", "addr": 16, "size": 8, "stream": -3}  ',
    ],
    "escaped key": [H, '{"action":"alloc","\\u0061ddr":16,"size":8}', FREE],
    "escaped value": [H, '{"action":"alloc","addr":16,"size":8,"op":"a\\"b"}', FREE],
    "duplicate keys": [H, '{"action":"alloc","addr":99,"size":8,"addr":16}', FREE],
    "duplicate action": [H, '{"action":"free","addr":16,"size":8,"action":"alloc"}', FREE],
    "leading zero": [H, '{"action":"alloc","addr":016,"size":8}'],
    "minus zero stream": [H, '{"action":"alloc","addr":16,"size":8,"stream":-0}', FREE],
    "19 digits": [H, '{"action":"alloc","addr":9223372036854775807,"size":8}'],
    "too big": [H, '{"action":"alloc","addr":9223372036854775808,"size":8}'],
    "5000 digits": [H, '{"action":"alloc","addr":' + "9" * 5000 + ',"size":8}'],
    "float": [H, '{"action":"alloc","addr":16,"size":8.0}'],
    "exponent": [H, '{"action":"alloc","addr":16,"size":1e3}'],
    "NaN": [H, '{"action":"alloc","addr":16,"size":NaN}'],
    "bool stream": [H, '{"action":"alloc","addr":16,"size":8,"stream":true}'],
    "null stream": [H, '{"action":"alloc","addr":16,"size":8,"stream":null}'],
    "negative size": [H, '{"action":"alloc","addr":16,"size":-8}'],
    "missing size": [H, '{"action":"alloc","addr":16}'],
    "string addr": [H, '{"action":"alloc","addr":"16","size":8}'],
    "nested value": [H, '{"action":"alloc","addr":16,"size":8,"x":{"addr":1}}', FREE],
    "list value": [H, '{"action":"alloc","addr":16,"size":8,"x":[1,2]}', FREE],
    "host float": [H, '{"action":"alloc","addr":16,"size":8,"host":0.05}', FREE],
    "host zero float": [H, '{"action":"alloc","addr":16,"size":8,"host":0.0}', FREE],
    "host string": [H, '{"action":"alloc","addr":16,"size":8,"host":"0"}', FREE],
    "host false": [H, '{"action":"alloc","addr":16,"size":8,"host":false}', FREE],
    "host 10": [H, '{"action":"alloc","addr":16,"size":8,"host":10}', FREE],
    "host free of device alloc": [H, EV, '{"action":"free","addr":16,"size":1,"host":1}'],
    "empty_cache junk": [H, '{"action":"empty_cache","addr":"x","size":-1,"k":[1]}'],
    "unknown action": [H, '{"action":"resize","addr":16,"size":8}'],
    "not an object": [H, EV, "[1, 2]"],
    "bad JSON": [H, EV, "{not json"],
    "deep JSON": [H, "[" * 100_000],
    "control char": [H, '{"action":"alloc","addr":16,"size":8,"op":"a\x01b"}'],
    "double alloc": [H, EV, EV],
    "free not live": [H, FREE],
    "live error before JSON error": [H, FREE, "{not json"],
    "JSON error before live error": [H, "{not json", FREE],
    "header only": [H],
    "no header": ["", "  "],
    "bad header": [EV],
    "BOM": ["\ufeff" + H, EV],
    "digits in keys and strings": [
        H,
        '{"action":"alloc","addr":16,"size":8,"k12":"a0012b","k13":7}',
        '{"action":"free","addr":16,"size":8,"k1":1}',
    ],
    "first digit line": [H, "12", EV],
}


@pytest.mark.parametrize("name", sorted(MALFORMED_AND_ODD))
@pytest.mark.parametrize("newline", ["\n", "\r\n", "\r"])
def test_odd_and_malformed_lines_read_as_the_reference_reads_them(
    tmp_path: Path, name: str, newline: str
) -> None:
    lines = MALFORMED_AND_ODD[name]
    _same_as_reference(_write_raw(tmp_path / "a.jsonl.gz", newline.join(lines) + newline))
    _same_as_reference(_write_raw(tmp_path / "b.jsonl", newline.join(lines), gz=False))


def test_read_errors_are_the_reference_ones(tmp_path: Path) -> None:
    good = "\n".join([H, EV, FREE] * 1) + "\n"
    bad_utf8 = _write_raw(tmp_path / "u.jsonl.gz", good.encode() + b'{"op":"\xff"}\n')
    _same_as_reference(bad_utf8)
    early_error = (H + "\n{oops\n" + EV + "\n").encode() + b"\xff\n"
    _same_as_reference(_write_raw(tmp_path / "e.jsonl.gz", early_error))
    whole = _write_raw(tmp_path / "w.jsonl.gz", good * 2000)
    cut = tmp_path / "cut.jsonl.gz"
    cut.write_bytes(whole.read_bytes()[:-12])
    _same_as_reference(cut)
    _same_as_reference(tmp_path / "missing.jsonl.gz")
    _same_as_reference(tmp_path)


def _trace_lines(n: int, seed: int) -> list[str]:
    """A consistent trace of ``n`` events over a few addresses, streams and host tags."""
    rng = np.random.default_rng(seed)
    live: dict[int, int] = {}
    lines = [H]
    for _ in range(n):
        addr = int(rng.integers(1, 64)) * 4096
        event: dict[str, Any]
        if addr in live:
            event = {"action": "free", "addr": addr, "size": live.pop(addr), "t": 5}
        else:
            live[addr] = int(rng.integers(0, 1 << 40))
            event = {"action": "alloc", "addr": addr, "size": live[addr], "op": "aten::x"}
        event["stream"] = int(rng.integers(-2, 3))
        if rng.random() < 0.2:
            event["host"] = 1
        if rng.random() < 0.01:
            event = {"action": "empty_cache"}
        lines.append(json.dumps(event, separators=(",", ":")))
        if rng.random() < 0.01:
            lines.append("")
    return lines


def test_lines_across_many_chunks(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_jsonl, "_CHUNK_BYTES", 1000)  # lines cut across reads, many chunks
    lines = _trace_lines(3000, seed=1)
    _same_as_reference(_write_raw(tmp_path / "t.jsonl.gz", "\n".join(lines) + "\n"))
    broken = [*lines[:2500], FREE.replace("16", "7"), *lines[2500:]]
    _same_as_reference(_write_raw(tmp_path / "b.jsonl.gz", "\n".join(broken)))
    double = [*lines[:1200], lines[1] if "alloc" in lines[1] else EV, *lines[1200:]]
    _same_as_reference(_write_raw(tmp_path / "d.jsonl.gz", "\n".join(double)))


_KEYS = st.sampled_from(["action", "addr", "size", "stream", "host", "t", "op", "k1"])
_VALUES = st.one_of(
    st.sampled_from(["alloc", "free", "empty_cache", "", "0", "x\\y"]),
    st.integers(min_value=-(1 << 64), max_value=1 << 64),
    st.sampled_from([0, 1, 16, 4096, -1, True, False, None, 0.5, 0.0, [], {}]),
)
_LINE = st.one_of(
    st.dictionaries(_KEYS, _VALUES, max_size=6).map(json.dumps),
    st.fixed_dictionaries(
        {
            "action": st.sampled_from(["alloc", "free"]),
            "addr": st.sampled_from([16, 32, 48]),
            "size": st.integers(0, 1 << 63),
        },
        optional={"stream": st.integers(-3, 3), "host": st.sampled_from([0, 1, "", 0.05])},
    ).map(lambda d: json.dumps(d, separators=(",", ":"))),
    st.sampled_from(["", " ", "{", "[]", "0", '{"action":"alloc","addr":01,"size":1}']),
)


@settings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(lines=st.lists(_LINE, max_size=12))
def test_generated_lines_read_as_the_reference_reads_them(tmp_path: Path, lines: list[str]) -> None:
    _same_as_reference(_write_raw(tmp_path / "g.jsonl.gz", "\n".join([H, *lines]) + "\n"))


# --- the replay loop --------------------------------------------------------------------------


def _report(trace: Trace, loop: Any, monkeypatch: pytest.MonkeyPatch, **options: Any) -> Any:
    calls: list[tuple[int, int]] = []
    with monkeypatch.context() as patch:
        patch.setattr(replay_module, "_run_events", loop)
        report = replay(trace, progress=lambda done, total: calls.append((done, total)), **options)
    data = report.to_dict()
    del data["wall_seconds"], data["events_per_second"]
    return data, report.memory_stats, report.segment_maps, calls


def _same_replay(trace: Trace, monkeypatch: pytest.MonkeyPatch, **options: Any) -> None:
    n = len(trace.events)
    options.setdefault("capture_at", [-1, 0, 1, n // 3, n // 2, n - 1, n, n + 7, -5])
    fast = _report(trace, replay_module._run_events, monkeypatch, **options)
    assert fast == _report(trace, replay_module._run_events_reference, monkeypatch, **options)


@pytest.mark.parametrize("config", ["defaults", "expandable_segments:True", "policy:accelrt"])
@pytest.mark.parametrize("path", TRACES, ids=lambda p: p.name)
def test_replay_of_traces_is_the_reference_one(
    path: Path, config: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    _same_replay(load(path), monkeypatch, config=config)


def test_replay_with_ooms_skips_and_streams_is_the_reference_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    mib = 1 << 20
    events = [
        TraceEvent("alloc", 1, 0, 0),  # zero bytes: skipped, and so is a capture after it
        TraceEvent("alloc", 2, 30 * mib, 5),
        TraceEvent("alloc", 3, 1 << 61, 7),  # beyond any device: an OOM without asking
        TraceEvent("alloc", 4, 30 * mib, -2),
        TraceEvent("alloc", 5, 30 * mib, 5),  # 64 MiB device: out of memory
        TraceEvent("free", 2, 30 * mib, 5),
        TraceEvent("free", 5, 30 * mib, 5),  # its alloc failed: nothing to free
        TraceEvent("empty_cache", 0, 0, 0),
        TraceEvent("free", 1, 0, 0),
        TraceEvent("alloc", 6, 10 * mib, 9),
    ] * 3
    trace = Trace(header={"name": "x"}, events=events)
    assert isinstance(trace.events, TraceEvents)
    for config in (None, "expandable_segments:True"):
        _same_replay(trace, monkeypatch, capacity=64 * mib, config=config, capture_at=range(-1, 32))
    path = tmp_path / "w.jsonl.gz"
    write(path, [e for e in events[:10] if e.addr != 5])
    _same_replay(load(path), monkeypatch, capacity=64 * mib)


def test_replay_progress_is_the_reference_one(monkeypatch: pytest.MonkeyPatch) -> None:
    events = [TraceEvent("alloc" if i % 2 == 0 else "free", i // 2, 512, 0) for i in range(9001)]
    _same_replay(Trace(header={}, events=events), monkeypatch)


# --- TraceEvents ------------------------------------------------------------------------------


def test_trace_events_is_a_sequence_of_trace_events() -> None:
    rows = [
        TraceEvent("alloc", 16, 8, -(1 << 63)),
        TraceEvent("empty_cache", 0, 0, 0),
        TraceEvent("free", 16, 8, 3),
    ]
    events = TraceEvents.from_events(rows)
    assert len(events) == 3 and list(events) == rows and events == rows and rows == events
    assert events[0] == rows[0] and events[-1] == rows[-1] and events[1:] == rows[1:]
    assert events != rows[:2] and events != [*rows[:2], TraceEvent("free", 16, 8, 4)]
    assert events == TraceEvents(events.op, events.addr, events.size, events.stream)
    assert events.op.dtype == np.int8 and events.addr.dtype == np.int64
    assert events.nbytes == 3 * 25 and repr(events) == "TraceEvents(3 events, 75 bytes)"
    assert not events.addr.flags.writeable
    with pytest.raises(IndexError):
        events[3]
    with pytest.raises(ValueError, match="unknown action 'resize'"):
        TraceEvents.from_events([("resize", 0, 0, 0)])
    with pytest.raises(ValueError, match="differ in length"):
        TraceEvents([0], [1, 2], [3], [4])
    with pytest.raises(ValueError, match="op codes"):
        TraceEvents([5], [1], [3], [4])
    with pytest.raises(TypeError):
        hash(events)
    assert Trace(header={}).events == []
