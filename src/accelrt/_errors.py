"""accelrt's exceptions.

::

    RuntimeError
     └── AcceleratorError            a device, stream or event operation failed
          └── OutOfMemoryError       (also a MemoryError) the allocator could not get memory
    ValueError / TypeError           bad arguments (plain built-ins, never wrapped)
     └── InputError                  (a ValueError) bad input from the user: a file, an
          │                          option, a setting; raised on purpose by the readers and
          │                          validators, and the only ValueError the ``accelrt``
          │                          command shows as a one-line error (status 2)
          ├── TraceFormatError       (accelrt.trace) a malformed trace or snapshot file
          └── StartStateError        (accelrt._start_state) a recording's start cannot be
                                     built under a setting

``OutOfMemoryError`` carries the figures its message states, so programs can react to them
without parsing text, and it pickles (it crosses process boundaries in multiprocessing pools).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import KW_ONLY, Field, InitVar, dataclass, fields
from typing import Any, ClassVar

__all__ = ["AcceleratorError", "InputError", "OutOfMemoryError"]


class MessageAndFields(Exception):
    """The base of an exception made of a message and keyword-only fields: a dataclass whose
    first, positional argument is ``message: InitVar[str]`` (the exception's ``str`` and
    ``args``), then ``_: KW_ONLY`` and the fields, kept as attributes of the same names.

    It pickles them: ``BaseException`` pickles only ``args``, which would lose the fields (and
    the constructor would refuse the call without them), so ``__reduce__`` passes the message
    and the fields by name (the errors cross process boundaries in multiprocessing pools).
    The dataclass is declared ``eq=False, repr=False``: errors compare by identity and show as
    ``BaseException`` shows them.
    """

    __dataclass_fields__: ClassVar[dict[str, Field[Any]]]

    def __post_init__(self, message: str) -> None:
        super().__init__(message)

    def __reduce__(
        self,
    ) -> tuple[Callable[..., BaseException], tuple[type[BaseException], str, dict[str, Any]]]:
        values = {field.name: getattr(self, field.name) for field in fields(self)}
        return (_rebuild, (type(self), str(self), values))


def _rebuild(
    cls: Callable[..., BaseException], message: str, values: dict[str, Any]
) -> BaseException:
    return cls(message, **values)


class InputError(ValueError):
    """Bad input from the user, found on purpose: a malformed file, a bad option or setting.

    Raised by accelrt's readers and validators where what they were given cannot be used (a
    trace line that is not an event, a setting out of range, an unknown scheduler...); the
    message says what is wrong and, where there is one, names the file and the place in it.
    A ``ValueError``, so that code catching ``ValueError`` for bad arguments keeps working.

    The ``accelrt`` command prints an ``InputError`` as one line, ``accelrt CMD: error:
    MESSAGE``, with exit status 2; any other exception reaching it is a bug in accelrt and is
    reported as one (its traceback and exit status 70; see :func:`accelrt.cli.main`).
    """


class AcceleratorError(RuntimeError):
    """A device, stream or event operation failed in a backend.

    Mirrors ``torch.AcceleratorError``: raised for failures reported by the device driver, never
    for bad arguments (those raise ``ValueError`` or ``TypeError``).
    """


@dataclass(eq=False, repr=False)
class OutOfMemoryError(MessageAndFields, AcceleratorError, MemoryError):
    """The caching allocator could not obtain device memory for a request.

    Mirrors ``torch.OutOfMemoryError``. Raised after the allocator has tried every step of its
    malloc ladder (docs/allocator.md section 6): reuse, a new segment, releasing cached blocks and a
    retry. The allocator is unchanged by the failed request and stays usable.

    Parameters
    ----------
    message : str
        The full, human-readable explanation.
    device : str
        The device, e.g. ``"opencl:0"``.
    requested_bytes : int
        The size the caller asked for.
    allocation_bytes : int
        The size the allocator tried to obtain from the device (the segment size).
    allocated_bytes : int
        Bytes handed out by the allocator on that device when it failed.
    reserved_bytes : int
        Bytes held from the device by the allocator (allocated plus cached).
    free_bytes : int
        Free device memory as the backend reported it.
    total_bytes : int
        The device's total memory.
    """

    message: InitVar[str]
    _: KW_ONLY
    device: str
    requested_bytes: int
    allocation_bytes: int
    allocated_bytes: int
    reserved_bytes: int
    free_bytes: int
    total_bytes: int
