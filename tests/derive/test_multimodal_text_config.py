"""A multimodal config whose language model is a sub-config (``text_config``) that transformers does
not build as a causal LM itself (Mistral3): its language model is derived, planned and trained as a
proxy, and every output says the other towers are not planned."""

from __future__ import annotations

import pytest

transformers = pytest.importorskip("transformers")
torch = pytest.importorskip("torch")


def _small_mistral3(tmp_path):
    cfg = transformers.Mistral3Config(text_config={"model_type": "mistral", "hidden_size": 256, "num_hidden_layers": 3,
                                                   "num_attention_heads": 4, "num_key_value_heads": 2,
                                                   "intermediate_size": 512, "vocab_size": 512, "head_dim": 64})
    cfg.save_pretrained(tmp_path)
    return cfg


def test_the_language_model_of_a_multimodal_config_is_derived_exactly(tmp_path):
    from dayzero.report.model_notes import model_notes
    from dayzero.specs.counting import params_total
    from dayzero.specs.registry import load_model

    cfg = _small_mistral3(tmp_path)
    spec = load_model(str(tmp_path))
    with torch.device("meta"):
        lm = transformers.AutoModelForCausalLM.from_config(cfg.get_text_config())
    assert params_total(spec) == sum(p.numel() for p in lm.parameters())
    notes = model_notes(spec)
    assert any("text_config" in n and "vision_config" in n for n in notes["config_notes"])
    assert "vision_config" in notes["unused_config_keys"]


def test_its_proxy_shrinks_the_language_model(tmp_path):
    from dayzero.runtime.config import ModelSection
    from dayzero.runtime.models.hf_model import proxy_config

    _small_mistral3(tmp_path)
    config, _, _ = proxy_config(ModelSection(name=str(tmp_path), layers=2, hidden=128))
    assert type(config).__name__ == "MistralConfig"
    assert config.num_hidden_layers == 2 and config.hidden_size == 128


def test_a_config_transformers_builds_itself_is_kept_whole():
    from dayzero.ops.hf_model import language_model_config

    cfg, notes = transformers.LlamaConfig(), []
    assert language_model_config(cfg, notes) is cfg and notes == []


def test_a_causal_lm_config_holding_its_language_model_as_text_config_shrinks_that(tmp_path):
    """Llama 4: transformers builds the outer config as a causal LM, the layers and width live in its
    text_config; the proxy shrinks those, inside the outer config (not the untouched full size)."""
    from dayzero.runtime.config import ModelSection
    from dayzero.runtime.models.hf_model import proxy_config

    transformers.Llama4Config(text_config={"hidden_size": 512, "intermediate_size": 256, "intermediate_size_mlp": 512,
                                           "num_hidden_layers": 4, "num_attention_heads": 8, "num_key_value_heads": 2,
                                           "head_dim": 64, "num_local_experts": 4, "vocab_size": 1024}
                              ).save_pretrained(tmp_path)
    config, _, notes = proxy_config(ModelSection(name=str(tmp_path), layers=1, hidden=128))
    text = config.get_text_config()
    assert type(config).__name__ == "Llama4Config" and text.hidden_size == 128
    # one layer of each of its kinds (dense/MoE interleaved, RoPE/NoPE), fewer than the 4 it had only if it has fewer
    assert text.num_hidden_layers <= 4 and (text.num_hidden_layers == 1 or any("kind" in n for n in notes))
