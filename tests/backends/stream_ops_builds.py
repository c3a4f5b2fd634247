"""The builds of accelrt/_stream_ops.py, for the tests that run one script on each and compare
what they did: the module run from its Python source, and Cython's build where it is installed."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

from accelrt import _compiled


def stream_ops_builds(name: str) -> dict[str, ModuleType]:
    """``{"source": ..., "compiled": ...}``: _stream_ops.py run as Python under the module name
    ``name`` (beside the build, so each test file has a copy of its own), and the installed
    build, present only where it was built at install."""
    path = Path(_compiled.STREAM_OPS.__file__).with_name("_stream_ops.py")
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    source = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(source)
    builds = {"source": source}
    if _compiled.STREAM_OPS_REASON == "built at install":
        builds["compiled"] = _compiled.STREAM_OPS
    return builds
