"""Tracing the real modeling code: layer kinds, FLOPs against dayzero inspect, categories."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from dayzero.ops.trace import trace_model  # noqa: E402
from dayzero.specs.counting import flops_per_token  # noqa: E402
from dayzero.specs.registry import load_model  # noqa: E402
from helpers.paths import DATA  # noqa: E402

# every preset whose model_type transformers implements (kimi_k2 via deepseek_v3); gpt-oss at
# seq 128 = its sliding window, where eager attention and inspect's windowed count agree
FLOP_CASES = [("llama-3.1-8b", 512), ("mixtral-8x7b", 512), ("qwen3-235b-a22b", 512), ("deepseek-v3", 512),
              ("kimi-k2", 512), ("glm-4.5", 512), ("gpt-oss-120b", 128), ("gpt3-175b", 512), ("tiny-moe", 256)]


@pytest.fixture(scope="module")
def tiny_llama():
    return trace_model("tiny-llama", seq=64)


@pytest.mark.parametrize("model,seq", FLOP_CASES)
def test_traced_flops_match_inspect(model, seq):
    """Forward + backward FLOPs of the traced step, scaled to full depth, equal dayzero inspect's
    train FLOPs (full-attention convention, the s x s that eager attention computes) within 2 %."""
    tr = trace_model(model, seq=seq)
    ref = flops_per_token(load_model(model), seq, causal=False).train
    got = tr.total_flops() / tr.tokens
    assert abs(got - ref) / ref < 0.02, (model, got, ref)


def test_sliding_window_differs_from_inspect_beyond_window():
    """Beyond gpt-oss's 128-token window, eager attention still computes s x s scores while
    inspect counts the window: the trace must show more FLOPs, not silently agree."""
    tr = trace_model("gpt-oss-120b", seq=512)
    ref = flops_per_token(load_model("gpt-oss-120b"), 512, causal=False).train
    assert tr.total_flops() / tr.tokens > 1.01 * ref


@pytest.mark.parametrize("model,expected", [
    ("deepseek-v3", {"dense": (0, 1, 2), "moe": tuple(range(3, 61))}),
    ("kimi-k2", {"dense": (0,), "moe": tuple(range(1, 61))}),
    ("glm-4.5", {"dense": (0, 1, 2), "moe": tuple(range(3, 92))}),
    ("gpt-oss-120b", {"moe/sliding_attention": tuple(range(0, 36, 2)), "moe/full_attention": tuple(range(1, 36, 2))}),
    ("llama-3.1-8b", {"dense": tuple(range(32))}),
])
def test_layer_kinds(model, expected):
    tr = trace_model(model, seq=32)
    assert {k.name: k.layers for k in tr.kinds} == expected
    spec = load_model(model)
    moe_layers = sum(len(k.layers) for k in tr.kinds if k.name.startswith("moe"))
    assert moe_layers == spec.num_moe_layers
    assert tr.num_layers == spec.layers


def test_kimi_traced_as_deepseek_v3_with_note():
    tr = trace_model("kimi-k2", seq=32)
    assert tr.model_type == "deepseek_v3"
    assert any("kimi_k2" in n and "deepseek_v3" in n for n in tr.notes)


def test_categories_and_backward_attribution(tiny_llama):
    tr = tiny_llama
    cats = {c.category for c in tr.calls}
    assert {"attention", "mlp", "norm", "embedding", "head", "loss"} <= cats
    # every matrix product runs in a projection: attention, MLP or head, forward and backward
    for c in tr.calls:
        if c.flops:
            assert c.category in ("attention", "mlp", "head"), c
    # backward matmul FLOPs are twice the forward ones in each category
    for cat in ("attention", "mlp", "head"):
        fwd = sum(c.flops for c in tr.calls if c.category == cat and c.phase == "forward")
        bwd = sum(c.flops for c in tr.calls if c.category == cat and c.phase == "backward")
        assert bwd == 2 * fwd, cat
    assert {c.op for c in tr.calls if c.category == "norm"} >= {"aten.rsqrt.default", "aten.mean.dim"}
    assert any(c.op == "aten.nll_loss_forward.default" and c.category == "loss" for c in tr.calls)
    assert any(c.op == "aten.embedding_dense_backward.default" and c.category == "embedding" for c in tr.calls)


def test_counts_scale_to_full_depth(tiny_llama):
    tr = tiny_llama
    (kind,) = tr.kinds
    assert len(kind.layers) == 4
    per_layer = sum(1 for c in tr.calls if c.layer == 0 and c.op == "aten.rsqrt.default")
    outside = sum(1 for c in tr.calls if c.layer is None and c.op == "aten.rsqrt.default")
    assert per_layer == 2 and outside == 1  # two norms per layer, one final norm
    assert tr.op_counts()["aten.rsqrt.default"] == 4 * per_layer + outside


def test_bytes_and_kernels(tiny_llama):
    for c in tiny_llama.calls:
        if c.op in ("aten.view.default", "aten.t.default", "aten.transpose.int", "aten.expand.default"):
            assert not c.kernel and c.bytes == 0
        if c.op == "aten.mm.default":
            (m, k), (_, n) = c.shapes
            assert c.bytes == 2 * (m * k + k * n + m * n)  # bf16 operands and result


def test_eager_experts_with_balanced_routing():
    """transformers' eager experts loop is data-dependent (nonzero, where, item): the tracer
    feeds it balanced synthetic routing and still matches inspect's FLOPs."""
    tr = trace_model("tiny-moe", seq=128, experts="eager")
    ref = flops_per_token(load_model("tiny-moe"), 128, causal=False).train
    assert abs(tr.total_flops() / tr.tokens - ref) / ref < 0.02
    assert any("balanced" in n for n in tr.notes)
    assert not any(c.op == "aten._grouped_mm.default" for c in tr.calls)
    assert any(c.op == "aten.nonzero.default" for c in tr.calls)


def test_remote_code_runs_only_when_trusted(tmp_path):
    import shutil

    from dayzero.errors import DayzeroError

    src = DATA / "remote_tinyx"
    model = tmp_path / "tinyx"
    shutil.copytree(src, model)
    with pytest.raises(DayzeroError, match="--trust-remote-code"):
        trace_model(str(model))
    tr = trace_model(str(model), trust_remote_code=True)
    assert tr.model_type == "tinyx" and tr.spec is None
    assert [k.name for k in tr.kinds] == ["dense"] and tr.num_layers == 3
    assert {"mlp", "norm", "head", "embedding"} <= {c.category for c in tr.calls}


def test_trace_is_deterministic_and_does_not_perturb_autograd():
    """Two traces record the same calls. (The recorder holds tensors weakly: holding them would
    make autograd clone gradients it could otherwise steal, adding calls that training never runs.)"""
    a = trace_model("tiny-moe", seq=64)
    b = trace_model("tiny-moe", seq=64)
    def key(tr):
        return [(c.op, c.layer, c.category, c.phase, c.flops, c.bytes) for c in tr.calls]

    assert key(a) == key(b)
