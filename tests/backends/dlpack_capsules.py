"""What a DLPack consumer does with a capsule, in ctypes: for the tests of accelrt's exports
(no consumer library needed)."""

from __future__ import annotations

import ctypes
from typing import Any

from accelrt.memory.buffers import _dlpack


def _c_api(name: str, restype: Any, *argtypes: Any) -> Any:
    return ctypes.PYFUNCTYPE(restype, *argtypes)((name, ctypes.pythonapi))


_get_name = _c_api("PyCapsule_GetName", ctypes.c_char_p, ctypes.py_object)
_get_pointer = _c_api("PyCapsule_GetPointer", ctypes.c_void_p, ctypes.py_object, ctypes.c_char_p)
_set_name = _c_api("PyCapsule_SetName", ctypes.c_int, ctypes.py_object, ctypes.c_char_p)


def open_capsule(capsule: Any) -> tuple[bytes, int, Any]:
    """The capsule's name, struct address and struct, as a consumer reads them."""
    name = _get_name(capsule)
    address = _get_pointer(capsule, name)
    kind = _dlpack.DLManagedTensorVersioned if name.endswith(b"versioned") else None
    struct = (kind or _dlpack.DLManagedTensor).from_address(address)
    return name, address, struct


def consume(capsule: Any) -> None:
    """What a consumer does: rename the capsule, then call the deleter when done."""
    name, address, struct = open_capsule(capsule)
    assert _set_name(capsule, b"used_" + name) == 0
    struct.deleter(address)
