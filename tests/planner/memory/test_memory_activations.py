"""Activation accounting against Korthikanti et al. 2022 (sec. 4, eqs. 1-2 and the interleaving factor),
checked on the paper's GPT configurations, plus hand counts for GQA, MLA and MoE layers."""

from __future__ import annotations

import pytest

from dayzero.planner.memory.activations import Dims, layer_activation, layer_terms
from dayzero.planner.memory.memory import MemoryOptions, estimate_memory
from dayzero.planner.schedule import inflight_chunks, inflight_microbatches, step_order
from dayzero.specs.hf_config import spec_from_hf_config
from dayzero.specs.parallel import ParallelConfig
from dayzero.specs.registry import load_model

# Korthikanti et al. 2022, Table 3: the GPT configurations (seq 2048).
GPT_CONFIGS = {"22B": (64, 6144, 48), "175B": (96, 12288, 96), "530B": (128, 20480, 105), "1T": (160, 25600, 128)}
GPT_OPTIONS = MemoryOptions(attention="eager", dropout=True)  # the paper's GPT: eager softmax + dropout


def gpt(name: str):
    a, h, layers = GPT_CONFIGS[name]
    cfg = {"model_type": "gpt2", "n_embd": h, "n_layer": layers, "n_head": a, "n_positions": 2048,
           "vocab_size": 51200, "tie_word_embeddings": True}
    return spec_from_hf_config(cfg, name=f"gpt-{name}")


def per_layer(spec, opts=GPT_OPTIONS, s=2048, b=1, t=1, sp=False):
    return layer_activation(spec, "dense", opts, Dims(seq=s, mbs=b, tp=t, cp=1, sp=sp))


@pytest.mark.parametrize("name", list(GPT_CONFIGS))
@pytest.mark.parametrize("b", [1, 4])
def test_no_parallelism_is_sbh_34_plus_5as_over_h(name, b):
    spec, s = gpt(name), 2048
    a, h = spec.attention.heads, spec.hidden
    assert float(per_layer(spec, b=b).none) == pytest.approx(s * b * h * (34 + 5 * a * s / h), rel=1e-12)


@pytest.mark.parametrize("name", list(GPT_CONFIGS))
@pytest.mark.parametrize("t", [2, 8])
def test_tensor_parallel_is_sbh_10_plus_24_over_t_plus_5as_over_ht(name, t):
    spec, s, b = gpt(name), 2048, 1
    a, h = spec.attention.heads, spec.hidden
    expected = s * b * h * (10 + 24 / t + 5 * a * s / (h * t))
    assert float(per_layer(spec, t=t).none) == pytest.approx(expected, rel=1e-12)


@pytest.mark.parametrize("name", list(GPT_CONFIGS))
@pytest.mark.parametrize("t", [4, 8])
def test_sequence_parallel_with_selective_recompute_is_sbh_34_over_t(name, t):
    spec, s, b = gpt(name), 2048, 2
    act = per_layer(spec, b=b, t=t, sp=True)
    assert float(act.selective) == pytest.approx(s * b * spec.hidden * 34 / t, rel=1e-12)
    # SP alone (no recompute) adds back the score terms, all divided by t: sbh(34/t + 5as/(ht))
    a, h = spec.attention.heads, spec.hidden
    assert float(act.none) == pytest.approx(s * b * h * (34 / t + 5 * a * s / (h * t)), rel=1e-12)


@pytest.mark.parametrize("name", list(GPT_CONFIGS))
def test_full_recompute_keeps_2sbh_per_layer(name):
    spec, s, b = gpt(name), 2048, 1
    assert float(per_layer(spec).full) == 2 * s * b * spec.hidden
    assert float(per_layer(spec, t=8, sp=True).full) == 2 * s * b * spec.hidden / 8


def test_stage_totals_follow_the_paper_for_1f1b_and_interleaving():
    """First stage of 1F1B holds pp micro-batches of L/pp layers = L layers' worth (sec. 4.2.3);
    interleaving multiplies that by 1 + (p - 1)/(p v)."""
    spec = gpt("175B")  # 96 layers
    t, p = 8, 8
    layer = float(per_layer(spec, t=t, sp=True).selective)
    for v in (1, 2, 3, 4):
        par = ParallelConfig(tp=t, pp=p, dp=1, vpp=v, mbs=1, gbs=8 * p, seq=2048, zero=1, recompute="selective",
                             sequence_parallel=True)
        st0 = estimate_memory(spec, par, 80 * 10**9, GPT_OPTIONS).stages[0]
        factor = 1 + (p - 1) / (p * v) if v > 1 else 1.0
        assert st0.terms["activations:layers"] == pytest.approx(spec.layers * layer * factor, rel=1e-9)


def test_1f1b_stage_i_holds_pp_minus_i_microbatches():
    for pp in (2, 4, 8):
        for rank in range(pp):
            assert float(inflight_microbatches(0, pp, 1, 32, rank)) == pp - rank
            assert float(inflight_microbatches(0, pp, 1, 2, rank)) == min(pp - rank, 2)
            assert float(inflight_microbatches(2, pp, 1, 32, rank)) == 32  # GPipe holds them all


@pytest.mark.parametrize("schedule,pp,vpp,m", [("1f1b", 4, 1, 8), ("1f1b", 4, 1, 2), ("interleaved", 4, 2, 8),
                                               ("interleaved", 2, 3, 4), ("gpipe", 3, 1, 5), ("interleaved", 4, 4, 4)])
def test_step_order_is_complete_and_peaks_at_the_formula(schedule, pp, vpp, m):
    for rank in range(pp):
        order = step_order(schedule, pp, vpp, m, rank)
        fwd = [(i, c) for op, i, c in order if op == "F"]
        bwd = [(i, c) for op, i, c in order if op == "B"]
        assert sorted(fwd) == sorted(bwd) == sorted((i, c) for i in range(m) for c in range(vpp))
        live, peak, seen = 0, 0, set()
        for op, i, c in order:
            if op == "F":
                live += 1
                seen.add((i, c))
            else:
                assert (i, c) in seen  # backward after its forward
                live -= 1
            peak = max(peak, live)
        code = {"1f1b": 0, "interleaved": 1, "gpipe": 2}[schedule]
        assert peak == int(inflight_chunks(code, pp, vpp, m, rank))


def test_gqa_layer_by_hand():
    spec = load_model("llama-3.1-8b")  # h 4096, a 32, kv 8, d 128, f 14336, gated
    s, b, h, f = 4096, 1, 4096, 14336
    sbh = s * b * h
    kv = s * b * 8 * 128
    expected = (2 * sbh + 2 * sbh  # ln1 input, qkv input
                + 2 * sbh + 2 * kv + 2 * kv  # q, k, v
                + 4 * s * b * 32  # flash log-sum-exp
                + 2 * sbh  # o_proj input
                + 2 * sbh + 2 * sbh  # ln2 input, mlp input
                + 2 * s * b * 2 * f + 2 * s * b * f)  # swiglu input (gate|up), down input
    assert float(layer_activation(spec, "dense", MemoryOptions(), Dims(s, b, 1, 1)).none) == expected
    # tp 16 > kv 8: each rank keeps one whole KV head
    terms = layer_terms(spec, "dense", MemoryOptions(), Dims(s, b, 16, 1))
    assert float(terms["k"]) == 2 * s * b * 128


def test_mla_and_moe_layer_by_hand():
    spec = load_model("tiny-moe")  # MLA (a 8, q_lora 96, kv_lora 64, dqk 48, dv 32); 8 experts top-2, f_e 128, 1 shared
    s, b, h = 256, 2, spec.hidden
    a = spec.attention
    tok = s * b
    attn = (2 * tok * h * 2 + 2 * tok * 96 * 2 + 2 * tok * 64 * 2  # ln1, input; q_a norm, q_b in; kv_a norm, kv_b in
            + 2 * tok * a.heads * (48 + 48 + 32) + 4 * tok * a.heads + 2 * tok * a.heads * 32)
    routed = tok * 2  # top-2, balanced, etp = tp = cp = 1
    mlp = (2 * tok * h * 2 + 4 * tok * 8 + 12 * tok * 2  # ln2, moe input, router probs, top-k
           + routed * (2 * h + 2 * 2 * 128 + 2 * 128 + 2 * h + 8)  # dispatched in, swiglu, down, out, map
           + tok * (2 * 2 * 128 + 2 * 128))  # shared expert
    got = float(layer_activation(spec, "moe", MemoryOptions(), Dims(s, b, 1, 1)).none)
    assert got == attn + mlp
    # capacity factor scales only the routed terms
    more = float(layer_activation(spec, "moe", MemoryOptions(moe_capacity_factor=1.5), Dims(s, b, 1, 1)).none)
    assert more - got == pytest.approx(0.5 * routed * (2 * h + 2 * 2 * 128 + 2 * 128 + 2 * h + 8))
    # routing weights folded into the SwiGLU (Megatron-Core): no expert output kept
    folded = float(layer_activation(spec, "moe", MemoryOptions(moe_probs="activation"), Dims(s, b, 1, 1)).none)
    assert got - folded == 2 * routed * h


def test_routing_weights_folded_into_the_swiglu_keep_no_expert_output():
    """Megatron-Core's grouped experts multiply the routing weights into the SwiGLU
    (experts.py: weighted_bias_swiglu_impl(intermediate, bias, permuted_probs)), so the combine is
    an unweighted sum that saves nothing. Weighting the outputs in the combine instead keeps every
    expert output for the weights' gradient: DeepSeek-V3 at seq 4096, mbs 1, tp 1, top-8, hidden
    7168: 2 B x 4096 x 8 x 7168 = 469,762,048 B per MoE layer and micro-batch (dayzero's runtime,
    kernels "eager", weights the outputs: it keeps them)."""
    spec, d = load_model("deepseek-v3"), Dims(4096, 1, 1, 1)
    folded = layer_terms(spec, "moe", MemoryOptions(moe_probs="activation"), d)
    combine = layer_terms(spec, "moe", MemoryOptions(), d)  # the default
    assert "expert_out" not in folded and combine["expert_out"] == 2 * 4096 * 8 * 7168 == 469_762_048
    assert "expert_out" in layer_terms(spec, "moe", MemoryOptions(moe_probs="activation", kernels="eager"), d)
    with pytest.raises(Exception, match="moe_probs"):
        MemoryOptions(moe_probs="router")


def test_fp8_halves_saved_linear_inputs():
    spec = load_model("llama-3.1-8b")
    bf16 = layer_terms(spec, "dense", MemoryOptions(), Dims(4096, 1, 1, 1))
    fp8 = layer_terms(spec, "dense", MemoryOptions(), Dims(4096, 1, 1, 1, fp8=True))
    for k in ("attn_in", "attn_out", "mlp_in", "mlp_down_in"):
        assert float(fp8[k]) * 2 == float(bf16[k])
    for k in ("ln1_in", "q", "mlp_act_in"):
        assert float(fp8[k]) == float(bf16[k])


def test_full_recompute_transient_is_the_largest_phase_by_hand():
    """Mixtral-8x7B's MoE layer under full recompute (mbs 4, seq 4096, tp = etp = 1, fused kernels,
    flash attention): the backward's transient is the largest of its phases, not the largest
    gradient set plus the whole rebuilt layer. Non-reentrant checkpointing hands each recomputed
    tensor to the op that saved it and drops its own reference (torch.utils.checkpoint,
    ``use_reentrant=False``: the unpack hook), so the tensors the combine and the down-projection
    saved are freed before the experts' activation backward; measured by ``memory --exact``
    (benchmarks/RESULTS.md, "memory --exact vs the analytic model"). Hand count in MiB: one
    hidden-wide bf16 tensor of the 16,384 tokens is 128, a K or V 32, the log-sum-exp 2; the 32,768
    routed rows are 256 hidden-wide and 896 MLP-wide (14,336)."""
    spec = load_model("mixtral-8x7b")
    d = Dims(seq=4096, mbs=4, tp=1, cp=1)
    mib = 2**20
    attn = {"ln1_in": 128, "attn_in": 128, "q": 128, "k": 32, "v": 32, "attn_lse": 2, "attn_out": 128}
    moe = {"ln2_in": 128, "moe_in": 128, "router_probs": 0.5, "router_topk": 0.375, "expert_in": 256,
           "expert_act_in": 2 * 896, "expert_down_in": 896, "expert_out": 256, "dispatch_map": 0.25}
    terms = layer_terms(spec, "moe", MemoryOptions(), d)
    assert {k: float(v) / mib for k, v in terms.items()} == {**attn, **moe}
    rebuilt = sum(attn.values()) + sum(moe.values()) - 128  # all but the kept layer input: 3,907.125
    phases = [rebuilt + 128,  # 1. the first op: the whole layer rebuilt, the output's gradient
              # 2. the experts' activation backward: the combine's and down-projection's inputs freed;
              #    3 MLP-wide gradients, 2 of the routed rows, 2 of the residual stream
              rebuilt - (896 + 256 + 0.25) + 3 * 896 + 2 * 256 + 2 * 128,
              # 3. the attention core's backward: its inputs; gradients of q, k, v and the output
              (128 + 128 + 32 + 32 + 2) + (128 + 32 + 32 + 128) + 2 * 128]
    assert phases == [4035.125, 6210.875, 898.0]
    got = layer_activation(spec, "moe", MemoryOptions(), d).recomputing
    assert float(got) / mib == pytest.approx(6210.875)


def test_full_recompute_sets_the_layer_transient():
    """The planner's layer transient under full recompute is the phase maximum above."""
    spec = load_model("mixtral-8x7b")
    p = ParallelConfig(ep=8, dp=16, mbs=4, gbs=64, seq=4096, recompute="full")
    terms = estimate_memory(spec, p, 10**15).stages[0].terms
    want = layer_activation(spec, "moe", MemoryOptions(), Dims(seq=4096, mbs=4, tp=1, cp=1)).recomputing
    assert float(terms["temporary:layer_transient"]) == pytest.approx(float(want))


@pytest.mark.parametrize("name, opts", [("tiny-moe", MemoryOptions()), ("tiny-llama", GPT_OPTIONS),
                                        ("tiny-moe", MemoryOptions(kernels="eager"))])
def test_layer_activations_are_layer_activation_once_per_distinct_dims(name, opts):
    """activations.layer_activations (the memory path's: each distinct (seq, mbs, tp, cp, etp, sp,
    fp8) computed once, memoised across calls) gives layer_activation's bytes at every candidate,
    exactly, in the candidates' shape; a second call with new and known dims alike agrees too."""
    import numpy as np

    from dayzero.planner.memory.activations import layer_activations

    spec = load_model(name)
    rng = np.random.default_rng(0)

    def dims(n):
        return Dims(seq=rng.choice([1024, 4096], (n, 1)), mbs=rng.choice([1, 2, 4], (n, 1)),
                    tp=rng.choice([1, 2], (n, 1)), cp=rng.choice([1, 2], (n, 1)), etp=rng.choice([1, 2], (n, 1)),
                    sp=rng.choice([False, True], (n, 1)), fp8=rng.choice([False, True], (n, 1)))

    kinds = sorted(set(spec.layer_types))
    for n in (50, 200):
        d = dims(n)
        got = layer_activations(spec, kinds, opts, d)
        for k in kinds:
            want = layer_activation(spec, k, opts, d)
            for field in ("none", "selective", "full", "core", "largest", "recomputing"):
                g, w = getattr(got[k], field), np.broadcast_to(getattr(want, field), (n, 1))
                assert g.shape == (n, 1) and np.array_equal(g, w), (k, field)
            for (gb, gv), (wb, wv) in zip(got[k].dropped + got[k].rebuilt, want.dropped + want.rebuilt):
                assert gb == wb and np.array_equal(gv, np.broadcast_to(wv, (n, 1)))
            assert len(got[k].dropped) == len(want.dropped) and len(got[k].rebuilt) == len(want.rebuilt)
