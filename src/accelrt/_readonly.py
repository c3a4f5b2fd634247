"""Read-only public attributes over private ones, written once a line (a leaf: imports nothing
of accelrt).

``handle: read_only[int] = read_only("_handle", "The backend's handle.")`` in a class body is
``@property def handle(self) -> int: return self._handle`` with that docstring: at run time it
is that ``property`` (its getter ``operator.attrgetter``, no Python frame), so setting or
deleting it raises the same ``AttributeError``; to type checkers it reads as an ``int``.
"""

from __future__ import annotations

from operator import attrgetter
from typing import TYPE_CHECKING, Generic, NoReturn, TypeVar, overload

__all__ = ["read_only"]

T = TypeVar("T")

if TYPE_CHECKING:

    class read_only(Generic[T]):  # lower case, as ``property`` is
        """What type checkers see: a descriptor reading ``T`` on instances."""

        def __init__(self, name: str, doc: str) -> None: ...
        @overload
        def __get__(self, instance: None, owner: type | None = None, /) -> property: ...
        @overload
        def __get__(self, instance: object, owner: type | None = None, /) -> T: ...
        def __get__(self, instance: object, owner: type | None = None, /) -> T | property: ...
        def __set__(self, instance: object, value: NoReturn, /) -> None: ...  # no setter

else:

    def read_only(name: str, doc: str) -> property:
        """Return a ``property`` that reads the attribute ``name`` (a str, e.g. ``"_handle"``)
        of its instance, documented by ``doc``; it has no setter nor deleter."""
        return property(attrgetter(name), doc=doc)
