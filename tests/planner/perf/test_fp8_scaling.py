"""Block-scaled FP8 (DeepSeek-V3 sec. 3.3.2: 1 x 128 activation tiles, 128 x 128 weight blocks,
FP32 promotion on CUDA cores every 128 elements of K) priced from DeepGEMM's measured H800 rates
(README of its 2025-02 release), against values worked by hand."""

from dataclasses import replace

import numpy as np
import pytest

from dayzero.errors import ConfigError
from dayzero.planner.perf.calibration import PerfConstants, rates
from dayzero.planner.perf.compute import compute_costs
from dayzero.planner.perf.fp8_scaling import BLOCK_DENSE_RATIO, BLOCK_GROUPED_RATIO, measured_ratios
from dayzero.planner.perf.perf import PerfOptions
from dayzero.specs.cluster import build_cluster
from dayzero.specs.grid import encode
from dayzero.specs.parallel import ParallelConfig
from dayzero.specs.registry import load_model


def test_ratios_are_deepgemm_over_the_planners_per_tensor_rate():
    """One row by hand: DeepGEMM's 4096 x 7168 x 16384 normal GEMM, 1,358 TFLOP/s on H800. The
    planner's per-tensor FP8 rate there: 1,978.9 x 0.7747 (catalog median MAMF ratio x
    gemm_scale_fp8) x 4096 / (4096 + 36.26) = 1,519.6 TFLOP/s: ratio 0.894. The medians over
    the six normal and the four grouped rows (the latter capped at 1) are the module's constants
    (0.691, 1.0); this fails when a refit of the constants moves them, and they then want
    refreshing."""
    c = PerfConstants()
    eff = rates(build_cluster("h800", 16), c).gemm_eff["fp8"]
    assert eff == pytest.approx(0.7747, abs=1e-4)
    planner = 1978.9e12 * eff * 4096 / (4096 + c.gemm_half_dim)
    assert 1358e12 / planner == pytest.approx(0.894, abs=1e-3)
    dense, grouped = measured_ratios(eff, c.gemm_half_dim, c.moe_gemm_scale)
    assert dense == pytest.approx(BLOCK_DENSE_RATIO, abs=1e-3)
    assert min(1.0, grouped) == pytest.approx(BLOCK_GROUPED_RATIO, abs=1e-3)


def _costs(spec, precision, scaling):
    cluster = build_cluster("h800", 8)
    r = replace(rates(cluster, PerfConstants()), fp8_scaling=scaling)
    grid = encode([ParallelConfig(tp=1, dp=8, mbs=1, gbs=8, seq=4096, precision=precision)])
    return compute_costs(spec, grid, r, PerfConstants())


def test_block_scaling_slows_dense_fp8_gemms_only():
    """A dense model's layer GEMMs all run in FP8 (none in BF16: no router), so block scaling
    divides their rate by 0.691: GEMM forward seconds x 1 / 0.691 = 1.4472; BF16 layouts and
    per-tensor FP8 are unchanged."""
    spec = load_model("llama-3.1-8b")
    tensor, block = _costs(spec, "fp8", "tensor"), _costs(spec, "fp8", "block")
    np.testing.assert_allclose(block.gemm_fwd / tensor.gemm_fwd, 1 / BLOCK_DENSE_RATIO, rtol=1e-9)
    assert 1 / BLOCK_DENSE_RATIO == pytest.approx(1.4472, abs=1e-4)
    np.testing.assert_allclose(_costs(spec, "bf16", "block").gemm_fwd, _costs(spec, "bf16", "tensor").gemm_fwd)
    with pytest.raises(ConfigError):
        PerfOptions(fp8_scaling="mx")
