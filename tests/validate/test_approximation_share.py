"""validate on a derived model: how much of the measured-vs-predicted difference its approximated
terms (what the prediction adds to the planner's own shapes) can account for."""

from __future__ import annotations

import pytest

from dayzero.report.validation import share_lines, to_markdown
from dayzero.validate.run import approximation_share, shapes_only


def _pred(step, peak):
    return {"time": {"step_s": step}, "memory": {"peak_bytes": peak}}


def test_the_share_bounds_what_the_terms_can_explain():
    """Predicted 1.2 s of which 0.1 s are the approximated terms; measured 1.0 s: the difference is
    +0.2 s and the terms can explain at most half of it. Memory: terms 0, so none of its difference."""
    got = approximation_share({"step_time_s": 1.0, "peak_memory_bytes": 100}, _pred(1.2, 120), _pred(1.1, 120))
    assert got["step_time"]["terms"] == pytest.approx(0.1) and got["step_time"]["share"] == pytest.approx(0.5)
    assert got["peak_memory"]["share"] == 0.0 and got["peak_memory"]["difference"] == 20
    big = approximation_share({"step_time_s": 1.0, "peak_memory_bytes": 100}, _pred(1.05, 100), _pred(0.5, 100))
    assert big["step_time"]["share"] == 1.0  # terms larger than the difference: all of it
    assert big["peak_memory"]["share"] == 0.0  # no difference, no terms
    lines = share_lines({"approximation_share": got})
    assert "at most 50%" in lines[0] and "+0.1 s" in lines[0]
    md = to_markdown({"run": {"model": "m", "approximations": ["a"], "approximation_share": got}})
    assert "## Approximations" in md and "at most 50%" in md


def test_shapes_only_drops_the_terms_the_shapes_do_not_give():
    import dataclasses

    from dayzero.specs.registry import load_model

    spec = dataclasses.replace(load_model("llama-3.1-8b"), layer_extra=(5,) * 32, outside_extra=7,
                               layer_flops_extra=((1.0, 0.0),) * 32)
    bare = shapes_only(spec)
    assert not any(bare.layer_extra) and bare.outside_extra == 0 and not any(a or b for a, b in bare.layer_flops_extra)
    assert bare.hidden == spec.hidden and bare.layers == spec.layers
