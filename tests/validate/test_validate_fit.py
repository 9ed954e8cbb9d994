"""The calibration loop recovers efficiency constants from step times the planner generated."""

import numpy as np
import pytest

from dayzero.errors import ConfigError
from dayzero.specs.cluster import cluster_from_dict
from dayzero.specs.parallel import ParallelConfig as P
from dayzero.specs.registry import load_model
from dayzero.validate.fit import Observation, fit, predict_steps, spearman, with_efficiency
from dayzero.validate.profile import build_profile
from helpers.measurements import measurements

LAYOUTS = [P(dp=8, mbs=2, gbs=16, seq=256), P(tp=2, dp=4, mbs=2, gbs=16, seq=256),
           P(tp=4, dp=2, mbs=2, gbs=16, seq=256, zero=0), P(tp=2, pp=2, dp=2, mbs=2, gbs=16, seq=256),
           P(pp=2, dp=4, mbs=1, gbs=16, seq=256, zero=3), P(tp=2, dp=4, mbs=2, gbs=16, seq=256, recompute="full")]


def test_spearman():
    assert spearman([1, 2, 3, 4], [10, 20, 30, 40]) == pytest.approx(1.0)
    assert spearman([1, 2, 3, 4], [4, 3, 2, 1]) == pytest.approx(-1.0)
    assert spearman([1, 2, 2, 3], [1, 2, 3, 4]) == pytest.approx(np.corrcoef([1, 2.5, 2.5, 4], [1, 2, 3, 4])[0, 1])
    assert spearman([1, 2], [1, 2]) is None


def test_fit_recovers_constants_from_planner_generated_runs():
    cl = cluster_from_dict(build_profile(measurements()), "host")
    spec = load_model("tiny-llama")
    truth = {"gemm_bf16": 0.7, "layer_overhead_s": 0.004, "intra": 0.6, "memory_scale": 2.0}
    obs0 = [Observation(p.describe(), spec, p, "fp32", 1.0) for p in LAYOUTS]
    measured = predict_steps(obs0, with_efficiency(cl, truth))
    obs = [Observation(o.label, o.spec, o.parallel, "fp32", float(t)) for o, t in zip(obs0, measured)]
    r = fit(obs, cl)
    assert r["after"]["median_abs_rel_error"] < 0.02 < r["before"]["median_abs_rel_error"]
    assert r["fitted"]["gemm_bf16"] == pytest.approx(0.7, rel=0.1)
    assert r["fitted"]["layer_overhead_s"] == pytest.approx(0.004, rel=0.15)
    assert r["after"]["spearman"] == pytest.approx(1.0)
    # one run: only the first key is fitted
    assert fit(obs[:1], cl)["keys"] == ["gemm_bf16"]


def test_fit_rejects_unknown_keys_and_no_runs():
    cl = cluster_from_dict(build_profile(measurements()), "host")
    with pytest.raises(ConfigError):
        fit([], cl)
    spec = load_model("tiny-llama")
    with pytest.raises(ConfigError, match="not a fittable"):
        fit([Observation("a", spec, LAYOUTS[0], "fp32", 1.0)], cl, keys=("bogus",))
