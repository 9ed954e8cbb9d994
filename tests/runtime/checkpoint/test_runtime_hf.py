"""The zoo model equals transformers' reference implementation, logit for logit, when it loads the
reference's safetensors checkpoint (tiny random configs, no download)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from dayzero.errors import ConfigError  # noqa: E402
from dayzero.runtime.checkpoint.hf_weights import HFCheckpoint  # noqa: E402
from dayzero.runtime.models.model import build_model  # noqa: E402
from dayzero.runtime.parallel.parallelize import write_full  # noqa: E402
from dayzero.specs.registry import load_model  # noqa: E402

SEQ = 24


def _tiny(family: str):
    t = transformers
    common = dict(vocab_size=300, hidden_size=64, max_position_embeddings=64, rms_norm_eps=1e-6)
    if family == "llama":
        return t.LlamaForCausalLM(t.LlamaConfig(intermediate_size=160, num_hidden_layers=2, num_attention_heads=4,
                                                num_key_value_heads=2, **common))
    if family == "qwen3_moe":
        return t.Qwen3MoeForCausalLM(t.Qwen3MoeConfig(
            intermediate_size=128, moe_intermediate_size=32, num_hidden_layers=3, num_attention_heads=4,
            num_key_value_heads=2, head_dim=16, num_experts=6, num_experts_per_tok=2, norm_topk_prob=True,
            mlp_only_layers=[0], **common))
    if family == "deepseek_v3":
        return t.DeepseekV3ForCausalLM(t.DeepseekV3Config(
            intermediate_size=128, moe_intermediate_size=32, num_hidden_layers=3, num_attention_heads=4,
            num_key_value_heads=4, n_routed_experts=8, num_experts_per_tok=2, n_shared_experts=1,
            first_k_dense_replace=1, q_lora_rank=32, kv_lora_rank=16, qk_nope_head_dim=16, qk_rope_head_dim=8,
            v_head_dim=16, n_group=4, topk_group=2, routed_scaling_factor=2.5, **common))
    raise ValueError(family)


@pytest.fixture(scope="module", params=["llama", "qwen3_moe", "deepseek_v3"])
def checkpoint(request, tmp_path_factory):
    torch.manual_seed(0)
    ref = _tiny(request.param).eval()
    with torch.no_grad():  # make norms and routing biases non-trivial so a wrong mapping shows
        for name, p in ref.named_parameters():
            if "norm" in name:
                p.add_(torch.randn_like(p) * 0.1)
        for name, b in ref.named_buffers():
            if name.endswith("e_score_correction_bias"):
                b.copy_(torch.randn_like(b) * 0.05)
    path = tmp_path_factory.mktemp(request.param)
    ref.save_pretrained(path)
    return request.param, ref, path


def _load_zoo(path):
    spec = load_model(path)
    zoo = build_model(spec, SEQ)
    zoo.to_empty(device="cpu")
    zoo.init_buffers()
    ckpt = HFCheckpoint(path, spec)
    with torch.no_grad():
        for name, p in zoo.named_parameters():
            write_full(p, ckpt.tensor(name, tuple(p.shape)))
        for name, b in zoo.named_buffers():
            if name.endswith("e_score_correction_bias"):
                b.copy_(ckpt.tensor(name, tuple(b.shape)))
    return spec, zoo.eval()


def test_logits_equal_transformers(checkpoint):
    family, ref, path = checkpoint
    spec, zoo = _load_zoo(path)
    assert spec.model_type == family
    x = torch.randint(0, 300, (2, SEQ), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        want = ref(x).logits
        got = zoo(x)
    assert got.shape == want.shape
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_every_checkpoint_tensor_is_used(checkpoint):
    """No HF tensor is silently ignored (which would leave random weights in the zoo)."""
    family, ref, path = checkpoint
    spec, zoo = _load_zoo(path)
    n_ref = sum(p.numel() for p in ref.parameters())
    n_zoo = sum(p.numel() for p in zoo.parameters())
    assert n_zoo == n_ref


def test_shape_mismatch_is_one_line(checkpoint, tmp_path):
    family, _, path = checkpoint
    spec = load_model(path).shrink(hidden=32)
    ckpt = HFCheckpoint(path, spec)
    with pytest.raises(ConfigError, match="does not match these weights"):
        ckpt.tensor("tok_embeddings.weight", (spec.vocab, 32))


@pytest.mark.slow
def test_hf_weights_through_a_parallel_run(checkpoint, tmp_path):
    """``dayzero train DIR --hf-weights DIR`` on 2 ranks (llama: tp2; deepseek_v3: ep2 x dp2)
    starts from exactly the reference's weights: its first loss is the reference's loss on the
    same batch."""
    import numpy as np
    import torch.nn.functional as F

    from dayzero.runtime.config import ModelSection, TrainConfig
    from dayzero.runtime.data import TokenStream
    from dayzero.runtime.metrics import read_metrics
    from dayzero.runtime.train_entry import spawn
    from dayzero.specs.parallel import ParallelConfig

    family, ref, path = checkpoint
    if family == "qwen3_moe":
        pytest.skip("the MoE dispatch path is the deepseek_v3 case's; one MoE family keeps the suite short")
    text = tmp_path / "text.txt"
    text.write_bytes(bytes(np.random.default_rng(0).integers(0, 256, 4000, dtype=np.uint8)))
    batch = dict(seq=SEQ, mbs=1, gbs=2)
    parallel = ParallelConfig(tp=2, **batch) if family == "llama" else ParallelConfig(ep=2, dp=2, **batch)
    m = tmp_path / "m.jsonl"
    cfg = TrainConfig(model=ModelSection(str(path), hf_weights=str(path)), parallel=parallel, steps=1,
                      compute_dtype="fp32", data=str(text), metrics=str(m), quiet=True, measure_comm=False)
    assert spawn(cfg, 2) == 0
    steps, _ = read_metrics(m)
    x, y = TokenStream([text], SEQ, 0, 300).batch(2)
    with torch.no_grad():
        logits = ref(torch.from_numpy(x)).logits
        want = F.cross_entropy(logits.flatten(0, 1), torch.from_numpy(y).flatten()).item()
    assert abs(steps[0]["loss"] - want) <= 1e-5 * want, (steps[0]["loss"], want)
