"""The host (pinned) caching allocator against PyOpenCL directly, on the same OpenCL device.

Measures, on the OpenCL device (PoCL's CPU device where there is no GPU), in one run:

- a cache-hit ``accelrt.empty_host(n).free()`` pair against allocating and releasing a pinned
  buffer through PyOpenCL directly (``CL_MEM_ALLOC_HOST_PTR`` buffer, blocking map for its host
  pointer, unmap, release: what ``empty_host`` does on a cache miss), at 4 KiB, 1 MiB, 64 MiB;
- host-to-device and device-to-host copy bandwidth (``accelrt.copy_`` plus a stream
  synchronize) from and to pinned memory (a ``HostBuffer``) against pageable memory (a numpy
  array), at 1 MiB and 64 MiB.

Each figure is the best of several repeats; ratios are against the peer measured in the same
run (< 1 means accelrt's pair is faster; > 1 means pinned copies are faster).

    python bench/host_alloc.py [--pairs 20000] [--copies 50] [--repeats 5]
"""

from __future__ import annotations

import argparse
import os
import time
from collections.abc import Callable

os.environ.setdefault("POCL_MEMORY_LIMIT", "2")

KiB, MiB = 1 << 10, 1 << 20


def best_ns_per_call(call: Callable[[], None], calls: int, repeats: int) -> float:
    """Return the best mean time of one ``call()`` over ``repeats`` runs of ``calls``, in ns."""
    call()
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter_ns()
        for _ in range(calls):
            call()
        best = min(best, (time.perf_counter_ns() - start) / calls)
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--pairs", type=int, default=20_000, help="cache-hit pairs per repeat")
    parser.add_argument("--peer-pairs", type=int, default=500, help="PyOpenCL pairs per repeat")
    parser.add_argument("--copies", type=int, default=50, help="copies per repeat")
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()

    import numpy as np
    import pyopencl as cl

    import accelrt as acc

    acc.backends.use("opencl")
    backend = acc.backends.get_backend("opencl")
    context = backend.context(0)  # type: ignore[attr-defined]
    queue = cl.CommandQueue(context, context.devices[0])
    flags = cl.mem_flags.READ_WRITE | cl.mem_flags.ALLOC_HOST_PTR
    access = cl.map_flags.READ | cl.map_flags.WRITE
    print(
        f"device: opencl:0 ({acc.get_device_name(0)}); pyopencl {cl.VERSION_TEXT}; "
        f"pinned host memory: {acc.get_device_properties(0).pinned_host_memory}"
    )

    print(f"\nalloc+free pair, best of {args.repeats}")
    print(f"{'size':>8} {'empty_host+free ns':>19} {'pyopencl pinned ns':>19} {'ratio':>7}")
    for size in (4 * KiB, MiB, 64 * MiB):

        def ours(size: int = size) -> None:
            acc.empty_host(size).free()

        def peer(size: int = size) -> None:
            buffer = cl.Buffer(context, flags, size)
            mapped, _ = cl.enqueue_map_buffer(
                queue, buffer, access, 0, (size,), np.uint8, is_blocking=True
            )
            mapped.base.release(queue)
            buffer.release()

        peer_ns = best_ns_per_call(peer, args.peer_pairs, args.repeats)
        ours_ns = best_ns_per_call(ours, args.pairs, args.repeats)
        print(f"{_size(size):>8} {ours_ns:19.0f} {peer_ns:19.0f} {ours_ns / peer_ns:6.3f}x")

    stream = acc.Stream()
    print(f"\ncopy bandwidth (copy_ + stream synchronize), best of {args.repeats}")
    print(f"{'size':>8} {'direction':>9} {'pinned GB/s':>12} {'pageable GB/s':>14} {'ratio':>7}")
    for size in (MiB, 64 * MiB):
        device_buffer = acc.empty(size, stream=stream)
        pinned = acc.empty_host(size)
        pinned.numpy()[:] = 1
        pageable = np.ones(size, np.uint8)
        copies = max(3, args.copies * MiB // size)
        for direction in ("H2D", "D2H"):

            def copy(
                host: object, direction: str = direction, dev: acc.Buffer = device_buffer
            ) -> Callable[[], None]:
                def run() -> None:
                    if direction == "H2D":
                        acc.copy_(dev, host, stream=stream)
                    else:
                        acc.copy_(host, dev, stream=stream)
                    stream.synchronize()

                return run

            pinned_ns = best_ns_per_call(copy(pinned), copies, args.repeats)
            pageable_ns = best_ns_per_call(copy(pageable), copies, args.repeats)
            print(
                f"{_size(size):>8} {direction:>9} {size / pinned_ns:12.2f} "
                f"{size / pageable_ns:14.2f} {pageable_ns / pinned_ns:6.2f}x"
            )
        pinned.free()
        device_buffer.free()


def _size(nbytes: int) -> str:
    return f"{nbytes // MiB} MiB" if nbytes >= MiB else f"{nbytes // KiB} KiB"


if __name__ == "__main__":
    main()
