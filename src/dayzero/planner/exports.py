"""Lazy package exports: a room of the planner names its public functions at its top
(``from dayzero.planner.memory import estimate_memory``) without importing any of its modules until
one of those names is asked for, so importing one module of a room costs that module alone."""

from __future__ import annotations

import importlib


def lazy_exports(package: str, exports: dict[str, str]):
    """``(__getattr__, __dir__)`` for ``package``, which exports each name of ``exports`` ({name:
    the module of ``package`` that defines it}); a name that is also a module of the package is
    not exported (after that module's import the package attribute is the module)."""

    def __getattr__(name: str):
        module = exports.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        return getattr(importlib.import_module(f"{package}.{module}"), name)

    def __dir__() -> list[str]:
        return sorted(exports)

    return __getattr__, __dir__
