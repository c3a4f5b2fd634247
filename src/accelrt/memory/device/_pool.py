"""Private memory pools: ``MemPool`` and ``use_mem_pool`` (mirror ``torch.cuda.MemPool``).

A ``MemPool`` is a set of free lists of its own inside a device's caching allocator
(docs/allocator.md section 14): while ``use_mem_pool(pool)`` is active, the thread's
allocations on that device come from the pool's segments, and its blocks are reused only for
the pool's allocations. Device-wide ``memory_stats()`` count every pool.
"""

from __future__ import annotations

import itertools
import threading
import weakref
from collections.abc import Iterator
from contextlib import contextmanager

from ... import _runtime
from ..._device import Device, DeviceLike
from ..history._history import SegmentInfo
from ._block import PoolId
from ._core import CachingAllocator
from ._registry import get_allocator

__all__ = ["MemPool", "use_mem_pool"]

_ids = itertools.count(1)
_ids_lock = threading.Lock()


class MemPool:
    """A private pool of device memory.

    Attributes
    ----------
    id : tuple of (int, int)
        ``(0, k)`` with k = 1, 2, ... in creation order; snapshots give it as the segments'
        ``segment_pool_id`` ((0, 0) is the device's default pool).

    Notes
    -----
    The pool binds to the device it is first used on (:func:`use_mem_pool`). Blocks keep
    their pool alive: a buffer allocated in the pool can be freed after the ``MemPool`` object
    is gone, and goes back to the pool. Once the object is gone and none of its blocks is
    allocated, the pool's memory is returned to the device. ``accelrt.empty_cache()`` releases
    what every pool caches. Mirrors ``torch.cuda.MemPool`` (PyTorch 2.13), without a custom
    allocator.

    Examples
    --------
    >>> import accelrt as acc
    >>> pool = acc.memory.MemPool()
    >>> with acc.memory.use_mem_pool(pool):
    ...     buf = acc.empty(1 << 20)
    >>> pool.memory_allocated()
    1048576
    >>> buf.free()
    """

    __slots__ = ("__weakref__", "_allocator", "_users", "id")

    def __init__(self) -> None:
        with _ids_lock:
            self.id: PoolId = (0, next(_ids))
        self._allocator: CachingAllocator | None = None
        self._users = 0  # use_mem_pool contexts inside, graphs holding a capture

    def use_count(self) -> int:
        """Return how many hold the pool: 1 for this object, plus each ``use_mem_pool``
        context inside (on any thread) and each ``accelrt.Graph`` that captured into it and
        was not reset.

        Mirrors ``torch.cuda.MemPool.use_count`` (the private pool's reference count)."""
        return 1 + self._users

    @property
    def device(self) -> Device | None:
        """The device the pool is bound to, or None before its first use."""
        if self._allocator is None:
            return None
        return Device(self._allocator.backend.name, self._allocator.device_index)

    def _bind(self, allocator: CachingAllocator) -> None:
        if self._allocator is None:
            allocator.create_pool(self.id)
            self._allocator = allocator
            weakref.finalize(self, allocator.release_pool, self.id)
        elif self._allocator is not allocator:
            raise ValueError(
                f"MemPool {self.id} belongs to device {self._allocator.device_name}; it cannot "
                f"be used on {allocator.device_name}. Make one MemPool per device."
            )

    def snapshot(self) -> list[SegmentInfo]:
        """Return the pool's segments and blocks in the snapshot schema (empty before use).

        Mirrors ``torch.cuda.MemPool.snapshot``.
        """
        if self._allocator is None:
            return []
        return self._allocator.snapshot(self.id, include_traces=False)[0]

    def memory_reserved(self) -> int:
        """Return the bytes the pool holds from the device (segments and mapped pages)."""
        return sum(s["total_size"] for s in self.snapshot())

    def memory_allocated(self) -> int:
        """Return the bytes of the pool's allocated blocks (after rounding)."""
        return sum(s["allocated_size"] for s in self.snapshot())

    def __repr__(self) -> str:
        return f"MemPool(id={self.id}, device={self.device})"


@contextmanager
def use_mem_pool(pool: MemPool, device: DeviceLike = None) -> Iterator[None]:
    """Route the calling thread's allocations on ``device`` to ``pool`` inside the block.

    Parameters
    ----------
    pool : MemPool
        The pool; bound to ``device`` on first use.
    device : int, str, Device or None
        The device; None for the current device. Allocations on other devices are unaffected.

    Raises
    ------
    TypeError
        If ``pool`` is not a MemPool, or ``device`` of a bad type.
    ValueError
        If the pool is bound to another device (the message names both), or the device is
        out of range.
    RuntimeError
        If there is no accelerator.

    Notes
    -----
    Nestable: the thread allocates to the latest pool entered and not left. Contexts may end
    out of order (asyncio tasks interleave so): leaving one removes only its own entry. Other
    threads keep allocating from the default pool. Blocks freed after the block ends still
    return to ``pool``. Mirrors ``torch.cuda.use_mem_pool``.
    """
    if not isinstance(pool, MemPool):
        raise TypeError(f"use_mem_pool() takes an accelrt.memory.MemPool, got {pool!r}")
    backend, index = _runtime.resolve_device(device)
    allocator = get_allocator(backend, index)
    pool._bind(allocator)
    allocator.begin_allocate_to_pool(pool.id)
    pool._users += 1
    try:
        yield
    finally:
        pool._users -= 1
        allocator.end_allocate_to_pool(pool.id)
