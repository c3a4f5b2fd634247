"""OpenCL's ``memcpy_async`` and queries (``SVMStreamOps`` and ``query_queue_event``,
accelrt/_stream_ops.py): what a copy and a query do, and the same from the compiled build and
from the Python source of that one file.

``_CLStream`` derives from ``SVMStreamOps``: Cython's build of _stream_ops.py where it is
installed, else the module run from its source. Here both run one script of copies over
recording fakes (device views cached or not, host memory writable or read-only, rescans by
count and by bytes, a driver error, a destroyed stream), and must leave the same record: every
call they made, what they keep alive, and their counters.
"""

from __future__ import annotations

from collections import deque
from typing import Any

import pytest
from stream_ops_builds import stream_ops_builds

MODULES = stream_ops_builds("stream_ops_from_source")
BUILDS = {build: module.SVMStreamOps for build, module in MODULES.items()}


def _recorder(base: type) -> Any:
    """A stream over ``base`` whose driver and hooks record each call in ``calls``."""

    class Recorder(base):  # type: ignore[misc,valid-type]
        def __init__(self) -> None:
            self.calls: list[tuple[Any, ...]] = []
            self.queue = "queue"
            self.last = None
            self.keep = deque()
            self.views = {(0x1000, 64): "view 0x1000"}
            self.wrap_host = lambda view: f"host {bytes(view)[:2]!r}"
            self.svm_memcpy = self.enqueue
            self.scan_at, self.scan_bytes, self.unscanned = 3, 300, 0
            self.fail_next = False

        def enqueue(self, *args: Any) -> str:
            self.calls.append(("svm_memcpy", *args))
            if self.fail_next:
                self.fail_next = False
                raise RuntimeError("CL_OUT_OF_RESOURCES")
            return f"event {len(self.calls)}"

        def device_view(self, address: int, nbytes: int) -> str:
            self.calls.append(("device_view", address, nbytes))
            return f"view {address:#x}"

        def rescan(self, keep: deque[tuple[Any, Any]]) -> None:
            self.calls.append(("rescan", len(keep), self.unscanned))
            keep.popleft()  # the oldest copy finished
            self.scan_at, self.unscanned = len(keep) + 3, 0

        def missing(self) -> None:
            raise ValueError("no such stream")

        def failed(self, call: str, exc: Exception) -> None:
            self.calls.append(("failed", call, str(exc)))

    return Recorder()


def _run(base: type) -> list[Any]:
    """The script; returns what the stream did and kept, step by step."""
    stream = _recorder(base)
    record: list[Any] = []

    def step(*args: Any) -> None:
        try:
            stream.memcpy_async(*args)
            outcome: Any = "ok"
        except Exception as exc:
            outcome = (type(exc).__name__, str(exc))
        kept = [(event, bytes(host), host.readonly) for event, host in stream.keep]
        record.append((outcome, stream.calls[:], kept, stream.last, stream.unscanned))
        stream.calls.clear()

    step(0x1000, memoryview(bytearray(b"ab" * 32)), 64)  # a cached view, host source
    step(0x2000, 0x1000, 64)  # a view made on a miss, device to device
    step(memoryview(bytearray(64)), 0x3000, 64)  # host destination
    step(0x1000, memoryview(b"cd" * 32), 64)  # read-only source: staged
    step(0x1000, memoryview(bytearray(b"ef" * 50)), 100)  # the fourth held: a rescan by count
    step(0x1000, memoryview(bytearray(350)), 350)  # over scan_bytes: a rescan by bytes
    stream.fail_next = True
    step(0x1000, memoryview(bytearray(b"gh" * 32)), 64)  # a driver error: nothing kept
    stream.queue = None
    step(0x1000, memoryview(bytearray(64)), 64)  # a destroyed stream
    return record


def test_the_build_does_what_the_source_does() -> None:
    if len(BUILDS) < 2:
        pytest.skip("the compiled streams module is not in use")
    assert _run(BUILDS["compiled"]) == _run(BUILDS["source"])


@pytest.mark.parametrize("build", list(BUILDS))
def test_what_a_copy_does(build: str) -> None:
    record = _run(BUILDS[build])
    outcome, calls, kept, last, unscanned = record[0]
    assert calls == [("svm_memcpy", "queue", False, "view 0x1000", "host b'ab'", None, 64)]
    assert kept == [("event 1", b"ab" * 32, False)] and last == "event 1" and unscanned == 64
    assert record[1][1] == [
        ("device_view", 0x1000 * 2, 64),
        ("svm_memcpy", "queue", False, "view 0x2000", "view 0x1000", None, 64),
    ]
    assert record[3][2][-1] == ("event 1", b"cd" * 32, False)  # staged: a writable copy
    calls = record[4][1]  # after the enqueue, 3 held: the count reached scan_at
    assert [calls[0], calls[2]] == [("device_view", 0x1000, 100), ("rescan", 3, 292)]
    assert len(record[4][2]) == 3  # one forgotten, one added
    assert record[5][1][2] == ("rescan", 3, 350)  # 350 bytes since the last look, 3 held
    outcome, calls, kept, last, _ = record[6]
    assert outcome == ("RuntimeError", "CL_OUT_OF_RESOURCES")
    assert calls[-1] == ("failed", "memcpy_async", "CL_OUT_OF_RESOURCES")
    assert len(kept) == len(record[5][2])  # nothing added
    assert record[7][0] == ("ValueError", "no such stream")


class _Marker:
    """A ``pyopencl.Event`` stand-in: its ``get_info``, which answers the status code only."""

    def __init__(self, status: int | None) -> None:
        self.status = status  # None: the driver fails

    def get_info(self, param: int) -> int:
        assert param == 0x11D3  # CL_EVENT_COMMAND_EXECUTION_STATUS
        if self.status is None:
            raise RuntimeError("clGetEventInfo failed: CL_INVALID_EVENT")
        return self.status


@pytest.mark.parametrize("build", list(BUILDS))
def test_a_query_asks_the_marker_for_its_status(build: str) -> None:
    module = MODULES[build]
    stream = _recorder(BUILDS[build])
    stream.status_info, stream.complete = 0x11D3, 0  # CL_COMPLETE

    class Handle(module.QueueEventCore):  # an OpenCLEvent stand-in: its marker and stream
        __slots__ = ()

        def __init__(self, marker: _Marker | None) -> None:
            self.marker = marker
            self.stream = stream if marker is not None else None

    assert module.query_queue_event(Handle(None)) is True  # never recorded
    assert module.query_queue_event(Handle(_Marker(1))) is False  # CL_RUNNING
    assert module.query_queue_event(Handle(_Marker(0))) is True
    with pytest.raises(RuntimeError, match="CL_INVALID_EVENT"):
        module.query_queue_event(Handle(_Marker(None)))
    assert stream.calls == [("failed", "event_query", "clGetEventInfo failed: CL_INVALID_EVENT")]
    stream.calls.clear()
    assert stream.query() is True  # nothing enqueued
    stream.last = _Marker(2)  # CL_SUBMITTED
    assert stream.query() is False
    stream.last = _Marker(None)
    with pytest.raises(RuntimeError, match="CL_INVALID_EVENT"):
        stream.query()
    assert stream.calls == [("failed", "stream_query", "clGetEventInfo failed: CL_INVALID_EVENT")]
