"""Shared fixtures: a ``device`` fixture over every available backend, and a clean runtime."""

from __future__ import annotations

import os

# PoCL sizes its device from this (GB), and POCL_DEVICES gives it two CPU devices, so that
# the multi-device tests run on OpenCL too; pin both before anything imports pyopencl.
os.environ.setdefault("POCL_MEMORY_LIMIT", "2")
os.environ.setdefault("POCL_DEVICES", "pthread pthread")
# Intel's OpenCL CPU runtime (the xpu backend's device here) reports 2 GB, as PoCL does, so that
# capacity tests allocate little; read when the SYCL runtime loads.
os.environ.setdefault("CL_CONFIG_CPU_FORCE_GLOBAL_MEM_SIZE", "2GB")
# the commands read these when --config gives no setting
os.environ.pop("ACCELRT_ALLOC_CONF", None)
os.environ.pop("PYTORCH_ALLOC_CONF", None)
os.environ.pop("PYTORCH_CUDA_ALLOC_CONF", None)
os.environ.pop("ACCELRT_BACKEND", None)

import _thread
import pickle
import random
import sys
import time
from collections.abc import Callable, Collection, Iterator
from pathlib import Path
from types import FrameType
from typing import Any

import pytest

import accelrt as acc
from accelrt.backends import get_backend
from accelrt.testing import reset_runtime


def _opencl_available() -> bool:
    try:
        return get_backend("opencl").is_available()
    except ImportError:
        return False


@pytest.fixture(autouse=True)
def clean_runtime() -> Iterator[None]:
    """Every test starts and ends with no chosen accelerator, allocators or current devices."""
    reset_runtime()
    yield
    reset_runtime()


def _cuda_available() -> bool:
    from accelrt.backends.cuda import CUDABackend

    return CUDABackend().device_count() > 0  # never raises; 0 without driver or GPU


def _xpu_skip_reason() -> str | None:
    """Why the ``xpu`` backend cannot run here (dpctl missing, no SYCL device), or None."""
    backend = get_backend("xpu")
    if backend.is_available():
        return None
    return f"no XPU device (install accelrt[xpu]): {backend.unavailable_reason()}"  # type: ignore[attr-defined]


def _use(name: str) -> str:
    """Make backend ``name`` the accelerator, or skip the test where its runtime has no
    device (``opencl``, ``xpu``)."""
    if name == "opencl" and not _opencl_available():
        pytest.skip("no OpenCL device (install accelrt[pocl])")
    if name == "xpu" and (reason := _xpu_skip_reason()) is not None:
        pytest.skip(reason)
    acc.backends.use(name)
    return name


@pytest.fixture(params=["sim", "opencl", "xpu", *(["cuda"] if _cuda_available() else [])])
def device(request: pytest.FixtureRequest) -> str:
    """The name of a backend made the accelerator: ``sim`` always, ``opencl`` when present,
    ``xpu`` when dpctl and a SYCL device are, ``cuda`` where there is an NVIDIA GPU (only then
    is it a parameter at all)."""
    return _use(request.param)


@pytest.fixture
def xpu() -> str:
    """The XPU backend as the accelerator; skipped without dpctl or a SYCL device."""
    return _use("xpu")


@pytest.fixture
def sim() -> str:
    """The simulated backend as the accelerator (2 devices of 80 GiB)."""
    acc.backends.use("sim")
    return "sim"


@pytest.fixture
def opencl() -> str:
    """The OpenCL backend as the accelerator; skipped without an OpenCL device."""
    return _use("opencl")


@pytest.fixture(params=["opencl", "xpu"])
def queue_backend(request: pytest.FixtureRequest) -> str:
    """A backend whose streams are in-order queues of a real runtime (``opencl``, ``xpu``) as
    the accelerator; each skipped where its runtime has no device."""
    return _use(request.param)


@pytest.fixture
def small_sim(monkeypatch: pytest.MonkeyPatch) -> str:
    """A simulated accelerator with 64 MiB devices."""
    monkeypatch.setenv("ACCELRT_SIM_CAPACITY", "64MiB")
    reset_runtime()  # a simulated backend made anew reads the capacity
    acc.backends.use("sim")
    return "sim"


class SigintAtRandomLines:
    """While active, simulates a SIGINT arriving at a random line of the given source files.

    A trace function counts the lines executed in ``files`` and, every 1 to ``most`` lines (at
    random), calls ``_thread.interrupt_main()``: the signal handler then runs at the next point
    where Python checks for signals, in the middle of whatever those files were doing.
    """

    def __init__(self, files: Collection[str], seed: int, most: int = 60) -> None:
        self._files = frozenset(files)
        self._rng = random.Random(seed)
        self._most = most
        self._countdown = self._rng.randint(1, most)
        self.sent = 0

    def _local(self, frame: FrameType, event: str, arg: object) -> object:
        if event == "line":
            self._countdown -= 1
            if self._countdown <= 0:
                self._countdown = self._rng.randint(1, self._most)
                self.sent += 1
                _thread.interrupt_main()
        return self._local

    def _global(self, frame: FrameType, event: str, arg: object) -> object:
        return self._local if frame.f_code.co_filename in self._files else None

    def __enter__(self) -> SigintAtRandomLines:
        sys.settrace(self._global)
        return self

    def __exit__(self, *exc_info: object) -> None:
        sys.settrace(None)


def settle_interrupts(seconds: float = 0.003) -> int:
    """Let interrupts still on their way arrive here; return how many did."""
    caught = 0
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            time.sleep(0.001)
        except KeyboardInterrupt:
            caught += 1
    return caught


@pytest.fixture
def sigint_at_random_lines() -> type[SigintAtRandomLines]:
    """The SIGINT injector (:class:`SigintAtRandomLines`), for the interrupt tests."""
    return SigintAtRandomLines


@pytest.fixture
def settle() -> Callable[[float], int]:
    """:func:`settle_interrupts`: catch the interrupts still on their way."""
    return settle_interrupts


@pytest.fixture
def small_recording(tmp_path: Path) -> dict[str, Any]:
    """A snapshot recorded on ``sim`` device 0, decoded: 1 MiB and 5 MiB allocated, the 1 MiB
    freed, then dumped (history and segments as ``accelrt.dump_snapshot`` writes them)."""
    acc.backends.use("sim")
    acc.record_memory_history()
    blocks = [acc.empty(n) for n in (1 << 20, 5 << 20)]
    blocks[0].free()
    path = tmp_path / "small_recording.pickle"
    acc.dump_snapshot(path)
    blocks[1].free()
    data: dict[str, Any] = pickle.loads(path.read_bytes())
    return data
