"""Exact parameter counts against published numbers, and FLOPs against closed forms."""

from __future__ import annotations

from dataclasses import replace

import pytest

from dayzero.specs import counting
from dayzero.specs.hf_config import spec_from_hf_config
from dayzero.specs.registry import load_model


def _targets(model_catalog):
    for m in model_catalog["models"]:
        for t in m["exact_test_targets"]:
            if t["value"] is not None:
                yield m, t


def _count_for(spec, definition: str, value: int) -> int:
    d = definition.lower()
    if "every tensor element" in d or "hf checkpoint" in d:
        return counting.checkpoint_elements(spec)
    if "vocab_size 32000" in d:
        return counting.params_total(replace(spec, vocab=32000))
    return counting.params_total(spec)


def test_every_exact_target_matches(model_catalog):
    checked = 0
    for m, t in _targets(model_catalog):
        spec = spec_from_hf_config(m["config"], m["id"])
        assert _count_for(spec, t["definition"], t["value"]) == t["value"], (m["id"], t["definition"])
        checked += 1
    assert checked >= 12


def test_with_mtp_adds_the_unique_mtp_parameters(model_catalog):
    by_id = {m["id"]: m for m in model_catalog["models"]}
    ds = spec_from_hf_config(by_id["deepseek-v3"]["config"], "ds")
    c = by_id["deepseek-v3"]["computed"]
    assert counting.params_total(ds, with_mtp=True) == c["main_model_params"] + c["mtp_unique_params"]
    assert counting.fp8_scale_elements(ds) == c["fp8_weight_scale_inv_elements"]
    glm = spec_from_hf_config(by_id["glm-4.5"]["config"], "glm")
    assert counting.params_total(glm, with_mtp=True) == by_id["glm-4.5"]["computed"]["main_plus_mtp"]


@pytest.mark.parametrize("model_id,key", [
    ("deepseek-v3", "active_params_incl_embed_and_head"), ("kimi-k2", "active_incl_embed_and_head"),
    ("qwen3-235b-a22b", "active_incl_embed_and_head"), ("mixtral-8x7b", "active"),
    ("glm-4.5", "active_incl_embed_and_head"), ("mixtral-8x22b", "active_vocab_32768"),
])
def test_active_params_match_published(model_catalog, model_id, key):
    m = next(m for m in model_catalog["models"] if m["id"] == model_id)
    assert counting.params_active(spec_from_hf_config(m["config"], model_id)) == m["computed"][key]


def _narayanan_per_token(layers, h, s, V):
    return 72 * layers * h * h * (1 + s / (6 * h) + V / (12 * layers * h))


@pytest.mark.parametrize("cfg", [
    dict(n_embd=12288, n_layer=96, n_head=96, vocab_size=51200, n_positions=2048),  # GPT-3 175B (Megatron vocab)
    dict(n_embd=25600, n_layer=128, n_head=160, vocab_size=51200, n_positions=2048),  # Megatron 1T
    dict(n_embd=2048, n_layer=24, n_head=16, vocab_size=51200, n_positions=2048),
])
def test_gpt_flops_match_narayanan_closed_form(cfg):
    spec = spec_from_hf_config({"model_type": "gpt2", **cfg}, "gpt")
    s = cfg["n_positions"]
    got = counting.flops_per_token(spec, seq=s, causal=False).train
    want = _narayanan_per_token(cfg["n_layer"], cfg["n_embd"], s, cfg["vocab_size"])
    assert got == pytest.approx(want, rel=1e-12)


def test_causal_convention_halves_attention_only():
    spec = load_model("gpt3-175b")
    full = counting.flops_per_token(spec, seq=2048, causal=False)
    causal = counting.flops_per_token(spec, seq=2048, causal=True)
    assert causal.matmul_forward == full.matmul_forward
    assert causal.attention_forward == pytest.approx(full.attention_forward * (2049 / 2) / 2048)


def test_sliding_window_caps_attention_flops():
    spec = load_model("gpt-oss-120b")
    short = counting.flops_per_token(spec, seq=128).attention_forward
    long = counting.flops_per_token(spec, seq=8192).attention_forward
    # half the layers see at most 128 keys, so long-context attention grows by about half the ratio
    assert long / short == pytest.approx((18 * 8192 + 18 * 128) / (36 * 128))


@pytest.mark.parametrize("name,low,high", [("dense-3t", 2.97e12, 3.03e12), ("moe-3t", 2.97e12, 3.03e12),
                                           ("tiny-llama", 1e6, 1e7), ("tiny-moe", 1e6, 1e7),
                                           ("gpt3-175b", 174e9, 176e9)])
def test_presets_have_documented_sizes(name, low, high):
    assert low <= counting.params_total(load_model(name)) <= high


def test_tiny_moe_has_every_feature():
    s = load_model("tiny-moe")
    assert s.attention.kind == "mla" and s.attention.q_lora_rank
    assert s.moe.shared_experts == 1 and s.layer_kinds[0] == "dense" and s.layer_kinds[1] == "moe"
