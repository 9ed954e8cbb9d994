"""Counting agrees, to the unit, with the tensors of the real transformers implementation.

For every supported model_type a small random config (never seen as a preset) is instantiated by
transformers on the meta device; dayzero's count must equal its parameter plus persistent-buffer elements.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from dayzero.specs import counting  # noqa: E402
from dayzero.specs.hf_config import SUPPORTED_MODEL_TYPES, spec_from_hf_config  # noqa: E402

BASE = dict(hidden_size=96, num_hidden_layers=3, num_attention_heads=6, num_key_value_heads=2,
            intermediate_size=160, vocab_size=301, max_position_embeddings=128, tie_word_embeddings=False)
MLA = dict(q_lora_rank=40, kv_lora_rank=24, qk_nope_head_dim=16, qk_rope_head_dim=8, v_head_dim=12,
           num_key_value_heads=6)
MOE_DS = dict(n_routed_experts=6, num_experts_per_tok=2, moe_intermediate_size=48, n_shared_experts=2,
              first_k_dense_replace=1, n_group=1, topk_group=1, num_nextn_predict_layers=1)

CONFIGS = {
    "llama": dict(BASE, attention_bias=True, mlp_bias=True),
    "mistral": dict(BASE, head_dim=20, sliding_window=64),
    "qwen2": dict(BASE, use_sliding_window=True, sliding_window=32, max_window_layers=1),
    "qwen3": dict(BASE, head_dim=24, attention_bias=True),
    "mixtral": dict(BASE, num_local_experts=4, num_experts_per_tok=2),
    "qwen3_moe": dict(BASE, head_dim=16, num_experts=5, num_experts_per_tok=2, moe_intermediate_size=40,
                      decoder_sparse_step=1, mlp_only_layers=[1]),
    "deepseek_v2": dict(BASE, **MLA, **{**MOE_DS, "n_group": 1}, topk_method="greedy"),
    "deepseek_v3": dict(BASE, **MLA, **MOE_DS),
    "glm4_moe": dict(BASE, head_dim=16, attention_bias=True, use_qk_norm=True, partial_rotary_factor=0.5,
                     n_routed_experts=4, num_experts_per_tok=2, moe_intermediate_size=32, n_shared_experts=1,
                     first_k_dense_replace=1, n_group=1, topk_group=1),
    "gpt_oss": dict(BASE, head_dim=16, num_local_experts=4, num_experts_per_tok=2, sliding_window=16,
                    layer_types=["sliding_attention", "full_attention", "sliding_attention"]),
    "nemotron": dict(BASE, head_dim=16, attention_bias=True, mlp_bias=True, hidden_act="relu2"),
    "gpt2": dict(n_embd=96, n_layer=3, n_head=6, n_positions=64, vocab_size=301),
}
HF_TYPE = {"kimi_k2": "deepseek_v3"}  # transformers has no kimi_k2 class: same architecture


def _hf_param_count(model_type: str, cfg: dict) -> int:
    config = transformers.AutoConfig.for_model(HF_TYPE.get(model_type, model_type), **cfg)
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(config)
    params = sum(p.numel() for p in model.parameters())  # parameters() yields a tied tensor once
    # Persistent buffers are stored in checkpoints too: DeepSeek-V3/GLM-4.5 keep the noaux_tc router's
    # e_score_correction_bias as a buffer (the published counts include it); rotary inv_freq is not persistent.
    buffers = sum(b.numel() for m in model.modules() for n, b in m._buffers.items()
                  if b is not None and n not in m._non_persistent_buffers_set)
    return params + buffers


@pytest.mark.parametrize("model_type", [t for t in SUPPORTED_MODEL_TYPES if t != "kimi_k2"])
def test_count_equals_transformers(model_type):
    cfg = CONFIGS[model_type]
    spec = spec_from_hf_config({"model_type": model_type, **cfg}, model_type)
    assert counting.params_total(spec) == _hf_param_count(model_type, cfg)


def test_kimi_k2_counts_as_deepseek_v3():
    cfg = dict(BASE, **MLA, **MOE_DS)
    a = spec_from_hf_config({"model_type": "kimi_k2", **cfg}, "k")
    b = spec_from_hf_config({"model_type": "deepseek_v3", **cfg}, "d")
    assert counting.params_total(a) == counting.params_total(b) == _hf_param_count("kimi_k2", cfg)


def test_every_supported_type_has_a_reference_config():
    assert set(SUPPORTED_MODEL_TYPES) - {"kimi_k2"} == set(CONFIGS)
