"""Import graphs of a package tree, read with ``ast`` (nothing is imported): module-level imports
*and* those inside functions (a deferred import still ties two modules into one unit); imports under
``if TYPE_CHECKING:`` are left out (annotations only, they never run). tests/test_import_graph.py and
tests/runtime/test_runtime_imports.py read them."""

from __future__ import annotations

import ast
from pathlib import Path


def module_name(root: Path, path: Path, prefix: str = "") -> str:
    """The dotted name of ``path`` in the package at ``root`` (``prefix`` before it: ``dayzero.``
    for a sub-package's tree)."""
    parts = [root.name, *path.relative_to(root).with_suffix("").parts]
    if parts[-1] == "__init__":
        parts.pop()
    return prefix + ".".join(parts)


def _type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def import_graph(root: Path, prefix: str = "") -> dict[str, set[str]]:
    """Module -> the modules of the package at ``root`` it imports anywhere in its file."""
    paths = {module_name(root, p, prefix): p for p in sorted(root.rglob("*.py"))}
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
