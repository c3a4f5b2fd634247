"""Device memory: the caching allocator, its pools, statistics, snapshots and settings.

The public home of memory, as ``torch.accelerator.memory`` and ``rmm.mr`` are. The top-level
``accelrt`` package re-exports the ``torch.accelerator`` names (``accelrt.empty``,
``accelrt.memory_stats``, ...); everything else about memory lives here:

- allocation and copies: :func:`empty`, :func:`copy_`, :func:`record_stream`, :class:`Buffer`;
- host (pinned) memory from the host caching allocator: :func:`empty_host`,
  :class:`HostBuffer`, :func:`empty_host_cache`, :func:`host_memory_stats` (PyTorch's keys) and
  its resets, :func:`get_host_allocator` (the :class:`HostCachingAllocator`);
- private pools: :class:`MemPool`, :func:`use_mem_pool`, :class:`PluggableAllocator` (a pool's
  segments from functions of your own);
- statistics and the cache: :func:`memory_stats` (PyTorch's keys), :func:`memory_allocated`,
  :func:`empty_cache`, ... and the summary table :func:`memory_summary`;
- history and snapshots in PyTorch's format: :func:`record_memory_history`,
  :func:`memory_snapshot`, :func:`dump_snapshot`, named stages (:func:`record_function`),
  entries stamped with :func:`set_memory_metadata`, allocations annotated after the fact
  (:func:`annotate_buffer`), and their ``TypedDict`` schemas;
- settings: :class:`AllocatorConfig` (``ACCELRT_ALLOC_CONF``), :func:`set_allocator_settings`,
  and :class:`Setting` (settings with where they came from, as the ``accelrt`` commands say);
- the machinery, for tools and replays: :func:`get_allocator` gives a device's
  :class:`CachingAllocator` (one per device, generic over a backend's primitives), whose
  ``malloc`` hands out :class:`Block` objects.

docs/allocator.md describes the allocator's behaviour exactly.
"""

from __future__ import annotations

from ._api import copy_ as copy_
from ._api import empty as empty
from ._api import empty_cache as empty_cache
from ._api import get_allocator as get_allocator
from ._api import get_memory_info as get_memory_info
from ._api import max_memory_allocated as max_memory_allocated
from ._api import max_memory_reserved as max_memory_reserved
from ._api import memory_allocated as memory_allocated
from ._api import memory_reserved as memory_reserved
from ._api import memory_stats as memory_stats
from ._api import record_stream as record_stream
from ._api import reset_accumulated_memory_stats as reset_accumulated_memory_stats
from ._api import reset_peak_memory_stats as reset_peak_memory_stats
from ._api import set_allocator_settings as set_allocator_settings
from ._api import set_per_process_memory_fraction as set_per_process_memory_fraction
from ._config import AllocatorConfig as AllocatorConfig
from ._config import Setting as Setting
from ._policy import round_size as round_size
from ._policy import segment_size as segment_size
from ._snapshots import annotate_buffer as annotate_buffer
from ._snapshots import dump_snapshot as dump_snapshot
from ._snapshots import get_memory_metadata as get_memory_metadata
from ._snapshots import memory_snapshot as memory_snapshot
from ._snapshots import memory_summary as memory_summary
from ._snapshots import record_function as record_function
from ._snapshots import record_memory_history as record_memory_history
from ._snapshots import set_memory_metadata as set_memory_metadata
from .buffers._buffer import Buffer as Buffer
from .device._core import Block as Block
from .device._core import CachingAllocator as CachingAllocator
from .device._pool import MemPool as MemPool
from .device._pool import PluggableAllocator as PluggableAllocator
from .device._pool import use_mem_pool as use_mem_pool
from .history._history import Annotation as Annotation
from .history._history import BlockInfo as BlockInfo
from .history._history import Frame as Frame
from .history._history import SegmentInfo as SegmentInfo
from .history._history import Snapshot as Snapshot
from .history._history import TraceEntry as TraceEntry
from .host._allocator import HostCachingAllocator as HostCachingAllocator
from .host._api import empty_host as empty_host
from .host._api import empty_host_cache as empty_host_cache
from .host._api import get_host_allocator as get_host_allocator
from .host._api import host_memory_stats as host_memory_stats
from .host._api import reset_accumulated_host_memory_stats as reset_accumulated_host_memory_stats
from .host._api import reset_peak_host_memory_stats as reset_peak_host_memory_stats
from .host._buffer import HostBuffer as HostBuffer

__all__ = [
    "AllocatorConfig",
    "Annotation",
    "Block",
    "BlockInfo",
    "Buffer",
    "CachingAllocator",
    "Frame",
    "HostBuffer",
    "HostCachingAllocator",
    "MemPool",
    "PluggableAllocator",
    "SegmentInfo",
    "Setting",
    "Snapshot",
    "TraceEntry",
    "annotate_buffer",
    "copy_",
    "dump_snapshot",
    "empty",
    "empty_cache",
    "empty_host",
    "empty_host_cache",
    "get_allocator",
    "get_host_allocator",
    "get_memory_info",
    "get_memory_metadata",
    "host_memory_stats",
    "max_memory_allocated",
    "max_memory_reserved",
    "memory_allocated",
    "memory_reserved",
    "memory_snapshot",
    "memory_stats",
    "memory_summary",
    "record_function",
    "record_memory_history",
    "record_stream",
    "reset_accumulated_host_memory_stats",
    "reset_accumulated_memory_stats",
    "reset_peak_host_memory_stats",
    "reset_peak_memory_stats",
    "round_size",
    "segment_size",
    "set_allocator_settings",
    "set_memory_metadata",
    "set_per_process_memory_fraction",
    "use_mem_pool",
]
