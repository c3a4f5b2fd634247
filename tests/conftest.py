"""Shared fixtures: a ``device`` fixture over every available backend, and a clean runtime."""

from __future__ import annotations

import os

# PoCL sizes its device from this (GB), and POCL_DEVICES gives it two CPU devices, so that
# the multi-device tests run on OpenCL too; pin both before anything imports pyopencl.
os.environ.setdefault("POCL_MEMORY_LIMIT", "2")
os.environ.setdefault("POCL_DEVICES", "pthread pthread")
os.environ.pop("ACCELRT_ALLOC_CONF", None)
os.environ.pop("ACCELRT_BACKEND", None)

from collections.abc import Iterator

import pytest

import accelrt as acc
from accelrt import _runtime, _stream
from accelrt.backends import _base


def _opencl_available() -> bool:
    try:
        return _base.get_backend("opencl").is_available()
    except ImportError:
        return False


@pytest.fixture(autouse=True)
def clean_runtime() -> Iterator[None]:
    """Every test starts and ends with no chosen accelerator, allocators or current devices."""
    _runtime.reset_state()
    _stream.reset_local()
    _base._instances.pop("sim", None)  # a fresh simulated backend (default capacity)
    yield
    _runtime.reset_state()
    _stream.reset_local()


def _cuda_available() -> bool:
    from accelrt.backends.cuda import CUDABackend

    return CUDABackend().device_count() > 0  # never raises; 0 without driver or GPU


@pytest.fixture(params=["sim", "opencl", *(["cuda"] if _cuda_available() else [])])
def device(request: pytest.FixtureRequest) -> str:
    """The name of a backend made the accelerator: ``sim`` always, ``opencl`` when present,
    ``cuda`` where there is an NVIDIA GPU (only then is it a parameter at all)."""
    name: str = request.param
    if name == "opencl" and not _opencl_available():
        pytest.skip("no OpenCL device (install accelrt[pocl])")
    acc.backends.use(name)
    return name


@pytest.fixture
def sim() -> str:
    """The simulated backend as the accelerator (2 devices of 80 GiB)."""
    acc.backends.use("sim")
    return "sim"


@pytest.fixture
def opencl() -> str:
    """The OpenCL backend as the accelerator; skipped without an OpenCL device."""
    if not _opencl_available():
        pytest.skip("no OpenCL device (install accelrt[pocl])")
    acc.backends.use("opencl")
    return "opencl"


@pytest.fixture
def small_sim(monkeypatch: pytest.MonkeyPatch) -> str:
    """A simulated accelerator with 64 MiB devices."""
    monkeypatch.setenv("ACCELRT_SIM_CAPACITY", "64MiB")
    _base._instances.pop("sim", None)
    acc.backends.use("sim")
    return "sim"
