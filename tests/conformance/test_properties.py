"""Device properties and capability: one schema on every backend."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

import accelrt as acc


def test_properties_common_schema(device: str) -> None:
    props = acc.get_device_properties()
    assert props == acc.get_device_properties(0) == acc.get_device_properties(f"{device}:0")
    assert isinstance(props.name, str) and props.name
    assert isinstance(props.vendor, str) and props.vendor
    assert props.backend == device and props.index == 0
    assert props.total_memory > 0 and props.multi_processor_count >= 1
    assert 0 < props.max_allocation_bytes <= props.total_memory
    assert isinstance(props.driver_version, str) and props.driver_version
    assert acc.get_device_name() == props.name
    free, total = acc.get_memory_info()
    assert total == props.total_memory and free <= total


def test_properties_are_frozen(device: str) -> None:
    props = acc.get_device_properties()
    with pytest.raises(dataclasses.FrozenInstanceError):
        props.total_memory = 1  # type: ignore[misc]
    with pytest.raises(TypeError):
        props.raw["new"] = 1  # type: ignore[index]


def test_raw_attributes(device: str) -> None:
    raw = acc.get_device_properties().raw
    if device == "sim":
        assert raw["physical_index"] == 0 and raw["base_address"] == 0x7F0000000000
    elif device == "cuda":
        assert raw["compute_capability"] == f"{raw['major']}.{raw['minor']}"
    elif device == "xpu":
        assert raw["sycl_backend"] in ("level_zero", "opencl", "cuda", "hip")
        assert raw["filter_string"].startswith(raw["sycl_backend"])
        assert raw["max_work_group_size"] >= 1
    else:
        assert raw["version"].startswith("OpenCL") and raw["max_work_group_size"] >= 1


def test_properties_of_each_device(two_devices: str) -> None:
    assert acc.get_device_properties(1).index == 1
    assert acc.get_device_name(1) == acc.get_device_properties(1).name


def test_capability_lists_numpy_dtypes(device: str) -> None:
    capability = acc.get_device_capability()
    dtypes = capability["supported_dtypes"]
    assert set(capability) == {"supported_dtypes"}
    assert all(isinstance(d, np.dtype) for d in dtypes)
    required = {np.dtype(n) for n in ("bool", "int8", "uint8", "int32", "int64", "float32")}
    assert required <= dtypes
    assert np.dtype("object") not in dtypes
    if device == "sim":
        assert {np.dtype("float16"), np.dtype("float64"), np.dtype("complex128")} <= dtypes
        assert len(dtypes) == 14
    assert acc.get_device_capability(0) == capability
