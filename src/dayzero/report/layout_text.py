"""A layout in one line, as every verb and report writes it: ParallelConfig.describe, one spelling
(tp8 pp8 dp128 vpp24 zero3 mbs2 gbs4096 full sp)."""

from __future__ import annotations


def describe(p: dict) -> str:
    """The layout string of a ``parallel`` JSON object."""
    from dayzero.specs.parallel import ParallelConfig

    return ParallelConfig.from_dict(p).describe()
