"""Cost in proportion to the input: the page's block matching, line assembly in the trace
reader, and the stacks of big snapshots (issue 26, section 2).

Each test is of a size where the quadratic code it replaced is clearly slow (seconds to hours)
and asserts exact results or a count of work, never a time.
"""

from __future__ import annotations

import gzip
import io
import json
import random
from pathlib import Path
from typing import Any

import pytest

from accelrt.trace import Trace, TraceEvent, TraceFormatError, _columns, _jsonl
from accelrt.view import (
    View,
    _moments,
    _recorded,
    _render,
    clean_stack,
    picture_moments,
    render_html,
    view_of_trace,
)

MiB = 1 << 20
HEADER = json.dumps({"type": "header", "format": "alloc-trace-jsonl", "format_version": 1})
EVENT = '{"action":"alloc","addr":16,"size":8,"stream":0}'


# --- the page's block matching ----------------------------------------------------------------


def _same_size_view(n: int, size: int = 100) -> View:
    """The picture (no replay) of ``n`` allocations of ``size`` bytes at addresses 1 to n."""
    events = [TraceEvent("alloc", i + 1, size, 0) for i in range(n)]
    return view_of_trace(Trace({"name": "same size"}, events))


def _segment(blocks: list[tuple[int, int, str]]) -> dict[str, Any]:
    """One segment of blocks ``(address, requested bytes, state)``, 128 bytes each."""
    return {
        "address": blocks[0][0],
        "total_size": 128 * len(blocks),
        "stream": 0,
        "is_expandable": False,
        "blocks": [
            {"address": a, "size": 128, "requested_size": r, "state": s} for a, r, s in blocks
        ],
    }


def test_blocks_take_their_address_else_the_oldest_unused_allocation_of_their_size() -> None:
    view = _same_size_view(6)
    allocated = "active_allocated"
    segment = _segment(
        [
            (4, 100, allocated),  # allocation 3 by its address
            (900, 100, allocated),  # no such address: the oldest unused, 0
            (901, 100, allocated),  # 1
            (1, 100, allocated),  # allocation 0's address, but 0 is taken: 2
            (902, 100, "active_pending_free"),  # 4 (3 is taken)
            (5, 7, allocated),  # allocation 4's address, another size: none of 7 bytes
            (903, 0, "inactive"),  # free
            (904, 100, allocated),  # 5
            (905, 100, allocated),  # none left
        ]
    )
    moment = _moments._Moments(view).moment(6, [segment])
    [[_, _, _, _, blocks]] = moment["segments"]
    assert [owner for _, _, owner in blocks] == [3, 0, 1, 2, 4, -1, -1, 5, -1]
    assert [code for _, code, _ in blocks] == [0, 0, 0, 0, 1, 0, 2, 0, 0]


def test_many_blocks_of_one_size_are_matched_in_one_pass() -> None:
    # 50,000 live allocations of one size whose replayed addresses all differ from the
    # recorded ones (a paged KV cache): the scans for an unused one took 1.25 * 10**9 steps
    n = 50_000
    view = _same_size_view(n)
    blocks = [(10**9 + i, 100, "active_allocated") for i in range(n)]
    moment = _moments._Moments(view).moment(n, [_segment(blocks)])
    [[_, _, _, _, matched]] = moment["segments"]
    assert [owner for _, _, owner in matched] == list(range(n))


def _events_with_peak(peak: int) -> list[TraceEvent]:
    """``peak`` allocations live at once, all freed, ``peak`` more, and allocations of 0 bytes
    (no block) beside them."""
    first = [TraceEvent("alloc", i + 1, 64, 0) for i in range(peak)]
    freed = [TraceEvent("free", i + 1, 64, 0) for i in range(peak)]
    again = [TraceEvent("alloc", 10**6 + i, 64, 0) for i in range(peak)]
    empty = [TraceEvent("alloc", 2 * 10**6 + i, 0, 0) for i in range(peak)]
    return first + freed + again + empty


def test_a_trace_of_many_live_allocations_captures_fewer_moments(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    trace = Trace({"name": "many"}, _events_with_peak(1000))
    assert picture_moments(trace) == picture_moments(trace, 240)  # 240,000 blocks: all
    monkeypatch.setattr(_moments, "CAPTURED_BLOCKS", 50 * 1000)  # 1000 at once, not 2000
    assert picture_moments(trace) == picture_moments(trace, 50)
    monkeypatch.setattr(_moments, "CAPTURED_BLOCKS", 1000)  # never fewer than MIN_MOMENTS
    assert picture_moments(trace) == picture_moments(trace, 24)
    assert len(picture_moments(trace, 240)) > len(picture_moments(trace, 50)) > 24


# --- line assembly in the trace reader ----------------------------------------------------------


def _members(*parts: tuple[bytes, int]) -> bytes:
    """A gzip file of ``count`` copies of each ``text`` (one member a copy: made at once)."""
    return b"".join(gzip.compress(text, 1) * count for text, count in parts)


def _outcome(path: Path) -> str:
    """The message both readers refuse ``path`` with (they must agree)."""
    messages = []
    for read in (_jsonl.load_jsonl, _jsonl._load_jsonl_reference):
        with pytest.raises(TraceFormatError) as info:
            read(path)
        messages.append(str(info.value))
    assert messages[0] == messages[1]
    return messages[0]


def test_a_line_of_gibibytes_is_refused_after_the_limit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "one_line.jsonl.gz"
    path.write_bytes(_members((HEADER.encode() + b"\n\n", 1), (b"a" * MiB, 2048)))  # 2 GiB
    read: list[int] = []
    opened = _jsonl._open_binary

    class Counted:
        """The decompressed file, counting the bytes read from it."""

        def __init__(self, name: Any) -> None:
            self.raw = opened(name)

        def __enter__(self) -> Counted:
            return self

        def __exit__(self, *exc: object) -> None:
            self.raw.close()

        def read(self, size: int) -> bytes:
            data = self.raw.read(size)
            read.append(len(data))
            return data

    monkeypatch.setattr(_jsonl, "_open_binary", Counted)
    assert _outcome(path) == (
        f"{path}:3: line longer than 16777216 bytes (16.00 MiB), the most a trace line may have "
        "(an event is a line of about 100 bytes)"
    )
    assert sum(read) <= 2 * (_jsonl.MAX_LINE_BYTES + 2 * _jsonl._CHUNK_BYTES)  # two readers


@pytest.mark.parametrize("newline", ["\n", "\r\n", "\r"])
def test_the_line_limit_is_exact_and_numbered(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, newline: str
) -> None:
    monkeypatch.setattr(_jsonl, "_CHUNK_BYTES", 7)  # lines cut across many reads
    monkeypatch.setattr(_jsonl, "MAX_LINE_BYTES", 65)
    limit = "line longer than 65 bytes (65 bytes), the most a trace line may have"
    fits = '{"action":"alloc","addr":32,"size":8,"op":"' + "x" * 20 + '"}'
    assert len(fits) == 65
    header = '{"type":"header","format":"alloc-trace-jsonl","format_version":1}'
    assert len(header) == 65
    lines = [header, "", EVENT, "  ", fits, "", ""]
    good = tmp_path / "good.jsonl"
    good.write_text(newline.join(lines), newline="")
    trace = _jsonl.load_jsonl(good)
    assert trace.events.addr.tolist() == [16, 32]
    assert _jsonl._load_jsonl_reference(good).events.addr.tolist() == [16, 32]
    long = fits.replace("x" * 20, "x" * 21)  # 66 bytes
    for n, text in [
        (5, [*lines[:4], long, *lines[5:]]),
        (5, [*lines[:4], long]),  # the last line, without its newline
        (1, [header + " ", EVENT]),
        (1, ["{" + '"a":1,' * 60 + '"b":2}']),
    ]:
        bad = tmp_path / "bad.jsonl"
        bad.write_text(newline.join(text), newline="")
        assert _outcome(bad) == f"{bad}:{n}: {limit} (an event is a line of about 100 bytes)"
    # a bad line before the long one is the one named
    bad.write_text(newline.join([header, "", EVENT, EVENT, long]), newline="")
    assert _outcome(bad) == f"{bad}:4: alloc of address 0x10, which is already live"
    # a multi-byte character counts its bytes
    bad.write_text(newline.join([header, fits.replace("x" * 20, "é" * 10 + "x")]), newline="")
    assert _outcome(bad).startswith(f"{bad}:2: {limit}")


def _scanned(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The sizes of the texts the fast reader's scanner is given, from now on."""
    sizes: list[int] = []
    scan = _columns.scan_lines

    def counted(data: bytes, shapes: dict[bytes, Any]) -> Any:
        sizes.append(len(data))
        return scan(data, shapes)

    monkeypatch.setattr(_jsonl, "scan_lines", counted)
    return sizes


def test_blank_lines_are_counted_without_being_scanned(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    scanned = _scanned(monkeypatch)
    path = tmp_path / "blank.jsonl.gz"
    blank = b"\n" * MiB
    path.write_bytes(
        _members(
            (blank, 16),  # 16 Mi blank lines before the header
            (HEADER.encode() + b"\n", 1),
            (blank, 48),  # and 48 Mi after it
            (b" \t\x0c\r\n\x1c\n", 4096),  # blank lines of other spaces: 8192 lines
            (EVENT.encode() + b"\n", 1),
            (b"\r\n", 3),
            (b'{"action":"free","addr":99,"size":8}\n', 1),
        )
    )
    header_line = 16 * MiB + 1
    bad_line = header_line + 48 * MiB + 8192 + 1 + 3 + 1
    assert _outcome(path) == f"{path}:{bad_line}: free of address 0x63, which is not live"
    assert sum(scanned) < 2 * MiB  # the event lines' chunk, not 64 MiB of blank lines
    path.write_bytes(_members((blank, 3), (HEADER.encode(), 1)))
    assert _jsonl.load_jsonl(path).header["format"] == "alloc-trace-jsonl"
    path.write_bytes(_members((blank, 3), (b" \n", 1)))
    assert _outcome(path) == f"{path}: empty file, expected a header line"


_BLANKS = ["", " ", "\t", "\x1c", " \x0b\x0c ", "\u3000", " " * 20]


@pytest.mark.parametrize("seed", range(6))
def test_lines_are_numbered_as_written_whatever_blank_lines_and_reads(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, seed: int
) -> None:
    # lines written one by one, the expected numbers counted here: neither reader is the
    # other's reference for what the line assembly does
    rng = random.Random(seed)
    for case in range(40):
        monkeypatch.setattr(_jsonl, "_CHUNK_BYTES", rng.choice([1, 3, 16, 64, 1000, MiB]))
        lines, addrs = [HEADER], []
        for _ in range(rng.randrange(1, 300)):
            if rng.random() < 0.7:
                lines.append(rng.choice(_BLANKS) * rng.choice([1, 1, 2]))
            else:
                addrs.append(len(lines))
                lines.append(f'{{"action":"alloc","addr":{len(lines)},"size":8}}')
        bad = rng.choice([None, "[1]", '{"action":"free","addr":4096,"size":8}'])
        at = rng.randrange(1, len(lines) + 1)
        if bad is not None:
            lines.insert(at, bad)
        newline = rng.choice(["\n", "\r\n", "\r"])
        text = newline.join(lines) + rng.choice(["", newline])
        path = tmp_path / f"{seed}_{case}.jsonl"
        path.write_text(text, encoding="utf-8", newline="")
        if bad is None:
            for read in (_jsonl.load_jsonl, _jsonl._load_jsonl_reference):
                assert read(path).events.addr.tolist() == addrs
        elif bad == "[1]":
            assert _outcome(path).startswith(f"{path}:{at + 1}: expected a JSON object, got")
        else:
            assert _outcome(path) == f"{path}:{at + 1}: free of address 0x1000, which is not live"


def test_blank_lines_between_events_are_left_out_before_scanning(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    scanned = _scanned(monkeypatch)
    path = tmp_path / "between.jsonl.gz"
    event = b'{"action":"alloc","addr":%d,"size":8}\n'
    path.write_bytes(
        _members(
            (HEADER.encode() + b"\n", 1),
            *[(event % (k + 1) + b"\n" * 65_536, 1) for k in range(256)],  # 16 Mi blank lines
            (b'{"action":"free","addr":999,"size":8}\n', 1),
        )
    )
    assert _outcome(path) == f"{path}:{2 + 256 * 65_537}: free of address 0x3e7, which is not live"
    assert sum(scanned) < 256 * 64  # the events, not the blank lines between them


def test_a_cr_lf_cut_between_reads_ends_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    data = b"\r\n".join([HEADER.encode(), b"", b"\r", EVENT.encode(), b"[1]"])
    text = io.TextIOWrapper(io.BytesIO(data), encoding="utf-8").readlines()  # as Python has it
    assert text[2:] == ["\n", "\n", EVENT + "\n", "[1]"]  # "\r" and "\r\n" end two lines
    path = tmp_path / "crlf.jsonl"
    path.write_bytes(data)
    for chunk in range(1, len(data) + 1):
        monkeypatch.setattr(_jsonl, "_CHUNK_BYTES", chunk)
        assert _outcome(path) == f"{path}:6: expected a JSON object, got '[1]'"


def test_op_and_time_are_read_again_past_blank_lines(tmp_path: Path) -> None:
    path = tmp_path / "ops.jsonl.gz"
    rows = [
        '{"action":"alloc","addr":1,"size":10,"stream":0,"t":0,"op":"aten::mm"}',
        '{"action":"alloc","addr":2,"size":20,"stream":0,"t":3000,"op":"aten::add"}',
    ]
    path.write_bytes(
        _members(
            (b"\n" * MiB, 2),
            (HEADER.encode() + b"\r\n", 1),
            (b"\r\n" * MiB, 2),
            (rows[0].encode() + b"\n  \n", 1),
            (rows[1].encode(), 1),
        )
    )
    view = view_of_trace(_jsonl.load_jsonl(path))
    assert view.ops == ["aten::mm", "aten::add"] and view.op.tolist() == [0, 1]
    assert view.times is not None and view.times.tolist() == [0.0, 3.0]


# --- the stacks of big snapshots ----------------------------------------------------------------

_NOISE = [{"name": f"c10::frame_{j}", "filename": "??", "line": 0} for j in range(16)]


def _stack(i: int, noise: list[dict[str, Any]] = _NOISE) -> list[dict[str, Any]]:
    """A stack of its own innermost Python frame and the same 16 C++ frame dicts as every
    other (the frames a quarter, half and three quarters of the way are shared)."""
    return [{"name": f"fn_{i}", "filename": "/work/model.py", "line": i + 1}, *noise]


def test_distinct_stacks_that_share_frames_are_found_in_one_pass() -> None:
    # 20,000 distinct stacks of one length, alike a quarter, half and three quarters of the
    # way: each was compared with every one before it (2 * 10**8 list comparisons)
    n = 20_000
    stacks = _recorded._Stacks()
    recorded = [_stack(i) for i in range(n)]  # alive while interned, as a snapshot's are
    assert [stacks.intern(frames) for frames in recorded] == list(range(n))
    assert len(stacks.stacks) == n
    copies = [{**f} for f in _NOISE]  # the same frames in dicts of their own
    again = [[*recorded[7]], _stack(n - 1, copies), [*recorded[5], "junk"]]
    assert [stacks.intern(frames) for frames in again] == [7, n - 1, 5]  # "junk": no frame
    unhashable = [{"name": ["a list"]}]
    assert stacks.intern(unhashable) == n  # a stack of its own
    assert stacks.intern([]) == -1 and stacks.intern(None) == -1
    first, other = stacks.stacks[0], stacks.stacks[1]
    assert first.python == ("fn_0  /work/model.py:1",) and first.hidden == 0
    assert first.native == tuple(f["name"] for f in _NOISE)
    assert all(a is b for a, b in zip(first.native, other.native, strict=True))  # held once


def test_a_stack_put_together_from_its_frames_is_what_clean_stack_makes(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    kinds = [
        {"name": "forward", "filename": "/work/model.py", "line": 42},  # Python
        {"name": "at::native::add", "filename": "??", "line": 0},  # C++, kept
        {"name": "c10::cuda::CUDACachingAllocator::malloc", "filename": "", "line": 0},  # noise
        {"name": "f", "filename": "Register.cpp", "line": 0},  # C++, kept (not Register*.cpp)
        {"name": "g", "filename": "RegisterCUDA.cpp", "line": 0},  # noise by its file
        {"name": None, "filename": "x.py", "line": 3},  # a name that is not text
        "not a frame",
        7,
    ]
    calls: list[int] = []
    clean = clean_stack

    def counted(frames: Any) -> Any:
        calls.append(len(frames))
        return clean(frames)

    monkeypatch.setattr(_recorded, "clean_stack", counted)
    rng = random.Random(3)
    recorded = [[rng.choice(kinds) for _ in range(rng.randrange(1, 12))] for _ in range(500)]
    stacks = _recorded._Stacks()
    for frames in recorded:
        assert stacks.stacks[stacks.intern(frames)] == clean(frames)
    assert calls == [1] * len(kinds)  # each frame cleaned once, alone
    monkeypatch.setattr(_recorded, "_CLEANED_FRAMES", 3)  # forgotten, and cleaned again
    forgetful = _recorded._Stacks()
    for frames in recorded[:50]:
        assert forgetful.stacks[forgetful.intern(frames)] == clean(frames)
    assert stacks.add("not a list") == len(stacks.stacks) - 1
    assert stacks.stacks[-1] == clean("not a list")


def test_the_page_sends_the_stacks_a_few_at_a_time_as_one_json(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    view = _same_size_view(3)
    stacks = _recorded._Stacks()
    view.stack[:] = [stacks.intern(_stack(i)) for i in range(3)]
    view.stacks = stacks.stacks
    whole = render_html(view)
    for at_once in (1, 2, 3, 4):
        monkeypatch.setattr(_render, "_STACKS_AT_ONCE", at_once)
        assert render_html(view) == whole
    view.stacks, view.stack[:] = [], -1
    rest: dict[str, Any] = {"ops": [], "groups": []}
    assert "".join(_render._meta_json([], rest)) == '{"stacks":[],"ops":[],"groups":[]}'
    text = "".join(_render._meta_json(stacks.stacks, rest))
    expected = {"stacks": [[list(s.python), list(s.native), s.hidden] for s in stacks.stacks]}
    assert text == json.dumps({**expected, **rest}, separators=(",", ":"))
