"""Saved-activation bytes of layers the shapes only approximate, counted by autograd's saved-tensor
hooks in the forward that dayzero.derive.traced_flops traces at two lengths
(dayzero.derive.traced_act, dayzero.ops.trace.SavedTensors; issue #15 item 1)."""

from __future__ import annotations

import json
from dataclasses import replace

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from dayzero.derive.traced_act import reference_bytes, stand_ins, traced_sides  # noqa: E402
from dayzero.derive.traced_flops import approximated_layers, trace_lengths, with_traced_flops  # noqa: E402
from dayzero.ops.hf_model import build_meta_model  # noqa: E402
from dayzero.ops.trace import _run  # noqa: E402
from dayzero.planner.memory.activations import Dims, layer_activation, layer_terms  # noqa: E402
from dayzero.planner.memory.memory_options import MemoryOptions  # noqa: E402
from dayzero.specs.registry import load_model  # noqa: E402

# llama-like layers: 4 query heads and 2 KV heads of 16, a SwiGLU MLP of 96
LLAMA = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
             intermediate_size=96, vocab_size=128, max_position_embeddings=512)
T = dict(hidden_size=64, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=4, intermediate_size=96,
         vocab_size=128, max_position_embeddings=256)
DSV32 = dict(T, q_lora_rank=32, kv_lora_rank=16, qk_nope_head_dim=8, qk_rope_head_dim=8, v_head_dim=8,
             n_routed_experts=4, num_experts_per_tok=2, moe_intermediate_size=32, n_shared_experts=1,
             first_k_dense_replace=1, n_group=1, topk_group=1, index_n_heads=2, index_head_dim=16)
MINIMAX = dict(T, head_dim=16, num_local_experts=4, num_experts_per_tok=2)


def _write(tmp_path, model_type: str, cfg: dict) -> str:
    d = tmp_path / model_type
    d.mkdir()
    (d / "config.json").write_text(json.dumps({"model_type": model_type, **cfg}))
    return str(d)


def _saved(path: str, seq: int) -> tuple[object, dict]:
    meta = build_meta_model(path)
    return meta, _run(meta, seq, 1, "bfloat16", backward=False, saved=True).saved_bytes


@pytest.mark.parametrize("model_type", ["granite", "llama"])
def test_the_hooks_count_what_the_planner_eager_terms_give_for_a_llama_layer(model_type, tmp_path):
    """Hand count per token at 256 tokens (bf16; transformers' LlamaRMSNorm, eager_attention_forward
    and LlamaMLP): two RMSNorms of 64, each an fp32 upcast 4x64 + fp32 rstd 4 + bf16 normalised copy
    2x64 = 388; attention: q_proj input 128, rotated q 128, K and V repeated to 4 heads 2x2x64, FP32
    softmax 4x4x256, its bf16 cast 2x4x256, o_proj input 128 = 6,784; MLP: gate/up input 128, gate,
    SiLU, up and down inputs 4 x 192 = 896. Total 8,456; at 512 tokens the two score matrices double
    (+4,096 + 2,048): 14,600. Weights, their transposes, the rotary tables and the mask are not counted.
    The planner's eager terms plus transformers' FP32 softmax and repeated K/V give the same (granite:
    derived from its code; llama: the hand-written parser)."""
    path = _write(tmp_path, model_type, LLAMA)
    spec = load_model(path)
    for seq, hand in ((256, 8456), (512, 14600)):
        meta, saved = _saved(path, seq)
        assert len(meta.kinds) == 1
        traced = sum(traced_sides(saved, 0, "", seq))
        assert traced == hand
        assert sum(reference_bytes(spec, 0, seq)) == pytest.approx(traced, rel=0.01)
        assert sum(reference_bytes(spec, 0, seq)) == pytest.approx(hand, abs=1e-6)  # exactly, in fact
    if spec.extra.get("derived"):  # exact layers: not traced, nothing added
        assert approximated_layers(spec.extra["description"], spec) == []
    assert spec.layer_act_extra == ((0.0, 0.0),) * 2


def test_an_indexer_is_measured_counted_always_and_extrapolates(tmp_path):
    """DeepSeek-V3.2's MLA with an indexer (recognised mixer, weights beyond the shapes): its mixer
    side's difference goes into layer_act_extra (counted under fused kernels too) and the fit from
    128 and 256 tokens equals a trace at 192 tokens."""
    path = _write(tmp_path, "deepseek_v32", DSV32)
    spec = load_model(path)
    desc = spec.extra["description"]
    assert not stand_ins(desc) and any(a or b for a, b in spec.layer_act_extra)
    assert spec.layer_act_reference == ((0.0, 0.0),) * spec.layers
    assert any("saved activations measured by tracing" in a and "under every kernel choice" in a
               for a in spec.extra["approximations"])
    meta, saved = _saved(path, 192)
    rep = {i: k for k, kind in enumerate(meta.kinds) for i in kind.layers}
    for i in approximated_layers(desc, spec):
        lin, quad = spec.layer_act_extra[i]
        mixer = traced_sides(saved, rep[i], desc.kind_of()[i].ffn.modules, 192)[0]
        assert reference_bytes(spec, i, 192)[0] + lin + quad * 192 == pytest.approx(mixer, rel=1e-9)
    d = Dims(seq=192, mbs=1, tp=1, cp=1)
    assert "traced_extra" in layer_terms(spec, spec.layer_types[1], MemoryOptions(), d)


def test_an_unread_mixer_counts_its_reference_bytes_under_eager_kernels_only(tmp_path):
    """MiniMax's Lightning attention (modelled as attention, its stand-in): the trace's bytes beyond
    the stand-in's eager terms (its core at the fused log-sum-exp figure) go into layer_act_reference,
    exact at the two traced lengths; a plan with fused kernels keeps the stand-in's terms."""
    path = _write(tmp_path, "minimax", MINIMAX)
    spec = load_model(path)
    desc = spec.extra["description"]
    lightning = sorted(stand_ins(desc))
    assert lightning and set(lightning) <= set(approximated_layers(desc, spec))
    assert spec.layer_act_extra == ((0.0, 0.0),) * spec.layers
    seqs = trace_lengths(spec.max_positions)
    for seq in seqs:
        meta, saved = _saved(path, seq)
        rep = {i: k for k, kind in enumerate(meta.kinds) for i in kind.layers}
        for i in lightning:
            lin, quad = spec.layer_act_reference[i]
            mixer = traced_sides(saved, rep[i], desc.kind_of()[i].ffn.modules, seq)[0]
            assert reference_bytes(spec, i, seq, stand_in=True)[0] + lin + quad * seq == pytest.approx(mixer, rel=1e-9)
    d = Dims(seq=256, mbs=1, tp=1, cp=1)
    kind = spec.layer_types[lightning[0]]
    assert "traced_extra" not in layer_terms(spec, kind, MemoryOptions(), d)
    assert "traced_extra" in layer_terms(spec, kind, MemoryOptions(kernels="eager"), d)
    assert any("under eager kernels only" in a for a in spec.extra["approximations"])


def test_the_planner_term_is_the_mean_per_layer_type_whole_on_every_tp_rank():
    """Hand values, llama-3.1-8b (32 dense layers), seq 4096, mbs 2, tp 4 -> 8,192 tokens per rank.
    Half the layers +1,000 B + 0.5 B x seq per token, half nothing: the mean 500 + 0.25 x 4096 = 1,524 B
    per token, held whole on each TP rank: 12,484,608 B. Layers short of their terms by 3,000 B per
    token: taken out of the TP-split share, -3,000 x 8,192 / 4 = -6,144,000 B. The reference-only
    field counts under eager kernels only. The hand-written preset has none (to_dict unchanged)."""
    base = load_model("llama-3.1-8b")
    assert "layer_act_extra" not in base.to_dict() and "layer_act_reference" not in base.to_dict()
    d = Dims(seq=4096, mbs=2, tp=4, cp=1)
    assert "traced_extra" not in layer_terms(base, "dense", MemoryOptions(kernels="eager"), d)
    half = ((1000.0, 0.5), (0.0, 0.0)) * 16
    spec = replace(base, layer_act_extra=half)
    assert float(layer_terms(spec, "dense", MemoryOptions(), d)["traced_extra"]) == 12_484_608
    assert "layer_act_extra" in spec.to_dict()
    short = replace(base, layer_act_extra=((-3000.0, 0.0),) * 32)
    assert float(layer_terms(short, "dense", MemoryOptions(), d)["traced_extra"]) == -6_144_000
    ref = replace(base, layer_act_reference=((-3000.0, 0.0),) * 32)
    assert "traced_extra" not in layer_terms(ref, "dense", MemoryOptions(), d)
    assert float(layer_terms(ref, "dense", MemoryOptions(kernels="eager"), d)["traced_extra"]) == -6_144_000
    both = replace(spec, layer_act_reference=((-3000.0, 0.0),) * 32)
    assert float(layer_terms(both, "dense", MemoryOptions(kernels="eager"), d)["traced_extra"]) == \
        12_484_608 - 6_144_000
    # a sum of tensors, not one: the largest single tensor (the biggest backward temporary) is unchanged
    huge = replace(base, layer_act_extra=((1e9, 0.0),) * 32)
    assert layer_activation(huge, "dense", MemoryOptions(), d).largest == \
        layer_activation(base, "dense", MemoryOptions(), d).largest
    assert layer_activation(huge, "dense", MemoryOptions(), d).none == pytest.approx(
        layer_activation(base, "dense", MemoryOptions(), d).none + 1e9 * 8192)
    # vectorised over candidates, as the search evaluates it
    dv = Dims(seq=np.array([4096, 4096]), mbs=np.array([2, 2]), tp=np.array([1, 4]), cp=np.array([1, 1]))
    got = layer_terms(short, "dense", MemoryOptions(), dv)["traced_extra"]
    assert list(got) == [-3000 * 8192, -3000 * 8192 / 4]


def test_a_trace_past_its_budget_measures_no_bytes_either(tmp_path):
    path = _write(tmp_path, "deepseek_v32", DSV32)
    spec = load_model(path)
    plain = replace(spec, layer_flops_extra=(), layer_act_extra=(), layer_act_reference=())
    out, _ = with_traced_flops(path, spec.extra["description"], plain, budget_s=0.0)
    assert out.layer_act_extra == out.layer_act_reference == ((0.0, 0.0),) * spec.layers


def test_a_proxy_keeps_the_measured_bytes_of_the_layers_it_keeps_and_drops_them_at_another_width():
    base = load_model("llama-3.1-8b")
    extra = tuple((float(i), 0.0) for i in range(32))
    spec = replace(base, layer_act_extra=extra, layer_act_reference=extra)
    deeper = spec.shrink(layers=3)
    assert deeper.layer_act_extra == deeper.layer_act_reference == ((0.0, 0.0), (1.0, 0.0), (2.0, 0.0))
    narrower = spec.shrink(hidden=1024)  # the bytes were measured at the full width
    assert narrower.layer_act_extra == narrower.layer_act_reference == ((0.0, 0.0),) * 32
