"""CUDA interop without a GPU: foreign streams, the CUDA Array Interface, DLPack capsules,
the CuPy and Numba allocator plugs and ``accelrt.Graph``.

The CUDA backend runs on the fake driver of ``test_cuda_nogpu.py`` (extended here with the
graph-capture functions); CuPy and Numba are fake modules put in ``sys.modules``, which check
the calls accelrt makes and the allocator's bookkeeping, not the libraries themselves. What
needs a real GPU is listed in docs/cuda.md.
"""

from __future__ import annotations

import gc
import sys
import types
from collections import namedtuple
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from dlpack_capsules import consume, open_capsule
from test_cuda_nogpu import SUCCESS, CUevent_flags, FakeDriver, MiB, _Names, _recorded

import accelrt as acc
from accelrt.backends import GraphCapture, get_backend
from accelrt.backends.cuda import CUDABackend, CUDAError
from accelrt.memory.buffers import _dlpack
from accelrt.testing import forget_backend, install_backend, reset_runtime

INVALID_VALUE = 1
CAPTURE_INVALIDATED = 901
STREAM_CAPTURE_UNSUPPORTED = 900


class GraphDriver(FakeDriver):
    """The fake driver plus stream capture and graphs (each a numbered handle)."""

    CUstreamCaptureMode = _Names()

    class CUgraphDebugDot_flags:
        CU_GRAPH_DEBUG_DOT_FLAGS_VERBOSE = 1

    def __init__(self, devices: int = 1) -> None:
        super().__init__(devices=devices)
        self.capturing: dict[int, str] = {}  # stream -> mode
        self.thread_mode = "CU_STREAM_CAPTURE_MODE_GLOBAL"  # one thread: the tests'
        self.graphs: set[int] = set()
        self.execs: dict[int, int] = {}  # exec -> graph
        self.launches: list[tuple[int, int]] = []

    @_recorded
    def cuThreadExchangeStreamCaptureMode(self, mode: str) -> tuple[int, str]:
        previous, self.thread_mode = self.thread_mode, mode
        return (SUCCESS, previous)

    def cuMemAlloc(self, nbytes: int) -> tuple[int, ...]:
        # as the driver: a capture not in relaxed mode refuses allocations on its thread
        if self.capturing and self.thread_mode != "CU_STREAM_CAPTURE_MODE_RELAXED":
            self.calls.append(("cuMemAlloc", (nbytes,)))
            return (STREAM_CAPTURE_UNSUPPORTED,)
        return super().cuMemAlloc(nbytes)  # type: ignore[no-any-return]

    def cuEventQuery(self, event: int) -> tuple[int]:
        # as the driver: querying an event during a global capture is illegal
        if self.capturing and self.thread_mode == "CU_STREAM_CAPTURE_MODE_GLOBAL":
            self.calls.append(("cuEventQuery", (event,)))
            return (STREAM_CAPTURE_UNSUPPORTED,)
        return super().cuEventQuery(event)  # type: ignore[no-any-return]

    @_recorded
    def cuStreamBeginCapture(self, stream: int, mode: str) -> tuple[int]:
        self.capturing[stream] = mode
        return (SUCCESS,)

    @_recorded
    def cuStreamEndCapture(self, stream: int) -> tuple[int, int]:
        del self.capturing[stream]
        graph = 0x6000 + self._handle()
        self.graphs.add(graph)
        return (SUCCESS, graph)

    @_recorded
    def cuGraphInstantiate(self, graph: int, flags: int) -> tuple[int, int]:
        assert graph in self.graphs and flags == 0
        executable = 0x9000 + self._handle()
        self.execs[executable] = graph
        return (SUCCESS, executable)

    @_recorded
    def cuGraphLaunch(self, executable: int, stream: int) -> tuple[int]:
        assert executable in self.execs
        self.launches.append((executable, stream))
        return (SUCCESS,)

    @_recorded
    def cuGraphDestroy(self, graph: int) -> tuple[int]:
        self.graphs.remove(graph)
        return (SUCCESS,)

    @_recorded
    def cuGraphExecDestroy(self, executable: int) -> tuple[int]:
        del self.execs[executable]
        return (SUCCESS,)

    @_recorded
    def cuGraphDebugDotPrint(self, graph: int, path: bytes, flags: int) -> tuple[int]:
        assert graph in self.graphs and isinstance(path, bytes) and flags == 1
        with open(path, "w") as out:
            out.write(f"digraph g{graph:x} {{}}\n")
        return (SUCCESS,)


def _use_fake(fake: FakeDriver) -> CUDABackend:
    backend = CUDABackend(driver=fake)
    install_backend("cuda", backend)
    acc.backends.use("cuda")
    return backend


@pytest.fixture
def gpu() -> Iterator[GraphDriver]:
    """The fake-driver CUDA backend (one 64 MiB device) made the accelerator."""
    fake = GraphDriver()
    _use_fake(fake)
    yield fake
    reset_runtime()
    forget_backend("cuda")


class ForeignStream:
    """A stream of another library: the CUDA stream protocol and nothing else."""

    def __init__(self, handle: int, version: int = 0) -> None:
        self.handle = handle
        self.version = version

    def __cuda_stream__(self) -> tuple[int, int]:
        return (self.version, self.handle)


# ---------------------------------------------------------------- foreign streams
def test_a_foreign_cuda_stream_is_wrapped_not_owned(gpu: GraphDriver) -> None:
    stream = acc.Stream.from_handle(ForeignStream(0x5123))
    assert stream.handle == 0x5123 and stream.device == acc.Device("cuda", 0)
    assert stream == acc.Stream.from_handle(0x5123)
    stream.synchronize()
    assert gpu.calls[-1] == ("cuStreamSynchronize", (0x5123,))
    del stream
    gc.collect()
    assert "cuStreamDestroy" not in gpu.names()


def test_an_early_cuda_core_attribute_tuple_is_accepted(gpu: GraphDriver) -> None:
    obj = types.SimpleNamespace(__cuda_stream__=(0, 0x77))
    assert acc.Stream.from_handle(obj).handle == 0x77


def test_a_bad_cuda_stream_protocol_is_refused(gpu: GraphDriver) -> None:
    with pytest.raises(ValueError, match=r"has protocol version 1; accelrt understands version 0"):
        acc.Stream.from_handle(ForeignStream(0x10, version=1))
    with pytest.raises(TypeError, match=r"must return \(version, handle\) ints, got \(0, '1'\)"):
        acc.Stream.from_handle(types.SimpleNamespace(__cuda_stream__=lambda: (0, "1")))
    with pytest.raises(ValueError, match=r"gave handle -4 < 0"):
        acc.Stream.from_handle(ForeignStream(-4))
    with pytest.raises(
        TypeError, match=r"must be an int, got 'x' \(or, on cuda, an object with __cuda_stream__\)"
    ):
        acc.Stream.from_handle("x")


def test_a_cuda_stream_is_refused_on_another_backend(sim: str) -> None:
    with pytest.raises(
        TypeError,
        match=r"ForeignStream is a CUDA stream \(it has __cuda_stream__\), but the device is "
        r"sim:0; CUDA streams wrap only on the 'cuda' backend",
    ):
        acc.Stream.from_handle(ForeignStream(0x10))


def test_accelrt_cuda_streams_speak_the_protocol(gpu: GraphDriver) -> None:
    stream = acc.Stream()
    assert stream.__cuda_stream__() == (0, stream.handle)
    assert acc.current_stream().__cuda_stream__() == (0, 0)
    assert acc.Stream.from_handle(stream) == stream  # accelrt streams are foreign streams too


def test_other_streams_have_no_cuda_stream_protocol(sim: str) -> None:
    stream = acc.Stream()
    assert not hasattr(stream, "__cuda_stream__")
    with pytest.raises(AttributeError, match="a stream of sim:0 is not a CUDA stream"):
        stream.__cuda_stream__  # noqa: B018


# ---------------------------------------------------------------- CUDA Array Interface
def test_cuda_buffers_have_the_cuda_array_interface(gpu: GraphDriver) -> None:
    stream = acc.Stream()
    buf = acc.empty(1000, stream=stream)
    assert buf.__cuda_array_interface__ == {
        "shape": (1000,),
        "typestr": "|u1",
        "data": (buf.ptr, False),
        "strides": None,
        "version": 3,
        "stream": stream.handle,
    }
    on_default = acc.empty(10)
    assert on_default.__cuda_array_interface__["stream"] == 1  # legacy default: 1, never 0
    assert acc.empty(0).__cuda_array_interface__["data"] == (0, False)
    buf.free()
    with pytest.raises(ValueError, match="holds no memory"):
        buf.__cuda_array_interface__  # noqa: B018


def test_other_buffers_have_no_cuda_array_interface(sim: str) -> None:
    buf = acc.empty(64)
    assert not hasattr(buf, "__cuda_array_interface__")
    with pytest.raises(
        AttributeError, match=r"memory of sim:0 is not CUDA memory \(no __cuda_array_interface__\)"
    ):
        buf.__cuda_array_interface__  # noqa: B018


# ---------------------------------------------------------------- DLPack
def test_dlpack_device_is_cuda_and_the_cuda_ordinal(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ACCELRT_VISIBLE_DEVICES", "1")
    _use_fake(GraphDriver(devices=2))
    try:
        assert acc.empty(16).__dlpack_device__() == (2, 1)
    finally:
        reset_runtime()
        forget_backend("cuda")


def test_a_dlpack_capsule_describes_the_buffer_and_keeps_it_alive(gpu: GraphDriver) -> None:
    buf = acc.empty(3000)
    ptr = buf.ptr
    capsule = buf.__dlpack__()
    name, _, struct = open_capsule(capsule)
    tensor = struct.dl_tensor
    assert name == b"dltensor"
    assert tensor.data == ptr and tensor.ndim == 1 and tensor.shape[0] == 3000
    assert (tensor.device.device_type, tensor.device.device_id) == (2, 0)
    assert (tensor.dtype.code, tensor.dtype.bits, tensor.dtype.lanes) == (1, 8, 1)
    assert not tensor.strides and tensor.byte_offset == 0
    del buf
    gc.collect()
    assert acc.memory_allocated() == 3072  # the capsule holds the buffer
    consume(capsule)
    assert _dlpack.live_count() == 0
    del capsule
    gc.collect()
    assert acc.memory_allocated() == 0


def test_a_versioned_capsule_for_dlpack_1_consumers(gpu: GraphDriver) -> None:
    buf = acc.empty(512)
    capsule = buf.__dlpack__(max_version=(1, 2))
    name, _, struct = open_capsule(capsule)
    assert name == b"dltensor_versioned"
    assert (struct.version.major, struct.version.minor) == (1, 0) and struct.flags == 0
    assert struct.dl_tensor.data == buf.ptr and struct.dl_tensor.shape[0] == 512
    legacy, _, _ = open_capsule(buf.__dlpack__(max_version=(0, 8)))
    assert legacy == b"dltensor"
    consume(capsule)
    assert _dlpack.live_count() == 0


def test_an_unconsumed_capsule_releases_the_buffer(gpu: GraphDriver) -> None:
    buf = acc.empty(1024)
    capsule = buf.__dlpack__()
    del buf
    assert _dlpack.live_count() == 1
    del capsule
    gc.collect()
    assert _dlpack.live_count() == 0
    assert acc.memory_allocated() == 0


def test_dlpack_makes_the_consumer_stream_wait(gpu: GraphDriver) -> None:
    stream = acc.Stream()
    buf = acc.empty(256, stream=stream)
    start = len(gpu.calls)
    consume(buf.__dlpack__(stream=0x7777))
    calls = [c for c in gpu.calls[start:] if not c[0].startswith("cuCtx")]
    names = [name for name, _ in calls]
    assert names == ["cuEventCreate", "cuEventRecord", "cuStreamWaitEvent", "cuEventDestroy"]
    assert calls[0][1] == (CUevent_flags.CU_EVENT_DISABLE_TIMING,)
    (event,) = calls[3][1]
    assert calls[1][1] == (event, stream.handle)
    assert calls[2][1] == (0x7777, event, 0)
    start = len(gpu.calls)
    consume(buf.__dlpack__(stream=None))  # the legacy default stream (CU_STREAM_LEGACY = 1)
    assert ("cuStreamWaitEvent", (1, gpu.calls[-1][1][0], 0)) in gpu.calls[start:]


def test_dlpack_skips_synchronisation_when_it_is_not_needed(gpu: GraphDriver) -> None:
    stream = acc.Stream()
    on_stream = acc.empty(256, stream=stream)
    on_default = acc.empty(256)
    start = len(gpu.calls)
    for capsule in (
        on_stream.__dlpack__(stream=-1),  # the consumer asked for none
        on_stream.__dlpack__(stream=stream.handle),  # the buffer's own stream
        on_default.__dlpack__(stream=1),  # legacy default = accelrt's default stream
        on_default.__dlpack__(),
    ):
        consume(capsule)
    assert "cuStreamWaitEvent" not in [name for name, _ in gpu.calls[start:]]


def test_dlpack_arguments_are_checked(gpu: GraphDriver) -> None:
    buf = acc.empty(256)
    with pytest.raises(ValueError, match="DLPack stream 0 is not allowed"):
        buf.__dlpack__(stream=0)
    with pytest.raises(ValueError, match="DLPack stream -2 is not allowed"):
        buf.__dlpack__(stream=-2)
    with pytest.raises(TypeError, match=r"DLPack stream must be an int or None, got 1\.5"):
        buf.__dlpack__(stream=1.5)
    with pytest.raises(BufferError, match=r"is on DLPack device \(2, 0\), not \(1, 0\)"):
        buf.__dlpack__(dl_device=(1, 0))
    with pytest.raises(BufferError, match="accelrt does not copy on export"):
        buf.__dlpack__(copy=True)
    buf.free()
    with pytest.raises(ValueError, match="holds no memory"):
        buf.__dlpack__()
    assert _dlpack.live_count() == 0


def test_host_accessible_buffers_still_export_through_numpy(sim: str) -> None:
    buf = acc.empty(8)
    buf.numpy()[:] = np.arange(8, dtype=np.uint8)
    assert buf.__dlpack_device__() == (1, 0)
    assert np.from_dlpack(buf).tolist() == list(range(8))
    assert np.from_dlpack(buf, copy=True).tolist() == list(range(8))


# ---------------------------------------------------------------- CuPy
class FakeCupy(types.ModuleType):
    """The parts of ``cupy`` the plug uses: recorded, with CuPy's signatures."""

    def __init__(self, stream_ptr: int = 0, device: int = 0) -> None:
        super().__init__("cupy")
        self.allocator: Any = "cupy's pool"
        stream = types.SimpleNamespace(ptr=stream_ptr)

        class UnownedMemory:
            def __init__(self, ptr: int, size: int, owner: object, device_id: int) -> None:
                self.ptr, self.size, self.owner, self.device_id = ptr, size, owner, device_id

        class MemoryPointer:
            def __init__(self, mem: UnownedMemory, offset: int) -> None:
                self.mem, self.ptr = mem, mem.ptr + offset

        def set_allocator(allocator: Any = None) -> None:
            self.allocator = allocator

        self.cuda = types.SimpleNamespace(
            runtime=types.SimpleNamespace(getDevice=lambda: device),
            get_current_stream=lambda: stream,
            UnownedMemory=UnownedMemory,
            MemoryPointer=MemoryPointer,
            set_allocator=set_allocator,
        )


def test_cupy_allocates_from_accelrt_on_its_current_stream(
    gpu: GraphDriver, monkeypatch: pytest.MonkeyPatch
) -> None:
    from accelrt.interop import cupy as acc_cupy

    fake = FakeCupy(stream_ptr=0x5ABC)
    monkeypatch.setitem(sys.modules, "cupy", fake)
    acc_cupy.use_accelrt_allocator()
    assert fake.allocator is acc_cupy.accelrt_allocator
    pointer = fake.allocator(1000)
    memory = pointer.mem
    assert isinstance(memory.owner, acc.Buffer)
    assert (pointer.ptr, memory.size, memory.device_id) == (memory.owner.ptr, 1000, 0)
    assert memory.owner.stream == acc.Stream.from_handle(0x5ABC)
    assert acc.memory_allocated() == 1024 and gpu.names().count("cuMemAlloc") == 1
    del pointer, memory
    gc.collect()
    assert acc.memory_allocated() == 0
    again = fake.allocator(1000)  # a cache hit on the same stream
    assert gpu.names().count("cuMemAlloc") == 1
    empty = fake.allocator(0)
    assert (empty.ptr, empty.mem.device_id) == (0, -1)  # CuPy must not query a null pointer
    del again


def test_cupy_plug_needs_the_cuda_backend(sim: str, monkeypatch: pytest.MonkeyPatch) -> None:
    from accelrt.interop import cupy as acc_cupy

    monkeypatch.setitem(sys.modules, "cupy", FakeCupy())
    with pytest.raises(
        RuntimeError, match="needs the 'cuda' backend, but the accelerator is 'sim'"
    ):
        acc_cupy.accelrt_allocator(16)


def test_cupy_device_hidden_from_accelrt(gpu: GraphDriver, monkeypatch: pytest.MonkeyPatch) -> None:
    from accelrt.interop import cupy as acc_cupy

    monkeypatch.setitem(sys.modules, "cupy", FakeCupy(device=3))
    with pytest.raises(ValueError, match=r"CUDA device 3 .* is not visible to accelrt"):
        acc_cupy.accelrt_allocator(16)


def test_cupy_missing_names_the_package(monkeypatch: pytest.MonkeyPatch) -> None:
    from accelrt.interop import cupy as acc_cupy

    monkeypatch.setitem(sys.modules, "cupy", None)
    with pytest.raises(ImportError, match=r"needs CuPy: pip install cupy-cuda12x"):
        acc_cupy.use_accelrt_allocator()


# ---------------------------------------------------------------- Numba
MemoryInfo = namedtuple("MemoryInfo", ["free", "total"])


def _fake_numba(
    nvidia_binding: bool,
) -> tuple[types.ModuleType, types.ModuleType, types.ModuleType]:
    numba = types.ModuleType("numba")
    cuda = types.ModuleType("numba.cuda")

    class HostOnlyCUDAMemoryManager:
        def __init__(self, context: Any) -> None:
            self.context = context
            self.events: list[str] = []

        def initialize(self) -> None:
            self.events.append("initialize")

        def reset(self) -> None:
            self.events.append("reset")

    class MemoryPointer:
        def __init__(self, context: Any, pointer: Any, size: int, finalizer: Any = None) -> None:
            self.context, self.device_pointer, self.size = context, pointer, size
            self.finalizer = finalizer

    def set_memory_manager(manager: type) -> None:
        cuda.manager = manager  # type: ignore[attr-defined]

    cuda.HostOnlyCUDAMemoryManager = HostOnlyCUDAMemoryManager  # type: ignore[attr-defined]
    cuda.MemoryPointer = MemoryPointer  # type: ignore[attr-defined]
    cuda.MemoryInfo = MemoryInfo  # type: ignore[attr-defined]
    cuda.set_memory_manager = set_memory_manager  # type: ignore[attr-defined]
    numba.cuda = cuda  # type: ignore[attr-defined]
    # numba-cuda's driver module has no USE_NV_BINDING (always cuda-bindings); Numba 0.60's
    # ctypes binding has it False, whatever NUMBA_CUDA_USE_NVIDIA_BINDING says
    driver = types.ModuleType("numba.cuda.cudadrv.driver")
    if not nvidia_binding:
        driver.USE_NV_BINDING = False  # type: ignore[attr-defined]
    numba.config = types.SimpleNamespace(CUDA_USE_NVIDIA_BINDING=not nvidia_binding)  # type: ignore[attr-defined]
    return numba, cuda, driver


@pytest.fixture(params=[False, True], ids=["ctypes-binding", "nvidia-binding"])
def fake_numba(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[bool]:
    from accelrt.interop import numba as acc_numba

    numba, cuda, driver = _fake_numba(request.param)
    monkeypatch.setitem(sys.modules, "numba", numba)
    monkeypatch.setitem(sys.modules, "numba.cuda", cuda)
    monkeypatch.setitem(sys.modules, "numba.cuda.cudadrv.driver", driver)
    acc_numba._manager_class.cache_clear()
    yield request.param
    acc_numba._manager_class.cache_clear()


def _context(device: int = 0) -> Any:
    return types.SimpleNamespace(device=types.SimpleNamespace(id=device))


def test_numba_emm_plugin_allocates_from_accelrt(gpu: GraphDriver, fake_numba: bool) -> None:
    from accelrt.interop import numba as acc_numba

    acc_numba.use_accelrt_allocator()
    manager_class = sys.modules["numba.cuda"].manager  # type: ignore[attr-defined]
    assert manager_class is acc_numba.AccelrtNumbaManager is acc_numba._numba_memory_manager
    assert manager_class.__mro__[1].__name__ == "HostOnlyCUDAMemoryManager"
    context = _context()
    manager = manager_class(context)
    manager.initialize()
    assert manager.interface_version == 1
    pointer = manager.memalloc(5000)
    address = int(pointer.device_pointer) if fake_numba else pointer.device_pointer.value
    assert pointer.context is context and pointer.size == 5000
    assert address in gpu.memory  # the first block of a cuMemAlloc segment
    assert acc.memory_allocated() == 5120
    assert type(pointer.device_pointer).__name__ == ("CUdeviceptr" if fake_numba else "c_ulong")
    pointer.finalizer()
    assert acc.memory_allocated() == 0
    assert manager.get_memory_info() == MemoryInfo(free=64 * MiB - 2 * MiB, total=64 * MiB)
    with pytest.raises(NotImplementedError, match="cannot make IPC handles yet"):
        manager.get_ipc_handle(pointer)
    manager.reset()
    assert manager.events == ["initialize", "reset"]
    assert acc.memory_reserved() == 0  # reset emptied accelrt's cache


def test_numba_finalizer_inside_an_allocator_call_waits_for_it(
    gpu: GraphDriver, fake_numba: bool
) -> None:
    # Numba runs the finaliser from weakref.finalize, so wherever the collector runs, even
    # inside an allocator call: it must not free there (it called buffer.free(), re-entering).
    from accelrt.interop import numba as acc_numba

    manager = acc_numba.AccelrtNumbaManager(_context())
    manager.initialize()
    pointer = manager.memalloc(5000)
    block = pointer.finalizer.buffer.block
    allocator = acc.memory.get_allocator()
    with allocator._lock:  # as if the collector ran the finaliser inside an allocator call
        pointer.finalizer()
        assert block.allocated
    acc.empty(1).free()  # the next call frees it first
    assert not block.allocated and acc.memory_allocated() == 0


def test_numba_plugin_needs_the_cuda_backend(sim: str, fake_numba: bool) -> None:
    from accelrt.interop import numba as acc_numba

    manager = acc_numba.AccelrtNumbaManager(_context())
    with pytest.raises(
        RuntimeError, match="needs the 'cuda' backend, but the accelerator is 'sim'"
    ):
        manager.initialize()


def test_numba_missing_names_the_package(monkeypatch: pytest.MonkeyPatch) -> None:
    from accelrt.interop import numba as acc_numba

    monkeypatch.setitem(sys.modules, "numba", None)
    acc_numba._manager_class.cache_clear()
    with pytest.raises(ImportError, match="needs Numba: pip install numba-cuda"):
        acc_numba.use_accelrt_allocator()
    with pytest.raises(AttributeError, match="has no attribute 'nothing'"):
        acc_numba.nothing  # noqa: B018


# ---------------------------------------------------------------- Graph
@pytest.mark.parametrize("name", ["sim", "opencl"])
def test_backends_without_capture_refuse_graphs(name: str, request: pytest.FixtureRequest) -> None:
    request.getfixturevalue(name)
    assert not isinstance(get_backend(name), GraphCapture)
    assert not acc.is_graph_available()
    with pytest.raises(RuntimeError, match=f"the '{name}' backend cannot capture graphs"):
        acc.Graph()


def test_the_cuda_backend_can_capture(gpu: GraphDriver) -> None:
    assert isinstance(get_backend("cuda"), GraphCapture)


def test_is_graph_available_is_the_backends_capability(gpu: GraphDriver) -> None:
    assert acc.is_graph_available()  # the cuda backend (fake driver) captures graphs


def test_is_graph_available_never_raises(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ACCELRT_BACKEND", "nonesuch")
    assert not acc.is_graph_available()
    with pytest.raises(ValueError, match="unknown backend 'nonesuch'"):
        acc.current_stream()  # choosing the accelerator raises: is_graph_available() did not


def test_graph_capture_and_replay(gpu: GraphDriver) -> None:
    src = acc.empty(MiB)
    graph = acc.Graph()
    stream = acc.Stream()
    assert not stream.is_capturing()
    with stream, graph:
        assert graph.is_capturing and gpu.capturing == {
            stream.handle: "CU_STREAM_CAPTURE_MODE_GLOBAL"
        }
        assert stream.is_capturing() and acc.Stream.from_handle(stream.handle).is_capturing()
        assert not acc.current_stream(0).is_capturing() or acc.current_stream(0) == stream
        out = acc.empty(MiB)  # a new segment: cuMemAlloc with the thread's mode relaxed
        acc.copy_(out, src)
    names = [name for name in gpu.names() if not name.startswith("cuCtx")]
    at = names.index("cuStreamBeginCapture")
    assert names[at + 1 : at + 4] == [
        "cuThreadExchangeStreamCaptureMode", "cuMemAlloc", "cuThreadExchangeStreamCaptureMode"
    ]  # fmt: skip
    assert gpu.thread_mode == "CU_STREAM_CAPTURE_MODE_GLOBAL"  # given back
    assert not graph.is_capturing and not gpu.capturing and not stream.is_capturing()
    assert graph.mem_pool.use_count() == 2  # the pool object and the graph's capture
    assert stream.native_handle == stream.handle == stream.stream_id  # the CUstream itself
    assert stream.device_type == "cuda"
    assert graph.mem_pool.memory_allocated() == MiB  # captured allocations: the private pool
    assert acc.memory_allocated() == 2 * MiB
    (graph_handle,) = [args[0] for name, args in gpu.calls if name == "cuGraphInstantiate"]
    assert graph_handle not in gpu.graphs  # keep_graph=False: destroyed once instantiated
    (executable,) = gpu.execs
    side = acc.Stream()
    with side:
        for _ in range(3):
            graph.replay()
    assert gpu.launches == [(executable, side.handle)] * 3  # on the current stream
    assert "Graph(instantiated" in repr(graph)
    graph.reset()
    assert not gpu.execs and repr(graph).startswith("Graph(empty")
    assert graph.mem_pool.use_count() == 1
    with stream, graph:  # recapture after reset
        pass
    assert len(gpu.execs) == 1
    del graph
    gc.collect()
    assert not gpu.execs and not gpu.graphs
    del out


def test_no_event_is_recorded_or_queried_during_a_capture(gpu: GraphDriver) -> None:
    side = acc.Stream()
    early = acc.empty(4096)
    acc.record_stream(early, side)
    early.free()  # its event has not completed: the allocator will query it
    (pending,) = [args[0] for name, args in gpu.calls if name == "cuEventRecord"]
    gpu.pending.add(pending)
    graph, stream = acc.Graph(), acc.Stream()
    with stream, graph:
        start = len(gpu.calls)
        out = acc.empty(MiB)  # a malloc that would have queried the pending event
        held = acc.empty(8192)
        acc.record_stream(held, side)
        held.free()  # set aside: an event recorded now would join the graph
        during = [name for name, _ in gpu.calls[start:]]
    assert "cuEventQuery" not in during and "cuEventRecord" not in during, during
    gpu.pending.clear()
    start = len(gpu.calls)
    after = acc.empty(16)  # no capture underway: the set-aside block's event, then queries
    names = [name for name, _ in gpu.calls[start:] if not name.startswith("cuCtx")]
    assert names[:3] == ["cuEventCreate", "cuEventRecord", "cuEventQuery"], names
    assert acc.memory_stats()["active_bytes.all.current"] == MiB + 512  # out and after
    del out, after


def test_debug_mode_keeps_the_graph_for_debug_dump(gpu: GraphDriver, tmp_path: Path) -> None:
    # torch.accelerator.Graph's enable_debug_mode and debug_dump (issue 25)
    plain = acc.Graph()
    with acc.Stream(), plain:
        pass
    with pytest.warns(RuntimeWarning, match=r"call graph.enable_debug_mode\(\) before"):
        plain.debug_dump(tmp_path / "none.dot")
    assert not (tmp_path / "none.dot").exists()
    graph = acc.Graph()
    graph.enable_debug_mode()
    with pytest.raises(RuntimeError, match="no captured graph to dump"):
        graph.debug_dump(tmp_path / "early.dot")
    with acc.Stream(), graph:
        pass
    (executable,) = [e for e, g in gpu.execs.items() if g in gpu.graphs]  # kept, instantiated
    dot = tmp_path / "graph.dot"
    graph.debug_dump(dot)
    assert dot.read_text() == f"digraph g{gpu.execs[executable]:x} {{}}\n"
    graph.replay()
    assert gpu.launches[-1][0] == executable


def test_allocations_outside_capture_use_the_default_pool(gpu: GraphDriver) -> None:
    graph = acc.Graph()
    with acc.Stream():
        graph.capture_begin()
        inside = acc.empty(4096)
        graph.capture_end()
        outside = acc.empty(4096)
    assert graph.mem_pool.memory_allocated() == 4096
    assert acc.memory_allocated() == 8192
    del inside, outside


def test_keep_graph_instantiates_on_demand(gpu: GraphDriver) -> None:
    graph = acc.Graph(keep_graph=True, capture_error_mode="relaxed")
    with acc.Stream() as stream:
        graph.capture_begin()
        assert gpu.capturing == {stream.handle: "CU_STREAM_CAPTURE_MODE_RELAXED"}
        graph.capture_end()
        assert len(gpu.graphs) == 1 and not gpu.execs
        graph.replay()
        graph.replay()
    assert gpu.names().count("cuGraphInstantiate") == 1
    first = next(iter(gpu.execs))
    graph.instantiate()  # again: the old executable goes
    assert first not in gpu.execs and len(gpu.execs) == 1
    graph.reset()
    assert not gpu.graphs and not gpu.execs


def test_graphs_share_a_pool(gpu: GraphDriver) -> None:
    first = acc.Graph()
    second = acc.Graph(pool=first.pool())
    assert second.mem_pool is first.mem_pool and second.pool() == first.pool()
    pool = acc.memory.MemPool()
    assert acc.Graph(pool=pool).mem_pool is pool
    with pytest.raises(ValueError, match=r"pool \(0, 999999\) is not the pool of a live"):
        acc.Graph(pool=(0, 999999))
    with pytest.raises(TypeError, match=r"pool must be an accelrt\.memory\.MemPool"):
        acc.Graph(pool="mine")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="keep_graph must be a bool, got 1"):
        acc.Graph(1)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="capture_error_mode must be one of 'default'"):
        acc.Graph(capture_error_mode="strict")


def test_graph_misuse_is_a_clear_error(gpu: GraphDriver) -> None:
    graph = acc.Graph()
    with pytest.raises(RuntimeError, match="nothing has been captured"):
        graph.replay()
    with pytest.raises(RuntimeError, match="capture_end\\(\\) without capture_begin\\(\\)"):
        graph.capture_end()
    with pytest.raises(RuntimeError, match="there is no captured graph to instantiate"):
        graph.instantiate()
    with pytest.raises(RuntimeError, match="cannot be captured on the default stream of cuda:0"):
        graph.capture_begin()
    with acc.Stream():
        graph.capture_begin()
        with pytest.raises(RuntimeError, match="already capturing"):
            graph.capture_begin()
        with pytest.raises(RuntimeError, match="cannot replay a graph while it is capturing"):
            graph.replay()
        with pytest.raises(RuntimeError, match="cannot reset a graph while it is capturing"):
            graph.reset()
        graph.capture_end()
        with pytest.raises(RuntimeError, match="already holds a capture; call reset"):
            graph.capture_begin()


def test_a_driver_refusal_undoes_the_pool_routing(gpu: GraphDriver) -> None:
    graph = acc.Graph()
    gpu.fail["cuStreamBeginCapture"] = [INVALID_VALUE]
    with acc.Stream(), pytest.raises(CUDAError, match="cuStreamBeginCapture failed"):
        graph.capture_begin()
    assert not graph.is_capturing
    buf = acc.empty(4096)
    assert graph.mem_pool.memory_allocated() == 0 and acc.memory_allocated() == 4096
    del buf


def test_an_invalidated_capture_leaves_nothing(gpu: GraphDriver) -> None:
    graph = acc.Graph()
    gpu.fail["cuStreamEndCapture"] = [CAPTURE_INVALIDATED]
    with acc.Stream():
        graph.capture_begin()
        with pytest.raises(CUDAError, match="cuStreamEndCapture failed on cuda:0: CUresult 901"):
            graph.capture_end()
        gpu.capturing.clear()  # the driver ends an invalidated capture; the fake did not
    assert not graph.is_capturing and repr(graph).startswith("Graph(empty")
    outside = acc.empty(4096)
    assert graph.mem_pool.memory_allocated() == 0
    del outside


def test_an_error_in_the_capture_block_wins(gpu: GraphDriver) -> None:
    graph = acc.Graph()
    gpu.fail["cuStreamEndCapture"] = [CAPTURE_INVALIDATED]
    with pytest.raises(KeyError, match="boom"), acc.Stream(), graph:
        raise KeyError("boom")
    assert not graph.is_capturing
    assert graph.mem_pool.memory_allocated() == 0


def test_the_readme_graph_example(gpu: GraphDriver, capsys: pytest.CaptureFixture[str]) -> None:
    from test_readme import examples, run_example

    said = run_example(examples()[2])
    assert capsys.readouterr().out.splitlines() == said == ["1048576 2097152"]
    assert len(gpu.launches) == 3 and len({executable for executable, _ in gpu.launches}) == 1
