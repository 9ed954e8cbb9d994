"""Imports point one way: no cycle among dayzero's modules, and no import up the layer order.

Every ``import`` is read with ``ast`` (nothing is imported), at module level *and* inside
functions: a deferred import still ties two modules into one unit that cannot be read, tested or
moved apart, so hiding a cycle in a function does not break it. Imports under ``if
TYPE_CHECKING:`` are left out (annotations only, they never run).

The layers, lowest first (docs/architecture.md, "Layers"): a module imports only from its own
layer or below. The one exception is :data:`ALLOWED`, each edge with its reason.
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

import pytest

import dayzero
from helpers.imports import find_cycle, import_graph

ROOT = Path(dayzero.__file__).parent

# Modules and packages of dayzero (by their dotted name under dayzero; the longest that names a
# module's package decides), lowest layer first; a module may import its own layer and the layers
# below.
LAYERS: tuple[tuple[str, ...], ...] = (
    ("dayzero", "errors", "torch_version", "names", "units"),  # the package root, one-line errors, the torch floor,
    # name suggestions by edit distance, the one unit vocabulary (GB and GiB)
    ("inputs", "outputs", "jsonable"),  # reading user files, checking output paths, the one JSON encoding
    ("specs",),  # what is given: models, clusters, hardware, ParallelConfig and its rules
    # the planner, pure numpy: the modules every room uses, then its rooms in order
    ("planner", "planner.exports", "planner.engines", "planner.schedule", "planner.targets"),
    ("planner.memory",),  # bytes per device
    ("planner.perf",),  # step time (reads memory's offload and options)
    ("planner.predict", "planner.training_cost"),  # one layout's prediction, and its cost
    ("planner.search",),  # the best layouts (memory + perf + predict)
    ("planner.backtest",),  # published runs, predicted and scored
    ("monitor",),  # alert rules and the exporter (no torch): the planner's targets
    # the one place that knows device types and backends (tests/runtime/test_device.py holds every
    # device name to it); it imports only errors (torch lazily), so ops' manifests and validate read it
    ("runtime.device",),
    ("derive", "ops"),  # the model's own modeling code, traced (torch and transformers)
    ("runtime",),  # training on torch.distributed
    ("validate",),  # runs of the runtime checked against the planner
    ("report",),  # day0 and compare reports
    ("export",),  # a plan as an engine's launch
    ("cli", "__main__"),  # parse -> one library call -> render
)

# (importer, imported): the edges allowed against the rules above, each with its reason.
ALLOWED: dict[tuple[str, str], str] = {
    ("dayzero.specs.registry", "dayzero.derive.describe"): "the optional-torch hook: load_model derives a "
    "ModelSpec from a model's own modeling code (torch, transformers) only for a model_type without a "
    "hand-written parser; every parsed model loads without them",
    ("dayzero.specs.registry", "dayzero.derive.to_spec"): "the optional-torch hook (see describe)",
    ("dayzero.specs.registry", "dayzero.derive.traced_flops"): "the optional-torch hook (see describe)",
}


def layer_of(module: str, layers: tuple[tuple[str, ...], ...]) -> int:
    """The index of the layer ``module`` (``dayzero.x.y``) belongs to: the layer naming the longest
    of ``x.y``, ``x`` (``dayzero`` itself for the package root)."""
    index = {name: i for i, names in enumerate(layers) for name in names}
    parts = module.split(".")[1:] or ["dayzero"]
    for n in range(len(parts), 0, -1):
        if ".".join(parts[:n]) in index:
            return index[".".join(parts[:n])]
    raise AssertionError(f"{module}: its top-level name {parts[0]!r} is in no layer; add it to LAYERS")


def upward_edges(graph: dict[str, set[str]], layers, allowed) -> list[str]:
    """Every import of a module from a higher layer than its own, except the allowed ones."""
    return [f"{a} -> {b}" for a in sorted(graph) for b in sorted(graph[a])
            if layer_of(b, layers) > layer_of(a, layers) and (a, b) not in allowed]


def checked_graph(root: Path, allowed) -> dict[str, set[str]]:
    """The import graph without the allowed edges (the cycle check sees the rest)."""
    return {a: {b for b in bs if (a, b) not in allowed} for a, bs in import_graph(root).items()}


@lru_cache(maxsize=1)
def dayzero_graph() -> dict[str, set[str]]:
    return import_graph(ROOT)


def test_no_import_cycle():
    graph = {a: {b for b in bs if (a, b) not in ALLOWED} for a, bs in dayzero_graph().items()}
    cycle = find_cycle(graph)
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


def test_no_import_up_the_layers():
    up = upward_edges(dayzero_graph(), LAYERS, ALLOWED)
    assert not up, "imports up the layer order:\n" + "\n".join(up)


def test_every_allowed_edge_exists():
    """An allowed edge nobody needs any more is taken off the list."""
    graph = dayzero_graph()
    stale = [f"{a} -> {b}" for a, b in ALLOWED if b not in graph.get(a, set())]
    assert not stale, "allowed edges that no longer exist: " + ", ".join(stale)


def fake_package(tmp_path: Path, files: dict[str, str]) -> Path:
    root = tmp_path / "dayzero"
    for rel, text in {"__init__.py": "", **files}.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    return root


def test_the_checker_finds_a_cycle_through_a_deferred_import(tmp_path):
    root = fake_package(tmp_path, {
        "specs/__init__.py": "", "planner/__init__.py": "",
        "specs/model.py": "import numpy\n",
        "planner/memory.py": "from dayzero.specs.model import X\nfrom dayzero.planner import perf\n",
        "planner/perf.py": "def f():\n    from dayzero.planner.memory import g\n",
        "planner/typed.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .memory import T\n",
    })
    graph = import_graph(root)
    assert graph["dayzero.planner.memory"] == {"dayzero.specs.model", "dayzero.planner.perf"}
    assert graph["dayzero.planner.typed"] == set()
    assert find_cycle(graph) == ["dayzero.planner.memory", "dayzero.planner.perf", "dayzero.planner.memory"]
    allowed = {("dayzero.planner.perf", "dayzero.planner.memory"): "a test"}
    assert find_cycle(checked_graph(root, allowed)) is None


def test_the_checker_finds_an_import_up_the_layers(tmp_path):
    root = fake_package(tmp_path, {
        "specs/__init__.py": "", "cli/__init__.py": "",
        "specs/model.py": "def f():\n    from dayzero.cli import common\n",
        "cli/common.py": "from dayzero.specs.model import f\n",
    })
    graph = import_graph(root)
    assert upward_edges(graph, LAYERS, {}) == ["dayzero.specs.model -> dayzero.cli.common"]
    assert upward_edges(graph, LAYERS, {("dayzero.specs.model", "dayzero.cli.common"): "a test"}) == []
    with pytest.raises(AssertionError, match="'newpkg' is in no layer"):
        layer_of("dayzero.newpkg.x", LAYERS)
    assert layer_of("dayzero.planner.memory.replay", LAYERS) < layer_of("dayzero.planner.search.search", LAYERS)
    assert layer_of("dayzero.planner.schedule", LAYERS) == layer_of("dayzero.planner", LAYERS)
    assert layer_of("dayzero.runtime.device", LAYERS) < layer_of("dayzero.ops.manifest", LAYERS)
