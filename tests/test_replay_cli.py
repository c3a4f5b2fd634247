"""``accelrt replay`` and ``accelrt info``: the shipped real trace, reports, errors, the CLI."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

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
    from accelrt.view import add_categories, picture_moments, render_html, view_of_trace

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
    view = view_of_trace(trace, report)
    add_categories(view)  # the command's page shows the kinds of memory too
    assert page.read_text() == render_html(view)
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
    conf = (
        "backend:native,expandable_segments:True,pinned_use_background_threads:True,"
        "pinned_max_cached_size_mb:64,pinned_max_round_threshold_mb:8"  # PyTorch 2.13's
    )
    assert main(["replay", str(EXAMPLE), "--device", "sim", "--json", "--config", conf]) == 0
    captured = capsys.readouterr()
    assert json.loads(captured.out)["config"] == "expandable_segments:True"
    assert captured.err == (
        "accelrt: ignored in --config: backend:native, pinned_use_background_threads:True, "
        "pinned_max_cached_size_mb:64, pinned_max_round_threshold_mb:8 (the device allocator's "
        "policy does not depend on them)\n"
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
    from accelrt.memory import AllocatorConfig

    def short(text: str) -> str:
        return AllocatorConfig.parse(text).short_label

    full = "roundup_power2_divisions:[" + ",".join(
        f"{1 << i}:{1 if i <= 8 else min(8, 2 ** (i - 8))}" for i in range(16)
    )
    assert short(full + "]") == "roundup:[..256:1,512:2,1024:4,2048..:8]"
    assert short("roundup_power2_divisions:4") == "roundup:4"
    assert short("expandable_segments:True") == "expandable"
    assert short("max_split_size_mb:128,expandable_segments:True") == "max_split:128, expandable"
    assert short("garbage_collection_threshold:0.6,per_process_memory_fraction:0.5") == (
        "gc:0.6, fraction:0.5"
    )
    assert short("max_non_split_rounding_mb:40,release_lock_on_malloc:True") == (
        "non_split_rounding:40, release_lock"
    )
    assert short("defaults") == "defaults"
    assert short("large_segment_size_mb:40") == "large_segment_size_mb:40"
    assert short("large_segment_size_mb:1099511627776") == "large_segment_size_mb:109..."


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


def _two_device_snapshot(path: Path, data: dict[str, Any]) -> Path:
    """``data`` (the ``small_recording``) as a snapshot whose devices 0 and 1 both recorded
    history (device 1: twice the sizes)."""
    import pickle

    doubled = [dict(e, size=2 * e["size"]) for e in data["device_traces"][0]]
    data["device_traces"] = [data["device_traces"][0], doubled]
    data["segments"] += [dict(s, device=1) for s in data["segments"]]
    path.write_bytes(pickle.dumps(data))
    return path


def test_device_index_means_the_same_in_replay_and_snapshot(
    tmp_path: Path, small_recording: dict[str, Any], capsys: pytest.CaptureFixture[str]
) -> None:
    from accelrt.cli import build_parser

    snap = _two_device_snapshot(tmp_path / "two.pickle", small_recording)
    page = tmp_path / "p.html"
    commands = {
        "replay": ["replay", str(snap), "--no-progress"],
        "summary": ["snapshot", "summary", str(snap)],
        "segments": ["snapshot", "segments", str(snap)],
        "view": ["snapshot", "view", str(snap), "-o", str(page)],
        "diff": ["snapshot", "diff", str(snap), str(snap)],
    }
    helps = set()
    for argv in [*commands.values(), ["sweep"]]:
        parser = build_parser()
        sub = parser._subparsers._group_actions[0].choices[argv[0]]  # type: ignore[union-attr]
        if argv[0] == "snapshot":
            sub = sub._subparsers._group_actions[0].choices[argv[1]]  # type: ignore[union-attr]
        [action] = [a for a in sub._actions if "--device-index" in a.option_strings]
        helps.add((action.help, action.default))
    assert helps == {
        (
            "snapshots: only the recorded device N, of device_traces[N] (default: every "
            "recorded device)",
            None,
        )
    }
    for argv in commands.values():  # the same one-line error naming the devices there are
        assert main([*argv, "--device-index", "2"]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1
        assert err.endswith(
            f": error: --device-index 2 is out of range for {snap}: it has devices 0, 1; choose "
            "one of them, or leave --device-index out for all\n"
        )
    # by default every device with history; --device-index N: that one only
    for index, shown in (([], "01"), (["--device-index", "0"], "0"),
                         (["--device-index", "1"], "1")):  # fmt: skip
        assert main([*commands["replay"], *index]) == 0
        out = capsys.readouterr().out
        assert [f"_dev{d} on sim:0" in out for d in "01"] == [d in shown for d in "01"]
        assert main([*commands["summary"], *index]) == 0
        out = capsys.readouterr().out
        assert [f"(recorded device {d})" in out for d in "01"] == [d in shown for d in "01"]
        assert ("Total of 2 recorded devices" in out) == (shown == "01")
    assert main([*commands["view"], "--device-index", "1"]) == 0
    assert main([*commands["diff"], "--device-index", "1"]) == 0
    assert main([*commands["segments"], "--device-index", "1"]) == 0


def recorded_on_two_devices(path: Path) -> Path:
    """A snapshot accelrt recorded on both simulated devices from an empty start. Device 0
    allocates 1 and 5 MiB (a 2 MiB small segment and a 20 MiB one: peak requested 6 MiB,
    reserved 22 MiB); device 1 allocates 3, 30 and 7 MiB (the 7 MiB in the 20 MiB segment of
    the 3 MiB, beside a 30 MiB one: 40 MiB requested, 50 MiB reserved; with expandable
    segments 40 MiB)."""
    import accelrt as acc

    acc.backends.use("sim")
    acc.record_memory_history(device=0)
    acc.record_memory_history(device=1)
    on0 = [acc.empty(n, device=0) for n in (MiB, 5 * MiB)]
    with acc.device_index(1):
        on1 = [acc.empty(n) for n in (3 * MiB, 30 * MiB, 7 * MiB)]
    on0[0].free()
    on1[1].free()
    acc.dump_snapshot(path)
    return path


def _json(capsys: pytest.CaptureFixture[str], argv: list[str]) -> Any:
    assert main(argv) == 0
    return json.loads(capsys.readouterr().out)


def test_replay_takes_every_recorded_device(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from accelrt.trace import read_snapshot, trace_from_snapshot, traces_from_snapshot

    snap = recorded_on_two_devices(tmp_path / "two.pickle")
    traces = traces_from_snapshot(read_snapshot(snap), path=str(snap))
    assert [(t.name, t.recording.device) for t in traces if t.recording] == [
        ("two_dev0", 0), ("two_dev1", 1)
    ]  # fmt: skip
    with pytest.raises(ValueError, match=r"devices \[0, 1\] all have events; choose one"):
        trace_from_snapshot(read_snapshot(snap))  # one device: its contract is unchanged
    assert main(["replay", str(snap), "--no-progress"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [line.split(" on ")[0] for line in lines if " on sim:0 " in line] == [
        "two_dev0", "two_dev1"
    ]  # fmt: skip
    rows = [line.split("│")[1:3] for line in lines if line.startswith("│ setting from")]
    assert [[cell.strip() for cell in row] for row in rows] == [["setting from", "recorded"]] * 2
    assert "two: 2 recorded devices" in lines
    [total] = [line for line in lines if line.startswith("│ total ")]
    assert total.split() == ["│", "total", "│", "46.00", "MiB", "│", "72.00", "MiB", "│"]
    assert lines[-1] == (
        "[recorded] total of 2 devices: peak requested 48234496 bytes, peak reserved 75497472 "
        "bytes; PyTorch recorded 75497472 bytes"
    )
    data = _json(capsys, ["replay", str(snap), "--json"])
    assert data["trace"] == "two" and data["recorded_devices"] == [0, 1]
    assert [
        (r["trace"], r["recorded_device"], r["config_source"], r["peak_requested_bytes"],
         r["peak_reserved_bytes"], r["recorded_peak_reserved_bytes"])
        for r in data["reports"]
    ] == [
        ("two_dev0", 0, "recorded", 6 * MiB, 22 * MiB, 22 * MiB),
        ("two_dev1", 1, "recorded", 40 * MiB, 50 * MiB, 50 * MiB),
    ]  # fmt: skip
    assert data["totals"] == [
        {"config": "recorded", "config_source": "recorded", "devices": 2,
         "peak_requested_bytes": 46 * MiB, "peak_reserved_bytes": 72 * MiB,
         "recorded_peak_reserved_bytes": 72 * MiB},
    ]  # fmt: skip
    both = ["--config", "defaults", "--config", "expandable_segments:True"]
    data = _json(capsys, ["replay", str(snap), "--json", *both])
    assert [r["trace"] for r in data["reports"]] == ["two_dev0"] * 2 + ["two_dev1"] * 2
    totals = [(t["config"], t["config_source"], t["peak_reserved_bytes"]) for t in data["totals"]]
    assert totals == [
        ("defaults", "--config", 72 * MiB), ("expandable_segments:True", "--config", 62 * MiB)
    ]  # fmt: skip
    one = _json(capsys, ["replay", str(snap), "--json", "--device-index", "1"])
    assert (one["trace"], one["recorded_device"], one["peak_reserved_bytes"]) == (
        "two_dev1", 1, 50 * MiB
    )  # fmt: skip
    assert main(["replay", str(snap), "--device-index", "5"]) == 2
    assert capsys.readouterr().err == (
        f"accelrt replay: error: --device-index 5 is out of range for {snap}: it has devices "
        "0, 1; choose one of them, or leave --device-index out for all\n"
    )


def test_snapshot_commands_take_every_recorded_device(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import html
    import re

    snap = recorded_on_two_devices(tmp_path / "two.pickle")
    assert main(["snapshot", "summary", str(snap)]) == 0
    out = capsys.readouterr().out
    assert "(recorded device 0)" in out and "(recorded device 1)" in out
    assert out.endswith(
        "Total of 2 recorded devices: peak requested 48234496 bytes, peak reserved 75497472 "
        "bytes (PyTorch recorded 75497472 bytes).\n"
    )
    assert main(["snapshot", "segments", str(snap)]) == 0
    out = capsys.readouterr().out
    assert "recorded device 0:\n" in out and "\n\nrecorded device 1:\n" in out
    assert out.splitlines()[-1].startswith(
        "total of 2 recorded devices: segments: 4, reserved 72.00 MiB"
    )
    page, png = tmp_path / "page.html", tmp_path / "p.png"
    assert main(["snapshot", "view", str(snap), "-o", str(page), "--png", str(png)]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"wrote {page} (devices 0, 1; ")
    assert out.endswith(f"{tmp_path / 'p_dev0.png'}, {tmp_path / 'p_dev1.png'}\n")
    sections = re.findall(r'<iframe title="([^"]*)" srcdoc="([^"]*)">', page.read_text())
    assert [title for title, _ in sections] == ["two_dev0", "two_dev1"]
    for title, doc in sections:  # each section is that device's whole page
        assert html.unescape(doc).startswith("<!DOCTYPE html>")
        assert f"<title>{title}: memory</title>" in html.unescape(doc)
    assert main(["snapshot", "view", str(snap), "-o", str(page), "--device-index", "1"]) == 0
    assert "<iframe" not in page.read_text() and "<title>two_dev1: memory" in page.read_text()
    capsys.readouterr()
    argv = ["snapshot", "diff", str(snap), "--config", "defaults"]
    assert main([*argv, "--config", "expandable_segments:True"]) == 0
    out = capsys.readouterr().out
    for device in "01":
        assert f"A: two.pickle device {device}, setting from --config (defaults)\n" in out
        assert (
            f"B: two.pickle device {device}, setting from --config (expandable_segments:True)\n"
            in out
        )
    assert out.endswith(
        "Total of 2 recorded devices: peak reserved (replay) A 75497472 bytes (72.00 MiB), B "
        "65011712 bytes (62.00 MiB), B - A -10485760 bytes\n"
    )
    one = tmp_path / "one.pickle"
    one.write_bytes(snap.read_bytes())
    assert main(["snapshot", "diff", str(snap), str(one), "--device-index", "1"]) == 0
    assert "A: two.pickle, setting from recorded (defaults)" in capsys.readouterr().out


def test_defaults_is_a_setting_in_every_command(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["replay", str(EXAMPLE), "--device", "sim", "--json"]
    named = _json(capsys, [*argv, "--config", "defaults"])
    empty = _json(capsys, [*argv, "--config", ""])
    assert (named["config"], named["config_source"]) == ("defaults", "--config")
    assert named["peak_reserved_bytes"] == empty["peak_reserved_bytes"]
    snap = recorded_on_two_devices(tmp_path / "two.pickle")
    outs = []
    for setting in ("defaults", ""):
        argv = ["snapshot", "diff", str(snap), "--config", setting, "--config", setting]
        assert main(argv) == 0
        outs.append(capsys.readouterr().out)
    assert outs[0] == outs[1] and "setting from --config (defaults)" in outs[0]


def test_the_environment_gives_the_setting_when_config_does_not(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["replay", str(EXAMPLE), "--device", "sim", "--json"]

    def setting(*extra: str) -> tuple[str, str]:
        data = _json(capsys, [*argv, *extra])
        return data["config"], data["config_source"]

    assert setting() == ("defaults", "defaults")
    monkeypatch.setenv("PYTORCH_CUDA_ALLOC_CONF", "max_split_size_mb:64")
    assert setting() == ("max_split_size_mb:64", "environment PYTORCH_CUDA_ALLOC_CONF")
    monkeypatch.setenv("PYTORCH_ALLOC_CONF", "expandable_segments:True")  # PyTorch reads it first
    assert setting() == ("expandable_segments:True", "environment PYTORCH_ALLOC_CONF")
    monkeypatch.setenv("ACCELRT_ALLOC_CONF", "")  # empty: as unset
    assert setting() == ("expandable_segments:True", "environment PYTORCH_ALLOC_CONF")
    monkeypatch.setenv("ACCELRT_ALLOC_CONF", "garbage_collection_threshold:0.5")
    assert setting() == ("garbage_collection_threshold:0.5", "environment ACCELRT_ALLOC_CONF")
    assert setting("--config", "defaults") == ("defaults", "--config")  # --config wins
    assert main(["replay", str(EXAMPLE), "--device", "sim"]) == 0
    [row] = [x for x in capsys.readouterr().out.splitlines() if x.startswith("│ setting from")]
    assert row.split("│")[2].strip() == "environment ACCELRT_ALLOC_CONF"
    # a snapshot: the environment before its recorded settings, never silently ignored
    snap = recorded_on_two_devices(tmp_path / "two.pickle")
    monkeypatch.setenv("ACCELRT_ALLOC_CONF", "expandable_segments:True")
    [total] = _json(capsys, ["replay", str(snap), "--json"])["totals"]
    assert (total["config"], total["config_source"], total["peak_reserved_bytes"]) == (
        "expandable_segments:True", "environment ACCELRT_ALLOC_CONF", 62 * MiB
    )  # fmt: skip
    monkeypatch.setenv("PYTORCH_CUDA_ALLOC_CONF", "backend:native,max_split_size_mb:64")
    monkeypatch.delenv("ACCELRT_ALLOC_CONF")
    monkeypatch.delenv("PYTORCH_ALLOC_CONF")
    assert main([*argv, "--no-progress"]) == 0
    assert capsys.readouterr().err == (
        "accelrt: ignored in environment PYTORCH_CUDA_ALLOC_CONF: backend:native (the device "
        "allocator's policy does not depend on them)\n"
    )
    monkeypatch.setenv("PYTORCH_ALLOC_CONF", "bogus:1")
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith(
        "accelrt replay: error: PYTORCH_ALLOC_CONF: unknown allocator setting 'bogus'"
    )
    assert err.endswith("(in 'bogus:1'); fix or unset it\n") and err.count("\n") == 1


def test_the_readmes_policy_example_is_what_replay_prints(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """The README's `policy:accelrt` table rows are the command's own (sim, 80 GiB)."""
    readme = (EXAMPLE.parents[2] / "README.md").read_text()
    block = readme.split("--config expandable_segments:True --config policy:accelrt\n", 1)[1]
    rows = [line.strip() for line in block.split("```", 1)[0].splitlines()[1:] if "│" in line]
    assert len(rows) == 5
    argv = ["replay", str(EXAMPLE), "--device", "sim", "--no-progress"]
    argv += ["--config", "defaults", "--config", "expandable_segments:True"]
    argv += ["--config", "policy:accelrt"]
    assert main(argv) == 0
    out = capsys.readouterr().out
    for row in rows:
        assert row in out
    assert "the best setting tried, policy:accelrt, recovers 6.00 MiB (accelrt only" in out
