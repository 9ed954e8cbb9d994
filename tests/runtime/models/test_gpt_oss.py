"""gpt-oss in the runtime's zoo: attention sinks (full and sliding-window layers), the clamped
SwiGLU experts with biases and the biased router, each against transformers' own GptOss modules
on a tiny config with the same weights copied in (fp32, forward and backward within 1e-5 relative), and the
whole model the same way."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
gpt_oss = pytest.importorskip("transformers.models.gpt_oss.modeling_gpt_oss")

from transformers import GptOssConfig  # noqa: E402

from dayzero.runtime.checks import runtime_problems  # noqa: E402
from dayzero.runtime.models.attention import GroupedQueryAttention, rope_cache  # noqa: E402
from dayzero.runtime.models.model import Transformer  # noqa: E402
from dayzero.runtime.models.moe import MoE  # noqa: E402
from dayzero.specs.hf_config import spec_from_hf_config  # noqa: E402
from dayzero.specs.parallel import ParallelConfig  # noqa: E402

SEQ, WINDOW, TOL = 12, 4, 1e-5
CFG = dict(model_type="gpt_oss", vocab_size=300, hidden_size=32, intermediate_size=24, num_hidden_layers=2,
           num_attention_heads=4, num_key_value_heads=2, head_dim=8, num_local_experts=4, num_experts_per_tok=2,
           sliding_window=WINDOW, layer_types=["sliding_attention", "full_attention"], max_position_embeddings=64,
           rms_norm_eps=1e-5, rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
           router_aux_loss_coef=0.0, swiglu_limit=0.5, attention_bias=True, tie_word_embeddings=False)


def _hf_config() -> GptOssConfig:
    cfg = {k: v for k, v in CFG.items() if k != "model_type"}
    c = GptOssConfig(**cfg)
    c._attn_implementation = "eager"  # the reference math (sinks in the softmax), not a kernel
    return c


def _spec():
    return spec_from_hf_config(dict(CFG), "tiny-gpt-oss")


def _randomize(module: torch.nn.Module, seed: int, std: float = 0.3) -> None:
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in module.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * std)


def _expert_tensors(hf_experts) -> dict[str, torch.Tensor]:
    """transformers' GptOssExperts -> the zoo's GroupedExperts tensors: gate_up_proj (E, H, 2I) holds
    gate and up interleaved along its last dim (gate = ::2, up = 1::2) and multiplies as x @ W."""
    gu, gub = hf_experts.gate_up_proj, hf_experts.gate_up_proj_bias
    return {"w1": gu[..., 0::2].transpose(1, 2), "w3": gu[..., 1::2].transpose(1, 2),
            "w2": hf_experts.down_proj.transpose(1, 2), "w1_bias": gub[:, 0::2], "w3_bias": gub[:, 1::2],
            "w2_bias": hf_experts.down_proj_bias}


def _hf_to_zoo(hf_model) -> dict[str, torch.Tensor]:
    """Every zoo parameter of the model as a differentiable view of a transformers parameter."""
    sd = dict(hf_model.named_parameters())
    out = {"tok_embeddings.weight": sd["model.embed_tokens.weight"], "norm.weight": sd["model.norm.weight"],
           "output.weight": sd["lm_head.weight"]}
    for i, layer in enumerate(hf_model.model.layers):
        p = f"layers.{i}."
        out[p + "attention_norm.weight"] = layer.input_layernorm.weight
        out[p + "ffn_norm.weight"] = layer.post_attention_layernorm.weight
        for zoo, hf in (("wq", "q_proj"), ("wk", "k_proj"), ("wv", "v_proj"), ("wo", "o_proj")):
            out[p + f"attention.{zoo}.weight"] = getattr(layer.self_attn, hf).weight
            out[p + f"attention.{zoo}.bias"] = getattr(layer.self_attn, hf).bias
        out[p + "attention.sinks"] = layer.self_attn.sinks
        out[p + "moe.router.gate.weight"] = layer.mlp.router.weight
        out[p + "moe.router.gate.bias"] = layer.mlp.router.bias
        for k, v in _expert_tensors(layer.mlp.experts).items():
            out[p + f"moe.experts.{k}"] = v
    return out


def _copy_into(zoo: torch.nn.Module, tensors: dict[str, torch.Tensor]) -> None:
    names = {n for n, _ in zoo.named_parameters()}
    assert names == set(tensors), names ^ set(tensors)
    with torch.no_grad():
        for n, p in zoo.named_parameters():
            p.copy_(tensors[n])


def _additive_mask(window: int | None) -> torch.Tensor:
    i = torch.arange(SEQ)
    keep = i[None, :] <= i[:, None]
    if window is not None:
        keep &= i[:, None] - i[None, :] < window
    return torch.zeros(SEQ, SEQ).masked_fill(~keep, float("-inf"))[None, None]


def _max_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    return (a - b).abs().max().item()


def _close(got: torch.Tensor, want: torch.Tensor) -> bool:
    """Within 1e-5 of the reference, relative to its largest entry where that exceeds 1."""
    return _max_diff(got, want) <= TOL * max(1.0, want.abs().max().item())


@pytest.mark.parametrize("layer", [0, 1], ids=["sliding", "full"])
def test_attention_with_sinks_matches_transformers(layer):
    cfg, spec = _hf_config(), _spec()
    window = spec.layer_windows[layer]
    assert window == (WINDOW if layer == 0 else None)  # gpt-oss's layer_types read as the window pattern
    hf = gpt_oss.GptOssAttention(cfg, layer)
    _randomize(hf, 1)
    with torch.no_grad():
        hf.sinks.copy_(torch.tensor([2.0, -1.0, 0.5, 4.0]))  # large enough to take real softmax mass
    zoo = GroupedQueryAttention(spec.attention, spec.hidden, spec.norm_eps, window)
    _copy_into(zoo, {"wq.weight": hf.q_proj.weight, "wq.bias": hf.q_proj.bias, "wk.weight": hf.k_proj.weight,
                     "wk.bias": hf.k_proj.bias, "wv.weight": hf.v_proj.weight, "wv.bias": hf.v_proj.bias,
                     "wo.weight": hf.o_proj.weight, "wo.bias": hf.o_proj.bias, "sinks": hf.sinks})
    x = torch.randn(2, SEQ, spec.hidden, generator=torch.Generator().manual_seed(2), requires_grad=True)
    xz = x.detach().clone().requires_grad_()
    rope = gpt_oss.GptOssRotaryEmbedding(cfg)
    pos = rope(x, torch.arange(SEQ)[None])
    want, _ = hf(x, pos, _additive_mask(hf.sliding_window))
    cos, sin = rope_cache(spec.attention.head_dim, SEQ, spec.rope_theta)
    got = zoo(xz, cos, sin)
    assert _close(got, want)
    gy = torch.randn(want.shape, generator=torch.Generator().manual_seed(3))
    (want * gy).sum().backward()
    (got * gy).sum().backward()
    assert _close(xz.grad, x.grad)
    assert _close(zoo.sinks.grad, hf.sinks.grad) and hf.sinks.grad.abs().max() > 1e-3
    assert _close(zoo.wq.weight.grad, hf.q_proj.weight.grad)
    assert _close(zoo.wk.bias.grad, hf.k_proj.bias.grad)
    # the sinks change the result: without them the same weights give another output
    with torch.no_grad():
        plain = zoo.core(*(t.transpose(1, 2) for t in _qkv(zoo, xz, cos, sin)))
        sunk = zoo.core(*(t.transpose(1, 2) for t in _qkv(zoo, xz, cos, sin)), zoo.sinks)
    assert _max_diff(plain, sunk) > 1e-2


def _qkv(zoo, x, cos, sin):
    from dayzero.runtime.models.attention import apply_rope

    b, s, _ = x.shape
    q = zoo.wq(x).view(b, s, -1, zoo.head_dim)
    k = zoo.wk(x).view(b, s, -1, zoo.head_dim)
    v = zoo.wv(x).view(b, s, -1, zoo.head_dim)
    return apply_rope(q, cos, sin), apply_rope(k, cos, sin), v


def test_clamped_swiglu_experts_and_biased_router_match_transformers():
    cfg, spec = _hf_config(), _spec()
    assert spec.moe.expert.activation == "swiglu_clamped" and spec.moe.expert.bias and spec.moe.router_bias
    assert (spec.moe.expert.swiglu_alpha, spec.moe.expert.swiglu_limit) == (1.702, 0.5)
    hf = gpt_oss.GptOssMLP(cfg)
    _randomize(hf, 4, std=0.5)
    zoo = MoE(spec.hidden, spec.moe)
    _copy_into(zoo, {"router.gate.weight": hf.router.weight, "router.gate.bias": hf.router.bias,
                     **{f"experts.{k}": v for k, v in _expert_tensors(hf.experts).items()}})
    zoo.reset_counts()
    x = torch.randn(2, SEQ, spec.hidden, generator=torch.Generator().manual_seed(5), requires_grad=True)
    xz = x.detach().clone().requires_grad_()
    want, _ = hf(x)
    got = zoo(xz)
    assert _close(got, want)
    # the clamps are exercised: some gate pre-activations exceed the limit, some up ones fall below -limit
    with torch.no_grad():
        gate_up = x.reshape(-1, spec.hidden) @ hf.experts.gate_up_proj[0] + hf.experts.gate_up_proj_bias[0]
    assert (gate_up[:, 0::2] > 0.5).any() and (gate_up[:, 1::2] < -0.5).any()
    gy = torch.randn(want.shape, generator=torch.Generator().manual_seed(6))
    (want * gy).sum().backward()
    (got * gy).sum().backward()
    assert _close(xz.grad, x.grad)
    assert _close(zoo.router.gate.bias.grad, hf.router.bias.grad)
    hf_grads = {"w1": hf.experts.gate_up_proj.grad[..., 0::2].transpose(1, 2),
                "w3": hf.experts.gate_up_proj.grad[..., 1::2].transpose(1, 2),
                "w2": hf.experts.down_proj.grad.transpose(1, 2), "w1_bias": hf.experts.gate_up_proj_bias.grad[:, 0::2],
                "w3_bias": hf.experts.gate_up_proj_bias.grad[:, 1::2], "w2_bias": hf.experts.down_proj_bias.grad}
    for k, g in hf_grads.items():
        assert _close(getattr(zoo.experts, k).grad, g), k


def test_whole_model_matches_transformers_forward_and_backward():
    cfg, spec = _hf_config(), _spec()
    hf = gpt_oss.GptOssForCausalLM(cfg).float()
    _randomize(hf, 7, std=0.2)
    zoo = Transformer(spec, max_seq=SEQ)
    views = _hf_to_zoo(hf)
    _copy_into(zoo, views)
    zoo.init_buffers()
    ids = torch.randint(0, CFG["vocab_size"], (2, SEQ), generator=torch.Generator().manual_seed(8))
    want = hf(input_ids=ids).logits
    got = zoo(ids)
    assert _close(got, want)
    gy = torch.randn(want.shape, generator=torch.Generator().manual_seed(9))
    (want * gy).sum().backward()
    (got * gy).sum().backward()
    hf_grads = _hf_to_zoo_grads(hf)
    for n, p in zoo.named_parameters():
        assert _close(p.grad, hf_grads[n]), n


def _hf_to_zoo_grads(hf_model) -> dict[str, torch.Tensor]:
    """The same mapping as :func:`_hf_to_zoo`, applied to the transformers parameters' gradients."""
    saved = {n: p.data for n, p in hf_model.named_parameters()}
    with torch.no_grad():
        for p in hf_model.parameters():
            p.data = p.grad
        out = {k: v.detach().clone() for k, v in _hf_to_zoo(hf_model).items()}
        for n, p in hf_model.named_parameters():
            p.data = saved[n]
    return out


def test_runtime_accepts_gpt_oss_and_only_gpt_oss_lists_the_swiglu_constants():
    spec = _spec()
    assert runtime_problems(spec, ParallelConfig(tp=2, dp=2, ep=2, seq=32, mbs=1, gbs=4), 4) == []
    d = spec_from_hf_config({"model_type": "llama", "vocab_size": 300, "hidden_size": 32, "intermediate_size": 64,
                             "num_hidden_layers": 2, "num_attention_heads": 4}).to_dict()
    assert "swiglu_limit" not in d["mlp"] and d["mlp"]["activation"] == "silu"
    assert _spec().to_dict()["moe"]["expert"]["swiglu_limit"] == 0.5


def test_the_experts_stacked_biases_are_not_weight_decayed():
    from dayzero.runtime.optim import build_optimizer

    zoo = MoE(_spec().hidden, _spec().moe)
    _randomize(zoo, 0)
    opt = build_optimizer(zoo.named_parameters(), 1e-3, 0.1)
    decayed = {id(p) for g in opt.param_groups if g["weight_decay"] > 0 for p in g["params"]}
    ex = zoo.experts
    assert {id(ex.w1), id(ex.w2), id(ex.w3), id(zoo.router.gate.weight)} <= decayed
    assert not {id(ex.w1_bias), id(ex.w2_bias), id(ex.w3_bias), id(zoo.router.gate.bias)} & decayed
