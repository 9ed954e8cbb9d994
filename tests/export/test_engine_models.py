"""Each engine export builds the planned model in the engine's own terms, proven by the engine's own
classes: the written Megatron arguments give Megatron-Core's GPTModel (built on the meta device from
TransformerConfig / MLATransformerConfig) and the written DeepSpeed files give DeepSpeedConfig and the
transformers model train.py builds, each with exactly `dayzero inspect`'s parameter count, for every
preset; every hyperparameter Megatron has a flag for is written; a layer kind an engine cannot build
is refused with its name, never approximated."""

from __future__ import annotations

import json

import pytest

from dayzero.cli.app import main
from dayzero.errors import ConfigError
from dayzero.export import deepspeed, megatron
from dayzero.specs.counting import params_total
from dayzero.specs.parallel import ParallelConfig as P
from dayzero.specs.registry import load_model, model_config, model_presets

pytest.importorskip("torch")
readback = pytest.importorskip("dayzero.export.readback")

SLOW = {"moe-3t", "kimi-k2", "deepseek-v3", "glm-4.5", "qwen3-235b-a22b", "dense-3t"}  # seconds each on meta
PRESETS = [pytest.param(n, marks=pytest.mark.slow) if n in SLOW else n for n in sorted(model_presets())]
QWEN3_NEXT = dict(model_type="qwen3_next", hidden_size=64, num_hidden_layers=4, num_attention_heads=4,
                  num_key_value_heads=2, head_dim=16, intermediate_size=96, vocab_size=128,
                  max_position_embeddings=256, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32,
                  shared_expert_intermediate_size=48, linear_num_value_heads=4, linear_num_key_heads=2,
                  linear_key_head_dim=16, linear_value_head_dim=24)  # a hybrid: 3 Gated-DeltaNet layers, 1 attention


def _args(files: dict[str, str]) -> list[str]:
    import shlex

    return shlex.split(files[megatron.ARGS_FILE])


@pytest.mark.parametrize("name", PRESETS)
def test_megatron_core_builds_the_exported_model_with_inspects_parameter_count(name):
    pytest.importorskip("megatron.core")
    spec = load_model(name)
    exp = megatron.export(spec, P(dp=8, gbs=8))
    assert readback.megatron_parameters(_args(exp.files)) == params_total(spec, with_mtp=True)


@pytest.mark.parametrize("name", PRESETS)
def test_deepspeed_export_builds_the_model_with_inspects_parameter_count(name):
    transformers = pytest.importorskip("transformers")
    pytest.importorskip("deepspeed")
    spec, cfg = load_model(name), model_config(name)
    if cfg["model_type"] not in transformers.CONFIG_MAPPING:  # kimi_k2: its own code (trust_remote_code)
        pytest.skip(f"transformers has no {cfg['model_type']} class: train.py loads it with trust_remote_code")
    exp = deepspeed.export(spec, P(dp=8, gbs=16, mbs=2), model_config=cfg)
    assert json.loads(exp.files[deepspeed.MODEL_FILE]) == cfg and "--model-config" in exp.command
    assert readback.deepspeed_parameters(exp.files, 8) == params_total(spec)  # transformers builds no MTP module


def test_a_derived_hybrid_is_refused_by_megatron_and_built_by_deepspeed(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(QWEN3_NEXT))
    spec = load_model(str(tmp_path))
    assert spec.layer_mixers.count("recurrent") == 3
    with pytest.raises(ConfigError, match="layer 0 has a gated_deltanet recurrent mixer \\(3 such layer"):
        megatron.export(spec, P(dp=8, gbs=8))
    assert main(["export", str(tmp_path), "--to", "megatron", "--devices", "8"]) == 2  # one line, no file
    pytest.importorskip("transformers")
    exp = deepspeed.export(spec, P(dp=8, gbs=8), model_config=model_config(str(tmp_path)))
    assert readback.deepspeed_parameters(exp.files, 8) == params_total(spec)


@pytest.mark.parametrize("name, flags", [
    ("qwen3-235b-a22b", ["--rotary-base 1000000", "--norm-epsilon 1e-06", "--disable-bias-linear", "--qk-layernorm",
                         "--untie-embeddings-and-output-weights", "--num-query-groups 4"]),
    ("llama-3.1-8b", ["--rotary-base 500000", "--use-rope-scaling", "--rope-scaling-factor 8", "--norm-epsilon 1e-05"]),
    ("deepseek-v3", ["--rope-type rope", "--moe-router-num-groups 8", "--moe-router-group-topk 4",
                     "--moe-layer-freq [0,0,0,1", "--moe-router-topk-scaling-factor 2.5", "--mtp-num-layers 1",
                     "--moe-router-score-function sigmoid", "--moe-router-enable-expert-bias"]),
    ("glm-4.5", ["--add-qkv-bias", "--disable-bias-linear", "--qk-layernorm"]),
    ("gpt-oss-120b", ["--softmax-type learnable", "--window-size 127,0", "--window-attn-skip-freq [1,0,1,0",
                      "--quick-geglu", "--glu-linear-offset 1", "--activation-func-clamp-value 7"]),
])
def test_every_hyperparameter_megatron_has_a_flag_for_is_written(name, flags):
    text = " ".join(_args(megatron.export(load_model(name), P(dp=8, gbs=8)).files))
    for flag in flags:
        assert flag in text, flag


def test_tied_embeddings_and_defaults_are_not_megatrons_silent_defaults(tmp_path):
    """Tied embeddings write no --untie flag; Megatron's defaults (rope base 10000, eps 1e-5) are
    written out, so a model that differs from them cannot inherit them."""
    cfg = dict(model_type="llama", hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
               intermediate_size=128, vocab_size=250, max_position_embeddings=128, tie_word_embeddings=True,
               rms_norm_eps=3e-6, rope_theta=12345.0)
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    spec = load_model(str(tmp_path))
    exp = megatron.export(spec, P(tp=2, dp=4, gbs=8))
    text = exp.files[megatron.ARGS_FILE]
    assert "--untie-embeddings-and-output-weights" not in text
    assert "--rotary-base 12345" in text and "--norm-epsilon 3e-06" in text
    assert "--make-vocab-size-divisible-by 1" in text  # 250 over tp 2: no padding row, so no extra parameter
    pytest.importorskip("megatron.core")
    assert readback.megatron_parameters(_args(exp.files)) == params_total(spec)


def test_a_vocabulary_tp_does_not_divide_is_padded_and_said(tmp_path):
    cfg = dict(model_type="llama", hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
               intermediate_size=128, vocab_size=251, max_position_embeddings=128)
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    exp = megatron.export(load_model(str(tmp_path)), P(tp=2, dp=4, gbs=8))
    assert any("vocab 251 padded to 256" in u for u in exp.unexpressed)


def test_top_k_weights_without_normalisation_are_megatrons_pre_softmax(tmp_path):
    """Qwen2-MoE style routing (softmax over every expert, top-k weights not renormalised) is
    Megatron-Core's --moe-router-pre-softmax; the normalised top-k is its default."""
    cfg = dict(model_type="qwen3_moe", hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
               num_key_value_heads=2, head_dim=16, intermediate_size=128, moe_intermediate_size=32, num_experts=4,
               num_experts_per_tok=2, vocab_size=256, max_position_embeddings=128, norm_topk_prob=False)
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    assert "--moe-router-pre-softmax" in _args(megatron.export(load_model(str(tmp_path)), P(dp=8, gbs=8)).files)
    assert "--moe-router-pre-softmax" not in _args(megatron.export(load_model("qwen3-235b-a22b"),
                                                                     P(dp=8, gbs=8)).files)
