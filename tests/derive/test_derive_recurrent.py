"""Recurrent mixers derived from the modeling code map to the spec's recurrent layers, exactly.

Tiny configs of transformers' own hybrid families (Nemotron-H: Mamba-2 / attention / MLP / MoE
layers; Qwen3-Next: Gated DeltaNet + attention; Mamba-2 alone), built on the meta device. The shapes
come from the weights (structure.recurrent_shapes), the counts must equal the module tree with
nothing left over per layer, and no recurrent layer is approximated as attention any more.
"""

from __future__ import annotations

import json

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from dayzero.specs.counting import flops_per_token, params_total  # noqa: E402
from dayzero.specs.model import RecurrentSpec  # noqa: E402
from dayzero.specs.registry import load_model  # noqa: E402
from helpers.hf_meta import meta_count  # noqa: E402

NEMOTRON_H = dict(hidden_size=256, num_hidden_layers=6, hybrid_override_pattern="M-M*EM", vocab_size=1024,
                  num_attention_heads=8, num_key_value_heads=2, head_dim=32, mamba_num_heads=16, mamba_head_dim=32,
                  ssm_state_size=64, n_groups=4, conv_kernel=4, chunk_size=128, intermediate_size=512,
                  n_routed_experts=8, num_experts_per_tok=2, moe_intermediate_size=128,
                  moe_shared_expert_intermediate_size=256, n_group=1, topk_group=1, tie_word_embeddings=False,
                  max_position_embeddings=4096)
QWEN3_NEXT = dict(hidden_size=64, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                  intermediate_size=96, vocab_size=128, max_position_embeddings=256, num_experts=4,
                  num_experts_per_tok=2, moe_intermediate_size=32, shared_expert_intermediate_size=48,
                  linear_num_value_heads=4, linear_num_key_heads=2, linear_key_head_dim=16, linear_value_head_dim=24)
MAMBA2 = dict(hidden_size=64, num_hidden_layers=3, num_heads=4, head_dim=32, expand=2, state_size=16, n_groups=2,
              vocab_size=128, chunk_size=64)


def load(tmp_path, model_type: str, cfg: dict):
    d = tmp_path / model_type
    d.mkdir()
    (d / "config.json").write_text(json.dumps({"model_type": model_type, **cfg}))
    return load_model(str(d))


def test_nemotron_h_layers_mixer_or_ffn(tmp_path):
    spec = load(tmp_path, "nemotron_h", NEMOTRON_H)
    assert spec.layer_mixers == ("recurrent", "none", "recurrent", "attention", "none", "recurrent")
    assert spec.layer_kinds == ("none", "dense", "none", "none", "moe", "none")
    assert spec.recurrent == RecurrentSpec(kind="mamba2", heads=16, head_dim=32, d_state=64, n_groups=4,
                                           conv_kernel=4, chunk_size=128, conv_bias=True)
    assert params_total(spec) == meta_count("nemotron_h", NEMOTRON_H) == spec.extra["params_module_tree"]
    assert spec.layer_extra == (0,) * 6  # every parameter is in a modelled shape
    notes = " ".join(spec.extra["approximations"])
    assert "window" not in notes and "taken back out" not in notes


def test_qwen3_next_gated_deltanet(tmp_path):
    spec = load(tmp_path, "qwen3_next", QWEN3_NEXT)
    assert spec.layer_mixers == ("recurrent",) * 3 + ("attention",)
    r = spec.recurrent
    assert (r.kind, r.heads, r.head_dim, r.key_heads, r.key_head_dim, r.conv_kernel, r.conv_bias) == (
        "gated_deltanet", 4, 24, 2, 16, 4, False)
    assert params_total(spec) == meta_count("qwen3_next", QWEN3_NEXT)
    assert not any("linear attention / SSM" in a for a in spec.extra["approximations"])


def test_pure_mamba2_flops_linear_in_seq(tmp_path):
    spec = load(tmp_path, "mamba2", MAMBA2)
    assert spec.layer_mixers == ("recurrent",) * 3 and not spec.has_attention
    assert spec.recurrent.kind == "mamba2" and spec.recurrent.d_state == 16 and spec.recurrent.n_groups == 2
    assert params_total(spec) == meta_count("mamba2", MAMBA2)
    a, b = flops_per_token(spec, 1024), flops_per_token(spec, 8192)
    assert a.forward == b.forward and a.attention_forward == 0 and a.recurrent_forward > 0
