"""For every published run with a full layout, the search finds a plan predicted at least as fast
as the layout the experts picked (among layouts needing no more memory than theirs)."""

from __future__ import annotations

import numpy as np
import pytest

from dayzero.planner.backtest.published import load_cases
from dayzero.planner.memory.memory import MemoryOptions, peak_memory_batch
from dayzero.planner.perf.perf import evaluate
from dayzero.planner.search.search import search
from dayzero.specs.grid import encode
from helpers.paths import data_file

pytestmark = pytest.mark.slow


def _groups():
    """Rows with a full layout, one per distinct (model, cluster, layout, options)."""
    seen = {}
    for case in load_cases(data_file("published_runs_dev.csv"))[0]:
        if not case.full_layout:
            continue
        key = (case.spec, case.cluster.name, case.cluster.devices, case.parallel, case.options)
        seen.setdefault(key, case)
    return list(seen.values())


def pytest_generate_tests(metafunc):
    """Rows are read when this module's tests are generated, not at import."""
    if "case" in metafunc.fixturenames:
        cases = _groups()
        metafunc.parametrize("case", cases, ids=[c.id for c in cases])


def test_search_is_at_least_as_fast_as_the_published_layout(case):
    p = case.parallel
    grid = encode([p])
    published = float(evaluate(case.spec, grid, case.cluster, case.options, layer_split=p.layer_split).step_s[0])
    opts = MemoryOptions.for_run(case.cluster.accelerator, case.options.attention_kernel)
    peak = float(peak_memory_batch(case.spec, grid, case.cluster.memory_bytes, opts)[0])
    limit = peak / case.cluster.memory_bytes * (1 + 1e-9)
    # a blank recompute setting is read as the fastest that fits among every distinct module set
    # (planner.backtest.row_memory.recompute_modules_sets), the sets the search tries by default
    result = search(case.spec, case.cluster, p.gbs, p.seq, p.precision, case.options, top_k=1, max_memory=limit)
    assert result.evaluation.step_s[0] <= published * (1 + 1e-9), (case.id, p.describe())
    assert np.isfinite(result.evaluation.step_s[0])
