"""Selective recompute by module (Megatron-LM --recompute-modules,
megatron/core/transformer/transformer_config.py ``recompute_modules``) and DeepSeek-V3's memory
recipe (arXiv 2412.19437, sec. 3.2.3 and 3.3.3), each against a hand count on tiny-moe: MLA
(8 heads, q_lora 96, kv_lora 64, qk 48 = nope 32 + rope 16, v 32), hidden 256, 8 experts top-2 of
width 128, one shared expert of width 128."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from dayzero.errors import LayoutError
from dayzero.planner.memory.activations import Dims, layer_activation, layer_terms
from dayzero.planner.memory.memory import MemoryOptions, estimate_memory
from dayzero.planner.perf.calibration import PerfConstants, rates
from dayzero.planner.perf.compute import BF16, compute_costs, layer_classes
from dayzero.planner.search.search import SearchSpace
from dayzero.specs import layout_rules
from dayzero.specs.cluster import build_cluster
from dayzero.specs.grid import MODULE_BIT, decode, encode, module_mask
from dayzero.specs.layout_options import LayoutOptions
from dayzero.specs.parallel import ParallelConfig
from dayzero.specs.registry import load_model

SPEC = load_model("tiny-moe")
S, B = 256, 2
TOK = S * B
H = 256
ROUTED = 2 * TOK  # top-2, balanced, tp = etp = cp = 1


def dropped(module: str, kind: str = "moe", spec=SPEC, opts=MemoryOptions()) -> float:
    a = layer_activation(spec, kind, opts, Dims(S, B, 1, 1))
    return float(a.none - a.saved(MODULE_BIT[module]))


def test_each_module_drops_its_saved_tensors_by_hand():
    """Bytes per micro-batch one MoE layer of tiny-moe no longer saves (BF16, 2 B per element):
    core_attn the FP32 log-sum-exp (4 B x tokens x heads); layernorm the two norm outputs (QKV and
    router inputs, 2 x 2 B x tok x h); mla_up_proj the per-head Q, K, V (2 B x tok x 8 x (48 + 48 +
    32)); moe_act the routed experts' down-projection input only (TEGroupedMLP; the shared expert
    is a plain MLP without an activation checkpoint); moe everything of the block but its input;
    shared_experts the shared expert's SwiGLU input (2 x 128) and down input (128)."""
    shared = 2 * TOK * (2 * 128 + 128)
    assert dropped("core_attn") == 4 * TOK * 8
    assert dropped("layernorm") == 2 * 2 * TOK * H
    assert dropped("mla_up_proj") == 2 * TOK * 8 * (48 + 48 + 32)
    assert dropped("moe_act") == 2 * ROUTED * 128
    assert dropped("shared_experts") == shared
    assert dropped("moe") == (4 * TOK * 8 + 12 * TOK * 2 + ROUTED * (2 * H + 2 * 2 * 128 + 2 * 128 + 2 * H + 8)
                              + shared)
    assert dropped("mlp") == 0  # a MoE layer has no dense MLP
    # the union: moe_act's tensor is inside moe's, counted once
    a = layer_activation(SPEC, "moe", MemoryOptions(), Dims(S, B, 1, 1))
    both = MODULE_BIT["moe"] | MODULE_BIT["moe_act"]
    assert float(a.saved(both)) == float(a.saved(MODULE_BIT["moe"]))
    # Megatron's default: selective == core_attn
    assert float(a.saved(MODULE_BIT["core_attn"])) == float(a.selective)


def test_dense_layer_modules_by_hand():
    """The dense layer of tiny-moe: mlp drops FC1's input (TE fuses the pre-MLP norm into FC1) and
    the SwiGLU input and down input (intermediate 512: spec.mlp); mla_up_proj on a GQA model drops
    nothing."""
    f = SPEC.mlp.intermediate
    assert dropped("mlp", "dense") == 2 * TOK * H + 2 * TOK * 2 * f + 2 * TOK * f
    llama = load_model("llama-3.1-8b")
    assert dropped("mla_up_proj", "dense", llama) == 0


def test_layer_memory_follows_the_module_set():
    """estimate_memory: the activations of a layout with modules drop by the hand count per layer
    (3 MoE layers + 1 dense, pp 1, one micro-batch in flight)."""
    base = ParallelConfig(mbs=B, seq=S, recompute="selective")
    ref = estimate_memory(SPEC, base, 80 * 2**30).stages[0].terms["activations:layers"]
    more = estimate_memory(SPEC, base.with_(recompute_modules=("core_attn", "moe_act")), 80 * 2**30)
    assert ref - more.stages[0].terms["activations:layers"] == 3 * 2 * ROUTED * 128


def constants():
    return replace(PerfConstants(), gemm_half_dim=0.0)


def replay_s(module: str) -> float:
    """Backward seconds added to one MoE layer by recomputing ``module`` (selective) on top of
    core_attn alone."""
    cl = build_cluster("h100", 8)
    c = constants()
    r = rates(cl, c)
    index = [(t, w) for t, w, _ in layer_classes(SPEC)].index(("moe", None))
    base = ParallelConfig(mbs=B, seq=S, recompute="selective")
    g = encode([base, base.with_(recompute_modules=("core_attn", module))])
    bwd = compute_costs(SPEC, g, r, c).bwd[index]
    return float(bwd[1] - bwd[0]), r, c


def test_recompute_flops_by_module_by_hand():
    """The forward each module replays (half_dim 0: GEMMs at the fitted rate): mla_up_proj the Q
    up-projection (2 x 96 x 8*48 FLOPs per token) and the KV up-projection (2 x 64 x 8*(32 + 32)),
    plus the rope/split copies (3 x 8*48 + 2 x 8*32 elements per token, BF16, at HBM bandwidth x the
    memory scale); moe_act the experts' SwiGLU (3 x 128 elements per routed row); layernorm the two
    norms (read + write h per token each)."""
    t, r, c = replay_s("mla_up_proj")
    rate = float(np.asarray(r.gemm_rate(np.array([0])))[0])
    mem = BF16 * c.memory_scale / r.hbm_bw
    assert t == pytest.approx(TOK * (2 * 96 * 8 * 48 + 2 * 64 * 8 * (32 + 32)) / rate
                              + TOK * (3 * 8 * 48 + 2 * 8 * 32) * mem, rel=1e-9)
    t, _, _ = replay_s("moe_act")
    assert t == pytest.approx(ROUTED * 3 * 128 * mem, rel=1e-9)
    t, _, _ = replay_s("layernorm")
    assert t == pytest.approx(TOK * 2 * H * 2 * mem, rel=1e-9)


def test_module_sets_encode_validate_and_parse():
    p = ParallelConfig(recompute="selective", recompute_modules=("moe_act", "core_attn"))
    assert p.recompute_modules == ("core_attn", "moe_act")  # one spelling
    assert ParallelConfig(recompute="selective").recompute_modules == ("core_attn",)
    g = encode([p])
    assert int(g["recompute_modules"][0]) == module_mask(("core_attn", "moe_act")) == 3
    assert decode(g) == [p] and ParallelConfig.from_dict(p.to_dict()) == p
    assert "selective(core_attn+moe_act)" in p.describe()
    assert layout_rules.problems(ParallelConfig(recompute="full", recompute_modules=("moe",))) == [
        "recompute modules (moe) need recompute selective, got full"]
    assert LayoutOptions(recompute_modules="moe_act,layernorm").parallel(1).recompute == "selective"
    with pytest.raises(LayoutError, match="bogus not among core_attn, moe_act"):
        LayoutOptions(recompute_modules="core_attn,bogus").parallel(1)


def test_search_levels_are_the_module_sets_that_apply():
    """none, every distinct set of the modules that drop something (fewest dropped tensors first,
    planner.backtest.row_memory.recompute_modules_sets), full. On llama-3.1-8b (dense GQA) core_attn drops the
    log-sum-exp, layernorm the two norm outputs (attn_in, mlp_in), mlp FC1's input and the SwiGLU
    tensors (mlp_in, mlp_act_in, mlp_down_in, mlp_act_out): all 7 non-empty sets drop different
    tensors, mla_up_proj and the MoE modules nothing. On tiny-moe ``moe + moe_act`` drops what
    ``moe`` drops, so only ``moe`` is tried; non-nested sets such as moe_act alone are."""
    from dayzero.planner.search.search import level_order
    from dayzero.specs.grid import module_names

    llama = [(r, module_names(mk)) for r, mk in SearchSpace().levels(load_model("llama-3.1-8b"))]
    assert llama == [(0, ()), (1, ("core_attn",)), (1, ("layernorm",)), (1, ("mlp",)), (1, ("core_attn", "layernorm")),
                     (1, ("core_attn", "mlp")), (1, ("layernorm", "mlp")), (1, ("core_attn", "layernorm", "mlp")),
                     (2, ())]
    levels = SearchSpace().levels(SPEC)
    masks = [mk for _, mk in levels]
    assert levels[0] == (0, 0) and levels[-1] == (2, 0) and len(set(levels)) == len(levels)
    assert module_mask(("moe_act",)) in masks and module_mask(("mla_up_proj",)) in masks
    assert module_mask(("moe", "moe_act")) not in masks and module_mask(("moe",)) in masks
    below = level_order(SPEC, levels)
    # a level never comes before one it recomputes less than
    assert not any(below[j, i] and not below[i, j] for i in range(len(levels)) for j in range(i + 1, len(levels)))
    assert SearchSpace(recompute=("none", "full")).levels(SPEC) == [(0, 0), (2, 0)]


def test_a_level_above_another_keeps_no_more_memory_and_takes_no_less_time():
    """The search's pruning (search.level_order): where level j recomputes everything level i does,
    j's peak is no higher and its step no shorter, checked on every pair of tiny-moe's 81 levels for
    one layout (tp 2, sp, ep 2, mbs 2, 8 H100)."""
    from dayzero.planner.memory.memory import peak_memory_batch
    from dayzero.planner.perf.perf import PerfOptions, evaluate
    from dayzero.planner.search.search import level_order

    cl = build_cluster("h100", 8)
    levels = SearchSpace().levels(SPEC)
    base = ParallelConfig(tp=2, dp=4, ep=2, mbs=B, gbs=16, seq=S, sequence_parallel=True, zero=1)
    g = encode([base] * len(levels))
    g["recompute"] = np.array([rc for rc, _ in levels])
    g["recompute_modules"] = np.array([mk for _, mk in levels])
    peak = np.asarray(peak_memory_batch(SPEC, g, cl.memory_bytes))
    step = evaluate(SPEC, g, cl, PerfOptions()).step_s
    below = level_order(SPEC, levels)
    i, j = np.nonzero(below)
    assert len(i) > len(levels)  # some levels lie above others
    assert (peak[j] <= peak[i] * (1 + 1e-12)).all() and (step[j] >= step[i] * (1 - 1e-12)).all()


def test_the_search_finds_a_module_set_off_the_old_ladder():
    """tiny-moe, one layout (tp pp cp ep 1, dp 8, mbs 2, seq 256, ZeRO-1, 8 H100) with the memory
    limit at its peak under selective recompute of moe_act alone. Per MoE layer (3 of them, one
    micro-batch in flight) the modules drop (test_each_module_drops_its_saved_tensors_by_hand):
    core_attn 4 x 512 x 8 = 16,384 B, moe_act 2 x 1,024 x 128 = 262,144 B, shared_experts
    2 x 512 x 384 = 393,216 B, layernorm 2 x 2 x 512 x 256 = 524,288 B, mla_up_proj
    2 x 512 x 8 x 128 = 1,048,576 B; so core_attn alone does not fit and every other single module
    does. Replayed forward: moe_act 1,024 x 3 x 128 = 393,216 elements at HBM speed, layernorm
    512 x 2 x 256 x 2 = 524,288 elements (test_recompute_flops_by_module_by_hand), shared_experts
    the shared expert's 512-token GEMMs (2 x 512 x 256 x 3 x 128 = 0.1 GFLOP, about 0.1 us at
    H100 rate, beside its 512 x 3 x 128 = 196,608-element copies: less than moe_act's pass), and
    mla_up_proj its GEMMs on top of 851,968 elements. So shared_experts alone, a set the old nested
    ladder (core_attn; + moe_act + layernorm; + mla_up_proj) never tried, is the fastest that fits
    (the brute force over all 81 levels agrees); the ladder's first fitting set, core_attn +
    moe_act + layernorm, is slower."""
    from dayzero.planner.memory.memory import peak_memory_batch
    from dayzero.planner.perf.perf import PerfOptions, evaluate
    from dayzero.planner.search.search import search

    cl = build_cluster("h100", 8)
    p = ParallelConfig(dp=8, mbs=B, gbs=16, seq=S, zero=1, recompute="selective", recompute_modules=("moe_act",))
    limit = float(peak_memory_batch(SPEC, encode([p]), cl.memory_bytes)[0]) * (1 + 1e-9)
    # the module sets alone: activation offload (at seq 256 its copies hide behind the compute, so it
    # would be the plan; planner.search.search.offloaded_variants, tests/planner/search/test_offload_search.py) kept off
    space = SearchSpace(tp=(1,), pp=(1,), cp=(1,), ep=(1,), etp=(1,), vpp=(1,), mbs=(B,), zero=(1,),
                        no_switches=("activation_offload_layers",))
    res = search(SPEC, cl, 16, S, options=PerfOptions(), top_k=1, max_memory=limit / cl.memory_bytes, space=space,
                 memory_fn=peak_memory_batch)
    best = decode(res.candidates)[0]
    assert (best.recompute, best.recompute_modules) == ("selective", ("shared_experts",))

    def timed(ms):
        g = encode([p.with_(recompute_modules=ms)])
        peak = float(peak_memory_batch(SPEC, g, cl.memory_bytes)[0])
        return peak, float(evaluate(SPEC, g, cl, PerfOptions()).step_s[0])

    step = float(res.evaluation.step_s[0])
    assert timed(("core_attn",))[0] > limit
    for ms in (("moe_act",), ("layernorm",), ("mla_up_proj",), ("core_attn", "moe_act", "layernorm")):
        peak, t = timed(ms)
        assert peak <= limit and t > step, ms
    # the brute force: every level of the space at this layout, the fastest that fits
    g = encode([p] * len(levels := space.levels(SPEC)))
    g["recompute"] = np.array([rc for rc, _ in levels])
    g["recompute_modules"] = np.array([mk for _, mk in levels])
    peaks = np.asarray(peak_memory_batch(SPEC, g, cl.memory_bytes))
    steps = np.where(peaks <= limit, evaluate(SPEC, g, cl, PerfOptions()).step_s, np.inf)
    assert float(steps.min()) == pytest.approx(step, rel=1e-12)


def test_bf16_moments_halve_the_moment_bytes():
    """DeepSeek-V3 sec. 3.3.3: BF16 AdamW moments, 2 x 2 B per parameter instead of 2 x 4 B; the
    FP32 master weights stay."""
    p = ParallelConfig(mbs=1, seq=S)
    fp32 = estimate_memory(SPEC, p, 80 * 2**30).stages[0].terms
    bf16 = estimate_memory(SPEC, p, 80 * 2**30, MemoryOptions(optim_bytes=4)).stages[0].terms
    assert bf16["optimizer:moments"] * 2 == fp32["optimizer:moments"]
    assert bf16["optimizer:master"] == fp32["optimizer:master"]
    assert fp32["optimizer:moments"] == 2 * fp32["optimizer:master"]  # 8 B against 4 B per parameter


def test_fp8_swiglu_input_cache_by_hand():
    """Megatron --activation-func-fp8-input-store / DeepSeek-V3 sec. 3.3.3: under FP8 training the
    SwiGLU inputs (2 x 128 per routed row and per token of the shared expert) are saved in 1 B
    instead of 2 B; BF16 training is unchanged."""
    on = MemoryOptions(act_func_fp8_input=True)
    fp8 = layer_terms(SPEC, "moe", on, Dims(S, B, 1, 1, fp8=True))
    assert float(fp8["expert_act_in"]) == 1 * ROUTED * 2 * 128
    assert float(fp8["shared_act_in"]) == 1 * TOK * 2 * 128
    plain = layer_terms(SPEC, "moe", MemoryOptions(), Dims(S, B, 1, 1, fp8=True))
    assert float(plain["expert_act_in"]) == 2 * ROUTED * 2 * 128
    bf16 = layer_terms(SPEC, "moe", on, Dims(S, B, 1, 1))
    assert float(bf16["expert_act_in"]) == 2 * ROUTED * 2 * 128


def test_only_megatron_runs_recompute_modules_and_its_export_says_them():
    """Megatron-Core's --recompute-modules (transformer_config.py recompute_modules); MindSpeed's
    the norms and the activation; torchtitan, DeepSpeed and dayzero's runtime recompute whole
    blocks or the attention core."""
    from dayzero.export.megatron import layout_args
    from dayzero.planner.engines import engines_for

    p = ParallelConfig(recompute="selective", recompute_modules=("layernorm", "moe_act"))
    # MindSpeed recomputes the norms and the activation too (--recompute-norm, --recompute-activation-function)
    assert engines_for(p) == ["megatron", "mindspeed"]
    assert engines_for(p.with_(recompute_modules=("mlp",))) == ["megatron"]
    assert "torchtitan" not in engines_for(p) and "dayzero" in engines_for(p.with_(recompute_modules=()))
    args = [str(a) for a in layout_args(p)]
    i = args.index("--recompute-modules")
    assert args[i + 1:i + 3] == ["moe_act", "layernorm"]
    assert "--recompute-modules" not in [str(a) for a in layout_args(p.with_(recompute_modules=()))]
    assert SearchSpace(engine="torchtitan").levels(SPEC) == [(0, 0), (1, 1), (2, 0)]
    from dayzero.export.megatron import parallel_from_args

    back, _ = parallel_from_args(args, world=1)
    assert back.recompute_modules == ("moe_act", "layernorm") and back.recompute == "selective"


def test_memory_remedies_offer_the_module_sets():
    """``dayzero memory``'s one-flag changes include --recompute-modules with the search's sets when
    they bring the peak under the target (a capacity between the peaks of selective core_attn and
    of core_attn+moe_act+layernorm+mla_up_proj)."""
    from dayzero.planner.search.remedies import single_changes

    p = ParallelConfig(mbs=4, seq=1024, recompute="selective")
    wide = ("core_attn", "moe_act", "layernorm", "mla_up_proj")
    lo = estimate_memory(SPEC, p.with_(recompute_modules=wide), 2**40).peak_bytes
    hi = estimate_memory(SPEC, p, 2**40).peak_bytes
    assert lo < hi
    found = single_changes(SPEC, p, 1, (lo + hi) // 2, MemoryOptions(), 1.0)
    sets = [set(r.parallel.recompute_modules) for r in found if r.change[0] == "--recompute-modules"]
    assert sets and all(s > {"core_attn"} for s in sets)
    # only the least sets that fit: none is a superset of another offered one (it replays more)
    assert not any(a < b for a in sets for b in sets)
    big = single_changes(SPEC, p, 1, 2**40, MemoryOptions(), 1.0)  # everything fits: the smallest sets only
    assert sorted(r.change[1] for r in big if r.change[0] == "--recompute-modules") == \
        ["core_attn,layernorm", "core_attn,mla_up_proj", "core_attn,mlp", "core_attn,moe_act",
         "core_attn,shared_experts"]
