"""Backends: one module per kind of device, all behind the ``Backend`` Protocol.

Built in: ``cuda`` (NVIDIA GPUs through ``cuda-bindings``), ``opencl`` (PyOpenCL; the PoCL
CPU device where there is no GPU), ``xpu`` (Intel's SYCL runtime through ``dpctl``: Level Zero
GPUs, else Intel's OpenCL CPU device) and ``sim`` (a simulated device that only hands out
addresses). Third-party packages add backends through the
entry-point group ``accelrt.backends``; each entry point names a class (or a factory) that
returns an object satisfying :class:`Backend`, and optionally :class:`GraphCapture` (graph
capture for ``accelrt.Graph``).
"""

from __future__ import annotations

from collections.abc import Callable

from ._base import (
    Backend as Backend,
)
from ._base import (
    BackendOutOfMemory as BackendOutOfMemory,
)
from ._base import (
    GraphCapture as GraphCapture,
)
from ._base import (
    available_backends as available_backends,
)
from ._base import (
    get_backend as get_backend,
)
from ._base import (
    registered_backends as registered_backends,
)

_chooser: list[Callable[[str], Backend]] = []  # accelrt._runtime.use, once it is imported


def _install_use(chooser: Callable[[str], Backend]) -> None:
    """Give :func:`use` the function that makes a backend the accelerator.

    ``accelrt._runtime`` calls this when it is imported (``import accelrt`` imports it), so
    that this package imports nothing above it.
    """
    _chooser[:] = [chooser]


def use(name: str) -> Backend:
    """Make the backend called ``name`` the process's accelerator (e.g. ``use("sim")``).

    Raises ``ValueError`` for an unregistered name. See ``accelrt._runtime.use``.
    """
    if not _chooser:  # only while accelrt itself is being imported
        raise RuntimeError("accelrt.backends.use() needs accelrt imported first (import accelrt)")
    return _chooser[0](name)


__all__ = [
    "Backend",
    "BackendOutOfMemory",
    "GraphCapture",
    "available_backends",
    "get_backend",
    "registered_backends",
    "use",
]
