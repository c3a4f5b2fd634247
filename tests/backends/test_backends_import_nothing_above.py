"""``accelrt.backends`` sits below the runtime: it imports only itself and the leaf modules under
it (devices, errors, text, units, the compiled-module switch), never ``_runtime``, ``memory``,
streams or the CLI, not even lazily or for type checking. ``_runtime`` hands ``backends.use``
its function when it is imported instead.
"""

from __future__ import annotations

import ast
from pathlib import Path

import accelrt
import accelrt.backends as backends

ROOT = Path(accelrt.__file__).parent
BELOW = {"_device", "_errors", "_text", "_units", "_compiled", "_stream_ops"}
"""The modules of accelrt below ``backends`` (each imports none above it either)."""


def _accelrt_imports(path: Path) -> set[str]:
    """Every accelrt module ``path`` imports, anywhere in it, as a dotted name."""
    package = ["accelrt", *path.parent.relative_to(ROOT).parts]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.split(".")[0] == "accelrt")
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[: len(package) - node.level + 1]
                module = ".".join([*base, *([node.module] if node.module else [])])
            else:
                module = node.module or ""
            if module.split(".")[0] != "accelrt":
                continue
            if module == "accelrt" or (node.level and not node.module):
                found.update(f"{module}.{a.name}" for a in node.names)  # from . import x
            else:
                found.add(module)
    return found


def test_backends_import_nothing_above_them() -> None:
    files = sorted((ROOT / "backends").rglob("*.py"))
    assert len(files) > 10
    above = {}
    for path in files:
        for module in _accelrt_imports(path):
            parts = module.split(".")
            if parts[1] == "backends" or (len(parts) == 2 and parts[1] in BELOW):
                continue
            above.setdefault(str(path.relative_to(ROOT)), []).append(module)
    assert above == {}
    for name in BELOW:  # and the leaf modules import no further up
        inside = _accelrt_imports(ROOT / f"{name}.py")
        assert {m.split(".")[1] for m in inside} <= BELOW, (name, inside)


def test_use_is_the_runtimes() -> None:
    from accelrt import _runtime

    assert backends._chooser == [_runtime.use]
    previous = _runtime.accelerator()
    try:
        assert backends.use("sim") is backends.get_backend("sim")
        assert _runtime.accelerator() is backends.get_backend("sim")
    finally:
        if previous is not None:
            backends.use(previous.name)
