"""What the ``accelrt`` command prints: input errors as one line (status 2), bugs as bug reports
(traceback, status 70), input-derived text escaped for the terminal, long fields bounded."""

from __future__ import annotations

import gzip
import html
import json
import pickle
import random
import re
from pathlib import Path
from typing import Any

import pytest

import accelrt as acc
import test_snapshot_fuzz as fuzz
from accelrt import __version__, _info, cli
from accelrt._errors import InputError
from accelrt._start_state import StartStateError
from accelrt._sweep import _worker, parse_grid
from accelrt._text import printable
from accelrt.backends import get_backend
from accelrt.cli import _replay as cli_replay
from accelrt.cli import _replay_tables as replay_tables
from accelrt.cli import main
from accelrt.testing import reset_runtime
from accelrt.trace import TraceFormatError, write

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "traces" / "transformer_train.jsonl.gz"
EVIL = "\x1b]0;pwned\x07\x1b[2J\u202e"
"""Sets the terminal's title, clears the screen, then reverses the rest of the line."""
SHOWN = "\\x1b]0;pwned\\x07\\x1b[2J\\u202e"
"""``EVIL`` as the command shows it."""
RAW = re.compile("[\x1b\x07\u202e]")
MiB = 1 << 20
MAX_NAME_CHARS = 4096
"""The longest header ``name`` that ``load`` and ``write`` accept (docs/reliability.md)."""
BUG_LINE = (
    "accelrt replay: internal error: this is a bug in accelrt {version}, not a problem with your "
    "input; please report it with the command you ran and the traceback above\n"
)


def _boom(*args: object, **kwargs: object) -> Any:
    raise TypeError("boom")


# bugs are bug reports; input errors are one line


def test_an_internal_failure_is_a_bug_report(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(cli_replay, "_replay_shown", _boom)
    assert main(["replay", str(EXAMPLE), "--device", "sim"]) == cli.EXIT_BUG == 70
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.startswith("Traceback (most recent call last):\n")
    assert "in _boom\n" in captured.err and "\nTypeError: boom\n" in captured.err
    assert captured.err.endswith("TypeError: boom\n" + BUG_LINE.format(version=__version__))


@pytest.mark.parametrize(
    ("missing", "status"),
    [("dask", 2), ("distributed", 2), ("accelrt._sweep_helpers", 70)],
)
def test_a_missing_package_is_one_line_and_a_missing_accelrt_module_a_bug(
    missing: str, status: int, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    def missing_module(*args: object, **kwargs: object) -> Any:
        raise ModuleNotFoundError(f"No module named {missing!r}", name=missing)

    monkeypatch.setattr(cli_replay, "_replay_shown", missing_module)
    assert main(["replay", str(EXAMPLE), "--device", "sim"]) == status
    err = capsys.readouterr().err
    if status == 2:
        assert err == f"accelrt replay: error: No module named {missing!r}\n"
    else:
        assert err.endswith(BUG_LINE.format(version=__version__))


def test_a_bug_report_escapes_what_the_exception_quotes(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    def fails(*args: object, **kwargs: object) -> Any:
        raise KeyError(f"name{EVIL}")

    monkeypatch.setattr(cli_replay, "_replay_shown", fails)
    assert main(["replay", str(EXAMPLE), "--device", "sim"]) == 70
    err = capsys.readouterr().err
    assert f"\nKeyError: 'name{SHOWN}'\n" in err  # repr escapes the ESC, printable the rest
    assert not RAW.search(err)


def test_a_bug_while_printing_is_a_bug_report(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(replay_tables, "_bytes_or_dash", _boom)
    assert main(["replay", str(EXAMPLE), "--device", "sim"]) == 70
    assert capsys.readouterr().err.endswith(
        "TypeError: boom\n" + BUG_LINE.format(version=__version__)
    )


def test_an_input_error_is_one_line_and_debug_adds_its_traceback(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    missing = tmp_path / "missing.jsonl.gz"
    line = (
        f"accelrt replay: error: {missing}: No such file or directory; give an accelrt trace "
        "(.jsonl.gz) or a PyTorch snapshot pickle\n"
    )
    assert main(["replay", str(missing)]) == 2
    assert capsys.readouterr().err == line
    monkeypatch.setenv("ACCELRT_DEBUG", "1")
    assert main(["replay", str(missing)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("Traceback (most recent call last):\n")
    assert err.endswith(f"accelrt._errors.InputError: {line.split(': error: ')[1]}{line}")


def test_a_bug_is_a_bug_report_with_debug_too(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ACCELRT_DEBUG", "1")
    monkeypatch.setattr(cli_replay, "_replay_shown", _boom)
    assert main(["replay", str(EXAMPLE), "--device", "sim"]) == 70
    err = capsys.readouterr().err
    assert err.count("Traceback (most recent call last):") == 1
    assert err.endswith(BUG_LINE.format(version=__version__))


@pytest.mark.parametrize(
    ("env", "message"),
    [
        (
            {"ACCELRT_BACKEND": "sim", "ACCELRT_SIM_DEVICES": "abc"},
            "ACCELRT_SIM_DEVICES='abc': expected a device count in ASCII digits, 1 to 1024",
        ),
        (
            {"ACCELRT_BACKEND": "sim", "ACCELRT_SIM_DEVICES": "0"},
            "ACCELRT_SIM_DEVICES must be 1 to 1024, got 0",
        ),
        ({"ACCELRT_BACKEND": "nope"}, "ACCELRT_BACKEND='nope': unknown backend 'nope'"),
        ({"ACCELRT_SIM_CAPACITY": "abc"}, "cannot parse ACCELRT_SIM_CAPACITY 'abc'"),
        ({"ACCELRT_ALLOC_CONF": "bogus:1"}, "ACCELRT_ALLOC_CONF: unknown allocator setting"),
    ],
)
def test_bad_environment_variables_are_input_errors(
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    env: dict[str, str],
    message: str,
) -> None:
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    device = [] if "ACCELRT_BACKEND" in env else ["--device", "sim"]
    assert main(["replay", str(EXAMPLE), *device]) == 2
    captured = capsys.readouterr()
    assert captured.err.startswith(f"accelrt replay: error: {message}")
    assert captured.err.count("\n") == 1 and captured.out == ""


def test_input_errors_are_value_errors_of_one_class() -> None:
    assert issubclass(TraceFormatError, InputError) and issubclass(StartStateError, InputError)
    assert issubclass(InputError, ValueError)
    refusals = [
        lambda: acc.AllocatorConfig.parse("bogus:1"),
        lambda: acc.AllocatorConfig.parse("max_split_size_mb:1"),
        lambda: acc.parse_bytes("5 parsecs"),
        lambda: parse_grid("max_split_size_mb"),
        lambda: get_backend("nope"),
    ]
    for refuse in refusals:
        with pytest.raises(InputError):
            refuse()


# a snapshot whose history has no segment entries (PyTorch recorded no reserved memory)


def _without_segment_entries(path: Path) -> Path:
    snapshot = {
        "segments": [],
        "device_traces": [
            [
                {"action": "alloc", "addr": 4096, "size": 1024, "stream": 0},
                {"action": "free_requested", "addr": 4096, "size": 1024, "stream": 0},
                {"action": "free_completed", "addr": 4096, "size": 1024, "stream": 0},
            ]
        ],
    }
    path.write_bytes(pickle.dumps(snapshot))
    return path


def test_a_recording_without_reserved_memory_replays(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    path = _without_segment_entries(tmp_path / "noseg.pickle")
    assert main(["replay", str(path), "--no-progress"]) == 0
    out = capsys.readouterr().out
    assert (
        "  PyTorch recorded: peak reserved 0 bytes (0 bytes), 0 device mallocs; accelrt: "
        "2097152 bytes, 1 device mallocs; difference undefined (PyTorch recorded no reserved "
        "memory)\n"
    ) in out
    assert main(["replay", str(path), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["recorded_peak_reserved_bytes"] == 0
    assert report["peak_reserved_difference"] is None


# text from input files is escaped


def test_printable_escapes_control_and_bidi_characters() -> None:
    controls = "".join(map(chr, [*range(0x20), 0x7F, *range(0x80, 0xA0)]))
    expected = "".join(f"\\x{c:02x}" for c in [*range(0x20), 0x7F, *range(0x80, 0xA0)])
    assert printable(controls) == expected
    bidi = "".join(map(chr, [*range(0x202A, 0x202F), *range(0x2066, 0x206A)]))
    assert printable(bidi) == "\\u202a\\u202b\\u202c\\u202d\\u202e\\u2066\\u2067\\u2068\\u2069"
    assert printable(f"a{EVIL}b") == f"a{SHOWN}b"
    assert printable("tab\tnew\nline") == "tab\\x09new\\x0aline"
    assert printable("tab\tnew\nline", keep_newlines=True) == "tab\\x09new\nline"
    kept = "C:\\path\\to\\model.py é 中 \u00a0 \u2028 \u200f 🙂 [bold]x[/bold]"
    assert printable(kept) is kept


def _evil_trace(path: Path, name: str) -> Path:
    events = [{"action": "alloc", "addr": 4096, "size": MiB, "stream": 0},
              {"action": "free", "addr": 4096, "size": MiB, "stream": 0}]  # fmt: skip
    write(path, events, {"name": name})
    return path


def test_replay_escapes_the_trace_name(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    name = f"run{EVIL}[bold]x"
    path = _evil_trace(tmp_path / "evil.jsonl.gz", name)
    assert main(["replay", str(path), "--device", "sim"]) == 0
    out = capsys.readouterr().out
    assert not RAW.search(out)
    assert out.startswith(f"run{SHOWN}[bold]x on sim:0 (80.00 GiB): 2 events")  # no markup read
    assert main(["replay", str(path), "--device", "sim", "--json"]) == 0
    out = capsys.readouterr().out
    assert not RAW.search(out)
    assert json.loads(out)["trace"] == name  # JSON keeps the name exactly


@pytest.mark.parametrize("name", ["bad\ud800name", "$\\foo^$ and $x_{1}$"])
def test_a_lone_surrogate_or_mathtext_in_a_name_is_drawn_as_text(
    name: str, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    # a lone surrogate ended in a UnicodeEncodeError, mathtext made --png fail (issue 25)
    pytest.importorskip("matplotlib")
    path = _evil_trace(tmp_path / "odd.jsonl.gz", name)
    html_path, png_path = tmp_path / "odd.html", tmp_path / "odd.png"
    argv = [
        "replay",
        str(path),
        "--device",
        "sim",
        "--html",
        str(html_path),
        "--png",
        str(png_path),
    ]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert printable(name) in out and "\ud800" not in out.replace("\\ud800", "")
    assert html_path.read_text(encoding="utf-8").count(html.escape(printable(name))) >= 2
    assert png_path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_sweep_escapes_trace_names_and_errors(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    pytest.importorskip("dask.distributed", reason="the sweep needs Dask (the test extra has it)")
    good = _evil_trace(tmp_path / "evil.jsonl.gz", f"x{EVIL}")
    bad = tmp_path / f"bad{EVIL}.jsonl.gz"
    bad.write_bytes(b"not gzip, not json")
    argv = ["sweep", str(good), str(bad), "--scheduler", "synchronous", "--no-progress"]
    assert main(argv) == 1  # a trace failed
    out = capsys.readouterr().out
    assert not RAW.search(out)
    assert f"x{SHOWN}" in out and f"bad{SHOWN}.jsonl.gz" in out


def test_a_sweep_row_that_hits_a_bug_says_so(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    pytest.importorskip("dask.distributed", reason="the sweep needs Dask (the test extra has it)")
    monkeypatch.setattr(_worker, "replay", _boom)
    (row,) = acc.sweep(str(EXAMPLE), "defaults", scheduler="synchronous")
    assert row.error == (
        f"{EXAMPLE}: internal error TypeError: boom (a bug in accelrt, not a problem with this "
        "trace; please report it)"
    )


def _evil_snapshot(path: Path, data: dict[str, Any], devices: int = 1) -> Path:
    """``data`` (the ``small_recording``) as a snapshot whose allocations' stacks hold ``EVIL``
    in a frame's name and file name, on ``devices`` devices (the same history on each)."""
    frames = [{"name": f"forward{EVIL}", "filename": f"/work/model{EVIL}.py", "line": 7}]
    for entry in data["device_traces"][0]:
        if "frames" in entry:
            entry["frames"] = frames
    for segment in data["segments"]:
        for block in segment["blocks"]:
            block["frames"] = frames
    data["device_traces"] = data["device_traces"][:1] * devices
    data["segments"] = [dict(s, device=d) for d in range(devices) for s in data["segments"]]
    path.write_bytes(pickle.dumps(data))
    return path


@pytest.mark.parametrize(
    "argv",
    [
        ["replay", "{snap}", "--no-progress"],
        ["snapshot", "summary", "{snap}"],
        ["snapshot", "segments", "{snap}"],
        ["snapshot", "diff", "{snap}", "{snap}"],
        ["snapshot", "diff", "{snap}", "--config", "defaults", "--config", "expandable_segments:1"],
    ],
)
@pytest.mark.parametrize("devices", [1, 2])
def test_snapshot_commands_escape_frames_and_file_names(
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
    small_recording: dict[str, Any],
    argv: list[str],
    devices: int,
) -> None:
    snap = _evil_snapshot(tmp_path / f"run{EVIL}.pickle", small_recording, devices)
    assert main([a.format(snap=snap) for a in argv]) == 0
    out = capsys.readouterr().out
    assert not RAW.search(out)
    if argv[0] == "replay":
        assert out.startswith(f"run{SHOWN}" if devices == 1 else f"run{SHOWN}_dev0")
    if argv[1] in ("summary", "diff"):  # the stacks are shown, escaped (the file cut short)
        assert f"forward{SHOWN}  ..." in out and "\\u202e.py:7\n" in out


def test_the_end_state_summary_escapes_frames(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, small_recording: dict[str, Any]
) -> None:
    snap = _evil_snapshot(tmp_path / f"end{EVIL}.pickle", small_recording)
    data = pickle.loads(snap.read_bytes())
    data["device_traces"] = [[]]  # no history: the summary shows the end state
    snap.write_bytes(pickle.dumps(data))
    assert main(["snapshot", "summary", str(snap)]) == 0
    out = capsys.readouterr().out
    assert not RAW.search(out)
    assert out.startswith(f"end{SHOWN} (recorded device 0)\n")


def test_error_messages_escape_what_they_quote(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    path = tmp_path / f"bad{EVIL}.jsonl.gz"
    with gzip.open(path, "wt") as f:
        f.write(json.dumps({"type": "header", "format": "alloc-trace-jsonl", "format_version": 1}))
        f.write("\n" + json.dumps({"action": f"x{EVIL}"}) + "\n")
    assert main(["replay", str(path)]) == 2
    err = capsys.readouterr().err
    shown_path = str(tmp_path / f"bad{SHOWN}.jsonl.gz")
    assert err == (
        f"accelrt replay: error: {shown_path}:2: unknown action 'x{SHOWN}'; expected one of "
        "alloc, free, empty_cache\n"
    )


def test_a_recording_start_that_does_not_fit_escapes_the_trace_name(
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    small_recording: dict[str, Any],
) -> None:
    def cannot_hold(*args: object, **kwargs: object) -> Any:
        raise StartStateError("the start does not fit")

    snap = _evil_snapshot(tmp_path / f"run{EVIL}.pickle", small_recording)
    monkeypatch.setattr(cli_replay, "_replay_shown", cannot_hold)
    assert main(["replay", str(snap), "--no-progress"]) == 2
    assert capsys.readouterr().err == f"error: run{SHOWN}: the start does not fit\n"


def test_info_escapes_what_the_drivers_report(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    sizes = dict.fromkeys(("total_memory_bytes", "free_memory_bytes", "max_allocation_bytes"), MiB)
    device = {"device": "x:0", "name": f"gpu{EVIL}", "vendor": f"v{EVIL}", **sizes,
              "compute_units": 1, "driver_version": f"1{EVIL}",
              "host_accessible": True}  # fmt: skip
    data = {"accelerator": "x", "registered_backends": ["x", "y"], "available_backends": ["x"],
            "unavailable_backends": {"y": f"no driver{EVIL}"}, "devices": [device],
            "allocator_core": {"core": "compiled", "reason": "built"}}  # fmt: skip
    monkeypatch.setattr(_info, "info_data", lambda: data)
    assert main(["info"]) == 0
    out = capsys.readouterr().out
    assert not RAW.search(out)
    assert f"y: unavailable: no driver{SHOWN}\n" in out
    for shown in (f"gpu{SHOWN}", f"v{SHOWN}", f"1{SHOWN}"):
        assert shown in out


def test_the_html_page_escapes_the_trace_name_as_html(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    plain, page = tmp_path / "plain.html", tmp_path / "page.html"
    assert main(["replay", str(EXAMPLE), "--device", "sim", "--html", str(plain)]) == 0
    name = "</title><script>alert(1)</script>"
    path = _evil_trace(tmp_path / "evil.jsonl.gz", name)
    assert main(["replay", str(path), "--device", "sim", "--html", str(page)]) == 0
    text = page.read_text()
    assert text.count("</script>") == plain.read_text().count("</script>")  # none of the name's
    assert "</title><script>" not in text
    assert "<title>&lt;/title&gt;&lt;script&gt;alert(1)&lt;/script&gt;: memory</title>" in text
    assert "<h1>&lt;/title&gt;&lt;script&gt;alert(1)&lt;/script&gt;</h1>" in text


# long header fields


def test_a_trace_name_longer_than_the_limit_is_refused(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    longest = _evil_trace(tmp_path / "longest.jsonl.gz", "n" * MAX_NAME_CHARS)
    assert main(["replay", str(longest), "--device", "sim"]) == 0
    assert capsys.readouterr().out.startswith("n" * MAX_NAME_CHARS + " on sim:0")
    too_long = tmp_path / "long.jsonl.gz"
    header = {"type": "header", "format": "alloc-trace-jsonl", "format_version": 1}
    with gzip.open(too_long, "wt") as f:
        f.write(json.dumps({**header, "name": "n" * (1 << 20)}) + "\n")
    assert main(["replay", str(too_long), "--device", "sim"]) == 2
    assert capsys.readouterr().err == (
        f"accelrt replay: error: {too_long}:1: header: field 'name' is 1048576 characters long, "
        "more than the limit of 4096; shorten it\n"
    )


# damaged snapshots through every command: an input error or a result, never a bug report


def test_mutated_snapshots_through_the_commands_are_never_bug_reports(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    bases = [fuzz._hand_made(), fuzz._recorded(tmp_path, "expandable_segments:True", 2)]
    acc.set_allocator_settings("")
    pickled = [pickle.dumps(base) for base in bases]
    rng = random.Random(fuzz.SEED)
    path, page = tmp_path / "run.pickle", tmp_path / "run.html"
    commands = [
        ["replay", str(path), "--no-progress"],
        ["replay", str(path), "--json", "--config", "expandable_segments:True"],
        ["snapshot", "summary", str(path)],
        ["snapshot", "segments", str(path)],
        ["snapshot", "view", str(path), "-o", str(page)],
        ["snapshot", "diff", str(path), str(path)],
    ]
    statuses: dict[int, int] = {0: 0, 2: 0}
    for _ in range(200):
        snapshot = pickle.loads(rng.choice(pickled))
        for _ in range(rng.choice([1, 1, 2, 3])):
            fuzz._mutate_data(rng, snapshot)
        try:
            data = pickle.dumps(snapshot, protocol=rng.choice([2, 4, 5]))
        except (RecursionError, ValueError):
            continue
        fuzz._write(path, fuzz._mutate_bytes(rng, data) if rng.random() < 0.3 else data)
        for argv in commands:
            reset_runtime()
            status = main(argv)
            err = capsys.readouterr().err
            assert status in statuses, (argv, err)
            assert "Traceback" not in err and (status == 0 or err.count("\n") == 1), err
            statuses[status] += 1
    assert statuses[0] > 300 and statuses[2] > 300
