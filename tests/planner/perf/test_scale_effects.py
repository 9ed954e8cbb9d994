"""The wait for the slowest rank (planner.perf.scale_effects) and its place in the step time."""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pytest

from dayzero.planner.perf.calibration import PerfConstants
from dayzero.planner.perf.perf import PerfOptions, evaluate
from dayzero.planner.perf.scale_effects import straggler_factor
from dayzero.specs.cluster import build_cluster
from dayzero.specs.grid import encode
from dayzero.specs.parallel import ParallelConfig
from dayzero.specs.registry import load_model


def test_straggler_factor_is_the_gaussian_maximum_asymptote():
    """Expected maximum of N normals ~ mu + sigma sqrt(2 ln N) (Cramer 1946 sec. 28.6; Dean &
    Barroso, "The Tail at Scale", CACM 2013). Hand value: N = 1024, sigma = 0.01:
    sqrt(2 ln 1024) = sqrt(13.8629) = 3.7233, factor 1.037233; N = 1: no wait."""
    assert float(straggler_factor(1024, 0.01)) == pytest.approx(1.037233, abs=1e-6)
    assert float(straggler_factor(1, 0.05)) == 1.0
    assert float(straggler_factor(16384, 0.0)) == 1.0
    f = straggler_factor(np.array([8, 64, 512, 4096]), 0.01)
    assert np.all(np.diff(f) > 0)  # grows with the synchronised ranks
    assert f[-1] - 1 == pytest.approx(0.01 * math.sqrt(2 * math.log(4096)), rel=1e-12)


def test_step_waits_for_the_slowest_of_the_world():
    """The straggler term is the step without it times sigma sqrt(2 ln N), N = tp pp dp cp = 64."""
    spec, cluster = load_model("llama-3.1-8b"), build_cluster("h100", 64)
    p = ParallelConfig(tp=2, pp=1, dp=32, mbs=1, gbs=256, seq=8192)
    base = evaluate(spec, encode([p]), cluster)
    jit = evaluate(spec, encode([p]), cluster, PerfOptions(constants=replace(PerfConstants(), step_jitter=0.01)))
    assert float(base.straggler_s[0]) == 0.0
    want = 0.01 * math.sqrt(2 * math.log(64))  # 0.028840
    assert float(jit.straggler_s[0] / base.step_s[0]) == pytest.approx(want, rel=1e-9)
    assert float(jit.step_s[0]) == pytest.approx(float(base.step_s[0]) * (1 + want), rel=1e-12)


def test_a_cluster_file_sets_the_jitter_and_its_range_is_checked():
    """``efficiency.step_jitter`` in a cluster file reaches the constants; a negative std is refused."""
    from dayzero.errors import ConfigError
    from dayzero.planner.perf.calibration import constants_for
    from dayzero.specs.cluster import cluster_from_dict

    cl = cluster_from_dict({"accelerator": "h100", "nodes": 2, "efficiency": {"step_jitter": 0.02}}, "jit")
    assert constants_for(cl).step_jitter == 0.02
    with pytest.raises(ConfigError):
        PerfConstants().with_overrides({"step_jitter": -0.01}, "test")
