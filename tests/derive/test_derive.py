"""Models nobody taught dayzero: the description derived from the model's own modeling code.

Offline: every config is built in the test from transformers' own config classes at tiny sizes.
The reference count is the model transformers builds on the meta device: its parameters (a tied
tensor once) plus persistent buffers, the way dayzero counts the hand-written families.
"""

from __future__ import annotations

import json

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from torch import nn  # noqa: E402

from dayzero.cli.app import main  # noqa: E402
from dayzero.derive import structure  # noqa: E402
from dayzero.derive.describe import describe  # noqa: E402
from dayzero.derive.to_spec import spec_from_description  # noqa: E402
from dayzero.specs.counting import flops_per_token, norm_params, params_total  # noqa: E402
from dayzero.specs.registry import load_model, model_presets  # noqa: E402
from helpers.hf_meta import meta_count  # noqa: E402
from helpers.paths import DATA  # noqa: E402

T = dict(hidden_size=64, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2, intermediate_size=96,
         vocab_size=128, max_position_embeddings=256)
MLA = dict(q_lora_rank=32, kv_lora_rank=16, qk_nope_head_dim=8, qk_rope_head_dim=8, v_head_dim=8, n_routed_experts=4,
           num_experts_per_tok=2, moe_intermediate_size=32, n_shared_experts=1, first_k_dense_replace=1, n_group=1,
           topk_group=1)
NEW_TYPES = {
    "llama4_text": dict(T, head_dim=16, num_local_experts=4, num_experts_per_tok=1, intermediate_size_mlp=128,
                        interleave_moe_layer_step=2, attention_chunk_size=32),
    "qwen3_next": dict(T, head_dim=16, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32,
                       shared_expert_intermediate_size=48, linear_num_value_heads=4, linear_num_key_heads=2,
                       linear_key_head_dim=16, linear_value_head_dim=16),
    # MLA: key/value heads equal the heads (transformers' MLA attention repeats no KV groups)
    "deepseek_v32": dict(T, **MLA, num_key_value_heads=4, index_n_heads=2, index_head_dim=16),
    "minimax": dict(T, head_dim=16, num_local_experts=4, num_experts_per_tok=2),
    "gemma3_text": dict(T, head_dim=16, sliding_window=16,
                        layer_types=["sliding_attention"] * 3 + ["full_attention"]),
    "phimoe": dict(T, num_local_experts=4, num_experts_per_tok=2),
    "olmo2": dict(T),
    "glm4_moe_lite": dict(T, **MLA, num_key_value_heads=4),
    "phi3": dict(T, pad_token_id=None),
}


def write_config(tmp_path, model_type: str, cfg: dict) -> str:
    d = tmp_path / model_type
    d.mkdir()
    (d / "config.json").write_text(json.dumps({"model_type": model_type, **cfg}))
    return str(d)


def run_json(argv, capsys) -> dict:
    code = main(argv + ["--json"])
    out, err = capsys.readouterr()
    assert code == 0, err
    return json.loads(out)


@pytest.mark.parametrize("model_type", sorted(NEW_TYPES))
def test_inspect_count_equals_the_meta_device_model(model_type, tmp_path, capsys):
    if model_type not in transformers.models.auto.configuration_auto.CONFIG_MAPPING:
        pytest.skip(f"transformers {transformers.__version__} has no {model_type}")
    cfg = NEW_TYPES[model_type]
    path = write_config(tmp_path, model_type, cfg)
    obj = run_json(["inspect", path], capsys)
    want = meta_count(model_type, cfg)
    assert obj["params_total"] == want == obj["params_module_tree"]
    assert obj["derived_from_modeling_code"] and obj["layers"] == cfg["num_hidden_layers"]
    final_norm = norm_params(load_model(path))
    assert sum(row["total"] for row in obj["per_layer"]) + obj["params_embedding"] + obj["params_head"] + \
        final_norm == want  # the per-layer rows add up to the exact total
    mem = run_json(["memory", path, "-a", "h100", "-n", "8"], capsys)
    assert mem["fits"] and mem["unused_config_keys"] == obj["unused_config_keys"]
    plan = run_json(["plan", path, "-a", "h100", "-n", "8", "--gbs", "16", "--seq", "256", "--top", "1"], capsys)
    assert plan["plans"] and "approximations" in plan


def test_described_structure_of_hybrid_and_moe_models(tmp_path):
    d = describe(write_config(tmp_path, "qwen3_next", NEW_TYPES["qwen3_next"]))
    kinds = {k.mixer.kind: k for k in d.kinds}
    assert set(kinds) == {"recurrent", "softmax"}  # gated DeltaNet layers and full attention (layer_types)
    assert kinds["recurrent"].layers == (0, 1, 2) and kinds["softmax"].layers == (3,)
    moe = kinds["softmax"].ffn
    assert (moe.experts.experts, moe.top_k, moe.experts.expert.intermediate, moe.shared.intermediate) == (4, 2, 32, 48)
    assert moe.shared_gate
    spec = load_model(write_config(tmp_path, "llama4_text", NEW_TYPES["llama4_text"]))
    assert spec.layer_kinds == ("dense", "moe", "dense", "moe")  # interleave_moe_layer_step 2
    assert spec.layer_windows == (32, 32, 32, None)  # chunked layers; every 4th layer global, no RoPE
    assert any("chunked attention" in a for a in spec.extra["approximations"])
    g = load_model(write_config(tmp_path, "gemma3_text", NEW_TYPES["gemma3_text"]))
    assert g.layer_windows == (16, 16, 16, None) and g.tie_embeddings


def test_linear_attention_is_stated_as_an_approximation(tmp_path, capsys):
    path = write_config(tmp_path, "minimax", NEW_TYPES["minimax"])
    assert main(["inspect", path]) == 0
    err = " ".join(capsys.readouterr().err.split())  # the notes wrap at the terminal's width
    assert "approximation" in err and "linear attention / SSM" in err and "MiniMaxLightningAttention" in err


@pytest.mark.parametrize("name", sorted(model_presets()))
def test_derived_description_agrees_with_the_hand_written_parsers(name):
    from dayzero.ops.hf_model import MODEL_TYPE_ALIASES

    cfg = model_presets()[name]
    mt = MODEL_TYPE_ALIASES.get(cfg["model_type"], cfg["model_type"])
    if mt not in transformers.models.auto.configuration_auto.CONFIG_MAPPING:
        pytest.skip(f"transformers {transformers.__version__} does not implement model_type {mt!r}")
    spec = load_model(name)
    d = describe(name)
    assert d.total == params_total(spec)  # to the unit (main model: transformers builds no MTP layers)
    assert (d.hidden, d.vocab, d.num_layers, d.tied) == (spec.hidden, spec.vocab, spec.layers, spec.tie_embeddings)
    kinds = tuple("moe" if k.ffn.kind == "moe" else "dense" for k in d.kind_of())
    assert kinds == spec.layer_kinds
    if spec.moe is not None:
        f = next(k.ffn for k in d.kinds if k.ffn.kind == "moe")
        assert (f.experts.experts, f.top_k, f.experts.expert.intermediate) == (
            spec.moe.experts, spec.moe.top_k, spec.moe.expert.intermediate)
    # the planner's spec built from the description costs what the parser's does (#15: within 0.5 %),
    # at two sequence lengths so both the per-token (linear) and the attention (quadratic) terms count
    derived, _ = spec_from_description(d)
    assert params_total(derived) == params_total(spec)
    for seq in (1024, 8192):
        want, got = flops_per_token(spec, seq), flops_per_token(derived, seq)
        assert got.train == pytest.approx(want.train, rel=5e-3), (seq, got, want)
        assert got.attention_forward == pytest.approx(want.attention_forward, rel=5e-3), seq


def test_relabelled_configs_show_the_keys_their_parser_ignores(tmp_path, capsys):
    qwen_next_like = {"model_type": "qwen3_moe", **T, "head_dim": 16, "num_experts": 4, "num_experts_per_tok": 2,
                      "moe_intermediate_size": 32, "shared_expert_intermediate_size": 48,
                      "layer_types": ["linear_attention"] * 3 + ["full_attention"], "torch_dtype": "bfloat16"}
    (tmp_path / "q.json").write_text(json.dumps(qwen_next_like))
    obj = run_json(["inspect", str(tmp_path / "q.json")], capsys)
    assert {"layer_types", "shared_expert_intermediate_size"} <= set(obj["unused_config_keys"])
    assert "torch_dtype" not in obj["unused_config_keys"]  # known irrelevant to planning
    ds32_like = {"model_type": "deepseek_v3", **T, **MLA, "index_topk": 2048, "index_n_heads": 64}
    (tmp_path / "d.json").write_text(json.dumps(ds32_like))
    assert main(["memory", str(tmp_path / "d.json"), "-a", "h100", "-n", "8"]) == 0
    err = capsys.readouterr().err
    assert "config keys not used" in err and "index_topk" in err and "index_n_heads" in err


def test_derived_configs_show_keys_the_modeling_code_never_read(tmp_path, capsys):
    path = write_config(tmp_path, "olmo2", dict(T, sliding_window=8, moe_intermediate_size=7))
    obj = run_json(["inspect", path], capsys)
    assert {"sliding_window", "moe_intermediate_size"} <= set(obj["unused_config_keys"])
    assert "hidden_size" not in obj["unused_config_keys"] and "num_hidden_layers" not in obj["unused_config_keys"]


# -- structure -----------------------------------------------------------------------------------

class _Block(nn.Module):
    def __init__(self, h):
        super().__init__()
        self.self_attn = nn.Linear(h, h)
        self.mlp = nn.Sequential(nn.Linear(h, 2 * h), nn.Linear(2 * h, h))


class _Toy(nn.Module):
    """Three decoder blocks, and a longer list of small heads whose length is 'num_hidden_layers'."""

    def __init__(self, h=8):
        super().__init__()
        self.blocks = nn.ModuleList([_Block(h) for _ in range(3)])
        self.heads = nn.ModuleList([nn.Linear(h, 1) for _ in range(5)])


def test_the_layer_list_is_the_largest_list_of_repeated_blocks():
    qual, layers = structure.find_layer_list(_Toy())
    assert qual == "blocks" and len(layers) == 3


def test_convolution_kernels_are_not_experts():
    mixer = nn.Module()
    mixer.conv1d = nn.Conv1d(16, 16, kernel_size=4, groups=16)  # weight [16, 1, 4]: 3-D
    mixer.in_proj = nn.Linear(8, 16)
    assert mixer.conv1d.weight.dim() == 3
    assert structure.expert_tensors(mixer) == [] and structure.routed_experts(mixer, 8) is None
    assert structure.is_recurrent_mixer(mixer)
    experts = nn.Module()
    experts.gate_up_proj = nn.Parameter(torch.zeros(4, 2 * 6, 8))
    experts.down_proj = nn.Parameter(torch.zeros(4, 8, 6))
    got = structure.routed_experts(experts, 8)
    assert (got.experts, got.expert.intermediate, got.expert.gated) == (4, 6, True)


def test_a_model_refusing_an_experts_implementation_falls_back_to_eager():
    from dayzero.ops.hf_model import _set_experts

    class Picky(nn.Module):
        def __init__(self):
            super().__init__()
            self.impl = None

        def set_experts_implementation(self, impl):
            if impl != "eager":
                raise ValueError(f"{impl} is not supported for this model")
            self.impl = impl

    net, notes = Picky(), []
    assert _set_experts(net, "grouped_mm", notes) == "eager" and net.impl == "eager"
    assert "refuses experts implementation 'grouped_mm'" in notes[0] and "instead" in notes[1]


@pytest.mark.slow
def test_specs_and_derive_do_not_import_torch_at_import_time():
    import subprocess
    import sys

    code = ("import sys, dayzero.specs.registry, dayzero.derive.describe, dayzero.derive.to_spec, dayzero.cli.app; "
            "sys.exit('torch' in sys.modules)")
    assert subprocess.run([sys.executable, "-c", code]).returncode == 0


def test_a_directory_with_its_own_modeling_code_needs_trust(tmp_path, capsys):
    import shutil

    model = tmp_path / "tinyx"
    shutil.copytree(DATA / "remote_tinyx", model)
    assert main(["inspect", str(model)]) == 2
    assert "--trust-remote-code" in capsys.readouterr().err
    obj = run_json(["inspect", str(model), "--trust-remote-code"], capsys)
    config = transformers.AutoConfig.from_pretrained(str(model), trust_remote_code=True, local_files_only=True)
    with torch.device("meta"):
        net = transformers.AutoModelForCausalLM.from_config(config, trust_remote_code=True)
    assert obj["params_total"] == sum(p.numel() for p in net.parameters()) and obj["layers"] == 3
