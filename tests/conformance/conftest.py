"""Fixtures of the conformance suite: every test runs on each available backend (``device``)."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable

import pytest

import accelrt as acc


@pytest.fixture
def two_devices(device: str) -> str:
    """The ``device`` backend, skipped where it has fewer than 2 devices (one PoCL CPU)."""
    if acc.device_count() < 2:
        pytest.skip(f"{device} has {acc.device_count()} device(s); this needs 2")
    return device


def _run_python(code: str, **env: str) -> str:
    full_env = {**os.environ, **env}
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=full_env, timeout=120
    )
    assert out.returncode == 0, out.stderr
    return out.stdout.strip()


@pytest.fixture
def run_python() -> Callable[..., str]:
    """``run_python(code, **env)``: run ``code`` in a fresh interpreter with ``env`` added and
    return its stdout, stripped. For what is per process: start-up environment, fork, lazy init.
    """
    return _run_python
