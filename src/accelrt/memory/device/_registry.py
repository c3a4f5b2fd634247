"""The allocators of the process: one ``CachingAllocator`` per (backend, device), and the settings.

Allocators are created on a device's first allocation with the current settings
(``ACCELRT_ALLOC_CONF`` until ``set_allocator_settings`` changes them); a settings change
applies to every existing allocator. Mirrors c10's per-device ``DeviceCachingAllocator`` table.
"""

from __future__ import annotations

import threading

from ... import _runtime
from ...backends._base import Backend
from .._config import AllocatorConfig
from ._core import CachingAllocator

__all__ = [
    "allocator_config",
    "get_allocator",
    "peek_allocator",
    "set_allocator_config",
]

_lock = threading.RLock()
_allocators: dict[tuple[str, int], CachingAllocator] = {}
_config: list[AllocatorConfig] = []


def allocator_config() -> AllocatorConfig:
    """Return the settings new allocators get (``ACCELRT_ALLOC_CONF`` until changed).

    Raises
    ------
    ValueError
        If ``ACCELRT_ALLOC_CONF`` is invalid.
    """
    with _lock:
        if not _config:
            _config.append(AllocatorConfig.from_env())
        return _config[0]


def set_allocator_config(config: AllocatorConfig) -> None:
    """Apply ``config`` to every existing allocator and to those created later."""
    with _lock:
        _config[:] = [config]
        for allocator in _allocators.values():
            allocator.set_config(config)


def get_allocator(backend: Backend, index: int) -> CachingAllocator:
    """Return the allocator of a device, creating it on first use.

    Raises
    ------
    ValueError
        If ``ACCELRT_ALLOC_CONF`` is invalid (when the first allocator is made).
    """
    allocator = _allocators.get((backend.name, index))
    if allocator is not None:
        return allocator
    with _lock:
        allocator = _allocators.get((backend.name, index))
        if allocator is None:
            allocator = CachingAllocator(backend, index, allocator_config())
            _allocators[(backend.name, index)] = allocator
        return allocator


def peek_allocator(backend: Backend, index: int) -> CachingAllocator | None:
    """Return the allocator of a device if it exists; never creates one."""
    return _allocators.get((backend.name, index))


def _reset() -> None:
    with _lock:
        for allocator in _allocators.values():
            allocator.empty_cache()
        _allocators.clear()
        _config.clear()


_runtime.on_reset(_reset)
