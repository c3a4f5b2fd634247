"""accelrt's CUDA backend on a real NVIDIA GPU: docs/cuda.md's verification list, items 2 to 5.

Run on a machine with a GPU, PyTorch, CuPy, Numba (numba-cuda) and cuda-bindings (the test suite,
item 1, is ``python -m pytest``, which adds ``cuda`` to the device fixture there):

- **replay**: every trace in ``--traces`` replayed by ``accelrt replay`` on ``cuda:0`` (really
  allocating) and on ``sim`` under the defaults, ``expandable_segments:True`` and
  ``policy:accelrt``: peak reserved, device mallocs and OOMs must be identical;
- **torch**: a real PyTorch training loop recorded from its first allocation with
  ``torch.cuda.memory._record_memory_history`` under PyTorch's defaults and under
  ``expandable_segments:True``, each snapshot replayed on ``sim`` and ``cuda:0`` under both
  settings: the recorded setting must give PyTorch's ``max_memory_reserved`` to the byte, and the
  other setting is a what-if whose error against PyTorch's own run of that setting is printed;
- **latency**: a cache-hit alloc+free pair (``accelrt.empty(n).free()``) against
  ``torch.cuda.caching_allocator_alloc``/``delete`` and CuPy's ``MemoryPool``, and event record
  and query, stream query, idle synchronize and copies against the raw ``cuda-bindings`` calls,
  as ratios measured in the same process (best of interleaved repeats);
- **interop**: CuPy and Numba computing on accelrt's pool, DLPack and
  ``__cuda_array_interface__`` into PyTorch, CuPy and Numba, PyTorch's ``ExternalStream`` on an
  accelrt stream, and a captured ``Graph`` replayed 100 times (with its DOT dump);
- **vmm**: the VMM granularity against the allocator's 2 MiB and 20 MiB pages, and the cost of
  growing and shrinking an expandable segment by 1 GiB.

Each check prints one line, ``ok`` or ``FAIL`` with the reason; every number goes to
``--out/cuda_verify.json``. Exit status 1 when a check failed.

    python bench/cuda_verify.py --traces DIR --out DIR
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np

MiB = 1 << 20
CONFIGS = ("defaults", "expandable_segments:True", "policy:accelrt")
RESULTS: dict[str, Any] = {}
FAILED: list[str] = []


def check(name: str, ok: bool, detail: str) -> None:
    """Print one check's line and remember a failure."""
    print(f"{'ok  ' if ok else 'FAIL'} {name}: {detail}", flush=True)
    if not ok:
        FAILED.append(name)


def section(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Run one section; an exception fails it and the run goes on to the next."""

    def run(*args: Any) -> None:
        start = time.perf_counter()
        print(f"\n== {fn.__name__} ==", flush=True)
        try:
            RESULTS[fn.__name__] = fn(*args)
        except Exception:
            check(fn.__name__, False, traceback.format_exc())
        print(f"   ({time.perf_counter() - start:.1f} s)", flush=True)

    return run


def replay(trace: Path, device: str, configs: tuple[str, ...] = CONFIGS) -> list[dict[str, Any]]:
    """``accelrt replay --json`` of ``trace`` on ``device`` under ``configs``."""
    args = [sys.executable, "-m", "accelrt", "replay", str(trace), "--device", device]
    for config in configs:
        args += ["--config", config]
    done = subprocess.run(
        [*args, "--json", "--no-progress"], capture_output=True, text=True, check=False
    )
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(args)} exited {done.returncode}: {done.stderr[-2000:]}")
    return list(json.loads(done.stdout))


@section
def environment() -> dict[str, Any]:
    from cuda.bindings import driver

    import accelrt as acc
    from accelrt.memory.device import _core

    info = {"python": sys.version.split()[0], "accelrt_core": _core.CORE}
    for name in ("torch", "cupy", "numba", "cuda.bindings"):
        try:
            info[name] = __import__(name, fromlist=["_"]).__version__
        except Exception as exc:
            info[name] = f"missing ({exc})"
    acc.backends.use("cuda")
    props = acc.get_device_properties(0)
    info["device"] = props.name
    info["total_memory"] = props.total_memory
    info["driver_version"] = props.driver_version
    info["compute_capability"] = props.raw.get("compute_capability")
    _, version = driver.cuDriverGetVersion()
    info["cuDriverGetVersion"] = version
    print(json.dumps(info, indent=1))
    check("cuda is the accelerator", str(acc.current_accelerator()) == "cuda", str(props.name))
    return info


@section
def replays(traces: Path) -> list[dict[str, Any]]:
    files = sorted(traces.glob("*.pickle")) + sorted(traces.glob("*.jsonl.gz"))
    start = time.perf_counter()
    with ThreadPoolExecutor(8) as pool:  # sim replays in parallel; the GPU's one at a time
        on_sim = dict(zip(files, pool.map(lambda trace: replay(trace, "sim"), files), strict=True))
    print(f"   {len(files)} traces on sim in {time.perf_counter() - start:.1f} s")
    keys = ("peak_reserved_bytes", "num_device_alloc", "num_device_free", "num_ooms")
    rows = []
    for trace in files:
        start = time.perf_counter()
        on_gpu = replay(trace, "cuda:0")
        seconds = time.perf_counter() - start
        for sim, gpu in zip(on_sim[trace], on_gpu, strict=True):
            row = {"trace": trace.name, "config": sim["config"], "cuda_seconds": seconds}
            row |= {f"sim_{k}": sim[k] for k in keys} | {f"cuda_{k}": gpu[k] for k in keys}
            row |= {"fragmentation": gpu["fragmentation"], "device": gpu["device"]}
            rows.append(row)
            check(
                f"replay {trace.name} [{sim['config']}]",
                all(sim[k] == gpu[k] for k in keys),
                f"peak reserved sim {sim['peak_reserved_bytes']} cuda "
                f"{gpu['peak_reserved_bytes']}, mallocs {sim['num_device_alloc']}/"
                f"{gpu['num_device_alloc']}, ooms {sim['num_ooms']}/{gpu['num_ooms']}, "
                f"cuda {seconds:.1f} s for 3 settings",
            )
    return rows


TORCH_PROGRAM = r"""
import json, sys, torch
torch.manual_seed(0)
torch.cuda.memory._record_memory_history(max_entries=2_000_000)
layer = torch.nn.TransformerEncoderLayer(1024, 16, 4096, batch_first=True)
model = torch.nn.TransformerEncoder(layer, 8, enable_nested_tensor=False).cuda()
opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
for step in range(24):
    seq = (96, 512, 200, 1024, 333, 768)[step % 6]
    x = torch.randn(12, seq, 1024, device="cuda")
    loss = model(x).float().square().mean()
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    if step % 7 == 6:
        del x, loss
        torch.cuda.empty_cache() if step == 13 else None
torch.cuda.synchronize()
stats = torch.cuda.memory_stats()
torch.cuda.memory._dump_snapshot(sys.argv[1])
print(json.dumps({
    "max_memory_reserved": torch.cuda.max_memory_reserved(),
    "max_memory_allocated": torch.cuda.max_memory_allocated(),
    "num_device_alloc": stats["num_device_alloc"],
    "num_alloc_retries": stats["num_alloc_retries"],
}))
"""


@section
def torch_snapshots(out: Path) -> dict[str, Any]:
    recorded: dict[str, dict[str, Any]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        program = Path(tmp) / "train.py"
        program.write_text(TORCH_PROGRAM)
        for config in ("defaults", "expandable_segments:True"):
            env = dict(os.environ)
            env.pop("PYTORCH_CUDA_ALLOC_CONF", None)
            env.pop("PYTORCH_ALLOC_CONF", None)
            if config != "defaults":
                env["PYTORCH_CUDA_ALLOC_CONF"] = config
            snapshot = out / f"torch_{'expandable' if config != 'defaults' else 'defaults'}.pickle"
            done = subprocess.run(
                [sys.executable, str(program), str(snapshot)],
                capture_output=True,
                text=True,
                env=env,
                check=False,
            )
            if done.returncode != 0:
                raise RuntimeError(done.stderr[-3000:])
            recorded[config] = json.loads(done.stdout.strip().splitlines()[-1])
            recorded[config]["snapshot"] = str(snapshot)
            print(f"   torch {config}: {recorded[config]}")
    rows = []
    for config, torch_run in recorded.items():
        for device in ("sim", "cuda:0"):
            for result in replay(Path(torch_run["snapshot"]), device, tuple(recorded)):
                actual = recorded[result["config"]]["max_memory_reserved"]
                error = result["peak_reserved_bytes"] / actual - 1
                row = {
                    "recorded": config,
                    "device": device,
                    "config": result["config"],
                    "peak_reserved_bytes": result["peak_reserved_bytes"],
                    "torch_max_memory_reserved": actual,
                    "error": error,
                    "num_device_alloc": result["num_device_alloc"],
                    "torch_num_device_alloc": recorded[result["config"]]["num_device_alloc"],
                }
                rows.append(row)
                name = f"torch snapshot [{config}] on {device} as [{result['config']}]"
                detail = (
                    f"accelrt {result['peak_reserved_bytes']} vs PyTorch {actual} "
                    f"({error:+.4%}); device mallocs {result['num_device_alloc']} vs "
                    f"{row['torch_num_device_alloc']}"
                )
                if result["config"] == config:  # the recorded setting: exact
                    check(name, result["peak_reserved_bytes"] == actual, detail)
                else:  # a what-if: reported, not a check
                    print(f"what-if {name}: {detail}")
    return {"torch": recorded, "replays": rows}


def repeat(call: Callable[..., object], *args: object) -> Callable[[int], None]:
    """A timed body: ``call(*args)``, ``n`` times."""

    def body(n: int) -> None:
        for _ in range(n):
            call(*args)

    return body


def best_ns(fn: Callable[[int], None], n: int) -> float:
    """Nanoseconds per iteration of one timed batch of ``n``."""
    start = time.perf_counter_ns()
    fn(n)
    return (time.perf_counter_ns() - start) / n


def compare(
    name: str, variants: dict[str, Callable[[int], None]], n: int, repeats: int = 7
) -> dict[str, float]:
    """Best-of-``repeats`` ns per call of each variant, interleaved; prints ratios to the last."""
    best = dict.fromkeys(variants, float("inf"))
    for fn in variants.values():
        fn(max(n // 10, 1))  # warm
    for _ in range(repeats):
        for key, fn in variants.items():
            best[key] = min(best[key], best_ns(fn, n))
    peer = list(variants)[-1]
    text = ", ".join(f"{k} {v:,.0f} ns ({v / best[peer]:.2f}x)" for k, v in best.items())
    print(f"   {name}: {text}", flush=True)
    return best


@section
def latency() -> dict[str, Any]:
    import cupy
    import torch
    from cuda.bindings import driver

    import accelrt as acc

    acc.backends.use("cuda")
    torch.cuda.init()
    out: dict[str, Any] = {}
    stream = acc.current_stream()
    for size in (512, 4096, MiB):
        acc.empty(size).free()
        pool = cupy.cuda.MemoryPool()
        torch.cuda.caching_allocator_delete(torch.cuda.caching_allocator_alloc(size))

        def ours(n: int, size: int = size) -> None:
            for _ in range(n):
                acc.empty(size).free()

        def cupy_pool(n: int, size: int = size, malloc: Any = pool.malloc) -> None:
            for _ in range(n):
                malloc(size)

        def torch_pair(n: int, size: int = size) -> None:
            alloc, delete = torch.cuda.caching_allocator_alloc, torch.cuda.caching_allocator_delete
            for _ in range(n):
                delete(alloc(size))

        best = compare(
            f"alloc+free {size} B",
            {"accelrt": ours, "cupy": cupy_pool, "torch": torch_pair},
            20_000,
        )
        out[f"pair_{size}"] = best

    # Raw handles in the same (primary) context, on accelrt's current stream.
    raw_stream = driver.CUstream(stream.native_handle)
    _, raw_event = driver.cuEventCreate(driver.CUevent_flags.CU_EVENT_DISABLE_TIMING)
    event = acc.Event()

    def ours_record(n: int) -> None:
        for _ in range(n):
            event.record(stream)
            event.query()

    def raw_record(n: int) -> None:
        for _ in range(n):
            driver.cuEventRecord(raw_event, raw_stream)
            driver.cuEventQuery(raw_event)

    out["event_record_query"] = compare(
        "Event.record+query", {"accelrt": ours_record, "raw": raw_record}, 20_000
    )

    created = acc.Stream()  # a created stream: calls on it check no current context
    raw_created = driver.CUstream(created.native_handle)
    for name, ours, raw in (
        ("Stream.query", repeat(stream.query), repeat(driver.cuStreamQuery, raw_stream)),
        ("Stream.query, created stream", repeat(created.query),
         repeat(driver.cuStreamQuery, raw_created)),
        ("idle Stream.synchronize", repeat(stream.synchronize),
         repeat(driver.cuStreamSynchronize, raw_stream)),
        ("idle Stream.synchronize, created stream", repeat(created.synchronize),
         repeat(driver.cuStreamSynchronize, raw_created)),
    ):  # fmt: skip
        out[name] = compare(name, {"accelrt": ours, "raw": raw}, 20_000)
    out["cuCtxGetCurrent"] = compare(
        "cuCtxGetCurrent (per backend call)",
        {"call": repeat(driver.cuCtxGetCurrent), "loop": repeat(int)},
        50_000,
    )
    for size, n in ((4096, 5000), (MiB, 500), (64 * MiB, 20)):
        host = np.random.default_rng(0).integers(0, 255, size, dtype=np.uint8)
        buffer = acc.empty(size)
        pinned = acc.empty_host(size)
        pinned.numpy()[:] = host

        def ours_copy(n: int, buffer: Any = buffer, host: Any = host) -> None:
            for _ in range(n):
                acc.copy_(buffer, host)
                stream.synchronize()

        def ours_pinned(n: int, buffer: Any = buffer, pinned: Any = pinned) -> None:
            for _ in range(n):
                acc.copy_(buffer, pinned)
                stream.synchronize()

        def raw_copy(n: int, buffer: Any = buffer, host: Any = host, size: int = size) -> None:
            dst, src = driver.CUdeviceptr(buffer.ptr), host.ctypes.data
            for _ in range(n):
                driver.cuMemcpyHtoDAsync(dst, src, size, raw_stream)
                driver.cuStreamSynchronize(raw_stream)

        best = compare(
            f"h2d copy+sync {size} B",
            {"accelrt": ours_copy, "accelrt_pinned": ours_pinned, "raw": raw_copy},
            n,
        )
        best["GB_per_s"] = {k: size / v for k, v in best.items()}
        out[f"h2d_{size}"] = best
        back = np.empty_like(host)
        acc.copy_(back, buffer)
        stream.synchronize()
        check(f"h2d+d2h {size} B round-trips", bool((back == host).all()), "data equal")
        buffer.free()
    driver.cuEventDestroy(raw_event)
    return out


@section
def numba_plugin() -> dict[str, Any]:
    import cupy

    import accelrt as acc
    from accelrt.interop import numba as acc_numba

    acc.backends.use("cuda")
    acc_numba.use_accelrt_allocator()  # before Numba makes its context
    from numba import cuda as ncuda

    before = acc.memory_allocated()
    a = np.arange(1 << 20, dtype=np.float32)
    da, db = ncuda.to_device(a), ncuda.to_device(a * 3)
    dc = ncuda.device_array_like(da)
    during = acc.memory_allocated() - before
    try:  # a Numba kernel, where this Numba can compile one

        @ncuda.jit  # type: ignore[misc]
        def add(a: Any, b: Any, c: Any) -> None:
            i = ncuda.grid(1)
            if i < c.size:
                c[i] = a[i] + b[i]

        add[(a.size + 255) // 256, 256](da, db, dc)
        how = "a Numba kernel"
    except Exception as exc:  # e.g. numba-cuda 0.30 under numpy 2.5 (np.row_stack is gone)
        print(f"   Numba cannot compile here ({type(exc).__name__}: {exc}); CuPy computes")
        cupy.add(cupy.asarray(da), cupy.asarray(db), out=cupy.asarray(dc))
        how = "CuPy on Numba's arrays"
    right = bool((dc.copy_to_host() == a * 4).all())
    check(
        "numba arrays on accelrt's pool",
        right and during >= 3 * a.nbytes,
        f"c = a + b by {how} right: {right}; accelrt allocated {during} B for 3 x {a.nbytes} B",
    )
    del da, db, dc
    ncuda.current_context().deallocations.clear()  # Numba defers its frees: run them now
    freed = acc.memory_allocated() - before
    check("numba's arrays go back to accelrt", freed == 0, f"{freed} B still allocated")
    buffer = acc.empty(a.nbytes)
    acc.copy_(buffer, a)
    acc.synchronize()
    via_numba = ncuda.as_cuda_array(buffer).copy_to_host().view(np.float32)
    check("__cuda_array_interface__ into numba", bool((via_numba == a).all()), "data equal")
    return {"allocated_for_three_arrays": during, "computed_by": how}


@section
def interop(out_dir: Path) -> dict[str, Any]:
    import cupy
    import torch

    import accelrt as acc
    from accelrt.interop import cupy as acc_cupy

    acc.backends.use("cuda")
    out: dict[str, Any] = {}
    acc_cupy.use_accelrt_allocator()
    before = acc.memory_allocated()
    x = cupy.arange(1 << 22, dtype=cupy.float64)
    during = acc.memory_allocated() - before
    total = float((x * 2).sum())
    check(
        "cupy computation on accelrt's pool",
        total == float((1 << 22) * ((1 << 22) - 1)) and during >= x.nbytes,
        f"sum {total}; accelrt allocated {during} B for {x.nbytes} B",
    )
    del x
    cupy.cuda.set_allocator(cupy.get_default_memory_pool().malloc)

    values = np.arange(1024, dtype=np.float32)
    buffer = acc.empty(values.nbytes)
    acc.copy_(buffer, values)
    acc.current_stream().synchronize()
    as_torch = torch.from_dlpack(buffer).view(torch.float32).cpu().numpy()
    check("DLPack into torch", bool((as_torch == values).all()), "data equal")
    as_cupy = cupy.from_dlpack(buffer).view(cupy.float32).get()
    check("DLPack into cupy", bool((as_cupy == values).all()), "data equal")
    via_cai = cupy.asarray(buffer).view(cupy.float32).get()
    check("__cuda_array_interface__ into cupy", bool((via_cai == values).all()), "data equal")

    stream = acc.Stream()
    external = torch.cuda.ExternalStream(stream.native_handle)
    check(
        "torch ExternalStream of an accelrt stream",
        external.cuda_stream == stream.native_handle,
        f"{external.cuda_stream:#x} == {stream.native_handle:#x}",
    )
    theirs = torch.cuda.Stream()
    wrapped = acc.Stream.from_handle(theirs)
    check(
        "Stream.from_handle(torch.cuda.Stream)",
        wrapped.native_handle == theirs.cuda_stream,
        f"{wrapped.native_handle:#x} == {theirs.cuda_stream:#x}",
    )

    source = acc.empty(MiB)
    host = np.random.default_rng(1).integers(0, 255, MiB, dtype=np.uint8)
    acc.copy_(source, host)
    acc.synchronize()
    graph = acc.Graph()
    graph.enable_debug_mode()
    capture_stream = acc.Stream()
    with capture_stream, graph:
        capturing = capture_stream.is_capturing()
        target = acc.empty(MiB)
        acc.copy_(target, source)
    check("Stream.is_capturing inside a capture", capturing is True, str(capturing))
    start = time.perf_counter()
    for _ in range(100):
        graph.replay()
    acc.synchronize()
    replay_us = (time.perf_counter() - start) / 100 * 1e6
    back = np.empty_like(host)
    acc.copy_(back, target)
    acc.synchronize()
    check(
        "graph replayed 100 times",
        bool((back == host).all()),
        f"copy right after 100 replays; {replay_us:.1f} us a replay",
    )
    graph.debug_dump(out_dir / "graph.dot")
    dot = (out_dir / "graph.dot").read_text()
    check("graph debug_dump", dot.startswith("digraph"), f"{len(dot)} bytes of DOT")
    out["graph_replay_us"] = replay_us
    return out


VMM_PROGRAM = r"""
import json, time, accelrt as acc
acc.backends.use("cuda")
from accelrt.backends import get_backend
granularity = get_backend("cuda").vm_granularity(0)
t0 = time.perf_counter(); b = acc.empty(1 << 30); acc.synchronize(); t1 = time.perf_counter()
b.free(); t2 = time.perf_counter(); acc.empty_cache(); t3 = time.perf_counter()
stats = acc.memory_stats()
print(json.dumps({"granularity": granularity, "grow_1GiB_ms": (t1 - t0) * 1e3,
                  "free_ms": (t2 - t1) * 1e3, "shrink_1GiB_ms": (t3 - t2) * 1e3,
                  "num_device_alloc": stats["num_device_alloc"],
                  "reserved_after": acc.memory_reserved()}))
"""


@section
def vmm() -> dict[str, Any]:
    env = dict(os.environ, ACCELRT_ALLOC_CONF="expandable_segments:True")
    done = subprocess.run(
        [sys.executable, "-c", VMM_PROGRAM], capture_output=True, text=True, env=env, check=False
    )
    if done.returncode != 0:
        raise RuntimeError(done.stderr[-3000:])
    out = json.loads(done.stdout.strip().splitlines()[-1])
    g = out["granularity"]
    check(
        "VMM granularity divides 2 MiB and 20 MiB",
        (2 * MiB) % g == 0 and (20 * MiB) % g == 0,
        f"{g} B",
    )
    check(
        "expandable 1 GiB grow and shrink",
        out["reserved_after"] == 0,
        f"grow {out['grow_1GiB_ms']:.1f} ms, shrink {out['shrink_1GiB_ms']:.1f} ms, "
        f"{out['num_device_alloc']} map calls",
    )
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--traces", type=Path, help="a folder of traces to replay (item 2)")
    parser.add_argument("--out", type=Path, default=Path("."), help="where the JSON goes")
    parser.add_argument("--only", default="", help="comma-separated sections to run")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    wanted = set(filter(None, args.only.split(",")))
    sections: list[tuple[str, Callable[..., None], tuple[Any, ...]]] = [
        ("environment", environment, ()),
        ("vmm", vmm, ()),
        ("numba_plugin", numba_plugin, ()),
        ("interop", interop, (args.out,)),
        ("latency", latency, ()),
        ("torch_snapshots", torch_snapshots, (args.out,)),
        ("replays", replays, (args.traces,)),
    ]
    for name, run, run_args in sections:
        if (not wanted or name in wanted) and (name != "replays" or args.traces):
            run(*run_args)
    (args.out / "cuda_verify.json").write_text(json.dumps(RESULTS, indent=1, default=str))
    print(f"\n{len(FAILED)} failed: {FAILED}" if FAILED else "\nall checks passed")
    return 1 if FAILED else 0


if __name__ == "__main__":
    sys.exit(main())
