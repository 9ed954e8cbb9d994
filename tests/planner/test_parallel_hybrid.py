"""Layers with two token mixers side by side (parallel hybrids: Falcon-H1's FalconH1DecoderLayer).

transformers' FalconH1DecoderLayer (models/falcon_h1/modeling_falcon_h1.py, forward) normalises the
layer input once (``input_layernorm``), runs its Mamba-2 mixer and its attention on that output and
adds the two before the residual. A ModelSpec says so with the layer_mixers entry
``attention&recurrent``: the layer costs both mixers (parameters, FLOPs, saved tensors, compute),
with one pre-norm and one layer input between them. The tiny spec below is counted by hand:

    hidden H 64; attention GQA 4 heads x 16, 2 KV heads: q, o 64 x 64 = 4,096 each, k, v 64 x 32 =
    2,048 each: 12,288; Mamba-2 8 heads x 8 (inner 64), 2 groups x d_state 16, conv kernel 4 with
    bias, gated norm: in_proj 64 x (2 x 64 + 2 x 2 x 16 + 8 = 200) = 12,800, out_proj 64 x 64 =
    4,096, conv (64 + 64) x 4 + 128 = 640, A_log / dt_bias / D 3 x 8 = 24, norm 64: 17,624;
    gated MLP 96: 3 x 64 x 96 = 18,432; norms 2 x 64 = 128 (one for both mixers, one for the MLP).
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from dayzero.planner.memory.activations import Dims, layer_terms
from dayzero.planner.memory.memory import estimate_memory
from dayzero.planner.memory.params import attention_split, layer_params, recurrent_split
from dayzero.planner.perf.calibration import PerfConstants
from dayzero.planner.perf.comm import CommOptions, layer_comm, place_groups
from dayzero.planner.perf.compute import BF16, compute_costs, layer_classes
from dayzero.planner.perf.perf import rates
from dayzero.specs.cluster import build_cluster
from dayzero.specs.counting import layer_count, layer_forward_flops, params_total
from dayzero.specs.grid import encode
from dayzero.specs.layout_rules import problems
from dayzero.specs.model import (
    AttentionSpec,
    MLPSpec,
    ModelSpec,
    RecurrentSpec,
    layer_type,
    mixer_parts,
    parallel_mixer,
)
from dayzero.specs.parallel import ParallelConfig

PAR = "attention&recurrent"


def spec(mixers=(PAR, PAR)) -> ModelSpec:
    rec = RecurrentSpec(kind="mamba2", heads=8, head_dim=8, d_state=16, n_groups=2, conv_kernel=4, chunk_size=64)
    return ModelSpec(name="tiny-parallel-hybrid", model_type="test", hidden=64, layers=len(mixers), vocab=128,
                     attention=AttentionSpec(kind="gqa", heads=4, kv_heads=2, head_dim=16, v_head_dim=16),
                     mlp=MLPSpec(96), recurrent=rec, layer_mixers=tuple(mixers), max_positions=4096)


def test_the_entry_names_both_mixers_in_one_order():
    assert mixer_parts(PAR) == ("attention", "recurrent") and mixer_parts("none") == ()
    assert parallel_mixer(["recurrent", "attention"]) == PAR and parallel_mixer([]) == "none"
    s = spec()
    assert s.layer_types == (f"{PAR}+dense",) * 2 and s.has_attention and s.has_recurrent and s.is_hybrid
    with pytest.raises(ValueError, match="layer_mixers entries"):
        spec(("recurrent&attention",) * 2)
    with pytest.raises(ValueError, match="need ModelSpec.recurrent"):
        replace(spec(), recurrent=None)


def test_counts_both_mixers_and_one_pre_norm_by_hand():
    """Module docstring: 12,288 + 17,624 + 18,432 + 128 = 48,472 per layer."""
    c = layer_count(spec(), 0)
    assert (c.attention, c.recurrent, c.dense_mlp, c.norms, c.other) == (12_288, 17_624, 18_432, 128, 0)
    assert c.total == 48_472
    # embedding + head 2 x 128 x 64, final norm 64
    assert params_total(spec()) == 2 * 48_472 + 2 * 128 * 64 + 64
    # the planner's TP split holds both mixers' split parts (and sums to the count, asserted inside)
    lp = layer_params(spec(), f"{PAR}+dense")
    a_tp, a_kv, _ = attention_split(spec())
    r_tp, _ = recurrent_split(spec())
    assert lp.total == 48_472 and lp.kv == a_kv and lp.tp == a_tp + r_tp + 18_432


def test_flops_per_token_are_both_mixers_by_hand():
    """seq 128, full attention (causal=False). Linears 2 x (12,288 + 12,800 + 4,096 + 18,432) =
    95,232; attention core 2 x 128 keys x 4 heads x (16 + 16) = 32,768; SSD scan (Dao & Gu 2024 sec.
    6, counting.recurrent_scan_flops_per_token) with Q = 64: 2 x (64 x 16 x 2 + 8 x (64 x 8 + 2 x 16 x
    8)) = 16,384. Sum 144,384."""
    assert layer_forward_flops(spec(), 0, 128, causal=False) == 144_384
    one_each = spec(("attention", "recurrent"))
    mlp = 2 * 18_432
    assert 144_384 == (layer_forward_flops(one_each, 0, 128, False) + layer_forward_flops(one_each, 1, 128, False)
                       - mlp)


def test_saved_activations_share_the_normed_input_by_hand():
    """seq 128, 1 sequence, no parallelism, BF16, fused kernels, FlashAttention (MemoryOptions()).
    Attention: layer input, QKV input 2 x 128 x 64 = 16,384 each, q 16,384, k and v 2 x 128 x 32 =
    8,192 each, log-sum-exp 4 x 128 x 4 = 2,048, o_proj input 16,384: 83,968. Mamba-2 beside it,
    without the normed input it shares: in_proj output 2 x 128 x 200 = 51,200, the scan output, the
    norm input and out_proj's input 16,384 each, the norm's rstd 4 x 128 x 2 = 1,024: 101,376. MLP:
    its pre-norm and FC1 inputs 16,384 each, SwiGLU input 2 x 128 x 192 = 49,152, FC2 input 2 x 128 x
    96 = 24,576: 106,496. Total 291,840."""
    from dayzero.planner.memory.memory_options import MemoryOptions

    terms = layer_terms(spec(), f"{PAR}+dense", MemoryOptions(), Dims(seq=128, mbs=1, tp=1, cp=1))
    assert "rec_in" not in terms and terms["attn_in"] == 16_384
    assert terms["rec_zxbcdt"] == 51_200 and terms["attn_lse"] == 2_048
    assert sum(terms.values()) == 291_840


def test_compute_time_adds_the_mixers_and_their_sum():
    """On one device, without SP: the parallel layer's GEMM and attention-core seconds are the
    attention layer's plus the recurrent layer's minus the MLP the two share; its memory-bound work
    has one mixer pre-norm and residual add (5 H per token) instead of two, plus the sum of the
    mixers' outputs (read 2, write 1: 3 H): 2 H elements per token fewer than the two layers."""
    s = spec((PAR, "attention", "recurrent", "none"))
    c = PerfConstants()
    r = rates(build_cluster("h100", 8), c)
    g = encode([ParallelConfig(tp=1, dp=8, mbs=1, gbs=8, seq=1024)])
    costs = compute_costs(s, g, r, c)
    k = {t: i for i, (t, *_) in enumerate(layer_classes(s))}
    par, att, rec, none = (k[layer_type(m, "dense")] for m in (PAR, "attention", "recurrent", "none"))
    for field in ("gemm_fwd", "attn_fwd"):
        x = getattr(costs, field)[:, 0]
        assert x[par] == pytest.approx(x[att] + x[rec] - x[none], rel=1e-12)
    f = costs.fwd[:, 0]
    assert f[par] - f[att] - f[rec] + f[none] == pytest.approx(-2 * 64 * 1024 * BF16 * c.memory_scale / r.hbm_bw,
                                                                rel=1e-9)


def test_one_tp_pair_for_the_mixers_side_by_side():
    """Without SP: the parallel mixers' row-parallel partial outputs are summed before one
    all-reduce (per forward: one for the mixers, one for the MLP; x 2 with the backward's): 4, as a
    transformer layer's."""
    s = spec()
    c = PerfConstants()
    r = rates(build_cluster("h100", 8), c)
    g = encode([ParallelConfig(tp=2, dp=4, mbs=1, gbs=8, seq=1024)])
    items = {i.name: i for i in layer_comm(s, g, r, compute_costs(s, g, r, c), place_groups(g, r), CommOptions())}
    assert items["tp all-reduce"].ops[0, 0] == 4


def test_tp_divides_both_mixers_heads_and_cp_is_refused():
    """Attention 4 heads / 2 KV heads; Mamba-2 8 heads in 2 groups (Megatron-Core's MambaMixer asserts
    nheads % tp == 0 and ngroups % tp == 0). tp 2 passes; tp 4 breaks the recurrent groups only; with
    8 groups, tp 8 breaks the attention heads only; cp 2 is refused for the recurrent mixer."""
    s = spec()
    assert problems(ParallelConfig(tp=2, dp=4, gbs=8, seq=1024), s, 8) == []
    (msg,) = problems(ParallelConfig(tp=4, dp=2, gbs=8, seq=1024), s, 8)
    assert "recurrent mixer heads (8) and key/B-C groups (2) must be divisible by tp (4)" in msg
    wide = replace(s, recurrent=replace(s.recurrent, n_groups=8))
    (msg,) = problems(ParallelConfig(tp=8, dp=1, gbs=8, seq=1024), wide, 8)
    assert "attention heads (4) must be divisible by tp (8)" in msg
    (msg,) = problems(ParallelConfig(cp=2, dp=4, gbs=8, seq=1024), s, 8)
    assert "has recurrent" in msg


def test_memory_holds_both_mixers():
    """Per device (tp 2), the parallel stack needs more than the same stack with attention alone
    (the Mamba-2 weights, their optimizer state and saved tensors) and less than with each layer's
    mixers doubled as two layers (one pre-norm, one MLP, one layer input fewer per layer)."""
    p = ParallelConfig(tp=2, dp=4, gbs=8, seq=1024)
    peak = {m: estimate_memory(spec(m), p, 80 * 2**30).peak_bytes
            for m in ((PAR, PAR), ("attention", "attention"), ("attention", "recurrent") * 2)}
    assert peak[("attention", "attention")] < peak[(PAR, PAR)] < peak[("attention", "recurrent") * 2]
