"""Per-call cost on the ``xpu`` backend (dpctl/SYCL): accelrt vs the raw dpctl calls, same queue.

Measures, in one run, on the first XPU device (Intel's OpenCL CPU device where there is no GPU):

- a cache-hit ``accelrt.empty(n).free()`` vs dpctl's ``MemoryUSMDevice(n, queue=q)`` created
  and released (what a dpctl user pays for each buffer), at 4 KiB and 1 MiB; and the same
  accelrt pair on ``opencl`` where PoCL is installed, batches of the two backends interleaved
  (issue 24: at most 0.1x / 0.02x the dpctl pair, at most 1.0x the OpenCL pair); beside them,
  the least any Python pair of a call that makes an object and a call that frees it costs
  (``memoryview(b"").release()``, two C calls and no Python frame), so that the table shows
  where a target in microseconds lies below what no Python API can go under;
- ``Event.record(stream)`` vs ``q.submit_barrier()``; ``Event.query()`` vs
  ``marker.execution_status == complete``; ``Stream.query()`` with a finished command recorded
  on it (a finished barrier) vs the same status of the queue's last command; an idle
  ``Stream.synchronize()`` vs ``q.wait()``; a 4 KiB host-to-device ``copy_`` (enqueued, then
  a ``synchronize``) vs ``q.memcpy_async(mem, host, n)`` (then ``q.wait()``) (issue 24: at most
  1.2x);
- copy bandwidth host to device at 1 and 64 MiB: ``copy_`` + ``synchronize`` vs
  ``memcpy_async`` + ``wait`` (issue 24: at least 95% of raw).

The raw side runs inside a Python function (``def raw(): q.wait()``), the least any Python API
over dpctl costs. Statements are timed in short interleaved batches (``timeit``), their order
reversed every other round, each batch after an untimed run of a tenth of it: a batch starts
warm instead of paying for the caches the other side's batch left (the 200 dpctl 1 MiB
allocations before ours, each an ``mmap`` and ``munmap``, had made our cache-hit pair read
0.1 us dearer at 1 MiB than at 4 KiB). Figures are the median batch's, per call, in
microseconds. The raw copies write the accelrt buffer's own memory (dpctl's view of it, through
``__sycl_usm_array_interface__``): the same bytes for both sides, since two USM allocations of
one size copy at rates a few percent apart, either way. Asserts nothing (timing is not a test).

On Intel's OpenCL CPU device a copy runs on the runtime's host threads, on the cores the
caller runs on, so the host work around a copy costs it more than it costs in a loop. On a
2-core VM, 1 MiB copy + wait (about 50 us), medians of 300-400 paired batches against dpctl's
call on a kept memoryview: a memoryview of the array made for each copy (as ``copy_`` makes
one; 0.12 us in a loop) +1.4 us, with the copy's event and host object kept until the
synchronize +0.6-1.6 us, the event released after the wait +0.7-1.0 us; the whole ``copy_`` +
``synchronize`` +5.3-5.9 us, hence the 1 MiB row's 90-93% there (95-97% on the AMD EPYC VMs
of earlier runs).

    python bench/xpu_overhead.py [--batches 100] [--batch 200]
"""

from __future__ import annotations

import argparse
import os
import statistics
import timeit
from collections.abc import Callable
from functools import partial
from typing import Any

os.environ.setdefault("POCL_MEMORY_LIMIT", "2")


def medians(
    statements: dict[str, str],
    namespace: dict[str, Any],
    batch: int,
    batches: int,
    before: dict[str, Callable[[], object]] | None = None,
) -> dict[str, float]:
    """Return each statement's median per-call time in microseconds over interleaved batches.

    ``before`` maps a statement's name to what runs, untimed, before each of its batches (and
    its warm-up): the backend to use, say.
    """
    timers = {k: timeit.Timer(v, globals=namespace) for k, v in statements.items()}
    prepare = before or {}
    for name, timer in timers.items():
        if name in prepare:
            prepare[name]()
        timer.timeit(batch)  # warm
    samples: dict[str, list[float]] = {k: [] for k in statements}
    order = list(timers.items())
    warm = max(1, batch // 10)
    for round_ in range(batches):
        for name, timer in order if round_ % 2 == 0 else order[::-1]:
            if name in prepare:
                prepare[name]()
            timer.timeit(warm)  # untimed: the batch starts warm, whatever ran before it
            samples[name].append(timer.timeit(batch) / batch * 1e6)
    return {k: statistics.median(v) for k, v in samples.items()}


def row(name: str, ours: float, raw: float, target: str) -> str:
    """One table line: accelrt us, raw us, ratio, target."""
    return f"{name:<34} {ours:>9.2f} {raw:>9.2f} {ours / raw:>7.3f}x  {target}"


def main() -> None:
    """Run the measurements and print two tables."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", type=int, default=100)
    parser.add_argument("--batch", type=int, default=200)
    args = parser.parse_args()

    import numpy as np

    import accelrt as acc
    from accelrt.memory.device import _core

    backend: Any = acc.backends.get_backend("xpu")
    if not backend.is_available():
        raise SystemExit(f"no XPU device: {backend.unavailable_reason()}")
    import dpctl.memory

    acc.backends.use("xpu")
    print(f"device: {acc.get_device_name()} ({acc.get_device_properties().raw['filter_string']})")
    print(f"allocator core: {_core.CORE}; dpctl {dpctl.__version__}")
    stream = acc.Stream()
    queue = backend.queue(0, stream.handle)
    complete = dpctl.event_status_type.complete
    ns: dict[str, Any] = {"acc": acc, "dm": dpctl.memory, "q": queue, "s": stream}
    with stream:
        for n in (4096, 1 << 20):
            acc.empty(n).free()  # cached
    print(f"\n{'operation':<34} {'accelrt':>9} {'raw':>9} {'ratio':>8}  target (us per call)")

    def raw_alloc(n: int) -> None:
        dpctl.memory.MemoryUSMDevice(n, queue=queue)

    ns["raw_alloc"] = raw_alloc
    ns["view"] = memoryview
    ns["nothing"] = b""
    with stream:
        for n, target in ((4096, 0.10), (1 << 20, 0.02)):
            m = medians(
                {
                    "ours": f"acc.empty({n}).free()",
                    "raw": f"raw_alloc({n})",
                    "least": "view(nothing).release()",
                },
                ns,
                args.batch,
                args.batches,
            )
            print(row(f"empty({n}).free() vs USM alloc", m["ours"], m["raw"], f"<= {target:.2f}x"))
            print(
                row(
                    "  the least pair (memoryview)",
                    m["least"],
                    m["raw"],
                    f"the target: {target * m['raw']:.3f} us",
                )
            )
    try:
        has_opencl = acc.backends.get_backend("opencl").is_available()
    except ImportError:
        has_opencl = False
    if has_opencl:  # the same statement on each backend, batches interleaved as above
        switch = {name: partial(acc.backends.use, name) for name in ("xpu", "opencl")}
        with stream:
            for n in (4096, 1 << 20):
                stmt = f"acc.empty({n}).free()"
                m = medians(
                    {"xpu": stmt, "opencl": stmt}, ns, args.batch, args.batches, before=switch
                )
                print(row(f"empty({n}).free() xpu vs opencl", m["xpu"], m["opencl"], "<= 1.0x"))
        acc.backends.use("xpu")

    event = acc.Event()
    host = np.zeros(4096, np.uint8)
    buf = acc.empty(4096, stream=stream)
    usm = dpctl.memory.as_usm_memory(buf)  # the same memory as buf's copies write
    marker = queue.submit_barrier()
    marker.wait()
    event.record(stream)
    event.synchronize()

    def raw_record() -> None:
        queue.submit_barrier()

    def raw_event_query() -> bool:
        return bool(marker.execution_status == complete)

    def raw_sync() -> None:
        queue.wait()

    def raw_copy() -> None:
        queue.memcpy_async(usm, host, 4096)

    ns.update(
        event=event, host=host, buf=buf, raw_record=raw_record, raw_event_query=raw_event_query,
        raw_sync=raw_sync, raw_copy=raw_copy,
    )  # fmt: skip
    cases = [
        ("Event.record(stream)", "event.record(s)", "raw_record()"),
        ("Event.query()", "event.query()", "raw_event_query()"),
        ("Stream.query()", "s.query()", "raw_event_query()"),
        ("Stream.synchronize() idle", "s.synchronize()", "raw_sync()"),
        ("copy_ 4 KiB h2d (enqueue)", "acc.copy_(buf, host, stream=s)", "raw_copy()"),
    ]
    for name, ours, raw in cases:
        if name == "Stream.query()":  # a command to ask about, as the raw side has (finished)
            event.record(stream)  # (after a synchronize the stream knows it is idle, asks none)
        queue.wait()
        event.synchronize()
        stmts = {"ours": ours, "raw": raw}
        if "record" in name or "copy" in name:  # keep the queue from growing without bound
            stmts = {"ours": f"{ours}; s.synchronize()", "raw": f"{raw}; raw_sync()"}
        m = medians(stmts, ns, args.batch, args.batches)
        label = name + (" +sync" if "record" in name or "copy" in name else "")
        print(row(label, m["ours"], m["raw"], "<= 1.2x"))
    buf.free()

    print(f"\n{'h2d copy + sync':<34} {'accelrt':>9} {'raw':>9} {'share':>8}  target (GB/s)")
    for mib in (1, 64):
        n = mib << 20
        big = acc.empty(n, stream=stream)
        raw_big = dpctl.memory.as_usm_memory(big)  # the same memory as big's copies write
        src = np.ones(n, np.uint8)

        def raw_big_copy(raw_big: Any = raw_big, src: Any = src, n: int = n) -> None:
            queue.memcpy_async(raw_big, src, n)
            queue.wait()

        ns.update(big=big, src=src, raw_big_copy=raw_big_copy)
        count = max(4, args.batch // (4 * mib))
        m = medians(
            {"ours": "acc.copy_(big, src, stream=s); s.synchronize()", "raw": "raw_big_copy()"},
            ns,
            count,
            max(10, args.batches // 4),
        )
        ours_gbs, raw_gbs = n / m["ours"] / 1e3, n / m["raw"] / 1e3
        print(
            f"{f'{mib} MiB':<34} {ours_gbs:>9.2f} {raw_gbs:>9.2f} "
            f"{ours_gbs / raw_gbs:>7.1%}  >= 95%"
        )
        del raw_big
        big.free()  # (returned when big is collected: its SYCL interface was read)


if __name__ == "__main__":
    main()
