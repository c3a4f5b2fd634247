"""All-or-nothing allocator operations: a KeyboardInterrupt never cuts one in half.

CPython raises ``KeyboardInterrupt`` (and whatever a Python signal handler raises) between
bytecodes, so a plain Python allocator interrupted half-way through a ``malloc`` or a ``free``
would be left with a block in no list, or statistics that disagree with its blocks. So the
functions that change an allocator are *atomic*: their code objects are registered here, and
the SIGINT handler installed by :func:`protect_sigint` looks at the interrupted stack. Inside
an atomic function it only notes the signal (``PENDING``); every atomic function checks that
note as it returns and hands the signal on (:func:`deliver`: at the caller's first bytecode
outside every atomic function), so the program sees its KeyboardInterrupt right after the
operation, which happened completely or not at all. The
hot path pays one flag test per call; a signal arriving before the function's first bytecode
interrupts before anything changed.

:func:`atomic` registers a function (wrapping it with the check, for the less frequent
paths); the hot paths register themselves with :func:`register` and test ``PENDING.flag`` in
a ``finally`` of their own. Exceptions other than signals (backend errors, out of memory) are
raised where nothing has changed yet or the state is consistent; docs/reliability.md lists
them.

*Finalisers* (``__del__`` methods, ``weakref.finalize`` callbacks, whatever the garbage
collector runs) are the other place where a signal must wait: CPython prints an exception
raised in one ("Exception ignored in ...") and drops it, so a Ctrl-C landing in
``Stream.__del__`` was lost. Their code objects are registered with :func:`finaliser`
(``weakref.finalize.__call__`` always is). A SIGINT inside one, with no atomic function below
it on the stack, is handed on at once (as :func:`deliver` does), so it arrives at the first
bytecode of the code the finaliser interrupted; with an atomic function below, that function
delivers it as it returns, as for any signal inside it.

The handler wraps whatever Python handler is in place when the first allocator is made on the
main thread (the default raises KeyboardInterrupt). A handler the program installs later
replaces it, and then interrupts are no longer deferred.
"""

from __future__ import annotations

import _thread
import functools
import signal
import sys
import threading
import weakref
from collections.abc import Callable
from types import CodeType, FrameType
from typing import TypeAlias, TypeVar

__all__ = ["PENDING", "atomic", "deliver", "finaliser", "protect_sigint", "register"]

F = TypeVar("F", bound=Callable[..., object])
_Handler: TypeAlias = Callable[[int, "FrameType | None"], object]
"""A Python-level signal handler."""
_Tracer: TypeAlias = Callable[[FrameType, str, object], "_Tracer | None"]
"""A ``sys.settrace`` trace function: it returns the frame's next one."""


class _Pending:
    """Whether a SIGINT arrived inside an atomic function and still waits to be delivered."""

    __slots__ = ("flag",)

    def __init__(self) -> None:
        self.flag = False


PENDING = _Pending()
_atomic_code: set[CodeType] = set()  # atomic functions and finalisers: delivery waits for both
_finaliser_code: set[CodeType] = set()  # finalisers only
_wrapped: list[_Handler] = []  # the handler in place when ours was installed


def register(func: F) -> F:
    """Mark ``func`` atomic; it must test ``PENDING.flag`` (and :func:`deliver`) as it returns."""
    _atomic_code.add(func.__code__)
    return func


def finaliser(func: F) -> F:
    """Mark ``func`` a finaliser (a ``__del__``, or a callback the garbage collector runs): a
    SIGINT inside it arrives at the first bytecode of the code it interrupted, not lost as an
    exception raised in a finaliser is. Nothing is wrapped: it needs no check of its own."""
    _atomic_code.add(func.__code__)
    _finaliser_code.add(func.__code__)
    return func


# the Python frame between the garbage collector and every weakref.finalize callback
finaliser(weakref.finalize.__call__)


def deliver() -> None:
    """Hand on a deferred SIGINT so that it arrives right after the atomic function returns.

    On the main thread, the wrapped handler runs at the first bytecode its callers execute
    outside every atomic function (a trace function on the calling frames, removed as it
    fires). Re-sending the signal instead would let it land at the start of the next atomic
    call, where CPython handles signals, and be deferred again and again: a loop of allocator
    calls never saw its Ctrl-C. Off the main thread, or while a debugger or coverage tool
    traces the program, the signal is sent again from a helper thread.
    """
    PENDING.flag = False
    _deliver_after(sys._getframe(1))


def _deliver_after(frame: FrameType | None) -> None:
    """Run the wrapped handler at the first bytecode outside every atomic function and
    finaliser that ``frame`` and its callers run (see :func:`deliver`)."""
    if threading.current_thread() is not threading.main_thread() or sys.gettrace() is not None:
        _thread.start_new_thread(_thread.interrupt_main, ())
        return
    traced: list[FrameType] = []

    def on_event(where: FrameType, event: str, arg: object) -> _Tracer | None:
        if event == "call" or _inside_atomic(where):
            return None if event == "call" else on_event
        sys.settrace(None)
        for traced_frame in traced:
            traced_frame.f_trace = None
        _wrapped[0](signal.SIGINT, where)  # the program's handler: raises KeyboardInterrupt
        return None

    while frame is not None:
        frame.f_trace = on_event
        frame.f_trace_opcodes = True
        traced.append(frame)
        frame = frame.f_back
    sys.settrace(on_event)  # per-frame tracing runs only while a thread has a trace function


def _inside_atomic(frame: FrameType | None) -> bool:
    while frame is not None:
        if frame.f_code in _atomic_code:
            return True
        frame = frame.f_back
    return False


def atomic(func: F) -> F:
    """Return ``func`` made atomic: a SIGINT inside it is delivered when it returns."""

    def atomic_call(*args: object, **kwargs: object) -> object:
        try:
            return func(*args, **kwargs)
        finally:
            if PENDING.flag:
                deliver()

    _atomic_code.add(func.__code__)
    _atomic_code.add(atomic_call.__code__)
    return functools.wraps(func)(atomic_call)  # type: ignore[return-value]


def _deferring_handler(signum: int, frame: FrameType | None) -> object:
    in_finaliser = False
    where = frame
    while where is not None:
        code = where.f_code
        if code in _atomic_code:
            if code not in _finaliser_code:  # it delivers as it returns
                PENDING.flag = True
                return None
            in_finaliser = True
        where = where.f_back
    if in_finaliser:  # raised here, the KeyboardInterrupt would be dropped with the finaliser
        _deliver_after(frame)
        return None
    return _wrapped[0](signum, frame)


def protect_sigint() -> None:
    """Defer SIGINT inside atomic functions; no-op off the main thread or if installed.

    Only a Python-level handler is wrapped; an ignored or OS-default SIGINT is left alone.
    """
    if _wrapped or threading.current_thread() is not threading.main_thread():
        return
    current = signal.getsignal(signal.SIGINT)
    if callable(current) and current is not _deferring_handler:
        _wrapped.append(current)
        signal.signal(signal.SIGINT, _deferring_handler)
