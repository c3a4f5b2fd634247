"""Values made on first use, once per key, by whichever thread asks first (a leaf: imports
nothing of accelrt)."""

from __future__ import annotations

from collections.abc import Callable, MutableMapping
from contextlib import AbstractContextManager
from typing import TypeVar

__all__ = ["made_once"]

K = TypeVar("K")
V = TypeVar("V")


def made_once(
    table: MutableMapping[K, V],
    key: K,
    lock: AbstractContextManager[object],
    make: Callable[[K], V],
) -> V:
    """Return ``table[key]``, made by ``make(key)`` and stored there on first use.

    Double-checked locking: a value already made is read without the lock; otherwise ``lock``
    is taken and the table read again, so two threads never both make one and ``make`` runs
    with ``lock`` held. A value must not be None (None means "not made yet"). What ``make``
    raises propagates, and nothing is stored.
    """
    value = table.get(key)
    if value is None:
        with lock:
            value = table.get(key)
            if value is None:
                value = table[key] = make(key)
    return value
