"""Streams on every backend: current stream, the context manager, equality, waiting.

Model: PyTorch's test/test_accelerator.py (current_stream, set_stream, the stream context
manager across devices) and torch_openreg's stream tests.
"""

from __future__ import annotations

import threading

import pytest

import accelrt as acc


def test_default_stream_is_current_until_set(device: str) -> None:
    default = acc.current_stream()
    assert default.handle == 0 and default.device == acc.Device(device, 0)
    assert acc.current_stream() == default


def test_creating_a_stream_does_not_make_it_current(device: str) -> None:
    default = acc.current_stream()
    s = acc.Stream(priority=0)
    assert s.handle != 0 and acc.current_stream() == default


def test_equality_ordering_and_repr(device: str) -> None:
    default = acc.current_stream()
    s = acc.Stream()
    assert s == s and s != default
    assert s != "stream" and s != s.handle and (s == None) is False  # noqa: E711
    with pytest.raises(TypeError):
        _ = s < default  # type: ignore[operator]
    with pytest.raises(TypeError):
        _ = s >= default  # type: ignore[operator]
    assert repr(s) == f"Stream(device={device}:0, handle={s.handle:#x})"
    assert len({s, default, acc.Stream.from_handle(s.handle)}) == 2


def test_stream_rebuilt_from_handle_and_device_compares_equal(device: str) -> None:
    s = acc.Stream()
    rebuilt = acc.Stream.from_handle(s.handle, s.device)
    assert rebuilt == s and hash(rebuilt) == hash(s) and rebuilt is not s
    assert acc.Stream.from_handle(0, f"{device}:0") == acc.current_stream()
    with acc.Stream.from_handle(s.handle, s.device_index):
        assert acc.current_stream() == s
    del rebuilt  # does not own the handle: the stream stays usable
    s.synchronize()
    with pytest.raises(TypeError, match="stream handle must be an int, got '1'"):
        acc.Stream.from_handle("1")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="stream handle must be >= 0, got -1"):
        acc.Stream.from_handle(-1)


def test_torch_stream_attributes(device: str) -> None:
    # torch.Stream's stream_id, device_type, native_handle and is_capturing (issue 25)
    s = acc.Stream()
    assert (s.stream_id, s.device_type, s.device_index) == (s.handle, device, 0)
    assert acc.Stream.from_handle(s.stream_id, f"{s.device_type}:{s.device_index}") == s
    assert not s.is_capturing() and not acc.current_stream().is_capturing()
    if device == "opencl":
        queue = acc.backends.get_backend("opencl").queue(0, s.handle)
        assert s.native_handle == queue.int_ptr != s.handle  # the cl_command_queue
    elif device == "xpu":
        queue = acc.backends.get_backend("xpu").queue(0, s.handle)
        assert s.native_handle == queue.addressof_ref() != s.handle  # the DPCTLSyclQueueRef
    else:
        assert s.native_handle == s.handle


def test_context_manager_returns_nests_reenters_and_restores(device: str) -> None:
    default = acc.current_stream()
    s, t = acc.Stream(), acc.Stream()
    with s as entered:
        assert entered is s and acc.current_stream() == s
        with t:
            assert acc.current_stream() == t
            with s:  # re-entrant
                assert acc.current_stream() == s
            assert acc.current_stream() == t
        assert acc.current_stream() == s
    assert acc.current_stream() == default
    with pytest.raises(RuntimeError, match="boom"), s:
        raise RuntimeError("boom")
    assert acc.current_stream() == default


def test_context_manager_switches_device_and_restores_each_devices_stream(
    two_devices: str,
) -> None:
    s0, s1 = acc.Stream(0), acc.Stream(1)
    acc.set_stream(s0)
    with s1:
        assert acc.current_device_index() == 1
        assert acc.current_stream() == s1
        assert acc.current_stream(0) == s0  # the other device's stream is untouched
    assert acc.current_device_index() == 0
    assert acc.current_stream() == s0
    assert acc.current_stream(1).handle == 0  # device 1's previous stream: its default
    with pytest.raises(ValueError, match="boom"), s1:
        raise ValueError("boom")
    assert acc.current_device_index() == 0 and acc.current_stream(1).handle == 0


def test_set_stream_switches_the_current_device(two_devices: str) -> None:
    s1 = acc.Stream(1)
    acc.set_stream(s1)
    assert acc.current_device_index() == 1 and acc.current_stream() == s1
    with pytest.raises(TypeError, match="set_stream\\(\\) takes a Stream, got int"):
        acc.set_stream(1)  # type: ignore[arg-type]


def test_current_stream_is_per_thread(device: str) -> None:
    s = acc.Stream()
    acc.set_stream(s)
    seen: list[int] = []
    thread = threading.Thread(target=lambda: seen.append(acc.current_stream().handle))
    thread.start()
    thread.join()
    assert seen == [0] and acc.current_stream() == s


def test_record_event_wait_stream_and_query(device: str) -> None:
    s, t = acc.Stream(), acc.Stream()
    event = s.record_event()
    assert isinstance(event, acc.Event) and event.device == s.device
    mine = acc.Event()
    assert s.record_event(mine) is mine
    t.wait_stream(s)
    t.wait_event(event)
    t.synchronize()
    assert t.query() and s.query() and event.query()
    with pytest.raises(TypeError, match="wait_event\\(\\) takes an Event, got Stream"):
        s.wait_event(t)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="wait_stream\\(\\) takes a Stream, got Event"):
        s.wait_stream(event)  # type: ignore[arg-type]


def test_bad_priority(device: str) -> None:
    with pytest.raises(TypeError, match="stream priority must be an int, got 'high'"):
        acc.Stream(priority="high")  # type: ignore[arg-type]


def test_every_stream_of_a_handle_shares_its_state(device: str) -> None:
    s = acc.Stream()
    copies = [acc.Stream.from_handle(s.handle), acc.Stream.from_handle(s.handle, s.device)]
    event = acc.Event()
    for other in copies:
        event.record(other)  # recorded through each wrapper, on the one stream
        other.synchronize()
        assert s.query() and other.query() and event.query()
    default = acc.current_stream()
    assert acc.Stream.from_handle(0).query() and default.query()


def test_a_backend_without_stream_ops_is_called_with_the_handle(
    device: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Third-party backends implement only the Protocol: Stream and Event reach its per-handle
    methods with the stream's handle."""
    from accelrt.backends import _base

    backend = _base.get_backend(device)
    for klass in type(backend).__mro__:  # where it is defined: a backend may be composed
        if "stream_ops" in vars(klass):
            monkeypatch.delattr(klass, "stream_ops")
    calls: list[tuple[str, int]] = []

    def spy(name: str, handle_at: int) -> None:
        real = getattr(backend, name)

        def call(*args: object) -> object:
            calls.append((name, args[handle_at]))  # type: ignore[arg-type]
            return real(*args)

        monkeypatch.setattr(backend, name, call)

    spy("stream_query", 1)
    spy("stream_synchronize", 1)
    spy("event_record", 2)
    s = acc.Stream()
    assert isinstance(s._ops, _base.StreamOps)
    acc.Event().record(s)
    s.synchronize()
    assert s.query()
    assert calls == [
        ("event_record", s.handle),
        ("stream_synchronize", s.handle),
        ("stream_query", s.handle),
    ]
