"""Physical effects behind the MoE rows of the backtest (issue 16: MoE cross-source error), each
against a hand-computed value and its source."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from dayzero.planner.backtest.published import case_of, read_rows
from dayzero.planner.perf.calibration import PerfConstants, rates
from dayzero.planner.perf.compute import compute_costs, layer_classes
from dayzero.specs.grid import encode
from helpers.paths import data_file

CSV = data_file("published_runs_dev.csv")


@pytest.fixture(scope="module")
def rows():
    return {r["id"]: r for r in read_rows(CSV)}


def _costs(case, kernel=None):
    c = PerfConstants()
    grid = {k: np.asarray(v) for k, v in encode([case.parallel]).items()}
    return compute_costs(case.spec, grid, rates(case.cluster, c), c, 1.0, kernel or case.options.attention_kernel)


def test_sink_attention_runs_fused_and_windowed_layers_cost_their_window(rows):
    """Transformer Engine 2.8 runs learnable softmax sinks in cuDNN fused attention (BSHD/SBHD,
    cuDNN >= 9.13.1; https://github.com/NVIDIA/TransformerEngine/pull/2148), so a Megatron-Bridge
    gpt-oss-120b row (R0241) is predicted with the fused kernel, and its 128-token sliding-window
    layers cost their window, not the whole causal square. By hand at seq 4096: a window layer's
    query sees (128 * 129 / 2 + (4096 - 128) * 128) / 4096 = 126.02 keys on average, a full causal
    layer (4096 + 1) / 2 = 2048.5, a ratio of 0.06152."""
    case = case_of(rows["R0241"])
    assert case.spec.attention.sinks and case.options.attention_kernel == "fused"
    costs = _costs(case)
    classes = [(t, w) for t, w, _ in layer_classes(case.spec)]
    window = classes.index(("moe", 128))
    full = classes.index(("moe", None))
    ratio = costs.attn_fwd[window, 0] / costs.attn_fwd[full, 0]
    assert ratio == pytest.approx((128 * 129 / 2 + (4096 - 128) * 128) / 4096 / 2048.5, rel=1e-9)
    assert ratio == pytest.approx(0.06152, abs=1e-5)
    # unfused attention (what the planner assumed before) masks but does not skip: both classes equal
    unfused = _costs(case, "unfused")
    assert unfused.attn_fwd[window, 0] == pytest.approx(unfused.attn_fwd[full, 0])


def test_clamped_swiglu_runs_eagerly_and_moves_six_times_the_bytes_of_a_fused_swiglu(rows):
    """Megatron-Bridge's GPT-OSS provider sets bias_activation_fusion=False, so Megatron-Core's
    grouped experts run the clamped SwiGLU one torch op at a time (experts.py, TEGroupedMLP): per
    routed row of expert width f, forward element traffic 2 (gate clamp) + 2 (up clamp) + 2 (x alpha)
    + 2 (sigmoid) + 3 (gate x sigmoid) + 2 (up + 1) + 3 (product) + 2 (x routing probability) = 18 f,
    against 3 f for a fused SwiGLU (read gate and up, write the product). By hand for one gpt-oss-120b
    MoE layer of R0241 (mbs 4 x seq 4096 = 16,384 tokens, top-4: 65,536 routed rows, f = 2,880): the
    extra forward traffic is 65,536 x 15 x 2,880 x 2 B = 5.662 GB, i.e. 5.662e9 x memory_scale / HBM
    bandwidth seconds more in the forward and twice that in the backward."""
    from dayzero.planner.perf.compute import activation_elements
    from dayzero.specs.model import MLPSpec

    assert activation_elements(MLPSpec(2880, gated=True, activation="swiglu_clamped")) == 18.0
    assert activation_elements(MLPSpec(2880, gated=True)) == 3.0
    assert activation_elements(MLPSpec(2880, gated=False, activation="gelu")) == 2.0

    case = case_of(rows["R0241"])
    assert case.spec.moe.expert.activation == "swiglu_clamped"
    moe = case.spec.moe
    spec_fused = replace(case.spec, moe=replace(moe, expert=replace(moe.expert, activation="silu")))
    c = PerfConstants()
    r = rates(case.cluster, c)
    grid = {k: np.asarray(v) for k, v in encode([case.parallel]).items()}
    eager = compute_costs(case.spec, grid, r, c, 1.0, "fused")
    plain = compute_costs(spec_fused, grid, r, c, 1.0, "fused")
    extra = 65_536 * 15 * 2_880 * 2 * c.memory_scale / r.hbm_bw
    assert eager.fwd[0, 0] - plain.fwd[0, 0] == pytest.approx(extra, rel=1e-9)
    assert eager.bwd[0, 0] - plain.bwd[0, 0] == pytest.approx(2 * extra, rel=1e-9)


def test_each_moe_layer_forward_waits_once_on_the_dispatch_host_sync():
    """Megatron-Core's dropless all-to-all dispatcher copies the split sizes to the host and
    synchronises before the EP all-to-all (MoEAlltoAllTokenDispatcher.preprocess, cuda_sync_point
    "before_ep_alltoall", megatron/core/transformer/moe/token_dispatcher.py): the split-size
    exchange of each MoE layer forward costs ``moe_sync_s`` more, once more in the backward only
    where recompute replays the MoE module (full, or selective with ``moe``; not ``moe_act``), and
    nothing on a dense layer. By hand with moe_sync_s = 1 ms and no EP overlap: +1 / +2 / +2 / +1
    ms exposed per MoE layer and micro-batch for none / full / selective(moe) / selective(moe_act);
    with the overlap it is hidden like the all-to-all (at most 20/132 of it shows: the SMs the
    dispatch kernels hold); the first three layers of DeepSeek-V3 are dense."""
    from dayzero.planner.perf.comm import CommOptions, layer_comm, place_groups
    from dayzero.specs.cluster import build_cluster
    from dayzero.specs.hardware import get_accelerator
    from dayzero.specs.parallel import ParallelConfig
    from dayzero.specs.registry import load_model

    spec = load_model("deepseek-v3")
    cluster = build_cluster(get_accelerator("nvidia_h100_sxm"), 256)
    base = ParallelConfig(tp=1, pp=16, dp=16, ep=8, mbs=1, gbs=4096, seq=4096)
    layouts = [base, base.with_(recompute="full"), base.with_(recompute="selective", recompute_modules=("moe",)),
               base.with_(recompute="selective", recompute_modules=("moe_act",))]
    grid = {k: np.asarray(v) for k, v in encode(layouts).items()}
    kinds = [k for k, *_ in layer_classes(spec)]
    moe, dense = kinds.index("moe"), kinds.index("dense")

    def counts(sync: float, overlap: bool):
        c = PerfConstants(moe_sync_s=sync)
        r = rates(cluster, c)
        costs = compute_costs(spec, grid, r, c)
        items = layer_comm(spec, grid, r, costs, place_groups(grid, r), CommOptions(ep_overlap=overlap))
        return next(i for i in items if i.name == "ep token counts")

    on, off = counts(1e-3, False), counts(0.0, False)
    np.testing.assert_allclose(on.time[moe] - off.time[moe], 1e-3, rtol=1e-9)
    np.testing.assert_allclose(on.ops[moe], [1, 2, 2, 1])
    np.testing.assert_allclose(on.exposed[moe] - off.exposed[moe], [1e-3, 2e-3, 2e-3, 1e-3], rtol=1e-9)
    assert np.all(on.ops[dense] == 0) and np.all(on.exposed[dense] == 0)
    # the overlap pairs only (n - w - 1) / n of the passes (comm.ep_overlap_windows: 240 of 256 here)
    from dayzero.planner.perf.comm import ep_overlap_windows

    w = ep_overlap_windows(grid)
    hidden = counts(1e-3, True).exposed[moe] - counts(0.0, True).exposed[moe]
    assert np.all(hidden <= on.ops[moe] * 1e-3 * (w * 20 / 132 + (1 - w)) + 1e-12)
    assert np.all(hidden < on.ops[moe] * 1e-3 / 2)
