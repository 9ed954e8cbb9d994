"""Hybrid configs read by their keys: spec_from_hf_config builds Nemotron-H-style models exactly.

The parameter count equals transformers' NemotronH model on the meta device to the unit, with
and without LatentMoE (moe_latent_size), and from either pattern key; bad patterns are one line.
"""

from __future__ import annotations

import pytest

from dayzero.errors import ConfigError
from dayzero.specs.counting import flops_per_token, params_total
from dayzero.specs.hf_config import spec_from_hf_config
from helpers.hf_meta import meta_count

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

TINY = dict(model_type="nemotron_h", hidden_size=256, num_hidden_layers=8, hybrid_override_pattern="M-M*EMEM",
            vocab_size=1024, num_attention_heads=8, num_key_value_heads=2, head_dim=32, mamba_num_heads=16,
            mamba_head_dim=32, ssm_state_size=64, n_groups=4, conv_kernel=4, chunk_size=128, intermediate_size=512,
            mlp_hidden_act="relu2", n_routed_experts=8, num_experts_per_tok=2, moe_intermediate_size=128,
            moe_shared_expert_intermediate_size=256, n_group=1, topk_group=1, tie_word_embeddings=False,
            max_position_embeddings=4096, use_bias=False, use_conv_bias=True, mlp_bias=False)


@pytest.mark.parametrize("extra", [{}, {"moe_latent_size": 64}, {"use_bias": True, "use_conv_bias": False}])
def test_nemotron_h_count_equals_transformers(extra):
    cfg = {**TINY, **extra}
    spec = spec_from_hf_config(cfg, "tiny")
    assert params_total(spec) == meta_count("nemotron_h", {k: v for k, v in cfg.items() if k != "model_type"})
    assert spec.layer_mixers == ("recurrent", "none", "recurrent", "attention", "none", "recurrent", "none",
                                 "recurrent")
    assert spec.layer_kinds == ("none", "dense", "none", "none", "moe", "none", "moe", "none")
    if extra.get("moe_latent_size"):  # 128 x 64 / 256 = 32 wide in H; the projections join the shared expert
        assert (spec.moe.expert.intermediate, spec.moe.shared_intermediate) == (32, 256 + 64)
        assert any("LatentMoE" in a for a in spec.extra["approximations"])


def test_layers_block_type_is_the_same_model():
    blocks = {"M": "mamba", "-": "mlp", "*": "attention", "E": "moe"}
    cfg = {k: v for k, v in TINY.items() if k != "hybrid_override_pattern"}
    cfg["layers_block_type"] = [blocks[c] for c in TINY["hybrid_override_pattern"]]
    a, b = spec_from_hf_config(cfg, "tiny"), spec_from_hf_config(TINY, "tiny")
    assert a.digest() == b.digest()
    assert "layers_block_type" not in a.extra["unused_config_keys"]


def test_layer_types_with_linear_attention():
    cfg = dict(model_type="some_new_hybrid", hidden_size=64, num_hidden_layers=4, vocab_size=128,
               num_attention_heads=4, num_key_value_heads=2, head_dim=16, intermediate_size=96,
               layer_types=["linear_attention"] * 3 + ["full_attention"], linear_num_value_heads=4,
               linear_value_head_dim=24, linear_num_key_heads=2, linear_key_head_dim=16, linear_conv_kernel_dim=4)
    spec = spec_from_hf_config(cfg, "x")
    assert spec.layer_mixers == ("recurrent",) * 3 + ("attention",) and spec.layer_kinds == ("dense",) * 4
    assert spec.recurrent.kind == "gated_deltanet" and spec.recurrent.key_heads == 2
    assert flops_per_token(spec, 2048).recurrent_forward == flops_per_token(spec, 8192).recurrent_forward


@pytest.mark.parametrize("bad,field", [({"hybrid_override_pattern": "M-X"}, "hybrid_override_pattern"),
                                       ({"num_hidden_layers": 5}, "hybrid_override_pattern"),
                                       ({"n_groups": 3}, "n_groups")])
def test_bad_hybrid_configs_are_one_line(bad, field):
    with pytest.raises(ConfigError) as e:
        spec_from_hf_config({**TINY, **bad}, "tiny")
    assert field in str(e.value) and "\n" not in str(e.value)
