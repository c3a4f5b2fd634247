"""The ``xpu`` backend's copies, waits and event queries (``USMStreamOps`` and
``query_queue_event``, accelrt/_stream_ops.py): what a copy, a ``synchronize`` and a query do, and
the same from the compiled build and from the Python source of that one file.

``_XPUStream`` derives from ``USMStreamOps``: Cython's build of _stream_ops.py where it is
installed, else the module run from its source. Here both run one script over recording fakes
(the view of the last device memory copied, the views cache hit or missed, host memory on either
side, a rescan by count, a driver error, a wait that fails, a destroyed stream), and must leave
the same record: every call they made, what they keep alive, and the view they remember.
"""

from __future__ import annotations

from collections import deque
from typing import Any

import pytest
from stream_ops_builds import stream_ops_builds

MODULES = stream_ops_builds("usm_stream_ops_from_source")
BUILDS = {build: (module.USMStreamOps, module.NO_VIEW) for build, module in MODULES.items()}


class _Queue:
    """A ``dpctl.SyclQueue`` stand-in: records its calls in the stream's ``calls``."""

    def __init__(self, calls: list[tuple[Any, ...]]) -> None:
        self.calls = calls
        self.fail_next = ""

    def _maybe_fail(self) -> None:
        if self.fail_next:
            message, self.fail_next = self.fail_next, ""
            raise RuntimeError(message)

    def memcpy_async(self, dest: object, src: object, count: int) -> str:
        self.calls.append(("memcpy_async", _shown(dest), _shown(src), count))
        self._maybe_fail()
        return f"event {len(self.calls)}"

    def wait(self) -> None:
        self.calls.append(("wait",))
        self._maybe_fail()


def _shown(obj: object) -> object:
    return f"host {bytes(obj)[:2]!r}" if isinstance(obj, memoryview) else obj


def _recorder(base: type, no_view: tuple[int, int, object]) -> Any:
    """A stream over ``base`` whose queue and hooks record each call in ``calls``."""

    class Recorder(base):  # type: ignore[misc,valid-type]
        def __init__(self) -> None:
            self.calls: list[tuple[Any, ...]] = []
            self.queue = _Queue(self.calls)
            self.last = None
            self.keep = deque()
            self.views = {(0x1000, 64): "view 0x1000"}
            self.last_view = no_view
            self.scan_at = 3

        def device_view(self, address: int, nbytes: int) -> str:
            self.calls.append(("device_view", address, nbytes))
            return f"view {address:#x}+{nbytes}"

        def rescan(self, keep: deque[tuple[Any, Any]]) -> None:
            self.calls.append(("rescan", len(keep)))
            keep.popleft()  # the oldest copy finished

        def missing(self) -> None:
            raise ValueError("no such stream")

        def failed(self, call: str, exc: Exception) -> None:
            self.calls.append(("failed", call, str(exc)))

    return Recorder()


def _run(base: type, no_view: tuple[int, int, object]) -> list[Any]:
    """The script; returns what the stream did and kept, step by step."""
    stream = _recorder(base, no_view)
    record: list[Any] = []

    def step(call: str, *args: Any) -> None:
        try:
            getattr(stream, call)(*args)
            outcome: Any = "ok"
        except Exception as exc:
            outcome = (type(exc).__name__, str(exc))
        kept = [(event, bytes(host)) for event, host in stream.keep]
        record.append((outcome, stream.calls[:], kept, stream.last, stream.last_view))
        stream.calls.clear()

    step("memcpy_async", 0x1000, memoryview(b"ab" * 32), 64)  # views hit, host source
    step("memcpy_async", 0x1000, memoryview(b"cd" * 32), 64)  # last_view hit
    step("memcpy_async", memoryview(bytearray(64)), 0x1000, 64)  # host destination
    step("memcpy_async", 0x2000, 0x1000, 64)  # device to device: a miss, then last_view
    step("memcpy_async", 0x1000, memoryview(b"ef" * 50), 100)  # 3 held: a rescan by count
    step("synchronize")  # forgets all it held
    stream.queue.fail_next = "CL_OUT_OF_RESOURCES"
    step("memcpy_async", 0x1000, memoryview(b"gh" * 32), 64)  # a driver error: nothing kept
    step("memcpy_async", 0x1000, memoryview(b"ij" * 32), 64)
    stream.queue.fail_next = "device lost"
    step("synchronize")  # a failed wait keeps everything, and the last command
    stream.queue = None
    step("memcpy_async", 0x1000, memoryview(bytearray(64)), 64)  # a destroyed stream
    step("synchronize")
    return record


def test_the_build_does_what_the_source_does() -> None:
    if len(BUILDS) < 2:
        pytest.skip("the compiled streams module is not in use")
    assert _run(*BUILDS["compiled"]) == _run(*BUILDS["source"])


@pytest.mark.parametrize("build", list(BUILDS))
def test_what_a_copy_and_a_wait_do(build: str) -> None:
    record = _run(*BUILDS[build])
    outcome, calls, kept, last, last_view = record[0]
    assert calls == [("memcpy_async", "view 0x1000", "host b'ab'", 64)]
    assert kept == [("event 1", b"ab" * 32)] and last == "event 1"
    assert last_view == (0x1000, 64, "view 0x1000")
    assert record[1][1] == [("memcpy_async", "view 0x1000", "host b'cd'", 64)]
    assert record[2][1] == [("memcpy_async", "host b'\\x00\\x00'", "view 0x1000", 64)]
    assert record[3][1] == [
        ("device_view", 0x2000, 64),
        ("memcpy_async", "view 0x2000+64", "view 0x1000", 64),  # the source: from views
    ]
    assert record[3][4] == (0x1000, 64, "view 0x1000")  # the last looked up
    assert len(record[3][2]) == 3  # device to device keeps nothing
    calls = record[4][1]  # after the enqueue, 3 held: the count reached scan_at
    assert calls == [
        ("device_view", 0x1000, 100),  # another size: not the last view
        ("memcpy_async", "view 0x1000+100", "host b'ef'", 100),
        ("rescan", 3),
    ]
    assert len(record[4][2]) == 3  # one forgotten, one added
    outcome, calls, kept, last, _ = record[5]
    assert calls == [("wait",)] and kept == [] and last is None
    outcome, calls, kept, last, _ = record[6]
    assert outcome == ("RuntimeError", "CL_OUT_OF_RESOURCES")
    assert calls[-1] == ("failed", "memcpy_async", "CL_OUT_OF_RESOURCES")
    assert kept == [] and last is None  # nothing added
    outcome, calls, kept, last, _ = record[8]
    assert outcome == ("RuntimeError", "device lost")
    assert calls == [("wait",), ("failed", "stream_synchronize", "device lost")]
    assert kept == [(record[7][3], b"ij" * 32)] and last == record[7][3]  # kept: may still run
    assert record[9][0] == ("ValueError", "no such stream")
    assert record[10][0] == ("ValueError", "no such stream")


@pytest.mark.parametrize("build", list(BUILDS))
def test_a_wait_keeps_what_another_thread_enqueued_meanwhile(build: str) -> None:
    stream = _recorder(*BUILDS[build])
    stream.keep.extend([("event 1", "host 1")])

    class Queue:
        def wait(self) -> None:
            stream.keep.append(("event 2", "host 2"))

    stream.queue = Queue()
    stream.synchronize()
    assert list(stream.keep) == [("event 2", "host 2")]


class _Event:
    """A ``dpctl.SyclEvent`` stand-in: its ``execution_status``, or the error reading it."""

    def __init__(self, status: str) -> None:
        self.status = status

    @property
    def execution_status(self) -> str:
        if self.status == "lost":
            raise RuntimeError("device lost")
        return self.status


@pytest.mark.parametrize("build", list(BUILDS))
def test_query_asks_the_last_command(build: str) -> None:
    stream = _recorder(*BUILDS[build])
    stream.complete = "complete"
    assert stream.query() is True  # nothing submitted
    stream.last = _Event("running")
    assert stream.query() is False
    stream.last = _Event("complete")
    assert stream.query() is True
    stream.last = _Event("lost")
    with pytest.raises(RuntimeError, match="device lost"):
        stream.query()
    assert stream.calls == [("failed", "stream_query", "device lost")]


@pytest.mark.parametrize("build", list(BUILDS))
def test_an_event_query_asks_its_marker(build: str) -> None:
    module = MODULES[build]
    stream = _recorder(*BUILDS[build])
    stream.complete = "complete"

    class Handle(module.QueueEventCore):  # an XPUEvent stand-in: its marker and its stream
        __slots__ = ()

        def __init__(self, marker: _Event | None) -> None:
            self.marker = marker
            self.stream = stream if marker is not None else None

    with pytest.raises(TypeError, match=r"needs an opencl or xpu event handle, got None"):
        module.query_queue_event(None)
    assert module.query_queue_event(Handle(None)) is True  # never recorded
    assert module.query_queue_event(Handle(_Event("running"))) is False
    assert module.query_queue_event(Handle(_Event("complete"))) is True
    with pytest.raises(RuntimeError, match="device lost"):
        module.query_queue_event(Handle(_Event("lost")))
    assert stream.calls == [("failed", "event_query", "device lost")]
