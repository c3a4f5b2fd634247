"""Counting CUDA devices through NVML, without initialising the CUDA driver in this process.

A process that has called ``cuInit`` cannot use CUDA in a child it forks (the child's first
driver call fails with ``CUDA_ERROR_NOT_INITIALIZED``). Counting devices must not cost a
program its forked workers, so the ``cuda`` backend counts them with NVML, as
``torch.cuda.device_count`` does, and calls ``cuInit`` only when a device is first used.
"""

from __future__ import annotations

import ctypes
import importlib.metadata
import os
import re
from collections.abc import Callable

NVML_LIBRARY = "libnvidia-ml.so.1"
_LEADING_INT = re.compile(r"\s*([+-]?\d+)")

NVMLCount = Callable[[], "int | None"]
"""How the backend counts GPUs before ``cuInit``: a count, or None when it cannot tell."""


def _visible_count(value: str | None, physical: int) -> int | None:
    """How many of ``physical`` GPUs CUDA shows under ``CUDA_VISIBLE_DEVICES=value``.

    Follows the driver's rules as ``torch.cuda`` reads them: entries up to the first that is
    not a non-negative integer (a leading integer counts: ``"1abc"`` is 1); a repeated
    entry among those hides every device; the count stops at the first that names a GPU
    beyond ``physical``. Returns None for the UUID and MIG forms (``GPU-...``, ``MIG-...``),
    which only the driver can resolve.
    """
    if value is None:
        return physical
    ordinals: list[int] = []
    for entry in value.split(","):
        if entry.strip().startswith(("GPU-", "MIG-")):
            return None
        match = _LEADING_INT.match(entry)
        if match is None or int(match.group(1)) < 0:
            break
        ordinals.append(int(match.group(1)))
    if len(set(ordinals)) < len(ordinals):
        return 0
    return next((i for i, ordinal in enumerate(ordinals) if ordinal >= physical), len(ordinals))


def _bindings_major() -> int | None:
    """The major version of the installed ``cuda-bindings`` (13 needs a CUDA 13 driver), or
    None when it cannot be read."""
    try:
        return int(importlib.metadata.version("cuda-bindings").split(".")[0])
    except (importlib.metadata.PackageNotFoundError, ValueError):
        return None


def nvml_device_count() -> int | None:
    """The number of GPUs CUDA will show this process, read through NVML; None when NVML is
    missing or fails, when the driver is older than ``cuda-bindings`` needs (its CUDA major
    version below the bindings' major: ``cuInit`` would fail, and the driver's own count says
    why), or when ``CUDA_VISIBLE_DEVICES`` names devices by UUID (then the driver must count
    them). Never raises; does not initialise CUDA."""
    try:
        nvml = ctypes.CDLL(NVML_LIBRARY)
    except OSError:
        return None
    if nvml.nvmlInit_v2() != 0:
        return None
    try:
        count, cuda_version = ctypes.c_uint(0), ctypes.c_int(0)
        if nvml.nvmlDeviceGetCount_v2(ctypes.byref(count)) != 0:
            return None
        if nvml.nvmlSystemGetCudaDriverVersion_v2(ctypes.byref(cuda_version)) != 0:
            return None
    finally:
        nvml.nvmlShutdown()
    needed = _bindings_major()
    if needed is not None and cuda_version.value // 1000 < needed:
        return None
    return _visible_count(os.environ.get("CUDA_VISIBLE_DEVICES"), count.value)
