"""Private memory pools: ``MemPool``, ``use_mem_pool`` and ``PluggableAllocator`` (mirror
``torch.cuda.MemPool``, ``torch.cuda.use_mem_pool`` and ``torch.cuda.CUDAPluggableAllocator``).

A ``MemPool`` is a set of free lists of its own inside a device's caching allocator
(docs/allocator.md section 14): while ``use_mem_pool(pool)`` is active, the thread's
allocations on that device come from the pool's segments, and its blocks are reused only for
the pool's allocations. Device-wide ``memory_stats()`` count every pool. A pool may take its
segments from a ``PluggableAllocator`` (user functions), hand its blocks out whole
(``no_split``), and lend its free blocks to requests that ran out of memory (``use_on_oom``).
"""

from __future__ import annotations

import itertools
import threading
import weakref
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from ... import _runtime
from ..._device import Device, DeviceLike
from ..._readonly import read_only
from ..history._history import SegmentInfo
from ._block import BlockPool, PoolId, Segment
from ._core import CachingAllocator
from ._registry import get_allocator
from ._source import MemorySource

__all__ = ["MemPool", "PluggableAllocator", "use_mem_pool"]

AllocFn = Callable[[int, int, int], int]
"""``alloc_fn(size, device, stream) -> address``: bytes, device index, stream handle."""
FreeFn = Callable[[int, int, int, int], None]
"""``free_fn(address, size, device, stream)``: what ``alloc_fn`` returned, and its arguments."""


class PluggableAllocator:
    """Device memory from two functions of the user's, for the segments of a ``MemPool``.

    Parameters
    ----------
    alloc_fn : callable
        ``alloc_fn(size, device, stream) -> int``: return the address of ``size`` bytes of
        device memory on device index ``device`` for the backend stream handle ``stream``,
        or 0 when there is no memory (the allocator then goes on down its malloc ladder
        and raises ``OutOfMemoryError`` at the end, as for a full device). ``size`` is a
        segment's size (2 MiB, 20 MiB or a rounded large request, docs/allocator.md
        section 2), never a single request's.
    free_fn : callable
        ``free_fn(address, size, device, stream)``: give back memory from ``alloc_fn`` (the
        same ``size``, ``device`` and ``stream``). Called when the allocator releases the
        segment: ``empty_cache()``, the malloc ladder's retries, or the pool going away.

    Raises
    ------
    TypeError
        If either is not callable.

    Notes
    -----
    The memory must be the device's own (an address the backend can copy to and from), as
    ``torch.cuda.CUDAPluggableAllocator``'s must be CUDA memory: wrap the backend's
    allocator (logging, a reserve of its own, another kind of memory of the same device).
    The functions run inside the allocator's lock; they must not call accelrt's allocator.
    An exception from ``alloc_fn`` propagates out of the allocation with the allocator
    unchanged; one from ``free_fn`` propagates out of the call that released the segment.
    Mirrors ``torch.cuda.memory.CUDAPluggableAllocator``, with Python functions in place of
    a shared library's ``alloc_fn_name``/``free_fn_name`` (the argument order is PyTorch's).
    """

    __slots__ = ("alloc_fn", "free_fn")

    def __init__(self, alloc_fn: AllocFn, free_fn: FreeFn) -> None:
        for name, fn, signature in (
            ("alloc_fn", alloc_fn, "(size, device, stream) -> address"),
            ("free_fn", free_fn, "(address, size, device, stream)"),
        ):
            if not callable(fn):
                raise TypeError(
                    f"PluggableAllocator {name} must be callable, got {fn!r}; pass a "
                    f"function {signature}"
                )
        self.alloc_fn = alloc_fn
        self.free_fn = free_fn

    def __repr__(self) -> str:
        return f"PluggableAllocator({self.alloc_fn!r}, {self.free_fn!r})"


class _PluggableSource(MemorySource):
    """A pool's segments from a :class:`PluggableAllocator` (the allocator's seam,
    device/_source.py): ordinary segments only."""

    __slots__ = ("allocator",)

    def __init__(self, allocator: PluggableAllocator, device: CachingAllocator) -> None:
        super().__init__(device.backend, device.device_index)
        self.allocator = allocator
        self.supports_expandable = False

    def allocate(self, size: int, stream: int, pool: BlockPool) -> Segment | None:
        """A segment of ``size`` bytes from ``alloc_fn``, or None if it returned 0."""
        address = self.allocator.alloc_fn(size, self.index, stream)
        if isinstance(address, bool) or not isinstance(address, int) or address < 0:
            raise TypeError(
                f"PluggableAllocator alloc_fn returned {address!r} for {size} bytes; it must "
                "return the memory's address (an int > 0), or 0 when there is no memory"
            )
        if address == 0:
            return None
        return Segment(address, size, stream, pool)

    def release(self, segment: Segment) -> None:
        """Give the segment back through ``free_fn``."""
        self.allocator.free_fn(segment.address, segment.size, self.index, segment.stream)


_ids = itertools.count(1)
_ids_lock = threading.Lock()


class MemPool:
    """A private pool of device memory.

    Parameters
    ----------
    allocator : PluggableAllocator, optional
        Where the pool's segments come from; None (default): the device, as for every other
        pool. A pool with an allocator never uses expandable segments.
    use_on_oom : bool
        Let requests outside any pool (the device's default pools) take a free block of
        this pool when they would otherwise raise ``OutOfMemoryError``: the last step of
        the malloc ladder (docs/allocator.md section 6), after the cache was released and
        retried. Only blocks already free in the pool are lent, no new memory; the block
        stays the pool's (it returns to the pool when freed). Default False.
    no_split : bool
        Never split the pool's blocks: a request takes a whole free block (or a whole new
        segment: 2 MiB for requests up to 1 MiB, 20 MiB up to 10 MiB), and the rest of it
        is allocated with it (``memory_allocated`` counts it). Default False.

    Attributes
    ----------
    id : tuple of (int, int)
        ``(0, k)`` with k = 1, 2, ... in creation order; snapshots give it as the segments'
        ``segment_pool_id`` ((0, 0) is the device's default pool).

    Raises
    ------
    TypeError
        If ``allocator`` is not a ``PluggableAllocator`` or None, or ``use_on_oom`` or
        ``no_split`` is not a bool.

    Notes
    -----
    The pool binds to the device it is first used on (:func:`use_mem_pool`); ``use_on_oom``
    lends blocks on that device only. Blocks keep their pool alive: a buffer allocated in the
    pool can be freed after the ``MemPool`` object is gone, and goes back to the pool. Once
    the object is gone and none of its blocks is allocated, the pool's memory is returned to
    the device (through ``allocator.free_fn`` if it has one). ``accelrt.empty_cache()``, and
    the retry before ``use_on_oom`` is tried, release what every pool caches whole, so the
    blocks lent on OOM are the free pieces of the pool's partly used segments. Mirrors
    ``torch.cuda.MemPool(allocator, use_on_oom, no_split)`` (PyTorch 2.14), whose
    ``empty_cache()`` leaves a live pool's cache alone (docs/allocator.md section 14).

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

    __slots__ = (
        "__weakref__",
        "_allocator",
        "_custom",
        "_no_split",
        "_use_on_oom",
        "_users",
        "id",
    )

    def __init__(
        self,
        allocator: PluggableAllocator | None = None,
        use_on_oom: bool = False,
        no_split: bool = False,
    ) -> None:
        if allocator is not None and not isinstance(allocator, PluggableAllocator):
            raise TypeError(
                f"MemPool allocator must be an accelrt.memory.PluggableAllocator or None, got "
                f"{allocator!r}"
            )
        for name, value in (("use_on_oom", use_on_oom), ("no_split", no_split)):
            if not isinstance(value, bool):
                raise TypeError(f"MemPool {name} must be a bool, got {value!r}")
        with _ids_lock:
            self.id: PoolId = (0, next(_ids))
        self._allocator: CachingAllocator | None = None
        self._custom = allocator
        self._users = 0  # use_mem_pool contexts inside, graphs holding a capture
        self._use_on_oom = use_on_oom
        self._no_split = no_split

    allocator: read_only[PluggableAllocator | None] = read_only(
        "_custom",
        """The ``PluggableAllocator`` the pool's segments come from, or None (the device).

        Mirrors ``torch.cuda.MemPool.allocator``.""",
    )

    use_on_oom: read_only[bool] = read_only(
        "_use_on_oom", "Whether the pool lends its free blocks to requests that ran out of memory."
    )
    no_split: read_only[bool] = read_only(
        "_no_split", "Whether the pool hands its blocks out whole, never split."
    )

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
            allocator.create_pool(
                self.id,
                no_split=self.no_split,
                use_on_oom=self.use_on_oom,
                source=None if self._custom is None else _PluggableSource(self._custom, allocator),
            )
            self._allocator = allocator
            weakref.finalize(self, allocator.release_pool, self.id)
        elif self._allocator is not allocator:
            raise ValueError(
                f"MemPool {self.id} belongs to device {self._allocator.device_name}; it cannot "
                f"be used on {allocator.device_name}. Make one MemPool per device."
            )

    def snapshot(self, include_traces: bool = True) -> list[SegmentInfo]:
        """Return the pool's segments and blocks in the snapshot schema (empty before use).

        Parameters
        ----------
        include_traces : bool
            Accepted as PyTorch's: the result is the segments either way (PyTorch's
            ``memory_snapshot(mempool_id)`` returns only them too).

        Raises
        ------
        TypeError
            If ``include_traces`` is not a bool.

        Notes
        -----
        Mirrors ``torch.cuda.MemPool.snapshot``; ``accelrt.memory_snapshot(mempool_id=pool.id)``
        gives the whole snapshot (history included) restricted to the pool's segments.
        """
        if not isinstance(include_traces, bool):
            raise TypeError(f"include_traces must be a bool, got {include_traces!r}")
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
        options = "".join(
            f", {name}=True" for name in ("use_on_oom", "no_split") if getattr(self, name)
        )
        custom = "" if self._custom is None else f", allocator={self._custom!r}"
        return f"MemPool(id={self.id}, device={self.device}{custom}{options})"


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
