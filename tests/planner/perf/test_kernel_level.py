"""The engine's kernel level: eager and compiled engines move the memory-bound bytes fused kernels save."""

from __future__ import annotations

import pytest

from dayzero.errors import ConfigError
from dayzero.planner.perf.calibration import constants_for, rates
from dayzero.planner.perf.compute import BF16, compute_costs
from dayzero.planner.perf.kernel_level import (
    RMSNORM_EXTRA,
    ROPE_EXTRA,
    SWIGLU_EXTRA,
    check_kernel_level,
    engine_kernel_level,
)
from dayzero.planner.perf.perf import PerfOptions
from dayzero.specs.cluster import build_cluster
from dayzero.specs.grid import encode
from dayzero.specs.parallel import ParallelConfig
from dayzero.specs.registry import load_model

LLAMA8 = load_model("llama-3.1-8b")
H100 = build_cluster("h100", 8)


def _layer(level: str, p: ParallelConfig):
    consts = constants_for(H100)
    c = compute_costs(LLAMA8, encode([p]), rates(H100, consts), consts, kernel_level=level)
    return float(c.fwd[0, 0]), float(c.bwd[0, 0]), consts


def test_eager_layer_exceeds_fused_by_the_unfused_bytes_over_hbm():
    """Per token, the closed form of the Hugging Face Llama layer's eager ops: two RMSNorms, RoPE
    on q and k, repeat_kv's two copies, SwiGLU's silu and mul (kernel_level docstring)."""
    p = ParallelConfig(tp=1, pp=1, dp=8, mbs=1, gbs=64, seq=4096)
    (f_fused, b_fused, consts), (f_eager, b_eager, _) = _layer("fused", p), _layer("eager", p)
    a, H, f = LLAMA8.attention, LLAMA8.hidden, LLAMA8.mlp.intermediate
    T = p.mbs * p.seq
    rotated = (a.heads + a.kv_heads) * a.head_dim
    rep = 2 * (a.heads + a.kv_heads) * a.head_dim
    fwd_el = T * (2 * RMSNORM_EXTRA[0] * H + ROPE_EXTRA[0] * rotated + rep + SWIGLU_EXTRA[0] * f)
    bwd_el = T * (2 * RMSNORM_EXTRA[1] * H + ROPE_EXTRA[1] * rotated + rep + SWIGLU_EXTRA[1] * f)
    per_el = BF16 * consts.memory_scale / H100.accelerator.hbm_bw
    assert f_eager - f_fused == pytest.approx(fwd_el * per_el, rel=1e-9)
    assert b_eager - b_fused == pytest.approx(bwd_el * per_el, rel=1e-9)
    # compile fuses the pointwise chains: only repeat_kv's copies stay
    f_comp, b_comp, _ = _layer("compile", p)
    assert f_comp - f_fused == pytest.approx(T * rep * per_el, rel=1e-9)
    assert f_fused < f_comp < f_eager and b_fused < b_comp < b_eager


def test_full_recompute_replays_the_eager_forward():
    base = dict(tp=1, pp=1, dp=8, mbs=1, gbs=64, seq=4096)
    none, full = ParallelConfig(**base), ParallelConfig(**base, recompute="full")
    gap_none = _layer("eager", none)[1] - _layer("fused", none)[1]
    gap_full = _layer("eager", full)[1] - _layer("fused", full)[1]
    fwd_gap = _layer("eager", none)[0] - _layer("fused", none)[0]
    assert gap_full == pytest.approx(gap_none + fwd_gap, rel=1e-9)


def test_levels_and_engines():
    assert engine_kernel_level("NeMo (Megatron-Core)") == "fused"
    assert engine_kernel_level("MindSpeed-LLM") == "fused"
    assert engine_kernel_level("torchtitan (FSDP2)") == "eager"
    assert engine_kernel_level("torchtitan (FSDP2, torch.compile)") == "compile"
    assert engine_kernel_level("Megatron-DeepSpeed") == "fused"
    assert engine_kernel_level("") == "fused"
    with pytest.raises(ConfigError, match="kernel-level"):
        check_kernel_level("triton")
    with pytest.raises(ConfigError, match="kernel-level"):
        PerfOptions(kernel_level="jit")


@pytest.mark.slow
def test_closed_form_equals_the_traced_eager_ops():
    """The RMSNorm and SwiGLU coefficients are what `dayzero ops` records for Hugging Face Llama's
    own code: per normed element 2 + 16 forward, 4 + 45 backward; per MLP-width element 3 + 2
    forward, 6 + 3 backward (the fused count plus the eager extra)."""
    pytest.importorskip("transformers")
    from dayzero.ops.trace import trace_model

    seq = 256
    tr = trace_model("llama-3.1-8b", seq=seq, batch=1)
    H, f = LLAMA8.hidden, LLAMA8.mlp.intermediate
    units = {}
    for c in tr.calls:
        if c.layer is None or not c.kernel or c.flops:
            continue
        width = c.shapes[0][-1] if c.shapes else 0
        if c.category == "norm" or (c.category == "mlp" and width == f):
            key = (c.phase, c.category)
            units[key] = units.get(key, 0.0) + c.bytes / (seq * BF16)
    assert units[("forward", "norm")] / (2 * H) == pytest.approx(2 + RMSNORM_EXTRA[0], rel=0.01)
    assert units[("backward", "norm")] / (2 * H) == pytest.approx(4 + RMSNORM_EXTRA[1], rel=0.01)
    assert units[("forward", "mlp")] / f == pytest.approx(3 + SWIGLU_EXTRA[0], rel=0.01)
    assert units[("backward", "mlp")] / f == pytest.approx(6 + SWIGLU_EXTRA[1], rel=0.01)
