"""Glue between accelrt and other GPU libraries, one module per optional dependency.

- :mod:`accelrt.interop.cupy`: ``use_accelrt_allocator()`` makes CuPy allocate from accelrt's
  caching allocator (``cupy.cuda.set_allocator``), stream-ordered on CuPy's current stream;
- :mod:`accelrt.interop.numba`: ``use_accelrt_allocator()`` installs an External Memory
  Management plugin so Numba's device arrays come from accelrt.

(The DLPack capsules ``Buffer.__dlpack__`` hands out for CUDA memory are built in
``accelrt.memory.buffers._dlpack``.)

Nothing here is imported by ``import accelrt``; each module imports its library only when a
function that needs it is called, and raises an ``ImportError`` naming the pip package when it
is missing.
"""

from __future__ import annotations

import importlib
from types import ModuleType
from typing import Any

__all__: list[str] = []


def _library(name: str, user: str, library: str, hint: str) -> ModuleType:
    """Import the module ``name`` that ``accelrt.interop.<user>`` needs, or raise an
    ``ImportError`` that names ``library`` and how to install it (``hint``)."""
    try:
        return importlib.import_module(name)
    except ImportError as exc:
        raise ImportError(f"accelrt.interop.{user} needs {library}: {hint} ({exc})") from exc


def _cuda_index(backend: Any, ordinal: int, whose: str) -> int:
    """The accelrt device index of CUDA device ``ordinal`` on ``backend`` (the ``cuda``
    backend), counting only what ``ACCELRT_VISIBLE_DEVICES`` shows; ``whose`` names where the
    ordinal came from in the error (e.g. ``"CuPy's current device"``).

    Raises
    ------
    ValueError
        If no visible device is that CUDA device.
    """
    physical = getattr(backend, "physical_index", None)
    for index in range(backend.device_count()):
        if (physical(index) if physical is not None else index) == ordinal:
            return index
    raise ValueError(
        f"CUDA device {ordinal} ({whose}) is not visible to accelrt; check ACCELRT_VISIBLE_DEVICES"
    )
