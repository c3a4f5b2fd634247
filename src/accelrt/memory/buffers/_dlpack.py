"""DLPack capsules for device memory, built with ctypes (numpy can only export host memory).

A capsule holds a ``DLManagedTensor`` (capsule name ``"dltensor"``) or, for consumers that ask
for DLPack 1.x with ``max_version``, a ``DLManagedTensorVersioned`` (``"dltensor_versioned"``)
describing a 1-D ``uint8`` tensor. The structs, their shape array and the owner (the Buffer
and its export pin: a ``free()`` meanwhile leaves the block to the pin) are kept in
:data:`_LIVE` until the tensor's deleter runs: the consumer calls it when it is done (after
renaming the capsule to ``"used_dltensor"``), or the capsule's destructor does when no consumer
took the capsule; the block is freed then. This module imports nothing from accelrt.
"""

from __future__ import annotations

import ctypes
import threading
from typing import Any

__all__ = [
    "DLPACK_VERSION",
    "KDL_CPU",
    "KDL_CUDA",
    "DLManagedTensor",
    "DLManagedTensorVersioned",
    "live_count",
    "to_capsule",
]

KDL_CPU = 1
KDL_CUDA = 2
KDL_UINT = 1
DLPACK_VERSION = (1, 0)
"""The DLPack version of the versioned capsules made here."""

NAME = b"dltensor"
NAME_VERSIONED = b"dltensor_versioned"


class DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class DLTensor(ctypes.Structure):
    _fields_ = [
        ("data", ctypes.c_void_p),
        ("device", DLDevice),
        ("ndim", ctypes.c_int32),
        ("dtype", DLDataType),
        ("shape", ctypes.POINTER(ctypes.c_int64)),
        ("strides", ctypes.POINTER(ctypes.c_int64)),
        ("byte_offset", ctypes.c_uint64),
    ]


class DLManagedTensor(ctypes.Structure):
    pass


_Deleter = ctypes.CFUNCTYPE(None, ctypes.c_void_p)
DLManagedTensor._fields_ = [
    ("dl_tensor", DLTensor),
    ("manager_ctx", ctypes.c_void_p),
    ("deleter", _Deleter),
]


class DLPackVersion(ctypes.Structure):
    _fields_ = [("major", ctypes.c_uint32), ("minor", ctypes.c_uint32)]


class DLManagedTensorVersioned(ctypes.Structure):
    _fields_ = [
        ("version", DLPackVersion),
        ("manager_ctx", ctypes.c_void_p),
        ("deleter", _Deleter),
        ("flags", ctypes.c_uint64),
        ("dl_tensor", DLTensor),
    ]


_LIVE: dict[
    int, tuple[DLManagedTensor | DLManagedTensorVersioned, ctypes.Array[ctypes.c_int64], object]
] = {}  # struct address -> (struct, shape, owner)
_lock = threading.Lock()


def _delete(address: int | None) -> None:
    """The tensors' deleter: forget the struct, releasing the owner (never raises)."""
    try:
        with _lock:
            _LIVE.pop(address or 0, None)
    except Exception:  # a deleter must not raise into C
        pass


_DELETER = _Deleter(_delete)

_Destructor = ctypes.CFUNCTYPE(None, ctypes.c_void_p)


def _c_api(name: str, restype: Any, *argtypes: Any) -> Any:
    """A private prototype of a C API function (``ctypes.pythonapi``'s attributes are shared
    by every module, and another one setting their argtypes would break ours)."""
    return ctypes.PYFUNCTYPE(restype, *argtypes)((name, ctypes.pythonapi))


_capsule_new = _c_api(
    "PyCapsule_New", ctypes.py_object, ctypes.c_void_p, ctypes.c_char_p, _Destructor
)
_capsule_is_valid = _c_api("PyCapsule_IsValid", ctypes.c_int, ctypes.c_void_p, ctypes.c_char_p)
_capsule_pointer = _c_api("PyCapsule_GetPointer", ctypes.c_void_p, ctypes.c_void_p, ctypes.c_char_p)


def _destroy_capsule(capsule: int | None) -> None:
    """A capsule no consumer took (still named as made) calls its tensor's deleter."""
    try:
        for name in (NAME, NAME_VERSIONED):
            if _capsule_is_valid(capsule, name):
                _delete(_capsule_pointer(capsule, name))
                return
    except Exception:  # a destructor must not raise into C
        pass


_DESTRUCTOR = _Destructor(_destroy_capsule)


def to_capsule(
    ptr: int, nbytes: int, device_type: int, device_id: int, owner: object, versioned: bool
) -> object:
    """Return a DLPack capsule of the 1-D ``uint8`` tensor ``[ptr, ptr + nbytes)``.

    Parameters
    ----------
    ptr : int
        The address of the first byte (device or host, as ``device_type`` says).
    nbytes : int
        The length in bytes (the tensor's only dimension).
    device_type, device_id : int
        The DLPack device: ``KDL_CUDA`` (2) and the CUDA device ordinal, for example.
    owner : object
        Kept alive until the consumer calls the tensor's deleter (or the unconsumed capsule
        is destroyed).
    versioned : bool
        True for a DLPack 1.0 ``"dltensor_versioned"`` capsule (flags 0: writable, not a
        copy), False for a legacy ``"dltensor"`` one.

    Returns
    -------
    PyCapsule
    """
    shape = (ctypes.c_int64 * 1)(nbytes)
    managed: DLManagedTensor | DLManagedTensorVersioned
    if versioned:
        managed = DLManagedTensorVersioned()
        managed.version = DLPackVersion(*DLPACK_VERSION)
        managed.flags = 0
        name = NAME_VERSIONED
    else:
        managed = DLManagedTensor()
        name = NAME
    tensor = managed.dl_tensor
    tensor.data = ptr or None
    tensor.device = DLDevice(device_type, device_id)
    tensor.ndim = 1
    tensor.dtype = DLDataType(KDL_UINT, 8, 1)
    tensor.shape = ctypes.cast(shape, ctypes.POINTER(ctypes.c_int64))
    tensor.strides = None  # compact row-major
    tensor.byte_offset = 0
    managed.manager_ctx = None
    managed.deleter = _DELETER
    address = ctypes.addressof(managed)
    with _lock:
        _LIVE[address] = (managed, shape, owner)
    try:
        return _capsule_new(address, name, _DESTRUCTOR)
    except BaseException:
        _delete(address)
        raise


def live_count() -> int:
    """Return how many exported tensors have not been deleted yet (for tests and leaks)."""
    with _lock:
        return len(_LIVE)
