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

The rest set up what a test needs and read what it checks without reaching into private
modules: a backend of the test's own in place of a registered one (:func:`install_backend`,
:func:`forget_backend`), no accelerator at all (:func:`use_no_accelerator`), allocator settings
replaced whole (:func:`replace_allocator_settings`), and whether a device has been initialised
or its allocator made (:func:`is_initialized`, :func:`peek_allocator`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from . import _runtime, _stream
from .backends import _base
from .memory.device import _registry

if TYPE_CHECKING:
    from .backends import Backend
    from .memory import AllocatorConfig, CachingAllocator

__all__ = [
    "forget_backend",
    "install_backend",
    "is_initialized",
    "peek_allocator",
    "replace_allocator_settings",
    "reset_runtime",
    "use_no_accelerator",
]


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


def install_backend(name: str, backend: Backend) -> None:
    """Make ``backend`` the instance that ``accelrt.backends.get_backend(name)`` returns (a
    backend over a fake driver, one that injects faults, a fresh one with no driver state), in
    place of the one made or installed before. ``accelrt.backends.use(name)`` then makes it
    the accelerator; so does auto-detection, where ``name`` is the one chosen."""
    _base._instances[name] = backend


def forget_backend(name: str) -> None:
    """Drop the instance of the backend called ``name``: the next ``get_backend(name)`` makes
    a new one (reading the environment, e.g. ``ACCELRT_VISIBLE_DEVICES``, as it is then).
    Nothing happens where there is none."""
    _base._instances.pop(name, None)


def is_initialized(backend: Backend) -> bool:
    """Whether this process has used a device of ``backend`` (a stream, an allocation, a
    synchronisation): what makes a forked child refuse it. Choosing the accelerator, counting
    devices and reading properties initialise nothing."""
    return _runtime.is_initialized(backend)


def peek_allocator(backend: Backend, index: int) -> CachingAllocator | None:
    """The caching allocator of device ``index`` of ``backend`` if one has been made, else
    None; unlike ``accelrt.memory.get_allocator`` it makes none."""
    return _registry.peek_allocator(backend, index)


def replace_allocator_settings(config: AllocatorConfig) -> None:
    """Make ``config`` the allocator settings, every one of them (a setting it does not name
    goes back to its default), for every allocator and those made later; where
    ``accelrt.set_allocator_settings(text)`` changes only the settings ``text`` names."""
    _registry.set_allocator_config(config)


def use_no_accelerator() -> None:
    """Act as on a machine with no accelerator until :func:`reset_runtime` or
    ``accelrt.backends.use``: ``is_available()`` is False, ``current_accelerator()`` is None
    and every call that needs a device raises PyTorch's ``RuntimeError``."""
    with _runtime._lock:
        _runtime._chosen[:] = [None]
        _runtime.STATE_EPOCH.bump()
