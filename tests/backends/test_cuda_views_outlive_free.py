"""CUDA memory outlives ``free()`` while a DLPack capsule or an interface consumer holds it.

The CUDA exports of a ``Buffer`` (issue 26, section 1; the numpy ones are in
tests/memory/test_views_outlive_free.py): a DLPack capsule holds the buffer's export pin, so a
``free()`` before the consumer deletes the tensor takes effect when it does; consumers of
``__cuda_array_interface__`` (CuPy, Numba, PyTorch) keep the buffer object itself, so once the
interface was read the block returns when the buffer is collected. On the fake driver of
``test_cuda_nogpu.py``.
"""

from __future__ import annotations

import gc
import types

import pytest
from dlpack_capsules import consume
from test_cuda_interop_nogpu import gpu  # noqa: F401 (gpu: the fixture)

import accelrt as acc

pytestmark = pytest.mark.usefixtures("gpu")
FREED = r"holds no memory \(freed or empty\)$"


def test_a_freed_buffer_keeps_its_block_until_the_consumer_deletes_the_tensor() -> None:
    buf = acc.empty(3000)
    address = buf.ptr
    capsule = buf.__dlpack__(max_version=(1, 0))
    buf.free()
    assert buf.freed
    with pytest.raises(ValueError, match=FREED):
        buf.__dlpack__()
    with pytest.raises(ValueError, match=FREED):
        buf.__cuda_array_interface__  # noqa: B018
    buf.free()  # a second free does nothing
    assert acc.memory_allocated() == 3072
    other = acc.empty(3000)  # the same size: not the same block while the tensor lives
    assert other.ptr != address
    consume(capsule)  # the consumer is done: calls the deleter
    assert acc.memory_allocated() == 3072
    other.free()
    assert acc.memory_allocated() == 0


def test_an_unconsumed_capsule_of_a_freed_buffer_frees_its_block_when_destroyed() -> None:
    buf = acc.empty(3000)
    capsule = buf.__dlpack__()
    buf.free()
    assert acc.memory_allocated() == 3072
    del capsule
    assert acc.memory_allocated() == 0


def test_after_the_interface_was_read_the_block_returns_when_the_buffer_is_collected() -> None:
    buf = acc.empty(3000)
    address = buf.ptr
    # what CuPy's UnownedMemory, Numba and PyTorch keep: the object and what it said
    consumer = types.SimpleNamespace(owner=buf, interface=buf.__cuda_array_interface__)
    assert consumer.interface["data"] == (address, False)
    buf.free()
    assert buf.freed
    assert acc.memory_allocated() == 3072  # the consumer may still use it
    other = acc.empty(3000)
    assert other.ptr != address
    del buf
    gc.collect()
    assert acc.memory_allocated() == 2 * 3072  # the consumer holds the buffer
    del consumer
    assert acc.memory_allocated() == 3072
    other.free()
    assert acc.memory_allocated() == 0


def test_a_buffer_whose_interface_was_read_is_freed_by_its_finaliser() -> None:
    buf = acc.empty(3000)
    buf.__cuda_array_interface__  # noqa: B018
    del buf
    assert acc.memory_allocated() == 0


def test_a_buffer_never_exported_frees_at_once() -> None:
    buf = acc.empty(3000)
    buf.free()
    assert acc.memory_allocated() == 0
