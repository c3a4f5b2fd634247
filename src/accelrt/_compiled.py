"""Whether accelrt's compiled modules run: one switch for all of them.

``pip install`` builds the compiled modules where it can: the allocator's hit path
(memory/device/_native.pyx, with a Python twin), the public fast path over it
(memory/buffers/_native.pyx: ``Buffer``; memory/calls/_native.pyx: ``empty``, ``copy_``; with
Python twins) and the streams' per-call methods (_stream_ops.py, one Python source that Cython
compiles as it is).
The Python code runs where they were not built, or everywhere when ``ACCELRT_PURE_PYTHON`` is
set to a true value (docs/design.md, "Two cores").
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys
from pathlib import Path
from types import ModuleType

__all__ = ["STREAM_OPS", "STREAM_OPS_REASON", "load", "load_source_or_build"]

_TRUE = {"1", "true", "yes", "on"}


def load(name: str) -> tuple[ModuleType | None, str]:
    """Import the compiled module ``name`` (absolute, e.g. ``"accelrt.memory.device._native"``).

    Returns
    -------
    (module or None, reason)
        None, with why, when ``ACCELRT_PURE_PYTHON`` is set, the module is not built, or
        ``accelrt._stream_ops`` runs from its source (the compiled modules ``cimport`` its
        ``Epoch``, so they run with its build or not at all); otherwise the module and
        ``"built at install"``.
    """
    if _pure():
        return None, "ACCELRT_PURE_PYTHON is set"
    if _is_source(STREAM_OPS):
        return None, f"accelrt._stream_ops is not compiled ({STREAM_OPS_REASON})"
    try:
        return importlib.import_module(name), "built at install"
    except ImportError as exc:  # no compiler at install time, or a foreign build
        return None, f"the compiled core is not built ({exc})"


def _pure() -> bool:
    return os.environ.get("ACCELRT_PURE_PYTHON", "").strip().lower() in _TRUE


def load_source_or_build(name: str) -> tuple[ModuleType, str]:
    """Import ``name`` (absolute, e.g. ``"accelrt._stream_ops"``), a Python module that is also
    compiled from the same source at install (Cython's pure-Python mode).

    Returns
    -------
    (module, reason)
        The build and ``"built at install"``; or, where ``ACCELRT_PURE_PYTHON`` is set or
        there is no build that imports, the module run from its ``.py`` source, and why.
        Either way it is ``sys.modules[name]``, so every later import of ``name`` gets it.
    """
    reason = "ACCELRT_PURE_PYTHON is set"
    if name not in sys.modules and not _pure():
        try:
            importlib.import_module(name)
        except ImportError as exc:  # a build for another interpreter
            reason = f"the compiled module does not import ({exc})"
    module = sys.modules.get(name)
    if module is not None:
        if not _is_source(module):
            return module, "built at install"
        return module, reason if _pure() else "the compiled module is not built"
    package, _, stem = name.rpartition(".")
    source = Path(importlib.import_module(package).__path__[0]) / f"{stem}.py"
    spec = importlib.util.spec_from_file_location(name, source)
    assert spec is not None and spec.loader is not None, source
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[name]
        raise
    return module, reason


def _is_source(module: ModuleType) -> bool:
    return (module.__file__ or "").endswith(".py")


# The modules compiled from their Python source, chosen before anything imports them (this
# module is the first that ``import accelrt`` runs).
STREAM_OPS, STREAM_OPS_REASON = load_source_or_build("accelrt._stream_ops")
