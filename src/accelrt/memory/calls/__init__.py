"""``empty`` and ``copy_``, the public calls that allocate device memory and copy it.

The compiled ones (calls/_native.pyx) where the compiled ``Buffer`` runs (buffers/_native.pyx),
else the Python ones (calls/_calls.py); the compiled ones fall back to the Python ones for
every call they do not take, so both cores behave alike (docs/design.md, "Two cores").
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..._compiled import load
from ..buffers._buffer import native as _buffer_native

__all__ = ["copy_", "empty", "native"]

#: calls/_native.pyx where the compiled Buffer runs, else None
native = None if _buffer_native is None else load("accelrt.memory.calls._native")[0]

if TYPE_CHECKING or native is None:
    from ._calls import copy_, empty
else:  # the compiled forms, documented by their Python twins
    empty = native.empty
    copy_ = native.copy_
