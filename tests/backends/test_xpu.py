"""The ``xpu`` backend (dpctl/SYCL): set-up, interop, bad input and real kernels (issue 24).

Skipped where dpctl or a SYCL device is missing (the ``xpu`` fixture); the tests that need no
device (lazy import, the reason ``accelrt info`` gives) run everywhere.
"""

from __future__ import annotations

import ctypes
import json
import subprocess
import sys
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import accelrt as acc
from accelrt.backends import get_backend

sys.path.insert(0, str(Path(__file__).parent))
from xpu_kernels import slow_fill

MiB = 1 << 20


def _run(code: str, **env: str) -> str:
    import os

    full = {k: v for k, v in os.environ.items() if k != "OCL_ICD_FILENAMES"}
    full.update(env)
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=full, timeout=120
    )
    assert out.returncode == 0, out.stderr
    return out.stdout.strip()


def test_importing_accelrt_imports_no_dpctl() -> None:
    code = (
        "import sys, accelrt, accelrt.backends.xpu; "
        "b = accelrt.backends.get_backend('xpu'); print('dpctl' in sys.modules)"
    )
    assert _run(code) == "False"


def test_info_says_why_there_is_no_xpu_device() -> None:
    code = (
        "import json, sys\n"
        "from accelrt import cli\n"
        "sys.argv = ['accelrt', 'info', '--json']\n"
        "cli.main(['info', '--json'])\n"
    )
    out = json.loads(_run(code, OCL_ICD_FILENAMES="/nonexistent/libintelocl.so"))
    if "xpu" in out["available_backends"]:  # a Level Zero GPU is there whatever the ICD
        pytest.skip("an XPU device exists without the OpenCL CPU runtime")
    reason = out["unavailable_backends"]["xpu"]
    assert "dpctl" in reason
    try:
        import dpctl  # noqa: F401
    except ImportError:
        assert "pip install 'accelrt[xpu]'" in reason
    else:
        assert "OCL_ICD_FILENAMES='/nonexistent/libintelocl.so' (set by the user)" in reason


def test_the_backend_sets_up_the_icd_itself(xpu: str) -> None:
    # a fresh process without OCL_ICD_FILENAMES finds the runtime in sys.prefix/lib
    code = (
        "import os, accelrt as acc\n"
        "b = acc.backends.get_backend('xpu')\n"
        "print(b.device_count(), os.path.basename(os.environ['OCL_ICD_FILENAMES']))"
    )
    count, library = _run(code).split()
    assert int(count) >= 1 and library.startswith("libintelocl.so")


def test_info_lists_the_xpu_device(xpu: str, capsys: pytest.CaptureFixture[str]) -> None:
    from accelrt import cli

    assert cli.main(["info", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    devices = [d for d in data["devices"] if d["device"].startswith("xpu:")]
    assert devices and devices[0]["total_memory_bytes"] == acc.get_device_properties().total_memory
    assert "xpu" in data["available_backends"]


def test_first_use_of_a_device_before_any_probe_does_not_deadlock(xpu: str) -> None:
    """A fresh backend's first call may be one that uses a device (``context``, ``malloc``)
    before anything counted the devices: the probe and the device's state share one lock."""
    import threading

    from accelrt.backends.xpu import XPUBackend

    fresh = XPUBackend()
    got: list[Any] = []
    worker = threading.Thread(target=lambda: got.append(fresh.context(0)), daemon=True)
    worker.start()
    worker.join(60)
    assert got and got[0] is fresh.context(0), "context(0) on a fresh backend did not return"


def test_properties_and_memory_info(xpu: str) -> None:
    props = acc.get_device_properties()
    assert props.backend == "xpu" and props.total_memory > 0 and props.pinned_host_memory
    free, total = acc.get_memory_info()
    assert free <= total
    assert total == props.total_memory
    buf = acc.empty(3 * MiB)
    assert acc.get_memory_info() == (total - acc.memory_reserved(), total)
    buf.free()


def test_memset_and_round_trips_in_every_direction(xpu: str) -> None:
    data = np.arange(5000, dtype=np.uint8)
    a, b = acc.empty(5000), acc.empty(5000)
    host = acc.empty_host(5000)
    acc.copy_(a, data)  # h2d
    acc.copy_(b, a)  # d2d
    acc.copy_(host, b)  # d2h pinned
    acc.synchronize()
    assert bytes(host.numpy()) == data.tobytes()
    backend = get_backend("xpu")
    backend.memset_async(0, b.ptr + 10, 0xAB, 20, 0)
    out = np.zeros(5000, np.uint8)
    acc.copy_(out, b)
    acc.synchronize()
    expected = data.copy()
    expected[10:30] = 0xAB
    assert out.tobytes() == expected.tobytes()
    for handle in (a, b, host):
        handle.free()


def test_a_stream_forgets_its_last_view_when_device_memory_is_freed(xpu: str) -> None:
    from accelrt._stream_ops import NO_VIEW

    buf = acc.empty(3 * MiB)  # a segment of its own: empty_cache gives it back
    stream = acc.current_stream()
    acc.copy_(buf, np.ones(3 * MiB, np.uint8))
    acc.copy_(buf, np.full(3 * MiB, 7, np.uint8))  # the view remembered from the first
    acc.synchronize()
    ops: Any = stream._ops
    assert ops.last_view[:2] == (buf.ptr, 3 * MiB)
    assert ops.last_view[2] is ops.views[(buf.ptr, 3 * MiB)]
    assert buf.numpy()[::MiB].tolist() == [7, 7, 7]
    buf.free()
    acc.empty_cache()  # the segment is freed: its views go
    assert ops.last_view == NO_VIEW and not ops.views


def test_expandable_segments_warn_naming_the_reason(xpu: str) -> None:
    with pytest.warns(RuntimeWarning, match="which the 'xpu' backend does not have"):
        acc.set_allocator_settings("expandable_segments:True")
        acc.empty(MiB).free()


def test_sycl_usm_array_interface_shares_the_memory_with_dpctl(xpu: str) -> None:
    import dpctl.memory

    buf = acc.empty(4096)
    acc.copy_(buf, np.full(4096, 3, np.uint8))
    interface = buf.__sycl_usm_array_interface__
    assert interface["data"] == (buf.ptr, False) and interface["shape"] == (4096,)
    usm = dpctl.memory.as_usm_memory(buf)
    assert usm.get_usm_type() == "device"
    assert usm.copy_to_host().tobytes() == b"\x03" * 4096
    assert not hasattr(acc.backends.get_backend("sim"), "adopt_queue")
    buf.free()


def test_no_sycl_interface_on_other_backends(sim: str) -> None:
    buf = acc.empty(16)
    assert not hasattr(buf, "__sycl_usm_array_interface__")
    buf.free()


def test_dlpack_device_names_the_device_as_dpctl_does(xpu: str) -> None:
    import dpctl

    backend: Any = get_backend("xpu")
    kind, device_id = backend.dlpack_device(0)
    assert kind == 14  # kDLOneAPI
    assert dpctl.get_devices()[device_id] == backend.sycl_device(0)


def test_stream_from_a_sycl_queue(xpu: str) -> None:
    import dpctl

    backend: Any = get_backend("xpu")
    queue = dpctl.SyclQueue(backend.context(0), backend.sycl_device(0), property="in_order")
    stream = acc.Stream.from_handle(queue)
    assert acc.Stream.from_handle(queue) == stream  # one handle per queue
    assert backend.queue(0, stream.handle) is queue
    buf = acc.empty(1000, stream=stream)
    acc.copy_(buf, np.full(1000, 9, np.uint8), stream=stream)
    stream.synchronize()
    out = np.zeros(1000, np.uint8)
    acc.copy_(out, buf, stream=stream)
    stream.synchronize()
    assert set(out.tolist()) == {9}
    buf.free()


def test_stream_from_a_bad_sycl_queue_names_it(xpu: str) -> None:
    import dpctl

    backend: Any = get_backend("xpu")
    device = backend.sycl_device(0)
    streams_before = len(backend._dev(0).streams)
    if device.is_cpu:  # a sub-device is another device (a GPU may not partition)
        sub = device.create_sub_devices(partition=1)[0]
        elsewhere = dpctl.SyclQueue(sub, property="in_order")
        with pytest.raises(ValueError, match=r"the queue is on SYCL device \(a sub-device\)"):
            acc.Stream.from_handle(elsewhere)
    out_of_order = dpctl.SyclQueue(backend.context(0), device)
    with pytest.raises(ValueError, match=r"the queue is out-of-order"):
        acc.Stream.from_handle(out_of_order)
    assert len(backend._dev(0).streams) == streams_before  # nothing changed
    with pytest.raises(TypeError, match=r"expected a dpctl.SyclQueue, got SyclContext"):
        acc.Stream.from_handle(backend.context(0))


def test_a_sycl_queue_on_another_backend_is_refused(xpu: str) -> None:
    import dpctl

    backend: Any = get_backend("xpu")
    queue = dpctl.SyclQueue(backend.context(0), backend.sycl_device(0), property="in_order")
    acc.backends.use("sim")
    with pytest.raises(TypeError, match=r"SyclQueue is a dpctl \(SYCL\) object, but the device"):
        acc.Stream.from_handle(queue)


def test_a_buffer_of_another_backend_in_a_copy_is_refused(xpu: str) -> None:
    buf = acc.empty(64)
    acc.backends.use("sim")
    other = acc.empty(64)
    with pytest.raises(ValueError):
        acc.copy_(other, buf)
    other.free()
    acc.backends.use("xpu")
    buf.free()


# ---------------------------------------------------------------- real kernels
N = 1 << 16
SLOW = 20_000  # iterations per byte: about 0.2 s of one queue's work on 2 CPU cores


def test_record_stream_keeps_a_block_from_reuse_while_a_kernel_writes_it(xpu: str) -> None:
    backend: Any = get_backend("xpu")
    side = acc.Stream()
    old = acc.empty(N)
    address = old.ptr
    slow_fill(backend.queue(0, side.handle), old.ptr, N, 7, SLOW)  # still writing below
    acc.record_stream(old, side)
    old.free()
    new = acc.empty(N)  # same size, same stream: the cached block, were it not for side
    assert new.ptr != address and not side.query()  # the kernel still writes the old block
    acc.copy_(new, np.ones(N, np.uint8))
    acc.synchronize()
    out = np.zeros(N, np.uint8)
    acc.copy_(out, new)
    acc.synchronize()
    assert set(out.tolist()) == {1}  # the kernel wrote the old block only
    new.free()
    again = acc.empty(N)  # the kernel has finished: the old block is reusable now
    assert again.ptr in (address, new.ptr)
    again.free()


def test_an_event_orders_a_kernel_before_a_copy_on_another_queue(xpu: str) -> None:
    backend: Any = get_backend("xpu")
    producer, consumer = acc.Stream(), acc.Stream()
    buf = acc.empty(N, stream=producer)
    slow_fill(backend.queue(0, producer.handle), buf.ptr, N, 5, SLOW)
    done = producer.record_event()
    assert not done.query()  # the kernel is still running
    consumer.wait_event(done)
    out = np.zeros(N, np.uint8)
    acc.copy_(out, buf, stream=consumer)
    consumer.synchronize()
    assert set(out.tolist()) == {5}
    acc.record_stream(buf, consumer)
    buf.free()


def _zeroed(nbytes: int) -> acc.Buffer:
    buf = acc.empty(nbytes)
    acc.copy_(buf, np.zeros(nbytes, np.uint8))
    return buf


def test_a_side_stream_copy_sees_a_write_on_the_default_stream_only_after_waiting(
    xpu: str,
) -> None:
    """tests/memory/test_copy_fast_path.py's "d2d side stream" case, made deterministic: a
    kernel on the default stream is still writing the source when the copy is submitted.
    ``copy_`` (compiled or reference, as the core in use has it) orders nothing across queues:
    unordered, the side queue copies the source before the kernel has written it (what that
    case read in CI, zeros); after ``wait_stream`` it copies the kernel's bytes."""
    backend: Any = get_backend("xpu")
    default = acc.current_stream()
    for wait in (False, True):
        src, dst = _zeroed(N), _zeroed(N)
        acc.synchronize()
        slow_fill(backend.queue(0, default.handle), src.ptr, N, 10, SLOW)
        side = acc.Stream()
        if wait:
            side.wait_stream(default)
        acc.copy_(dst, src, stream=side)
        side.synchronize()
        out = np.zeros(N, np.uint8)
        acc.copy_(out, dst)
        acc.synchronize()
        if wait:
            assert set(out.tolist()) == {10}
        else:  # the queues ran at once: the copy read bytes the kernel had not written yet
            assert out.tolist().count(10) < N
        src.free()
        dst.free()


def test_elapsed_time_around_a_kernel(xpu: str) -> None:
    backend: Any = get_backend("xpu")
    stream = acc.Stream()
    buf = acc.empty(N, stream=stream)
    start, end = acc.Event(enable_timing=True), acc.Event(enable_timing=True)
    slow_fill(backend.queue(0, stream.handle), buf.ptr, N, 1, 1)  # built and warm
    start.record(stream)
    slow_fill(backend.queue(0, stream.handle), buf.ptr, N, 2, SLOW // 4)
    end.record(stream)
    elapsed = start.elapsed_time(end)
    assert 1.0 < elapsed < 60_000.0  # the kernel's tens of milliseconds, not a marker's us
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        buf.free()


def test_dlpack_exports_usm_memory_as_oneapi(xpu: str) -> None:
    from dlpack_capsules import consume, open_capsule

    backend: Any = get_backend("xpu")
    buf = acc.empty(3000)
    acc.copy_(buf, np.arange(3000, dtype=np.uint8))
    assert buf.__dlpack_device__() == backend.dlpack_device(0)
    capsule = buf.__dlpack__(max_version=(1, 0))  # the buffer's stream is synchronized first
    name, _, struct = open_capsule(capsule)
    tensor = struct.dl_tensor
    assert name == b"dltensor_versioned"
    assert (tensor.device.device_type, tensor.device.device_id) == backend.dlpack_device(0)
    assert tensor.data == buf.ptr and tensor.ndim == 1 and tensor.shape[0] == 3000
    # the bytes a consumer reads at that address are the buffer's (USM memory on the CPU)
    assert bytes((ctypes.c_uint8 * 3000).from_address(tensor.data)) == bytes(
        np.arange(3000, dtype=np.uint8)
    )
    consume(capsule)
    host_view = np.from_dlpack(buf, device="cpu")  # numpy asks for the host view
    assert host_view[:4].tolist() == [0, 1, 2, 3]
    with pytest.raises(BufferError, match=r"not \(2, 0\); accelrt does not copy on export"):
        buf.__dlpack__(dl_device=(2, 0))
    with pytest.raises(BufferError, match="accelrt does not copy on export"):
        buf.__dlpack__(copy=True)
    del host_view
    buf.free()


def test_usm_allocation_failures_become_backend_out_of_memory() -> None:
    # The runtime's two ways of refusing memory (a MemoryError, dpctl's USMAllocationError)
    # become BackendOutOfMemory, which the allocator turns into OutOfMemoryError; any other
    # error passes unchanged. Needs no device: the allocation is a stand-in.
    from accelrt.backends import BackendOutOfMemory
    from accelrt.backends.xpu._memory import _usm_allocation

    class USMAllocationError(Exception):
        pass

    def raising(error: Exception) -> Any:
        def make() -> Any:
            raise error

        return make

    assert _usm_allocation(0, 8, "bytes", lambda: "memory") == "memory"
    with pytest.raises(BackendOutOfMemory, match=r"^xpu:1: 4096 host bytes: MemoryError$"):
        _usm_allocation(1, 4096, "host bytes", raising(MemoryError()))
    with pytest.raises(BackendOutOfMemory, match=r"^xpu:0: USM allocation failed$"):
        _usm_allocation(0, 8, "bytes", raising(USMAllocationError("USM allocation failed")))
    with pytest.raises(ValueError, match="unrelated"):
        _usm_allocation(0, 8, "bytes", raising(ValueError("unrelated")))
