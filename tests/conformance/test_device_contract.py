"""The device-argument contract of torch.accelerator, on every backend.

Model: PyTorch's test/test_accelerator.py (device index, set_device_index, device_index, the
errors of a mismatched device type) and torch_openreg's device tests.
"""

from __future__ import annotations

import pytest

import accelrt as acc
from accelrt.testing import install_backend, use_no_accelerator


def test_accelerator_identity(device: str) -> None:
    assert acc.is_available()
    assert acc.current_accelerator() == acc.Device(device)
    assert acc.current_accelerator(check_available=True) == acc.Device(device)
    assert acc.current_accelerator().index is None
    assert acc.device_count() >= 1
    assert acc.current_device_index() == 0


def test_int_index_passes_through_and_is_range_checked(device: str) -> None:
    count = acc.device_count()
    acc.set_device_index(count - 1)
    assert acc.current_device_index() == count - 1
    for bad in (count, count + 7, 2**63, -2):
        with pytest.raises(ValueError, match=rf"device index {bad} is out of range \[0, {count}\)"):
            acc.set_device_index(bad)
        with pytest.raises(ValueError, match=rf"device index {bad} is out of range"):
            acc.synchronize(bad)
    assert acc.current_device_index() == count - 1  # a refused index changes nothing


def test_string_and_device_forms(device: str) -> None:
    acc.set_device_index(f"{device}:0")
    acc.set_device_index(acc.Device(device, 0))
    assert acc.current_device_index() == 0
    assert acc.current_stream(f"{device}:0").device == acc.Device(device, 0)
    assert acc.memory_allocated(acc.Device(device)) == 0  # no index: the current device


def test_other_device_type_names_both_types(device: str) -> None:
    other = "sim" if device != "sim" else "opencl"
    for arg in (f"{other}:0", acc.Device(other, 0), acc.Device(other)):
        with pytest.raises(
            ValueError,
            match=rf"device type '{other}' doesn't match the current accelerator "
            rf"'{device}'",
        ):
            acc.set_device_index(arg)
        with pytest.raises(ValueError, match=f"'{other}' doesn't match"):
            acc.memory_stats(arg)


def test_device_without_index_where_one_is_required(device: str) -> None:
    for arg in (device, acc.Device(device)):
        with pytest.raises(ValueError, match=r"expected a device with an index or an int, got"):
            acc.set_device_index(arg)
        with (
            pytest.raises(ValueError, match="expected a device with an index"),
            acc.device_index(arg),
        ):
            pass


def test_bad_argument_types(device: str) -> None:
    for arg in (1.0, True, [0], b"sim:0"):
        with pytest.raises(TypeError, match="device must be an int index, a string like"):
            acc.set_device_index(arg)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="invalid device string 'opencl:x'"):
        acc.set_device_index("opencl:x")


def test_set_device_index_minus_one_is_a_no_op(device: str) -> None:
    acc.set_device_index(-1)
    assert acc.current_device_index() == 0
    with acc.device_index(None):
        assert acc.current_device_index() == 0


def test_device_index_context_restores_on_exit_and_exception(two_devices: str) -> None:
    with acc.device_index(1):
        assert acc.current_device_index() == 1
        with acc.device_index(0):
            assert acc.current_device_index() == 0
        assert acc.current_device_index() == 1
    assert acc.current_device_index() == 0
    with pytest.raises(KeyError), acc.device_index(1):
        raise KeyError("boom")
    assert acc.current_device_index() == 0


def test_current_device_is_per_thread(two_devices: str) -> None:
    import threading

    acc.set_device_index(1)
    seen: list[int] = []
    thread = threading.Thread(target=lambda: seen.append(acc.current_device_index()))
    thread.start()
    thread.join()
    assert seen == [0] and acc.current_device_index() == 1


def test_a_chosen_backend_without_devices_says_why(monkeypatch: pytest.MonkeyPatch) -> None:
    # ACCELRT_BACKEND=cuda on a machine without a driver said only PyTorch's sentence
    # (issue 25); the reason is the one `accelrt info` shows.
    from accelrt.backends.sim import SimBackend

    class NoDriver(SimBackend):
        def device_count(self) -> int:
            return 0

        def unavailable_reason(self) -> str:
            return "no driver could be loaded (libfake.so: not found)."

    monkeypatch.setenv("ACCELRT_BACKEND", "sim")
    install_backend("sim", NoDriver())
    with pytest.raises(RuntimeError) as info:
        acc.empty(1)
    assert str(info.value) == (
        "Cannot access accelerator device when none is available. The 'sim' backend "
        "(ACCELRT_BACKEND=sim) has no device: no driver could be loaded (libfake.so: not "
        "found). `accelrt info` lists the devices here."
    )


def test_no_accelerator() -> None:
    use_no_accelerator()
    assert acc.is_available() is False
    assert acc.device_count() == 0
    assert acc.current_accelerator() is None
    message = r"^Cannot access accelerator device when none is available\.$"
    for call in (
        acc.current_device_index,
        lambda: acc.set_device_index(0),
        acc.current_stream,
        acc.Stream,
        acc.synchronize,
        acc.memory_stats,
        acc.get_device_properties,
        lambda: acc.empty(1),
    ):
        with pytest.raises(RuntimeError, match=message):
            call()
