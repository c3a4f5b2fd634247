"""Events on every backend: lifecycle, errors, timing around real work.

Model: PyTorch's test/test_accelerator.py and torch_openreg's event tests.
"""

from __future__ import annotations

import numpy as np
import pytest

import accelrt as acc


def test_unrecorded_event(device: str) -> None:
    e = acc.Event()
    assert e.query() is True and e.device is None and e.enable_timing is False
    e.synchronize()  # returns at once
    assert repr(e) == "Event(device=None, enable_timing=False)"


def test_record_sets_the_device(device: str) -> None:
    e = acc.Event()
    e.record()
    assert e.device == acc.Device(device, 0)
    e.synchronize()
    assert e.query()


def test_event_id_is_zero_until_recorded_then_stable_and_distinct(device: str) -> None:
    a, b = acc.Event(), acc.Event()
    assert a.event_id == 0  # no native event before the first record (torch.Event's too)
    a.record()
    b.record()
    first = a.event_id
    assert first != 0 and first != b.event_id
    a.record()
    assert a.event_id == first  # recording again keeps the event


def test_elapsed_time_errors(device: str) -> None:
    timed, untimed = acc.Event(enable_timing=True), acc.Event()
    with pytest.raises(
        ValueError, match=r"^Both events must be created with argument 'enable_timing=True'\.$"
    ):
        timed.elapsed_time(untimed)
    with pytest.raises(
        ValueError, match=r"^Both events must be recorded before calculating elapsed time\.$"
    ):
        timed.elapsed_time(acc.Event(enable_timing=True))
    timed.record()
    with pytest.raises(ValueError, match="Both events must be recorded"):
        timed.elapsed_time(acc.Event(enable_timing=True))


def test_elapsed_time_is_positive_around_real_work(device: str) -> None:
    nbytes = 32 << 20
    host = np.full(nbytes, 7, np.uint8)
    stream = acc.Stream()
    with acc.empty(nbytes, stream=stream) as a, acc.empty(nbytes, stream=stream) as b:
        start, end = acc.Event(enable_timing=True), acc.Event(enable_timing=True)
        start.record(stream)
        acc.copy_(a, host, stream=stream)
        acc.copy_(b, a, stream=stream)
        end.record(stream)
        elapsed_ms = start.elapsed_time(end)  # waits for ``end``
        assert end.query()
        assert 0.0 < elapsed_ms < 60_000.0
        out = np.zeros(nbytes, np.uint8)
        acc.copy_(out, b, stream=stream)
        stream.synchronize()
        assert (out == 7).all()  # the timed work really ran


def test_recording_on_another_devices_stream_raises(two_devices: str) -> None:
    e = acc.Event()
    e.record(acc.Stream(0))
    with pytest.raises(
        ValueError,
        match=rf"event was recorded on {two_devices}:0 and cannot be recorded on a "
        rf"stream of {two_devices}:1; create a new Event",
    ):
        e.record(acc.Stream(1))
    assert e.device == acc.Device(two_devices, 0)
