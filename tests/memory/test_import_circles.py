"""accelrt.memory has no import circle, lazy and ``TYPE_CHECKING`` imports included
(docs/design.md, "Memory has no import circles"): read from the sources with ``ast``."""

from __future__ import annotations

import ast
from pathlib import Path

import accelrt.memory

ROOT = Path(accelrt.memory.__file__).parent
PACKAGE = "accelrt.memory"


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join((PACKAGE, *parts[: -1 if parts[-1] == "__init__" else None]))


def _python_lines(path: Path) -> str:
    text = path.read_text()
    if path.suffix != ".pyx":
        return text
    # a compiled module: its Python-level imports only
    return "\n".join(
        line for line in text.splitlines() if line.startswith("from ") and " cimport " not in line
    )


def _imports() -> dict[str, set[str]]:
    files = {_module_name(p): p for p in [*ROOT.rglob("*.py"), *ROOT.rglob("*.pyx")]}
    graph: dict[str, set[str]] = {name: set() for name in files}
    for name, path in files.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for node in ast.walk(ast.parse(_python_lines(path))):
            if isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    parts = package.split(".")
                    base = ".".join([*parts[: len(parts) - node.level + 1], *base.split(".")])
                    base = base.rstrip(".")
                targets = [
                    f"{base}.{a.name}" if f"{base}.{a.name}" in files else base for a in node.names
                ]
            elif isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            else:
                continue
            for target in targets:
                while target and target not in files:
                    target = target.rpartition(".")[0]
                if target and target != name:
                    graph[name].add(target)
    return graph


def _a_circle(graph: dict[str, set[str]]) -> list[str] | None:
    done: set[str] = set()
    for start in sorted(graph):
        path: list[str] = []
        stack = [(start, iter(sorted(graph[start])))]
        on_path = {start}
        path.append(start)
        while stack:
            node, following = stack[-1]
            step = next(following, None)
            if step is None:
                stack.pop()
                on_path.discard(path.pop())
                done.add(node)
            elif step in on_path:
                return [*path[path.index(step) :], step]
            elif step not in done:
                stack.append((step, iter(sorted(graph[step]))))
                on_path.add(step)
                path.append(step)
    return None


def test_memory_has_no_import_circle() -> None:
    graph = _imports()
    assert "accelrt.memory.device._events" in graph["accelrt.memory.host._allocator"]  # read at all
    assert _a_circle(graph) is None, " -> ".join(_a_circle(graph) or [])
