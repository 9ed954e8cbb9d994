"""The memory model: ZeRO paper numbers, exact model states, per-stage unevenness, batch == scalar."""

from __future__ import annotations

import numpy as np
import pytest

from dayzero.errors import ConfigError, LayoutError
from dayzero.planner.memory.activations import Dims, layer_activation
from dayzero.planner.memory.memory import (
    CATEGORIES,
    MemoryOptions,
    estimate_memory,
    model_states,
    peak_memory_batch,
    zero_comparison,
    zero_state_bytes,
)
from dayzero.planner.memory.params import layer_params
from dayzero.specs import layout_rules
from dayzero.specs.counting import layer_count, params_total
from dayzero.specs.grid import encode
from dayzero.specs.parallel import ParallelConfig, even_split, model_split
from dayzero.specs.registry import load_model

GB = 10**9
ZERO_PAPER = MemoryOptions(param_bytes=2, grad_bytes=2, master_bytes=4, optim_bytes=8)  # K = 12


def test_zero_paper_figure_1_numbers():
    """Rajbhandari et al. 2020, Fig. 1: 7.5B parameters, Nd = 64, K = 12."""
    psi = 7.5e9
    got = [zero_state_bytes(psi, 64, z, ZERO_PAPER) / GB for z in range(4)]
    assert [round(x, 1) for x in got] == [120.0, 31.4, 16.6, 1.9]


def test_megatron_distributed_optimizer_is_6_plus_12_over_dp():
    for dp in (1, 8, 64):
        assert zero_state_bytes(1, dp, 1) == pytest.approx(6 + 12 / dp)
    assert MemoryOptions().bytes_per_param == 18 and ZERO_PAPER.bytes_per_param == 16


@pytest.mark.parametrize("model", ["llama-3.1-8b", "tiny-moe", "gpt3-175b", "mixtral-8x7b"])
@pytest.mark.parametrize("zero", [0, 1, 2, 3])
def test_single_stage_model_states_are_exact(model, zero):
    """tp = pp = 1: the model states of the one stage are the exact parameter count times the bytes,
    divided by dp where ZeRO shards them (the ZeRO paper's arithmetic, per stage)."""
    spec = load_model(model)
    dp = 16
    st = estimate_memory(spec, ParallelConfig(dp=dp, zero=zero), 80 * GB, ZERO_PAPER).stages[0]
    want = zero_state_bytes(params_total(spec), dp, zero, ZERO_PAPER)
    assert st.model_states == pytest.approx(want, abs=3)


def test_parameter_split_sums_to_exact_counts():
    for model in ("deepseek-v3", "gpt-oss-120b", "qwen3-235b-a22b", "gpt3-175b", "glm-4.5"):
        spec = load_model(model)
        for kind in set(spec.layer_kinds):
            assert layer_params(spec, kind).total == layer_count(spec, 0, kind).total


def test_tp_pp_shards_add_back_to_the_model():
    """Summing one TP group's weights over all stages gives the model back, up to what TP
    replicates (norms, router, KV heads when tp > kv_heads) and the tied-head copy."""
    spec = load_model("llama-3.1-70b")  # kv 8, untied
    tp = 8
    rep = estimate_memory(spec, ParallelConfig(tp=tp, pp=4, zero=0), 80 * GB)
    weights = sum(s.weights for s in rep.stages) * tp / 2
    replicated = spec.layers * (tp - 1) * layer_params(spec, "dense").rep + (tp - 1) * spec.hidden
    assert weights == pytest.approx(params_total(spec) + replicated, abs=tp * 4)


def test_moe_experts_shard_over_ep_and_zero_over_edp():
    spec = load_model("deepseek-v3")
    base = dict(tp=1, pp=1, dp=64, zero=1)
    e8 = estimate_memory(spec, ParallelConfig(**base, ep=8), 80 * GB).stages[0]
    e64 = estimate_memory(spec, ParallelConfig(**base, ep=64), 80 * GB).stages[0]
    assert e64.terms["weights:experts"] * 8 == pytest.approx(e8.terms["weights:experts"], rel=1e-12)
    # ZeRO-1 shards expert optimizer states over edp = 64/ep: per device it is the same either way
    opt8 = e8.optimizer - e64.optimizer
    assert abs(opt8) < 1e-9 * e8.optimizer + 2


def seed_layout(**kw) -> ParallelConfig:
    return ParallelConfig(**{**dict(tp=8, pp=16, dp=64, zero=3, recompute="full"), **kw})


def test_seed_scenario_classic_arithmetic():
    spec = load_model("dense-3t")
    ms = model_states(params_total(spec))
    assert ms.weights / 1e12 == pytest.approx(6.0, rel=1e-3)  # 2 B x 3e12
    assert ms.moments / 1e12 == pytest.approx(24.0, rel=1e-3)  # FP32 exp_avg + exp_avg_sq
    assert ms.master / 1e12 == pytest.approx(12.0, rel=1e-3)
    rows = zero_comparison(spec, seed_layout(), 64 * GB)
    # dp = 64 with FP32 grads: ZeRO-2 cuts 18 B to 2 + 16/64 = 2.25 B per parameter, exactly 8x
    assert rows[2]["cut_factor"] == pytest.approx(8.0, rel=1e-9)
    assert rows[1]["cut_factor"] == pytest.approx(18 / (6 + 12 / 64), rel=1e-9)
    assert rows[3]["cut_factor"] == pytest.approx(64.0, rel=1e-9)
    assert not rows[0]["fits"] and rows[3]["fits"]
    rows16 = zero_comparison(spec, seed_layout(), 64 * GB, MemoryOptions(grad_bytes=2))
    assert rows16[2]["cut_factor"] == pytest.approx(16 / (2 + 14 / 64), rel=1e-9)  # ~7.2x with BF16 grads


def test_stages_are_visibly_uneven():
    spec = load_model("dense-3t")
    rep = estimate_memory(spec, seed_layout(gbs=64 * 32, recompute="selective", sequence_parallel=True), 64 * GB)
    first, mid, last = rep.stages[0], rep.stages[7], rep.stages[-1]
    emb = "weights:embedding"
    assert first.terms[emb] > 0 and mid.terms[emb] == 0 == last.terms[emb]
    assert last.terms["weights:head"] > 0 and first.terms["weights:head"] == 0
    assert last.terms["temporary:logits"] > 0 and all(s.terms["temporary:logits"] == 0 for s in rep.stages[:-1])
    acts = [s.terms["activations:layers"] for s in rep.stages]
    assert acts == sorted(acts, reverse=True) and acts[0] == 16 * acts[-1]  # 1F1B: pp - i in flight
    assert first.activations > mid.activations > last.terms["activations:layers"]


def test_uneven_layer_split_is_accounted_per_stage():
    spec = load_model("llama-3.1-8b")  # 32 layers
    rep = estimate_memory(spec, ParallelConfig(pp=4, layer_split=(6, 9, 9, 8), zero=0), 80 * GB)
    assert [len(s.layers) for s in rep.stages] == [6, 9, 9, 8]
    per_layer = rep.stages[1].terms["weights:layers"] / 9
    assert rep.stages[0].terms["weights:layers"] == pytest.approx(6 * per_layer, abs=2)


def test_deepseek_dense_prefix_makes_first_stage_lighter_in_experts():
    spec = load_model("deepseek-v3")  # 3 dense layers first
    rep = estimate_memory(spec, ParallelConfig(pp=4, layer_split=(16, 15, 15, 15), ep=8, dp=8, zero=1), 80 * GB)
    assert rep.stages[0].terms["weights:experts"] < rep.stages[1].terms["weights:experts"]


def test_report_dict_follows_the_design_contract():
    spec = load_model("tiny-llama")
    rep = estimate_memory(spec, ParallelConfig(pp=2, dp=2, gbs=8), 8 * GB)
    d = rep.to_dict()
    assert set(d) == {"peak_bytes", "capacity_bytes", "utilization", "stages", "fits"}
    for s in d["stages"]:
        assert {"stage", *CATEGORIES, "total"} <= set(s)
        assert s["total"] == sum(s[c] for c in CATEGORIES)
    assert d["peak_bytes"] == max(s["total"] for s in d["stages"]) and d["fits"] is True
    assert d["utilization"] == pytest.approx(d["peak_bytes"] / d["capacity_bytes"])


def test_impossible_layouts_and_options_raise_one_line_errors():
    spec = load_model("llama-3.1-8b")
    with pytest.raises(LayoutError, match="heads"):
        estimate_memory(spec, ParallelConfig(tp=3), 80 * GB)
    with pytest.raises(LayoutError, match="divisible by pp"):
        estimate_memory(spec, ParallelConfig(pp=5), 80 * GB)
    with pytest.raises(ConfigError, match="fragmentation"):
        MemoryOptions(fragmentation=1.5)


def test_batch_equals_scalar_on_named_layouts():
    cases = {
        "dense-3t": [seed_layout(), seed_layout(zero=1, recompute="selective", sequence_parallel=True, gbs=4096),
                     seed_layout(pp=8, dp=128, vpp=2, gbs=1024, zero=2, precision="fp8")],
        "deepseek-v3": [ParallelConfig(tp=2, pp=1, dp=32, ep=16, cp=2, mbs=1, gbs=64, seq=4096, zero=1,
                                       sequence_parallel=True),
                        ParallelConfig(tp=1, pp=1, dp=64, ep=64, zero=3, recompute="full", schedule="gpipe")],
        "gpt-oss-120b": [ParallelConfig(tp=8, pp=4, dp=4, ep=4, etp=2, gbs=64, zero=2, precision="fp8")],
    }
    # uneven even-splits (61 and 96 layers over many stages): the batch path evaluates only the ranks
    # that can be busiest; the scalar path evaluates all of them
    for pp, vpp in ((8, 1), (4, 2), (16, 1), (61, 1)):
        cases["deepseek-v3"].append(ParallelConfig(pp=pp, vpp=vpp, dp=8, ep=8, gbs=8 * pp * 2, zero=1,
                                                   layer_split=model_split(61, pp * vpp, 1)))  # + the MTP layer
    cases["gpt3-175b"] = [ParallelConfig(tp=8, pp=pp, dp=2, gbs=2 * pp, zero=z, recompute="selective",
                                         layer_split=even_split(96, pp)) for pp, z in ((64, 1), (40, 3), (7, 0))]
    for model, layouts in cases.items():
        spec = load_model(model)
        want = [estimate_memory(spec, p, 80 * GB).peak_bytes for p in layouts]
        got = peak_memory_batch(spec, encode(layouts), 80 * GB)
        np.testing.assert_allclose(got, want, rtol=1e-12, atol=8)


def test_batch_rejects_a_malformed_grid():
    spec = load_model("tiny-llama")
    with pytest.raises(LayoutError, match="lacks"):
        peak_memory_batch(spec, {"tp": np.array([1])}, 1)


def test_balanced_split_lowers_the_peak():
    from dayzero.planner.memory.balance import balance_layers

    spec = load_model("llama-3.1-70b")  # 80 layers
    p = ParallelConfig(tp=8, pp=8, dp=4, gbs=256, zero=1, sequence_parallel=True)
    split = balance_layers(spec, p, 80 * GB)
    assert sum(split) == 80 and len(split) == 8 and split[0] < split[-1]
    even = estimate_memory(spec, p, 80 * GB).peak_bytes
    balanced = estimate_memory(spec, p.with_(layer_split=split), 80 * GB)
    assert balanced.peak_bytes < 0.85 * even
    # no contiguous split does better: moving one layer off the busiest stage raises a neighbour above it
    b = balanced.busiest_stage
    for nb in (b - 1, b + 1):
        if 0 <= nb < 8:
            moved = list(split)
            moved[b] -= 1
            moved[nb] += 1
            assert estimate_memory(spec, p.with_(layer_split=tuple(moved)), 80 * GB).peak_bytes >= balanced.peak_bytes
    with pytest.raises(LayoutError, match="vpp"):
        balance_layers(spec, p.with_(vpp=2), 80 * GB)


def test_vendor_defaults_for_communicator_buffers():
    from dayzero.specs.hardware import get_accelerator

    assert MemoryOptions.for_accelerator(get_accelerator("910b")).comm_buffer_bytes == 400 * 10**6
    assert MemoryOptions.for_accelerator(get_accelerator("h100")).comm_buffer_bytes == MemoryOptions().comm_buffer_bytes
    spec = load_model("tiny-llama")
    one = estimate_memory(spec, ParallelConfig(), GB).stages[0].terms["overhead:comm_buffers"]
    four = estimate_memory(spec, ParallelConfig(tp=2, pp=2, dp=2, gbs=8), GB).stages[0].terms["overhead:comm_buffers"]
    assert one == 0 and four == 4 * MemoryOptions().comm_buffer_bytes  # tp, dp (x cp), pp send + receive


def test_batch_reads_recompute_layers_as_estimate_memory_does():
    """The grid's recompute_layers column (0: every layer) prices full recompute of the first N
    layers of each chunk, as estimate_memory (memory._features) does: DeepSeek-V3's first 3 dense
    layers, vpp chunks, the MTP layer on the last stage, N up to a chunk's length (4 of pp16's
    chunks). N beyond the largest chunk, or N without full recompute, is a layout error."""
    spec = load_model("deepseek-v3")
    layouts = [ParallelConfig(pp=pp, vpp=vpp, dp=8, ep=8, gbs=8 * pp * 2, zero=1, recompute="full",
                              recompute_layers=n, layer_split=model_split(61, pp * vpp, 1))
               for pp, vpp in ((8, 1), (4, 2), (16, 1)) for n in (None, 1, 2, 4)]
    want = [estimate_memory(spec, p, 80 * GB).peak_bytes for p in layouts]
    got = peak_memory_batch(spec, encode(layouts), 80 * GB)
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=8)
    beyond = layouts[-1].with_(recompute_layers=5)  # pp16: ceil(61 / 16) = 4 layers a chunk
    assert any("exceed the 4 layers of a model chunk" in m for m in layout_rules.problems(beyond, spec))
    selective = layouts[-1].with_(recompute="selective")
    assert any("need recompute full" in m for m in layout_rules.problems(selective, spec))


def test_recompute_layers_memory_is_linear_in_n():
    """Each layer taken out of full recompute keeps its whole activation (memory_terms: n - nfull
    layers at a.none, nfull at a.full) instead of its input: on a model of identical layers
    (tiny-llama, 4 dense layers, one stage: 1 micro-batch in flight) the peak falls by the same
    bytes, none - full of one layer, per layer recomputed from N = 1 on; N = 4 equals every layer."""
    spec = load_model("tiny-llama")
    base = dict(pp=1, dp=1, gbs=1, recompute="full")
    layouts = [ParallelConfig(**base, recompute_layers=n) for n in range(1, 5)] + [ParallelConfig(**base)]
    no_frag = MemoryOptions(fragmentation=0.0)  # the allocator's budget scales activations too
    peaks = peak_memory_batch(spec, encode(layouts), 80 * GB, no_frag)
    a = layer_activation(spec, "dense", no_frag, Dims(seq=4096, mbs=1, tp=1, cp=1))
    np.testing.assert_allclose(np.diff(peaks[:4]), -(a.none - a.full), rtol=1e-9)
    assert peaks[3] == peaks[4]
