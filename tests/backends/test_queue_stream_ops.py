"""``QueueStreamOps.synchronize``: what it forgets, what it keeps (on the core in use; CI
runs it on the build and on the source).

The base of an in-order queue's per-stream object (accelrt/_stream_ops.py) forgets, after
``finish()``, every entry of ``keep`` that was there when it called ``finish()``, and nothing
appended while it waited: another thread's copy, enqueued after the wait began, may still be
running. A driver error keeps everything.
"""

from __future__ import annotations

from collections import deque
from typing import Any

import pytest

from accelrt.backends import _base


class _Ops(_base.QueueStreamOps):  # type: ignore[misc,valid-type]
    """A queue stream over a fake queue; ``missing`` and ``failed`` record their calls."""

    def __init__(self, queue: Any) -> None:
        self.queue = queue
        self.last = "last command"
        self.keep = deque()
        self.failures: list[str] = []

    def missing(self) -> None:
        raise ValueError("no such stream")

    def failed(self, call: str, exc: Exception) -> None:
        self.failures.append(f"{call}: {exc}")


class _Queue:
    """``finish()`` runs ``during`` (what another thread does while the caller waits)."""

    def __init__(self, during: Any = None) -> None:
        self.during = during
        self.finished = 0

    def finish(self) -> None:
        self.finished += 1
        if self.during is not None:
            self.during()


def test_forgets_what_was_enqueued_before_finish() -> None:
    ops = _Ops(_Queue())
    ops.keep.extend([("event 1", "host 1"), ("event 2", "host 2")])
    ops.synchronize()
    assert list(ops.keep) == []
    assert ops.last is None
    assert ops.queue.finished == 1


def test_keeps_what_another_thread_enqueued_while_it_waited() -> None:
    ops = _Ops(None)
    ops.queue = _Queue(lambda: ops.keep.append(("event 3", "host 3")))
    ops.keep.extend([("event 1", "host 1"), ("event 2", "host 2")])
    ops.synchronize()
    assert list(ops.keep) == [("event 3", "host 3")]


def test_a_driver_error_keeps_everything_in_order() -> None:
    def fail() -> None:
        ops.keep.append(("event 3", "host 3"))
        raise RuntimeError("device lost")

    ops = _Ops(None)
    ops.queue = _Queue(fail)
    ops.keep.extend([("event 1", "host 1"), ("event 2", "host 2")])
    with pytest.raises(RuntimeError, match="device lost"):
        ops.synchronize()
    assert [event for event, _ in ops.keep] == ["event 1", "event 2", "event 3"]
    assert ops.last == "last command"  # unknown: the work may not have finished
    assert ops.failures == ["stream_synchronize: device lost"]


def test_a_destroyed_stream_raises_its_error() -> None:
    ops = _Ops(None)
    with pytest.raises(ValueError, match="no such stream"):
        ops.synchronize()


def test_an_idle_stream_keeps_its_empty_deque() -> None:
    ops = _Ops(_Queue())
    keep = ops.keep
    ops.synchronize()
    assert ops.keep is keep  # nothing to forget: no new deque
