"""Adversarial input: every CLI error is one line and status 2; bounded sizes, settings, traces."""

from __future__ import annotations

import gzip
import json
import os
import pickle
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import accelrt as acc
from accelrt import AllocatorConfig, parse_bytes
from accelrt.cli import main
from accelrt.trace import TraceFormatError, load, write

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "traces" / "transformer_train.jsonl.gz"
HEADER = {"type": "header", "format": "alloc-trace-jsonl", "format_version": 1, "name": "t"}
ALLOC = {"action": "alloc", "addr": 16, "size": 8, "stream": 0}
MiB = 1 << 20


def _lines(path: Path, lines: list[object]) -> Path:
    with gzip.open(path, "wt") as out:
        for line in lines:
            out.write((line if isinstance(line, str) else json.dumps(line)) + "\n")
    return path


def _fails_in_one_line(capsys: pytest.CaptureFixture[str], argv: list[str], message: str) -> str:
    """Run the command; assert status 2, one non-empty stderr line holding ``message``."""
    assert main(argv) == 2
    captured = capsys.readouterr()
    err = captured.err
    assert "Traceback" not in err
    lines = err.splitlines()
    assert len(lines) == 1 and lines[0].strip() and err.endswith("\n"), err
    assert message in err, err
    assert captured.out == ""
    return err


@pytest.fixture
def files(tmp_path: Path) -> dict[str, str]:
    """Files that are not what the commands want."""
    binary = tmp_path / "random.bin"
    binary.write_bytes(bytes(range(256)))
    zipped = tmp_path / "binary.gz"
    with gzip.open(zipped, "wb") as f:
        f.write(bytes(range(256)))
    empty = tmp_path / "empty"
    empty.write_bytes(b"")
    code = tmp_path / "code.pickle"
    code.write_bytes(pickle.dumps(os.getcwd))
    a_list = tmp_path / "list.pickle"
    a_list.write_bytes(pickle.dumps([1, 2]))
    malformed = tmp_path / "malformed.pickle"
    malformed.write_bytes(
        pickle.dumps({"segments": [{}], "device_traces": [[{"action": "alloc"}]]})
    )
    cap = _lines(tmp_path / "cap.jsonl.gz", [{**HEADER, "device_capacity_bytes": "abc"}])
    digits = _lines(
        tmp_path / "digits.jsonl.gz",
        [HEADER, '{"action": "alloc", "addr": 16, "size": ' + "9" * 5000 + "}"],
    )
    return {
        "dir": str(tmp_path),
        "missing": str(tmp_path / "missing.jsonl.gz"),
        "binary": str(binary),
        "gzip": str(zipped),
        "empty": str(empty),
        "code": str(code),
        "list": str(a_list),
        "malformed": str(malformed),
        "cap": str(cap),
        "digits": str(digits),
    }


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["replay", "{dir}"], "is a directory; give an accelrt trace"),
        (["replay", "{missing}"], "No such file or directory"),
        (["replay", "{binary}"], "is neither an accelrt trace"),
        (["replay", "{gzip}"], "gzip'd but not JSON"),
        (["replay", "{empty}"], "empty file, expected a header line"),
        (["replay", "{code}"], "refused: the pickle names global"),
        (["replay", "{list}"], "not a PyTorch memory snapshot"),
        (["replay", "{malformed}"], "malformed.pickle: "),
        (["replay", "{cap}"], ":1: header: field 'device_capacity_bytes' must be an integer"),
        (["replay", "{digits}"], ":2: a number with too many digits"),
        (["snapshot", "summary", "{dir}"], "is a directory"),
        (["snapshot", "summary", "{missing}"], "No such file or directory"),
        (["snapshot", "summary", "{binary}"], "is not a snapshot pickle"),
        (["snapshot", "summary", "{gzip}"], "is gzip'd data"),
        (["snapshot", "summary", "{empty}"], "is empty, not a snapshot pickle"),
        (["snapshot", "summary", "{code}"], "refused: the pickle names global"),
        (["snapshot", "segments", "{list}"], "not a PyTorch memory snapshot"),
        (["snapshot", "summary", "{malformed}"], "malformed.pickle: "),
        (["snapshot", "segments", "{malformed}"], "malformed.pickle: "),
        (["snapshot", "view", "{malformed}", "-o", "{dir}/m.html"], "malformed.pickle: "),
    ],
)
def test_bad_files_are_one_line(
    capsys: pytest.CaptureFixture[str], files: dict[str, str], argv: list[str], message: str
) -> None:
    err = _fails_in_one_line(capsys, [a.format(**files) for a in argv], message)
    assert "accelrt " in err and ": error: " in err


@pytest.mark.parametrize("command", ["summary", "segments", "view"])
def test_a_jsonl_trace_is_not_called_a_pickle(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, command: str
) -> None:
    out = tmp_path / "page.html"
    argv = ["snapshot", command, str(EXAMPLE)] + (["-o", str(out)] if command == "view" else [])
    err = _fails_in_one_line(
        capsys, argv, f"{EXAMPLE} is a JSONL trace, not a snapshot pickle; use accelrt replay"
    )
    assert "names" not in err
    assert not out.exists()  # nothing written


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (["--device", ""], "argument --device: the device is empty"),
        (["--device", "   "], "the device is empty"),
        (["--device", "sim:99999999"], "device index '99999999' of 'sim' is too large"),
        (["--device", "sim:1024"], "at most 1023"),
        (["--device", "sim:" + "9" * 5000], "is too large"),
        (["--device", "sim:\u0663"], "invalid device"),
        (["--device", "sim:-1"], "invalid device 'sim:-1'"),
        (["--device", "SIM"], "invalid device 'SIM'"),
        (["--device", "nope:0"], "unknown backend 'nope'"),
        (["--device", "nope:0", "--capacity", "1GiB"], "capacity applies to the simulated"),
        (["--device", "sim", "--capacity", "-5"], "sim capacity must be >= 0 bytes, got '-5'"),
        (["--device", "sim", "--capacity", "1e5"], "cannot parse sim capacity '1e5'"),
        (["--device", "sim", "--capacity", "nan"], "cannot parse sim capacity 'nan'"),
        (["--device", "sim", "--capacity", "inf"], "cannot parse sim capacity 'inf'"),
        (["--device", "sim", "--capacity", "\u0663GiB"], "cannot parse sim capacity"),
        (["--device", "sim", "--capacity", "9223372036854775808"], "less than 2**63"),
        (["--device", "sim", "--capacity", "99999999999999999999999TiB"], "too many digits"),
        (["--device", "sim", "--capacity", "8388608TiB"], "less than 2**63"),
        (["--device", "sim", "--config", "max_split_size_mb:\u0663\u0660"], "ASCII digits"),
        (
            ["--device", "sim", "--config", "max_split_size_mb:" + "9" * 30],
            "max_split_size_mb must be at most 1099511627776 (MiB)",
        ),
        (["--device", "sim", "--config", "garbage_collection_threshold:nan"], "not nan or inf"),
        (["--device", "sim", "--config", "per_process_memory_fraction:inf"], "not nan or inf"),
        (["--device", "sim", "--config", "roundup_power2_divisions:131072"], "up to 65536"),
        (["--device", "sim", "--config", "", "--config", "bogus:1"], "unknown allocator setting"),
        (["--device-index", "-1"], "argument --device-index: the device index must be >= 0"),
        (["--device-index", "99999999999999"], "is too large: at most 1023"),
        (["--device-index", "\u0663"], "ASCII digits"),
        (["--device-index", "x"], "ASCII digits"),
        (["--device-index", "0"], "device_index applies to snapshots only"),
        (["--device", "sim", "--html", "/nonexistent-accelrt/x.html"], "does not exist"),
        (["--device", "sim", "--png", "/nonexistent-accelrt/x.png"], "does not exist"),
        (["--device", "sim", "--html", ""], "--html needs a file name"),
        (["--bogus"], "unrecognized arguments: --bogus"),
        (["--device"], "expected one argument"),
    ],
)
def test_bad_replay_options_are_one_line(
    capsys: pytest.CaptureFixture[str], options: list[str], message: str
) -> None:
    start = time.perf_counter()
    _fails_in_one_line(capsys, ["replay", str(EXAMPLE), *options], message)
    assert time.perf_counter() - start < 20  # refused up front: nothing built, nothing hangs


def test_output_options_refuse_directories_and_the_input(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    _fails_in_one_line(
        capsys, ["replay", str(EXAMPLE), "--html", str(tmp_path)], "is a directory; give a file"
    )
    copy = tmp_path / "t.jsonl.gz"
    copy.write_bytes(EXAMPLE.read_bytes())
    _fails_in_one_line(
        capsys,
        ["replay", str(copy), "--device", "sim", "--html", str(copy)],
        "is the input file; writing it would destroy it",
    )
    assert copy.read_bytes() == EXAMPLE.read_bytes()


def test_png_with_a_format_matplotlib_cannot_write(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    page = tmp_path / "run.html"
    argv = ["replay", str(EXAMPLE), "--device", "sim", "--html", str(page)]
    err = _fails_in_one_line(capsys, [*argv, "--png", str(tmp_path / "x.foo")], "--png")
    assert "matplotlib" in err or "cannot write a 'foo' file" in err
    assert not page.exists()  # refused before anything was written


def test_a_failing_run_writes_nothing(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    page = tmp_path / "run.html"
    bad = _lines(tmp_path / "bad.jsonl.gz", [HEADER, ALLOC, ALLOC])
    _fails_in_one_line(
        capsys, ["replay", str(bad), "--device", "sim", "--html", str(page)], ":3: alloc of"
    )
    assert not page.exists()


@pytest.mark.parametrize(
    "argv",
    [[], ["bogus"], ["replay"], ["snapshot"], ["snapshot", "view", str(EXAMPLE)], ["info", "-x"]],
)
def test_usage_errors_are_one_line(capsys: pytest.CaptureFixture[str], argv: list[str]) -> None:
    err = _fails_in_one_line(capsys, argv, "error: ")
    assert "--help" in err


def test_help_still_works(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["replay", "--help"]) == 0
    assert "--device" in capsys.readouterr().out


def _snapshot(path: Path) -> Path:
    acc.backends.use("sim")
    acc.record_memory_history()
    blocks = [acc.empty(n) for n in (MiB, 5 * MiB)]
    blocks[0].free()
    acc.dump_snapshot(path)
    return path


@pytest.mark.parametrize("command", ["summary", "segments", "view"])
def test_snapshot_device_index_out_of_range(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, command: str
) -> None:
    snap = _snapshot(tmp_path / "run.pickle")
    out = tmp_path / "page.html"
    extra = ["-o", str(out)] if command == "view" else []
    _fails_in_one_line(
        capsys, ["snapshot", command, str(snap), "--device-index", "7", *extra], "out of range"
    )
    _fails_in_one_line(
        capsys, ["snapshot", command, str(snap), "--device-index", "-1", *extra], ">= 0"
    )
    assert not out.exists()
    assert main(["snapshot", command, str(snap), *extra]) == 0  # the good path still works


def test_snapshot_with_damaged_settings_names_the_file(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    snap = _snapshot(tmp_path / "run.pickle")
    data = pickle.loads(snap.read_bytes())
    data["allocator_settings"] = {"roundup_power2_divisions": {"abc": 4}}
    snap.write_bytes(pickle.dumps(data))
    err = _fails_in_one_line(capsys, ["snapshot", "summary", str(snap)], f"{snap}: ")
    assert "roundup_power2_divisions" in err and "'abc'" in err


def test_sigint_during_replay_is_one_line_and_130(tmp_path: Path) -> None:
    if os.name != "posix":
        pytest.skip("SIGINT to a child process needs POSIX")
    path = tmp_path / "big.jsonl.gz"
    pair = (
        '{"action":"alloc","addr":4096,"size":1048576,"stream":0}\n'
        '{"action":"free","addr":4096,"size":1048576,"stream":0}\n'
    )
    with gzip.open(path, "wt", compresslevel=1) as out:  # 2,000,000 events: seconds to replay
        out.write(json.dumps(HEADER) + "\n")
        chunk = pair * 10_000
        for _ in range(100):
            out.write(chunk)
    child = subprocess.Popen(
        [sys.executable, "-m", "accelrt.cli", "replay", str(path), "--device", "sim", "--json"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        # a shell may start children with SIGINT ignored; let Python install its handler
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    try:
        fds = Path(f"/proc/{child.pid}/fd")
        deadline = time.monotonic() + 30
        started = False
        while time.monotonic() < deadline and child.poll() is None and not started:
            try:  # the command is running once it has the trace open
                started = any(os.path.realpath(fd) == str(path.resolve()) for fd in fds.iterdir())
            except OSError:
                if not Path("/proc/self/fd").exists():  # no /proc: give it time to start
                    time.sleep(3)
                    started = True
            time.sleep(0.01)
        if child.poll() is not None:
            pytest.skip("the replay finished before it could be interrupted")
        child.send_signal(signal.SIGINT)
        out, err = child.communicate(timeout=60)
    finally:
        if child.poll() is None:
            child.kill()
            child.communicate()
    if child.returncode == 0:
        pytest.skip("the replay finished before the interrupt arrived")
    assert child.returncode == 130, err
    assert err == "accelrt: interrupted\n"
    assert out == ""


# the parts under the CLI, one by one


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("\u0663\u0660MiB", "cannot parse size"),  # Arabic-Indic digits
        ("\uff13MiB", "cannot parse size"),  # fullwidth 3
        ("nan", "cannot parse size 'nan'"),
        ("inf", "cannot parse size 'inf'"),
        ("1e5", "cannot parse size '1e5'"),
        ("-1MiB", "size must be >= 0 bytes"),
        ("9" * 5000, "too many digits"),
        ("1." + "0" * 60 + "1", "too many digits"),
        ("9223372036854775808", "less than 2**63"),
        ("8EiB", "less than 2**63"),
        ("5 parsecs", "cannot parse size '5 parsecs'"),
        ("8388608TiB", "less than 2**63"),
    ],
)
def test_parse_bytes_refuses(text: str, message: str) -> None:
    with pytest.raises(ValueError) as info:
        parse_bytes(text)
    assert message in str(info.value)


def test_parse_bytes_bounds() -> None:
    assert parse_bytes("9223372036854775807") == (1 << 63) - 1
    assert parse_bytes((1 << 63) - 1) == (1 << 63) - 1
    assert parse_bytes("0" * 30 + "1") == 1
    assert parse_bytes("8388607TiB") == 8388607 << 40
    with pytest.raises(ValueError, match=r"capacity must be less than 2\*\*63 bytes"):
        parse_bytes(1 << 63, name="capacity")
    for text, value in [("512MiB", 512 * MiB), (" 3 m ", 3 * MiB), ("1.5KiB", 1536)]:
        assert parse_bytes(text) == value


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("max_split_size_mb:\u0663\u0660", "max_split_size_mb must be an integer >= 20 (MiB)"),
        ("max_split_size_mb:" + "9" * 30, "max_split_size_mb must be at most 1099511627776"),
        ("max_split_size_mb:" + "9" * 5000, "max_split_size_mb must be an integer >= 20"),
        ("max_split_size_mb:1099511627777", "20 to 1099511627776"),
        ("max_non_split_rounding_mb:\uff13\uff10", "ASCII digits"),
        ("max_split_size_mb:+30", "max_split_size_mb must be an integer"),
        ("max_split_size_mb:3_0", "max_split_size_mb must be an integer"),
        ("garbage_collection_threshold:nan", "garbage_collection_threshold must be a number"),
        ("garbage_collection_threshold:inf", "not nan or inf"),
        ("garbage_collection_threshold:1e999", "not nan or inf"),
        ("garbage_collection_threshold:\u0660.\u0665", "ASCII decimal"),
        ("per_process_memory_fraction:NaN", "per_process_memory_fraction must be a number"),
        ("per_process_memory_fraction:0_5", "per_process_memory_fraction must be a number"),
        ("roundup_power2_divisions:\u0664", "must be 0 or a power of two, got '\u0664'"),
        ("roundup_power2_divisions:131072", "up to 65536"),
        ("roundup_power2_divisions:[256:\u0664]", "must be 0 or a power of two"),
        ("roundup_power2_divisions:[\u0662\u0665\u0666:4]", "interval '\u0662\u0665\u0666'"),
        ("roundup_power2_divisions:[" + "9" * 5000 + ":4]", "must be a power of two in MiB"),
        ("roundup_power2_divisions:[2199023255552:4]", "up to 1099511627776"),
    ],
)
def test_config_refuses(text: str, message: str) -> None:
    with pytest.raises(ValueError) as info:
        AllocatorConfig.parse(text)
    assert message in str(info.value)
    assert text.partition(":")[0] in str(info.value)  # names the key


def test_config_accepts_its_range() -> None:
    assert AllocatorConfig.parse("max_split_size_mb:1099511627776").max_split_size == 1 << 60
    assert AllocatorConfig.parse("max_split_size_mb: 30 ").max_split_size == 30 * MiB
    assert AllocatorConfig.parse("garbage_collection_threshold:1e-05").garbage_collection_threshold
    assert AllocatorConfig.parse("per_process_memory_fraction:.5").per_process_memory_fraction
    divisions = AllocatorConfig.parse("roundup_power2_divisions:65536").roundup_power2_divisions
    assert divisions == (65536,) * 16


@pytest.mark.parametrize(
    ("mapping", "exc", "message"),
    [
        ({"max_split_size_mb": 1.5}, TypeError, "max_split_size_mb must be an integer"),
        ({"max_split_size_mb": True}, TypeError, "max_split_size_mb must be an integer"),
        ({"max_split_size_mb": [30]}, TypeError, "max_split_size_mb"),
        ({"max_split_size_mb": "\u0663\u0660"}, ValueError, "ASCII digits"),
        ({"max_split_size_mb": 10**30}, ValueError, "at most 1099511627776"),
        ({"garbage_collection_threshold": float("nan")}, ValueError, "not nan or inf"),
        ({"garbage_collection_threshold": 10**400}, ValueError, "not nan or inf"),
        ({"garbage_collection_threshold": [0.5]}, TypeError, "garbage_collection_threshold"),
        ({"per_process_memory_fraction": "inf"}, ValueError, "per_process_memory_fraction"),
        ({"roundup_power2_divisions": 4.0}, TypeError, "roundup_power2_divisions"),
        ({"roundup_power2_divisions": [4.0] * 16}, TypeError, "roundup_power2_divisions"),
        ({"roundup_power2_divisions": 1 << 20}, ValueError, "up to 65536"),
    ],
)
def test_config_mapping_checks_types(mapping: dict[str, object], exc: type, message: str) -> None:
    with pytest.raises(exc) as info:
        AllocatorConfig.coerce(mapping)
    assert message in str(info.value)


def test_config_mapping_accepts_plain_values() -> None:
    cfg = AllocatorConfig.coerce(
        {"max_split_size_mb": 64, "garbage_collection_threshold": 0.5, "expandable_segments": True}
    )
    assert cfg.max_split_size == 64 * MiB and cfg.garbage_collection_threshold == 0.5
    assert (
        AllocatorConfig.coerce({"roundup_power2_divisions": 4}).roundup_power2_divisions
        == (4,) * 16
    )


@pytest.mark.parametrize(
    "recorded",
    [
        {"roundup_power2_divisions": {"abc": 4}},
        {"roundup_power2_divisions": {"256": "\u0664"}},
        {"garbage_collection_threshold": float("inf")},
    ],
)
def test_damaged_recorded_settings_are_clear(recorded: dict[str, object]) -> None:
    with pytest.raises(ValueError, match="a recorded setting: the snapshot is damaged") as info:
        AllocatorConfig.from_torch_settings(recorded)
    assert next(iter(recorded)) in str(info.value)  # names the key


@pytest.mark.parametrize(
    ("lines", "message"),
    [
        ([{**HEADER, "device_capacity_bytes": "abc"}], ":1: header: field 'device_capacity_bytes'"),
        ([{**HEADER, "device_capacity_bytes": None}], "must be an integer, got None"),
        ([{**HEADER, "device_capacity_bytes": 1.5e10}], "must be an integer, got 15000000000.0"),
        ([{**HEADER, "device_capacity_bytes": -1}], "must be >= 0, got -1"),
        ([{**HEADER, "device_capacity_bytes": 1 << 64}], "must be an integer in [0, 2**63)"),
        ([HEADER, '{"action":"alloc","addr":16,"size":' + "9" * 5000 + "}"], ":2: a number"),
        ([HEADER, {**ALLOC, "size": 1 << 63}], ":2: field 'size' must be an integer in [0, 2**63)"),
        ([HEADER, {**ALLOC, "addr": 1 << 70}], ":2: field 'addr' must be an integer in [0, 2**63)"),
        ([HEADER, {**ALLOC, "stream": -(1 << 64)}], "field 'stream' must be an integer in [-2**63"),
        (
            [HEADER, '{"action":"alloc","addr":16,"size":NaN}'],
            ":2: field 'size' must be an integer",
        ),
        ([HEADER, {**ALLOC, "size": 8.0}], ":2: field 'size' must be an integer, got 8.0"),
        ([HEADER, "[" * 100_000], ":2: JSON nested too deeply"),
        ([HEADER, {"action": "x" * 10_000}], ":2: unknown action 'xxxx"),
        (
            [{**HEADER, "name": "n" * 4097}],
            ":1: header: field 'name' is 4097 characters long, more than the limit of 4096; "
            "shorten it",
        ),
    ],
)
def test_trace_reader_refuses(tmp_path: Path, lines: list[object], message: str) -> None:
    path = _lines(tmp_path / "bad.jsonl.gz", lines)
    with pytest.raises(TraceFormatError) as info:
        load(path)
    text = str(info.value)
    assert text.startswith(str(path)) and message in text
    assert len(text) < 400  # a huge value is cut short


def test_trace_reader_tells_what_a_file_is(tmp_path: Path, files: dict[str, str]) -> None:
    with pytest.raises(TraceFormatError, match="is a directory"):
        load(files["dir"])
    with pytest.raises(TraceFormatError, match="is neither an accelrt trace"):
        load(files["binary"])
    with pytest.raises(TraceFormatError, match="gzip'd but not JSON"):
        load(files["gzip"])
    with pytest.raises(FileNotFoundError):
        load(files["missing"])
    text = tmp_path / "words.txt"
    text.write_text("hello\n")
    with pytest.raises(TraceFormatError, match="is neither an accelrt trace"):
        load(text)


def test_trace_reader_keeps_valid_traces(tmp_path: Path) -> None:
    trace = load(EXAMPLE)
    assert len(trace.events) == 6141
    edge = _lines(
        tmp_path / "edge.jsonl.gz",
        [
            {**HEADER, "device_capacity_bytes": (1 << 63) - 1},
            {**ALLOC, "addr": (1 << 63) - 1, "size": (1 << 63) - 1, "stream": -(1 << 63)},
        ],
    )
    loaded = load(edge)
    assert loaded.events[0].size == (1 << 63) - 1 and loaded.events[0].stream == -(1 << 63)


def test_write_refuses_what_load_refuses(tmp_path: Path) -> None:
    path = tmp_path / "w.jsonl.gz"
    with pytest.raises(TraceFormatError, match=r"event on line 2: field 'size' must be an integer"):
        write(path, [{**ALLOC, "size": 1 << 63}])
    with pytest.raises(TraceFormatError, match="event on line 2: unknown action 'resize'"):
        write(path, [{**ALLOC, "action": "resize"}])
    with pytest.raises(TraceFormatError, match="header: field 'device_capacity_bytes'"):
        write(path, [ALLOC], {"device_capacity_bytes": "80GiB"})
    with pytest.raises(TraceFormatError, match=r"^header: field 'name' is 5000 characters long"):
        write(path, [ALLOC], {"name": "n" * 5000})
    assert not path.exists()
    write(path, [ALLOC, {"action": "empty_cache"}, {**ALLOC, "action": "free"}])
    assert len(load(path).events) == 3
