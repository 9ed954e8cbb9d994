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
from helpers.imports import find_cycle, import_graph

ROOT = Path(dayzero.runtime.__file__).parent


def test_no_import_cycle_among_runtime_modules():
    cycle = find_cycle(import_graph(ROOT, "dayzero."))
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
    graph = import_graph(pkg, "dayzero.")
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
