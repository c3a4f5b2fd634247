"""Whether accelrt's compiled modules run: one switch for all of them.

``pip install`` builds the compiled modules (the allocator's hit path,
memory/device/_native.pyx; the
streams' per-call methods, _native_streams.pyx) where it can. Each has a Python twin that runs
where it was not built, or everywhere when ``ACCELRT_PURE_PYTHON`` is set to a true value
(docs/design.md, "Two cores").
"""

from __future__ import annotations

import importlib
import os
from types import ModuleType

__all__ = ["load"]

_TRUE = {"1", "true", "yes", "on"}


def load(name: str) -> tuple[ModuleType | None, str]:
    """Import the compiled module ``name`` (absolute, e.g. ``"accelrt.memory.device._native"``).

    Returns
    -------
    (module or None, reason)
        None, with why, when ``ACCELRT_PURE_PYTHON`` is set or the module is not built;
        otherwise the module and ``"built at install"``.
    """
    if os.environ.get("ACCELRT_PURE_PYTHON", "").strip().lower() in _TRUE:
        return None, "ACCELRT_PURE_PYTHON is set"
    try:
        return importlib.import_module(name), "built at install"
    except ImportError as exc:  # no compiler at install time, or a foreign build
        return None, f"the compiled core is not built ({exc})"
