"""Lazy initialisation, the memory API before first use, fork safety, visible devices.

Model: PyTorch's lazy CUDA init (``torch.cuda.is_initialized``), its "Cannot re-initialize CUDA
in forked subprocess" error, and ``CUDA_VISIBLE_DEVICES``. Per-process behaviour runs in a
fresh interpreter (``run_python``).
"""

from __future__ import annotations

import pathlib
from collections.abc import Callable, Iterator

import pytest

import accelrt as acc
from accelrt.backends import get_backend
from accelrt.testing import forget_backend, install_backend, is_initialized, peek_allocator

RunPython = Callable[..., str]


@pytest.fixture
def fresh(device: str) -> Iterator[str]:
    """The ``device`` backend as a new instance (no driver state yet), for this test only."""
    kept = get_backend(device)
    install_backend(device, type(kept)())
    acc.backends.use(device)
    yield device
    install_backend(device, kept)


def _driver_contexts(device: str) -> int:
    """OpenCL contexts the backend created (the simulated device has none to create)."""
    backend = get_backend(device)
    return len(backend._state) if device == "opencl" else 0  # type: ignore[attr-defined]


def test_counting_devices_initialises_nothing(fresh: str) -> None:
    device = fresh
    backend = get_backend(device)
    assert acc.is_available() and acc.device_count() >= 1
    acc.current_accelerator()
    assert not is_initialized(backend)
    assert _driver_contexts(device) == 0


def test_memory_api_before_first_use(fresh: str) -> None:
    device = fresh
    backend = get_backend(device)
    assert acc.memory_stats() == {}
    assert acc.memory_allocated() == acc.memory_reserved() == 0
    assert acc.max_memory_allocated() == acc.max_memory_reserved() == 0
    acc.empty_cache()
    acc.reset_peak_memory_stats()
    acc.reset_accumulated_memory_stats()
    acc.get_device_properties()
    acc.get_device_capability()
    assert acc.memory_stats() == {}
    assert peek_allocator(backend, 0) is None
    assert not is_initialized(backend) and _driver_contexts(device) == 0
    free, total = acc.get_memory_info()  # the one memory function that initialises
    assert total == acc.get_device_properties().total_memory
    if acc.get_device_properties().host_accessible:  # sim, opencl, xpu: nothing is held yet
        assert free == total
    else:  # a GPU: the driver's context takes memory of its own
        assert 0 < free < total
    assert is_initialized(backend)


def test_first_use_initialises(device: str) -> None:
    backend = get_backend(device)
    acc.empty(16).free()
    assert is_initialized(backend)
    assert acc.memory_stats()["allocation.all.allocated"] == 1


_FORK = """
import os, accelrt as acc
acc.backends.use({backend!r})
{parent}
r, w = os.pipe()
pid = os.fork()
if pid == 0:
    try:
        acc.empty(16).free()
        msg = "child used the device"
    except RuntimeError as exc:
        msg = str(exc)
    os.write(w, f"{{acc.device_count()}}|{{msg}}".encode())
    os._exit(0)
os.waitpid(pid, 0)
print(os.read(r, 4096).decode())
"""


def test_fork_after_init_raises_and_says_spawn(device: str, run_python: RunPython) -> None:
    out = run_python(_FORK.format(backend=device, parent="acc.empty(16).free()"))
    count, message = out.split("|", 1)
    assert int(count) == acc.device_count()  # counting still works in the child
    assert message.startswith(
        f"Cannot use accelrt's {device!r} accelerator in a forked subprocess: the parent "
        "process (pid "
    )
    assert "use the 'spawn' start method" in message


def test_fork_before_init_is_fine(device: str, run_python: RunPython) -> None:
    parent = "assert acc.device_count() >= 1 and acc.memory_stats() == {}"
    out = run_python(_FORK.format(backend=device, parent=parent))
    assert out.endswith("|child used the device")


def test_spawned_child_after_init_works(
    sim: str, run_python: RunPython, tmp_path: pathlib.Path
) -> None:
    code = """
import multiprocessing as mp, accelrt as acc

def work(_):
    acc.backends.use("sim")
    with acc.empty(100) as buf:
        return acc.memory_allocated(), buf.device.index

if __name__ == "__main__":
    acc.backends.use("sim")
    acc.empty(16).free()
    with mp.get_context("spawn").Pool(1) as pool:
        print(pool.map(work, [0]))
"""
    script = tmp_path / "job.py"  # spawn re-imports the main module from its file
    script.write_text(code)
    out = run_python(f"import runpy; runpy.run_path({str(script)!r}, run_name='__main__')")
    assert out == "[(512, 0)]"


_VISIBLE = """
import accelrt as acc
acc.backends.use({backend!r})
print(acc.device_count(), end=" ")
if acc.device_count():
    print(acc.get_device_properties(0).raw.get("physical_index"), end=" ")
    with acc.empty(1) as buf:
        print(hex(buf.ptr))
"""


def test_visible_devices_hides_and_renumbers(two_devices: str, run_python: RunPython) -> None:
    backend = two_devices
    code = _VISIBLE.format(backend=backend)
    assert run_python(code, ACCELRT_VISIBLE_DEVICES="").split() == ["0"]
    two = run_python(code, ACCELRT_VISIBLE_DEVICES="0,1").split()
    assert two[0] == "2"
    one = run_python(code, ACCELRT_VISIBLE_DEVICES="1").split()
    assert one[0] == "1"
    if backend == "sim":  # logical 0 is physical 1: its addresses, not device 0's
        assert one[1:] == ["1", hex(0x7F0000000000 + (1 << 44))]
        assert two[1:] == ["0", hex(0x7F0000000000)]


def test_visible_devices_bad_entry_warns_and_truncates(
    sim: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ACCELRT_VISIBLE_DEVICES", "1,x,0")
    forget_backend("sim")
    with pytest.warns(
        RuntimeWarning,
        match=r"ACCELRT_VISIBLE_DEVICES='1,x,0': entry 'x' is not an integer; it and the "
        r"entries after it are ignored, so 1 device\(s\) are visible",
    ):
        acc.backends.use("sim")
    assert acc.device_count() == 1
    assert acc.get_device_properties(0).raw["physical_index"] == 1
    for value, problem in (("0,0", "is listed twice"), ("5", r"is out of range \[0, 2\)")):
        monkeypatch.setenv("ACCELRT_VISIBLE_DEVICES", value)
        forget_backend("sim")
        with pytest.warns(RuntimeWarning, match=problem):
            acc.backends.use("sim")
