"""Helpers for the tests of programs that use accelrt, and of accelrt itself.

A test that picks a backend, allocates or changes allocator settings leaves that state in the
process; :func:`reset_runtime` puts the runtime back as it was at import, so each test starts
clean (accelrt's own ``tests/conftest.py`` calls it around every test)::

    import pytest
    import accelrt.testing

    @pytest.fixture(autouse=True)
    def clean_accelrt():
        accelrt.testing.reset_runtime()
        yield
        accelrt.testing.reset_runtime()
"""

from __future__ import annotations

from . import _runtime, _stream
from .backends import _base

__all__ = ["reset_runtime"]


def reset_runtime() -> None:
    """Forget the chosen accelerator, every allocator, the allocator settings, the current
    devices and this thread's current streams, and make the simulated backend anew (its
    default capacity, no memory in use).

    Each allocator is emptied first (its cached memory goes back to the device); memory still
    allocated stays with its ``Buffer`` objects, which must not be used afterwards. Other
    threads' current streams are forgotten on their next call (the runtime's state epoch
    changes). Not for use while another thread is inside an accelrt call.
    """
    _runtime.reset_state()
    _stream.reset_local()
    _base._instances.pop("sim", None)
