"""The device-agnostic runtime API: devices, the one device normaliser, streams, events."""

from __future__ import annotations

import subprocess
import sys
import threading

import pytest

import accelrt as acc
from accelrt.backends.sim import BASE_ADDRESS, DEVICE_STRIDE


def test_public_surface_sorted_and_complete() -> None:
    assert acc.__all__ == sorted(acc.__all__)
    for name in acc.__all__:
        assert getattr(acc, name).__doc__, f"{name} has no docstring"


def test_import_initialises_no_driver() -> None:
    code = (
        "import sys, accelrt\n"
        "assert 'pyopencl' not in sys.modules, 'pyopencl imported'\n"
        "assert 'accelrt.backends.opencl' not in sys.modules\n"
        "print('ok')"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "ok"


def test_device_parsing() -> None:
    assert acc.Device("opencl:0") == acc.Device("opencl", 0)
    assert acc.Device("sim").index is None
    assert str(acc.Device("sim", 1)) == "sim:1"
    assert repr(acc.Device("sim:1")) == "Device(type='sim', index=1)"
    assert hash(acc.Device("sim:1")) == hash(acc.Device("sim", 1))
    with pytest.raises(ValueError, match="invalid device string 'opencl:x'"):
        acc.Device("opencl:x")
    with pytest.raises(ValueError, match="already has an index"):
        acc.Device("sim:0", 1)
    with pytest.raises(TypeError, match="takes a string"):
        acc.Device(3)  # type: ignore[arg-type]


def test_accelerator_and_devices(device: str) -> None:
    assert acc.is_available()
    assert acc.current_accelerator() == acc.Device(device)
    assert acc.current_accelerator().index is None
    assert acc.device_count() >= 1
    assert acc.current_device_index() == 0
    props = acc.get_device_properties()
    assert props.backend == device and props.total_memory > 0
    assert acc.get_device_name(0) == props.name


def test_device_argument_contract(sim: str) -> None:
    assert acc.device_count() == 2
    with pytest.raises(ValueError, match=r"device index 2 is out of range \[0, 2\)"):
        acc.memory_stats(2)
    with pytest.raises(ValueError, match="device index 5 is out of range"):
        acc.set_device_index("sim:5")
    with pytest.raises(ValueError, match="'opencl' doesn't match the current accelerator 'sim'"):
        acc.memory_stats("opencl:0")
    with pytest.raises(TypeError, match="device must be an int index"):
        acc.memory_stats(1.0)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="expected a device with an index"):
        acc.set_device_index("sim")
    acc.set_device_index(-1)  # no-op
    assert acc.current_device_index() == 0
    acc.set_device_index(acc.Device("sim", 1))
    assert acc.current_device_index() == 1
    with acc.device_index(0):
        assert acc.current_device_index() == 0
    assert acc.current_device_index() == 1


def test_unknown_backend_is_clear(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ValueError, match=r"unknown backend 'nope'; registered backends: .*opencl"):
        acc.backends.use("nope")
    monkeypatch.setenv("ACCELRT_BACKEND", "nope")
    assert acc.current_accelerator() is None
    assert acc.device_count() == 0
    with pytest.raises(ValueError, match="ACCELRT_BACKEND='nope': unknown backend"):
        acc.empty(1)


def test_env_backend_selects_sim(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ACCELRT_BACKEND", "sim")
    assert acc.current_accelerator() == acc.Device("sim")


def test_multi_device_allocations_independent(sim: str) -> None:
    a = acc.empty(100, device=0)
    b = acc.empty(100, device="sim:1")
    assert a.ptr == BASE_ADDRESS and b.ptr == BASE_ADDRESS + DEVICE_STRIDE
    assert a.device == acc.Device("sim:0") and b.device == acc.Device("sim:1")
    assert acc.memory_allocated(0) == acc.memory_allocated(1) == 512
    acc.synchronize(1)
    assert acc.current_device_index() == 0
    a.free()
    assert acc.memory_allocated(0) == 0 and acc.memory_allocated(1) == 512
    b.free()


def test_streams(device: str) -> None:
    default = acc.current_stream()
    assert default.handle == 0
    s = acc.Stream(priority=0)
    assert acc.current_stream() == default  # creating does not make current
    assert s != default and s == s and s != "stream"
    with pytest.raises(TypeError):
        _ = s < default  # type: ignore[operator]
    assert repr(s).startswith(f"Stream(device={device}:0, handle=")
    with s as entered:
        assert entered is s
        assert acc.current_stream() == s
        with default:
            assert acc.current_stream() == default
        assert acc.current_stream() == s
    assert acc.current_stream() == default
    with pytest.raises(RuntimeError, match="boom"), s:
        raise RuntimeError("boom")
    assert acc.current_stream() == default
    acc.set_stream(s)
    assert acc.current_stream() == s
    s.synchronize()
    assert s.query()
    s.wait_stream(default)
    with pytest.raises(TypeError, match="takes an Event"):
        s.wait_event(default)  # type: ignore[arg-type]


def test_current_stream_is_per_thread(sim: str) -> None:
    s = acc.Stream()
    acc.set_stream(s)
    seen = []
    thread = threading.Thread(target=lambda: seen.append(acc.current_stream().handle))
    thread.start()
    thread.join()
    assert seen == [0] and acc.current_stream() == s


def test_events(device: str) -> None:
    e = acc.Event(enable_timing=True)
    assert e.query() and e.device is None
    e.synchronize()
    with pytest.raises(ValueError, match="Both events must be recorded"):
        e.elapsed_time(acc.Event(enable_timing=True))
    with pytest.raises(ValueError, match="created with argument 'enable_timing=True'"):
        e.elapsed_time(acc.Event())
    e.record()
    assert e.device == acc.Device(device, 0)
    end = acc.current_stream().record_event(acc.Event(enable_timing=True))
    end.synchronize()
    assert end.query()
    assert e.elapsed_time(end) >= 0.0


def test_event_on_other_device_refused(sim: str) -> None:
    e = acc.Event()
    e.record(acc.Stream(0))
    with pytest.raises(ValueError, match="cannot be recorded on a stream of sim:1"):
        e.record(acc.Stream(1))


def test_copy_round_trip(device: str) -> None:
    np = pytest.importorskip("numpy")
    host = np.arange(1000, dtype=np.uint32)
    buf = acc.empty(host.nbytes)
    acc.copy_(buf, host)
    other = acc.empty(host.nbytes)
    acc.copy_(other, buf)
    out = np.zeros_like(host)
    acc.copy_(out, other)
    acc.current_stream().synchronize()
    assert (out == host).all()
    view = other.numpy().view(np.uint32)
    assert (view == host).all()
    with pytest.raises(ValueError, match="sizes differ: dst has 4000 bytes, src 8"):
        acc.copy_(buf, np.zeros(2, np.uint32))
    with pytest.raises(TypeError, match=r"needs at least one accelrt\.Buffer"):
        acc.copy_(out, host)
    with pytest.raises(ValueError, match="is read-only"):
        acc.copy_(b"x" * 4000, buf)
    buf.free()
    other.free()


def test_memory_api_before_first_use(sim: str) -> None:
    assert acc.memory_stats() == {}
    assert acc.memory_allocated() == acc.memory_reserved() == 0
    assert acc.max_memory_allocated() == acc.max_memory_reserved() == 0
    acc.empty_cache()
    acc.reset_peak_memory_stats()
    acc.reset_accumulated_memory_stats()
    assert acc.memory_stats() == {}
    free, total = acc.get_memory_info()
    assert free == total == 80 << 30


def test_buffer_lifecycle(sim: str) -> None:
    with acc.empty(1000) as buf:
        assert acc.memory_allocated() == 1024
        assert len(buf) == 1000
        assert buf.device == acc.Device("sim:0")
    assert acc.memory_allocated() == 0
    assert buf.freed
    with pytest.raises(ValueError, match="holds no memory"):
        acc.record_stream(buf, acc.Stream())
    acc.empty(1000)  # dropped at once: the finaliser frees it
    assert acc.memory_allocated() == 0


def test_no_accelerator(monkeypatch: pytest.MonkeyPatch) -> None:
    from accelrt import _runtime

    monkeypatch.setattr(_runtime, "AUTO_ORDER", ())
    assert not acc.is_available()
    assert acc.device_count() == 0
    assert acc.current_accelerator() is None
    with pytest.raises(
        RuntimeError, match=r"^Cannot access accelerator device when none is available\.$"
    ):
        acc.current_device_index()
    with pytest.raises(RuntimeError, match="Cannot access accelerator device"):
        acc.empty(1)
