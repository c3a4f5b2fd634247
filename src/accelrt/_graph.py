"""``Graph``: capture the work submitted to a stream once, replay it many times.

Mirrors ``torch.accelerator.Graph`` (PyTorch 2.13). Capture needs the backend's optional
graph-capture capability (``accelrt.backends.GraphCapture``): the ``cuda`` backend has
it (``cuStreamBeginCapture`` ... ``cuGraphLaunch``); ``sim`` and ``opencl`` do not, and
``Graph()`` raises a ``RuntimeError`` naming the backend there.

Memory allocated while capturing comes from the graph's private ``MemPool``: nothing outside
the pool reuses those blocks, so the addresses the captured work uses stay valid for every
replay while the graph lives.
"""

from __future__ import annotations

import contextlib
import os
import warnings
import weakref
from types import TracebackType

from . import _runtime
from ._readonly import read_only
from ._stream import CAPTURING, Stream, current_stream
from .backends._base import Backend, GraphCapture, GraphHandle
from .memory._atomic import finaliser
from .memory.device._block import PoolId
from .memory.device._core import CachingAllocator
from .memory.device._pool import MemPool
from .memory.device._registry import get_allocator

__all__ = ["Graph", "is_graph_available"]

CAPTURE_ERROR_MODES = ("default", "global", "thread_local", "relaxed")
"""The ``capture_error_mode`` values; ``"default"`` is ``"global"`` on CUDA (as PyTorch's)."""

_pools: weakref.WeakValueDictionary[PoolId, MemPool] = weakref.WeakValueDictionary()
"""The pools of live graphs by id, so that ``Graph(pool=other.pool())`` shares one."""


def is_graph_available() -> bool:
    """Return True if the accelerator can capture and replay graphs (:class:`Graph`).

    Returns
    -------
    bool
        True when the accelerator's backend has the graph-capture capability and at least
        one device (``cuda``); False for ``sim``, ``opencl`` and ``xpu``, and when there is
        no accelerator. ``Graph()`` raises ``RuntimeError`` exactly when this is False.

    Notes
    -----
    Never raises and creates no driver context, as ``is_available``. A backend capability
    query: PyTorch 2.14's ``torch.accelerator`` has none (``torch.accelerator.Graph`` fails on
    a backend without graphs); docs/conformance.md.
    """
    try:
        backend = _runtime.accelerator()
    except ValueError:  # ACCELRT_BACKEND names no backend: there is no accelerator
        return False
    return isinstance(backend, GraphCapture) and _runtime.device_count() > 0


class Graph:
    """A captured sequence of device work that can be replayed with one launch.

    Parameters
    ----------
    keep_graph : bool
        False (default): ``capture_end`` instantiates the executable graph and drops the
        captured one. True: the captured graph is kept, and instantiated by ``instantiate``
        or on the first ``replay``.
    pool : MemPool, tuple of (int, int) or None
        The private memory pool that allocations made during capture come from: a
        ``MemPool``, another live graph's ``pool()`` id (the graphs then share memory), or
        None for a new pool of this graph's own.
    capture_error_mode : {"default", "global", "thread_local", "relaxed"}
        How strictly the driver refuses unsafe calls during capture (CUDA's
        ``cudaStreamCaptureMode``; "default" is "global").

    Raises
    ------
    RuntimeError
        If there is no accelerator, or its backend cannot capture graphs (``sim``,
        ``opencl``; the message names it).
    TypeError
        If ``keep_graph`` is not a bool or ``pool`` not a MemPool, a pool id or None.
    ValueError
        If ``capture_error_mode`` is not one of the four, or ``pool`` is an id that is not a
        live graph's pool.

    Notes
    -----
    Capture runs on the current stream, which must not be the device's default stream
    (CUDA cannot capture the legacy default stream): use ``with acc.Stream(), graph:``.
    ``capture_begin`` and ``capture_end`` must be called on the same thread. Buffers
    allocated during capture must stay alive (or be freed back to the pool, which only this
    graph's captures use) for as long as the graph is replayed. Not thread-safe. Mirrors
    ``torch.accelerator.Graph``.

    Examples
    --------
    >>> import accelrt as acc                                     # doctest: +SKIP
    >>> acc.backends.use("cuda")                                  # doctest: +SKIP
    >>> graph = acc.Graph()                                       # doctest: +SKIP
    >>> with acc.Stream(), graph:                                 # doctest: +SKIP
    ...     out = acc.empty(1 << 20)
    ...     acc.copy_(out, src)
    >>> for _ in range(100):                                      # doctest: +SKIP
    ...     graph.replay()
    """

    __slots__ = (
        "_allocator",
        "_backend",
        "_capture",
        "_capture_stream",
        "_capturing",
        "_debug",
        "_exec",
        "_graph",
        "_holds_pool",
        "_index",
        "_mem_pool",
        "capture_error_mode",
        "keep_graph",
    )

    def __init__(
        self,
        keep_graph: bool = False,
        *,
        pool: MemPool | PoolId | None = None,
        capture_error_mode: str = "default",
    ) -> None:
        self._graph: GraphHandle | None = None
        self._exec: GraphHandle | None = None
        self._capturing = False
        self._holds_pool = False  # a capture counts in the pool's use_count until reset
        self._debug = False  # enable_debug_mode: keep the captured graph for debug_dump
        if not isinstance(keep_graph, bool):
            raise TypeError(f"keep_graph must be a bool, got {keep_graph!r}")
        if capture_error_mode not in CAPTURE_ERROR_MODES:
            raise ValueError(
                f"capture_error_mode must be one of {', '.join(map(repr, CAPTURE_ERROR_MODES))}"
                f", got {capture_error_mode!r}"
            )
        if pool is None:
            mem_pool = MemPool()
        elif isinstance(pool, MemPool):
            mem_pool = pool
        elif isinstance(pool, tuple):
            found = _pools.get(pool)
            if found is None:
                raise ValueError(
                    f"pool {pool!r} is not the pool of a live accelrt.Graph; pass "
                    "another graph's pool() or an accelrt.memory.MemPool"
                )
            mem_pool = found
        else:
            raise TypeError(
                f"pool must be an accelrt.memory.MemPool, another graph's pool() or None, "
                f"got {pool!r}"
            )
        backend = _runtime.require_accelerator()
        if not isinstance(backend, GraphCapture):
            raise RuntimeError(
                f"the {backend.name!r} backend cannot capture graphs (accelrt.Graph needs a "
                "backend with graph capture, such as 'cuda')"
            )
        self._backend: Backend = backend
        self._capture: GraphCapture = backend
        self._index: int | None = None
        self._capture_stream: Stream | None = None
        self._allocator: CachingAllocator | None = None
        self._mem_pool = mem_pool
        _pools[mem_pool.id] = mem_pool
        self.keep_graph = keep_graph
        self.capture_error_mode = capture_error_mode

    mem_pool: read_only[MemPool] = read_only(
        "_mem_pool", "The private ``MemPool`` that allocations made during capture come from."
    )
    is_capturing: read_only[bool] = read_only(
        "_capturing", "True between ``capture_begin`` and ``capture_end``."
    )

    def pool(self) -> PoolId:
        """Return the id of the graph's memory pool; ``Graph(pool=id)`` shares it.

        Mirrors ``torch.accelerator.Graph.pool``.
        """
        return self._mem_pool.id

    def capture_begin(self) -> None:
        """Begin capturing the work submitted to the current stream.

        From now until ``capture_end`` the stream's work is recorded, not run, and this
        thread's allocations on the stream's device come from the graph's pool.

        Raises
        ------
        RuntimeError
            If the graph is capturing or holds a capture (call ``reset`` first), the
            accelerator changed since the graph was made, or the current stream is the
            device's default stream.
        ValueError
            If the pool is bound to another device.
        AcceleratorError
            If the driver refuses to capture (``CUDAError``).
        """
        if self._capturing:
            raise RuntimeError("the graph is already capturing; call capture_end() first")
        if self._graph is not None or self._exec is not None:
            raise RuntimeError("the graph already holds a capture; call reset() to recapture")
        if _runtime.require_accelerator() is not self._backend:
            raise RuntimeError(
                f"the graph was made for the {self._backend.name!r} backend, which is no "
                "longer the accelerator"
            )
        stream = current_stream()
        if stream.handle == 0:
            raise RuntimeError(
                f"graphs cannot be captured on the default stream of {stream.device}; capture "
                "on a stream of your own: with acc.Stream(), graph: ..."
            )
        index = stream.device_index
        allocator = get_allocator(self._backend, index)
        self._mem_pool._bind(allocator)
        mode = "global" if self.capture_error_mode == "default" else self.capture_error_mode
        allocator.begin_allocate_to_pool(self._mem_pool.id)
        try:
            self._capture.graph_capture_begin(index, stream.handle, mode)
        except BaseException:
            allocator.end_allocate_to_pool(self._mem_pool.id)
            raise
        self._capturing = True
        self._index = index
        self._capture_stream = stream
        self._allocator = allocator
        CAPTURING.add(stream)
        if not self._holds_pool:
            self._holds_pool = True
            self._mem_pool._users += 1

    def capture_end(self) -> None:
        """End the capture begun by ``capture_begin`` (on the stream it began on).

        With ``keep_graph=False`` the executable graph is instantiated and the captured graph
        released; with True it is kept for ``instantiate``.

        Raises
        ------
        RuntimeError
            If the graph is not capturing.
        AcceleratorError
            If the driver fails to end the capture (e.g. ``CUDA_ERROR_STREAM_CAPTURE_
            INVALIDATED``) or to instantiate; the graph then holds nothing.
        """
        if not self._capturing:
            raise RuntimeError("capture_end() without capture_begin()")
        stream, allocator = self._capture_stream, self._allocator
        if stream is None or allocator is None:  # set together with _capturing
            raise RuntimeError("capture_end() without capture_begin()")
        self._capturing = False
        try:
            self._graph = self._capture.graph_capture_end(stream.device_index, stream.handle)
        finally:
            CAPTURING.discard(stream)
            allocator.end_allocate_to_pool(self._mem_pool.id)
        if not self.keep_graph:
            try:
                self.instantiate()
            finally:
                if not self._debug:  # debug mode keeps it for debug_dump
                    graph, self._graph = self._graph, None
                    self._capture.graph_destroy(self._device_index(), graph)

    def enable_debug_mode(self) -> None:
        """Keep the captured graph after ``capture_end`` so that :meth:`debug_dump` can write
        it. Call it before capturing.

        Mirrors ``torch.accelerator.Graph.enable_debug_mode``.
        """
        self._debug = True

    def debug_dump(self, path: str | os.PathLike[str]) -> None:
        """Write the captured graph to ``path`` in the driver's debug format (Graphviz DOT
        on CUDA, ``cuGraphDebugDotPrint`` with its verbose flags).

        Does nothing but warn (``RuntimeWarning``) unless :meth:`enable_debug_mode` was called
        before the capture, as PyTorch does.

        Raises
        ------
        RuntimeError
            In debug mode, if nothing has been captured (or the graph was reset).
        AcceleratorError
            If the driver cannot write the file.

        Mirrors ``torch.accelerator.Graph.debug_dump``.
        """
        if not self._debug:
            warnings.warn(
                "graph debug mode is not enabled: call graph.enable_debug_mode() before "
                "capturing, then debug_dump()",
                RuntimeWarning,
                stacklevel=2,
            )
            return
        if self._graph is None:
            raise RuntimeError("there is no captured graph to dump: capture the graph first")
        self._capture.graph_debug_dump(self._device_index(), self._graph, os.fspath(path))

    def _device_index(self) -> int:
        return self._index if self._index is not None else 0

    def instantiate(self) -> None:
        """Make the executable graph from the captured one (again, if made before).

        Raises
        ------
        RuntimeError
            If there is no captured graph (nothing captured, or ``keep_graph=False`` after
            ``capture_end``, which instantiated it already).
        AcceleratorError
            If the driver fails.
        """
        if self._graph is None:
            raise RuntimeError(
                "there is no captured graph to instantiate (capture first; with "
                "keep_graph=False capture_end() instantiates it)"
            )
        index = self._device_index()
        executable = self._capture.graph_instantiate(index, self._graph)
        old, self._exec = self._exec, executable
        if old is not None:
            self._capture.graph_exec_destroy(index, old)

    def replay(self) -> None:
        """Submit the captured work to the device's current stream (no host blocking).

        Raises
        ------
        RuntimeError
            If nothing has been captured, or the graph is capturing.
        AcceleratorError
            If the driver fails.
        """
        if self._capturing:
            raise RuntimeError("cannot replay a graph while it is capturing")
        if self._exec is None:
            if self._graph is None:
                raise RuntimeError("nothing has been captured: capture the graph before replay()")
            self.instantiate()
        index = self._device_index()
        stream = current_stream(self._capture_stream.device if self._capture_stream else None)
        self._capture.graph_launch(index, self._exec, stream.handle)

    def reset(self) -> None:
        """Release the captured and executable graphs; the graph can then be recaptured.

        The memory pool stays (buffers allocated during capture keep their memory).

        Raises
        ------
        RuntimeError
            If the graph is capturing.
        AcceleratorError
            If the driver fails to destroy a graph (it is forgotten anyway).
        """
        if self._capturing:
            raise RuntimeError("cannot reset a graph while it is capturing; call capture_end()")
        if self._holds_pool:
            self._holds_pool = False
            self._mem_pool._users -= 1
        executable, self._exec = self._exec, None
        graph, self._graph = self._graph, None
        if executable is not None:
            self._capture.graph_exec_destroy(self._device_index(), executable)
        if graph is not None:
            self._capture.graph_destroy(self._device_index(), graph)

    def __enter__(self) -> Graph:
        """Synchronize the device, empty the cache and ``capture_begin`` (as PyTorch)."""
        from ._accelerator import synchronize
        from .memory import empty_cache

        synchronize()
        empty_cache()
        self.capture_begin()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        """``capture_end``; if the block raised, its exception wins over one from ending."""
        if exc_type is None:
            self.capture_end()
            return
        with contextlib.suppress(Exception):  # the block's exception says more
            self.capture_end()

    @finaliser  # a Ctrl-C inside it arrives after it (memory/_atomic.py)
    def __del__(self) -> None:
        try:
            if not self._capturing:
                self.reset()
        except Exception:  # __del__ never raises
            pass

    def __repr__(self) -> str:
        state = (
            "capturing"
            if self._capturing
            else "instantiated"
            if self._exec is not None
            else "captured"
            if self._graph is not None
            else "empty"
        )
        return f"Graph({state}, backend={self._backend.name!r}, pool={self._mem_pool.id})"
