"""The proxy of a derived model keeps its structure (runtime.models.proxy_shape): the three ways a
generic shrink broke new architectures, on configs built here from transformers' own config classes
at small sizes (meta-device builds and one CPU forward of a tiny proxy each)."""

from __future__ import annotations

import json

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from dayzero.derive import structure as st  # noqa: E402
from dayzero.errors import DayzeroError  # noqa: E402
from dayzero.runtime.config import ModelSection  # noqa: E402
from dayzero.runtime.models.hf_model import _build, proxy_config  # noqa: E402
from dayzero.runtime.models.proxy_shape import fit  # noqa: E402


def config_dir(tmp_path, model_type: str, **fields) -> str:
    cfg = transformers.CONFIG_MAPPING[model_type](**fields).to_dict()
    d = tmp_path / model_type
    d.mkdir()
    (d / "config.json").write_text(json.dumps(cfg))
    return str(d)


def kinds(config) -> list[list[int]]:
    return st.group_layers(st.find_layer_list(_build(config, "t"))[1])


HYBRIDS = {  # more layer kinds than --layers 2, set by a per-layer list, a pattern string or a period
    "qwen3_next": dict(hidden_size=128, intermediate_size=256, num_hidden_layers=8, num_attention_heads=4,
                       num_key_value_heads=2, head_dim=32, linear_key_head_dim=16, linear_value_head_dim=16,
                       linear_num_key_heads=4, linear_num_value_heads=8, moe_intermediate_size=64,
                       shared_expert_intermediate_size=64, num_experts=4, num_experts_per_tok=2,
                       vocab_size=256),
    "gemma3_text": dict(hidden_size=128, intermediate_size=256, num_hidden_layers=6, num_attention_heads=4,
                        num_key_value_heads=2, head_dim=32, vocab_size=256),
    "jamba": dict(hidden_size=128, intermediate_size=256, num_hidden_layers=8, num_attention_heads=4,
                  num_key_value_heads=2, num_experts=4, mamba_dt_rank=8, vocab_size=256),
    "zamba2": dict(hidden_size=128, intermediate_size=256, num_hidden_layers=8, num_attention_heads=4,
                   num_key_value_heads=4, n_mamba_heads=4, mamba_d_state=16, adapter_rank=16, vocab_size=256,
                   layers_block_type=["mamba"] * 3 + ["hybrid"] + ["mamba"] * 3 + ["hybrid"]),
}


@pytest.mark.parametrize("model_type", sorted(HYBRIDS))
def test_layers_below_the_kinds_keep_one_layer_of_each_kind(model_type, tmp_path):
    path = config_dir(tmp_path, model_type, **HYBRIDS[model_type])
    full, _, _ = proxy_config(ModelSection(path))
    config, _, notes = proxy_config(ModelSection(path, layers=2, hidden=64))
    assert len(kinds(config)) == len(kinds(full)) > 1
    assert config.num_hidden_layers < full.num_hidden_layers and config.hidden_size == 64
    if config.num_hidden_layers > 2:  # more layers than asked: said in one line
        assert len(notes) == 1 and "keeps one layer of each of its" in notes[0]
    spec = ModelSection(path, layers=2, hidden=64).spec()
    assert spec.layers == config.num_hidden_layers and spec.extra["proxy_notes"] == list(notes)


def test_a_list_layout_keeps_one_layer_of_each_kind_at_exactly_their_count(tmp_path):
    path = config_dir(tmp_path, "qwen3_next", **HYBRIDS["qwen3_next"])  # linear x3, full, linear x3, full
    config, _, notes = proxy_config(ModelSection(path, layers=2))
    assert config.num_hidden_layers == 2 and config.layer_types == ["linear_attention", "full_attention"]
    assert "2 layers (of 8: 0, 3)" in notes[0]


def test_a_hybrid_mamba_head_dims_follow_the_ratio(tmp_path):
    """Falcon-H1: d_ssm = heads x head dim (the config class checks it); Zamba2: the Mamba head dim is
    computed by the class from expand x hidden / heads, so it is left to the class."""
    falcon = config_dir(tmp_path, "falcon_h1", hidden_size=512, intermediate_size=1024, num_hidden_layers=2,
                        num_attention_heads=8, num_key_value_heads=2, mamba_d_ssm=512, mamba_n_heads=32,
                        mamba_d_head=16, mamba_d_state=16, mamba_chunk_size=16, vocab_size=256)
    cls = type(transformers.CONFIG_MAPPING["falcon_h1"]())
    with pytest.raises(Exception, match="Mamba head state do not match"):  # the invariant is the class's
        cls(hidden_size=128, mamba_d_ssm=512, mamba_n_heads=8, mamba_d_head=16)
    config, _, _ = proxy_config(ModelSection(falcon, hidden=128))
    assert config.mamba_n_heads == 8 and config.mamba_d_head == 16 and config.mamba_d_ssm == 128
    zamba = config_dir(tmp_path, "zamba2", **HYBRIDS["zamba2"])
    config, _, _ = proxy_config(ModelSection(zamba, hidden=64))
    assert config.mamba_headdim * config.n_mamba_heads == config.mamba_expand * 64


def test_an_explicit_head_dim_and_expert_sizes_not_tied_to_hidden(tmp_path):
    """Heads x head_dim != hidden and expert widths of their own: head_dim kept, widths scaled to
    multiples of 8, the proxy runs the model's own forward."""
    path = config_dir(tmp_path, "qwen3_moe", hidden_size=512, intermediate_size=1536, num_hidden_layers=2,
                      num_attention_heads=8, num_key_value_heads=4, head_dim=128, moe_intermediate_size=200,
                      num_experts=8, num_experts_per_tok=2, vocab_size=256)
    config, _, _ = proxy_config(ModelSection(path, hidden=128, experts=4))
    assert config.head_dim == 128 and config.num_attention_heads == 2 and config.num_key_value_heads == 1
    assert config.moe_intermediate_size == 48 and config.intermediate_size == 384 and config.num_experts == 4
    gpt_oss = config_dir(tmp_path, "gpt_oss", hidden_size=360, intermediate_size=360, num_hidden_layers=4,
                         num_attention_heads=8, num_key_value_heads=2, head_dim=64, num_local_experts=4,
                         vocab_size=256)
    config, _, notes = proxy_config(ModelSection(gpt_oss, layers=2, hidden=120))
    assert config.head_dim == 64 and len(kinds(config)) == 2 and not notes  # sliding + full in the first 2


def test_a_shape_the_code_rejects_tries_a_smaller_one_then_names_the_reason(tmp_path):
    config_dir(tmp_path, "qwen3_moe", hidden_size=512, intermediate_size=1536, num_hidden_layers=2,
                      num_attention_heads=8, num_key_value_heads=4, moe_intermediate_size=256, num_experts=8,
                      num_experts_per_tok=2, vocab_size=256)
    cfg = json.loads((tmp_path / "qwen3_moe" / "config.json").read_text())
    cls = type(transformers.CONFIG_MAPPING["qwen3_moe"]())

    def narrow(d):  # a modeling code that accepts the full model and proxies of hidden <= 100 only
        if 100 < d["hidden_size"] < 512:
            raise DayzeroError(f"hidden {d['hidden_size']} is too wide for this code")
        return cls(**{k: v for k, v in d.items() if k != "model_type"})

    def never(d):
        return narrow(dict(d, hidden_size=200) if d["hidden_size"] < 512 else d)

    proxy = fit(cfg, narrow, None, 128, None, None, "t")
    assert proxy.cfg["hidden_size"] == 64 and "the proxy uses hidden 64" in proxy.notes[0]
    with pytest.raises(DayzeroError, match="no proxy of this shape .* too wide for this code"):
        fit(cfg, never, None, 128, None, None, "t")


@pytest.mark.slow  # trains the proxy in a rank process
def test_validate_compares_the_derived_spec_with_the_proxy_run(tmp_path, capsys):
    from dayzero.cli.app import main
    from dayzero.validate.profile import build_profile, write_profile
    from helpers.measurements import measurements

    profile = str(write_profile(build_profile(measurements(ranks=1)), tmp_path / "host.yaml"))
    path = config_dir(tmp_path, "qwen3_next", **HYBRIDS["qwen3_next"])
    assert main(["validate", path, "--cluster", profile, "--nproc", "1", "--layers", "2", "--vocab", "512",
                 "--seq", "32", "--gbs", "4", "--steps", "6", "--out", str(tmp_path / "v")]) == 0
    res = json.loads((tmp_path / "v" / "validation.json").read_text())
    rows = {c["metric"]: c for c in res["checks"]}
    assert rows["peak_memory"]["predicted"] and rows["step_time"]["predicted"] and rows["peak_memory"]["measured"]
    assert res["run"]["derived_from_modeling_code"] and isinstance(res["run"]["approximations"], list)
    assert "approximation" in capsys.readouterr().out


def test_per_layer_overrides_keyed_by_layer_index_follow_the_kept_layers():
    from dayzero.runtime.models.proxy_shape import truncate_layers

    cfg = {"num_hidden_layers": 6, "per_layer_config": {"1": {"heads": 8}, "4": {"heads": 2}, "5": {"heads": 4}},
           "by_int": {0: "a", 4: "b"}, "not_layers": {"x": 1}, "out_of_range": {"9": 1}}
    out = truncate_layers(cfg, 6, [0, 4, 5])
    assert out["num_hidden_layers"] == 3
    assert out["per_layer_config"] == {"1": {"heads": 2}, "2": {"heads": 4}}  # old 4 -> 1, old 5 -> 2, old 1 dropped
    assert out["by_int"] == {0: "a", 1: "b"}
    assert out["not_layers"] == {"x": 1} and out["out_of_range"] == {"9": 1}  # not per-layer mappings: untouched
    words = truncate_layers({"num_hidden_layers": 4, "activation_function": "gelu", "pattern": "M*M-"}, 4, [0, 1])
    assert words["activation_function"] == "gelu" and words["pattern"] == "M*"  # a word of n letters is not a pattern


def test_special_token_ids_past_the_proxy_vocabulary_move_to_its_top_and_stay_distinct():
    from dayzero.runtime.models.proxy_shape import shrink_vocab

    cfg = {"vocab_size": 50000, "bos_token_id": 1, "eos_token_id": [49999, 50000], "pad_token_id": 49999,
           "decoder_start_token_id": 40000, "sep_token_id": None}
    out = shrink_vocab(cfg, 512)
    assert out["vocab_size"] == 512 and out["bos_token_id"] == 1 and out["sep_token_id"] is None
    assert out["eos_token_id"] == [511, 510] and out["pad_token_id"] == 511  # the same id keeps one slot
    assert out["decoder_start_token_id"] == 509  # an int still, as strict config classes require
    tables = shrink_vocab({"vocab_size": 260, "encoder_hash_byte_group_vocab": 500002,
                           "vocab_size_per_layer_input": 64}, 128)
    assert tables == {"vocab_size": 128, "encoder_hash_byte_group_vocab": 128, "vocab_size_per_layer_input": 64}


def test_heads_that_tile_the_width_when_the_code_reads_head_dim_in_one_place_only(tmp_path):
    """StableLM computes its head size as hidden // heads and its rotary width from ``head_dim`` when
    set: a head_dim kept from the full model (80) disagrees with 256 // 3 and the forward fails, so the
    proxy takes the head count nearest the scaled one that divides the width (4 x 64) and says so."""
    path = config_dir(tmp_path, "stablelm", hidden_size=640, intermediate_size=1024, num_hidden_layers=2,
                      num_attention_heads=8, num_key_value_heads=8, vocab_size=256)
    config, _, notes = proxy_config(ModelSection(path, hidden=256))
    assert (config.hidden_size, config.num_attention_heads, config.num_key_value_heads) == (256, 4, 4)
    assert any("4 attention heads, dividing hidden 256" in n for n in notes), notes
    qwen = config_dir(tmp_path, "qwen2", hidden_size=640, intermediate_size=1024, num_hidden_layers=2,
                      num_attention_heads=8, num_key_value_heads=8, vocab_size=256)
    config, _, notes = proxy_config(ModelSection(qwen, hidden=256))  # reads head_dim everywhere: kept
    assert (config.num_attention_heads, config.head_dim) == (3, 80) and not notes


def test_an_encoder_family_is_built_as_a_causal_decoder(tmp_path):
    """BERT's LM head attends bidirectionally unless is_decoder is set; the proxy sets it, so a token's
    logits do not change when a later token does."""
    path = config_dir(tmp_path, "bert", hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=4, vocab_size=256)
    config, _, _ = proxy_config(ModelSection(path, hidden=64))
    assert config.is_decoder
    net = _build(config, "bert", "cpu").eval()
    a = torch.tensor([[5, 6, 7, 8]])
    b = torch.tensor([[5, 6, 7, 9]])
    with torch.no_grad():
        la, lb = net(input_ids=a).logits, net(input_ids=b).logits
    assert torch.allclose(la[0, :3], lb[0, :3]) and not torch.allclose(la[0, 3], lb[0, 3])


def test_other_towers_shrink_by_the_language_models_ratio_and_stay_tied():
    """A vision tower beside the text model: its widths scale by the text's ratio, a field holding its
    own width (an adapter's input) takes its new width, a field holding the text width (the adapter's
    output) follows the proxy text width wherever the fit puts it; a config with no width of its own
    (BLT: byte encoder, global model, patcher) scales every tower by the widest one's ratio."""
    from dayzero.runtime.models.proxy_shape import shrink_towers, tie_towers

    vision = {"hidden_size": 512, "num_attention_heads": 8, "intermediate_size": 2048, "num_hidden_layers": 6,
              "num_local_experts": 64, "adapter_in_dim": 512, "adapter_out_dim": 1024, "vocab_size": 9000}
    text = {"hidden_size": 1024, "num_attention_heads": 16, "num_hidden_layers": 8}
    out, note, ties = shrink_towers({"text_config": text, "vision_config": vision}, text, 256, 2, 512)
    v = out["vision_config"]
    assert (v["hidden_size"], v["adapter_in_dim"], v["intermediate_size"]) == (128, 128, 512)
    assert v["num_hidden_layers"] == 2
    assert v["num_local_experts"] == 64 and v["vocab_size"] == 512 and out["text_config"] is text
    assert ties == {"vision_config": ["adapter_out_dim"]} and "ratio 0.25" in note
    whole = tie_towers({"text_config": dict(text, hidden_size=128), "vision_config": v}, ties, 128)
    assert whole["vision_config"]["adapter_out_dim"] == 128
    blt = {"vocab_size": 260, "global_config": {"hidden_size": 2048, "num_attention_heads": 16},
           "encoder_config": {"hidden_size": 1024, "hidden_size_global": 2048, "num_attention_heads": 16}}
    out, _, ties = shrink_towers(blt, blt, 256, None, None)
    assert out["global_config"]["hidden_size"] == 256 and out["encoder_config"]["hidden_size"] == 128
    assert out["encoder_config"]["hidden_size_global"] == 256 and not ties


def test_other_layer_counts_follow_the_kept_layers():
    from dayzero.runtime.models.proxy_shape import count_readings, layer_counts

    stack = {"n_input_layers": 16, "n_recurrent_layers": 40, "n_output_layers": 16}
    assert layer_counts(stack, 72, [0, 1, 2]) == {"n_input_layers": 1, "n_recurrent_layers": 1, "n_output_layers": 1}
    assert sum(layer_counts(stack, 72, list(range(6))).values()) == 6  # the sections still sum to the layers kept
    assert layer_counts({"num_kv_shared_layers": 30, "num_nextn_predict_layers": 1, "num_attention_heads": 30},
                        30, [0, 1]) == {"num_kv_shared_layers": 2, "num_nextn_predict_layers": 1}
    shared = {"num_kv_shared_layers": 15}  # Gemma 3n: the last 15 of 35 layers reuse earlier layers' caches
    keep = [0, 4, 10, 14, 18, 19, 20, 24]
    assert [layer_counts(shared, 35, keep, r)["num_kv_shared_layers"] for r in count_readings(shared, 35, keep)] == [
        3, 2, 4]  # scaled, the kept layers in the last 15, those in the first 15


def test_a_layer_count_under_its_own_name_is_found_by_the_built_layers(tmp_path):
    """LongCat-Flash counts its layers in ``num_layers`` (no alias to num_hidden_layers): --layers 2
    still cuts it, the field found as the one equal to the built model's decoder-layer count."""
    path = config_dir(tmp_path, "longcat_flash", hidden_size=128, num_layers=4, num_attention_heads=4,
                      num_key_value_heads=4, ffn_hidden_size=256, q_lora_rank=32, kv_lora_rank=16,
                      qk_nope_head_dim=16, qk_rope_head_dim=16, v_head_dim=16, qk_head_dim=32, head_dim=16,
                      n_routed_experts=4, zero_expert_num=2, moe_topk=2, expert_ffn_hidden_size=64, vocab_size=256)
    config, _, _ = proxy_config(ModelSection(path, layers=2, hidden=64))
    assert config.num_layers == 2 and len(kinds(config)) >= 1 and config.hidden_size == 64


def test_a_config_class_that_refuses_a_layer_count_setter_is_traced(tmp_path):
    """ProphetNet's config raises on ``num_hidden_layers =`` (its counts are per encoder/decoder): the
    tracer cuts the layer list and leaves the count to the class, rather than a traceback."""
    from dayzero.specs.registry import load_model

    path = config_dir(tmp_path, "prophetnet", hidden_size=64, encoder_ffn_dim=128, decoder_ffn_dim=128,
                      num_encoder_layers=2, num_decoder_layers=2, num_encoder_attention_heads=4,
                      num_decoder_attention_heads=4, vocab_size=256)
    spec = load_model(path)
    assert spec.extra["derived"] and spec.extra["params_module_tree"] > 0
