"""Latency of a cache-hit alloc+free pair: accelrt vs PyOpenCL's C++ pool, same device, same run.

Measures, on the OpenCL device (PoCL's CPU device where there is no GPU):

- ``accelrt.empty`` + ``Buffer.free``: the public path (device normalisation, current stream,
  Buffer object);
- ``CachingAllocator.malloc`` + ``free``: the allocator's internal fast path;
- ``pyopencl.tools.MemoryPool`` ``allocate`` + ``release``: the peer, a C++ caching pool.

Each is timed as the best of several repeats of N pairs of a 1 MiB request (a cache hit after
the first), and printed with its ratio to the peer. No target yet: this is the number.

    python bench/alloc_latency.py [--pairs 200000] [--repeats 5] [--size 1048576]
"""

from __future__ import annotations

import argparse
import os
import time
from collections.abc import Callable

os.environ.setdefault("POCL_MEMORY_LIMIT", "2")


def best_ns_per_pair(pair: Callable[[], None], pairs: int, repeats: int) -> float:
    """Return the best mean time of one call of ``pair`` over ``repeats`` runs, in ns."""
    pair()
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter_ns()
        for _ in range(pairs):
            pair()
        best = min(best, (time.perf_counter_ns() - start) / pairs)
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--pairs", type=int, default=200_000)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--size", type=int, default=1 << 20)
    args = parser.parse_args()

    import pyopencl as cl
    import pyopencl.tools as cl_tools

    import accelrt as acc

    acc.backends.use("opencl")
    allocator = acc.memory.get_allocator(0)
    size = args.size

    def public_pair() -> None:
        acc.empty(size).free()

    def internal_pair() -> None:
        allocator.free(allocator.malloc(size, 0))

    queue = allocator.backend.queue(0, 0)  # type: ignore[attr-defined]
    pool = cl_tools.MemoryPool(cl_tools.ImmediateAllocator(queue))

    def peer_pair() -> None:
        pool.allocate(size).release()

    peer = best_ns_per_pair(peer_pair, args.pairs, args.repeats)
    internal = best_ns_per_pair(internal_pair, args.pairs, args.repeats)
    public = best_ns_per_pair(public_pair, args.pairs, args.repeats)
    device = acc.get_device_name(0)
    print(f"device: opencl:0 ({device}); pyopencl {cl.VERSION_TEXT}; request {size} bytes")
    print(f"pairs: {args.pairs} x best of {args.repeats}")
    print(f"{'path':42} {'ns/pair':>10} {'ratio vs peer':>14}")
    rows = [
        ("pyopencl.tools.MemoryPool (peer, C++)", peer),
        ("CachingAllocator.malloc+free (internal)", internal),
        ("accelrt.empty+Buffer.free (public)", public),
    ]
    for name, ns in rows:
        print(f"{name:42} {ns:10.0f} {ns / peer:13.2f}x")


if __name__ == "__main__":
    main()
