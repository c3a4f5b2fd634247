"""Stacks people can read: noise frames filtered, Python frames first and whole, C++ folded.

PyTorch records up to a hundred frames per allocation: the caching allocator's own functions,
the dispatcher's ``Register*.cpp`` wrappers, the interpreter's ``_PyEval_*`` loop, and, among
them, the few lines of the user's program that matter. :func:`clean_stack` keeps those.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

__all__ = ["CleanStack", "clean_stack", "is_python_frame"]

_NOISE_NAME = re.compile(
    r"CUDACachingAllocator|CachingAllocator|c10::cuda::|torch::unwind|CapturedTraceback"
    r"|gather_with_cpp|wrap_kernel_functor|c10::impl::|c10::Dispatcher|c10::BoxedKernel"
    r"|c10::KernelFunction|at::_ops::|::redispatch\(|_PyEval_|PyEval_|_PyObject_|PyObject_"
    r"|_PyFunction_|_PyVectorcall|cfunction_call|cfunction_vectorcall|method_vectorcall"
    r"|slot_tp_|_Py_|Py_RunMain|Py_BytesMain|pymain_|__libc_start|^_start$|^\?\?$"
    r"|accelrt/memory/|accelrt/trace/|THPVariable_|torch::autograd::dispatch_"
    r"|empty_strided_generic|_empty_strided_generic|at::detail::empty",
)
_NOISE_FILE = re.compile(r"(^|/)Register[A-Za-z0-9_]*\.cpp$|(^|/)memory_snapshot\.cpp$")
_LIMIT_NAME = 160
_LIMIT_FILE = 240


def _text(value: object, limit: int) -> str:
    return value[:limit] if isinstance(value, str) else "?"


def is_python_frame(frame: object) -> bool:
    """Whether a recorded frame is a line of Python source (a ``.py`` file with a line > 0).

    Parameters
    ----------
    frame : dict
        A snapshot frame, ``{"name": str, "filename": str, "line": int}``; anything else is
        not a Python frame.
    """
    if not isinstance(frame, dict):
        return False
    filename, line = frame.get("filename"), frame.get("line")
    return (
        isinstance(filename, str)
        and (filename.endswith((".py", ".pyx")) or ".py:" in filename)
        and isinstance(line, int)
        and not isinstance(line, bool)
        and line > 0
    )


def _is_noise(frame: dict[str, object]) -> bool:
    name = frame.get("name")
    filename = frame.get("filename")
    if isinstance(filename, str) and _NOISE_FILE.search(filename):
        return True
    return not isinstance(name, str) or bool(_NOISE_NAME.search(name))


@dataclass(frozen=True)
class CleanStack:
    """A recorded stack, cleaned for reading.

    Attributes
    ----------
    python : tuple of str
        Every Python frame as ``"function  file:line"``, innermost first (none dropped).
    native : tuple of str
        The C++ frames that are not noise, innermost first (shown folded).
    hidden : int
        Frames left out as noise (allocator internals, dispatcher wrappers, the interpreter).
    """

    python: tuple[str, ...]
    native: tuple[str, ...]
    hidden: int

    @property
    def top(self) -> str:
        """The frame that names the stack in one line: the innermost Python frame, else the
        innermost kept C++ frame, else ``"(no stack)"``."""
        if self.python:
            return self.python[0]
        if self.native:
            return self.native[0]
        return "(no stack)"

    def lines(self, native_shown: int = 3) -> list[str]:
        """The stack as lines: Python frames whole, then the first ``native_shown`` C++ frames
        and a line counting the rest."""
        out = list(self.python)
        shown = self.native[:native_shown]
        out += [f"[C++] {f}" for f in shown]
        folded = len(self.native) - len(shown)
        if folded > 0 or self.hidden:
            out.append(f"... {folded} more C++ frames, {self.hidden} allocator/dispatcher frames")
        return out


def clean_stack(frames: object) -> CleanStack:
    """Clean a recorded stack (a snapshot entry's ``frames``).

    Parameters
    ----------
    frames : list of dict
        ``{"name", "filename", "line"}`` dicts, innermost first, as PyTorch and accelrt record
        them; entries that are not frames are skipped (a damaged file shows no stack rather
        than an error).

    Returns
    -------
    CleanStack
        Python frames first and whole; C++ frames that are not noise (the CUDA caching
        allocator, ``Register*.cpp`` wrappers, ``PyEval_*``, ``gather_with_cpp`` and the like);
        the count of noise frames.
    """
    python: list[str] = []
    native: list[str] = []
    hidden = 0
    for frame in frames if isinstance(frames, list) else []:
        if not isinstance(frame, dict):
            continue
        name = _text(frame.get("name"), _LIMIT_NAME)
        if is_python_frame(frame):
            python.append(f"{name}  {_text(frame.get('filename'), _LIMIT_FILE)}:{frame['line']}")
        elif _is_noise(frame):
            hidden += 1
        else:
            filename = frame.get("filename")
            where = f"  {filename[:_LIMIT_FILE]}" if isinstance(filename, str) and filename else ""
            native.append(f"{name}{'' if where.strip() in ('', '??') else where}")
    return CleanStack(tuple(python), tuple(native), hidden)
