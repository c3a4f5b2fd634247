"""Pausing Python's cyclic garbage collector while a big snapshot is decoded and walked.

Decoding a snapshot creates a container (a dict or list) for every trace entry and stack, and
none of them is part of a reference cycle. With the collector on, every few thousand new
containers start a collection, and each full collection walks all of them: on a 90 MB snapshot
that is four fifths of the time pickle takes to decode it (1.5 s against 0.3 s), and as much
again for every pass that builds objects while the snapshot is alive. A replay is the same
case: every split makes a ``Block`` (a container), and the collections its allocations start
walk every live block; ``replay.replay`` runs its events with the collector paused. Memory is
still freed by reference counting while the collector is paused; only cycles wait for the next
collection.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager

__all__ = ["collector_paused"]


@contextmanager
def collector_paused() -> Iterator[None]:
    """Pause the cyclic garbage collector in the ``with`` block (nested blocks are fine).

    It is turned back on at the end only if it was on at the start.
    """
    was_on = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_on:
            gc.enable()
