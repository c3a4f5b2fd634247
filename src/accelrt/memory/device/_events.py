"""Frees that wait for other streams' work, and finalisers' frees deferred: the stream-event
logic the device and host caching allocators share (c10's ``insert_events`` and
``process_events``, in ``CUDACachingAllocator`` and ``CachingHostAllocator`` alike).

A block freed after other streams used it gets one event recorded on each of them; it becomes
reusable (the allocator's ``_free_block``) once all of them have completed. Events wait in
queues, each checked oldest first and no further than the first that has not completed: one
queue per stream on the device allocator, one for all on the host allocator, as in PyTorch.
Completed events are kept per device for reuse, and destroyed by ``empty_cache``.
"""

from __future__ import annotations

import functools
from collections import deque
from collections.abc import Callable
from typing import Any, Generic, Protocol, TypeVar

from ..._warn import warn_user
from ...backends._base import Backend

__all__ = ["EventBlock", "StreamEvents"]


class EventBlock(Protocol):
    """What a block needs to wait for events: its address and its count of pending events."""

    address: int
    event_count: int


B = TypeVar("B", bound=EventBlock)


class StreamEvents(Generic[B]):
    """The stream-event part of a caching allocator (a base class; it holds no state itself).

    The allocator sets ``backend``, ``_lock`` (an ``RLock``-like lock with ``_is_owned``),
    ``_events`` (``{}``), ``_idle_events`` (``{}``) and ``_finalized`` (``[]``), and defines
    ``_take_stream_uses(block)`` (the ``(device index, stream)`` pairs that used the block,
    sorted, forgotten by the block), ``_free_block(block)`` (the block is reusable) and
    ``_free_if_allocated(block)`` (a finaliser's free, run once the operation ends).
    """

    #: One event queue per stream (the device allocator) or one for all (the host allocator).
    _QUEUE_PER_STREAM = True
    #: How the warning of a free that could not record an event names the block at ``{:#x}``.
    _USED_BLOCK = "the block at {:#x}"

    backend: Backend
    _lock: Any
    #: queue (a stream, or 0) -> (event, block, device index), oldest first
    _events: dict[int, deque[tuple[Any, B, int]]]
    _idle_events: dict[int, list[Any]]  # device index -> completed events to reuse
    _finalized: list[Callable[[], None]]  # finalisers' work, run after an operation
    _free_block: Callable[[B], None]  # the host allocator's own; the device one's HitPath's

    def _take_stream_uses(self, block: B) -> list[tuple[int, int]]:
        raise NotImplementedError

    def _free_if_allocated(self, block: B) -> None:
        raise NotImplementedError

    def _catch_up(self) -> None:
        """An operation's first step: the frees finalisers deferred, then the blocks whose
        streams' events have completed (each only where there is any)."""
        if self._finalized:
            self._free_finalized()
        if self._events:
            self._process_events()

    def _release(self, block: B, used_elsewhere: bool) -> None:
        """A free's last step: ``block`` is reusable now, or, where other streams used it
        (``used_elsewhere``), once the events recorded on them have completed."""
        if used_elsewhere:
            self._insert_events(block)
        else:
            self._free_block(block)

    def _insert_events(self, block: B) -> None:
        """Record an event on every other stream that used the block; free it when none is
        needed. A stream that cannot take an event (destroyed, or a driver error) is waited
        for instead, if it still exists: the block is never stranded half-freed."""
        for device_index, stream in self._take_stream_uses(block):
            try:
                event = self._event_on(device_index, stream)
            except Exception as exc:
                self._wait_instead(block, device_index, stream, exc)
                continue
            block.event_count += 1
            key = stream if self._QUEUE_PER_STREAM else 0
            queue = self._events.get(key)
            if queue is None:
                queue = self._events[key] = deque()
            queue.append((event, block, device_index))
        if block.event_count == 0:
            self._free_block(block)

    def _event_on(self, device_index: int, stream: int) -> Any:
        idle = self._idle_events.get(device_index)
        event = idle.pop() if idle else None
        if event is None:
            event = self.backend.event_create(device_index, False)
        try:
            self.backend.event_record(event, device_index, stream)
        except BaseException:
            self._idle_events.setdefault(device_index, []).append(event)
            raise
        return event

    def _wait_instead(self, block: B, device_index: int, stream: int, exc: Exception) -> None:
        try:
            self.backend.stream_synchronize(device_index, stream)
            how = "waited for the stream instead"
        except Exception:
            how = "the stream is gone: a destroyed stream has finished its work"
        used = self._USED_BLOCK.format(block.address)
        warn_user(
            f"{self.backend.name}:{device_index}: no event could be recorded on stream "
            f"{stream:#x}, which used {used}: {exc}; {how}, so the free does not wait for it",
            RuntimeWarning,
        )

    def _process_events(self) -> None:
        idle = self._idle_events
        for key in list(self._events):
            queue = self._events[key]
            while queue:
                event, block, device_index = queue[0]
                if not self.backend.event_query(event):
                    break
                queue.popleft()
                idle.setdefault(device_index, []).append(event)
                block.event_count -= 1
                if block.event_count == 0:
                    self._free_block(block)
            if not queue:
                del self._events[key]

    def _destroy_idle_events(self) -> None:
        """Destroy the completed events kept for reuse (``empty_cache``)."""
        for idle in self._idle_events.values():
            while idle:
                self.backend.event_destroy(idle.pop())

    # ------------------------------------------------------------------ finalisers
    def _deferred_inside_operation(self, work: Callable[..., None], *args: Any) -> bool:
        """For finalisers: if this thread is inside one of this allocator's operations, queue
        ``work(*args)`` for when it ends and return True; else return False (do it now)."""
        if not self._lock._is_owned():
            return False
        self._finalized.append(functools.partial(work, *args))
        return True

    def _free_finalized(self) -> None:
        """Run what finalisers asked for inside an operation (frees, pools let go)."""
        work, self._finalized = self._finalized, []
        for item in work:
            item()
