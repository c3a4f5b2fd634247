"""Latency of a cache-hit alloc+free pair: accelrt vs PyOpenCL's C++ pool, same device, same run.

Measures, on the OpenCL device (PoCL's CPU device where there is no GPU), for 512 B, 4 KiB and
1 MiB requests (each a cache hit after the first):

- ``accelrt.empty`` + ``Buffer.free``: the public path (current device and stream, a Buffer);
- ``CachingAllocator.malloc`` + ``free``: the allocator of the core in use (compiled unless
  ``ACCELRT_PURE_PYTHON=1``);
- the same pair on the pure-Python reference allocator
  (``memory.device._core.ReferenceCachingAllocator``);
- ``pyopencl.tools.MemoryPool`` ``allocate`` + ``release``: the peer, a C++ caching pool;
- "as written": ``acc.empty(n).free()`` and ``pool.allocate(n).release()`` as users write them,
  the function looked up on its module or object in every iteration (the columns above hoist
  it into a local first).

Each is the best of several repeats of N pairs (a tenth of them for the reference), the
variants interleaved repeat by repeat, size by size, printed with its ratio to the peer (the
as-written pair to the as-written peer). Targets (issues 10, 25): public <= 1.0x, internal
<= 0.8x, public as written <= 1.0x.

A second table compares the allocation policies' cache hits on the simulated device (OpenCL
has no virtual memory): ``CachingAllocator.malloc`` + ``free`` under the defaults,
``expandable_segments:True`` and ``policy:accelrt``, each against the defaults' pair. Target
(issue 23): ``policy:accelrt`` within 1.10x of the defaults.

    python bench/alloc_latency.py [--pairs 200000] [--repeats 5]
    ACCELRT_PURE_PYTHON=1 python bench/alloc_latency.py   # the public path on the Python core
"""

from __future__ import annotations

import argparse
import os
import time
from collections.abc import Callable

os.environ.setdefault("POCL_MEMORY_LIMIT", "2")
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")  # no BLAS threads spinning beside the loops

SIZES = (512, 4096, 1 << 20)


def best_ns_per_pair(
    runs: dict[str, tuple[Callable[[int], None], int]], repeats: int
) -> dict[str, float]:
    """Return, for each ``name: (pair, pairs)``, the best mean ns of one pair over
    ``repeats`` runs of ``pair(pairs)``, the variants interleaved run by run (a machine that
    speeds up or slows down during the measurement does so for all of them)."""
    best = dict.fromkeys(runs, float("inf"))
    for pair, _ in runs.values():
        pair(1)
    for _ in range(repeats):
        for name, (pair, pairs) in runs.items():
            start = time.perf_counter_ns()
            pair(pairs)
            best[name] = min(best[name], (time.perf_counter_ns() - start) / pairs)
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--pairs", type=int, default=200_000)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()

    import pyopencl as cl
    import pyopencl.tools as cl_tools

    import accelrt as acc
    from accelrt.memory.device import _core

    acc.backends.use("opencl")
    allocator = acc.memory.get_allocator(0)
    reference = _core.ReferenceCachingAllocator(allocator.backend, 0)
    queue = allocator.backend.queue(0, 0)  # type: ignore[attr-defined]
    pool = cl_tools.MemoryPool(cl_tools.ImmediateAllocator(queue))

    print(f"device: opencl:0 ({acc.get_device_name(0)}); pyopencl {cl.VERSION_TEXT}")
    print(f"allocator core: {_core.CORE} ({_core.CORE_REASON})")
    print(f"pairs: {args.pairs} x best of {args.repeats}; ns per alloc+free pair (x peer)")
    head = ("size", "peer pool", "internal", "reference", "public", "peer written", "as written")
    print(f"{head[0]:>8} {head[1]:>10} " + " ".join(f"{h:>16}" for h in head[2:]))
    for size in SIZES:

        def peer(n: int, size: int = size) -> None:
            allocate = pool.allocate
            for _ in range(n):
                allocate(size).release()

        def internal(n: int, size: int = size) -> None:
            malloc, free = allocator.malloc, allocator.free
            for _ in range(n):
                free(malloc(size, 0))

        def python_core(n: int, size: int = size) -> None:  # 20x slower: run a tenth
            malloc, free = reference.malloc, reference.free
            for _ in range(n):
                free(malloc(size, 0))

        def public(n: int, size: int = size) -> None:
            empty = acc.empty
            for _ in range(n):
                empty(size).free()

        def peer_written(n: int, size: int = size) -> None:
            for _ in range(n):
                pool.allocate(size).release()

        def public_written(n: int, size: int = size) -> None:
            for _ in range(n):
                acc.empty(size).free()

        pairs = args.pairs
        best = best_ns_per_pair(
            {
                "peer": (peer, pairs),
                "internal": (internal, pairs),
                "reference": (python_core, max(pairs // 10, 1)),
                "public": (public, pairs),
                "peer written": (peer_written, pairs),
                "as written": (public_written, pairs),
            },
            args.repeats,
        )
        peer_ns = best["peer"]
        cells = [f"{peer_ns:10.0f}"]
        for name in ("internal", "reference", "public"):
            ns = best[name]
            cells.append(f"{ns:8.0f} ({ns / peer_ns:5.2f}x)")
        written_peer_ns = best["peer written"]
        cells.append(f"{written_peer_ns:16.0f}")
        ns = best["as written"]
        cells.append(f"{ns:8.0f} ({ns / written_peer_ns:5.2f}x)")
        print(f"{size:>8} " + " ".join(cells))
    policy_hits(args.pairs, args.repeats)


def policy_hits(pairs: int, repeats: int) -> None:
    """Print each policy's cache-hit pair on sim against the defaults' (issue 23)."""
    from accelrt.backends.sim import SimBackend
    from accelrt.memory import AllocatorConfig, CachingAllocator

    backend = SimBackend(device_count=1, capacity=16 << 30)
    settings = ("defaults", "expandable_segments:True", "policy:accelrt")
    allocators = {s: CachingAllocator(backend, 0, AllocatorConfig.parse(s)) for s in settings}
    print("\ncache hits by policy on sim:0: ns per malloc+free pair (x defaults)")
    print(f"{'size':>8} " + " ".join(f"{s:>26}" for s in settings))
    for size in SIZES:
        runs = {}
        for setting, allocator in allocators.items():

            def pair(n: int, allocator: CachingAllocator = allocator, size: int = size) -> None:
                malloc, free = allocator.malloc, allocator.free
                for _ in range(n):
                    free(malloc(size, 0))

            runs[setting] = (pair, pairs)
        best = best_ns_per_pair(runs, repeats)
        cells = [f"{best[s]:15.0f} ({best[s] / best['defaults']:5.2f}x)" for s in settings]
        print(f"{size:>8} " + " ".join(f"{c:>26}" for c in cells))


if __name__ == "__main__":
    main()
