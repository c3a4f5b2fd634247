"""The layers above ``memory/`` import downward only: ``trace/`` below ``replay``, ``replay``
below ``view``, the CLI and the sweep on top; no import circles among them. Every import
counts, lazy (inside a function) and ``TYPE_CHECKING`` ones included (docs/design.md)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parent.parent / "src"
PACKAGE = SRC / "accelrt"


def _module(path: Path) -> str:
    parts = list(path.relative_to(SRC).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports() -> dict[str, set[str]]:
    """Every module of accelrt and the accelrt modules it imports, anywhere in its code."""
    modules = {_module(p): p for p in PACKAGE.rglob("*.py")}
    edges: dict[str, set[str]] = {m: set() for m in modules}
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom):
                if node.level:
                    base = ".".join(package.split(".")[: len(package.split(".")) - node.level + 1])
                    target = f"{base}.{node.module}" if node.module else base
                else:
                    target = node.module or ""
                for alias in node.names:
                    full = f"{target}.{alias.name}"
                    found = full if full in modules else target
                    if found in modules and found != name:
                        edges[name].add(found)
            elif isinstance(node, ast.Import):
                edges[name].update(a.name for a in node.names if a.name in modules)
    return edges


def _in(module: str, room: str) -> bool:
    return module == room or module.startswith(room + ".")


@pytest.mark.parametrize(
    ("room", "above"),
    [
        ("accelrt.trace", ["accelrt.replay", "accelrt.view", "accelrt.cli", "accelrt._sweep"]),
        ("accelrt.replay", ["accelrt.view", "accelrt.cli", "accelrt._sweep"]),
        ("accelrt.view", ["accelrt.cli", "accelrt._sweep"]),
    ],
)
def test_a_layer_imports_nothing_above_it(room: str, above: list[str]) -> None:
    edges = _imports()
    upward = sorted(
        f"{m} -> {t}"
        for m, targets in edges.items()
        if _in(m, room)
        for t in targets
        if any(_in(t, a) for a in above)
    )
    assert upward == []


def test_no_import_circle_outside_memory_and_backends() -> None:
    edges = {
        m: {t for t in ts if not _in(t, "accelrt.memory") and not _in(t, "accelrt.backends")}
        for m, ts in _imports().items()
        if not _in(m, "accelrt.memory") and not _in(m, "accelrt.backends")
    }
    circles = []
    for start in edges:  # a circle through start: start reaches itself
        seen: set[str] = set()
        todo = list(edges[start])
        while todo:
            m = todo.pop()
            if m == start:
                circles.append(start)
                break
            if m not in seen:
                seen.add(m)
                todo.extend(edges.get(m, ()))
    assert circles == []
