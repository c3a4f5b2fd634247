"""CUDA graph capture: ``cuStreamBeginCapture``/``cuStreamEndCapture``, instantiation,
launch, destruction and the DOT dump (``accelrt.Graph``)."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from ._devices import _Devices

if TYPE_CHECKING:
    from cuda.bindings.driver import CUgraph, CUgraphExec


class _Graphs(_Devices):
    """Graph capture of the ``cuda`` backend (``graph_*``)."""

    def graph_capture_begin(self, index: int, stream: int, mode: str) -> None:
        """``cuStreamBeginCapture(stream, CU_STREAM_CAPTURE_MODE_<MODE>)``.

        Raises
        ------
        ValueError
            If ``mode`` is not ``"global"``, ``"thread_local"`` or ``"relaxed"``.
        CUDAError
            If the driver refuses (``CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED`` on the legacy
            default stream, for example).
        """
        if mode not in ("global", "thread_local", "relaxed"):
            raise ValueError(
                f"capture mode must be 'global', 'thread_local' or 'relaxed', got {mode!r}"
            )
        state = self._dev(index)
        value = getattr(self.driver.CUstreamCaptureMode, f"CU_STREAM_CAPTURE_MODE_{mode.upper()}")
        self._call("cuStreamBeginCapture", index, self._stream(state, stream), value)
        with self._lock:
            self._captures += 1

    def graph_capture_end(self, index: int, stream: int) -> CUgraph:
        """``cuStreamEndCapture``: the captured ``CUgraph``.

        Raises ``CUDAError`` (``CUDA_ERROR_STREAM_CAPTURE_INVALIDATED`` when an illegal call
        broke the capture, for example).
        """
        state = self._dev(index)
        try:
            return self._call("cuStreamEndCapture", index, self._stream(state, stream))
        finally:  # an invalidated capture has ended too
            with self._lock:
                self._captures -= 1

    def graph_instantiate(self, index: int, graph: CUgraph) -> CUgraphExec:
        """``cuGraphInstantiate(graph, 0)``: the ``CUgraphExec``. Raises ``CUDAError``."""
        return self._call("cuGraphInstantiate", index, graph, 0)

    def graph_launch(self, index: int, executable: CUgraphExec, stream: int) -> None:
        """``cuGraphLaunch`` of a ``CUgraphExec`` on ``stream``. Raises ``CUDAError``."""
        state = self._dev(index)
        self._call("cuGraphLaunch", index, executable, self._stream(state, stream))

    def graph_destroy(self, index: int, graph: CUgraph) -> None:
        """``cuGraphDestroy``. Raises ``CUDAError``."""
        self._call("cuGraphDestroy", index, graph)

    def graph_exec_destroy(self, index: int, executable: CUgraphExec) -> None:
        """``cuGraphExecDestroy``. Raises ``CUDAError``."""
        self._call("cuGraphExecDestroy", index, executable)

    def graph_debug_dump(self, index: int, graph: CUgraph, path: str) -> None:
        """``cuGraphDebugDotPrint(graph, path, CU_GRAPH_DEBUG_DOT_FLAGS_VERBOSE)``: the graph
        as Graphviz DOT. Raises ``CUDAError``."""
        flags = int(self.driver.CUgraphDebugDot_flags.CU_GRAPH_DEBUG_DOT_FLAGS_VERBOSE)
        self._call("cuGraphDebugDotPrint", index, graph, os.fsencode(path), flags)
