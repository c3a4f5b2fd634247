"""The SYCL runtime through dpctl for the ``xpu`` backend: the OpenCL ICD set-up, importing
dpctl, naming devices, mapping dpctl's errors, and dpctl's C interface for what its Python
layer lacks (``DPCTLQueue_Memset``)."""

from __future__ import annotations

import ctypes
import glob
import os
import sys
from types import ModuleType
from typing import TYPE_CHECKING

from ..._errors import AcceleratorError
from ..._text import error_line

if TYPE_CHECKING:
    from dpctl import SyclDevice

INSTALL_HINT = "pip install 'accelrt[xpu]'"
"""How to install what the backend needs (dpctl and Intel's OpenCL CPU runtime)."""


_icd_note: list[str] = []  # what setup_icd did, for unavailable_reason


def setup_icd() -> str | None:
    """Point the OpenCL ICD loader at Intel's runtime inside the environment, where needed.

    Returns
    -------
    str or None
        The library ``OCL_ICD_FILENAMES`` was set to, or None when nothing was done: the
        variable was already set (the user's choice wins), or no ``libintelocl.so*`` is in
        ``sys.prefix/lib`` (no ``intel-opencl-rt`` installed).

    Notes
    -----
    Must run before dpctl first enumerates devices (the SYCL runtime reads the variable once);
    the backend calls it before importing dpctl. It changes ``os.environ``, so subprocesses
    see the same devices. Other OpenCL ICDs (``/etc/OpenCL/vendors``) stay visible: the loader
    loads the listed file in addition to those. PyOpenCL's bundled loader ignores it.
    """
    if os.environ.get("OCL_ICD_FILENAMES"):
        return None
    libdir = os.path.join(sys.prefix, "lib")
    found = sorted(glob.glob(os.path.join(libdir, "libintelocl.so.*")))
    found = [p for p in found if not p.endswith(".py")]
    if not found and os.path.exists(os.path.join(libdir, "libintelocl.so")):
        found = [os.path.join(libdir, "libintelocl.so")]
    if not found:
        return None
    os.environ["OCL_ICD_FILENAMES"] = found[-1]
    return found[-1]


def _import_dpctl() -> ModuleType:
    """Set up the ICD (once), then import dpctl and dpctl.memory."""
    if not _icd_note:
        path = setup_icd()
        _icd_note.append(path or "")
    import dpctl
    import dpctl.memory

    module: ModuleType = dpctl
    return module


def _describe(device: SyclDevice) -> str:
    """A SYCL device in words: its filter string and name (a sub-device has no filter)."""
    try:
        where = repr(str(device.filter_string))
    except Exception:  # dpctl: "This SyclDevice is not a root device"
        where = "(a sub-device)"
    return f"{where} {str(device.name).strip()!r}"


def _raise_driver_error(call: str, exc: Exception) -> None:
    """Raise ``AcceleratorError`` from ``exc`` if dpctl (or SYCL) raised it; return otherwise."""
    if type(exc).__module__.partition(".")[0] == "dpctl":
        raise AcceleratorError(f"SYCL {call} failed: {error_line(exc)}") from exc


_dpctl_lib: list[ctypes.CDLL] = []


def _memset_lib(dpctl: ModuleType) -> ctypes.CDLL:
    """dpctl's C interface with ``DPCTLQueue_Memset`` and ``DPCTLEvent_Delete`` typed."""
    if not _dpctl_lib:
        lib = ctypes.CDLL(os.path.join(dpctl.__path__[0], "libDPCTLSyclInterface.so"))
        lib.DPCTLQueue_Memset.restype = ctypes.c_void_p
        lib.DPCTLQueue_Memset.argtypes = [
            ctypes.c_void_p, ctypes.c_void_p, ctypes.c_uint8, ctypes.c_size_t,
        ]  # fmt: skip
        lib.DPCTLEvent_Delete.restype = None
        lib.DPCTLEvent_Delete.argtypes = [ctypes.c_void_p]
        _dpctl_lib.append(lib)
    return _dpctl_lib[0]
