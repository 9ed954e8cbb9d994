"""A layout as the command-line flags that reproduce it (``--tp 8 --pp 2 ...``): the inverse of
:mod:`dayzero.specs.layout_options`, for the next-step commands the verbs print and for the
launches ``dayzero export`` writes. Each field's spelling is declared once, in
:mod:`dayzero.specs.layout_fields`."""

from __future__ import annotations

from typing import Any, Mapping

from dayzero.specs.layout_fields import FIELDS, not_train_flags, written


def layout_flags(p: Mapping[str, Any], precision: bool = True) -> list[str]:
    """The ``--tp .. --pp ..`` flags that reproduce a layout (a ``ParallelConfig.to_dict()`` or the
    ``parallel`` of plan/predict JSON): the degrees and batch always, the rest where they differ
    from the default (layout_fields.written). ``--precision`` is the memory and runtime precision;
    ``precision=False`` for verbs without the flag (``dayzero validate``)."""
    out: list[str] = []
    for f in FIELDS:
        if precision or f.name != "precision":
            out += written(f, p)
    return out


def train_layout(p: Mapping[str, Any]) -> dict:
    """A plan's layout as ``dayzero train``'s flags take it: the fields it has no flag for
    (layout_fields.not_train_flags: the memory switches, activation offload, rank order) at their
    defaults (export.job.unexpressed names what was left out)."""
    return {**p, **{f.name: f.default for f in not_train_flags()}}
