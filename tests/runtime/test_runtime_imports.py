"""The runtime's module structure: no import cycle among its modules, and every package's docstring
reads through every module in it.

Imports are read with ``ast`` (nothing is imported), at module level *and* inside functions: a
deferred import still ties two modules into one unit that cannot be read or tested apart. Imports
under ``if TYPE_CHECKING:`` are left out: they never run (annotations only).
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

import dayzero.runtime

ROOT = Path(dayzero.runtime.__file__).parent


def module_name(root: Path, path: Path) -> str:
    parts = [root.name, *path.relative_to(root).with_suffix("").parts]
    if parts[-1] == "__init__":
        parts.pop()
    return "dayzero." + ".".join(parts)


def _type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def import_graph(root: Path) -> dict[str, set[str]]:
    """Module -> the modules of the same tree it imports anywhere in its file."""
    paths = {module_name(root, p): p for p in sorted(root.rglob("*.py"))}
    graph: dict[str, set[str]] = {}
    for name, path in paths.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        targets: set[str] = set()
        tree = ast.parse(path.read_text(), str(path))
        typing_only = {id(n) for block in ast.walk(tree) if isinstance(block, ast.If) and _type_checking(block.test)
                       for stmt in block.body for n in ast.walk(stmt)}
        for node in ast.walk(tree):
            if id(node) in typing_only:
                continue
            if isinstance(node, ast.Import):
                targets |= {a.name for a in node.names}
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    anchor = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                    base = f"{anchor}.{base}" if base else anchor
                for a in node.names:  # ``from pkg import mod`` imports a module; ``from mod import obj`` the module
                    targets.add(f"{base}.{a.name}" if f"{base}.{a.name}" in paths else base)
        graph[name] = {t for t in targets if t in paths and t != name}
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle as ``[a, b, ..., a]``, or None when the graph is acyclic."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                return path[path.index(nxt):] + [nxt]
            if nxt not in state and (found := visit(nxt)):
                return found
        path.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (found := visit(node)):
            return found
    return None


def test_no_import_cycle_among_runtime_modules():
    cycle = find_cycle(import_graph(ROOT))
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


def test_cycle_detection_sees_deferred_imports(tmp_path):
    """The shape of a cycle through a function-level import (a loop module importing the launcher at
    the top, the launcher importing the loop inside a function) is found."""
    pkg = tmp_path / "runtime"
    pkg.mkdir()
    (pkg / "__init__.py").write_text('"""doc"""\n')
    (pkg / "train.py").write_text("from dayzero.runtime.launch import init\n")
    (pkg / "launch.py").write_text("def run():\n    from dayzero.runtime.train import train\n")
    (pkg / "data.py").write_text("from . import launch\n")
    (pkg / "typed.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .train import T\n")
    graph = import_graph(pkg)
    assert graph["dayzero.runtime.data"] == {"dayzero.runtime.launch"}
    assert graph["dayzero.runtime.typed"] == set()
    assert find_cycle(graph) == ["dayzero.runtime.launch", "dayzero.runtime.train", "dayzero.runtime.launch"]


@pytest.mark.parametrize("package", sorted(p.parent.name for p in ROOT.glob("*/__init__.py")) + ["."])
def test_package_docstring_names_every_module(package):
    """Each runtime package's docstring gives a reading order that covers every module in it."""
    folder = (ROOT / package).resolve()
    doc = ast.get_docstring(ast.parse((folder / "__init__.py").read_text())) or ""
    named = set(re.findall(r"``(\w+)``", doc))
    members = {p.stem for p in folder.glob("*.py") if p.stem != "__init__"}
    members |= {p.parent.name for p in folder.glob("*/__init__.py")}
    assert members - named == set(), f"dayzero.runtime{'' if package == '.' else '.' + package}: docstring misses"
