"""accelrt: a framework-neutral, device-agnostic runtime for stream-based accelerators.

One API, modelled on ``torch.accelerator``, for devices, streams, events, synchronization and
device memory from a PyTorch-compatible caching allocator, whatever the hardware: OpenCL
(PyOpenCL; PoCL's CPU device on machines without a GPU) and a simulated device.

Importing accelrt initialises no driver.

>>> import accelrt as acc
>>> acc.current_accelerator()                         # doctest: +SKIP
Device(type='opencl', index=None)
"""

from __future__ import annotations

from typing import TYPE_CHECKING

# first: chooses the build or the Python source of the modules compiled from Python source
from . import _compiled as _compiled
from . import backends as backends
from . import memory as memory
from ._accelerator import current_accelerator as current_accelerator
from ._accelerator import current_device_index as current_device_index
from ._accelerator import device_count as device_count
from ._accelerator import device_index as device_index
from ._accelerator import get_device_capability as get_device_capability
from ._accelerator import get_device_name as get_device_name
from ._accelerator import get_device_properties as get_device_properties
from ._accelerator import is_available as is_available
from ._accelerator import set_device_index as set_device_index
from ._accelerator import synchronize as synchronize
from ._device import Device as Device
from ._device import DeviceProperties as DeviceProperties
from ._errors import AcceleratorError as AcceleratorError
from ._errors import OutOfMemoryError as OutOfMemoryError
from ._graph import Graph as Graph
from ._graph import is_graph_available as is_graph_available
from ._stream import Event as Event
from ._stream import Stream as Stream
from ._stream import current_stream as current_stream
from ._stream import set_stream as set_stream
from ._units import format_bytes as format_bytes
from ._units import parse_bytes as parse_bytes
from ._version import __version__ as __version__
from .memory import AllocatorConfig as AllocatorConfig
from .memory import Buffer as Buffer
from .memory import HostBuffer as HostBuffer
from .memory import copy_ as copy_
from .memory import dump_snapshot as dump_snapshot
from .memory import empty as empty
from .memory import empty_cache as empty_cache
from .memory import empty_host as empty_host
from .memory import empty_host_cache as empty_host_cache
from .memory import get_memory_info as get_memory_info
from .memory import host_memory_stats as host_memory_stats
from .memory import max_memory_allocated as max_memory_allocated
from .memory import max_memory_reserved as max_memory_reserved
from .memory import memory_allocated as memory_allocated
from .memory import memory_reserved as memory_reserved
from .memory import memory_snapshot as memory_snapshot
from .memory import memory_stats as memory_stats
from .memory import memory_summary as memory_summary
from .memory import record_memory_history as record_memory_history
from .memory import record_stream as record_stream
from .memory import reset_accumulated_host_memory_stats as reset_accumulated_host_memory_stats
from .memory import reset_accumulated_memory_stats as reset_accumulated_memory_stats
from .memory import reset_peak_host_memory_stats as reset_peak_host_memory_stats
from .memory import reset_peak_memory_stats as reset_peak_memory_stats
from .memory import set_allocator_settings as set_allocator_settings
from .memory import set_per_process_memory_fraction as set_per_process_memory_fraction

if TYPE_CHECKING:
    from ._sweep import sweep as sweep
else:

    def sweep(*args: object, **kwargs: object) -> object:
        """Replay traces under a grid of allocator settings and capacities, in parallel.

        The signature, documentation and errors are those of ``accelrt._sweep.sweep``
        (docs/sweep.md), which this stub imports on first use and puts in its place:
        ``import accelrt`` imports neither Dask nor the sweep machinery (70 ms). A stub, not
        a module ``__getattr__``: CPython does not specialize attribute loads on a module
        that has one, which made every ``acc.empty`` lookup cost 14 ns more.
        """
        from ._sweep import sweep as run

        globals()["sweep"] = run
        return run(*args, **kwargs)


__all__ = [
    "AcceleratorError",
    "AllocatorConfig",
    "Buffer",
    "Device",
    "DeviceProperties",
    "Event",
    "Graph",
    "HostBuffer",
    "OutOfMemoryError",
    "Stream",
    "backends",
    "copy_",
    "current_accelerator",
    "current_device_index",
    "current_stream",
    "device_count",
    "device_index",
    "dump_snapshot",
    "empty",
    "empty_cache",
    "empty_host",
    "empty_host_cache",
    "format_bytes",
    "get_device_capability",
    "get_device_name",
    "get_device_properties",
    "get_memory_info",
    "host_memory_stats",
    "is_available",
    "is_graph_available",
    "max_memory_allocated",
    "max_memory_reserved",
    "memory",
    "memory_allocated",
    "memory_reserved",
    "memory_snapshot",
    "memory_stats",
    "memory_summary",
    "parse_bytes",
    "record_memory_history",
    "record_stream",
    "reset_accumulated_host_memory_stats",
    "reset_accumulated_memory_stats",
    "reset_peak_host_memory_stats",
    "reset_peak_memory_stats",
    "set_allocator_settings",
    "set_device_index",
    "set_per_process_memory_fraction",
    "set_stream",
    "sweep",
    "synchronize",
]
