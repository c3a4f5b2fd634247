"""The package's imports: no circle between modules and no arrow from a lower layer to a higher
one (docs/design.md, "Layers as built"); the one test of layering for the whole package, and
of that map naming every module.
Every import counts: at the top of a module, inside a function (lazy) and under
``TYPE_CHECKING``; a compiled module's Python-level imports too.

The layers, lowest first: a module may import its own layer and the ones below.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import accelrt

SRC = Path(accelrt.__file__).parent

LAYERS: list[tuple[str, ...]] = [
    # leaves: errors, units, text, values made once, the compiled-module switch, devices
    (
        "_errors",
        "_units",
        "_text",
        "_gc",
        "_lazy",
        "_readonly",
        "_warn",
        "_compiled",
        "_stream_ops",
        "_device",
        "_version",
    ),
    ("backends",),
    ("_runtime", "_accelerator"),
    # memory's plain parts: settings, rules, all-or-nothing operations, history
    ("memory._config", "memory._policy", "memory._atomic", "memory.history"),
    ("memory.device",),  # the caching allocator
    ("_stream",),
    (
        "memory.buffers",
        "memory.host",
        "memory.calls",
        "memory._snapshots",
        "memory._api",
        "memory",
        "_graph",
    ),
    ("interop",),
    ("trace",),
    ("_offline_plan", "_bounds", "_start_state"),
    ("replay",),
    ("_verdict", "view", "_sweep"),
    ("_info", "cli"),
    ("__init__", "__main__", "testing"),
]


def _modules() -> dict[str, Path]:
    """Every module of the package by dotted name (a package by its ``__init__``)."""
    out: dict[str, Path] = {}
    for path in sorted(SRC.rglob("*")):
        if path.suffix not in (".py", ".pyx") or "__pycache__" in path.parts:
            continue
        parts = ["accelrt", *path.relative_to(SRC).with_suffix("").parts]
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


MODULES = _modules()


def _tree(path: Path) -> ast.Module:
    text = path.read_text(encoding="utf-8")
    if path.suffix == ".pyx":  # its Python-level imports; cimports are C-level
        lines = [
            line.strip()
            for line in text.splitlines()
            if line.strip().startswith(("import ", "from ")) and " cimport " not in line
        ]
        text = "\n".join(lines)
    return ast.parse(text)


def _imports(name: str, path: Path) -> set[str]:
    """The package's modules that ``name`` imports anywhere in its file."""
    package = name if path.stem == "__init__" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(_tree(path)):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            for alias in node.names:
                sub = f"{module}.{alias.name}"
                found.add(sub if sub in MODULES else module)
    return {m for m in found if m in MODULES and m != name}


GRAPH = {name: _imports(name, path) for name, path in MODULES.items()}


def _layer(module: str) -> int:
    """The layer of ``module``: that of the longest entry of ``LAYERS`` it is or is inside."""
    name = module.removeprefix("accelrt").removeprefix(".") or "__init__"
    best, layer = "", -1
    for n, entries in enumerate(LAYERS):
        for entry in entries:
            inside = name == entry or name.startswith(entry + ".")
            if inside and len(entry) > len(best):
                best, layer = entry, n
    assert layer >= 0, f"{module} is in no layer: add it to LAYERS and docs/design.md"
    return layer


def _cycles() -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    out: list[list[str]] = []
    for root in GRAPH:
        if root in index:
            continue
        work = [(root, iter(sorted(GRAPH[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(GRAPH[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    out.append(sorted(component))
    return out


def test_every_module_is_in_a_layer() -> None:
    for module in MODULES:
        _layer(module)


def test_every_module_is_on_the_map() -> None:
    # docs/design.md's "Layers as built" names every module (its file name, or its stem in a
    # list such as "_cl / _sycl"), so that a newcomer finds any room from it
    design = SRC.parent.parent / "docs" / "design.md"
    if not design.exists():
        pytest.skip("docs/design.md is not beside this install (not an editable one)")
    section = design.read_text().split("## Layers as built", 1)[1].split("\n## ", 1)[0]
    missing = [p.relative_to(SRC).as_posix() for p in MODULES.values() if p.stem not in section]
    assert missing == [], f"add these to docs/design.md, 'Layers as built': {missing}"


def test_no_import_circles() -> None:
    assert _cycles() == []


def test_no_arrow_from_a_lower_layer_to_a_higher_one() -> None:
    upward = sorted(
        f"{a} -> {b}" for a, targets in GRAPH.items() for b in targets if _layer(b) > _layer(a)
    )
    assert upward == []


def test_the_checker_sees_lazy_and_type_checking_imports(tmp_path: Path) -> None:
    source = tmp_path / "example.py"
    source.write_text(
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n"
        "    from .replay import ReplayReport\n"
        "def f():\n"
        "    from .trace import load\n"
        "    import accelrt.view\n"
    )
    assert _imports("accelrt.example", source) == {
        "accelrt.replay",
        "accelrt.trace",
        "accelrt.view",
    }


def test_use_is_the_runtimes() -> None:
    """``accelrt.backends.use`` is the runtime's ``use``, handed down when ``_runtime`` is
    imported, so that backends/ imports nothing above it."""
    import accelrt.backends as backends
    from accelrt import _runtime

    assert backends._chooser == [_runtime.use]
    previous = _runtime.accelerator()
    try:
        assert backends.use("sim") is backends.get_backend("sim")
        assert _runtime.accelerator() is backends.get_backend("sim")
    finally:
        if previous is not None:
            backends.use(previous.name)
