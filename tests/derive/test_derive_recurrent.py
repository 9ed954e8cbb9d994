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


# Granite 4.0 hybrid (transformers GraniteMoeHybridDecoderLayer): every layer holds block_sparse_moe
# (routed experts) and shared_mlp (a dense MLP summed with it), and either a Mamba-2 mixer
# (GraniteMoeHybridMambaLayer, layer_types "mamba") or attention. Its classes all carry the family
# name "GraniteMoeHybrid", whose "Moe" once made the reader take the Mamba and attention mixers for
# feed-forward blocks and the MoE block (declared first) for the mixer.
GRANITE = dict(hidden_size=64, num_hidden_layers=4, layer_types=["mamba", "attention", "mamba", "mamba"],
               num_attention_heads=4, num_key_value_heads=2, intermediate_size=96, vocab_size=128,
               max_position_embeddings=256, num_local_experts=4, num_experts_per_tok=2, shared_intermediate_size=48,
               mamba_n_heads=8, mamba_d_head=16, mamba_n_groups=2, mamba_d_state=16, mamba_d_conv=4,
               mamba_expand=2, mamba_chunk_size=64)


def test_granitemoehybrid_mamba2_and_attention_with_moe_and_shared_experts(tmp_path, capsys):
    """Hand-derived from the config: Mamba-2 inner = expand x hidden = 128 = 8 heads x 16, conv over
    inner + 2 groups x 16 states (transformers GraniteMoeHybridMambaLayer: conv_dim = intermediate +
    2 n_groups d_state); 4 routed experts of width intermediate_size 96 (GraniteMoeHybridExperts),
    top-2, and one shared MLP of shared_intermediate_size 48 (GraniteMoeHybridMLP)."""
    from dayzero.cli.app import main

    if "granitemoehybrid" not in transformers.models.auto.configuration_auto.CONFIG_MAPPING:
        pytest.skip(f"transformers {transformers.__version__} has no granitemoehybrid")
    spec = load(tmp_path, "granitemoehybrid", GRANITE)
    assert spec.layer_mixers == ("recurrent", "attention", "recurrent", "recurrent")
    assert spec.layer_kinds == ("moe",) * 4
    assert spec.recurrent == RecurrentSpec(kind="mamba2", heads=8, head_dim=16, d_state=16, n_groups=2,
                                           conv_kernel=4, chunk_size=64, conv_bias=True)
    m = spec.moe
    assert (m.experts, m.top_k, m.expert.intermediate, m.shared_experts, m.shared_intermediate) == (4, 2, 96, 1, 48)
    assert spec.layer_extra == (0,) * 4  # nothing left unread: no layer approximated or traced
    assert not any("linear attention / SSM" in a or "tracing" in a for a in spec.extra["approximations"])
    want = meta_count("granitemoehybrid", GRANITE)
    assert params_total(spec) == want == spec.extra["params_module_tree"]
    path = tmp_path / "granitemoehybrid"
    assert main(["inspect", str(path), "--json"]) == 0
    obj = json.loads(capsys.readouterr().out)
    assert obj["params_total"] == want == obj["params_module_tree"]


def test_mixer_roles_do_not_come_from_the_family_name():
    """A child's class name is read without the family's name (the CamelCase words it shares with
    the model's and the decoder layer's classes), and a convolution or recurrent state makes a
    token mixer whatever its name."""
    from torch import nn

    from dayzero.derive import structure

    assert structure.family_prefix("GraniteMoeHybridForCausalLM", "GraniteMoeHybridDecoderLayer") == "GraniteMoeHybrid"
    assert structure.family_prefix("LlamaForCausalLM", "TransformerBlock") == ""

    class FooMoeAttention(nn.Module):
        def __init__(self):
            super().__init__()
            self.q_proj = nn.Linear(8, 8)

    class FooMoeBlock(nn.Module):  # no name a reader knows, but a depthwise conv and SSM state
        def __init__(self):
            super().__init__()
            self.conv1d = nn.Conv1d(8, 8, 4, groups=8)
            self.A_log = nn.Parameter(torch.zeros(2))

    assert structure.category("self_attn", FooMoeAttention(), "FooMoe") == "mixer"
    assert structure.category("block", FooMoeBlock(), "FooMoe") == "mixer"


def test_a_recurrent_mixer_whose_value_width_equals_hidden(tmp_path):
    """Gated DeltaNet with 4 value heads x 16 = hidden 64: the output projection is square, the only
    projection into hidden; the layout is read as with any other width."""
    cfg = dict(QWEN3_NEXT, linear_value_head_dim=16)
    spec = load(tmp_path, "qwen3_next", cfg)
    assert spec.layer_mixers == ("recurrent",) * 3 + ("attention",)
    assert (spec.recurrent.kind, spec.recurrent.heads, spec.recurrent.head_dim) == ("gated_deltanet", 4, 16)
    assert params_total(spec) == meta_count("qwen3_next", cfg)


def test_the_mixer_is_the_largest_child_that_reads_as_one_and_mlps_beside_experts_are_shared():
    """A toy layer (made up, as new architectures are): a small helper named like attention declared
    before the real attention, a short convolution after it, routed experts [E, a, b] and a list of
    two dense MLPs beside them. Hand count, hidden 16: attention q/k/v/o 4 x 16 x 16 = 1,024; the
    helper 16; the conv 16 x 3 = 48; experts 4 x (16 x 64 + 32 x 16) = 6,144 plus a router 4 x 16 =
    64; each dense MLP 16 x 48 (gate, up of 24) + 24 x 16 = 1,152; two norms of 16."""
    from types import SimpleNamespace

    from torch import nn

    from dayzero.derive.describe import describe_module

    class ToyAttention(nn.Module):
        def __init__(self):
            super().__init__()
            self.q_proj, self.k_proj, self.v_proj, self.o_proj = (nn.Linear(16, 16, bias=False) for _ in range(4))
            self.num_heads, self.head_dim = 2, 8

    class ToyExperts(nn.Module):
        def __init__(self):
            super().__init__()
            self.gate_up_proj = nn.Parameter(torch.zeros(4, 16, 64))
            self.down_proj = nn.Parameter(torch.zeros(4, 32, 16))

    class ToyMoE(nn.Module):
        def __init__(self):
            super().__init__()
            self.router = nn.Linear(16, 4, bias=False)
            self.experts = ToyExperts()
            self.top_k = 2

    class ToyMLP(nn.Module):
        def __init__(self):
            super().__init__()
            self.gate_up = nn.Linear(16, 48, bias=False)
            self.down = nn.Linear(24, 16, bias=False)

    class ToyLayer(nn.Module):
        def __init__(self):
            super().__init__()
            self.attention_input = nn.Module()
            self.attention_input.weight = nn.Parameter(torch.zeros(16))  # a mixing weight, not the mixer
            self.self_attn = ToyAttention()
            self.short_conv = nn.Conv1d(16, 16, 3, groups=16, bias=False)
            self.input_layernorm, self.post_attention_layernorm = nn.RMSNorm(16), nn.RMSNorm(16)
            self.moe = ToyMoE()
            self.mlps = nn.ModuleList([ToyMLP(), ToyMLP()])

    class ToyForCausalLM(nn.Module):
        def __init__(self):
            super().__init__()
            self.embed = nn.Embedding(32, 16)
            self.layers = nn.ModuleList([ToyLayer(), ToyLayer()])
            self.norm = nn.RMSNorm(16)
            self.lm_head = nn.Linear(16, 32, bias=False)

        def get_input_embeddings(self):
            return self.embed

        def get_output_embeddings(self):
            return self.lm_head

    d = describe_module(ToyForCausalLM(), SimpleNamespace(num_attention_heads=2), "toy", "toy")
    (k,) = d.kinds
    assert (k.mixer.kind, k.mixer.module, k.mixer.params) == ("softmax", "ToyAttention", 1024)
    f = k.ffn
    assert (f.kind, f.experts.experts, f.top_k, f.experts.expert.intermediate) == ("moe", 4, 2, 32)
    assert (f.shared.intermediate, f.shared.gated, f.params) == (48, True, 6144 + 64 + 2 * 1152)
    assert f.modules == ("ToyMoE", "ModuleList")
    assert (k.norms, k.other) == (32, 16 + 48)  # the helper and the conv stay outside the shapes


HYBRIDS = {  # tiny configs; layer pattern from each config class's own keys
    "jamba": (dict(hidden_size=64, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
                   intermediate_size=96, vocab_size=128, max_position_embeddings=256, num_experts=4,
                   num_experts_per_tok=2, expert_layer_period=2, expert_layer_offset=1, attn_layer_period=4,
                   attn_layer_offset=2, mamba_d_state=16, use_mamba_kernels=False),
              ["JambaMambaMixer:dense", "JambaMambaMixer:moe", "JambaAttention:dense", "JambaMambaMixer:moe"]),
    "bamba": (dict(hidden_size=64, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
                   intermediate_size=96, vocab_size=128, max_position_embeddings=256, attn_layer_indices=[1],
                   mamba_n_heads=8, mamba_d_head=16, mamba_n_groups=2, mamba_d_state=16, mamba_chunk_size=64),
              ["BambaMixer:dense", "BambaAttention:dense", "BambaMixer:dense", "BambaMixer:dense"]),
    "lfm2": (dict(hidden_size=64, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
                  intermediate_size=96, vocab_size=128, max_position_embeddings=256,
                  layer_types=["conv", "full_attention", "conv", "conv"], block_auto_adjust_ff_dim=False),
             ["Lfm2ShortConv:dense", "Lfm2Attention:dense", "Lfm2ShortConv:dense", "Lfm2ShortConv:dense"]),
}


@pytest.mark.parametrize("model_type", sorted(HYBRIDS))
def test_hybrid_layers_have_their_mixers_and_ffns(model_type, tmp_path):
    """Every layer's mixer is the module its config puts there (Mamba / short conv / attention by the
    config's layer pattern), its feed-forward block dense or MoE as configured, nothing unread."""
    from dayzero.derive.describe import describe

    if model_type not in transformers.models.auto.configuration_auto.CONFIG_MAPPING:
        pytest.skip(f"transformers {transformers.__version__} has no {model_type}")
    cfg, want = HYBRIDS[model_type]
    d = tmp_path / model_type
    d.mkdir()
    (d / "config.json").write_text(json.dumps({"model_type": model_type, **cfg}))
    desc = describe(str(d))
    assert [f"{k.mixer.module}:{k.ffn.kind}" for k in desc.kind_of()] == want
    assert all(k.other == 0 for k in desc.kinds)
    assert desc.total == meta_count(model_type, cfg)


# Falcon-H1 (transformers FalconH1DecoderLayer): every layer runs a Mamba-2 mixer (``mamba``,
# FalconH1Mixer) and attention (``self_attn``) on one input_layernorm output and adds them
FALCON_H1 = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                 intermediate_size=96, vocab_size=128, max_position_embeddings=256, mamba_d_ssm=64,
                 mamba_n_heads=8, mamba_n_groups=2, mamba_d_state=16, mamba_d_conv=4, mamba_chunk_size=64,
                 mamba_rms_norm=True)


def test_falcon_h1_describes_both_mixers_side_by_side(tmp_path):
    """Hand-derived from the config: Mamba-2 inner mamba_d_ssm 64 = 8 heads x 8 (mamba_d_head
    "auto": 64 / 8), conv over 64 + 2 groups x 16 states with bias, a gated norm (mamba_rms_norm);
    attention 4 heads x 16 (hidden / heads), 2 KV heads. Both mixers are read, so nothing of the
    layer is left over and nothing is traced; the counts equal the module tree."""
    if "falcon_h1" not in transformers.models.auto.configuration_auto.CONFIG_MAPPING:
        pytest.skip(f"transformers {transformers.__version__} has no falcon_h1")
    spec = load(tmp_path, "falcon_h1", FALCON_H1)
    assert spec.layer_mixers == ("attention&recurrent",) * 2 and spec.layer_kinds == ("dense",) * 2
    assert spec.recurrent == RecurrentSpec(kind="mamba2", heads=8, head_dim=8, d_state=16, n_groups=2,
                                           conv_kernel=4, chunk_size=64, conv_bias=True)
    a = spec.attention
    assert (a.heads, a.kv_heads, a.head_dim) == (4, 2, 16)
    assert spec.layer_extra == (0,) * 2
    assert not any("tracing" in n or "more parameters" in n for n in spec.extra["approximations"])
    assert params_total(spec) == meta_count("falcon_h1", FALCON_H1) == spec.extra["params_module_tree"]
    (kind,) = spec.extra["description"].kinds
    # the larger first: Mamba-2 17,624 parameters (tests/planner/test_parallel_hybrid.py counts the
    # same shapes by hand), attention 12,288
    assert [(m.module, m.params) for m in kind.mixers] == [("FalconH1Mixer", 17_624), ("FalconH1Attention", 12_288)]
    assert kind.other == 0
