"""The planner's rooms (memory, perf, search, backtest): each exports names that are its modules'
own objects, never a name one of its modules also has (the module would shadow it once imported),
and its docstring names every module in it."""

from __future__ import annotations

import importlib
from pathlib import Path

import pytest

from dayzero.planner.exports import lazy_exports

ROOMS = ("memory", "perf", "search", "backtest")


def modules_of(room) -> set[str]:
    return {p.stem for p in Path(room.__file__).parent.glob("*.py")} - {"__init__"}


@pytest.mark.parametrize("name", ROOMS)
def test_exports_are_the_modules_objects(name):
    room = importlib.import_module(f"dayzero.planner.{name}")
    assert room.__all__ == sorted(room.EXPORTS)
    for export, module in room.EXPORTS.items():
        assert export not in modules_of(room)
        assert getattr(room, export) is getattr(importlib.import_module(f"{room.__name__}.{module}"), export)


@pytest.mark.parametrize("name", ROOMS)
def test_docstring_names_every_module(name):
    room = importlib.import_module(f"dayzero.planner.{name}")
    missing = [m for m in sorted(modules_of(room)) if f"``{m}``" not in room.__doc__]
    assert not missing, f"dayzero.planner.{name}'s docstring does not name {missing}"


def test_unknown_name_is_an_attribute_error():
    getattr_, dir_ = lazy_exports("dayzero.planner.memory", {"estimate_memory": "memory"})
    assert dir_() == ["estimate_memory"]
    with pytest.raises(AttributeError, match="no attribute 'nothing'"):
        getattr_("nothing")
