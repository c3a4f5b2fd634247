"""Backends: one module per kind of device, all behind the ``Backend`` Protocol.

Built in: ``cuda`` (NVIDIA GPUs through ``cuda-bindings``), ``opencl`` (PyOpenCL; the PoCL
CPU device where there is no GPU), ``xpu`` (Intel's SYCL runtime through ``dpctl``: Level Zero
GPUs, else Intel's OpenCL CPU device) and ``sim`` (a simulated device that only hands out
addresses). Third-party packages add backends through the
entry-point group ``accelrt.backends``; each entry point names a class (or a factory) that
returns an object satisfying :class:`Backend`.
"""

from __future__ import annotations

from ._base import (
    Backend as Backend,
)
from ._base import (
    BackendOutOfMemory as BackendOutOfMemory,
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


def use(name: str) -> Backend:
    """Make the backend called ``name`` the process's accelerator (e.g. ``use("sim")``).

    Raises ``ValueError`` for an unregistered name. See ``accelrt._runtime.use``.
    """
    from .._runtime import use as _use

    return _use(name)


__all__ = [
    "Backend",
    "BackendOutOfMemory",
    "available_backends",
    "get_backend",
    "registered_backends",
    "use",
]
