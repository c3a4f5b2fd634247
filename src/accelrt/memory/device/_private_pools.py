"""``PrivatePools``: the free lists of ``MemPool``s inside a device's caching allocator.

Each private pool is a pair of free lists of its own (docs/allocator.md section 14); a thread's
allocations go to the innermost pool it has begun allocating to (``begin_allocate_to_pool``,
as ``use_mem_pool`` does), and a pool whose owner is gone releases what it caches as its
blocks are freed. A base of ``SlowPath`` (device/_allocator.py), which sets ``_private`` and
``_routes``.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ..._warn import warn_user
from .._atomic import atomic
from .._policy import K_SMALL_SIZE
from ._block import Block, BlockPool, PoolId

if TYPE_CHECKING:
    from ._source import MemorySource

__all__ = ["PrivatePool", "PrivatePools"]


class PrivatePool:
    """The free lists of one ``MemPool`` on this device, whether its owner still exists, and
    its options (``MemPool(allocator=, use_on_oom=, no_split=)``; device/_pool.py)."""

    __slots__ = ("large", "no_split", "owner_alive", "small", "source", "use_on_oom")

    def __init__(
        self,
        pool_id: PoolId,
        pool_type: type[BlockPool],
        *,
        no_split: bool = False,
        use_on_oom: bool = False,
        source: MemorySource | None = None,
    ) -> None:
        self.small = pool_type(is_small=True, pool_id=pool_id)
        self.large = pool_type(is_small=False, pool_id=pool_id)
        self.owner_alive = True
        self.no_split = no_split  # blocks are handed out whole, never split
        self.use_on_oom = use_on_oom  # free blocks serve default-pool requests that ran out
        self.source = source  # where its segments come from; None: the device's source


class PrivatePools:
    """Private pools' free lists, routing and release: a base of ``SlowPath``, which sets the
    attributes and defines the methods declared here."""

    _private: dict[PoolId, PrivatePool]  # pool id -> its free lists
    _routes: dict[int, list[PoolId]]  # thread id -> the pools it allocates to, innermost last
    _BlockPool: type[BlockPool]
    _small: BlockPool
    _large: BlockPool
    _lock: Any
    device_name: str
    _get_free_block: Callable[[BlockPool, int, int], Block | None]
    _release_pool_blocks: Callable[[BlockPool], None]
    _release_unused_ranges: Callable[[BlockPool], None]
    _forget_dropped_pools: Callable[[], None]
    _deferred_inside_operation: Callable[..., bool]

    def _routed_pool(self, size: int) -> BlockPool:
        ids = self._routes.get(threading.get_ident())
        if not ids:
            return self._small if size <= K_SMALL_SIZE else self._large
        private = self._private[ids[-1]]
        return private.small if size <= K_SMALL_SIZE else private.large

    def _borrow_on_oom(self, size: int, stream: int) -> Block | None:
        """The last resort of a default-pool request: a free block of a ``use_on_oom`` pool.

        Pools are tried in creation order; only their free blocks (no new memory). Mirrors the
        ``use_on_oom_pools`` step of PyTorch's ``DeviceCachingAllocator::malloc``.
        """
        for private in self._private.values():
            if private.use_on_oom and private.owner_alive:
                pool = private.small if size <= K_SMALL_SIZE else private.large
                block = self._get_free_block(pool, size, stream)
                if block is not None:
                    return block
        return None

    @atomic
    def create_pool(
        self,
        pool_id: PoolId,
        *,
        no_split: bool = False,
        use_on_oom: bool = False,
        source: MemorySource | None = None,
    ) -> None:
        """Make the free lists of private pool ``pool_id`` (a ``MemPool``); no-op if they exist.

        ``no_split``: its blocks are never split (a request takes a whole free block or a new
        segment). ``use_on_oom``: its free blocks serve default-pool requests that would
        otherwise raise ``OutOfMemoryError``. ``source``: where its segments come from
        (``MemPool(allocator=...)``); its segments are then never expandable.
        """
        with self._lock:
            if pool_id not in self._private:
                self._private[pool_id] = PrivatePool(
                    pool_id,
                    self._BlockPool,
                    no_split=no_split,
                    use_on_oom=use_on_oom,
                    source=source,
                )

    def _pool_no_split(self, pool_id: PoolId) -> bool:
        """Whether private pool ``pool_id`` hands its blocks out whole (``no_split``)."""
        private = self._private.get(pool_id)
        return private is not None and private.no_split

    @atomic
    def begin_allocate_to_pool(self, pool_id: PoolId) -> None:
        """Route the calling thread's allocations to private pool ``pool_id`` (nestable)."""
        with self._lock:
            self.create_pool(pool_id)
            self._routes.setdefault(threading.get_ident(), []).append(pool_id)

    @atomic
    def end_allocate_to_pool(self, pool_id: PoolId) -> None:
        """Undo the calling thread's latest :meth:`begin_allocate_to_pool` of ``pool_id``.

        Contexts may end in any order (asyncio tasks interleave so): the pool's latest entry
        is removed wherever it is, and the thread goes on allocating to the latest pool still
        begun, or to the default pool. Mirrors ``endAllocateToPool`` of PyTorch's
        CUDACachingAllocator, which also removes the pool's entry wherever it is.

        Raises
        ------
        ValueError
            If the thread is not allocating to that pool; the routing is unchanged.
        """
        with self._lock:
            ident = threading.get_ident()
            ids = self._routes.get(ident, [])
            if pool_id not in ids:
                raise ValueError(
                    f"{self.device_name}: this thread is not allocating to pool {pool_id}"
                )
            del ids[len(ids) - 1 - ids[::-1].index(pool_id)]
            if not ids:
                del self._routes[ident]

    @atomic
    def release_pool(self, pool_id: PoolId) -> None:
        """The pool's owner is gone: release what it caches now, the rest as its blocks are freed.

        The pool's id is forgotten once it holds no segment. Called by a finaliser, so inside
        an operation of this allocator on this thread it waits for that operation to end, and
        a driver error while releasing is a ``RuntimeWarning`` (``empty_cache`` retries).
        """
        if self._deferred_inside_operation(self.release_pool, pool_id):
            return
        with self._lock:
            private = self._private.get(pool_id)
            if private is not None:
                private.owner_alive = False
                self._release_dropped_pool_cache(pool_id)

    def _release_if_abandoned(self, pool_id: PoolId) -> None:
        private = self._private.get(pool_id)
        if private is None or private.owner_alive:  # None: forgotten as another pool was
            return
        try:
            for pool in (private.large, private.small):  # nothing can allocate from it any more
                self._release_pool_blocks(pool)
                self._release_unused_ranges(pool)
        finally:
            self._forget_dropped_pools()

    def pool_ids(self) -> list[PoolId]:
        """Return the ids of the private pools that still exist on this device."""
        with self._lock:
            return list(self._private)

    def _release_dropped_pool_cache(self, pool_id: PoolId) -> None:
        """After a free into a private pool: release it if its owner is gone. The free itself
        has happened, so a driver error here is a warning (``empty_cache`` retries later)."""
        try:
            self._release_if_abandoned(pool_id)
        except Exception as exc:
            warn_user(
                f"{self.device_name}: releasing the cache of dropped MemPool {pool_id} failed "
                f"({exc}); empty_cache() releases it later",
                RuntimeWarning,
            )
