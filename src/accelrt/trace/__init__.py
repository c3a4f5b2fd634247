"""Allocation traces: read and write accelrt's JSONL format; record one from PyTorch.

The format (docs/allocator.md section 12) is gzip'd JSON Lines: a header object, then one event a
line, ``{"action": "alloc" | "free", "addr", "size", "stream", "t"}`` or
``{"action": "empty_cache"}``. In memory a trace's events are numpy columns
(:class:`TraceEvents`, 25 bytes an event), read without a Python object per line; its ``op``
column holds ``OP_ALLOC``, ``OP_FREE`` and ``OP_EMPTY_CACHE``; its named stretches
(``Trace.phases``) are :class:`Phase` objects.

A PyTorch memory snapshot becomes a trace per device that recorded history
(:func:`devices_with_history`): one with :func:`trace_from_snapshot`, all of them with
:func:`traces_from_snapshot`.
"""

from __future__ import annotations

from ._columns import OP_ALLOC as OP_ALLOC
from ._columns import OP_EMPTY_CACHE as OP_EMPTY_CACHE
from ._columns import OP_FREE as OP_FREE
from ._columns import TraceEvents as TraceEvents
from ._format import Trace as Trace
from ._format import TraceEvent as TraceEvent
from ._format import TraceFormatError as TraceFormatError
from ._format import write as write
from ._load import load as load
from ._phases import Phase as Phase
from ._snapshot import devices_with_history as devices_with_history
from ._snapshot import trace_from_snapshot as trace_from_snapshot
from ._snapshot import traces_from_snapshot as traces_from_snapshot
from ._snapshot_schema import read_snapshot as read_snapshot
from ._torch import record_torch as record_torch

__all__ = [
    "OP_ALLOC",
    "OP_EMPTY_CACHE",
    "OP_FREE",
    "Phase",
    "Trace",
    "TraceEvent",
    "TraceEvents",
    "TraceFormatError",
    "devices_with_history",
    "load",
    "read_snapshot",
    "record_torch",
    "trace_from_snapshot",
    "traces_from_snapshot",
    "write",
]
