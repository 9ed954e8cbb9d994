"""Option groups: a verb's related flags declared once as a frozen dataclass whose fields are typer
options (``Annotated[type, typer.Option(...)]`` with their defaults), so that a verb with many flags
takes a few typed objects instead of dozens of keyword arguments.

:func:`takes_groups` puts each group's fields in place of the verb's parameter of that name (the same
flag names, aliases, defaults, help and order a flat signature gives) and hands the verb one instance
per group, as :func:`dayzero.cli.common.takes_layout` does for the layout flags."""

from __future__ import annotations

import functools
import inspect
import typing
from dataclasses import fields


def group_parameters(cls: type) -> list[inspect.Parameter]:
    """The keyword-only parameters a group's fields become (its typer options and their defaults)."""
    hints = typing.get_type_hints(cls, include_extras=True)
    return [inspect.Parameter(f.name, inspect.Parameter.KEYWORD_ONLY, annotation=hints[f.name], default=f.default)
            for f in fields(cls)]


def takes_groups(**groups: type):
    """Decorator: each parameter named in ``groups`` becomes the fields of its group (a frozen
    dataclass of typer options), in its place; the verb receives one instance of the group."""
    names = {g: [f.name for f in fields(cls)] for g, cls in groups.items()}

    def wrap(fn):
        sig = inspect.signature(fn, eval_str=True)
        missing = sorted(set(groups) - set(sig.parameters))
        if missing:
            raise TypeError(f"{fn.__name__} has no parameter {', '.join(missing)}")
        params, keyword = [], False
        for p in sig.parameters.values():
            keyword = keyword or p.default is not p.empty or p.name in groups
            if p.name in groups:
                params += group_parameters(groups[p.name])
            else:
                params.append(p.replace(kind=inspect.Parameter.KEYWORD_ONLY) if keyword else p)

        @functools.wraps(fn)
        def verb(*args, **kwargs):
            made = {g: groups[g](**{n: kwargs.pop(n) for n in names[g] if n in kwargs}) for g in groups}
            return fn(*args, **made, **kwargs)

        verb.__signature__ = sig.replace(parameters=params)
        verb.__annotations__ = {p.name: p.annotation for p in params}
        return verb

    return wrap
