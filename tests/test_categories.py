"""Memory by category and phase (view/_categories.py): inferred kinds, user rules, folded
stacks."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from accelrt.trace import Phase, load
from accelrt.trace._phases import header_phases
from accelrt.view import (
    CategoryRule,
    add_categories,
    category_bytes,
    folded_stacks,
    view_of_trace,
)

KiB = 1024
BUILT_IN = ("parameters", "gradients", "optimizer state", "activations", "temporary", "unknown")
"""The inferred categories, in the order tables show them (docs/viewer.md)."""


def _write(path: Path, events: list[tuple[str, int, int, str | None]], phases: list) -> Path:
    header = {
        "type": "header",
        "format": "alloc-trace-jsonl",
        "format_version": 1,
        "name": "step",
        "phases": phases,
    }
    lines = [json.dumps(header)]
    for action, addr, size, op in events:
        event = {"action": action, "addr": addr, "size": size, "stream": 0}
        if op is not None:
            event["op"] = op
        lines.append(json.dumps(event))
    path.write_text("\n".join(lines) + "\n")
    return path


# One training step: a parameter, then forward (an activation kept for backward and a
# temporary), backward (a gradient kept, the activation freed), the optimizer (its state).
STEP = [
    ("alloc", 0x1000, 100 * KiB, "aten::empty"),  # 0 init: parameter
    ("alloc", 0x100000, 30 * KiB, "aten::mm"),  # 1 fwd: activation
    ("alloc", 0x200000, 7 * KiB, "aten::add"),  # 2 fwd: temporary
    ("free", 0x200000, 7 * KiB, "aten::add"),  # 3 fwd
    ("alloc", 0x300000, 100 * KiB, "aten::mm"),  # 4 bwd: gradient
    ("free", 0x100000, 30 * KiB, "aten::mm"),  # 5 bwd
    ("alloc", 0x400000, 200 * KiB, "aten::zeros_like"),  # 6 opt: optimizer state
]
PHASES = [
    {"phase": "init", "first": 0, "end": 1},
    {"phase": "step0/fwd", "first": 1, "end": 4},
    {"phase": "step0/bwd", "first": 4, "end": 6},
    {"phase": "step0/opt", "first": 6, "end": 7},
]


def _view(tmp_path: Path, events=STEP, phases=PHASES):
    trace = load(_write(tmp_path / "step.jsonl", events, phases))
    return view_of_trace(trace), trace.phases


def test_phases_decide_each_kind_and_lifetimes_split_temporaries(tmp_path: Path) -> None:
    view, phases = _view(tmp_path)
    assert view.phases == phases and phases  # add_categories reads the trace's phases
    categories = add_categories(view)
    assert categories.names == BUILT_IN
    shown = [categories.names[i] for i in categories.of.tolist()]
    assert shown == ["parameters", "activations", "temporary", "gradients", "optimizer state"]
    # after event 2 (state 3): the parameter, the activation and the temporary are live
    assert category_bytes(view, categories, 3) == {
        "parameters": (100 * KiB, 1),
        "gradients": (0, 0),
        "optimizer state": (0, 0),
        "activations": (30 * KiB, 1),
        "temporary": (7 * KiB, 1),
        "unknown": (0, 0),
    }
    at_end = category_bytes(view, categories, view.events)
    assert at_end["gradients"] == (100 * KiB, 1)
    assert at_end["optimizer state"] == (200 * KiB, 1)
    assert at_end["activations"] == (0, 0)


def test_user_rules_come_first_in_their_order(tmp_path: Path) -> None:
    view, phases = _view(tmp_path)
    rules = [CategoryRule.parse("matmuls=aten::mm"), CategoryRule.parse("temporary=add")]
    assert view.phases == phases and phases
    categories = add_categories(view, rules)
    # rule names first, a rule named like a built-in category is that category
    assert categories.names == ("matmuls", "temporary", *(n for n in BUILT_IN if n != "temporary"))
    shown = [categories.names[i] for i in categories.of.tolist()]
    assert shown == ["parameters", "matmuls", "temporary", "matmuls", "optimizer state"]


def test_without_phases_ops_give_the_sites(tmp_path: Path) -> None:
    events = [
        ("alloc", 0x1000, 10 * KiB, "aten::mm"),  # before any known site: unknown
        ("alloc", 0x2000, 20 * KiB, "autograd::engine::evaluate_function: MmBackward0"),
        ("alloc", 0x3000, 5 * KiB, "aten::convolution_backward"),
        ("free", 0x3000, 5 * KiB, None),  # freed in the same backward run: temporary
        ("alloc", 0x4000, 40 * KiB, "Optimizer.step#AdamW.step"),
        ("free", 0x1000, 10 * KiB, None),
    ]
    view, phases = _view(tmp_path, events, [])
    assert phases == () and view.phases == ()
    categories = add_categories(view)
    shown = [categories.names[i] for i in categories.of.tolist()]
    assert shown == ["unknown", "gradients", "temporary", "optimizer state"]


def test_nothing_known_is_unknown(tmp_path: Path) -> None:
    events = [("alloc", 0x1000, 10 * KiB, None), ("alloc", 0x2000, 1, "aten::mm")]
    events.append(("free", 0x1000, 10 * KiB, None))
    view, _ = _view(tmp_path, events, [])
    assert view.phases == ()
    categories = add_categories(view)
    assert [categories.names[i] for i in categories.of.tolist()] == ["unknown", "unknown"]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("kv", "category rule 'kv' is not NAME=REGEX"),
        ("=cache", "category rule '=cache' is not NAME=REGEX"),
        ("kv=", "category rule 'kv=' is not NAME=REGEX"),
        ("kv=(cache", "category rule 'kv=(cache': '(cache' is not a regular expression"),
    ],
)
def test_bad_rules_name_the_value(text: str, message: str) -> None:
    with pytest.raises(ValueError, match="^" + message.replace("(", r"\(")):
        CategoryRule.parse(text)


def test_header_phases_skip_damaged_entries_and_clip() -> None:
    header = {
        "phases": [
            {"phase": "b", "first": 5, "end": 50},
            {"phase": "a", "first": -3, "end": 5},
            {"phase": 3, "first": 0, "end": 1},
            {"phase": "empty", "first": 4, "end": 4},
            "not a phase",
            {"phase": "bool", "first": True, "end": 2},
        ]
    }
    assert header_phases(header, None, 10) == (Phase("a", 0, 5), Phase("b", 5, 10))
    assert header_phases({"phases": "x"}, None, 10) == ()
    assert header_phases(None, None, 10) == ()


def test_phases_follow_the_events_the_trace_keeps(tmp_path: Path) -> None:
    path = _write(tmp_path / "host.jsonl", STEP, PHASES)
    lines = path.read_text().splitlines()
    host = json.loads(lines[3])  # event 2, and its free (event 3): host-only
    host["host"] = 1
    free = json.loads(lines[4])
    free["host"] = 1
    lines[3], lines[4] = json.dumps(host), json.dumps(free)
    path.write_text("\n".join(lines) + "\n")
    assert load(path, include_host=True).phases == tuple(
        Phase(p["phase"], p["first"], p["end"]) for p in PHASES
    )
    # two fwd events gone: fwd keeps event 1 only, and the later phases move down by two
    assert load(path).phases == (
        Phase("init", 0, 1),
        Phase("step0/fwd", 1, 2),
        Phase("step0/bwd", 2, 4),
        Phase("step0/opt", 4, 5),
    )


def test_folded_stacks_sum_live_bytes_per_stack(tmp_path: Path) -> None:
    events = [
        ("alloc", 0x1000, 10, "aten::mm"),
        ("alloc", 0x2000, 20, "aten::mm"),
        ("alloc", 0x3000, 5, "odd;op"),
        ("alloc", 0x4000, 7, None),
        ("free", 0x1000, 10, None),
    ]
    view, _ = _view(tmp_path, events, [])
    assert folded_stacks(view, view.events) == (
        "(no stack);aten::mm 20\n(no stack) 7\n(no stack);odd,op 5\n"
    )
    assert folded_stacks(view, 0) == ""
    with pytest.raises(ValueError, match=r"state 6 is out of range \[0, 5\]"):
        folded_stacks(view, 6)


def _cli(*argv: str) -> tuple[int, str, str]:
    import contextlib
    import io

    from accelrt.cli import main

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main(list(argv))
        except SystemExit as exc:  # argparse's errors
            code = int(exc.code or 0)
    return code, out.getvalue(), err.getvalue()


def test_snapshot_stacks_writes_folded_stacks_at_the_peak_or_an_event(tmp_path: Path) -> None:
    events = [
        ("alloc", 0x1000, 10, "aten::mm"),
        ("alloc", 0x2000, 20, "aten::mm"),
        ("free", 0x1000, 10, None),
        ("alloc", 0x3000, 5, "aten::add"),
    ]
    path = _write(tmp_path / "t.jsonl", events, [])
    assert _cli("snapshot", "stacks", str(path)) == (
        0,
        "(no stack);aten::mm 30\n",  # the peak: after event 1
        "",
    )
    out = tmp_path / "live.folded"
    assert _cli("snapshot", "stacks", str(path), "--at", "3", "-o", str(out))[0] == 0
    assert out.read_text() == "(no stack);aten::mm 20\n(no stack);aten::add 5\n"
    code, _, err = _cli("snapshot", "stacks", str(path), "--at", "4")
    assert code == 2 and f"--at 4: {path} has 4 events (0 to 3)" in err
    code, _, err = _cli("snapshot", "stacks", str(path), "--at", "-1")
    assert code == 2 and "--at takes 'peak' or an event index" in err


def test_diff_and_summary_show_kinds_and_the_users_rules(tmp_path: Path) -> None:
    path = _write(tmp_path / "step.jsonl", STEP, PHASES)
    code, out, err = _cli(
        "snapshot", "diff", str(path), "--config", "defaults", "--config",
        "expandable_segments:True", "--category", "big matmul=aten::mm",
    )  # fmt: skip
    assert code == 0, err
    kinds = out.split("by kind (inferred; docs/viewer.md):\n")[1].splitlines()
    assert kinds[1:] == [
        "  100.00 KiB   100.00 KiB      +0 bytes  big matmul",
        "  100.00 KiB   100.00 KiB      +0 bytes  parameters",
        "  200.00 KiB   200.00 KiB      +0 bytes  optimizer state",
    ]
    snapshot = Path(__file__).parent / "data" / "streams_midrun.pickle"
    code, out, err = _cli("snapshot", "summary", str(snapshot), "--no-progress")
    assert code == 0, err
    assert "by kind (inferred; docs/viewer.md)" in out
    code, _, err = _cli("snapshot", "summary", str(snapshot), "--category", "x=(")
    assert code == 2 and "category rule 'x=(': '(' is not a regular expression" in err
