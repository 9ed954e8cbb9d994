"""The losses one named run of a batch of rank groups wrote (the layout-equality tests' records)."""

from __future__ import annotations


def run_losses(runs, name: str, steps: int) -> list[float]:
    """``runs`` = (records by run name: (step records, end record), exit codes by world size): the
    losses of run ``name``, which must have written ``steps`` steps and its end record."""
    records, codes = runs
    assert name in records, f"{name} wrote no metrics (exit codes by world size: {codes})"
    got, end = records[name]
    assert len(got) == steps and end is not None
    return [r["loss"] for r in got]
