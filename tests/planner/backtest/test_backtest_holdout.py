"""Leave-one-source-group-out re-uses work between its many evaluations (row batches, group
placements, memoised collective times, one shared first simplex) and must give exactly the numbers
of evaluating every row afresh each time."""

from __future__ import annotations

import csv
from dataclasses import replace

import numpy as np
import pytest

from dayzero.planner.backtest.backtest import (
    CONSTANT_BOUNDS,
    FIT_FIELDS,
    batch_cases,
    in_bounds,
    leave_one_group_out,
    predict_batches,
)
from dayzero.planner.backtest.published import load_cases, read_rows
from dayzero.planner.perf.calibration import PerfConstants, rates
from dayzero.planner.perf.collectives import group_collective
from dayzero.planner.perf.comm import coll
from dayzero.planner.perf.minimize import nelder_mead
from dayzero.planner.perf.perf import evaluate, placement
from dayzero.specs.grid import encode
from helpers.paths import data_file

CSV = data_file("published_runs_dev.csv")


@pytest.fixture(scope="module")
def cases():
    return load_cases(CSV)[0]


def fresh(case, constants: PerfConstants) -> float:
    """One row evaluated on its own, nothing re-used."""
    options = replace(case.options, constants=constants)
    ev = evaluate(case.spec, encode([case.parallel]), case.cluster, options, layer_split=case.parallel.layer_split)
    return float(ev.tokens_per_s_per_device[0])


def test_collective_memo_returns_the_formula_read_only(cases):
    case = next(c for c in cases if c.parallel.tp > 1 and c.parallel.dp > 1)
    grid = encode([case.parallel])
    placed = placement(grid, case.cluster)
    r = rates(case.cluster, PerfConstants())
    nbytes = np.array([3.0e8])
    first = coll("all_reduce", nbytes, placed, "dp_cp", r)
    size, per, doms = placed["dp_cp"]
    assert np.array_equal(first, group_collective("all_reduce", nbytes, size, per, doms, r.intra, r.inter))
    assert coll("all_reduce", nbytes, placed, "dp_cp", r) is first  # paid once
    assert not first.flags.writeable  # shared between evaluations: nobody may change it in place
    other = coll("all_reduce", 2 * nbytes, placed, "dp_cp", r)  # other bytes: another entry
    assert other[0] > first[0]
    slower = rates(case.cluster, replace(PerfConstants(), inter_eff=0.45))  # other links: another entry
    if r.inter is not None and doms[0] > 1:
        assert coll("all_reduce", nbytes, placed, "dp_cp", slower)[0] > first[0]


def test_batches_reused_across_constants_predict_as_fresh_rows(cases):
    batches = batch_cases(cases)
    for k, scale in enumerate((0.70, 0.95, 0.70)):  # back to the first: warm memos must not leak
        c = replace(PerfConstants(), gemm_scale_bf16=scale, layer_overhead_s=0.001 * (k + 1))
        got = predict_batches(batches, len(cases), c)
        want = np.array([fresh(case, c) for case in cases])
        assert np.array_equal(got, want)


def naive_holdout(cases, iterations: int, step: float) -> dict:
    """leave_one_group_out as first written: every loss evaluates every training row afresh."""
    start = PerfConstants()
    x0 = np.log([getattr(start, f) for f in FIT_FIELDS])
    out = {}
    for g in sorted({c.source_group for c in cases}):
        train = [c for c in cases if c.source_group != g]
        published = np.array([c.published for c in train])

        def make(x):
            return replace(start, **{f: float(np.exp(v)) for f, v in zip(FIT_FIELDS, x)})

        def loss(x):
            c = make(x)
            if not all(in_bounds(getattr(c, f), CONSTANT_BOUNDS[f]) for f in FIT_FIELDS):
                return 1e9
            pred = np.array([fresh(case, c) for case in train])
            return float(np.mean(np.abs(pred - published) / published))

        x, _ = nelder_mead(loss, x0, iterations, step)
        constants = make(x)
        for case in cases:
            if case.source_group == g:
                out[case.id] = fresh(case, constants)
    return out


def test_leave_one_group_out_equals_refitting_from_scratch(tmp_path):
    rows = read_rows(CSV)
    by_group: dict[str, list[dict]] = {}
    for row in rows:
        by_group.setdefault(row["source_group"] or row["source"], []).append(row)
    picked = [r for g in sorted(by_group) for r in by_group[g][:8]]  # a few rows of every group
    path = tmp_path / "subset.csv"
    with path.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(picked)
    cases = load_cases(path)[0]
    assert len({c.source_group for c in cases}) >= 2
    got = leave_one_group_out(path, iterations=4, step=0.05)
    want = naive_holdout(cases, iterations=4, step=0.05)
    assert {r["id"]: r["predicted"] for r in got["rows"]} == want
    errors = [(want[c.id] - c.published) / c.published for c in cases]
    assert got["overall"]["mape"] == pytest.approx(float(np.mean(np.abs(errors))), rel=1e-12)
