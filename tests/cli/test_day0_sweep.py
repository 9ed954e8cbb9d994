"""``dayzero day0`` never dies on a finding: every preset on a card of each catalog family (CUDA,
ROCm, Ascend), with and without torch, and a model derived from its own modeling code, each ends
in a complete report (tests/helpers/day0_sweep.py says what complete means). The fast lane runs a
sample; the slow lane the whole sweep (also ``benchmarks/bench_day0_sweep.py``, timed)."""

from __future__ import annotations

import importlib.util
import shutil

import pytest

from helpers import day0_sweep as sweep
from helpers.paths import DATA

TORCH = all(importlib.util.find_spec(m) is not None for m in ("torch", "transformers"))


@pytest.fixture(scope="module")
def shared():
    with sweep.shared_work():
        yield


@pytest.mark.parametrize("case", sweep.sample(TORCH), ids=lambda c: c.name)
def test_sample_ends_in_a_complete_report(case, tmp_path, shared):
    o = sweep.run(case, tmp_path / "human")
    assert sweep.problems(o) == []
    o = sweep.run(case, tmp_path / "json", json_out=True)
    assert sweep.problems(o, json_out=True) == []


@pytest.mark.slow
@pytest.mark.parametrize("case", sweep.full_grid(TORCH), ids=lambda c: c.name)
def test_every_preset_on_every_family(case, tmp_path, shared):
    assert sweep.problems(sweep.run(case, tmp_path)) == []


def test_a_crashing_render_input_is_a_finding_not_an_exception():
    """The shapes a section may meet (issue 34: operators as records, not names) render as text."""
    from dayzero.report.table import Table, cell_text

    assert cell_text([{"op": "aten.histc.default", "flops_share": 0.0}]) == "aten.histc.default"
    assert cell_text({"a": 1, "b": [2.5, None]}) == "a: 1, b: 2.5, —"
    assert cell_text(3) == "3" and cell_text(True) == "yes" and cell_text(None) == "—"
    t = Table("t", ("", ""), (("x", [{"name": "k1"}, {"name": "k2"}]),), ["n1", "n2"])
    assert t.rows == (("x", "k1, k2"),) and t.note == "n1, n2"


@pytest.mark.slow
@pytest.mark.skipif(not TORCH, reason="a derived model is built from its code by torch and transformers")
def test_a_model_with_its_own_modeling_code(tmp_path, shared):
    model = tmp_path / "tinyx"
    shutil.copytree(DATA / "remote_tinyx", model)
    for acc in ("h100", "910b"):
        case = sweep.Case(str(model), acc, True, devices=8, extra=("--gbs", "64", "--trust-remote-code"))
        o = sweep.run(case, tmp_path / acc)
        assert sweep.problems(o) == []
        assert "approximation" in o.out  # the summary says what the numbers rest on
