"""Values made on first use, once per key, by whichever thread asks first (a leaf: imports
nothing of accelrt): ``made_once``, and ``PerDevice``, a backend's per-device state made so."""

from __future__ import annotations

from collections.abc import Callable, MutableMapping
from contextlib import AbstractContextManager
from typing import Generic, TypeVar

__all__ = ["PerDevice", "made_once"]

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


class PerDevice(Generic[V]):
    """A base of a backend's device layer: its state of each device (``V``), made on first use.

    The subclass sets ``_state`` (an empty dict) and ``_lock`` in ``__init__`` and defines
    ``_new_dev``; ``_dev(index)`` is the state of device ``index`` (an int).
    """

    _state: dict[int, V]
    _lock: AbstractContextManager[object]

    def _dev(self, index: int) -> V:
        """The state of device ``index``, made by ``_new_dev`` on first use (``made_once``)."""
        state = self._state.get(index)  # the hot case inline: no extra call
        if state is None:  # first use: made once, under the lock
            state = made_once(self._state, index, self._lock, self._new_dev)
        return state

    def _new_dev(self, index: int) -> V:
        """A new state of device ``index`` (called under ``_lock``, once per device)."""
        raise NotImplementedError
