"""Runtime basics outside the conformance suite: the public surface, import, Device parsing,
backend selection, copies and buffers (torch.accelerator behaviours: ``tests/conformance``)."""

from __future__ import annotations

import subprocess
import sys
import types

import pytest

import accelrt as acc
import accelrt.testing


@pytest.mark.parametrize(
    "module",
    [acc, acc.memory, accelrt.testing],
    ids=["accelrt", "accelrt.memory", "accelrt.testing"],
)
def test_public_surface_sorted_and_complete(module: object) -> None:
    names = module.__all__  # type: ignore[attr-defined]
    assert names == sorted(names)
    for name in names:
        assert getattr(module, name).__doc__, f"{name} has no docstring"


def test_memory_is_one_home() -> None:
    # the top level re-exports torch.accelerator's memory names from accelrt.memory
    for name in ("empty", "memory_stats", "empty_cache", "Buffer", "AllocatorConfig"):
        assert getattr(acc, name) is getattr(acc.memory, name)


def test_compiled_modules_run_only_with_the_compiled_stream_ops(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # calls/_native.pyx cimports _stream_ops' Epoch: with _stream_ops from its source it
    # would read a Python object as a C struct, so no compiled module loads then.
    source = types.ModuleType("accelrt._stream_ops")
    source.__file__ = "/somewhere/accelrt/_stream_ops.py"
    monkeypatch.delenv("ACCELRT_PURE_PYTHON", raising=False)
    monkeypatch.setattr(acc._compiled, "STREAM_OPS", source)
    monkeypatch.setattr(acc._compiled, "STREAM_OPS_REASON", "the compiled module is not built")
    assert acc._compiled.load("accelrt.memory.device._native") == (
        None,
        "accelrt._stream_ops is not compiled (the compiled module is not built)",
    )


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
    if acc.get_device_properties().host_accessible:  # sim, opencl, xpu: a host view
        assert (other.numpy().view(np.uint32) == host).all()
    else:  # cuda
        with pytest.raises(TypeError, match=r"is not host-accessible; copy it with accelrt\.copy_"):
            other.numpy()
    with pytest.raises(ValueError, match="sizes differ: dst has 4000 bytes, src 8"):
        acc.copy_(buf, np.zeros(2, np.uint32))
    with pytest.raises(TypeError, match=r"needs at least one accelrt\.Buffer"):
        acc.copy_(out, host)
    with pytest.raises(ValueError, match="is read-only"):
        acc.copy_(b"x" * 4000, buf)
    buf.free()
    other.free()


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
