"""``CachingAllocator``: one per device, generic over a backend's raw primitives; which hit
path it runs, compiled or Python.

``CachingAllocator`` is ``HitPath`` in front of ``SlowPath`` on both cores. ``HitPath`` is the
compiled one (memory/device/_native.pyx, built by ``pip install``) when it imports and
``ACCELRT_PURE_PYTHON`` is not set to a true value, else the Python one
(memory/device/_hit_path.py); ``SlowPath`` (memory/device/_allocator.py) is the same Python on
both. ``ReferenceCachingAllocator`` is the allocator on the Python ``HitPath`` whichever is
built: tests/memory/test_native_core.py checks that both give the same blocks, addresses,
statistics, snapshots and errors. docs/design.md ("Two cores") says why the split lies where it
does.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..._compiled import load
from .._atomic import register
from ..history._history import History
from ._allocator import SlowPath
from ._hit_path import HitPath as PythonHitPath

__all__ = [
    "CORE",
    "CORE_REASON",
    "Block",
    "CachingAllocator",
    "HitPath",
    "PythonHitPath",
    "ReferenceCachingAllocator",
    "SlowPath",
    "native",
]

native, CORE_REASON = load("accelrt.memory.device._native")
#: "compiled" or "python": which core ``CachingAllocator`` runs (``accelrt info`` shows it).
CORE = "python" if native is None else "compiled"

if TYPE_CHECKING or native is None:  # noqa: SIM108 (a class alias mypy can follow)
    HitPath = PythonHitPath
else:
    HitPath = native.HitPath


class CachingAllocator(HitPath, SlowPath):
    """The caching allocator of one device.

    Parameters
    ----------
    backend : Backend
        The device's backend; the allocator uses its memory (through a ``MemorySource``), its
        events and ``mem_get_info``.
    device_index : int
        The device's index within the backend.
    config : AllocatorConfig, optional
        Settings (the defaults when None). ``per_process_memory_fraction`` in it applies at once.

    Notes
    -----
    The default policy reproduces PyTorch's CUDACachingAllocator (docs/allocator.md sections
    1-8): requests are rounded and split between a small and a large pool; a request takes the
    smallest free block of its own stream that fits (lowest address first); blocks are split
    and merged inside their segment; frees of blocks used by other streams wait for events
    recorded on those streams; when nothing fits, the malloc ladder grows a segment, releases
    cached memory and retries before raising ``OutOfMemoryError``. ``policy:accelrt``
    (section 16) shares pages between streams and pools.

    Thread-safe: every public method runs under one lock. Stream arguments are the backend's
    integer stream handles. Blocks are handed out as :class:`Block` objects; callers keep them
    and give them back to :meth:`free`. Mirrors c10's ``DeviceCachingAllocator``. Frees that
    wait for other streams are ``StreamEvents``' (device/_events.py), shared with the host
    allocator.
    """


if TYPE_CHECKING or native is None:
    ReferenceCachingAllocator = CachingAllocator
else:

    class ReferenceCachingAllocator(PythonHitPath, SlowPath):
        """``CachingAllocator`` on the Python ``HitPath``, for the differential tests and
        benchmarks of the compiled core."""

    # The Python paths the compiled hit path calls: a KeyboardInterrupt inside them waits for
    # the operation to end (memory/_atomic.py), as it does inside the Python hit path.
    for _method in (
        SlowPath._free_finalized,
        SlowPath._process_events,
        SlowPath._routed_pool,
        SlowPath._malloc_slow,
        SlowPath._insert_events,
        SlowPath._release_dropped_pool_cache,
        SlowPath._pool_no_split,
    ):
        register(_method)
    register(History.record)

Block = HitPath._Block
