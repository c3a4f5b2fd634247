"""``accelrt replay`` and ``accelrt info``: the shipped real trace, reports, errors, the CLI."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from accelrt.cli import main
from accelrt.replay import replay
from accelrt.trace import TraceEvent, load, write

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "traces" / "transformer_train.jsonl.gz"
MiB = 1 << 20


def test_replay_shipped_trace(device: str) -> None:
    trace = load(EXAMPLE)
    report = replay(trace, device=f"{device}:0")
    assert report.events == len(trace.events) == 6141
    assert (
        report.peak_requested_bytes
        == trace.peak_live_bytes
        == trace.header["stats"]["peak_live_bytes"]
    )
    assert report.peak_reserved_bytes >= report.peak_allocated_bytes >= report.peak_requested_bytes
    assert report.fragmentation == report.peak_reserved_bytes / report.peak_requested_bytes
    assert report.num_ooms == 0 and report.device == f"{device}:0"


def test_replay_is_deterministic_on_sim() -> None:
    trace = load(EXAMPLE)
    a = replay(trace, device="sim", config="max_split_size_mb:64")
    b = replay(trace, device="sim", config="max_split_size_mb:64")
    assert a.peak_reserved_bytes == b.peak_reserved_bytes
    assert a.num_device_alloc == b.num_device_alloc
    assert a.config == "max_split_size_mb:64"


def test_replay_records_ooms_and_continues(tmp_path: Path) -> None:
    events = [TraceEvent("alloc", i, 30 * MiB, 0) for i in range(4)] + [
        TraceEvent("free", 0, 30 * MiB, 0),
        TraceEvent("alloc", 9, 10 * MiB, 0),
    ]
    write(tmp_path / "o.jsonl.gz", events)
    report = replay(load(tmp_path / "o.jsonl.gz"), device="sim", capacity="64MiB")
    assert report.num_ooms == 2
    assert [o.event for o in report.ooms] == [2, 3]
    assert report.ooms[0].requested_bytes == 30 * MiB
    assert report.peak_reserved_bytes == 60 * MiB


def test_replay_rejects_capacity_on_real_device() -> None:
    with pytest.raises(ValueError, match="capacity applies to the simulated device only"):
        replay(load(EXAMPLE), device="opencl:0", capacity="1GiB")


def test_cli_replay_json(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["replay", str(EXAMPLE), "--device", "sim", "--capacity", "80GiB", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    for key in (
        "events",
        "peak_requested_bytes",
        "peak_allocated_bytes",
        "peak_reserved_bytes",
        "fragmentation",
        "num_device_alloc",
        "num_device_free",
        "num_ooms",
        "wall_seconds",
        "events_per_second",
    ):
        assert key in data
    assert data["peak_requested_bytes"] == 341293844
    assert data["capacity_bytes"] == 80 << 30


def test_cli_replay_compares_settings(capsys: pytest.CaptureFixture[str]) -> None:
    argv = [
        "replay",
        str(EXAMPLE),
        "--device",
        "sim",
        "--config",
        "",
        "--config",
        "roundup_power2_divisions:4",
    ]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "defaults" in out and "roundup_power2_divisions" in out
    assert "peak requested 341293844 bytes equals the trace's peak live 341293844 bytes" in out


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["replay", "missing.jsonl.gz"], "No such file or directory"),
        (
            ["replay", str(EXAMPLE), "--device", "sim", "--config", "bogus:1"],
            "unknown allocator setting 'bogus'",
        ),
        (
            ["replay", str(EXAMPLE), "--device", "sim", "--capacity", "lots"],
            "cannot parse sim capacity",
        ),
        (["replay", str(EXAMPLE), "--device", "nope:0"], "unknown backend 'nope'"),
    ],
)
def test_cli_errors_are_one_line(
    capsys: pytest.CaptureFixture[str], argv: list[str], message: str
) -> None:
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err and err.count("\n") == 1


def test_cli_info_json(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["info", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert {"opencl", "sim"} <= set(data["registered_backends"])
    for dev in data["devices"]:
        assert dev["total_memory_bytes"] > 0
    assert {"sim:0", "sim:1"} <= {dev["device"] for dev in data["devices"]}  # listed unchosen
    assert data["allocator_core"]["core"] in ("compiled", "python")


def test_cli_as_subprocess() -> None:
    env = {**os.environ, "ACCELRT_BACKEND": "sim"}
    out = subprocess.run(
        [sys.executable, "-m", "accelrt.cli", "info"],
        capture_output=True,
        text=True,
        env=env,
        check=True,
    )
    assert "accelerator: sim" in out.stdout and "sim:0" in out.stdout


def test_replay_uses_header_capacity_on_sim(tmp_path: Path) -> None:
    path = tmp_path / "cap.jsonl.gz"
    write(path, [TraceEvent("alloc", 1, 50 * MiB, 0)], {"device_capacity_bytes": 64 * MiB})
    trace = load(path)
    assert replay(trace, device="sim").capacity_bytes == 64 * MiB
    assert replay(trace, device="sim", capacity="1GiB").capacity_bytes == 1 << 30


def test_pictures_draw_the_replay_the_user_asked_for(tmp_path: Path) -> None:
    from accelrt.view import picture_moments, render_html, view_of_trace

    trace = load(EXAMPLE)
    page = tmp_path / "run.html"
    args = ["replay", str(EXAMPLE), "--device", "sim", "--capacity", "1GiB"]
    assert main([*args, "--config", "expandable_segments:True", "--html", str(page)]) == 0
    report = replay(
        trace,
        device="sim",
        capacity="1GiB",
        config="expandable_segments:True",
        capture_at=picture_moments(trace),
    )
    assert report.capacity_bytes == 1 << 30
    assert page.read_text() == render_html(view_of_trace(trace, report))
    plain = replay(trace, device="sim", capture_at=picture_moments(trace))
    assert render_html(view_of_trace(trace, plain)) != page.read_text()  # the setting shows
    with pytest.raises(ValueError, match="captured no segment map"):
        view_of_trace(trace, replay(trace, device="sim"))


def test_expandable_segments_replay_on_sim_and_fall_back_on_opencl(opencl: str) -> None:
    trace = load(EXAMPLE)
    on_sim = replay(trace, device="sim", config="expandable_segments:True")
    assert on_sim.notes == [] and on_sim.memory_stats["segment.all.peak"] == 0  # pages only
    on_opencl = replay(trace, device="opencl:0", config="expandable_segments:True")
    assert on_opencl.notes == [
        "opencl:0: expandable segments need virtual memory (reserving address space and mapping "
        "pages into it), which the 'opencl' backend does not have; using normal segments"
    ]
    stats = on_opencl.memory_stats  # ordinary segments, one device malloc each
    assert stats["segment.all.peak"] > 0 and stats["num_device_alloc"] == on_opencl.num_device_alloc


def test_impossible_requests_and_capacities(tmp_path: Path) -> None:
    path = tmp_path / "huge.jsonl.gz"
    write(path, [TraceEvent("alloc", 4096, 1 << 61, 0), TraceEvent("alloc", 8192, 100, 0)])
    report = replay(load(path))
    assert [(o.event, o.requested_bytes) for o in report.ooms] == [(0, 1 << 61)]
    assert report.num_ooms == 1 and report.peak_requested_bytes == 100


def test_replay_takes_a_real_pytorch_alloc_conf(capsys: pytest.CaptureFixture[str]) -> None:
    """Keys the policy does not depend on (backend, pinned_*) are reported and left out."""
    conf = "backend:native,expandable_segments:True,pinned_use_background_threads:True"
    assert main(["replay", str(EXAMPLE), "--device", "sim", "--json", "--config", conf]) == 0
    captured = capsys.readouterr()
    assert json.loads(captured.out)["config"] == "expandable_segments:True"
    assert captured.err == (
        f"accelrt: ignored in {repr(conf)[:57]}...: backend:native, "
        "pinned_use_background_threads:True (the device allocator's policy does not depend on "
        "them)\n"
    )


def test_replay_defaults_to_accelrt_alloc_conf(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("ACCELRT_ALLOC_CONF", "max_split_size_mb:64")
    assert main(["replay", str(EXAMPLE), "--device", "sim", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["config"] == "max_split_size_mb:64"
    assert main(["replay", str(EXAMPLE), "--device", "sim", "--json", "--config", ""]) == 0
    assert json.loads(capsys.readouterr().out)["config"] == "defaults"  # --config wins
    monkeypatch.setenv("ACCELRT_ALLOC_CONF", "bogus:1")
    assert main(["replay", str(EXAMPLE), "--device", "sim"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("accelrt replay: error: ACCELRT_ALLOC_CONF: unknown allocator setting")
    assert err.count("\n") == 1


def test_short_setting_forms() -> None:
    from accelrt.cli import _short_setting

    full = "roundup_power2_divisions:[" + ",".join(
        f"{1 << i}:{1 if i <= 8 else min(8, 2 ** (i - 8))}" for i in range(16)
    )
    assert _short_setting(full + "]") == "roundup:[..256:1,512:2,1024:4,2048..:8]"
    assert _short_setting("expandable_segments:True") == "expandable"
    assert _short_setting("max_split_size_mb:128,expandable_segments:True") == (
        "max_split:128, expandable"
    )
    assert _short_setting("garbage_collection_threshold:0.6,per_process_memory_fraction:0.5") == (
        "gc:0.6, fraction:0.5"
    )
    assert _short_setting("max_non_split_rounding_mb:4,release_lock_on_malloc:True") == (
        "non_split_rounding:4, release_lock"
    )
    assert _short_setting("defaults") == "defaults"
    assert _short_setting("some_future_key_with_a_long_name:12345") == (
        "some_future_key_with_a_lo..."
    )


def test_comparison_table_heads_are_short_and_nothing_wraps_in_a_pipe(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("COLUMNS", "40")  # a narrow terminal setting does not apply to a pipe
    roundup = "roundup_power2_divisions:[256:1,512:2,1024:4,>:8]"
    argv = ["replay", str(EXAMPLE), "--device", "sim", "--config", "",
            "--config", "expandable_segments:True,max_split_size_mb:128",
            "--config", roundup + ",garbage_collection_threshold:0.6"]  # fmt: skip
    assert main(argv) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == (
        "transformer_train on sim:0 (80.00 GiB): 6141 events (device view, 0 host events "
        "skipped); trace peak live 341293844 bytes (325.48 MiB)"
    )
    assert lines[1:4] == [
        "┏━━━━━━━━━━━━━━━━┳━━━━━━━━━━━━┳━━━━━━━━━━━━━━━━━━━━━━━━━━━┳"
        "━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━┓",
        "┃                ┃   defaults ┃ max_split:128, expandable ┃"
        " roundup:[..256:1,512:2,1024:4,2048..:8], gc:0.6 ┃",
        "┡━━━━━━━━━━━━━━━━╇━━━━━━━━━━━━╇━━━━━━━━━━━━━━━━━━━━━━━━━━━╇"
        "━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━┩",
    ]
    assert lines[4] == (
        "│ peak requested │ 325.48 MiB │                325.48 MiB │"
        "                                      325.48 MiB │"
    )
    legend = lines.index("Column heads in full:")
    assert lines[legend + 1 : legend + 4] == [
        "  max_split:128, expandable = max_split_size_mb:128,expandable_segments:True",
        "  roundup:[..256:1,512:2,1024:4,2048..:8], gc:0.6 = roundup_power2_divisions:[1:1,2:1,"
        "4:1,8:1,16:1,32:1,64:1,128:1,256:1,512:2,1024:4,2048:8,4096:8,8192:8,16384:8,32768:8],"
        "garbage_collection_threshold:0.6",
        "[defaults] peak requested 341293844 bytes equals the trace's peak live 341293844 bytes; "
        "peak reserved 362807296 bytes",
    ]
    assert lines[legend + 4].startswith("[max_split_size_mb:128,expandable_segments:True] peak")
    assert lines[legend + 4].endswith("; peak reserved 530579456 bytes")


def _two_device_snapshot(path: Path) -> Path:
    """A snapshot whose devices 0 and 1 both recorded history (device 1: twice the sizes)."""
    import pickle

    import accelrt as acc

    acc.backends.use("sim")
    acc.record_memory_history()
    blocks = [acc.empty(n) for n in (MiB, 5 * MiB)]
    blocks[0].free()
    acc.dump_snapshot(path)
    blocks[1].free()
    data = pickle.loads(path.read_bytes())
    doubled = [dict(e, size=2 * e["size"]) for e in data["device_traces"][0]]
    data["device_traces"] = [data["device_traces"][0], doubled]
    data["segments"] += [dict(s, device=1) for s in data["segments"]]
    path.write_bytes(pickle.dumps(data))
    return path


def test_device_index_means_the_same_in_replay_and_snapshot(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from accelrt.cli import build_parser

    snap = _two_device_snapshot(tmp_path / "two.pickle")
    page = tmp_path / "p.html"
    commands = {
        "replay": ["replay", str(snap), "--no-progress"],
        "summary": ["snapshot", "summary", str(snap)],
        "segments": ["snapshot", "segments", str(snap)],
        "view": ["snapshot", "view", str(snap), "-o", str(page)],
        "diff": ["snapshot", "diff", str(snap), str(snap)],
    }
    helps = set()
    for argv in commands.values():
        parser = build_parser()
        sub = parser._subparsers._group_actions[0].choices[argv[0]]  # type: ignore[union-attr]
        if argv[0] == "snapshot":
            sub = sub._subparsers._group_actions[0].choices[argv[1]]  # type: ignore[union-attr]
        [action] = [a for a in sub._actions if "--device-index" in a.option_strings]
        helps.add((action.help, action.default))
    assert helps == {
        ("snapshots: the recorded device to read, N of device_traces[N] (default: 0)", None)
    }
    for argv in commands.values():  # the same one-line error out of range
        assert main([*argv, "--device-index", "2"]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1
        assert err.endswith(
            f": error: --device-index 2 is out of range [0, 2) for {snap}; choose a device the "
            "snapshot recorded\n"
        )
    # default 0: with two devices recorded, nothing asks to choose
    for index, live in (([], "6.00 MiB"), (["--device-index", "0"], "6.00 MiB"),
                        (["--device-index", "1"], "12.00 MiB")):  # fmt: skip
        assert main([*commands["replay"], *index]) == 0
        out = capsys.readouterr().out
        assert f"_dev{(index or ['', '0'])[1]} on sim:0" in out
        assert main([*commands["summary"], *index]) == 0
        out = capsys.readouterr().out
        assert f"(recorded device {(index or ['', '0'])[1]})" in out and live in out
    assert main([*commands["view"], "--device-index", "1"]) == 0
    assert main([*commands["diff"], "--device-index", "1"]) == 0
    assert main([*commands["segments"], "--device-index", "1"]) == 0
