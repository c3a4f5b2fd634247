"""Which allocator core runs: the compiled hit path or the pure-Python reference.

``CachingAllocator`` here is what the rest of accelrt builds. When the compiled module
(memory/device/_native.pyx, built by ``pip install``) imports and ``ACCELRT_PURE_PYTHON`` is not set
to a true value, it is ``NativeCachingAllocator``: the compiled ``HotPath`` (``malloc``,
``free``, best fit, splitting, merging, statistics) in front of the Python reference, whose
code still runs every rare path on the compiled blocks and pools. Otherwise it is the
reference itself (memory/device/_allocator.py). Both give the same blocks, addresses, statistics,
snapshots and errors; tests/memory/test_native_core.py checks it. docs/design.md ("Two cores")
says why the split lies where it does.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..._compiled import load
from .._atomic import register
from ..history._history import History
from . import _block
from ._allocator import CachingAllocator as ReferenceCachingAllocator

__all__ = [
    "CORE",
    "CORE_REASON",
    "Block",
    "CachingAllocator",
    "ReferenceCachingAllocator",
    "native",
]


def _native_allocator(module: Any) -> type[ReferenceCachingAllocator]:
    class NativeCachingAllocator(module.HotPath, ReferenceCachingAllocator):  # type: ignore[misc]
        """The caching allocator with its hit path compiled; see ``CachingAllocator``.

        Same constructor, methods, results and errors as the Python reference
        (memory/device/_allocator.py); blocks are ``accelrt.memory.device._native.Block`` objects.
        """

        _Block = module.Block
        _BlockPool = module.BlockPool
        _Stat = module.Stat
        _StatArray = module.StatArray
        _ActiveBlocks = module.ActiveBlocks

    # The Python paths the compiled hit path calls: a KeyboardInterrupt inside them waits for
    # the operation to end (memory/_atomic.py), as it does inside the Python hot path.
    for method in (
        "_free_finalized",
        "_process_events",
        "_routed_pool",
        "_malloc_slow",
        "_insert_events",
        "_release_dropped_pool_cache",
        "_pool_no_split",
    ):
        register(getattr(ReferenceCachingAllocator, method))
    register(History.record)
    return NativeCachingAllocator


native, CORE_REASON = load("accelrt.memory.device._native")
#: "compiled" or "python": which core ``CachingAllocator`` runs (``accelrt info`` shows it).
CORE = "python" if native is None else "compiled"

if TYPE_CHECKING:
    from ._allocator import CachingAllocator as CachingAllocator
    from ._block import Block as Block
elif native is not None:
    CachingAllocator = _native_allocator(native)
    Block = native.Block
else:
    CachingAllocator = ReferenceCachingAllocator
    Block = _block.Block
