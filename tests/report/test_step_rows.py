"""The Day-0 report's step table lists terms that add up to the step, the straggler term
(planner.perf.scale_effects) only when a sigma is set."""

import pytest

from dayzero.planner.perf.calibration import PerfConstants
from dayzero.planner.perf.perf import PerfOptions
from dayzero.planner.predict import predict
from dayzero.report.day0_render import step_rows
from dayzero.specs.cluster import build_cluster
from dayzero.specs.parallel import ParallelConfig
from dayzero.specs.registry import load_model


def _rows(sigma: float):
    spec, cl = load_model("llama-3.1-8b"), build_cluster("h100", 64)
    p = ParallelConfig(tp=2, dp=32, gbs=64, seq=4096)
    t = predict(spec, p, cl, PerfOptions(constants=PerfConstants(step_jitter=sigma)))["time"]
    return {r[0]: float(r[1]) for r in step_rows(t)}


def test_the_listed_terms_add_up_to_the_step_with_and_without_stragglers():
    quiet, noisy = _rows(0.0), _rows(0.01)
    assert "stragglers" not in quiet and noisy["stragglers"] > 0
    for rows in (quiet, noisy):
        assert sum(v for k, v in rows.items() if k != "step") == pytest.approx(rows["step"], abs=2e-3)
