"""FLOPs of layers the shapes only approximate, measured by tracing the model's own code at two
sequence lengths (dayzero.derive.traced_flops; issue #15 item 1)."""

from __future__ import annotations

import json
from dataclasses import replace

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from dayzero.derive.traced_act import fit_extra  # noqa: E402
from dayzero.derive.traced_flops import (  # noqa: E402
    approximated_layers,
    reference_spec,
    trace_lengths,
    with_traced_flops,
)
from dayzero.ops.hf_model import build_meta_model  # noqa: E402
from dayzero.ops.trace import _run  # noqa: E402
from dayzero.planner.perf.calibration import PerfConstants  # noqa: E402
from dayzero.planner.perf.compute import compute_costs, layer_classes  # noqa: E402
from dayzero.planner.perf.perf import rates  # noqa: E402
from dayzero.specs.cluster import build_cluster  # noqa: E402
from dayzero.specs.counting import flops_per_token, layer_forward_flops, traced_extra_flops  # noqa: E402
from dayzero.specs.grid import encode  # noqa: E402
from dayzero.specs.parallel import ParallelConfig  # noqa: E402
from dayzero.specs.registry import load_model  # noqa: E402

T = dict(hidden_size=64, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=4, intermediate_size=96,
         vocab_size=128, max_position_embeddings=256)
# DeepSeek-V3.2: MLA plus a lightning indexer (its weights are beyond the shapes, its scores quadratic)
DSV32 = dict(T, q_lora_rank=32, kv_lora_rank=16, qk_nope_head_dim=8, qk_rope_head_dim=8, v_head_dim=8,
             n_routed_experts=4, num_experts_per_tok=2, moe_intermediate_size=32, n_shared_experts=1,
             first_k_dense_replace=1, n_group=1, topk_group=1, index_n_heads=2, index_head_dim=16)


def _write(tmp_path, model_type: str, cfg: dict) -> str:
    d = tmp_path / model_type
    d.mkdir()
    (d / "config.json").write_text(json.dumps({"model_type": model_type, **cfg}))
    return str(d)


def _traced_forward(path: str, seq: int) -> list[float]:
    """Forward FLOPs per token of each layer, from a trace at ``seq`` tokens (the reference)."""
    meta = build_meta_model(path)
    tr = _run(meta, seq, 1, "bfloat16", backward=False)
    per_kind = [0.0] * len(meta.kinds)
    for c in tr.calls:
        if c.layer is not None and c.phase == "forward":
            per_kind[c.layer] += c.flops / tr.tokens
    out = [0.0] * meta.num_layers
    for k, kind in enumerate(meta.kinds):
        for i in kind.layers:
            out[i] = per_kind[k]
    return out


def test_fit_separates_the_linear_and_quadratic_terms():
    """Hand values: traced 10 + 2 s and modelled 4 at s = 256 and 512 -> extra 6 + 2 s."""
    assert fit_extra((10 + 2 * 256, 10 + 2 * 512), (4, 4), (256, 512)) == pytest.approx((6.0, 2.0))
    assert trace_lengths(4096) == (256, 512) and trace_lengths(256) == (128, 256) and trace_lengths(100) == (32, 64)


def test_an_indexer_beyond_the_shapes_is_measured_and_extrapolates_to_another_length(tmp_path):
    """DeepSeek-V3.2's indexer (weights beyond the MLA shapes, scores over every key) is traced at 128
    and 256 tokens; at a third length (192) the spec's non-causal forward FLOPs per token equal a trace
    of the same code to 1e-9, while the shapes alone fall short."""
    path = _write(tmp_path, "deepseek_v32", DSV32)
    spec = load_model(path)
    desc = spec.extra["description"]
    assert approximated_layers(desc, spec) == [0, 1, 2, 3]
    lin, quad = spec.layer_flops_extra[1]
    assert lin > 0 and quad > 0  # the indexer's projections (per token) and its q.k scores (per key)
    assert any("FLOPs measured by tracing the model's own code at 128 and 256 tokens" in a
               for a in spec.extra["approximations"])
    ref = reference_spec(desc, spec)
    traced = sum(_traced_forward(path, 192))
    head = 2.0 * spec.vocab * spec.hidden
    with_trace = flops_per_token(ref, 192, causal=False).forward - head
    shapes_only = flops_per_token(replace(ref, layer_flops_extra=()), 192, causal=False).forward - head
    assert with_trace == pytest.approx(traced, rel=1e-9)
    assert shapes_only < 0.99 * traced
    # causal: the quadratic part counts half the keys, as attention does
    assert traced_extra_flops(spec, 1, 192, causal=True) == pytest.approx(lin + quad * 193 / 2)


def test_a_mixer_the_planner_does_not_recognise_gets_its_traced_flops(tmp_path):
    """MiniMax's Lightning attention is modelled as a window of attention; the trace replaces the
    stand-in's FLOPs by the code's own (linear in the sequence length within its blocks)."""
    path = _write(tmp_path, "minimax", dict(T, head_dim=16, num_local_experts=4, num_experts_per_tok=2))
    spec = load_model(path)
    desc = spec.extra["description"]
    linear = [i for i, k in enumerate(desc.kind_of()) if k.mixer.kind == "recurrent"]
    assert linear and set(linear) <= set(approximated_layers(desc, spec))
    ref = reference_spec(desc, spec)
    for seq in (128, 256):  # the traced lengths: exact by construction
        traced = _traced_forward(path, seq)
        for i in linear:
            got = layer_forward_flops(ref, i, seq, causal=False) + traced_extra_flops(ref, i, seq, causal=False)
            assert got == pytest.approx(traced[i], rel=1e-9)
            assert layer_forward_flops(ref, i, seq, causal=False) != pytest.approx(traced[i], rel=1e-2)


def test_a_trace_past_its_budget_keeps_the_shapes_and_says_so(tmp_path):
    path = _write(tmp_path, "deepseek_v32", DSV32)
    spec = load_model(path)
    desc = spec.extra["description"]
    plain = replace(spec, layer_flops_extra=())
    out, notes = with_traced_flops(path, desc, plain, budget_s=0.0)
    assert out.layer_flops_extra == ((0.0, 0.0),) * spec.layers
    assert len(notes) == 1 and "FLOPs from the shapes only" in notes[0] and "took over 0 s" in notes[0]


def test_step_time_adds_the_traced_flops_as_untiled_bf16_gemms():
    """A layer with 1 GFLOP per token beyond its shapes: its forward grows by T x 1e9 FLOPs at the
    BF16 GEMM rate with the half-dim efficiency of min(T, hidden) (compute._gemm), backward by twice
    that, and the layer becomes its own class."""
    base = load_model("llama-3.1-8b")
    extra = ((1e9, 0.0),) + ((0.0, 0.0),) * (base.layers - 1)
    spec = replace(base, layer_flops_extra=extra)
    assert len(layer_classes(spec)) == len(layer_classes(base)) + 1
    c = PerfConstants()
    r = rates(build_cluster("h100", 8), c)
    grid = encode([ParallelConfig(tp=1, dp=8, mbs=1, gbs=8, seq=4096)])
    a, b = compute_costs(base, grid, r, c), compute_costs(spec, grid, r, c)
    T, H = 4096.0, base.hidden
    d = min(T, H)
    t_x = T * 1e9 / (float(np.asarray(r.gemm_rate(np.asarray([0])))[0]) * d / (d + c.gemm_half_dim))
    assert b.fwd[0, 0] - a.fwd[0, 0] == pytest.approx(t_x, rel=1e-9)
    assert b.bwd[0, 0] - a.bwd[0, 0] == pytest.approx(2 * t_x, rel=1e-9)
    assert flops_per_token(spec, 4096).forward - flops_per_token(base, 4096).forward == pytest.approx(1e9)
