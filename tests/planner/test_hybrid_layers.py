"""Hybrid (Mamba-2 / attention / MoE) layers in the planner: FLOPs, memory, TP communication, layout.

The model is a small Nemotron-H-style stack built by hand: each layer is either a mixer (Mamba-2
``M`` or attention ``*``) or a feed-forward block (dense ``-`` or MoE ``E``), one pre-norm each.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from dayzero.planner.memory.activations import Dims, layer_activation, layer_terms
from dayzero.planner.memory.memory import estimate_memory, peak_memory_batch
from dayzero.planner.memory.memory_options import MemoryOptions
from dayzero.planner.memory.params import layer_params
from dayzero.planner.perf.calibration import PerfConstants
from dayzero.planner.perf.comm import CommOptions, layer_comm, place_groups
from dayzero.planner.perf.compute import compute_costs, layer_classes, mamba2_elements
from dayzero.planner.perf.perf import PerfOptions, evaluate, rates
from dayzero.specs.cluster import build_cluster
from dayzero.specs.counting import flops_per_token, layer_count, params_total, recurrent_params
from dayzero.specs.grid import encode
from dayzero.specs.layout_rules import problems
from dayzero.specs.model import AttentionSpec, MLPSpec, ModelSpec, MoESpec, RecurrentSpec
from dayzero.specs.parallel import ParallelConfig

PATTERN = "M-M*EM-ME"  # Nemotron-H's notation (hybrid_override_pattern)
MIXER = {"M": "recurrent", "*": "attention", "-": "none", "E": "none"}
FFN = {"M": "none", "*": "none", "-": "dense", "E": "moe"}


def hybrid(pattern: str = PATTERN) -> ModelSpec:
    rec = RecurrentSpec(kind="mamba2", heads=16, head_dim=32, d_state=64, n_groups=4, conv_kernel=4, chunk_size=128)
    return ModelSpec(name="tiny-hybrid", model_type="test", hidden=256, layers=len(pattern), vocab=1024,
                     attention=AttentionSpec(kind="gqa", heads=8, kv_heads=2, head_dim=32, v_head_dim=32),
                     mlp=MLPSpec(512, gated=False, activation="relu2"),
                     moe=MoESpec(experts=8, top_k=2, expert=MLPSpec(128, gated=False, activation="relu2"),
                                 shared_experts=1, shared_intermediate=256),
                     recurrent=rec, layer_mixers=tuple(MIXER[c] for c in pattern),
                     layer_kinds=tuple(FFN[c] for c in pattern), max_positions=65536)


CLUSTER = build_cluster("h100", 8)


def test_transformer_digest_and_dict_have_no_hybrid_fields():
    spec = replace(hybrid(), recurrent=None, layer_mixers=(), layer_kinds=("dense",) * 9)
    d = spec.to_dict()
    assert "recurrent" not in d and "layer_mixers" not in d
    assert "recurrent" in hybrid().to_dict() and hybrid().digest() != spec.digest()


def test_counts_per_layer_type():
    """One pre-norm per block present; mixer-only layers hold no MLP, FFN-only layers no mixer."""
    spec = hybrid()
    m, star, dash, e = (layer_count(spec, i) for i in (0, 3, 1, 4))
    assert (m.kind, star.kind, dash.kind, e.kind) == ("recurrent+none", "attention+none", "none+dense", "none+moe")
    assert m.recurrent == recurrent_params(spec.recurrent, 256) and m.attention == m.dense_mlp == 0
    assert m.norms == star.norms == dash.norms == 256
    assert dash.dense_mlp == 2 * 256 * 512 and dash.attention == dash.recurrent == 0
    assert star.attention == 256 * 8 * 32 * 2 + 256 * 2 * 32 * 2 and star.dense_mlp == 0
    assert e.routed_experts == 8 * 2 * 256 * 128 and e.attention == 0
    for t in set(spec.layer_types):  # the TP/EP split sums to the exact count (asserted inside)
        assert layer_params(spec, t).total == layer_count(spec, spec.layer_types.index(t)).total


def test_recurrent_flops_linear_in_sequence_length():
    """Per token, the recurrent layers' scan costs the same at 4K and 32K; attention's core grows with seq."""
    spec = hybrid()
    a, b = flops_per_token(spec, 4096, causal=True), flops_per_token(spec, 32768, causal=True)
    assert a.recurrent_forward == b.recurrent_forward > 0
    assert a.matmul_forward == b.matmul_forward
    assert b.attention_forward == pytest.approx(a.attention_forward * 32769 / 4097)
    # compute model: the recurrent class's scan seconds per token do not depend on seq (both batches
    # hold several sequences: a one-sequence batch skips Megatron-Core's layout copies, mamba2_elements)
    r = rates(CLUSTER, PerfConstants())
    costs = [compute_costs(spec, encode([ParallelConfig(tp=1, dp=8, mbs=mbs, gbs=64, seq=seq)]), r, PerfConstants())
             for seq, mbs in ((4096, 8), (16384, 2))]
    k = [t for t, *_ in layer_classes(spec)].index("recurrent+none")
    assert costs[0].attn_fwd[k, 0] == pytest.approx(costs[1].attn_fwd[k, 0])
    assert costs[0].fwd[k, 0] == pytest.approx(costs[1].fwd[k, 0])


def test_tp_all_reduce_per_mixer_layer():
    """Without SP: one all-reduce forward and one backward per block (a mixer-only layer: 2;
    a transformer layer with an MLP: 4); with SP an all-gather and a reduce-scatter each."""
    spec = hybrid()
    cons = PerfConstants()
    r = rates(CLUSTER, cons)
    classes = [t for t, *_ in layer_classes(spec)]
    for sp in (False, True):
        g = encode([ParallelConfig(tp=4, dp=2, mbs=1, gbs=8, seq=4096, sequence_parallel=sp)])
        costs = compute_costs(spec, g, r, cons)
        items = {i.name: i for i in layer_comm(spec, g, r, costs, place_groups(g, r), CommOptions())}
        for t, want in (("recurrent+none", 2), ("attention+none", 2), ("none+dense", 2)):
            k = classes.index(t)
            if sp:
                assert items["tp all-gather"].ops[k, 0] == items["tp reduce-scatter"].ops[k, 0] == want
                assert items["tp all-reduce"].ops[k, 0] == 0
            else:
                assert items["tp all-reduce"].ops[k, 0] == want
        # MoE layer (etp 1): only the shared experts' pair
        assert (items["tp all-reduce"].ops[classes.index("none+moe"), 0] == (0 if sp else 2))


def test_activations_of_recurrent_layers_linear_in_seq():
    spec = hybrid()
    o = MemoryOptions()
    acts = [layer_activation(spec, "recurrent+none", o, Dims(seq=s, mbs=1, tp=1, cp=1)).none for s in (4096, 8192)]
    assert acts[1] == pytest.approx(2 * acts[0])
    terms = layer_terms(spec, "recurrent+none", o, Dims(seq=4096, mbs=1, tp=2, cp=1))
    # Mamba-2 saved tensors as mamba_ssm's MambaSplitConv1dScanCombinedFn.forward saves them (bf16,
    # 2 B, split by tp): the in_proj output zxbcdt, 2 x 512 + 2 x 256 + 16 = 1552 wide, and the
    # ungated scan output out_x (512); the RMSNorm's input (512) and its FP32 rstd per group (4)
    assert terms["rec_zxbcdt"] == 2 * 4096 * 1552 / 2
    assert terms["scan_out_x"] == terms["rec_norm_in"] == 2 * 4096 * 512 / 2
    assert terms["rec_norm_rstd"] == 4 * 4096 * 4 / 2
    # the conv output and the FP32 chunk states are recomputed in backward, not kept
    assert not {"scan_in", "scan_states", "conv_in"} & set(terms)
    assert "attn_scores" not in terms and "attn_lse" not in terms
    # a layer without a mixer: its FFN's pre-norm input is the layer input (full recompute keeps it)
    ffn = layer_activation(spec, "none+dense", o, Dims(seq=4096, mbs=1, tp=1, cp=1))
    assert ffn.full == 2 * 4096 * 256


def test_memory_and_step_time_run_and_agree():
    spec = hybrid()
    p = ParallelConfig(tp=2, pp=3, dp=4, mbs=1, gbs=32, seq=4096)
    assert problems(p, spec, 24) == []
    rep = estimate_memory(spec, p, 80 * 2**30)
    batch = peak_memory_batch(spec, encode([p]), 80 * 2**30)
    assert batch[0] == pytest.approx(rep.peak_bytes, rel=1e-9)
    ev = evaluate(spec, encode([p]), build_cluster("h100", 24), PerfOptions())
    assert np.all(np.isfinite(ev.step_s)) and ev.step_s[0] > 0
    # the parameters held add up to the model (no MLP in mixer-only layers)
    assert params_total(spec) == sum(layer_count(spec, i).total for i in range(9)) + 1024 * 256 * 2 + 256


def test_layout_rules_for_recurrent_layers():
    spec = hybrid()
    cp = problems(ParallelConfig(tp=1, cp=2, dp=4, mbs=1, gbs=8, seq=4096), spec, 8)
    assert any("recurrent" in m and "cp 2" in m for m in cp)
    tp = problems(ParallelConfig(tp=8, dp=1, mbs=1, gbs=8, seq=4096), spec, 8)  # 4 B/C groups
    assert any("recurrent mixer heads" in m for m in tp)


def test_ep_overlap_does_not_hide_a_hybrid_moe_layers_all_to_all():
    """Megatron-Core's 1F1B a2a overlap schedules a layer's dispatch/combine of one micro-batch under
    another's attention and experts (TransformerLayer); a hybrid stack's MoE layer has no token
    mixer of its own, and HybridModel cannot be scheduled so (NVIDIA/Megatron-LM issue #5854, PR
    #4798 unmerged): with ep_overlap on, its EP all-to-all is still exposed in full (exposed = ops x
    time of each item), while a transformer MoE layer's hides behind the layer's compute but for the
    slowdown of the SMs the all-to-all holds (DeepSeek-V3 sec. 3.2.2: exposed max(c - C, f c), f = 20/132)."""
    cons = PerfConstants()
    r = rates(CLUSTER, cons)
    g = encode([ParallelConfig(tp=1, dp=8, ep=8, mbs=1, gbs=8 * 64, seq=4096)])  # 64 micro-batches to pair

    def ep_items(spec):
        costs = compute_costs(spec, g, r, cons)
        items = layer_comm(spec, g, r, costs, place_groups(g, r), CommOptions(ep_overlap=True))
        k = [t for t, *_ in layer_classes(spec)].index(next(t for t in spec.layer_types if t.endswith("moe")))
        return [(i.ops[k, 0] * i.time[k, 0], i.exposed[k, 0], i.hidden_by) for i in items if i.dim == "ep"]

    for busy, exposed, hidden_by in ep_items(hybrid()):
        assert busy > 0 and exposed == pytest.approx(busy) and hidden_by == ""
    transformer = replace(hybrid("EEEE"), recurrent=None, layer_mixers=(), layer_kinds=("moe",) * 4)
    items = ep_items(transformer)
    # the passes another micro-batch runs beside (63 of 64: comm.ep_overlap_windows) show only the SMs' share
    from dayzero.planner.perf.comm import ep_overlap_windows

    w = float(ep_overlap_windows(g)[0])
    assert w == pytest.approx(63 / 64)
    assert all(exposed == pytest.approx(busy * (w * r.comm_sm_fraction + 1 - w)) for busy, exposed, _ in items)
    assert items[0][2] == "other micro-batch"


def test_mamba2_memory_passes_kernel_by_kernel():
    """Megatron-Core's MambaMixer._ssm_training over mamba_ssm's SSD kernels
    (mamba_ssm/ops/triton/ssd_combined.py, MambaSplitConv1dScanCombinedFn): per token, forward
    2C + 7D + 4GN + 6S + 4GQ, backward 5C + 20D + 5GN + 17S + 12GQ (the backward re-runs the conv,
    C B^T, chunk states and state passing; compute.mamba2_elements lists every kernel). The tiny
    mixer: D = 16 x 32 = 512, GN = 4 x 64 = 256, C = 1024, q = 128, S = 512 x 64 / 128 = 256,
    GQ = 4 x 128 = 512: forward 2048 + 3584 + 1024 + 1536 + 2048 = 10240, backward 5120 + 10240 +
    1280 + 4352 + 6144 = 27136; a batch of several sequences adds the (l b d) <-> (b l d) copies of
    the in_proj output and the mixer output, 2 (1552 + 512) = 4128 each way."""
    r = hybrid().recurrent
    assert mamba2_elements(r, 4096, 1) == (10240, 27136)
    assert mamba2_elements(r, 4096, 2) == (10240 + 4128, 27136 + 4128)
    # in the step time: the backward's memory time beyond twice the forward's (the scan's matmuls
    # add their own 2.5 - 2 = 0.5 x forward)
    spec, cons = hybrid(), PerfConstants()
    rt = rates(CLUSTER, cons)
    c = compute_costs(spec, encode([ParallelConfig(tp=1, dp=8, mbs=1, gbs=8, seq=4096)]), rt, cons)
    k = [t for t, *_ in layer_classes(spec)].index("recurrent+none")
    extra = c.bwd[k, 0] - 2 * c.fwd[k, 0] - 0.5 * c.attn_fwd[k, 0]
    assert extra == pytest.approx((27136 - 2 * 10240) * 4096 * 2 * cons.memory_scale / rt.hbm_bw)
