"""``accelrt sweep`` / ``accelrt.sweep``: equal to single replays on every Dask scheduler (local
ones and a ``LocalCluster``), the capacity search, the fleet summary, outputs and bad input."""

from __future__ import annotations

import contextlib
import csv
import io
import json
import multiprocessing
import os
import pickle
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

import accelrt as acc
from accelrt import _sweep, cli
from accelrt._sweep import GRANULARITY, SweepResults, _plan, _schedule, _worker, parse_grid, sweep
from accelrt.replay import replay
from accelrt.testing import reset_runtime
from accelrt.trace import TraceEvent, load, write

pytest.importorskip("dask.distributed", reason="the sweep needs Dask (the test extra has it)")

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "traces" / "transformer_train.jsonl.gz"
MiB = 1 << 20
CONFIGS = ["defaults", "expandable_segments:True", "max_split_size_mb:20"]
CAPACITIES = [None, 300 * MiB]
_TIMING = ("wall_seconds", "events_per_second")


@pytest.fixture(scope="module")
def traces(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """The shipped example, a small JSONL trace, a snapshot pickle (with its recorded
    settings), and one whose smallest capacity is below its unlimited peak reserved."""
    folder = tmp_path_factory.mktemp("traces")
    small = folder / "small.jsonl.gz"
    events = [TraceEvent("alloc", i, (3 + i) * MiB + 1000 * i, i % 2) for i in range(8)]
    events += [TraceEvent("free", i, 0, 0) for i in (1, 3, 5)]
    events += [TraceEvent("alloc", 20 + i, 700 * 1024, 0) for i in range(6)]
    events += [TraceEvent("empty_cache", 0, 0, 0), TraceEvent("alloc", 40, 50 * MiB, 1)]
    write(small, events, {"name": "small"})
    # a 2 MiB request takes a 20 MiB segment; once it is free, a 30 MiB request needs a new
    # segment (50 MiB reserved), unless the device is too small: then the cache is released
    squeeze = folder / "squeeze.jsonl.gz"
    write(
        squeeze,
        [
            TraceEvent("alloc", 1, 2 * MiB, 0),
            TraceEvent("free", 1, 0, 0),
            TraceEvent("alloc", 2, 30 * MiB, 0),
        ],
        {"name": "squeeze"},
    )
    snapshot = folder / "run.pickle"
    with _recording(settings="max_split_size_mb:40"):
        blocks = [acc.empty(n) for n in (5 * MiB, 700, 25 * MiB, 3 * MiB)]
        acc.record_memory_history()
        blocks[0].free()
        blocks.append(acc.empty(12 * MiB, stream=acc.Stream()))
        acc.empty_cache()
        blocks.append(acc.empty(30 * MiB))
        acc.dump_snapshot(snapshot)
    return {"example": str(EXAMPLE), "small": str(small), "snapshot": str(snapshot),
            "squeeze": str(squeeze)}  # fmt: skip


@contextlib.contextmanager
def _recording(settings: str) -> Iterator[None]:
    acc.backends.use("sim")
    acc.set_allocator_settings(settings)
    try:
        yield
    finally:
        reset_runtime()


def _replay_cli(path: str, config: str | None, capacity: int | None) -> dict[str, Any]:
    """What ``accelrt replay PATH --device sim --json [--config C] [--capacity N]`` prints."""
    argv = ["replay", path, "--device", "sim", "--json", "--no-progress"]
    if config is not None:
        argv += ["--config", "" if config == "defaults" else config]
    if capacity is not None:
        argv += ["--capacity", str(capacity)]
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert cli.main(argv) == 0
    report: dict[str, Any] = json.loads(out.getvalue())
    return report


@pytest.fixture(scope="module")
def expected(traces: dict[str, str]) -> dict[tuple[str, str, int | None], dict[str, Any]]:
    """Single ``accelrt replay`` runs of every combination, keyed by (trace, config, capacity)."""
    runs = {}
    for path in (traces["example"], traces["small"], traces["snapshot"]):
        configs: list[str] = list(CONFIGS)
        if path.endswith(".pickle"):
            configs.insert(0, "recorded")
        for config in configs:
            for capacity in CAPACITIES:
                flag = None if config == "recorded" else config
                runs[path, config, capacity] = _replay_cli(path, flag, capacity)
    return runs


def _same_as_replay(
    results: SweepResults, expected: dict[tuple[str, str, int | None], dict[str, Any]]
) -> None:
    assert [(r.trace, r.config, r.capacity) for r in results] == list(expected)
    for r in results:
        assert r.error is None, r.error
        row = r.to_dict()
        single = expected[r.trace, r.config, r.capacity]
        assert row["name"] == single["trace"] and row["settings"] == single["config"]
        for key, value in single.items():
            if key == "config_source" and value == "--config":
                value = "configs"  # given to sweep() as configs, to replay as --config
            if key not in ("trace", "config", *_TIMING):
                assert row[key] == value, (r.trace, r.config, r.capacity, key)


@pytest.mark.parametrize("scheduler", ["synchronous", "threads", "processes"])
def test_results_equal_single_replays(
    scheduler: str,
    traces: dict[str, str],
    expected: dict[tuple[str, str, int | None], dict[str, Any]],
) -> None:
    paths = [traces["example"], traces["small"], traces["snapshot"]]
    results = sweep(paths, CONFIGS, capacities=CAPACITIES, scheduler=scheduler, num_workers=2)
    _same_as_replay(results, expected)
    assert results.scheduler == scheduler
    assert results.configs == ["recorded", *CONFIGS]
    assert multiprocessing.active_children() == []  # the pool is gone


def test_local_cluster_gives_the_same_results(
    traces: dict[str, str], expected: dict[tuple[str, str, int | None], dict[str, Any]]
) -> None:
    distributed = pytest.importorskip("distributed")
    paths = [traces["example"], traces["small"], traces["snapshot"]]
    with distributed.LocalCluster(
        n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None
    ) as cluster:
        address = cluster.scheduler_address
        results = sweep(paths, CONFIGS, capacities=CAPACITIES, scheduler=address)
        assert results.scheduler == address
        _same_as_replay(results, expected)
        with distributed.Client(cluster) as client:  # a Client of one's own works too
            again = sweep(traces["small"], "defaults", scheduler=client)
        assert again.to_dicts()[0]["peak_reserved_bytes"] == results[6].peak_reserved_bytes


def test_dask_conventions_find_the_cluster(
    traces: dict[str, str],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    # DASK_SCHEDULER_ADDRESS, --scheduler-file, the dashboard link and the version check, as
    # Dask's own Client() has them (issue 25)
    distributed = pytest.importorskip("distributed")
    with distributed.LocalCluster(
        n_workers=1,
        threads_per_worker=1,
        processes=False,
        protocol="tcp",
        dashboard_address="127.0.0.1:0",
    ) as cluster:
        address = cluster.scheduler_address
        monkeypatch.setenv("DASK_SCHEDULER_ADDRESS", address)
        assert sweep(traces["small"], "defaults").scheduler == address
        monkeypatch.delenv("DASK_SCHEDULER_ADDRESS")
        scheduler_file = tmp_path / "scheduler.json"
        scheduler_file.write_text(json.dumps({"type": "Scheduler", "address": address}))
        argv = ["sweep", traces["small"], "--scheduler-file", str(scheduler_file), "--json"]
        assert cli.main(argv) == 0
        captured = capsys.readouterr()
        assert json.loads(captured.out)["scheduler"] == address
        assert re.fullmatch(
            r"accelrt sweep: Dask dashboard at http://[\w.]+:\d+/status\n", captured.err
        )

        def mismatched(self: Any, check: bool = False, packages: Any = None) -> Any:
            raise ValueError("Mismatched versions found\n\n| Package | Client | Scheduler |")

        monkeypatch.setattr(distributed.Client, "get_versions", mismatched)
        with pytest.raises(ValueError) as info:
            sweep(traces["small"], scheduler=address)
        assert str(info.value) == (
            f"the Dask scheduler or workers at {address} run other versions than this client; "
            "install the same ones there: Mismatched versions found | Package | Client | "
            "Scheduler |"
        )
    with pytest.raises(FileNotFoundError, match=r"scheduler file .* does not exist"):
        sweep(traces["small"], scheduler_file=tmp_path / "none.json")
    monkeypatch.setenv("DASK_SCHEDULER_ADDRESS", "bogus")
    with pytest.raises(ValueError, match=r"^DASK_SCHEDULER_ADDRESS: unknown scheduler 'bogus'"):
        sweep(traces["small"])


@pytest.mark.skipif(shutil.which("openssl") is None, reason="openssl makes the test's certificate")
def test_a_tls_cluster_gives_the_same_results(traces: dict[str, str], tmp_path: Path) -> None:
    # tls:// with Dask's own TLS settings and a certificate made here (issue 25)
    distributed = pytest.importorskip("distributed")
    import dask
    from distributed.security import Security

    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key),
         "-out", str(cert), "-days", "1", "-subj", "/CN=localhost",
         "-addext", "subjectAltName=IP:127.0.0.1,DNS:localhost"],
        check=True, capture_output=True,
    )  # fmt: skip
    roles = ("scheduler", "worker", "client")
    security = Security(
        tls_ca_file=str(cert),
        require_encryption=True,
        **{f"tls_{role}_{part}": str(path) for role in roles
           for part, path in (("cert", cert), ("key", key))},
    )  # fmt: skip
    paths = [traces["example"], traces["small"]]
    local = sweep(paths, CONFIGS, scheduler="synchronous")
    client_tls = {
        "distributed.comm.tls.ca-file": str(cert),
        "distributed.comm.tls.client.cert": str(cert),
        "distributed.comm.tls.client.key": str(key),
    }
    with (
        distributed.LocalCluster(
            n_workers=2, threads_per_worker=1, processes=False, protocol="tls",
            security=security, dashboard_address=None, host="127.0.0.1",
        ) as cluster,
        dask.config.set(client_tls),
    ):  # fmt: skip
        address = cluster.scheduler_address
        assert address.startswith("tls://")
        remote = sweep(paths, CONFIGS, scheduler=address)
    assert remote.scheduler == address
    assert [r.peak_reserved_bytes for r in remote] == [r.peak_reserved_bytes for r in local]
    assert [r.report and r.report.num_device_alloc for r in remote] == [
        r.report and r.report.num_device_alloc for r in local
    ]


def test_cli_json_has_one_entry_per_combination(
    traces: dict[str, str],
    expected: dict[tuple[str, str, int | None], dict[str, Any]],
    capsys: pytest.CaptureFixture[str],
) -> None:
    argv = ["sweep", traces["small"], traces["snapshot"], "--scheduler", "threads", "--json"]
    argv += [a for c in CONFIGS for a in ("--config", c)]
    assert cli.main([*argv, "--capacity", str(300 * MiB)]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["configs"] == ["recorded", *CONFIGS] and data["capacities"] == [300 * MiB]
    assert len(data["results"]) == 1 * 3 + 1 * 4
    skip = ("trace", "config", *_TIMING)
    for row in data["results"]:
        single = expected[row["trace"], row["config"], row["capacity"]]
        assert set(single) - {"trace", "config"} <= set(row)
        assert {k: v for k, v in row.items() if k in single and k not in skip} == {
            k: v for k, v in single.items() if k not in skip
        }
    assert [s["rank"] for s in data["summary"]] == [1, 2, 3, 4]
    assert data["winner"]["config"] != "recorded"


def test_find_capacity_is_the_smallest_that_fits(traces: dict[str, str]) -> None:
    results = sweep(
        [traces["squeeze"], traces["example"]],
        ["defaults", "expandable_segments:True"],
        find_capacity=True,
        scheduler="synchronous",
    )
    squeeze = results[0]
    assert squeeze.peak_reserved_bytes == 50 * MiB  # unlimited: the 20 MiB segment stays cached
    assert squeeze.min_capacity_bytes == 30 * MiB  # the cache is released before an OOM
    for r in results:
        assert r.min_capacity_bytes is not None and r.min_capacity_bytes % GRANULARITY == 0
        trace = load(r.trace)
        config = "" if r.config == "defaults" else r.config
        fits = replay(trace, capacity=r.min_capacity_bytes, config=config)
        assert fits.num_ooms == 0
        less = replay(trace, capacity=r.min_capacity_bytes - GRANULARITY, config=config)
        assert less.num_ooms > 0
    assert [r.min_capacity_bytes for r in results[2:]] == [346 * MiB, 346 * MiB]


def test_find_capacity_beyond_a_petabyte(tmp_path: Path) -> None:
    # A request of 3 PiB: find-capacity answered "never" above 1 PiB, while a replay with a
    # larger --capacity ran it without an OOM (issue 26).
    path = str(tmp_path / "huge.jsonl.gz")
    write(path, [TraceEvent("alloc", 1, 3 << 50, 0), TraceEvent("free", 1, 0, 0)], {})
    (row,) = sweep([path], ["defaults"], find_capacity=True, scheduler="synchronous")
    assert row.min_capacity_bytes == 3 << 50
    assert replay(load(path), capacity="3PiB").num_ooms == 0
    assert replay(load(path), capacity=(3 << 50) - GRANULARITY).num_ooms == 1
    (never,) = sweep(
        [_one_alloc(tmp_path, (1 << 62) + GRANULARITY)], ["defaults"], find_capacity=True,
        scheduler="synchronous",
    )  # fmt: skip
    assert never.min_capacity_bytes is None and never.report is not None


def _one_alloc(tmp_path: Path, nbytes: int) -> str:
    path = str(tmp_path / f"alloc{nbytes}.jsonl.gz")
    write(path, [TraceEvent("alloc", 1, nbytes, 0)], {})
    return path


def test_fleet_summary_ranks_and_names_the_winner(
    traces: dict[str, str], capsys: pytest.CaptureFixture[str]
) -> None:
    paths = [traces["squeeze"], traces["small"]]
    results = sweep(
        paths, ["defaults", "max_split_size_mb:20"], capacities=["80GiB", "40MiB"],
        find_capacity=True, scheduler="synchronous",
    )  # fmt: skip
    summary = results.summary()
    by_config = {s.config: s for s in summary}
    for config, s in by_config.items():
        rows = [r for r in results if r.config == config and r.capacity == 80 << 30]
        assert s.total_peak_reserved_bytes == sum(r.peak_reserved_bytes or 0 for r in rows)
        assert s.total_min_capacity_bytes == sum(r.min_capacity_bytes or 0 for r in rows)
        assert s.fits == ((80 << 30, 2), (40 * MiB, 1))  # small's 50 MiB request cannot fit
        assert s.traces == 2 and s.errors == 0 and s.unfit == 0
    assert [s.rank for s in summary] == [1, 2]
    winner = results.winner()
    assert winner == summary[0]
    assert results.best(paths[0]) is not None
    assert cli.main(["sweep", *paths, "--config", "max_split_size_mb:20", "--scheduler",
                     "synchronous", "--find-capacity"]) == 0  # fmt: skip
    out = capsys.readouterr().out
    assert "fleet summary: 2 traces" in out
    assert out.rstrip().splitlines()[-1] == (
        "export PYTORCH_CUDA_ALLOC_CONF=max_split_size_mb:20   # or "
        "ACCELRT_ALLOC_CONF=max_split_size_mb:20"
    )


def test_grid_and_configs(traces: dict[str, str]) -> None:
    assert parse_grid("roundup_power2_divisions=[256:1,>:4],8") == (
        "roundup_power2_divisions",
        ["[256:1,>:4]", "8"],
    )
    results = sweep(
        traces["squeeze"],
        ["", "expandable_segments:False"],  # the same setting twice: tried once
        grid={"max_split_size_mb": [20, 40], "expandable_segments": [True, False]},
        scheduler="synchronous",
    )
    assert results.configs == [
        "defaults",
        "max_split_size_mb:20,expandable_segments:True",
        "max_split_size_mb:20",
        "max_split_size_mb:40,expandable_segments:True",
        "max_split_size_mb:40",
    ]
    assert [r.config for r in results] == results.configs


def test_urls_are_read_through_fsspec(traces: dict[str, str]) -> None:
    fsspec = pytest.importorskip("fsspec")
    fs = fsspec.filesystem("memory")
    for name in ("small", "snapshot"):
        fs.pipe(f"/sweep/{name}.bin", Path(traces[name]).read_bytes())
    urls = ["memory://sweep/small.bin", "memory://sweep/snapshot.bin", "file://" + traces["small"]]
    results = sweep(urls, "defaults", scheduler="synchronous")
    local = sweep([traces["small"], traces["snapshot"]], "defaults", scheduler="synchronous")
    assert [(r.trace, r.config) for r in results] == [
        (urls[0], "defaults"), (urls[1], "recorded"), (urls[1], "defaults"), (urls[2], "defaults")
    ]  # fmt: skip
    assert [r.peak_reserved_bytes for r in results] == [
        local[0].peak_reserved_bytes, local[1].peak_reserved_bytes,
        local[2].peak_reserved_bytes, local[0].peak_reserved_bytes,
    ]  # fmt: skip
    assert results[0].name == "small"  # the header's name, not the temporary file's


def test_failing_traces_are_reported_in_their_rows(
    tmp_path: Path, traces: dict[str, str], capsys: pytest.CaptureFixture[str]
) -> None:
    missing = str(tmp_path / "missing.jsonl.gz")
    text = tmp_path / "notes.txt"
    text.write_text("not a trace\n")
    malformed = tmp_path / "malformed.pickle"
    malformed.write_bytes(pickle.dumps({"segments": [{"blocks": 3}], "device_traces": [[]]}))
    bad = [missing, str(text), str(malformed)]
    results = sweep([*bad, traces["small"]], ["defaults", "expandable_segments:True"],
                    scheduler="processes", num_workers=2)  # fmt: skip
    assert [r.ok for r in results] == [False] * 7 + [True] * 2
    assert results[0].error == (
        f"{missing}: No such file or directory; give an accelrt trace (.jsonl.gz) or a PyTorch "
        "snapshot pickle"
    )
    assert results[2].error == (
        f"{text} is neither an accelrt trace (JSON Lines, maybe gzip'd, whose first line is a "
        "header object) nor a PyTorch snapshot pickle (protocol 2 or later)"
    )
    # the same line as `accelrt replay` prints for it
    assert cli.main(["replay", str(malformed), "--json"]) == 2
    err = capsys.readouterr().err.strip()
    assert results[4].error == err.removeprefix("accelrt replay: error: ")
    assert results[4].config == "recorded" and results[5].config == "defaults"
    assert results.to_dicts()[0]["peak_reserved_bytes"] is None
    assert [s.errors for s in results.summary()] == [3, 3, 1]
    argv = ["sweep", *bad, traces["small"], "--scheduler", "synchronous", "--json"]
    assert cli.main(argv) == 1  # a trace failed: its rows say why
    data = json.loads(capsys.readouterr().out)
    assert [row["error"] is None for row in data["results"]] == [False] * 4 + [True]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
    return port


def _fails_in_one_line(capsys: pytest.CaptureFixture[str], argv: list[str]) -> str:
    assert cli.main(argv) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.count("\n") == 1
    return captured.err.rstrip("\n")


def test_unreachable_scheduler_is_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    address = f"tcp://127.0.0.1:{_free_port()}"
    err = _fails_in_one_line(capsys, ["sweep", str(EXAMPLE), "--scheduler", address])
    assert err == (
        f"accelrt sweep: error: cannot reach the Dask scheduler at {address} within 5 s; check "
        "the address, or start one there with `dask scheduler`"
    )
    with pytest.raises(ConnectionError, match=f"^cannot reach the Dask scheduler at {address} "):
        sweep(EXAMPLE, scheduler=address, connect_timeout=0.5)


def _serve(handler: Callable[[socket.socket], None]) -> tuple[str, socket.socket]:
    """A server on a free port whose connections ``handler`` answers, in a thread."""
    server = socket.create_server(("127.0.0.1", 0))

    def run() -> None:
        with contextlib.suppress(OSError):
            while True:
                conn, _ = server.accept()
                handler(conn)

    threading.Thread(target=run, daemon=True).start()
    return f"tcp://127.0.0.1:{server.getsockname()[1]}", server


def _http(conn: socket.socket) -> None:
    with conn:
        conn.recv(1024)  # an HTTP server waits for the request first
        conn.sendall(b"HTTP/1.0 200 OK\r\nContent-Length: 0\r\n\r\n")


@pytest.mark.parametrize(
    ("handler", "answered"),
    [
        (_http, "an HTTP server answered ('HTTP/1.0 200 OK'): the Dask dashboard listens on 8787"),
        (lambda conn: conn.sendall(b"SSH-2.0-OpenSSH_9.6\r\n"),
         "something answered with b'SSH-2.0-OpenSSH_9.6\\r\\n', not Dask's handshake"),
        (lambda conn: None, "something accepted the connection but sent nothing within 2 s"),
    ],
)  # fmt: skip
def test_a_server_that_is_not_dask_is_refused_within_the_timeout(
    handler: Callable[[socket.socket], None], answered: str
) -> None:
    # `accelrt sweep --scheduler` at the dashboard's port waited for ever (issue 25).
    address, server = _serve(handler)
    outcome: list[BaseException] = []

    def run() -> None:
        try:
            sweep(EXAMPLE, scheduler=address, connect_timeout=2)
        except BaseException as exc:
            outcome.append(exc)

    with server:
        thread = threading.Thread(target=run, daemon=True)
        thread.start()
        thread.join(60)  # a hang fails the test instead of stopping the suite
    assert not thread.is_alive()
    (error,) = outcome
    assert isinstance(error, ConnectionError)
    assert str(error) == (
        f"{address} is not a Dask scheduler: {answered}; give the scheduler's own address "
        "(tcp://HOST:8786 by default, printed by `dask scheduler`)"
    )


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--config", "foo:1"], "argument --config: unknown allocator setting 'foo'; known "
         "settings: max_split_size_mb, max_non_split_rounding_mb, large_segment_size_mb, "
         "roundup_power2_divisions, "
         "garbage_collection_threshold, expandable_segments, per_process_memory_fraction, "
         "release_lock_on_malloc, throw_on_cudamalloc_oom, policy (in 'foo:1') "
         "(see 'accelrt sweep --help')"),
        (["--grid", "max_split_size_mb=128,1"], "max_split_size_mb must be an integer >= 20 "
         "(MiB), got '1'; allowed: ASCII digits, 20 to 1099511627776 (2**40) (in grid setting "
         "'max_split_size_mb:1')"),
        (["--grid", "max_split_size_mb"], "argument --grid: a grid is KEY=V1,V2,..., such as "
         "max_split_size_mb=128,256; got 'max_split_size_mb' (see 'accelrt sweep --help')"),
        (["--scheduler", "cluster"], "unknown scheduler 'cluster': give processes, threads, "
         "synchronous or the address of a dask.distributed scheduler, tcp://HOST:PORT"),
        (["--scheduler", "tcp://localhost"], "invalid scheduler address 'tcp://localhost': "
         "expected tcp://HOST:PORT with a port from 1 to 65535, such as tcp://127.0.0.1:8786"),
        (["--capacity", "0"], "capacity 0 holds nothing; give a size such as 80GiB"),
        (["--workers", "0"], "argument --workers: the number of workers must be a whole number "
         ">= 1, got '0' (see 'accelrt sweep --help')"),
        (["--json", "--csv", "out.csv"], "argument --csv: not allowed with argument --json "
         "(see 'accelrt sweep --help')"),
    ],
)  # fmt: skip
def test_bad_input_is_refused_before_any_work(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, argv: list[str],
    message: str,
) -> None:  # fmt: skip
    def no_work(*args: object) -> None:
        raise AssertionError("work started")

    monkeypatch.setattr(_schedule, "_run_batch", no_work)
    monkeypatch.setattr(_sweep, "_connect", no_work)
    err = _fails_in_one_line(capsys, ["sweep", str(EXAMPLE), *argv])
    assert err.split(": error: ", 1)[1] == message


def test_bad_library_arguments() -> None:
    with pytest.raises(ValueError, match=r"^unknown allocator setting 'foo'; .* \(in setting "):
        sweep(EXAMPLE, {"foo": 1})
    with pytest.raises(ValueError, match=r"^no traces given; give at least one path or URL$"):
        sweep([])
    with pytest.raises(ValueError, match=r"^a trace name is empty \(' '\); give a path or a URL$"):
        sweep(" ")
    with pytest.raises(TypeError, match=r"^a trace must be a path or a URL \(str\), got 3$"):
        sweep([3])  # type: ignore[list-item]
    with pytest.raises(ValueError, match=r"^num_workers must be a whole number >= 1, got 0$"):
        sweep(EXAMPLE, num_workers=0)
    with pytest.raises(TypeError, match=r"^grid 'max_split_size_mb': give a list of values"):
        sweep(EXAMPLE, grid={"max_split_size_mb": "128"})


def test_outputs_csv_parquet_png_and_tables(
    tmp_path: Path, traces: dict[str, str], capsys: pytest.CaptureFixture[str]
) -> None:
    table = tmp_path / "sweep.csv"
    base = ["sweep", traces["small"], traces["squeeze"], "--scheduler", "synchronous"]
    base += ["--config", "defaults", "--config", "expandable_segments:True"]
    assert cli.main([*base, "--csv", str(table), "--png", str(tmp_path / "p.png")]) == 0
    out = capsys.readouterr().out
    assert "small" in out and "squeeze" in out and "winner: " in out
    with open(table, newline="") as f:
        rows = list(csv.DictReader(f))
    assert [(Path(r["trace"]).name, r["config"]) for r in rows] == [
        ("small.jsonl.gz", "defaults"), ("small.jsonl.gz", "expandable_segments:True"),
        ("squeeze.jsonl.gz", "defaults"), ("squeeze.jsonl.gz", "expandable_segments:True"),
    ]  # fmt: skip
    assert rows[2]["peak_reserved_bytes"] == str(50 * MiB)
    assert (tmp_path / "p.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    pq = pytest.importorskip("pyarrow.parquet")
    parquet = tmp_path / "sweep.parquet"
    assert cli.main([*base, "--parquet", str(parquet)]) == 0
    assert pq.read_table(parquet).column("peak_reserved_bytes").to_pylist()[2] == 50 * MiB
    pytest.importorskip("pandas")
    frame = sweep(traces["squeeze"], scheduler="synchronous").to_pandas()
    assert frame.loc[0, "peak_reserved_bytes"] == 50 * MiB and len(frame) == 1


def test_progress_counts_combinations(traces: dict[str, str]) -> None:
    calls: list[tuple[int, int]] = []
    sweep(
        [traces["small"], traces["snapshot"]],
        ["defaults", "expandable_segments:True"],
        capacities=[None, "1GiB"],
        scheduler="synchronous",
        progress=lambda done, total: calls.append((done, total)),
    )
    assert calls[0] == (0, 4 + 6) and calls[-1] == (10, 10)
    assert [d for d, _ in calls] == sorted(d for d, _ in calls)


def test_interrupt_stops_the_workers(
    traces: dict[str, str], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def interrupt(self: object, key: object, rows: object) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(_schedule._Counter, "done", interrupt)
    argv = ["sweep", traces["example"], traces["small"], "--workers", "2", "--no-progress"]
    assert cli.main(argv) == 130
    assert capsys.readouterr().err == "accelrt: interrupted\n"
    assert multiprocessing.active_children() == []


def test_ctrl_c_in_a_terminal_exits_130_without_tracebacks(traces: dict[str, str]) -> None:
    # Ctrl-C reaches the whole foreground process group: the command and its workers
    script = Path(sys.executable).with_name("accelrt")  # the command as installed
    command = [str(script)] if script.exists() else [sys.executable, "-m", "accelrt.cli"]
    argv = [*command, "sweep", traces["example"], "--find-capacity",
            "--grid", "max_split_size_mb=" + ",".join(str(n) for n in range(20, 60)),
            "--workers", "2", "--no-progress"]  # fmt: skip
    # the Python core, so that the sweep is surely still running when Ctrl-C comes (the
    # compiled core can finish it within the 2 s)
    env = {**os.environ, "ACCELRT_PURE_PYTHON": "1"}
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True, env=env)  # fmt: skip
    time.sleep(2)  # let it start its workers (an earlier Ctrl-C is handled the same way)
    os.killpg(proc.pid, signal.SIGINT)
    out, err = proc.communicate(timeout=60)
    assert (proc.returncode, out, err) == (130, "", "accelrt: interrupted\n")


def test_import_accelrt_does_not_import_dask() -> None:
    code = (
        "import sys, accelrt\n"
        "assert 'dask' not in sys.modules and 'accelrt._sweep' not in sys.modules\n"
        "assert callable(accelrt.sweep) and 'accelrt._sweep' not in sys.modules\n"
        "try:\n"
        "    accelrt.sweep([])\n"
        "except ValueError as exc:\n"
        "    print(exc)\n"
        "print(accelrt.sweep.__module__)"  # the first call put the real function in place
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.splitlines() == [
        "no traces given; give at least one path or URL",
        "accelrt._sweep",
    ]
    # a module __getattr__ would stop CPython specializing every accelrt.<name> load
    assert "__getattr__" not in vars(acc)


def test_every_recorded_device_is_swept_and_ranked(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from test_replay_cli import recorded_on_two_devices

    snap = str(recorded_on_two_devices(tmp_path / "two.pickle"))
    results = sweep(snap, ["defaults", "expandable_segments:True"], scheduler="synchronous")
    rows = [(r.name, r.recorded_device, r.config, r.config_source, r.peak_reserved_bytes)
            for r in results]  # fmt: skip
    assert rows == [
        ("two_dev0", 0, "recorded", "recorded", 22 * MiB),
        ("two_dev0", 0, "defaults", "configs", 22 * MiB),
        ("two_dev0", 0, "expandable_segments:True", "configs", 22 * MiB),
        ("two_dev1", 1, "recorded", "recorded", 50 * MiB),
        ("two_dev1", 1, "defaults", "configs", 50 * MiB),
        ("two_dev1", 1, "expandable_segments:True", "configs", 40 * MiB),
    ]
    assert results.units() == [(snap, 0), (snap, 1)]
    summary = {s.config: (s.rank, s.traces, s.total_peak_reserved_bytes) for s in results.summary()}
    assert summary == {
        "expandable_segments:True": (1, 2, 62 * MiB),
        "recorded": (2, 2, 72 * MiB),
        "defaults": (3, 2, 72 * MiB),
    }
    assert results.best(snap, 1) is results[5]
    only = sweep(snap, "defaults", device_index=1, scheduler="synchronous")
    assert [(r.name, r.recorded_device) for r in only] == [("two_dev1", 1)] * 2
    absent = sweep(snap, "defaults", device_index=5, scheduler="synchronous")
    assert absent[0].error == (
        f"{snap}: device index 5 is out of range: the snapshot has devices 0, 1, with allocation "
        "history on 0, 1; choose one of those"
    )
    argv = ["sweep", snap, "--scheduler", "synchronous"]
    assert cli.main([*argv, "--config", "defaults"]) == 0
    out = capsys.readouterr().out
    assert "fleet summary: 2 traces (1 file: each recorded device counts), best first" in out
    assert out.count("  defaults (from --config)") == 2 and "two_dev1" in out
    monkeypatch.setenv("ACCELRT_ALLOC_CONF", "expandable_segments:True")  # no --config: used
    data = json.loads(_out(capsys, [*argv, "--json"]))
    assert [(r["name"], r["config"], r["config_source"]) for r in data["results"]] == [
        (f"two_dev{d}", c, s)
        for d in (0, 1)
        for c, s in (("recorded", "recorded"),
                     ("expandable_segments:True", "environment ACCELRT_ALLOC_CONF"))
    ]  # fmt: skip


def _out(capsys: pytest.CaptureFixture[str], argv: list[str]) -> str:
    assert cli.main(argv) == 0
    return capsys.readouterr().out


_RESUMED = {
    "configs": CONFIGS,
    "capacities": CAPACITIES,
}  # the sweep the resume tests interrupt: 14 combinations


def _without_timing(results: SweepResults) -> list[dict[str, Any]]:
    return [{k: v for k, v in row.items() if k not in _TIMING} for row in results.to_dicts()]


@pytest.fixture
def replays(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Counts the replays a sweep on this process (synchronous) runs."""
    count = [0]

    def counted(*args: Any, **kwargs: Any) -> Any:
        count[0] += 1
        return replay(*args, **kwargs)

    monkeypatch.setattr(_worker, "replay", counted)
    return count


@pytest.mark.parametrize("cut", [0, 1, 5, 8, 14])
def test_a_resumed_sweep_replays_only_what_the_file_lacks(
    traces: dict[str, str], tmp_path: Path, replays: list[int], cut: int
) -> None:
    paths = [traces["small"], traces["snapshot"]]
    whole = tmp_path / "whole.jsonl"
    full = sweep(paths, **_RESUMED, scheduler="synchronous", results_file=whole)
    lines = whole.read_text().splitlines(keepends=True)
    assert len(lines) == 1 + len(full) == 15
    # killed after `cut` rows, in the middle of writing the next one (a truncated last line)
    part = tmp_path / "part.jsonl"
    part.write_text("".join(lines[: 1 + cut]) + lines[1 + cut][:40] if cut < 14 else "".join(lines))
    replays[0] = 0
    calls: list[tuple[int, int]] = []
    resumed = sweep(paths, **_RESUMED, scheduler="synchronous", results_file=part, resume=True,
                    progress=lambda done, total: calls.append((done, total)))  # fmt: skip
    kept = cut // 2 * 2  # a (trace, setting) is kept whole, at both capacities, or replayed
    assert replays[0] == len(full) - kept
    assert _without_timing(resumed) == _without_timing(full)
    assert sum(r in full for r in resumed) == kept  # the rows kept are the file's, timed as it says
    assert (calls[0], calls[-1]) == ((kept, 14), (14, 14))
    # the file now holds the whole sweep, once: resuming it again replays nothing
    assert len(part.read_text().splitlines()) == 15
    replays[0] = 0
    again = sweep(paths, **_RESUMED, scheduler="synchronous", results_file=part, resume=True)
    assert replays[0] == 0 and again == resumed


def test_an_interrupted_sweep_resumes(
    traces: dict[str, str], tmp_path: Path, replays: list[int]
) -> None:
    paths = [traces["example"], traces["small"], traces["snapshot"]]
    file = tmp_path / "results.jsonl"

    def interrupt(done: int, total: int) -> None:
        if done:  # the first task is done: Ctrl-C
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        sweep(paths, **_RESUMED, scheduler="processes", num_workers=2, results_file=file,
              progress=interrupt)  # fmt: skip
    assert multiprocessing.active_children() == []
    written = len(file.read_text().splitlines()) - 1
    assert 0 < written < 20
    resumed = sweep(paths, **_RESUMED, scheduler="synchronous", results_file=file, resume=True)
    assert replays[0] == 20 - written
    full = sweep(paths, **_RESUMED, scheduler="synchronous")
    assert _without_timing(resumed) == _without_timing(full)


def test_the_command_resumes_with_the_same_output(
    traces: dict[str, str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    file = tmp_path / "results.jsonl"
    argv = ["sweep", traces["small"], traces["snapshot"], "--scheduler", "synchronous",
            "--config", "defaults", "--config", "expandable_segments:True",
            "--results-file", str(file)]  # fmt: skip
    table = _out(capsys, argv)
    assert "small" in table and "winner: " in table
    lines = file.read_text().splitlines(keepends=True)
    file.write_text("".join(lines[:3]) + lines[3][:-1])  # the newline of the last row lost
    assert _out(capsys, [*argv, "--resume"]) == table
    assert _out(capsys, [*argv, "--resume"]) == table  # nothing left to do: the same again
    err = _fails_in_one_line(capsys, argv)  # without --resume, the file is not overwritten
    assert err == (
        f"accelrt sweep: error: {file} already holds sweep results; resume it (--resume, "
        "resume=True) or give a new file"
    )
    fresh = tmp_path / "fresh.jsonl"  # --resume with no file yet starts one
    assert _out(capsys, [*argv[:-1], str(fresh), "--resume"]) == table


def test_a_results_file_of_another_sweep_is_refused(
    traces: dict[str, str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    file = tmp_path / "results.jsonl"
    sweep(traces["small"], ["defaults"], scheduler="synchronous", results_file=file)
    kept = file.read_text()
    argv = ["sweep", traces["small"], "--scheduler", "synchronous", "--results-file", str(file),
            "--resume"]  # fmt: skip
    err = _fails_in_one_line(capsys, [*argv, "--config", "expandable_segments:True"])
    assert err == (
        f"accelrt sweep: error: {file} holds another sweep's results (configs ['defaults'], "
        "this sweep's ['expandable_segments:True']); resume with the same arguments, or give a "
        "new file"
    )
    err = _fails_in_one_line(capsys, [*argv, "--capacity", "1GiB"])
    assert "holds another sweep's results (capacities [None], this sweep's [1073741824])" in err
    assert file.read_text() == kept  # refused before anything was written
    lines = kept.splitlines(keepends=True)
    file.write_text(lines[0] + "not a row\n" + lines[1])
    with pytest.raises(ValueError, match=r"line 2 is not a sweep result \('not a row'\); give"):
        sweep(traces["small"], ["defaults"], results_file=file, resume=True)
    file.write_text('{"name": "small"}\n')
    with pytest.raises(ValueError, match=r"is not an accelrt sweep results file; give another$"):
        sweep(traces["small"], ["defaults"], results_file=file, resume=True)
    with pytest.raises(ValueError, match=r"is not an accelrt sweep results file; give another$"):
        sweep(traces["small"], ["defaults"], results_file=traces["squeeze"])  # not resumed either
    with pytest.raises(ValueError, match=r"^resume needs a results file to continue \("):
        sweep(traces["small"], resume=True)


def test_small_traces_are_batched_into_dask_tasks(traces: dict[str, str], tmp_path: Path) -> None:
    def task(source: str) -> _plan._Task:
        return _plan._Task("id", source, False, None, (), False, (None,), False, None, 1)

    sources = ["a", "b", "big", "c", "s3://bucket/d", "e", "f", "g"]
    sizes = [10, 10, 1000, 10, 0, 10, 10, 10]
    batches, totals = _plan._batches(
        [task(s) for s in sources], sizes, target=2
    )  # 133 bytes a batch
    assert [[t.source for t in b] for b in batches] == [
        ["a", "b"], ["big"], ["c"], ["s3://bucket/d"], ["e", "f", "g"]
    ]  # fmt: skip
    assert totals == [20, 1000, 10, 0, 30]
    calls: list[tuple[int, int]] = []  # 20 Dask tasks before; 2 traces a task now
    many = [shutil.copy(traces[name], tmp_path / f"{i}-{name}.jsonl.gz")
            for i in range(10) for name in ("small", "squeeze")]  # fmt: skip
    results = sweep(many, "defaults", scheduler="processes", num_workers=2,
                    progress=lambda done, total: calls.append((done, total)))  # fmt: skip
    assert [r.peak_reserved_bytes for r in results] == [113246208, 50 * MiB] * 10
    assert calls == [(0, 20), *((2 * i, 20) for i in range(1, 11))]


def test_an_accelrt_only_winner_is_marked_and_pytorchs_best_named(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """policy:accelrt (340 MiB on the example against 346 MiB) wins, but PyTorch cannot use it:
    the sweep says so and names the best setting PyTorch can use."""
    configs = ["defaults", "max_split_size_mb:20", "policy:accelrt"]
    results = sweep([str(EXAMPLE)], configs, scheduler="synchronous")
    winner = results.winner()
    assert winner is not None and winner.config == "policy:accelrt" and winner.accelrt_only
    assert winner.total_peak_reserved_bytes == 340 * MiB
    for_torch = results.winner(pytorch=True)
    assert for_torch is not None and not for_torch.accelrt_only
    data = results.to_json()["winner"]
    assert data["accelrt_only"] is True and data["ACCELRT_ALLOC_CONF"] == "policy:accelrt"
    assert data["PYTORCH_CUDA_ALLOC_CONF"] == for_torch.env_value
    argv = ["sweep", str(EXAMPLE), "--scheduler", "synchronous"]
    for config in configs:
        argv += ["--config", config]
    assert cli.main(argv) == 0
    out = capsys.readouterr().out
    assert "(accelrt only)" in out
    assert "winner: policy:accelrt (accelrt only: PyTorch's allocator has no such policy)" in out
    assert "export ACCELRT_ALLOC_CONF=policy:accelrt" in out
    assert f"best PyTorch can use: {for_torch.config}" in out
    assert out.rstrip().splitlines()[-1] == (
        "for PyTorch, leave PYTORCH_CUDA_ALLOC_CONF unset: the defaults"
    )
