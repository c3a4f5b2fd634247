"""``accelrt.copy_`` on the compiled core gives what the Python reference gives, case by case
and on generated host arrays.

With the compiled core, ``copy_`` is memory/calls/_native.pyx's fast path: it takes the common
copies itself and hands every other call (a HostBuffer, any error) to the Python function in
memory/calls/_calls.py. Each case below runs through both on fresh, identical operands and must end
the same way: the same bytes in the destination, or the same error. On the pure-Python core
both are the reference, and the cases check its results alone.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import accelrt as acc
from accelrt.memory import calls
from accelrt.memory.calls import _calls
from accelrt.memory.device import _core

N = 64  # bytes of every operand


def _pattern(seed: int) -> np.ndarray:
    return (np.arange(N, dtype=np.uint8) * 7 + seed).astype(np.uint8)


def _filled(seed: int) -> acc.Buffer:
    buf = acc.empty(N)
    acc.copy_(buf, _pattern(seed))
    return buf


def _freed() -> acc.Buffer:
    buf = acc.empty(N)
    buf.free()
    return buf


def _read_only() -> np.ndarray:
    host = np.zeros(N, np.uint8)
    host.flags.writeable = False
    return host


def _pinned(seed: int) -> Any:
    host = acc.empty_host(N)
    host.numpy()[:] = _pattern(seed)
    return host


def _side_stream() -> acc.Stream:
    """A new stream that waits for the work already on the current one. A case's source is
    filled on the current stream, and a copy on another stream reads it only once ordered
    after that fill (``copy_`` orders nothing across streams): on ``xpu`` the queues of Intel's
    CPU runtime run at once, and an unordered side-stream copy read the buffer before the
    fill had run (zeros, about one process in three)."""
    side = acc.Stream()
    side.wait_stream(acc.current_stream())
    return side


def _other_device_stream() -> acc.Stream:
    return acc.current_stream(1)


# each case: () -> (dst, src, stream keyword or "default" for none)
CASES: dict[str, Callable[[], tuple[Any, Any, Any]]] = {
    "h2d uint8": lambda: (acc.empty(N), _pattern(1), "default"),
    "h2d float32 cast": lambda: (acc.empty(N), np.arange(N // 4, dtype=np.float32), "default"),
    "h2d 2-d": lambda: (acc.empty(N), _pattern(2).reshape(8, 8), "default"),
    "h2d bytes": lambda: (acc.empty(N), bytes(_pattern(3)), "default"),
    "h2d explicit stream": lambda: (acc.empty(N), _pattern(4), acc.current_stream()),
    "h2d side stream": lambda: (acc.empty(N), _pattern(5), acc.Stream()),
    "d2h": lambda: (np.zeros(N, np.uint8), _filled(6), "default"),
    "d2h bytearray": lambda: (bytearray(N), _filled(7), "default"),
    "d2h float64": lambda: (np.zeros(N // 8), _filled(8), "default"),
    "d2d": lambda: (acc.empty(N), _filled(9), "default"),
    "d2d side stream": lambda: (acc.empty(N), _filled(10), _side_stream()),
    "h2d pinned": lambda: (acc.empty(N), _pinned(11), "default"),
    "d2h pinned": lambda: (acc.empty_host(N), _filled(12), "default"),
    "zero bytes": lambda: (acc.empty(0), b"", "default"),
    # errors
    "no buffer": lambda: (np.zeros(N, np.uint8), _pattern(0), "default"),
    "size differs h2d": lambda: (acc.empty(N), _pattern(0)[:-1], "default"),
    "size differs d2h": lambda: (np.zeros(N + 1, np.uint8), _filled(0), "default"),
    "size differs d2d": lambda: (acc.empty(N), acc.empty(N // 2), "default"),
    "freed dst": lambda: (_freed(), _pattern(0), "default"),
    "freed src": lambda: (np.zeros(N, np.uint8), _freed(), "default"),
    "freed d2d": lambda: (acc.empty(N), _freed(), "default"),
    "not contiguous": lambda: (acc.empty(N), np.zeros(2 * N, np.uint8)[::2], "default"),
    "read-only dst": lambda: (_read_only(), _filled(0), "default"),
    "bytes dst": lambda: (bytes(N), _filled(0), "default"),
    "not a buffer": lambda: (acc.empty(N), [0] * N, "default"),
    "not a stream": lambda: (acc.empty(N), _pattern(0), "stream 0"),
    "stream of another device": lambda: (acc.empty(N), _pattern(0), _other_device_stream()),
    "buffers on two devices": lambda: (acc.empty(N), acc.empty(N, device=1), "default"),
}


def _bytes_of(side: Any) -> bytes:
    """The bytes of a copy's side: read back from a device buffer, or a host object's own."""
    if isinstance(side, acc.Buffer):
        out = np.zeros(side.nbytes, np.uint8)
        if side.nbytes:
            acc.copy_(out, side)
            acc.synchronize()
        return out.tobytes()
    view = side.numpy() if isinstance(side, acc.HostBuffer) else side
    return bytes(memoryview(view).cast("B"))


def _outcome(copy: Callable[..., Any], case: str) -> tuple[str, Any]:
    """Run one case through ``copy``: ('ok', destination bytes) or (error type, message)."""
    dst, src, stream = CASES[case]()
    try:
        result = copy(dst, src) if stream == "default" else copy(dst, src, stream=stream)
    except Exception as exc:
        return type(exc).__name__, str(exc)
    assert result is dst
    acc.synchronize()
    return "ok", _bytes_of(dst)


TWO_DEVICES = ("stream of another device", "buffers on two devices")
"""The cases that need a second device (one Intel CPU device on xpu has none)."""

ERRORS = {
    "no buffer": "TypeError",
    "not a buffer": "TypeError",
    "not a stream": "TypeError",
}


@pytest.mark.parametrize("case", list(CASES))
def test_compiled_copy_matches_the_reference(device: str, case: str) -> None:
    if case in TWO_DEVICES and acc.device_count() < 2:
        pytest.skip(f"{device} has {acc.device_count()} device(s); this case needs 2")
    compiled = _outcome(acc.copy_, case)
    reference = _outcome(_calls.copy_, case)
    assert compiled == reference
    if list(CASES).index(case) < list(CASES).index("no buffer"):  # a copy that succeeds
        src = CASES[case]()[1]
        assert compiled == ("ok", _bytes_of(src))
    else:
        assert compiled[0] == ERRORS.get(case, "ValueError"), compiled


def test_compiled_copy_is_in_use() -> None:
    if _core.native is None:  # the Python core: no compiled fast path either
        assert calls.native is None
        assert acc.copy_ is _calls.copy_
    else:
        assert calls.native is not None
        assert acc.copy_ is calls.native.copy_
        assert acc.copy_.__doc__ == _calls.copy_.__doc__


@st.composite
def _host_arrays(draw: st.DrawFn) -> np.ndarray:
    """Host arrays of any dtype, 0 to 2 dimensions, contiguous or strided, writable or not."""
    dtype = draw(st.sampled_from(["u1", "i2", "i4", "f4", "f8", "c16"]))
    shape = draw(st.lists(st.integers(1, 6), min_size=0, max_size=2))
    array = np.arange(int(np.prod(shape)) * 2, dtype=dtype).reshape(*shape[:-1], -1)
    if shape and draw(st.booleans()):
        array = array[..., ::2]  # strided: not C-contiguous
    else:
        array = array.reshape(-1)[: int(np.prod(shape))].reshape(shape).copy()
    array.flags.writeable = draw(st.booleans())
    return array


@settings(max_examples=200, deadline=None)
@given(array=_host_arrays(), to_device=st.booleans(), extra=st.sampled_from([0, 0, 0, -1, 8]))
def test_generated_host_copies_match_the_reference(
    array: np.ndarray, to_device: bool, extra: int
) -> None:
    acc.backends.use("sim")
    outcomes = []
    for copy in (acc.copy_, _calls.copy_):
        host = array.copy() if array.flags.c_contiguous else array
        host.flags.writeable = array.flags.writeable
        buf = acc.empty(max(array.nbytes + extra, 0))
        acc.copy_(buf, bytes(buf.nbytes))
        dst, src = (buf, host) if to_device else (host, buf)
        try:
            copy(dst, src)
            acc.synchronize()
            outcomes.append(
                ("ok", _bytes_of(buf), _bytes_of(host) if host.flags.c_contiguous else None)
            )
        except Exception as exc:
            outcomes.append((type(exc).__name__, str(exc)))
        buf.free()
    assert outcomes[0] == outcomes[1]
